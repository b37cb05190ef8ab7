"""The server under hostile clients and exhausted resources.

Each test plays what a hostile client or a pressed operator does, through a
real kproxy: a raw socket or a real broker (Tansu) where that is how it
happens, a scripted fake broker (tests/support/fakecluster.py) where the test
needs answers Tansu does not give, a virtual clock where it needs exact time.
"""

from __future__ import annotations

import contextlib
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import trio

from kproxy.metrics.labels import MAX_LABEL_LENGTH, LabelCap
from kproxy.metrics.stats import TrafficStats
from kproxy.protocol.compression import Codec
from kproxy.protocol.frame_builder import request_frame
from kproxy.protocol.records import Record, RecordBudget, count_records, encode_message_set
from kproxy.ratelimit import LogRateLimit
from kproxy.testing import Broker, free_port, proxy_config, running_server, wait_for_port
from tests.support.fakecluster import fake_cluster
from tests.support.kafkaclient import KafkaClient

PRODUCE, API_VERSIONS = 0, 18
KPROXY = [sys.executable, "-m", "kproxy"]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def scrape(port: int) -> str:
    """``GET /metrics`` over a plain socket; the body as text."""
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nhost: kproxy\r\nconnection: close\r\n\r\n")
            data = bytearray()
            while chunk := await stream.receive_some(65536):
                data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return body.decode()


def series(body: str, name: str) -> list[str]:
    return [line for line in body.splitlines() if line.startswith(name + "{")]


# -- defect: every (api key, version) pair a client sends became metric series ---------------------------
def raw_request(api_key: int, api_version: int, correlation_id: int, client_id: bytes = b"raw") -> bytes:
    """A request frame with header v1 and an empty body: all kproxy needs to count it."""
    payload = (api_key.to_bytes(2, "big", signed=True) + api_version.to_bytes(2, "big", signed=True)
               + correlation_id.to_bytes(4, "big", signed=True) + len(client_id).to_bytes(2, "big") + client_id)
    return len(payload).to_bytes(4, "big") + payload


async def test_metric_series_stay_bounded_whatever_api_keys_and_versions_clients_send() -> None:
    async with fake_cluster((0,)) as cluster:
        config = proxy_config(cluster.bootstrap, metrics_listen=f"127.0.0.1:{free_port()}",
                              metrics__client_id_label=True)
        async with running_server(config) as server:
            assert server.metrics_server is not None
            port = server.metrics_server.port
            before = await scrape(port)
            # 1,500 pairs nobody knows (the fake broker echoes them), 500 known APIs at versions no
            # Kafka has; and 50 client ids of 4 KB each (the label is opt-in and capped in count).
            pairs = [(key, version) for key in range(1000, 1030) for version in range(50)]
            pairs += [(key, version) for key in (8, 9, 11, 19) for version in range(200, 325)]
            async with await KafkaClient.connect(server.bootstrap_port, timeout=30) as client:
                sent = b"".join(raw_request(k, v, c, client_id=b"c%04d" % (c % 50) + b"x" * 4096)
                                for c, (k, v) in enumerate(pairs))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(client.send_raw, sent)  # while reading: the echoes are as big
                    for _ in pairs:
                        await client.receive_frame()
            after = await scrape(port)
    requests = series(after, "kproxy_requests_total")
    assert len(requests) - len(series(before, "kproxy_requests_total")) <= 5, requests
    assert 'api="unknown",node_id="bootstrap",version="other"' in after
    assert 'api="join_group",node_id="bootstrap",version="other"' in after
    client_ids = {m for line in series(after, "kproxy_client_requests_total")
                  for m in re.findall(r'client_id="([^"]*)"', line)}
    assert 0 < len(client_ids) <= 100  # --metrics-label-cap
    assert max(map(len, client_ids)) <= MAX_LABEL_LENGTH
    assert len(after) < len(before) + 64 * 1024, f"/metrics grew from {len(before)} to {len(after)} bytes"


# -- defect: --upstream-no-verify was accepted silently ---------------------------------------------------
def run_briefly(*flags: str) -> str:
    """``kproxy run`` with ``flags`` until it listens, then SIGTERM; its log."""
    port = free_port()
    argv = [*KPROXY, "run", "--upstream", f"127.0.0.1:{closed_port()}", "--listen", f"127.0.0.1:{port}",
            "--broker-port-base", "0", "--shutdown-grace", "1", *flags]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port("127.0.0.1", port)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    return err


def test_upstream_no_verify_logs_one_warning_at_start() -> None:
    log = run_briefly("--upstream-tls", "--upstream-no-verify")
    warned = [line for line in log.splitlines() if "event=upstream_tls_unverified" in line]
    assert len(warned) == 1, log
    assert " level=warning " in warned[0] and "\n" not in warned[0]
    # Verification on (the default): nothing to warn about.
    assert "upstream_tls_unverified" not in run_briefly("--upstream-tls")


