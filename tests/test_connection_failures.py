"""The server layer when things go wrong: dead upstreams, vanishing clients, hostile frames,
slow readers, idle connections and shutdown.

Most tests run a real :class:`ProxyServer` in the test's trio run in front of a
scripted fake broker (tests/support/fakecluster.py). The ones that need exact
interleavings or time drive a :class:`Connection` over trio's in-memory
streams with a virtual clock instead.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import struct
import tracemalloc
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
import trio.testing

from kproxy.config import Limits
from kproxy.host_port import HostPort
from kproxy.protocol import FrameSplitter, frame
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap, BrokerRoute
from kproxy.proxy.session import Session, Verdict
from kproxy.server.connection import Connection
from kproxy.server.proxy_server import ProxyServer
from kproxy.testing import proxy_config, running_server
from tests.support.fakecluster import METADATA, CloseConnection, FakeBroker, FakeCluster, Received, fake_cluster
from tests.support.kafkaclient import KafkaClient

UNKNOWN_API = 30000  # passes through kproxy untouched; the fake echoes it unless told otherwise
MiB = 1024 * 1024


def opaque(correlation_id: int, body: bytes = b"") -> bytes:
    """A request frame of an api key nobody knows (header v1, null client id)."""
    return frame(struct.pack(">hhih", UNKNOWN_API, 0, correlation_id, -1) + body)


def opaque_answer(correlation_id: int, body: bytes = b"") -> bytes:
    return frame(struct.pack(">i", correlation_id) + body)


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.005)


def open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextlib.asynccontextmanager
async def proxied(**options: Any) -> AsyncIterator[tuple[FakeCluster, ProxyServer]]:
    async with fake_cluster((0,)) as cluster, running_server(proxy_config(cluster.bootstrap, **options)) as server:
        yield cluster, server


def only_connection(server: ProxyServer) -> Connection:
    [conn] = server.connections
    return conn


# -- upstream failures ----------------------------------------------------------------------------
async def test_upstream_refused_closes_the_client_and_leaks_nothing() -> None:
    config = proxy_config(f"127.0.0.1:{closed_port()}", limits__connect_timeout=2)
    async with running_server(config) as server:
        before = open_fds()
        for _ in range(5):
            async with await KafkaClient.connect(server.bootstrap_port) as client:
                assert await client.closed_by_peer() == b""
        await wait_until(lambda: not server.connections)
        assert server.connections_total == 5
        if before is not None:
            # At most as many as before: broker discovery retries in the background, and its probe
            # socket may have been open when `before` was counted (one connect() in flight).
            await wait_until(lambda: open_fds() <= before)


async def test_upstream_dies_with_requests_in_flight_no_invented_answers() -> None:
    async with proxied() as (cluster, server):
        async def first_only(broker: FakeBroker, received: Received) -> bytes:
            if received.correlation_id == 1:
                return struct.pack(">i", 1) + b"one"
            raise CloseConnection

        cluster.handlers[UNKNOWN_API] = first_only
        async with await KafkaClient.connect(server.bootstrap_port) as client:
            await client.send_raw(opaque(1) + opaque(2) + opaque(3))
            assert await client.receive_frame() == struct.pack(">i", 1) + b"one"
            assert await client.closed_by_peer() == b""
        await wait_until(lambda: not server.connections)


async def test_upstream_dies_mid_response_client_gets_no_partial_frame() -> None:
    async with proxied() as (cluster, server):
        async def half(broker: FakeBroker, received: Received) -> bytes:
            raise CloseConnection(last_words=opaque_answer(received.correlation_id, b"x" * 1000)[:300])

        cluster.handlers[UNKNOWN_API] = half
        async with await KafkaClient.connect(server.bootstrap_port) as client:
            await client.send_raw(opaque(1))
            assert await client.closed_by_peer() == b""
        await wait_until(lambda: not server.connections)


async def test_garbage_from_upstream_closes_the_connection() -> None:
    async with proxied() as (cluster, server):
        async def wrong_id(broker: FakeBroker, received: Received) -> bytes:
            return struct.pack(">i", received.correlation_id + 1000)

        cluster.handlers[UNKNOWN_API] = wrong_id
        async with await KafkaClient.connect(server.bootstrap_port) as client:
            await client.send_raw(opaque(1))
            assert await client.closed_by_peer() == b""
        await wait_until(lambda: not server.connections)


# -- client failures ------------------------------------------------------------------------------
async def test_client_disconnects_mid_request_nothing_left_behind() -> None:
    async with proxied() as (cluster, server):
        broker = cluster.brokers[0]
        client = await KafkaClient.connect(server.bootstrap_port)
        await client.send_raw(opaque(1, b"y" * 100)[:50])  # half a frame
        await wait_until(lambda: broker.open_connections == 1)
        await client.aclose()
        await wait_until(lambda: not server.connections and broker.open_connections == 0)
        assert cluster.received == [], "half a request is never forwarded"


async def test_client_disconnects_with_a_request_in_flight() -> None:
    async with proxied() as (cluster, server):
        broker = cluster.brokers[0]
        answered = trio.Event()

        async def slow(b: FakeBroker, received: Received) -> bytes:
            await trio.sleep(0.3)
            answered.set()
            return struct.pack(">i", received.correlation_id)

        cluster.handlers[UNKNOWN_API] = slow
        client = await KafkaClient.connect(server.bootstrap_port)
        await client.send_raw(opaque(1))
        await wait_until(lambda: len(cluster.received) == 1)
        conn = only_connection(server)
        await client.aclose()
        await wait_until(lambda: not server.connections)
        assert not answered.is_set(), "the proxy let go before the broker answered"
        assert conn.close_reason == "client closed"
        with trio.fail_after(5):
            await answered.wait()
        await wait_until(lambda: broker.open_connections == 0)


# -- hostile frames --------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix", [struct.pack(">i", 4096), struct.pack(">i", -1), struct.pack(">i", 2**31 - 1)])
async def test_oversize_request_closes_that_connection_only(prefix: bytes) -> None:
    async with proxied(limits__max_frame_size=1024) as (cluster, server):
        async with await KafkaClient.connect(server.bootstrap_port) as good, \
                await KafkaClient.connect(server.bootstrap_port) as bad:
            await good.request(METADATA, 12, topics=[])
            before = len(cluster.received)
            await bad.send_raw(prefix + b"z" * 200)
            assert await bad.closed_by_peer() == b""
            assert len(cluster.received) == before, "nothing of the oversize frame went upstream"
            for _ in range(3):
                await good.request(METADATA, 12, topics=[])
            await good.send_raw(opaque(99, b"q" * 900))  # just under the limit: fine
            assert await good.receive_frame() == struct.pack(">i", 99) + b"echo" + opaque(99, b"q" * 900)[4:]
        await wait_until(lambda: not server.connections)


async def test_oversize_response_closes_that_connection_only() -> None:
    async with proxied(limits__max_frame_size=1024) as (cluster, server):
        async def big(broker: FakeBroker, received: Received) -> bytes:
            return struct.pack(">i", received.correlation_id) + b"B" * 2000

        cluster.handlers[UNKNOWN_API] = big
        async with await KafkaClient.connect(server.bootstrap_port) as good, \
                await KafkaClient.connect(server.bootstrap_port) as bad:
            await bad.send_raw(opaque(1))
            assert await bad.closed_by_peer() == b""
            response = await good.request(METADATA, 12, topics=[])
            assert response.body["brokers"]


# -- slow clients ----------------------------------------------------------------------------------
async def test_slow_client_does_not_grow_proxy_memory() -> None:
    frames, size = 48, MiB
    blob = b"R" * size
    produced = 0

    async def huge(broker: FakeBroker, received: Received) -> bytes:
        nonlocal produced
        produced += 1
        return struct.pack(">i", received.correlation_id) + blob

    async with proxied() as (cluster, server):
        cluster.handlers[UNKNOWN_API] = huge
        client = await KafkaClient.connect(server.bootstrap_port, timeout=20)
        assert isinstance(client.stream, trio.SocketStream)
        client.stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        async with client:
            tracemalloc.start(30)
            try:
                await client.send_raw(b"".join(opaque(c) for c in range(1, frames + 1)))
                await wait_until(lambda: produced > 0)
                # Let the broker push as much as the sockets take, then measure.
                stalled_at = -1
                while stalled_at != produced:
                    stalled_at = produced
                    await trio.sleep(0.15)
                snapshot = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
            # What the proxy's own code holds (allocated with a kproxy server or proxy frame on the stack).
            ours = snapshot.filter_traces([tracemalloc.Filter(True, f"*/kproxy/{d}/*", all_frames=True)
                                           for d in ("server", "proxy")])
            held = sum(stat.size for stat in ours.statistics("filename"))
            read_size = server.config.limits.read_size
            assert held < 2 * read_size + 2 * size, f"the proxy holds {held} bytes"
            assert produced < frames / 2, "backpressure reached the broker"
            # Nothing was lost: once the client reads, every answer arrives, in order.
            for c in range(1, frames + 1):
                payload = await client.receive_frame()
                assert payload[:4] == struct.pack(">i", c)
                assert len(payload) == 4 + size
        assert produced == frames


def memory_connection(limits: Limits) -> tuple[Connection, trio.abc.Stream, trio.abc.Stream]:
    """A Connection over in-memory streams: (connection, client end, upstream end)."""
    proxy_client, client = trio.testing.memory_stream_pair()
    proxy_upstream, upstream = trio.testing.memory_stream_pair()
    return _connection(limits, proxy_client, proxy_upstream), client, upstream


def _connection(limits: Limits, client: trio.abc.Stream, upstream: trio.abc.Stream) -> Connection:
    async def no_listeners(routes: list[BrokerRoute]) -> None:
        pass

    session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), max_in_flight=limits.max_in_flight,
                      max_frame_size=limits.max_frame_size)
    return Connection(client, upstream, session, limits=limits, ensure_listeners=no_listeners, peer="test",
                      listener="bootstrap", upstream_addr=HostPort("upstream.test", 9092))


async def read_frames(stream: trio.abc.Stream, count: int) -> list[bytes]:
    splitter = FrameSplitter()
    out: list[bytes] = []
    while len(out) < count:
        data = await stream.receive_some(65536)
        assert data, "closed early"
        splitter.feed(data)
        out += splitter.raw_frames()
    return out


async def test_slow_client_stops_the_proxy_reading_upstream_exactly() -> None:
    """Lockstep streams: a send completes only when the peer has read it all."""
    frames, size = 12, 256 * 1024
    proxy_client, client = trio.testing.lockstep_stream_pair()
    proxy_upstream, upstream = trio.testing.lockstep_stream_pair()
    conn = _connection(Limits(read_size=16 * 1024), proxy_client, proxy_upstream)
    sent = 0

    async def broker() -> None:
        nonlocal sent
        assert len(await read_frames(upstream, frames)) == frames
        for c in range(1, frames + 1):
            await upstream.send_all(opaque_answer(c, b"r" * size))
            sent += 1

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            nursery.start_soon(broker)
            await client.send_all(b"".join(opaque(c) for c in range(1, frames + 1)))
            await trio.testing.wait_all_tasks_blocked()
            # One answer went through the proxy and waits for the client; the next is half read.
            assert sent == 1
            assert [f[4:8] for f in await read_frames(client, frames)] == [
                struct.pack(">i", c) for c in range(1, frames + 1)]
            assert sent == frames
            await client.aclose()


# -- idle timeout -----------------------------------------------------------------------------------
async def test_idle_timeout_closes_an_idle_connection_not_a_busy_one() -> None:
    async with proxied(limits__idle_timeout=0.3) as (_, server), \
            await KafkaClient.connect(server.bootstrap_port) as idle, \
            await KafkaClient.connect(server.bootstrap_port) as busy:
        start = trio.current_time()
        with trio.fail_after(5):
            for _ in range(6):
                await busy.request(METADATA, 12, topics=[])
                await trio.sleep(0.1)
            assert await idle.closed_by_peer() == b""
        assert trio.current_time() - start > 0.25
        await busy.request(METADATA, 12, topics=[])  # still open
        assert len(server.connections) == 1


async def test_idle_timeout_on_a_virtual_clock(autojump_clock: trio.testing.MockClock) -> None:
    conn, client, upstream = memory_connection(Limits(idle_timeout=600))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        start = trio.current_time()
        await trio.sleep(599)
        await client.send_all(opaque(1))  # activity resets the clock
        assert await upstream.receive_some() == opaque(1)
        await upstream.send_all(opaque_answer(1))
        assert await client.receive_some() == opaque_answer(1)
        assert await client.receive_some() == b""  # ... until 600 s of nothing
        assert trio.current_time() - start == pytest.approx(1199, abs=0.01)
    assert conn.close_reason == "idle timeout"


# -- frame deadline (slowloris) ----------------------------------------------------------------------
async def test_a_trickled_frame_is_cut_at_the_frame_deadline_on_a_virtual_clock(
        autojump_clock: trio.testing.MockClock) -> None:
    """A byte every 2 s keeps the connection from ever being idle; the frame deadline (default
    30 s from the frame's first byte) ends it all the same, and says why."""
    conn, client, upstream = memory_connection(Limits(idle_timeout=3))
    rejected: list[str] = []
    conn.on_reject = rejected.append
    request = opaque(1, b"x" * 100)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        # Whole frames, however slow between them, are fine: each is complete when its first byte is in.
        for c in range(2, 12):
            await client.send_all(opaque(c))
            assert await upstream.receive_some() == opaque(c)
            await trio.sleep(2.5)

        async def trickle() -> None:
            for byte in request:
                try:
                    await client.send_all(bytes([byte]))
                except trio.BrokenResourceError:
                    return
                await trio.sleep(2)

        start = trio.current_time()
        nursery.start_soon(trickle)
        assert await client.receive_some() == b""
        assert trio.current_time() - start == pytest.approx(30, abs=0.01)
    assert conn.close_reason == "request frame not complete within frame_timeout 30 s"
    assert rejected == ["request_timeout"]


async def test_the_frame_deadline_restarts_with_each_frame(autojump_clock: trio.testing.MockClock) -> None:
    conn, client, upstream = memory_connection(Limits(frame_timeout=10))
    # Nine frames of 31 bytes sent 9 bytes every 2 s: each takes about 8 s, most begin in the chunk
    # that ends the one before. 60 s of traffic, no frame later than its own 10 s.
    frames = b"".join(opaque(c, b"y" * 21) for c in range(1, 10))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        for piece in range(0, len(frames), 9):
            await client.send_all(frames[piece:piece + 9])
            await trio.sleep(2)
        assert await read_frames(upstream, 9) == [opaque(c, b"y" * 21) for c in range(1, 10)]
        await client.aclose()
    assert conn.close_reason == "client closed"


async def test_the_frame_deadline_waits_while_kproxy_does_not_read(autojump_clock: trio.testing.MockClock) -> None:
    """A request behind one awaiting its answer (max_in_flight reached) is not the client's delay."""
    conn, client, upstream = memory_connection(Limits(frame_timeout=10, max_in_flight=1))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client.send_all(opaque(50) + opaque(51)[:5])  # kproxy holds 5 bytes of frame 51 ...
        assert await upstream.receive_some() == opaque(50)
        await trio.sleep(60)  # ... and reads no more until 50 is answered
        await upstream.send_all(opaque_answer(50))
        assert await client.receive_some() == opaque_answer(50)
        await trio.sleep(9)  # the client gets its full frame_timeout from then
        await client.send_all(opaque(51)[5:])
        assert await upstream.receive_some() == opaque(51)
        await upstream.send_all(opaque_answer(51))
        assert await client.receive_some() == opaque_answer(51)
        await client.aclose()
    assert conn.close_reason == "client closed"


async def test_slowloris_over_a_real_socket_other_clients_unaffected() -> None:
    async with proxied(limits__idle_timeout=3, limits__frame_timeout=0.5) as (_, server), \
            await KafkaClient.connect(server.bootstrap_port) as slow, \
            await KafkaClient.connect(server.bootstrap_port) as busy:
        start = trio.current_time()
        request = opaque(1, b"z" * 64)
        with trio.fail_after(5):
            for byte in request:  # as in the field: a byte at a time, well within the idle timeout
                try:
                    await slow.send_raw(bytes([byte]))
                except trio.BrokenResourceError:
                    break
                await busy.request(METADATA, 12, topics=[])
                if trio.current_time() - start > 1.5:
                    break
                await trio.sleep(0.1)
            assert await slow.closed_by_peer() == b""
        assert 0.45 < trio.current_time() - start < 1.5
        await busy.request(METADATA, 12, topics=[])
        assert server.stats.frames_rejected["request_timeout"] == 1
        assert len(server.connections) == 1


# -- shutdown -----------------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def own_server(upstream: str, **options: Any) -> AsyncIterator[tuple[ProxyServer, trio.Nursery]]:
    """A server whose ``run`` must return by itself (after ``shutdown``) when the block ends."""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server = ProxyServer(proxy_config(upstream, **options), handle_signals=False)
            await nursery.start(server.run)
            yield server, nursery


async def cannot_connect(port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return True
    await stream.aclose()
    return False


async def test_shutdown_stops_accepting_finishes_in_flight_then_closes() -> None:
    async with fake_cluster((0, 1)) as cluster, own_server(cluster.bootstrap) as (server, _):
        async def slow(broker: FakeBroker, received: Received) -> bytes:
            await trio.sleep(0.3)
            return struct.pack(">i", received.correlation_id) + b"late but whole"

        cluster.handlers[UNKNOWN_API] = slow
        busy = await KafkaClient.connect(server.bootstrap_port)
        idle = await KafkaClient.connect(server.bootstrap_port)
        broker_port = next(b["port"] for b in (await idle.request(METADATA, 12, topics=[])).body["brokers"])
        await busy.send_raw(opaque(1))
        await wait_until(lambda: len([r for r in cluster.received if r.api_key == UNKNOWN_API]) == 1)
        conns = set(server.connections)
        server.shutdown()
        assert await cannot_connect(server.bootstrap_port)
        assert await cannot_connect(broker_port)
        assert await idle.closed_by_peer() == b"", "nothing in flight: closed at once"
        assert await busy.receive_frame() == struct.pack(">i", 1) + b"late but whole"
        assert await busy.closed_by_peer() == b""
        assert {c.close_reason for c in conns} == {"shutdown"}
        await busy.aclose()
        await idle.aclose()
    assert not server.connections


async def test_shutdown_before_start_up_completes_ends_run_cleanly() -> None:
    """A shutdown that comes before ``run`` (or while it starts) opens no listener, and ``run``
    returns, telling whoever waits for its start, instead of failing or serving on."""
    async with fake_cluster((0,)) as cluster:
        server = ProxyServer(proxy_config(cluster.bootstrap), handle_signals=False)
        server.shutdown()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(server.run)
        assert server.bootstrap_port == 0 and not server.listeners


SHUTDOWN_GRACE = 0.5
# What may come after the grace ends: trio running the cancelled connection task and a loopback
# FIN. Measured at 2-25 ms on a loaded 2-core machine; 0.2 s leaves ~8x that for a slower one,
# while a grace counted twice, or a connection left to its idle timeout, lands far outside it.
GRACE_OVERSHOOT = 0.2


async def test_shutdown_grace_expiry_cancels_what_is_left() -> None:
    async with fake_cluster((0,)) as cluster, \
            own_server(cluster.bootstrap, limits__shutdown_grace=SHUTDOWN_GRACE) as (server, _):
        async def never(broker: FakeBroker, received: Received) -> bytes:
            await trio.sleep(60)
            raise AssertionError("unreachable")

        cluster.handlers[UNKNOWN_API] = never
        async with await KafkaClient.connect(server.bootstrap_port) as client:
            await client.send_raw(opaque(1))
            await wait_until(lambda: len(cluster.received) == 1)
            start = trio.current_time()
            server.shutdown()
            assert await client.closed_by_peer() == b"", "no invented answer"
            elapsed = trio.current_time() - start
            # No lower margin: the grace starts after shutdown() returns, on this same clock.
            assert SHUTDOWN_GRACE <= elapsed < SHUTDOWN_GRACE + GRACE_OVERSHOOT, (
                f"closed {elapsed:.3f} s after shutdown, grace {SHUTDOWN_GRACE} s")
    assert not server.connections


async def test_drain_before_a_read_request_is_forwarded_drops_it_cleanly(
        autojump_clock: trio.testing.MockClock) -> None:
    """Shutdown landing between a client read and its forwarding, nothing in flight: the
    request never reaches the broker and the connection closes (the client retries)."""
    conn, client, upstream = memory_connection(Limits(idle_timeout=600))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        await client.send_all(opaque(1))  # the proxy's read completes ...
        conn.drain()  # ... and shutdown begins before it runs again
        assert await upstream.receive_some() == b""
        assert await client.receive_some() == b""
        assert trio.current_time() - start < 1
    assert conn.close_reason == "shutdown"


async def test_drain_between_read_and_forward_with_requests_in_flight_does_not_stall(
        autojump_clock: trio.testing.MockClock) -> None:
    """Shutdown landing between a client read and its forwarding, while an earlier request is
    in flight: the read request is forwarded whole and answered, then the connection closes.
    A request tracked but never sent would leave the connection waiting for an answer that
    cannot come, until the grace period or the idle timeout ran out."""
    conn, client, upstream = memory_connection(Limits(idle_timeout=600))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client.send_all(opaque(1))
        assert await upstream.receive_some() == opaque(1)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        await client.send_all(opaque(2))  # the proxy's read completes ...
        conn.drain()  # ... and shutdown begins before it runs again
        with trio.fail_after(5):
            assert await upstream.receive_some() == opaque(2)
            await upstream.send_all(opaque_answer(1, b"one") + opaque_answer(2, b"two"))
            assert await read_frames(client, 2) == [opaque_answer(1, b"one"), opaque_answer(2, b"two")]
            assert await client.receive_some() == b""
            assert await upstream.receive_some() == b""
        assert trio.current_time() - start < 1
    assert conn.close_reason == "shutdown"


# -- the session's wake-up requests --------------------------------------------------------------------
class _Delayed:
    """A policy that holds every answer ``hold`` seconds after it came: what a response delay rule does."""

    hold = 5.0

    def decide(self, exchange: Any) -> Verdict:
        return Verdict(response_delay_s=self.hold)


async def test_a_wake_up_the_session_asks_for_is_kept(autojump_clock: trio.testing.MockClock) -> None:
    limits = Limits()
    # The session's clock is trio's (here, the mock one): the connection converts its wake-up times.
    session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), max_frame_size=limits.max_frame_size,
                      clock=trio.current_time, policy=_Delayed())

    async def no_listeners(routes: Any) -> None:
        pass

    proxy_client, client = trio.testing.memory_stream_pair()
    proxy_upstream, upstream = trio.testing.memory_stream_pair()
    conn = Connection(proxy_client, proxy_upstream, session, limits=limits, ensure_listeners=no_listeners,
                      peer="test", listener="bootstrap", upstream_addr=HostPort("upstream.test", 9092))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client.send_all(opaque(1))
        assert await upstream.receive_some() == opaque(1)
        start = trio.current_time()
        await upstream.send_all(opaque_answer(1))
        assert await client.receive_some() == opaque_answer(1)
        assert trio.current_time() - start == pytest.approx(_Delayed.hold, abs=0.05)
        await client.aclose()
    assert conn.close_reason == "client closed"


