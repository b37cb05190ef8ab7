"""What every frame transformation shares: a request's header, re-framing, the result type.

Frames here are whole frames as the proxy holds them: the 4-byte size prefix,
the header, the body (and, for requests, whatever bytes a client sent after the
body: brokers ignore them, so kproxy keeps them, see DESIGN.md). A
transformation returns a :class:`Mutation`: the new frame and how many things
it changed. ``changed == 0`` means the very same frame object came back, so a
caller can test ``result.frame is frame`` and forward the original. Where a response's
body starts: :func:`kproxy.protocol.headers.response_body_offset` with ``whole=True``.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from kproxy.protocol.headers import RequestHeader, check_frame_size, decode_request_header

_SIZE = struct.Struct(">i")


class Mutation(NamedTuple):
    """A transformed frame (size prefix included) and the count of changes made to it."""

    frame: bytes
    changed: int


def request_header(frame: bytes) -> RequestHeader:
    """The header of a request frame (size prefix included); its body starts at ``4 + size``."""
    check_frame_size(frame)
    return decode_request_header(memoryview(frame)[4:])


def reframe(frame: bytes, body_offset: int, new_body: bytes, new_header: bytes | None = None) -> bytes:
    """``frame`` with the bytes from ``body_offset`` replaced by ``new_body`` (and the
    header by ``new_header`` when given), under a size prefix that fits."""
    header = frame[4:body_offset] if new_header is None else new_header
    return _SIZE.pack(len(header) + len(new_body)) + header + new_body