# -- defect: counting a legacy gzip Produce's records stalled every connection --------------------------
def legacy_gzip_wrapper(inner_messages: int) -> bytes:
    """One magic-0 gzip wrapper around ``inner_messages`` identical empty messages (26 bytes each):
    gzip shrinks them about a thousand-fold, and counting them means walking every one."""
    one = encode_message_set([Record(0, -1, None, None, [])], magic=0)
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip framing, as Kafka's codec 1
    value = deflate.compress(one * inner_messages) + deflate.flush()
    body = struct.pack(">bbii", 0, Codec.GZIP, -1, len(value)) + value  # magic, attributes, null key, value
    return struct.pack(">qiI", 0, 4 + len(body), zlib.crc32(body)) + body


def produce_frame(records: bytes, correlation_id: int, version: int = 2) -> bytes:
    topic = {"name": "bomb", "partition_data": [{"index": 0, "records": records}]}
    return request_frame(PRODUCE, version, correlation_id, acks=1, timeout_ms=1000, topic_data=[topic])


def round_trip(sock: socket.socket, correlation_id: int) -> float:
    """Seconds for one ApiVersions v0 request through ``sock`` to be answered."""
    started = time.perf_counter()
    sock.sendall(raw_request(API_VERSIONS, 0, correlation_id))
    size = int.from_bytes(recv_exact(sock, 4), "big")
    assert int.from_bytes(recv_exact(sock, size)[:4], "big") == correlation_id
    return time.perf_counter() - started


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "closed by kproxy"
        data += chunk
    return bytes(data)


@contextlib.contextmanager
def kproxy_process(upstream: str, *flags: str) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """``kproxy run`` in front of ``upstream``, as users run it: (bootstrap port, process)."""
    port = free_port()
    argv = [*KPROXY, "run", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--broker-port-base", "0",
            "--shutdown-grace", "2", *flags]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port("127.0.0.1", port)
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_a_legacy_gzip_produce_does_not_stall_other_connections(tansu: Broker) -> None:
    # 651 KB on the wire: four gzip wrappers of 2.58 million empty messages each (64 MiB inflated).
    records = legacy_gzip_wrapper(64 * 1024 * 1024 // 26 - 1) * 4
    with kproxy_process(tansu.bootstrap) as (port, _), \
            socket.create_connection(("127.0.0.1", port), timeout=3) as probe, \
            socket.create_connection(("127.0.0.1", port), timeout=10) as hostile:
        baseline = max(round_trip(probe, c) for c in range(1, 6))
        hostile.sendall(produce_frame(records, 1))
        worst = 0.0
        deadline = time.monotonic() + 2
        c = 10
        while time.monotonic() < deadline:  # about 2 s of round trips, each bounded by the socket timeout
            try:
                worst = max(worst, round_trip(probe, c))
            except TimeoutError:
                worst = float("inf")
                break
            c += 1
            time.sleep(0.01)
        assert worst < 0.5, f"another connection waited {worst:.2f} s (baseline {baseline * 1000:.1f} ms)"
        # The Produce itself went through and was answered (Tansu refuses magic 0; what matters is the answer).
        size = int.from_bytes(recv_exact(hostile, 4), "big")
        assert int.from_bytes(recv_exact(hostile, size)[:4], "big") == 1


def test_record_counting_stops_at_its_budget() -> None:
    bomb = legacy_gzip_wrapper(1_000_000)  # 26 MB inflated, 10 KB on the wire
    budget = RecordBudget(1024 * 1024)
    started = time.perf_counter()
    assert count_records(bomb * 50, budget=budget) == 0
    assert budget.exhausted and budget.remaining == 0
    assert time.perf_counter() - started < 0.1
    # Within the budget: counted exactly, and the budget spent by what was inflated.
    small = legacy_gzip_wrapper(1000)
    budget = RecordBudget(100 * 26_000)
    assert count_records(small * 3, budget=budget) == 3000
    assert not budget.exhausted and budget.remaining == 100 * 26_000 - 3 * 26_000
    # The budget is per frame, shared by its records fields: the 101st wrapper is not paid for.
    assert sum(count_records(small, budget=budget) for _ in range(98)) == 97_000
    assert budget.exhausted


def test_a_frame_past_the_budget_is_counted_as_uncounted_not_as_a_partial_count() -> None:
    stats = TrafficStats()
    fits = produce_frame(legacy_gzip_wrapper(1000), 1)
    stats.request(stats.broker(1), PRODUCE, 2, len(fits), None, fits)
    bomb = produce_frame(legacy_gzip_wrapper(1000) + legacy_gzip_wrapper(1_000_000), 2)
    stats.request(stats.broker(1), PRODUCE, 2, len(bomb), None, bomb)
    assert stats.records == {"produce": 1000}
    assert stats.records_uncounted == {"produce": 1, "fetch": 0}


# -- defect: running out of file descriptors killed the process -------------------------------------------
def api_versions_works(sock: socket.socket, correlation_id: int) -> bool:
    """One ApiVersions round trip; False when kproxy closed the connection or did not answer in time."""
    try:
        round_trip(sock, correlation_id)
    except (AssertionError, OSError):
        return False
    return True


def wait_for_line(path: Path, text: str, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in path.read_text().splitlines():
            if text in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} in the log:\n{path.read_text()}")


def test_out_of_file_descriptors_kproxy_keeps_serving(tansu: Broker, tmp_path: Path) -> None:
    log = tmp_path / "kproxy.log"
    port, metrics = free_port(), free_port()
    argv = [*KPROXY, "run", "--upstream", tansu.bootstrap, "--listen", f"127.0.0.1:{port}", "--broker-port-base",
            "0", "--shutdown-grace", "2", "--metrics-listen", f"127.0.0.1:{metrics}"]

    def few_fds() -> None:  # in the child, before exec: a limit a few dozen connections reach
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, hard))

    held: list[socket.socket] = []
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, preexec_fn=few_fds)
    try:
        wait_for_port("127.0.0.1", port)
        wait_for_line(log, "event=brokers_discovered")
        # Open connections until one is not served: kproxy holds two descriptors for each.
        pending = None
        for c in range(1, 40):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=1)
            except ConnectionRefusedError:
                time.sleep(0.5)
                raise AssertionError(f"kproxy stopped listening (exit status {proc.poll()})") from None
            if not api_versions_works(sock, c):
                pending = sock
                break
            held.append(sock)
        assert pending is not None and len(held) >= 5, "the descriptor limit was not reached"
        hanging: socket.socket | None = None
        if not api_versions_works(pending, 100):  # refused (one descriptor left), not hanging
            pending.close()
            # One idle scrape connection takes the last descriptor; the next client meets EMFILE in accept.
            hanging = socket.create_connection(("127.0.0.1", metrics), timeout=1)
            pending = socket.create_connection(("127.0.0.1", port), timeout=1)
            assert not api_versions_works(pending, 101)
        line = wait_for_line(log, "event=accept_failed listener=bootstrap")
        assert "error=EMFILE" in line and " level=warning " in line
        assert proc.poll() is None, "kproxy exited"
        # Connections already open still reach the broker ...
        assert all(api_versions_works(sock, 200 + i) for i, sock in enumerate(held[:5]))
        # ... and once some close, the waiting client is served, and new ones too.
        for sock in held[:5]:
            sock.close()
        if hanging is not None:
            hanging.close()
        pending.settimeout(10)
        size = int.from_bytes(recv_exact(pending, 4), "big")  # the request it sent while it waited
        assert len(recv_exact(pending, size)) == size
        with socket.create_connection(("127.0.0.1", port), timeout=5) as fresh:
            assert api_versions_works(fresh, 300)
        for sock in held[5:10]:
            sock.close()
        body = trio.run(scrape, metrics)
        assert re.search(r'^kproxy_accept_errors_total\{error="EMFILE"\} [1-9]', body, re.M), body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        for sock in held:
            sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text and "start_failed" not in text
    # Rate-limited: however many times accept failed, a handful of lines.
    assert len([line for line in text.splitlines() if "event=accept_failed" in line]) <= 3