async def test_big_frames_cross_real_sockets_byte_for_byte_in_pieces() -> None:
    """Plain sockets (the vectored writes) and no observer (responses spanning reads go out as the
    reads): big requests and answers, sent in uneven writes, arrive whole and in order."""
    def socket_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
        a, b = trio.socket.socketpair()
        return trio.SocketStream(a), trio.SocketStream(b)

    proxy_client, client = socket_pair()
    proxy_upstream, upstream = socket_pair()
    conn = _connection(Limits(read_size=64 * 1024), proxy_client, proxy_upstream)
    requests = b"".join(opaque(c, bytes([c]) * 300_000) for c in range(1, 4))
    answers = b"".join(opaque_answer(c, bytes([c]) * 1_000_003) for c in range(1, 4))

    async def send_unevenly(stream: trio.SocketStream, data: bytes) -> None:
        for i, cut in enumerate(range(0, len(data), 100_001)):
            await stream.send_all(data[cut : cut + 100_001])
            if i % 3 == 0:
                await trio.sleep(0.001)  # let the proxy read part of a frame

    async def receive(stream: trio.SocketStream, n: int) -> bytes:
        got = bytearray()
        while len(got) < n:
            data = await stream.receive_some(1 << 20)
            assert data, "closed early"
            got += data
        return bytes(got)

    async def broker() -> None:
        assert await receive(upstream, len(requests)) == requests
        await send_unevenly(upstream, answers)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            nursery.start_soon(broker)
            await send_unevenly(client, requests)
            assert await receive(client, len(answers)) == answers
            await client.aclose()


async def test_a_wake_up_due_after_the_connections_tasks_ended_is_dropped() -> None:
    """trio closes a nursery as its last task exits and resumes its owner later: the server's
    deadlines task can call a connection back in between, with a wake-up due (a delay rule's held
    answer) and the connection's nursery closed. That call returns, starting nothing (it raised
    "Nursery is closed to new arrivals", ending the deadlines task and the server with it)."""
    conn, _, _ = memory_connection(Limits())
    async with trio.open_nursery() as closed:
        pass
    conn._nursery = closed  # what run() set, its tasks ended, run() not resumed yet
    conn._wake_due = 0.0
    conn._touch()
    conn.on_deadline(trio.current_time())
    assert conn._wake_due == math.inf

