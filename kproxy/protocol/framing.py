"""Splitting a byte stream into Kafka frames: a 4-byte big-endian size, then that many bytes.

Sans-IO: feed whatever chunks the socket gave, take out whole frames. The size
is checked the moment its 4 bytes are in, and no buffer is ever sized from it:
memory grows with the bytes a peer actually sent, so announcing a huge frame
and sending nothing more costs kproxy nothing.
"""

from __future__ import annotations

import struct
from typing import Any, Final, overload

from librt.strings import read_i32_be

from kproxy.protocol.errors import FrameSizeError

DEFAULT_MAX_FRAME_SIZE: Final = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes is 100 MiB too
SIZE_PREFIX: Final = struct.Struct(">i")
# A frame as the pieces of the chunks that brought it, in order (FrameSplitter.split with join=False).
Spanned = list[bytes | bytearray | memoryview]
# Pieces smaller than this are copied into one buffer rather than held each as an object of its own:
# a peer trickling a byte per read must not cost an object's header per byte it sent.
COALESCE_BELOW: Final = 16 * 1024
# split(join=False) joins frames smaller than this all the same: copying a few KB costs less than the
# vectored write of their pieces would save.
SPANNED_MIN: Final = 64 * 1024


def check_frame_size(size: int, max_frame_size: int, *, offset: int | None = None) -> None:
    """Raise :class:`FrameSizeError` for a negative or over-limit frame size."""
    if size < 0:
        raise FrameSizeError(f"negative frame size {size}", offset=offset)
    if size > max_frame_size:
        raise FrameSizeError(f"frame size {size} exceeds the limit of {max_frame_size} bytes", offset=offset)


