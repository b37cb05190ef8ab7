"""The periodic upstream check: /readyz reads it (no connection per probe), kproxy_upstream_up exports it."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import trio

from kproxy.host_port import HostPort
from kproxy.server.upstream_health import BOOTSTRAP, Result, Target, UpstreamHealth
from kproxy.testing import Broker, free_port, running_proxy


class CountingListener:
    """A TCP port that accepts and counts connections (a stand-in upstream that is up)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.thread.join(timeout=5)
        self.sock.close()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_readiness_probes_open_no_upstream_connections() -> None:
    upstream = CountingListener()
    metrics = free_port()
    try:
        with running_proxy(f"127.0.0.1:{upstream.port}", metrics_listen=f"127.0.0.1:{metrics}",
                           upstream_check_interval=60) as proxy:
            assert proxy.server is not None
            wait(lambda: get(f"http://127.0.0.1:{metrics}/readyz")[0] == 200)
            before = upstream.accepted
            for _ in range(30):
                assert get(f"http://127.0.0.1:{metrics}/readyz") == (200, "ready\n")
            # Discovery (retrying: this upstream speaks no Kafka) may connect meanwhile; probes must not.
            assert upstream.accepted - before < 30, upstream.accepted - before
            assert proxy.server.stats.upstream_up[(f"127.0.0.1:{upstream.port}", BOOTSTRAP)] == 1
    finally:
        upstream.close()


def test_a_dead_upstream_is_seen_before_any_client() -> None:
    dead = f"127.0.0.1:{free_port()}"
    metrics = free_port()
    with running_proxy(dead, metrics_listen=f"127.0.0.1:{metrics}", upstream_check_interval=0.2) as proxy:
        assert proxy.server is not None
        stats = proxy.server.stats
        wait(lambda: stats.upstream_connect_failures.get((dead, BOOTSTRAP), 0) >= 2)  # counted with no client at all
        assert stats.upstream_up[(dead, BOOTSTRAP)] == 0
        status, body = get(f"http://127.0.0.1:{metrics}/readyz")
        assert status == 503
        # Said once: the address and its reason, not "upstream unavailable: X: upstream unavailable: X: ...".
        assert body == f"not ready: upstream unavailable: {dead}: connection refused\n"
        text = get(f"http://127.0.0.1:{metrics}/metrics")[1]
        assert f'kproxy_upstream_up{{node_id="bootstrap",upstream="{dead}"}} 0.0' in text


def test_discovered_brokers_are_checked_by_node_id(tansu: Broker) -> None:
    with running_proxy(tansu.bootstrap, upstream_check_interval=0.2) as proxy:
        assert proxy.server is not None
        up = proxy.server.stats.upstream_up
        wait(lambda: any(node != BOOTSTRAP for _, node in up))
        assert {node for _, node in up} == {BOOTSTRAP, "111"}  # Tansu's node id
        assert set(up.values()) == {1}


async def test_a_target_that_comes_back_is_up_again() -> None:
    state = {"fail": True}

    async def probe(target: Target) -> None:
        if state["fail"]:
            raise OSError("connection refused")

    seen: list[Result] = []
    target = Target(HostPort("k", 1), BOOTSTRAP)
    health = UpstreamHealth(lambda: [target], probe, interval=1.0, on_result=lambda t, r: seen.append(r))
    assert health.not_ready() == "upstream not checked yet"
    await health.check_all()
    assert health.not_ready() == "upstream unavailable: k:1: connection refused"
    state["fail"] = False
    await health.check_all()
    assert health.not_ready() is None
    assert [r.up for r in seen] == [False, True]
    with trio.move_on_after(0.1):
        await health.run()  # the loop runs a round at once and then sleeps; cancelled here


def test_process_metrics_are_opt_in() -> None:
    metrics_off, metrics_on = free_port(), free_port()
    dead = f"127.0.0.1:{free_port()}"
    with running_proxy(dead, metrics_listen=f"127.0.0.1:{metrics_off}"), \
            running_proxy(dead, metrics_listen=f"127.0.0.1:{metrics_on}", metrics__process_metrics=True):
        off = get(f"http://127.0.0.1:{metrics_off}/metrics")[1]
        on = get(f"http://127.0.0.1:{metrics_on}/metrics")[1]
    assert "process_open_fds" not in off and "python_gc_objects_collected_total" not in off
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                 "python_gc_objects_collected_total", "python_info"):
        assert f"\n{name}" in on, name


def test_a_client_retrying_against_a_dead_upstream_makes_few_log_lines(caplog: object) -> None:
    import logging

    import pytest

    assert isinstance(caplog, pytest.LogCaptureFixture)
    dead = f"127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING, logger="kproxy"), \
            running_proxy(dead, upstream_check_interval=3600) as proxy:
        host, port = proxy.bootstrap.rsplit(":", 1)
        for _ in range(40):
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.settimeout(5)
                assert s.recv(1) == b""  # refused: closed without an answer
        assert proxy.server is not None
        assert proxy.server.stats.upstream_connect_failures[(dead, BOOTSTRAP)] >= 40
    lines = [r.getMessage() for r in caplog.records if "event=connection_refused" in r.getMessage()]
    assert 1 <= len(lines) <= 2, lines  # the first at once, then at most one per 10 s with its count
    assert "occurrences=1" in lines[0]
