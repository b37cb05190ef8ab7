"""Upstream faults: the broker killed and restarted mid-stream, refusing, slow, answering with a
wrong correlation id, closing half-way through a response.

The real Tansu broker where it can show the fault (kill and restart, refusing); a
small fault-injecting relay on raw sockets in front of Tansu for the rest (it
passes everything through and spoils only the responses a test marks). Each case
checks that the client's connection ends cleanly (EOF or reset, never a partial or
foreign frame), that nothing leaks (file descriptors from /proc/self/fd, trio
tasks, kproxy's connections and listeners), and that kproxy serves a real client
again once the broker behaves.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import pytest
import trio

from kproxy.protocol import decode_response
from kproxy.protocol.frame_builder import request_frame
from kproxy.testing import Broker, ProxyThread, free_port, run_tansu, running_proxy
from tests.support.e2e import create_topic, unique
from tests.support.resilience import (
    api_versions_request,
    closed_by_peer,
    open_fds,
    recv_exactly,
    recv_frame,
    steady_producer,
    wait_for,
)

FAULT_CLIENT_ID = "spoil-me"  # the relay spoils responses to requests with this client id


# -- what kproxy holds ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Holdings:
    fds: int
    tasks: int
    connections: int
    listeners: int


def holdings(proxy: ProxyThread) -> Holdings:
    def inside() -> tuple[int, int, int]:
        def count(task: trio.lowlevel.Task) -> int:
            return 1 + sum(count(child) for nursery in task.child_nurseries for child in nursery.child_tasks)

        server = proxy.server
        assert server is not None
        return count(trio.lowlevel.current_root_task()), len(server.connections), len(server.listeners)

    tasks, connections, listeners = proxy.call(inside)
    return Holdings(open_fds(), tasks, connections, listeners)


def assert_back_to(proxy: ProxyThread, before: Holdings, timeout: float = 10.0) -> None:
    """kproxy holds no more than it did before the fault (fds: a little slack for the test's clients)."""
    def settled() -> bool:
        now = holdings(proxy)
        return (now.connections <= before.connections and now.tasks <= before.tasks
                and now.listeners == before.listeners and now.fds <= before.fds + 2)

    try:
        wait_for(settled, timeout, "kproxy to release what the faulty connections held")
    except AssertionError:
        raise AssertionError(f"leak: before {before}, after {holdings(proxy)}") from None


def metadata_request(correlation_id: int, client_id: str = FAULT_CLIENT_ID) -> bytes:
    return request_frame(3, 12, correlation_id, client_id=client_id, topics=None, allow_auto_topic_creation=False)


def real_client_gets_through(bootstrap: str, topic: str, count: int = 10, timeout: float = 30.0) -> None:
    with steady_producer(bootstrap, topic) as steady:
        wait_for(lambda: steady.delivered >= count, timeout, "a real client to get through kproxy")


# -- a fault-injecting relay on raw sockets ------------------------------------------------------------------
@dataclass
class FaultyRelay:
    """Relays TCP to ``upstream``; responses to requests from FAULT_CLIENT_ID get ``fault``:

    * ``"wrong-correlation-id"`` - the correlation id is changed;
    * ``"close-half-way"`` - half of the response is sent, then both sides are closed;
    * ``"slow"`` - the response is held ``delay`` seconds.
    """

    upstream: tuple[str, int]
    fault: str
    delay: float = 0.0
    port: int = 0
    spoiled: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _socks: list[socket.socket] = field(default_factory=list)

    def __enter__(self) -> FaultyRelay:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for sock in [self._listener, *self._socks]:
            with contextlib.suppress(OSError):
                sock.close()
        for thread in self._threads:
            thread.join(5)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _spawn(self, fn: object, *args: object) -> None:
        thread = threading.Thread(target=fn, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(self.upstream, timeout=10)
            self._socks += [client, upstream]
            marked: set[int] = set()
            self._spawn(self._requests, client, upstream, marked)
            self._spawn(self._responses, upstream, client, marked)

    def _requests(self, client: socket.socket, upstream: socket.socket, marked: set[int]) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            client.settimeout(None)
            while True:
                head = recv_exactly(client, 4)
                payload = recv_exactly(client, struct.unpack(">i", head)[0])
                (correlation_id, n) = struct.unpack_from(">ih", payload, 4)
                if payload[10 : 10 + max(n, 0)] == FAULT_CLIENT_ID.encode():
                    marked.add(correlation_id)
                upstream.sendall(head + payload)
        self._close(client, upstream)

    def _responses(self, upstream: socket.socket, client: socket.socket, marked: set[int]) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            upstream.settimeout(None)
            while True:
                head = recv_exactly(upstream, 4)
                payload = recv_exactly(upstream, struct.unpack(">i", head)[0])
                (correlation_id,) = struct.unpack_from(">i", payload, 0)
                if correlation_id in marked:
                    self.spoiled += 1
                    if self.fault == "wrong-correlation-id":
                        payload = struct.pack(">i", correlation_id + 1000) + payload[4:]
                    elif self.fault == "close-half-way":
                        whole = head + payload
                        client.sendall(whole[: len(whole) // 2])
                        break
                    elif self.fault == "slow":
                        time.sleep(self.delay)
                client.sendall(head + payload)
        self._close(client, upstream)

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture
def topic(tansu: Broker) -> str:
    name = unique("upstream-fault")
    create_topic(tansu.bootstrap, name, partitions=1)
    return name


@pytest.mark.parametrize("fault", ["wrong-correlation-id", "close-half-way"])
def test_spoiled_response_closes_the_client_cleanly(tansu: Broker, topic: str, fault: str) -> None:
    with FaultyRelay((tansu.host, tansu.port), fault) as relay, running_proxy(relay.bootstrap) as proxy:
        real_client_gets_through(proxy.bootstrap, topic)
        before = holdings(proxy)
        for i in range(10):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
                sock.sendall(api_versions_request(100 + i))  # unspoiled: answered
                assert decode_response(recv_frame(sock), 18, 3).header.correlation_id == 100 + i
                sock.sendall(metadata_request(200 + i))
                closed, got = closed_by_peer(sock, timeout=10)
                assert closed, f"{fault}: the client connection was left open"
                assert got == b"", f"{fault}: {len(got)} bytes of a spoiled response reached the client"
        assert relay.spoiled == 10
        assert_back_to(proxy, before)
        real_client_gets_through(proxy.bootstrap, topic)


def test_slow_broker_delays_only_its_own_clients(tansu: Broker, topic: str) -> None:
    """A response held 3 s: that client waits and gets it intact; other clients are not held up."""
    with FaultyRelay((tansu.host, tansu.port), "slow", delay=3.0) as relay, \
            running_proxy(relay.bootstrap) as proxy:
        real_client_gets_through(proxy.bootstrap, topic)
        before = holdings(proxy)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as slow, \
                steady_producer(proxy.bootstrap, topic) as steady:
            wait_for(lambda: steady.delivered > 0, 15, "the steady producer's first delivery")
            started = time.monotonic()
            slow.sendall(metadata_request(7))
            answer = decode_response(recv_frame(slow), 3, 12)
            waited = time.monotonic() - started
            assert answer.header.correlation_id == 7 and answer.body["brokers"], "the slow answer was spoiled"
            assert 2.5 < waited < 8
            during = steady.delivered
        assert not steady.errors and during >= 20, f"others were held up: {during} deliveries, {steady.errors}"
        assert steady.worst_latency < 2.0
        assert_back_to(proxy, before)


@pytest.mark.broker  # starts its own Tansu (not the tansu fixture)
def test_refusing_broker_then_it_arrives(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Nothing listens upstream: each client is closed promptly, nothing piles up; then the broker
    starts on that port and kproxy serves real clients without a restart."""
    port = free_port()
    with running_proxy(f"127.0.0.1:{port}", limits__connect_timeout=2) as proxy:
        time.sleep(0.5)
        before = holdings(proxy)
        for i in range(30):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
                sock.sendall(api_versions_request(i))
                closed, got = closed_by_peer(sock, timeout=5)
                assert closed and got == b"", "a client of a refusing broker was not closed cleanly"
        assert_back_to(proxy, before)
        with run_tansu(port) as broker:
            name = unique("arrived")
            create_topic(broker.bootstrap, name, partitions=1)
            real_client_gets_through(proxy.bootstrap, name, timeout=45)


@pytest.mark.broker  # starts its own Tansu (not the tansu fixture)
def test_broker_killed_and_restarted_mid_stream() -> None:
    """SIGKILL the broker while a producer runs and raw clients wait on answers; restart it on the
    same port. Every client connection ends cleanly, nothing leaks, producing resumes."""
    port = free_port()
    stack = contextlib.ExitStack()
    with stack:
        broker = stack.enter_context(run_tansu(port))
        name = unique("restart")
        create_topic(broker.bootstrap, name, partitions=1)
        proxy = stack.enter_context(running_proxy(broker.bootstrap))
        real_client_gets_through(proxy.bootstrap, name)
        before = holdings(proxy)
        with steady_producer(proxy.bootstrap, name, **{"message.timeout.ms": 60000}) as steady:
            wait_for(lambda: steady.delivered >= 20, 20, "deliveries before the kill")
            waiting = []
            for i in range(5):
                sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
                sock.sendall(api_versions_request(i))
                recv_frame(sock)
                waiting.append(sock)
            broker.process.kill()
            broker.process.wait(10)
            killed_at = steady.delivered
            for sock in waiting:
                closed, got = closed_by_peer(sock, timeout=10)
                assert closed and got == b"", "a client connection outlived its broker or got bytes"
                sock.close()
            time.sleep(2)
            restarted = stack.enter_context(run_tansu(port))
            create_topic(restarted.bootstrap, name, partitions=1)  # in-memory storage starts empty
            wait_for(lambda: steady.delivered >= killed_at + 20, 60, "producing to resume after the restart")
        assert_back_to(proxy, before, timeout=15)
        real_client_gets_through(proxy.bootstrap, name)
