"""Fields read in place from a request frame (size prefix included), building nothing else.

The proxy reads a request's fixed header on every frame and, now and then, one
more field: its client id (a metrics label), the acks of a Produce (acks=0 has no
response), its body offset, the group id a group member's request opens with
(consumer lag: the group is still there). Each is read here, at the offsets
RequestHeader.json, ProduceRequest.json and the group requests' specs give, so no
other module carries its own copy of the header layout. None of these raise: an unreadable field is
``None`` and the caller decides (a malformed request is the broker's to refuse).
"""

from __future__ import annotations

import struct
from typing import Final

from librt.strings import read_i16_be

from kproxy.protocol.headers import request_body_offset, request_header_version
from kproxy.protocol.message_schemas import MessageType, message_schema
from kproxy.protocol.primitives import Malformed, read_uvarint

_INT16: Final = struct.Struct(">h")
# Request header v1/v2: size, api_key, api_version, correlation_id, then the client id's int16 length.
_CLIENT_ID_AT: Final = 12


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


class RequestHeaderMemo:
    """The client id and the body offset of one connection's requests, remembering the last header read.

    A client sends the same client id on every request of a connection, so after the first, a
    request's variable header part (the client id with its int16 length and, in header v2, the
    tagged fields) is compared in place with the last one read, as bytes, and not read again.
    Whatever the bytes, the answer is :func:`request_client_id`'s and
    :func:`~kproxy.protocol.headers.request_body_offset`'s: a request whose bytes there or whose
    header version differ is read afresh, and a header that cannot be read is not remembered.
    """

    __slots__ = ("_found", "_raw", "_version")

    def __init__(self) -> None:
        self._raw = b""  # bytes 12 .. body offset of the last header remembered
        self._version = -1  # its header version (-1: none remembered)
        self._found: tuple[str | None, int | None] = (None, None)

    def read(self, frame: bytes, api_key: int, api_version: int) -> tuple[str | None, int | None]:
        """(client id, body offset) of a request frame (size prefix included), as the functions read them."""
        version = request_header_version(api_key, api_version)
        if version == self._version and frame.startswith(self._raw, _CLIENT_ID_AT):
            return self._found
        found = request_client_id(frame, api_key, api_version), request_body_offset(frame, api_key, api_version)
        offset = found[1]
        if version and offset is not None:  # header v0 has nothing to compare: read every time (it is cheap)
            self._raw, self._version, self._found = frame[_CLIENT_ID_AT:offset], version, found
        return found


def produce_acks(frame: bytes, api_version: int, body_offset: int) -> int | None:
    """The acks of a Produce request frame whose body starts at ``body_offset``; None if unreadable."""
    try:
        _, _, pos = transactional_id_at(frame, api_version, body_offset)
        acks: int = read_i16_be(frame, pos)
        return acks
    except (Malformed, IndexError, ValueError):
        return None


def produce_head(frame: bytes, api_version: int, body_offset: int) -> tuple[str | None, int | None]:
    """A Produce request's transactional id (v3+; None when null or older) and acks, read in place;
    (None, None) if unreadable."""
    try:
        start, n, pos = transactional_id_at(frame, api_version, body_offset)
        acks: int = read_i16_be(frame, pos)
    except (Malformed, IndexError, ValueError):
        return None, None
    txn = frame[start:start + n].decode("utf-8", "replace") if n >= 0 else None
    return txn, acks


def transactional_id_at(frame: bytes, api_version: int, pos: int) -> tuple[int, int, int]:
    """Where a Produce body's transactional_id starts, its length (-1: null or absent; below -1: not a
    length, the bytes are malformed) and where acks starts: the one reader of a Produce body's head
    (:func:`produce_acks`, :func:`produce_head`, and, before its topics,
    :func:`kproxy.protocol.produce_scan.produce_request_scan`). ProduceRequest.json: the body opens
    with transactional_id (v3+; a nullable string, compact from v9, the first flexible version), then
    acks (int16). Raises IndexError or ValueError (a negative position) for a frame cut short,
    :class:`~kproxy.protocol.primitives.Malformed` for a varint that never ends."""
    if api_version >= 9:
        n, pos = (frame[pos], pos + 1) if frame[pos] < 0x80 else read_uvarint(frame, pos)
        return pos, n - 1, pos + max(n - 1, 0)  # compact: length + 1, 0 for null
    if api_version >= 3:
        size: int = read_i16_be(frame, pos)
        return pos + 2, size, pos + 2 + max(size, 0)
    return pos, -1, pos


# api_key << 16 | api_version -> (strings before the group id, flexible) of the kinds whose body opens
# with plain strings up to a group_id (found from the message specs); None: another layout.
_GROUP_ID_LAYOUTS: dict[int, tuple[int, bool] | None] = {}


def _group_id_layout(api_key: int, api_version: int) -> tuple[int, bool] | None:
    key = api_key << 16 | api_version
    if key in _GROUP_ID_LAYOUTS:
        return _GROUP_ID_LAYOUTS[key]
    schema = message_schema(api_key, api_version, MessageType.REQUEST)
    if schema is None:
        return None  # (not remembered: a client cycling through made-up versions adds nothing)
    layout = None
    for i, f in enumerate(schema.fields):
        if f.tag is not None or f.type != "string" or f.array:
            break
        if f.name == "group_id":
            layout = (i, schema.flexible)
            break
    _GROUP_ID_LAYOUTS[key] = layout
    return layout


def request_group_id(frame: bytes | memoryview, api_key: int, api_version: int, body_offset: int | None
                     ) -> str | None:
    """The group id a request's body opens with (JoinGroup, Heartbeat, SyncGroup, LeaveGroup,
    OffsetCommit, OffsetFetch v0-7, ConsumerGroupHeartbeat; TxnOffsetCommit's after its transactional
    id), read in place; None for a kind that does not open so, or bytes that cannot be read. Bad
    UTF-8 is replaced, as the scans' values mode reads a group id (the two name a group alike)."""
    if body_offset is None:
        return None
    layout = _group_id_layout(api_key, api_version)
    if layout is None:
        return None
    skip, flexible = layout
    pos = body_offset
    try:
        for _ in range(skip + 1):
            if flexible:  # compact string: length + 1 (0: null), an unsigned varint
                n, pos = (frame[pos], pos + 1) if frame[pos] < 0x80 else read_uvarint(frame, pos)
                n -= 1
            else:
                (n,) = _INT16.unpack_from(frame, pos)
                pos += 2
            start = pos
            pos += max(n, 0)
        if n < 0 or pos > len(frame):
            return None
        return str(frame[start:pos], "utf-8", "replace")
    except (Malformed, struct.error, IndexError):
        return None
