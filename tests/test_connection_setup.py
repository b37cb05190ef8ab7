"""What every connection pays to open and close, and the process-level gc settings of ``kproxy run``."""

from __future__ import annotations

import errno
import gc
import socket
from collections.abc import Iterator

import pytest
import trio
import trio.testing

from kproxy import memory
from kproxy.server.connection import _close
from kproxy.server.proxy_server import ProxyServer
from kproxy.server.sockets import open_tcp, os_reason
from kproxy.testing.proxy_thread import proxy_config
from tests.support.fakecluster import fake_cluster


async def listening() -> tuple[trio.SocketListener, int]:
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    return listener, listener.socket.getsockname()[1]


async def test_an_upstream_address_literal_connects_without_open_tcp_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    # open_tcp_stream races addresses in a nursery of its own; an address literal has none to race.
    def not_for_literals(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("open_tcp_stream used for an IP address")

    monkeypatch.setattr(trio, "open_tcp_stream", not_for_literals)
    listener, port = await listening()
    async with listener:
        with trio.fail_after(5):
            stream = await open_tcp("127.0.0.1", port)
            async with stream, await listener.accept() as accepted:
                assert stream.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                await stream.send_all(b"kafka")
                assert await accepted.receive_some(10) == b"kafka"


async def test_an_upstream_host_name_still_goes_through_open_tcp_stream() -> None:
    listener, port = await listening()
    async with listener:
        with trio.fail_after(5):
            stream = await open_tcp("localhost", port)
            async with stream, await listener.accept() as accepted:
                await accepted.send_all(b"k")
                assert await stream.receive_some(10) == b"k"


async def test_a_refused_address_literal_says_connection_refused() -> None:
    listener, port = await listening()
    await listener.aclose()  # nothing listens there any more
    with pytest.raises(OSError) as failure:
        await open_tcp("127.0.0.1", port)
    assert failure.value.errno == errno.ECONNREFUSED
    assert os_reason(failure.value) == "connection refused"


async def test_a_plain_stream_is_closed_at_once_even_in_a_cancelled_scope() -> None:
    left, right = trio.socket.socketpair()
    stream, peer = trio.SocketStream(left), trio.SocketStream(right)
    with trio.CancelScope() as scope:
        scope.cancel()
        await _close(stream)  # no checkpoint: nothing to raise Cancelled
        assert stream.socket.fileno() == -1
    assert not scope.cancelled_caught
    with trio.fail_after(5):
        assert await peer.receive_some(10) == b""


@pytest.fixture
def restored_gc() -> Iterator[None]:
    """The collector's thresholds as they were, and the objects frozen again if they were (tests/conftest.py)."""
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count() > 0
    yield
    gc.unfreeze()
    if frozen:
        gc.freeze()
    gc.set_threshold(*threshold)


def test_tune_gc_raises_only_the_generation_0_threshold(restored_gc: None) -> None:
    gc.set_threshold(700, 10, 10)
    memory.tune_gc()
    assert gc.get_threshold() == (memory.GEN0_THRESHOLD, 10, 10)


@pytest.mark.parametrize("freeze", [True, False])
async def test_the_server_freezes_start_up_objects_only_when_asked(restored_gc: None, freeze: bool) -> None:
    # Only `kproxy run` (and the bench runner) own their process; servers inside tests and
    # embedding programs must leave the collector alone.
    gc.unfreeze()
    async with fake_cluster((0,)) as cluster, trio.open_nursery() as nursery:
        server = ProxyServer(proxy_config(cluster.bootstrap), handle_signals=False, freeze_gc=freeze)
        await nursery.start(server.run)
        with trio.fail_after(10):
            await server.warmed.wait()
        assert (gc.get_freeze_count() > 0) is freeze
        nursery.cancel_scope.cancel()
