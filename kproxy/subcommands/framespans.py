"""Kafka bytes cut into frames for ``kproxy decode``, with or without 4-byte size prefixes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.framing import SIZE_PREFIX, check_frame_size
from kproxy.subcommands.hexdump import InputError

__all__ = ["FrameSpan", "frame_spans"]


@dataclass(frozen=True, slots=True)
class FrameSpan:
    """One frame: ``byte_offset`` is where it starts (its size prefix, if any), ``payload_offset``
    where the bytes after the prefix start; both index the Kafka bytes."""

    index: int
    byte_offset: int
    payload_offset: int
    payload: bytes


def frame_spans(data: bytes, size_prefix: bool | None, max_frame_size: int,
                decodes: Callable[[FrameSpan], bool]) -> Iterator[FrameSpan]:
    """The frames in ``data``, lazily: an error surfaces when its frame is reached.

    With ``size_prefix`` False the whole input is one frame. When it is None
    (detect), the input is size-prefixed frames if the prefixes tile it exactly;
    otherwise it is one frame without a prefix if ``decodes`` says so of the
    whole input (``kproxy decode`` asks: a known request, or a response whose
    kind its options give), and else size-prefixed frames again, so that the
    error names the broken prefix.
    """
    if not data:
        raise InputError(0, "empty input")
    whole = FrameSpan(0, 0, 0, data)
    if size_prefix is False or (size_prefix is None and not _tiles(data, max_frame_size) and decodes(whole)):
        yield whole
    else:
        yield from _split_frames(data, max_frame_size)


def _tiles(data: bytes, max_frame_size: int) -> bool:
    pos = 0
    while len(data) - pos >= 4:
        (size,) = SIZE_PREFIX.unpack_from(data, pos)
        if not 0 <= size <= max_frame_size:
            return False
        pos += 4 + size
    return pos == len(data)


def _split_frames(data: bytes, max_frame_size: int) -> Iterator[FrameSpan]:
    pos = 0
    index = 0
    while pos < len(data):
        left = len(data) - pos
        if left < 4:
            raise InputError(pos, f"truncated size prefix: {left} bytes left where a frame's 4-byte size "
                             "should be")
        (size,) = SIZE_PREFIX.unpack_from(data, pos)
        try:
            check_frame_size(size, max_frame_size, offset=pos)
        except ProtocolError as exc:
            raise InputError(pos, exc.reason) from None
        if size > left - 4:
            raise InputError(pos, f"truncated frame: its size prefix announces {size} bytes but only "
                             f"{left - 4} follow (give --no-size if the input has no size prefix)")
        yield FrameSpan(index, pos, pos + 4, data[pos + 4 : pos + 4 + size])
        pos += 4 + size
        index += 1
