"""Helpers of the resilience tests: steady clients (a producer, a round-trip probe), fd and memory readings.

Everything is bounded: the producer thread stops when its block ends, every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from kproxy.protocol.frame_builder import request_frame


@dataclass
class ProducerRecord:
    delivered: int = 0
    errors: list[str] = field(default_factory=list)
    worst_latency: float = 0.0
    offsets: dict[int, list[int]] = field(default_factory=dict)


@contextlib.contextmanager
def in_background(name: str, loop: Callable[[threading.Event], None], join: float = 30.0) -> Iterator[None]:
    """``loop(stop)`` in a daemon thread while the block runs; ``stop`` is set when the block ends,
    then the thread is given ``join`` seconds to return."""
    stop = threading.Event()
    thread = threading.Thread(target=loop, args=(stop,), name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(join)


@contextlib.contextmanager
def steady_producer(bootstrap: str, topic: str, interval: float = 0.02, **config: Any) -> Iterator[ProducerRecord]:
    """A confluent-kafka producer (acks=all) sending one record per ``interval`` while the block runs.

    The record says what it got through: deliveries, errors, the worst produce-to-ack latency.
    """
    record = ProducerRecord()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                         "message.timeout.ms": 20000, **config})

    def on_delivery(err: Any, msg: Any, sent: float) -> None:
        if err is not None:
            record.errors.append(str(err))
            return
        record.delivered += 1
        record.offsets.setdefault(msg.partition(), []).append(msg.offset())
        record.worst_latency = max(record.worst_latency, time.monotonic() - sent)

    def run(stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():
            sent = time.monotonic()
            producer.produce(topic, value=b"steady-%d" % n,
                             on_delivery=lambda err, msg, sent=sent: on_delivery(err, msg, sent))
            producer.poll(interval)
            n += 1
        producer.flush(20)

    with in_background("steady-producer", run):
        yield record


@dataclass
class ProbeRecord:
    worst_wait: float = 0.0  # seconds: the longest gap between two answers, or the wait for one that never came


@contextlib.contextmanager
def steady_round_trips(port: int, interval: float = 0.01) -> Iterator[ProbeRecord]:
    """ApiVersions round trips on one connection to ``port``, one per ``interval``, while the block
    runs; the record keeps the worst wait between two answers."""
    record = ProbeRecord()

    def run(stop: threading.Event) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            last, n = time.monotonic(), 0
            while not stop.is_set():
                n += 1
                sock.sendall(request_frame(18, 3, n, client_id="probe", client_software_name="probe",
                                           client_software_version="1"))
                try:
                    recv_frame(sock)
                except OSError:
                    record.worst_wait = max(record.worst_wait, time.monotonic() - last)
                    return
                now = time.monotonic()
                record.worst_wait = max(record.worst_wait, now - last)
                last = now
                stop.wait(interval)

    with in_background("probe", run, join=35.0):
        yield record


def assert_unaffected(record: ProducerRecord, at_least: int = 5, worst_latency: float = 5.0) -> None:
    """The steady producer kept going: deliveries, no errors, no long stall."""
    assert not record.errors, f"the well-behaved client saw errors: {record.errors[:5]}"
    assert record.delivered >= at_least, f"the well-behaved client delivered only {record.delivered} records"
    assert record.worst_latency < worst_latency, (
        f"a produce of the well-behaved client took {record.worst_latency:.1f} s to be acknowledged")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def vm_rss_kb(pid: int) -> int:
    """VmRSS of a process, in KiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def raise_nofile() -> int:
    """Raise this process's RLIMIT_NOFILE soft limit to its hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    return recv_exactly(sock, size)


def api_versions_request(correlation_id: int) -> bytes:
    return request_frame(18, 3, correlation_id, client_software_name="hostile", client_software_version="1")


def closed_by_peer(sock: socket.socket, timeout: float) -> tuple[bool, bytes]:
    """Read until the peer closes or ``timeout``; (closed, bytes read meanwhile)."""
    sock.settimeout(0.2)
    got = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True, bytes(got)
        if not chunk:
            return True, bytes(got)
        got += chunk
    return False, bytes(got)


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