async def test_connections_over_the_cap_are_closed_at_once_and_counted() -> None:
    async with fake_cluster((0,)) as cluster, \
            running_server(proxy_config(cluster.bootstrap, limits__max_connections=2)) as server:
        first = await KafkaClient.connect(server.bootstrap_port)
        async with await KafkaClient.connect(server.bootstrap_port) as second:
            await first.request(API_VERSIONS, 3)
            await second.request(API_VERSIONS, 3)
            for _ in range(3):
                async with await KafkaClient.connect(server.bootstrap_port) as third:
                    await third.send_raw(raw_request(API_VERSIONS, 0, 1))
                    assert await third.closed_by_peer() == b""
            assert server.stats.client_connections_refused == {("bootstrap", "bootstrap"): 3,
                                                               ("broker-0", "0"): 0}
            await first.aclose()
            with trio.fail_after(5):
                while server.open_clients > 1:
                    await trio.sleep(0.01)
            async with await KafkaClient.connect(server.bootstrap_port) as fourth:
                await fourth.request(API_VERSIONS, 3)
            await second.request(API_VERSIONS, 3)
        assert server.connections_total == 3


def test_log_rate_limit_logs_the_first_then_one_line_per_interval_with_the_count() -> None:
    throttle = LogRateLimit(interval=0.2)
    assert throttle.due() == 1
    assert [throttle.due() for _ in range(1000)] == [None] * 1000
    time.sleep(0.25)
    assert throttle.due() == 1001


def test_label_values_are_capped_in_length() -> None:
    cap = LabelCap(2)
    long_id = "consumer-" + "x" * 5000
    assert cap(long_id) == long_id[:MAX_LABEL_LENGTH - 1] + "~"
    assert cap(long_id + "y") == cap(long_id)  # same first 127 characters: one value, not two
    assert cap("short") == "short" and cap("third") == "other"
