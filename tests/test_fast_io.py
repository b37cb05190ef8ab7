"""The plain-TCP fast paths of the connection pumps: same bytes, same backpressure, fair."""

from __future__ import annotations

import os

import pytest
import trio

from kproxy.server.fastio import YIELD_EVERY, reader, vector_writer, writer


def stream_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    return trio.SocketStream(a), trio.SocketStream(b)


async def test_writer_falls_back_to_send_all_when_the_kernel_is_full() -> None:
    left, right = stream_pair()
    payload = os.urandom(8 * 1024 * 1024)  # far more than the socket buffers hold
    received = bytearray()

    async def drain() -> None:
        while len(received) < len(payload):
            await trio.sleep(0.001)  # a slow reader: the writer must wait, not buffer
            received.extend(await right.receive_some(65536))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            await writer(left)(payload)
    assert bytes(received) == payload


async def test_reader_returns_eof_and_data_like_receive_some() -> None:
    left, right = stream_pair()
    read = reader(right)
    await left.send_all(b"kafka")
    assert await read(100) == b"kafka"
    await left.aclose()
    with trio.fail_after(5):
        assert await read(100) == b""


async def test_a_busy_connection_does_not_starve_others() -> None:
    left, right = stream_pair()
    read = reader(right)
    await left.send_all(b"x" * (YIELD_EVERY * 4))
    other_ran = 0

    async def other() -> None:
        nonlocal other_ran
        while True:
            other_ran += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.sleep(0)  # let `other` start
        before = other_ran
        for _ in range(YIELD_EVERY * 4):
            assert await read(1) == b"x"  # data is always waiting: only the periodic yield lets `other` run
        assert other_ran - before >= 3
        nursery.cancel_scope.cancel()


async def test_writer_reports_a_closed_peer_as_a_broken_stream() -> None:
    left, right = stream_pair()
    await right.aclose()
    write = writer(left)
    try:
        with trio.fail_after(5):
            for _ in range(100):
                await write(b"x" * 65536)
    except trio.BrokenResourceError:
        return
    raise AssertionError("writing to a closed peer never failed")


async def test_vector_writer_writes_every_buffer_in_order_when_the_kernel_is_full() -> None:
    """A writev the kernel takes only part of: the rest goes through send_all, from where it stopped."""
    left, right = stream_pair()
    buffers = [os.urandom(n) for n in (3 * 1024 * 1024, 17, 2 * 1024 * 1024 + 5, 1)]
    expected = b"".join(buffers)
    received = bytearray()

    async def drain() -> None:
        while len(received) < len(expected):
            await trio.sleep(0.001)  # a slow reader: the writer must wait, not buffer
            received.extend(await right.receive_some(65536))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            await vector_writer(left)(buffers)
    assert bytes(received) == expected


async def test_vector_writer_reports_a_closed_peer_as_a_broken_stream() -> None:
    left, right = stream_pair()
    await right.aclose()
    with trio.fail_after(5), pytest.raises(trio.BrokenResourceError):
        for _ in range(100):  # the first writes may land in the buffer before the reset is seen
            await vector_writer(left)([b"x" * 65536, b"y" * 65536])


async def test_vector_writer_takes_more_buffers_than_one_writev_can() -> None:
    """A 100 MiB frame read a few KB at a time is thousands of pieces: more than IOV_MAX (1024)."""
    left, right = stream_pair()
    buffers = [bytes([i % 256]) * 7 for i in range(3000)]
    expected = b"".join(buffers)
    received = bytearray()
    with trio.fail_after(10):
        await vector_writer(left)(buffers)
        while len(received) < len(expected):
            received.extend(await right.receive_some(65536))
    assert bytes(received) == expected
