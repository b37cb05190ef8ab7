"""Plain-TCP fast paths for the connection pumps (one job: move bytes with fewer scheduler passes).

trio's stream methods pass through the scheduler on every call, even when the
kernel could answer at once: ``receive_some`` yields after a read that found
data waiting, ``send_all`` after a write the kernel took whole. For Kafka's
small frames that doubles the scheduler passes per exchange. These wrappers
try the system call first and fall back to trio's waiting only when the kernel
cannot answer, which keeps backpressure and cancellation as they were.
"""

from __future__ import annotations

import array
import fcntl
import os
import termios
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import trio

Writer = Callable[[bytes], Awaitable[None]]
VectorWriter = Callable[[Sequence[bytes | bytearray | memoryview]], Awaitable[None]]
Reader = Callable[[int], Awaitable[bytes | bytearray]]
# A pump that always finds data waiting still yields to the scheduler this often (fairness, cancellation).
YIELD_EVERY: Final = 8
# A read returning less than it asked for but at least this much is a stream of big frames in full
# flow: the next read asks FIONREAD whether more came meanwhile instead of parking at once.
STREAMING_BYTES: Final = 64 * 1024
# The most buffers one writev takes (POSIX: at least 16; Linux: 1024).
IOV_MAX: Final = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 16


def reader(stream: trio.abc.Stream) -> Reader:
    """``receive_some`` for ``stream``, with a fast path for plain TCP.

    trio's ``receive_some`` passes through the scheduler after every read, even
    when data was already waiting. For a plain socket kproxy reads first and
    parks in ``wait_readable`` only when the kernel has nothing; every
    ``YIELD_EVERY`` reads it yields anyway, so a busy connection cannot starve
    the others and stays cancellable. TLS streams always use ``receive_some``.

    After a read that returned less than it asked for, the kernel held nothing more at that
    moment. When that read was small (under :data:`STREAMING_BYTES`: requests and answers, one
    or a few frames), the next read parks in ``wait_readable`` at once: with one request in
    flight per connection nothing comes in between, and a read would fail with ``EAGAIN``, which
    Python raises as a ``BlockingIOError`` (an errno, a message string and an exception per
    wake-up). After a big one (a stream of big frames in full flow, whose next bytes may well
    have come while it was handled) the next read asks the kernel how much is queued
    (``FIONREAD``) and reads at once if anything is. A read that filled its buffer is followed by
    another at once. Bytes that arrive between a read and the wait cost only an immediate
    wake-up: the socket is readable when the wait begins. None of the waiting happens inside an
    ``except`` block: a parked pump would otherwise keep that exception and its traceback alive
    for as long as it waits.
    """
    if not isinstance(stream, trio.SocketStream):
        return stream.receive_some
    fd = stream.socket.fileno()
    streak = 0
    short = 0  # bytes of the last read if it returned less than it asked for (0: it filled its buffer)

    async def read(max_bytes: int) -> bytes:
        # Module globals, not closure cells: a cell per name per reader, two readers per connection.
        nonlocal streak, short
        if short:
            if short < STREAMING_BYTES or not _queued(fd):
                streak = 0
                short = 0
                await _wait_readable(fd)
            short = 0
        while True:
            try:
                data = os.read(fd, max_bytes)
            except BlockingIOError:
                data = None
            except OSError as exc:
                raise trio.BrokenResourceError(f"read failed: {exc.strerror or exc}") from exc
            if data is None:
                streak = 0
                await _wait_readable(fd)
                continue
            if len(data) < max_bytes:
                short = len(data)
            streak += 1
            if streak >= YIELD_EVERY:
                streak = 0
                await _checkpoint()
            return data

    return read


_wait_readable = trio.lowlevel.wait_readable
_checkpoint = trio.lowlevel.checkpoint
_FIONREAD_OUT: Final = array.array("i", [0])  # one for all readers: read back before any other task runs


def _queued(fd: int) -> int:
    """Bytes the kernel holds for ``fd`` (``FIONREAD``); 1 when it cannot say, so that the caller reads."""
    try:
        fcntl.ioctl(fd, termios.FIONREAD, _FIONREAD_OUT, True)
    except OSError:
        return 1  # the read reports the socket's error
    return _FIONREAD_OUT[0]


def writer(stream: trio.abc.Stream) -> Writer:
    """``send_all`` for ``stream``, with a fast path for plain TCP.

    trio's ``send_all`` always passes through the scheduler, even when the
    kernel takes every byte at once, which it nearly always does for Kafka's
    small frames. For a plain socket, kproxy first writes synchronously; only
    what the kernel did not take goes through ``send_all`` (which then waits for
    room: backpressure is unchanged). TLS streams always use ``send_all``.
    """
    if not isinstance(stream, trio.SocketStream):
        return stream.send_all
    fd = stream.socket.fileno()
    send_all = stream.send_all

    async def write(data: bytes) -> None:
        try:
            sent = os.write(fd, data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"write failed: {exc.strerror or exc}") from exc
        if sent < len(data):
            await send_all(memoryview(data)[sent:])

    return write


def vector_writer(stream: trio.abc.Stream) -> VectorWriter:
    """Write several buffers in order, as :func:`writer` writes one: for a plain socket, one
    ``os.writev`` first (the kernel gathers them: no join, no copy in kproxy), then
    ``send_all`` for what it did not take. TLS streams get one ``send_all`` per buffer."""
    if not isinstance(stream, trio.SocketStream):
        send = stream.send_all

        async def write_each(buffers: Sequence[bytes | bytearray | memoryview]) -> None:
            for data in buffers:
                await send(data)

        return write_each
    fd = stream.socket.fileno()
    send_all = stream.send_all

    async def writev(buffers: Sequence[bytes | bytearray | memoryview]) -> None:
        for start in range(0, len(buffers), IOV_MAX):  # a frame read in many small reads has many pieces
            group = buffers[start : start + IOV_MAX]
            try:
                sent = os.writev(fd, group)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise trio.BrokenResourceError(f"write failed: {exc.strerror or exc}") from exc
            for data in group:
                if sent >= len(data):
                    sent -= len(data)
                    continue
                await send_all(memoryview(data)[sent:] if sent else data)
                sent = 0

    return writev
