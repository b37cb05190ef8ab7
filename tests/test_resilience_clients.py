"""Hostile clients on raw sockets against a real kproxy in front of the real Tansu broker.

Each case checks three things: kproxy deals with the hostile connection within its
timeout (closes it, or holds it at bounded cost), a well-behaved real client
(confluent-kafka, producing with acks=all the whole time) is not disturbed, and
memory stays bounded. Slowloris and reused correlation ids are in the tests of
their fixes (test_hostile_clients.py); this file covers the rest of the list.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import struct
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from kproxy.protocol import decode_response
from kproxy.protocol.frame_builder import request_frame
from kproxy.protocol.records import Record, encode_batch_v2
from kproxy.testing import Broker, ProxyThread, free_port, run_tansu, running_proxy, stop_process, wait_for_port
from tests.support.e2e import create_topic, unique
from tests.support.pki import server_pki
from tests.support.resilience import (
    api_versions_request,
    assert_unaffected,
    closed_by_peer,
    raise_nofile,
    recv_frame,
    steady_producer,
    vm_rss_kb,
    wait_for,
)

LIMIT = 256 * 1024  # the frame-size limit of these tests (Tansu takes a Produce of this size)
IDLE_TARGET = int(os.environ.get("KPROXY_IDLE_CONNECTIONS", "10000"))


def live_connections(proxy: ProxyThread) -> int:
    return int(proxy.call(lambda: len(proxy.server.connections)))  # type: ignore[union-attr]


@pytest.fixture
def topic(tansu: Broker) -> str:
    name = unique("resilience")
    create_topic(tansu.bootstrap, name, partitions=1)
    return name


@contextlib.contextmanager
def raw(proxy: ProxyThread) -> Iterator[socket.socket]:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    try:
        yield sock
    finally:
        sock.close()


def test_half_open_client_mid_frame_is_closed_and_forgotten(tansu: Broker, topic: str) -> None:
    """A client that shuts its write side down in the middle of a frame: kproxy closes, nothing stays."""
    with running_proxy(tansu.bootstrap) as proxy, steady_producer(proxy.bootstrap, topic) as steady:
        wait_for(lambda: steady.delivered > 0, 15, "the steady producer's first delivery")
        base = live_connections(proxy)
        socks = []
        for i in range(20):
            sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
            whole = api_versions_request(i)
            sock.sendall(whole[: 4 + i % (len(whole) - 4)])  # the size, then part of the frame
            sock.shutdown(socket.SHUT_WR)
            socks.append(sock)
        started = time.monotonic()
        for sock in socks:
            closed, got = closed_by_peer(sock, timeout=10)
            assert closed, "kproxy kept a half-open connection with a partial frame"
            assert got == b"", "kproxy answered a request it never fully received"
            sock.close()
        took = time.monotonic() - started
        wait_for(lambda: live_connections(proxy) <= base, 10, "kproxy to forget the half-open connections")
        time.sleep(0.5)
    assert took < 10
    assert_unaffected(steady)


def test_half_open_after_a_whole_request_still_gets_its_answer_or_a_clean_close(tansu: Broker) -> None:
    """SHUT_WR right after a complete request: either its answer then EOF, or EOF; never garbage."""
    with running_proxy(tansu.bootstrap) as proxy, raw(proxy) as sock:
        sock.sendall(api_versions_request(41))
        sock.shutdown(socket.SHUT_WR)
        closed, got = closed_by_peer(sock, timeout=10)
        assert closed
        if got:
            (size,) = struct.unpack_from(">i", got, 0)
            assert len(got) == 4 + size, "a partial or extra frame reached the half-closed client"
            assert decode_response(got[4:], 18, 3).header.correlation_id == 41


def test_client_that_never_reads_is_held_at_bounded_memory(tansu: Broker, topic: str) -> None:
    """Pipelined requests, responses never read: kproxy stops reading the client instead of buffering."""
    with running_proxy(tansu.bootstrap, limits__max_in_flight=100) as proxy, \
            steady_producer(proxy.bootstrap, topic) as steady:
        wait_for(lambda: steady.delivered > 0, 15, "the steady producer's first delivery")
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", proxy.port))
            sock.setblocking(False)
            # Metadata answers are ~20x their requests: the answers pile up on kproxy's side.
            request = request_frame(3, 12, 1, topics=None, allow_auto_topic_creation=False)
            sent = 0
            # Generous: on a loaded machine kproxy answers slowly, and the loop ends once blocked for 2 s.
            deadline = time.monotonic() + 30
            blocked_since: float | None = None
            n = 0
            while time.monotonic() < deadline:
                frame = request[:8] + struct.pack(">i", n) + request[12:]
                try:
                    sent += sock.send(frame)
                    n += 1
                    blocked_since = None
                except BlockingIOError:
                    blocked_since = blocked_since or time.monotonic()
                    if time.monotonic() - blocked_since > 2:
                        break  # kproxy stopped reading us: the backpressure we want
                    time.sleep(0.01)
            grown = tracemalloc.get_traced_memory()[0] - before
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
        assert blocked_since is not None, f"kproxy read {sent} bytes of requests without pushing back"
        assert sent < 64 * 1024 * 1024
        assert peak < 32 * 1024 * 1024, f"kproxy's memory grew {peak >> 20} MiB for a client that never reads"
        live = live_connections(proxy)
        sock.close()
        wait_for(lambda: live_connections(proxy) < live, 10, "the non-reading client's connection to close")
    assert_unaffected(steady)
    print(f"never-reading client: {n} requests ({sent} bytes) accepted before backpressure, "
          f"memory {grown >> 10} KiB now, {peak >> 10} KiB peak")


def _produce_of_size(topic: str, size: int, correlation_id: int) -> bytes:
    """A Produce v9 (acks=1) frame whose size prefix says exactly ``size``."""
    value_len = size - 200
    for _ in range(6):
        batch = encode_batch_v2([Record(0, int(time.time() * 1000), b"k", b"x" * value_len)])
        frame = request_frame(0, 9, correlation_id, acks=1, timeout_ms=10000, transactional_id=None,
                              topic_data=[{"name": topic, "partition_data": [{"index": 0, "records": batch}]}])
        have = len(frame) - 4
        if have == size:
            return frame
        value_len += size - have
    raise AssertionError(f"could not build a Produce of exactly {size} bytes")


def test_frame_at_the_limit_passes_and_one_byte_over_is_refused(tansu: Broker, topic: str) -> None:
    with running_proxy(tansu.bootstrap, limits__max_frame_size=LIMIT) as proxy, \
            steady_producer(proxy.bootstrap, topic) as steady:
        wait_for(lambda: steady.delivered > 0, 15, "the steady producer's first delivery")
        with raw(proxy) as sock:
            sock.sendall(_produce_of_size(topic, LIMIT, 5))
            answer = decode_response(recv_frame(sock), 0, 9)
            assert answer.header.correlation_id == 5
            partition = answer.body["responses"][0]["partition_responses"][0]
            assert partition["error_code"] == 0, f"the broker refused the frame at the limit: {partition}"
        with raw(proxy) as sock:
            sock.sendall(api_versions_request(6))
            recv_frame(sock)  # a working connection first
            started = time.monotonic()
            over = _produce_of_size(topic, LIMIT + 1, 7)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(over)
            closed, got = closed_by_peer(sock, timeout=10)
            assert closed and got == b"", "a frame one byte over the limit was not refused by closing"
            assert time.monotonic() - started < 5
    assert_unaffected(steady)


@pytest.mark.parametrize("garbage", [b"GET / HTTP/1.1\r\nHost: kproxy\r\n\r\n", b"\xff\xff\xff\xff",
                                     b"\x00\x00\x00\x08\x7f\x7f\x00\x00\x00\x00\x00\x09", b"\x00" * 3],
                         ids=["http", "negative-size", "unknown-api", "short-size"])
def test_garbage_after_a_valid_frame(tansu: Broker, topic: str, garbage: bytes) -> None:
    """The valid request gets its answer (or none, if kproxy closes first); garbage never reaches the client
    as a response, and the connection ends without disturbing anyone else."""
    with running_proxy(tansu.bootstrap) as proxy, steady_producer(proxy.bootstrap, topic) as steady:
        wait_for(lambda: steady.delivered > 0, 15, "the steady producer's first delivery")
        with raw(proxy) as sock:
            sock.sendall(api_versions_request(9) + garbage)
            if garbage == b"\x00" * 3:
                sock.shutdown(socket.SHUT_WR)  # a size prefix that never completes: the client gives up
            closed, got = closed_by_peer(sock, timeout=10)
            assert closed, "kproxy kept a connection that sent garbage"
            pos = 0
            while pos < len(got):
                (size,) = struct.unpack_from(">i", got, pos)
                payload = got[pos + 4 : pos + 4 + size]
                assert len(payload) == size, "a partial frame reached the client"
                assert decode_response(payload, 18, 3).header.correlation_id == 9, "garbage answered"
                pos += 4 + size
        time.sleep(0.3)
    assert_unaffected(steady)


@pytest.fixture(scope="module")
def server_cert(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return server_pki(tmp_path_factory.mktemp("resilience-pki"))


def test_tls_handshakes_that_never_finish_are_cut_at_the_timeout(tansu: Broker, topic: str,
                                                                 server_cert: dict[str, Path]) -> None:
    """Silent TCP connections and half a ClientHello on a TLS port: closed after connect_timeout.

    A well-behaved TLS client (confluent-kafka over SSL) keeps producing meanwhile.
    """
    timeout = 2.0
    with running_proxy(tansu.bootstrap, tls__client__cert=str(server_cert["cert"]),
                       tls__client__key=str(server_cert["key"]), limits__connect_timeout=timeout) as proxy, \
            steady_producer(proxy.bootstrap, topic, **{"security.protocol": "SSL",
                                                       "ssl.ca.location": str(server_cert["ca"])}) as steady:
        wait_for(lambda: steady.delivered > 0, 15, "the TLS producer's first delivery")
        base = live_connections(proxy)
        hello = _client_hello()
        socks = []
        for i in range(30):
            sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
            if i % 3 == 1:
                sock.sendall(hello[: len(hello) // 2])  # half a ClientHello, then nothing
            elif i % 3 == 2:
                sock.sendall(hello)  # a whole ClientHello, then never the rest of the handshake
            socks.append(sock)
        started = time.monotonic()
        for sock in socks:
            closed, _ = closed_by_peer(sock, timeout=timeout + 8)
            assert closed, "a TLS handshake that never finished was kept open"
            sock.close()
        took = time.monotonic() - started
        assert took < timeout + 8
        assert live_connections(proxy) <= base
        time.sleep(0.5)
    assert_unaffected(steady)


def _client_hello() -> bytes:
    """The first flight of a real TLS client (Python's ssl), captured from a memory BIO."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


# -- many idle connections, against kproxy as its own process -------------------------------------
@pytest.mark.broker  # starts its own Tansu (not the tansu fixture)
def test_many_idle_connections(tmp_path: Path) -> None:
    """As many idle client connections as the fd limit allows (up to 10,000), each with its upstream
    connection: kproxy holds them, serves a real client meanwhile, and its RSS per connection is measured.

    kproxy opens one upstream connection per client, so it needs two fds per connection; the
    test process and the broker need one each. The figure printed goes to docs/RELIABILITY.md.
    """
    soft = raise_nofile()
    # kproxy: 2 fds per connection; this process: 1; Tansu: 1. Keep 300 fds of headroom for each.
    target = max(100, min(IDLE_TARGET, (soft - 300) // 2))
    with run_tansu() as broker:
        port = free_port()
        log = (tmp_path / "kproxy.log").open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "kproxy", "run", "--upstream", broker.bootstrap,
                                 "--listen", f"127.0.0.1:{port}", "--broker-port-base", str(free_port() - 111),
                                 "--shutdown-grace", "2", "--log-level", "warning"],
                                stdout=log, stderr=subprocess.STDOUT)
        socks: list[socket.socket] = []
        try:
            wait_for_port("127.0.0.1", port)
            bootstrap = f"127.0.0.1:{port}"
            name = unique("idle")
            create_topic(bootstrap, name, partitions=1)
            time.sleep(1)
            rss_before = vm_rss_kb(proc.pid)
            started = time.monotonic()
            failures = 0
            while len(socks) < target and time.monotonic() - started < 120:
                try:
                    socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
                except OSError:
                    failures += 1
                    if failures > 50:
                        break
                    time.sleep(0.05)
            opened = time.monotonic() - started
            time.sleep(3)  # let kproxy finish accepting and connecting upstream
            assert proc.poll() is None, "kproxy exited while connections were being opened"
            rss_after = vm_rss_kb(proc.pid)
            with steady_producer(bootstrap, name) as steady:
                wait_for(lambda: steady.delivered >= 20, 30, "a real client to get through meanwhile")
            assert_unaffected(steady, at_least=20)
            per_connection = (rss_after - rss_before) * 1024 / max(len(socks), 1)
            print(f"idle connections: {len(socks)} held (fd soft limit {soft}, target {target}), opened in "
                  f"{opened:.1f} s; kproxy RSS {rss_before} -> {rss_after} KiB, "
                  f"{per_connection / 1024:.1f} KiB per connection (client + upstream socket)")
            assert len(socks) >= min(target, 1000), f"only {len(socks)} connections could be opened"
            assert per_connection < 64 * 1024, f"{per_connection / 1024:.0f} KiB per idle connection"
            # Every one of them is still served: a sample answers ApiVersions.
            for sock in socks[:: max(1, len(socks) // 20)]:
                sock.sendall(api_versions_request(3))
                assert decode_response(recv_frame(sock), 18, 3).header.correlation_id == 3
        finally:
            for sock in socks:
                sock.close()
            stop_process(proc, grace=15)
            log.close()


