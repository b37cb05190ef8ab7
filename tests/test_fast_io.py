"""The plain-TCP fast paths of the connection pumps: same bytes, same backpressure, fair."""

from __future__ import annotations

import gc
import os

import pytest
import trio
import trio.testing

from kproxy.server.fastio import STREAMING_BYTES, YIELD_EVERY, reader, vector_writer, writer


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


async def test_a_parked_reader_holds_no_exception() -> None:
    # With a thousand idle connections, anything a parked pump keeps alive is kept a thousand
    # times: the EAGAIN of the read that found nothing must be gone before the pump waits.
    left, right = stream_pair()
    read = reader(right)
    got: list[bytes] = []

    async def pump() -> None:
        got.append(await read(100))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump)
        await trio.testing.wait_all_tasks_blocked()
        alive = [o for o in gc.get_objects() if type(o) is BlockingIOError]  # type(): dead weak proxies raise
        await left.send_all(b"kafka")
    assert alive == []
    assert got == [b"kafka"]


async def test_after_a_read_the_next_waits_without_a_failing_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # One request in flight per connection: after each read the socket is empty. The pump must
    # park on what the short read said, not on an EAGAIN (an exception per wake-up).
    left, right = stream_pair()
    read = reader(right)
    await left.send_all(b"first")
    assert await read(100) == b"first"
    failed = 0
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        nonlocal failed
        try:
            return real_read(fd, n)
        except BlockingIOError:
            failed += 1
            raise

    monkeypatch.setattr(os, "read", counting_read)
    async with trio.open_nursery() as nursery:
        second: list[bytes] = []

        async def pump() -> None:
            second.append(await read(100))

        nursery.start_soon(pump)
        await trio.testing.wait_all_tasks_blocked()
        await left.send_all(b"second")
    assert second == [b"second"]
    assert failed == 0


async def test_after_a_short_read_the_next_parks_without_a_system_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # A read that returned less than it asked for drained the socket: the next read waits for it to
    # be readable without asking the kernel first (no read, no FIONREAD ioctl: a system call fewer
    # per direction per request at a steady rate).
    import fcntl

    left, right = stream_pair()
    read = reader(right)
    await left.send_all(b"first")
    assert await read(100) == b"first"
    calls: list[str] = []
    real_read, real_ioctl = os.read, fcntl.ioctl

    def counting_read(fd: int, n: int) -> bytes:
        calls.append("read")
        return real_read(fd, n)

    def counting_ioctl(*args: object) -> object:
        calls.append("ioctl")
        return real_ioctl(*args)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "read", counting_read)
    monkeypatch.setattr(fcntl, "ioctl", counting_ioctl)
    second: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def pump() -> None:
            second.append(await read(100))

        nursery.start_soon(pump)
        await trio.testing.wait_all_tasks_blocked()
        assert calls == []  # parked at once
        await left.send_all(b"second")
    assert second == [b"second"]
    assert calls == ["read"]


async def test_after_a_full_read_the_next_reads_the_rest_at_once() -> None:
    left, right = stream_pair()
    read = reader(right)
    await left.send_all(b"x" * 150)
    assert await read(100) == b"x" * 100  # filled its buffer: the kernel may hold more
    with trio.fail_after(5):
        assert await read(100) == b"x" * 50
    await left.send_all(b"y")
    with trio.fail_after(5):
        assert await read(100) == b"y"  # after the short read above: waits, then reads


async def test_after_a_big_short_read_the_next_asks_what_is_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stream of big frames in full flow: what came while a big read was handled is read at once,
    # after one FIONREAD, without a pass through trio's wait.
    import fcntl

    left, right = stream_pair()
    read = reader(right)
    await left.send_all(b"x" * STREAMING_BYTES)
    assert len(await read(4 * STREAMING_BYTES)) == STREAMING_BYTES
    await left.send_all(b"more")
    calls: list[str] = []
    real_read, real_ioctl = os.read, fcntl.ioctl

    def counting_read(fd: int, n: int) -> bytes:
        calls.append("read")
        return real_read(fd, n)

    def counting_ioctl(*args: object) -> object:
        calls.append("ioctl")
        return real_ioctl(*args)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "read", counting_read)
    monkeypatch.setattr(fcntl, "ioctl", counting_ioctl)
    with trio.fail_after(5):
        assert await read(4 * STREAMING_BYTES) == b"more"
    assert calls == ["ioctl", "read"]
