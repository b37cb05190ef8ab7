"""A rule's regex met by a hostile text must not freeze kproxy (issue 19, defect 1).

``(a+)+$`` against ``'a' * 50 + '!'`` backtracks for hours in Python's ``re``: on the event loop,
every connection would stop, ``/healthz`` time out and SIGTERM go unheeded. Rule patterns run on
RE2 (kproxy/rules/patterns.py), linear in the text. Each scenario runs kproxy as a subprocess (a
frozen kproxy must not freeze the test with it: ``re`` holds the GIL) in front of the real Tansu
broker, with the rule loaded from a file or added through the admin API, and checks that

* every hostile request (client id, FindCoordinator group key, Metadata topic, transactional id,
  each ``'a' * n + '!'``) is answered within a second, and a matching text still gets the rule;
* a well-behaved real client (confluent-kafka producing with acks=all) is answered throughout,
  and a probe doing ApiVersions round trips every ~10 ms never waits long;
* the event loop was never blocked over 100 ms (the watchdog's ``kproxy_event_loop_held_seconds``);
* kproxy's memory stays bounded, and SIGTERM ends it cleanly afterwards.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kproxy.admin.api_client import AdminClient
from kproxy.protocol.codes import ApiKey
from kproxy.protocol.frame_builder import request_frame
from kproxy.testing import Broker, free_port, wait_for_port
from tests.support.e2e import create_topic, unique
from tests.support.loopwatch import BLOCKED, stalls_over
from tests.support.resilience import (
    assert_unaffected,
    recv_frame,
    steady_producer,
    steady_round_trips,
    vm_rss_kb,
    wait_for,
)

KPROXY = [sys.executable, "-m", "kproxy"]
EVIL = "(a+)+$"  # exponential in a backtracking engine on a run of a's that does not end the text
INJECTED = "CLUSTER_AUTHORIZATION_FAILED"

RULES: list[dict[str, Any]] = [
    {"id": "redos-client", "match": {"api": "api_versions", "client_id": EVIL},
     "actions": [{"inject_error": {"error": INJECTED}}]},
    {"id": "redos-group", "match": {"api": "find_coordinator", "group_id": EVIL},
     "actions": [{"inject_error": {"error": INJECTED}}]},
    {"id": "redos-topic", "match": {"api": "metadata", "topic": {"regex": EVIL}},
     "actions": [{"inject_error": {"error": INJECTED}}]},
    {"id": "redos-txn", "match": {"api": "init_producer_id", "transactional_id": EVIL},
     "actions": [{"inject_error": {"error": INJECTED}}]},
]


class Kproxy:
    """``kproxy run`` as a subprocess in front of ``tansu``, with metrics and the admin API on."""

    def __init__(self, tansu: Broker, tmp_path: Path, *extra: str) -> None:
        self.port, self.metrics_port, self.admin_port = free_port(), free_port(), free_port()
        self.log = tmp_path / "kproxy.log"
        argv = [*KPROXY, "run", "--upstream", tansu.bootstrap, "--listen", f"127.0.0.1:{self.port}",
                "--broker-port-base", "0", "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
                "--admin-listen", f"127.0.0.1:{self.admin_port}", "--shutdown-grace", "5", *extra]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        for port in (self.port, self.metrics_port, self.admin_port):
            wait_for_port("127.0.0.1", port)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


@contextlib.contextmanager
def kproxy_process(tansu: Broker, tmp_path: Path, *extra: str) -> Iterator[Kproxy]:
    proxy = Kproxy(tansu, tmp_path, *extra)
    try:
        yield proxy
    finally:
        proxy.kill()  # a frozen kproxy ignores SIGTERM: the test ends it whatever happened


def requests_carrying(text: str, correlation_id: int) -> list[tuple[str, bytes]]:
    """One request per pattern rule, each carrying ``text`` where that rule looks."""
    return [
        ("client_id", request_frame(ApiKey.API_VERSIONS, 3, correlation_id, client_id=text,
                                    client_software_name="hostile", client_software_version="1")),
        ("group_id", request_frame(ApiKey.FIND_COORDINATOR, 1, correlation_id, key=text, key_type=0)),
        ("topic", request_frame(ApiKey.METADATA, 1, correlation_id, topics=[{"name": text}])),
        ("transactional_id", request_frame(ApiKey.INIT_PRODUCER_ID, 1, correlation_id, transactional_id=text,
                                           transaction_timeout_ms=60000)),
    ]


def ask(port: int, frame: bytes, within: float) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=within) as sock:
        sock.sendall(frame)
        return recv_frame(sock)


@pytest.mark.parametrize("source", ["file", "admin"])
def test_a_catastrophic_regex_does_not_stop_the_proxy(tansu: Broker, tmp_path: Path, source: str) -> None:
    topic = unique("redos")
    create_topic(tansu.bootstrap, topic, partitions=1)
    extra: list[str] = []
    if source == "file":
        path = tmp_path / "rules.yaml"
        path.write_text(json.dumps({"rules": RULES}))  # JSON is YAML
        extra = ["--rules", str(path)]
    with kproxy_process(tansu, tmp_path, *extra) as proxy:
        if source == "admin":
            admin = AdminClient(f"http://127.0.0.1:{proxy.admin_port}")
            for rule in RULES:
                admin.add(rule)
        with steady_producer(proxy.bootstrap, topic) as steady:
            wait_for(lambda: steady.delivered > 0, 15, "the steady producer's first delivery")
            rss_before = vm_rss_kb(proxy.proc.pid)
            stalls_before = stalls_over(proxy.metrics(), BLOCKED)
            slowest = 0.0
            with steady_round_trips(proxy.port) as probe:
                # Lengths 20..219: each text is new to every cache, so each is matched for real.
                for n in range(20, 220):
                    for key, frame in requests_carrying("a" * n + "!", n):
                        asked = time.monotonic()
                        try:
                            ask(proxy.port, frame, within=5)
                        except OSError as exc:
                            pytest.fail(f"a request with a {n + 1}-character {key} got no answer within 5 s: "
                                        f"{exc!r} (probe's worst wait {probe.worst_wait:.1f} s)")
                        slowest = max(slowest, time.monotonic() - asked)
                # The rules are in force: a text the pattern matches gets the rule.
                for _, frame in requests_carrying("a" * 30, 1):
                    ask(proxy.port, frame, within=5)
            stalls = stalls_over(proxy.metrics(), BLOCKED) - stalls_before
            rss_growth_mb = (vm_rss_kb(proxy.proc.pid) - rss_before) / 1024
        print(f"\n[{source}] slowest hostile answer {slowest * 1000:.0f} ms, probe's worst wait "
              f"{probe.worst_wait * 1000:.0f} ms, loop stalls over {BLOCKED * 1000:.0f} ms: {stalls}, "
              f"RSS growth {rss_growth_mb:.1f} MiB")
        assert slowest < 1.0, f"a hostile request took {slowest:.2f} s to be answered"
        assert probe.worst_wait < 1.0, f"the probe waited {probe.worst_wait:.2f} s for an answer"
        assert stalls == 0, f"the event loop was blocked over {BLOCKED * 1000:.0f} ms {stalls} times"
        assert rss_growth_mb < 64, f"kproxy's RSS grew {rss_growth_mb:.0f} MiB"
        assert_unaffected(steady, worst_latency=2.0)
        hits = {rule["id"]: rule["hits"] for rule in AdminClient(f"http://127.0.0.1:{proxy.admin_port}").rules()["rules"]}
        assert hits == {rule["id"]: {"inject_error": 1} for rule in RULES}, hits
        proxy.proc.send_signal(signal.SIGTERM)
        assert proxy.proc.wait(timeout=15) == 0
