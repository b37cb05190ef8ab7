"""Facts read in place from a request frame (size prefix included), building nothing else.

The proxy reads a request's fixed header on every frame and, now and then, one
more fact: its client id (a metrics label), the acks of a Produce (acks=0 has no
response), its body offset. Each is read here, at the offsets
RequestHeader.json and ProduceRequest.json give, so no other module carries its
own copy of the header layout. None of these raise: an unreadable fact is
``None`` and the caller decides (a malformed request is the broker's to refuse).
"""

from __future__ import annotations

import struct

from kproxy.protocol.headers import CONTROLLED_SHUTDOWN_KEY, request_header_version
from kproxy.protocol.wire import Malformed, read_uvarint

_INT16 = struct.Struct(">h")
# Request header v1/v2: size, api_key, api_version, correlation_id, then the client id's int16 length.
_CLIENT_ID_AT = 12


def request_client_id(frame: bytes | memoryview, api_key: int, api_version: int) -> str | None:
    """The client id of a request frame; None when null, absent or not UTF-8.

    ClientId is a nullable *int16*-length string in request header v1 and v2 alike
    (never compact: RequestHeader.json, KIP-482), so it sits at the same place for
    every request but ControlledShutdown v0, whose header v0 has none.
    """
    if request_header_version(api_key, api_version) == 0:
        return None
    try:
        (n,) = _INT16.unpack_from(frame, _CLIENT_ID_AT)
        start = _CLIENT_ID_AT + 2
        if n < 0 or start + n > len(frame):
            return None
        return str(frame[start : start + n], "utf-8")
    except (struct.error, UnicodeDecodeError):
        return None


class ClientIdMemo:
    """:func:`request_client_id` for the requests of one connection, remembering the last one read.

    A client sends the same client id on every request of a connection, so after the first it is
    compared in place, as the bytes it was decoded from (its int16 length and its bytes), and not
    decoded again. Whatever the bytes, the answer is :func:`request_client_id`'s: a request whose
    bytes at the client id's place differ is decoded, and one whose answer depends on more than
    those bytes (a length running past the frame's end, a frame too short) is not remembered.
    """

    __slots__ = ("_raw", "_value")

    def __init__(self) -> None:
        self._raw = b""  # the int16 length and the bytes of the last client id read ("": none yet)
        self._value: str | None = None

    def read(self, frame: bytes, api_key: int, api_version: int) -> str | None:
        raw = self._raw
        if raw and frame.startswith(raw, _CLIENT_ID_AT) and (api_key != CONTROLLED_SHUTDOWN_KEY or api_version):
            return self._value
        value = request_client_id(frame, api_key, api_version)
        if request_header_version(api_key, api_version) != 0 and len(frame) >= _CLIENT_ID_AT + 2:
            (n,) = _INT16.unpack_from(frame, _CLIENT_ID_AT)
            end = _CLIENT_ID_AT + 2 + max(n, 0)
            if end <= len(frame):  # else the answer (None) is the frame's length's, not the bytes'
                self._raw, self._value = frame[_CLIENT_ID_AT:end], value
        return value


def produce_acks(frame: bytes | memoryview, api_version: int, body_offset: int) -> int | None:
    """The acks of a Produce request frame whose body starts at ``body_offset``; None if unreadable.

    ProduceRequest.json: the body opens with transactional_id (v3+; a nullable
    string, compact from v9, the first flexible version), then acks (int16).
    """
    try:
        pos = body_offset
        if api_version >= 9:
            n, pos = (frame[pos], pos + 1) if frame[pos] < 0x80 else read_uvarint(frame, pos)
            pos += max(n - 1, 0)  # compact: length + 1, 0 for null
        elif api_version >= 3:
            (n,) = _INT16.unpack_from(frame, pos)
            pos += 2 + max(n, 0)
        (acks,) = _INT16.unpack_from(frame, pos)
        return int(acks)
    except (Malformed, struct.error, IndexError):
        return None