class FrameSplitter:
    """Incremental frame splitter, with two entry points (use one or the other on a splitter).

    :meth:`split` is the proxy's hot path: it takes each chunk as read and returns
    the frames it completes. ``feed(chunk)`` then ``next_frame()`` / ``next_raw()``
    is the pull path (tests, tools, fake brokers): bytes are buffered, and each
    call returns the next complete frame or ``None``. ``consumed`` counts bytes
    consumed so far, so errors can name where in the stream they happened. After
    a :class:`FrameSizeError` the stream is unusable (framing is lost) and the
    caller must close the connection.
    """

    __slots__ = ("_buf", "_held", "_need", "_parts", "_pos", "consumed", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 0:
            raise ValueError("max_frame_size must be >= 0")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()  # the pull path's buffer
        self._pos = 0
        self.consumed = 0
        # split(): the bytes of the frame not yet complete, as the chunks that brought them (the first
        # one a view of its chunk's tail): nothing is copied until the frame is whole.
        self._parts: Spanned = []
        self._held = 0  # their total length
        self._need = 0  # that frame's length, size prefix included, once its prefix is in (0: not yet)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos and self._pos == len(self._buf):
            # Everything was consumed: start over rather than grow.
            self._buf.clear()
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes held that are not yet part of a returned frame."""
        return len(self._buf) - self._pos + self._held

    def pending_frame_size(self) -> int | None:
        """Size announced by the next frame's prefix, once its 4 bytes are in (validated; pull path)."""
        if len(self._buf) - self._pos < 4:
            return None
        (size,) = SIZE_PREFIX.unpack_from(self._buf, self._pos)
        check_frame_size(size, self.max_frame_size, offset=self.consumed)
        return int(size)

    def next_frame(self) -> bytes | None:
        """The next complete frame's payload (no size prefix), or None."""
        return self._take(4)

    def next_raw(self) -> bytes | None:
        """The next complete frame *with* its size prefix (what a proxy forwards), or None."""
        return self._take(0)

    def raw_frames(self) -> list[bytes]:
        """Every complete frame buffered so far, size prefixes included."""
        out = []
        while (raw := self._take(0)) is not None:
            out.append(raw)
        return out

    @overload
    def split(self, data: bytes | bytearray) -> tuple[list[bytes], bytes, bool]: ...

    @overload
    def split(self, data: bytes | bytearray, join: bool) -> tuple[list[bytes | Spanned], bytes, bool]: ...

    def split(self, data: bytes | bytearray, join: bool = True) -> tuple[list[Any], bytes, bool]:
        """Take the chunk ``data`` and return every frame it completes (size prefixes included).

        The proxy's hot path. Returns ``(frames, chunk, exact)``: ``chunk`` is
        ``data`` as ``bytes`` (TLS streams hand out bytearrays); ``exact`` means
        the chunk held exactly these frames, with nothing held before or left
        after, so forwarding ``chunk`` itself equals forwarding the frames.

        Each byte is copied at most once: a frame inside the chunk is sliced from
        it (a chunk that is one whole frame is returned as is: no copy at all), and
        a frame that spans chunks is joined once, when its last byte comes, from
        the chunks that brought it (held as they came, not gathered into a
        growing buffer: for a multi-megabyte Fetch response that meant copying
        each chunk in, then again on every resize). What is held is what the
        peer sent: big reads as they are (the first a view of its chunk's tail,
        which keeps that chunk alive), small ones copied together (COALESCE_BELOW).

        ``join=False``: a frame of SPANNED_MIN bytes or more that spans chunks comes back
        as :data:`Spanned`, the pieces that brought it, not joined. For a reader that may
        need only its head (a proxy forwarding it untouched, in a vectored write): a
        multi-megabyte Fetch response then costs no copy in kproxy but its first piece's.
        """
        if not isinstance(data, bytes):
            data = bytes(data)
        frames: list[bytes | Spanned] = []
        pos = 0
        if self._held:
            pos = self._complete(data, frames, join)
            if pos < 0:
                return frames, data, False
        n = len(data)
        begun = pos
        base = self.consumed - pos  # where data[0] is in the stream
        while n - pos >= 4:
            size: int = read_i32_be(data, pos)
            check_frame_size(size, self.max_frame_size, offset=base + pos)
            end = pos + 4 + size
            if end > n:
                self._need = end - pos
                break
            frames.append(data if pos == 0 and end == n else data[pos:end])
            pos = end
        self.consumed = base + pos
        if pos == n:
            return frames, data, not begun
        self._hold(memoryview(data)[pos:])
        return frames, data, False

    def _hold(self, piece: bytes | memoryview) -> None:
        """Keep ``piece`` as part of the frame not yet whole: as it is when big, else copied."""
        parts = self._parts
        self._held += len(piece)
        if len(piece) >= COALESCE_BELOW:
            parts.append(piece)
        elif parts and type(parts[-1]) is bytearray:
            parts[-1] += piece
        else:
            parts.append(bytearray(piece))

    def _complete(self, data: bytes, frames: list[bytes | Spanned], join: bool) -> int:
        """Add ``data`` to the frame begun in earlier chunks; where in ``data`` that frame ends,
        once whole (appended to ``frames``), else -1."""
        n = len(data)
        if not self._need:  # fewer than 4 bytes held: the size prefix is not whole yet
            head = b"".join(self._parts) + data[:4]
            if len(head) < 4:
                self._hold(data)
                return -1
            size: int = read_i32_be(head, 0)
            check_frame_size(size, self.max_frame_size, offset=self.consumed)
            self._need = 4 + size
        take = self._need - self._held
        if take > n:
            self._hold(data)
            return -1
        parts = self._parts
        parts.append(data if take == n else memoryview(data)[:take])
        frames.append(parts if not join and self._need >= SPANNED_MIN else b"".join(parts))
        self.consumed += self._need
        self._parts = []
        self._held = self._need = 0
        return take

    def _take(self, skip: int) -> bytes | None:
        size = self.pending_frame_size()
        if size is None:
            return None
        end = self._pos + 4 + size
        if end > len(self._buf):
            return None
        with memoryview(self._buf) as view:
            frame = bytes(view[self._pos + skip : end])
        self._pos = end
        self.consumed += 4 + size
        if self._pos > 65536 and self._pos * 2 > len(self._buf):
            # Drop consumed bytes once they dominate, keeping memory ~ one frame.
            del self._buf[: self._pos]
            self._pos = 0
        return frame

    def frames(self) -> list[bytes]:
        """Every complete frame buffered so far."""
        out = []
        while (frame := self.next_frame()) is not None:
            out.append(frame)
        return out


def frame(payload: bytes | bytearray) -> bytes:
    """Prefix a payload with its 4-byte size."""
    return SIZE_PREFIX.pack(len(payload)) + bytes(payload)


def frame_head(parts: Spanned, n: int = 16) -> bytes:
    """The first ``n`` bytes of a :data:`Spanned` frame (all of it when shorter): its header."""
    head = b""
    for part in parts:
        head += bytes(part[: n - len(head)])
        if len(head) >= n:
            break
    return head
