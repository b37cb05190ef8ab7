"""Splitting a byte stream into Kafka frames: a 4-byte big-endian size, then that many bytes.

Sans-IO: feed whatever chunks the socket gave, take out whole frames. The size
is checked the moment its 4 bytes are in, and no buffer is ever sized from it:
memory grows with the bytes a peer actually sent, so announcing a huge frame
and sending nothing more costs kproxy nothing.
"""

from __future__ import annotations

import struct

from kproxy.protocol.errors import FrameSizeError

DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes is 100 MiB too
LARGE_FRAME = 1024 * 1024  # frames at least this big are assembled in a buffer of their own
SIZE_PREFIX = struct.Struct(">i")


def check_frame_size(size: int, max_frame_size: int, *, offset: int | None = None) -> None:
    """Raise :class:`FrameSizeError` for a negative or over-limit frame size."""
    if size < 0:
        raise FrameSizeError(f"negative frame size {size}", offset=offset)
    if size > max_frame_size:
        raise FrameSizeError(f"frame size {size} exceeds the limit of {max_frame_size} bytes", offset=offset)


class FrameSplitter:
    """Incremental frame splitter.

    ``feed(chunk)`` buffers bytes; ``next_frame()`` returns the payload of the
    next complete frame (without its size prefix) or ``None``. ``stream_offset``
    counts bytes consumed so far, so errors can name where in the stream they
    happened. After a :class:`FrameSizeError` the stream is unusable (framing is
    lost) and the caller must close the connection.
    """

    __slots__ = ("_buf", "_large", "_large_size", "_pos", "consumed", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 0:
            raise ValueError("max_frame_size must be >= 0")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._pos = 0
        self.consumed = 0
        self._large: bytearray | None = None
        self._large_size = 0  # the large frame's length, size prefix included

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos and self._pos == len(self._buf):
            # Everything was consumed: start over rather than grow.
            self._buf.clear()
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes held that are not yet part of a returned frame."""
        return len(self._buf) - self._pos + (len(self._large) if self._large is not None else 0)

    def pending_frame_size(self) -> int | None:
        """Size announced by the next frame's prefix, once its 4 bytes are in (validated)."""
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

    def split(self, data: bytes | bytearray) -> tuple[list[bytes], bytes, bool]:
        """Feed ``data`` and take every complete frame (size prefixes included).

        The proxy's hot path. Returns ``(frames, chunk, exact)``: ``chunk`` is
        ``data`` as ``bytes`` (TLS streams hand out bytearrays); ``exact`` means
        the chunk held exactly these frames, with nothing buffered before or left
        after, so forwarding ``chunk`` itself equals forwarding the frames. With
        nothing buffered, frames are sliced straight from ``data`` (a chunk
        that is one whole frame is returned as is: no copy at all).
        """
        if not isinstance(data, bytes):
            data = bytes(data)
        if self._large is not None:
            return self._fill_large(data)
        if self._pos != len(self._buf):
            self.feed(data)
            frames = self.raw_frames()
            self._maybe_go_large()
            return frames, data, False
        frames = []
        pos = 0
        n = len(data)
        while n - pos >= 4:
            (size,) = SIZE_PREFIX.unpack_from(data, pos)
            check_frame_size(size, self.max_frame_size, offset=self.consumed + pos)
            end = pos + 4 + size
            if end > n:
                break
            frames.append(data if pos == 0 and end == n else data[pos:end])
            pos = end
        self.consumed += pos
        if pos == n:
            return frames, data, True
        self._buf.clear()
        self._buf += memoryview(data)[pos:]
        self._pos = 0
        self._maybe_go_large()
        return frames, data, False

    def _maybe_go_large(self) -> None:
        """A partial frame of LARGE_FRAME bytes or more moves to a buffer of its own.

        That buffer holds only this frame and grows as its bytes arrive (never
        sized from the prefix: a peer announcing 100 MiB and sending 4 bytes
        holds 4 bytes). Each chunk is copied into it once, and it is handed out
        as it is when complete: no copy out of a shared buffer. Growing a
        bytearray is amortised, and at these sizes the allocator moves pages
        (mremap) rather than bytes.
        """
        size = self.pending_frame_size()
        if size is None or size < LARGE_FRAME:
            return
        self._large = bytearray(memoryview(self._buf)[self._pos:])
        self._large_size = 4 + size
        self._buf.clear()
        self._pos = 0

    def _fill_large(self, data: bytes) -> tuple[list[bytes], bytes, bool]:
        large = self._large
        assert large is not None
        take = min(self._large_size - len(large), len(data))
        large += memoryview(data)[:take]
        if len(large) < self._large_size:
            return [], data, False
        self._large = None
        self.consumed += len(large)
        rest = self.split(data[take:])[0] if take < len(data) else []
        # A bytearray, not bytes: copying a multi-megabyte frame once more buys nothing.
        return [large, *rest], data, False  # type: ignore[list-item]

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
