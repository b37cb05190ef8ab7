"""HTTP clients cannot take the descriptors Kafka clients need (issue 19, defect 4).

kproxy runs as its own process under a lowered RLIMIT_NOFILE (256), in front of the real Tansu
broker, with its admin API and metrics endpoint on. A hostile client keeps 300 connections to the
admin port, each with a request half sent (a head that never ends, or a body that never comes),
opening new ones as kproxy closes them. Meanwhile a well-behaved client (confluent-kafka, acks=all)
keeps producing and new Kafka clients must still connect and be answered; kproxy's loop is never
held over 100 ms (its own ``kproxy_event_loop_held_seconds``), its memory stays bounded.
"""

from __future__ import annotations

import resource
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer

from kproxy.protocol import decode_response
from kproxy.testing import Broker, free_port, stop_process, wait_for_port
from tests.support.e2e import create_topic, unique
from tests.support.loopwatch import BLOCKED, stalls_over
from tests.support.resilience import (
    api_versions_request,
    assert_unaffected,
    raise_nofile,
    recv_frame,
    steady_producer,
    vm_rss_kb,
    wait_for,
)

NOFILE = 256
HOSTILE = 300
HALF_SENT = (b"POST /rules HTTP/1.1\r\nHost: kproxy\r\nContent-Type: application/json\r\n",  # the head, unfinished
             b"PUT /rules HTTP/1.1\r\nHost: kproxy\r\nContent-Length: 100000\r\n\r\n{\"rules\": [")  # the body


def _lowered_nofile() -> Callable[[], None]:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

    return lower


@dataclass
class Siege:
    """The hostile client's tally."""

    opened: int = 0
    closed: int = 0  # by kproxy
    held_max: int = 0  # the most hostile connections kproxy kept open over a second at once
    connect_errors: int = 0


def _besiege(port: int, stop: threading.Event, siege: Siege) -> None:
    """Keep HOSTILE half-sent requests open on ``port`` until ``stop``; reopen what kproxy closes."""
    socks: dict[socket.socket, float] = {}
    try:
        while not stop.is_set():
            while len(socks) < HOSTILE and not stop.is_set():
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=2)
                    sock.sendall(HALF_SENT[siege.opened % 2])
                except OSError:
                    siege.connect_errors += 1
                    break
                sock.setblocking(False)
                socks[sock] = time.monotonic()
                siege.opened += 1
            # Refilled five times a second: a siege, not a connect flood (the cap is what is tested).
            readable, _, _ = select.select(list(socks), [], [], 0.2) if socks else ([], [], [])
            for sock in readable:
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if not data:  # closed by kproxy
                    siege.closed += 1
                    del socks[sock]
                    sock.close()
            # Over the cap, kproxy closes at once: what is still open after a second, it holds.
            now = time.monotonic()
            siege.held_max = max(siege.held_max, sum(1 for since in socks.values() if now - since > 1.0))
    finally:
        for sock in socks:
            sock.close()


def _new_kafka_clients(bootstrap: str, topic: str, port: int) -> float:
    """Ten new connections answer ApiVersions and a new producer delivers; returns the time it took."""
    started = time.monotonic()
    for i in range(10):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.settimeout(5)
            sock.sendall(api_versions_request(100 + i))
            assert decode_response(recv_frame(sock), 18, 3).header.correlation_id == 100 + i
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 10000})
    delivered: list[object] = []
    producer.produce(topic, value=b"newcomer", on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(15) == 0 and delivered == [None], f"a new producer could not deliver: {delivered}"
    return time.monotonic() - started


def test_admin_connections_cannot_starve_kafka_clients_of_descriptors(tansu: Broker, tmp_path: Path) -> None:
    raise_nofile()  # this process holds the 300 hostile sockets
    port, admin, metrics = free_port(), free_port(), free_port()
    log = (tmp_path / "kproxy.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "kproxy", "run", "--upstream", tansu.bootstrap,
                             "--listen", f"127.0.0.1:{port}", "--broker-port-base", "0",
                             "--admin-listen", f"127.0.0.1:{admin}", "--metrics-listen", f"127.0.0.1:{metrics}",
                             "--shutdown-grace", "2", "--log-level", "info"],
                            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_lowered_nofile())
    stop = threading.Event()
    siege = Siege()
    try:
        for p in (port, admin, metrics):
            wait_for_port("127.0.0.1", p)
        bootstrap = f"127.0.0.1:{port}"
        topic = unique("descriptors")
        create_topic(bootstrap, topic, partitions=1)

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as answer:
                return str(answer.read().decode())

        with steady_producer(bootstrap, topic) as steady:
            wait_for(lambda: steady.delivered > 0, 15, "the steady producer's first delivery")
            # Start-up (the warm-up, then one full collection before gc.freeze) is not the scenario.
            wait_for(lambda: "event=codecs_warmed" in (tmp_path / "kproxy.log").read_text(), 30, "the warm-up")
            time.sleep(1)
            stalls_before = stalls_over(scrape(), BLOCKED)
            rss_before = vm_rss_kb(proc.pid)
            attacker = threading.Thread(target=_besiege, args=(admin, stop, siege), daemon=True)
            attacker.start()
            wait_for(lambda: siege.opened >= HOSTILE, 15, f"{HOSTILE} hostile connections")
            time.sleep(1.5)  # past the second after which what is still open is held
            newcomers = [_new_kafka_clients(bootstrap, topic, port) for _ in range(2)]
            text = scrape()  # the metrics endpoint is served too: its own connections, its own cap
            stop.set()
            attacker.join(15)
            rss_after = vm_rss_kb(proc.pid)
            stalls = stalls_over(text, BLOCKED) - stalls_before
            assert proc.poll() is None, "kproxy exited"
    finally:
        stop.set()
        stop_process(proc, grace=15)
        log.close()
    kproxy_log = (tmp_path / "kproxy.log").read_text()
    assert_unaffected(steady)
    print(f"admin siege: {siege.opened} hostile connections opened, {siege.closed} closed by kproxy, at most "
          f"{siege.held_max} held at once; new "
          f"Kafka clients answered in {max(newcomers):.1f} s; kproxy RSS {rss_before} -> {rss_after} KiB; "
          f"loop stalls over 100 ms: {stalls}")
    assert "event=accept_failed listener=bootstrap" not in kproxy_log, "the Kafka listener ran out of descriptors"
    assert "event=connection_refused listener=admin reason=max_connections max_connections=64" in kproxy_log
    assert 0 < siege.held_max <= 64, f"kproxy held {siege.held_max} admin connections at once (cap 64)"
    assert rss_after - rss_before < 64 * 1024
    assert stalls == 0, f"the loop was held over 100 ms {stalls} times"
