"""Build a well-formed response that answers a request with a Kafka error code.

:func:`error_response` serves every (api key, version) the tables know, from
the schemas rather than per-API code:

1. The response body starts from :func:`~kproxy.protocol.messages.default_body`
   (every field at the spec's default; ``throttle_time_ms`` 0).
2. The request's *identity* is mirrored into it: each response array of
   structs is paired with the request array playing the same role (a topic
   array with a topic array, a partition array with a partition array or a
   ``partition_indexes`` list), and key fields are copied: topic name or id,
   partition index, group id, coordinator key. So every topic and partition
   the request named gets an answer, as a broker's would.
3. :func:`set_error_codes` sets the error code: every error code field when no
   partition subset is given; with a subset, only the partition-level codes
   of those partitions (the others stay NONE: a partial failure). An
   ``error_message`` field beside a code that was set gets the message.

The header is response header v1 for flexible versions, v0 otherwise and
always v0 for ApiVersions (KIP-511); the correlation id is the request's.

Where a schema default would mislead a client, a small table fixes it (see
``_ERROR_VALUES``): each entry says which Kafka class sets that value on an
error path.

Produce with acks=0 has no response at all: callers must never send one
(this function builds what was asked and cannot know the connection's rules).

A caution for callers answering Produce *without forwarding* it: partitions
outside the subset are answered as successful (``base_offset`` -1) though
their records were never written. Partial Produce failures without loss need
the request forwarded and its response's codes replaced (``set_error_codes``
on the decoded response).
"""

from __future__ import annotations

import struct
from collections.abc import Collection
from typing import Any

from kproxy.protocol.codes import ApiKey, error_name
from kproxy.protocol.errors import DecodeError
from kproxy.protocol.headers import ResponseHeader, encode_response_header, response_header_version
from kproxy.protocol.message_schemas import PARTITION_FIELDS, Field, MessageType
from kproxy.protocol.messages import Body, default_struct, require_codec

_SIZE = struct.Struct(">i")
_TOPIC_KEYS = frozenset({"name", "topic", "topic_name", "topic_id"})
_PARTITION_KEYS = PARTITION_FIELDS | {"index"}
# Identity fields copied from a request struct to its answer, beside topics and partitions.
_OTHER_KEYS = frozenset({"group_id", "key", "key_type", "resource_type", "resource_name", "transactional_id",
                         "member_id", "group_instance_id"})

# Values Kafka's brokers put in a response when a partition (or the request) failed, where the
# spec's default (often 0) would read as data. Keyed by api key, then field name; applied in every
# struct of the response that has the field.
_ERROR_VALUES: dict[int, dict[str, Any]] = {
    # ProduceResponse.INVALID_OFFSET (clients/.../ProduceResponse.java): no offset was assigned.
    ApiKey.PRODUCE: {"base_offset": -1},
    # FetchResponse.INVALID_HIGH_WATERMARK / INVALID_LAST_STABLE_OFFSET; MemoryRecords.EMPTY, not null,
    # because some clients read a null records field as a protocol error.
    ApiKey.FETCH: {"high_watermark": -1, "last_stable_offset": -1, "records": b""},
    # ListOffsetsResponse.UNKNOWN_OFFSET / UNKNOWN_TIMESTAMP (the spec's -1 defaults hold already for v1+;
    # v0 has old_style_offsets, an empty list).
    ApiKey.LIST_OFFSETS: {"offset": -1, "timestamp": -1},
    # MetadataResponse: no controller known (-1), a partition without a leader (-1).
    ApiKey.METADATA: {"controller_id": -1, "leader_id": -1},
    # OffsetFetchResponse: no committed offset (OffsetFetchResponse.INVALID_OFFSET).
    ApiKey.OFFSET_FETCH: {"committed_offset": -1},
    # FindCoordinatorResponse on error: Node.noNode() is id -1, host "", port -1.
    ApiKey.FIND_COORDINATOR: {"node_id": -1, "port": -1},
    # OffsetForLeaderEpochResponse: UNDEFINED_EPOCH_OFFSET / UNDEFINED_EPOCH.
    ApiKey.OFFSET_FOR_LEADER_EPOCH: {"end_offset": -1, "leader_epoch": -1},
    # ShareFetch partitions: an empty record set, as for Fetch.
    ApiKey.SHARE_FETCH: {"records": b""},
}


def error_values(api_key: int) -> dict[str, Any]:
    """The values Kafka's brokers write in a failed entry of ``api_key``'s responses where the
    spec's default would read as data (field name -> value; empty when the defaults hold)."""
    return _ERROR_VALUES.get(api_key, {})


def error_response(request_frame: bytes, error_code: int, *, partitions: Collection[int] | None = None,
                   message: str | None = None) -> bytes:
    """The response frame (size prefix included) answering ``request_frame`` with ``error_code``.

    ``request_frame`` is the whole request, 4-byte size prefix included. Bytes
    after its body are ignored, as brokers ignore them. Raises
    :class:`~kproxy.protocol.errors.UnknownApiError` for an (api key, version)
    the tables do not know and :class:`DecodeError` for an unreadable request.
    """
    from kproxy.protocol.headers import decode_request_header

    header = decode_request_header(memoryview(request_frame)[4:])
    data = bytes(request_frame)
    request_codec = require_codec(header.api_key, header.api_version, MessageType.REQUEST)
    start = 4 + header.size
    end = request_codec.skip(data, start)
    request = request_codec.decode(data[:end], start)
    body = build_error_body(header.api_key, header.api_version, request, error_code, partitions=partitions,
                            message=message)
    response_codec = require_codec(header.api_key, header.api_version, MessageType.RESPONSE)
    out = bytearray(b"\0\0\0\0")
    out += encode_response_header(ResponseHeader(
        header.correlation_id, response_header_version(header.api_key, header.api_version)))
    response_codec.encode_into(out, body)
    _SIZE.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def build_error_body(api_key: int, api_version: int, request: Body, error_code: int, *,
                     partitions: Collection[int] | None = None, message: str | None = None) -> Body:
    """The response body (a dict for :func:`encode_body`) answering a decoded request with an error."""
    response_fields = require_codec(api_key, api_version, MessageType.RESPONSE).schema.fields
    request_fields = require_codec(api_key, api_version, MessageType.REQUEST).schema.fields
    body = _mirror(response_fields, request_fields, request)
    fixes = _ERROR_VALUES.get(api_key)
    if fixes:
        _apply_fixes(response_fields, body, fixes)
    if message is None:
        message = f"{error_name(error_code)} (injected by kproxy)"
    set_error_codes(response_fields, body, error_code, partitions=partitions, message=message)
    return body


def set_error_codes(fields: tuple[Field, ...], body: Body, error_code: int, *,
                    partitions: Collection[int] | None = None, message: str | None = None) -> int:
    """Set error codes in a response body in place; how many were set.

    Without ``partitions``: every error code field, at every level. With it:
    only those of partition-level structs whose partition index is in it.
    ``error_message`` beside a code that was set gets ``message`` when given.
    """
    return _set_codes(fields, body, error_code, None if partitions is None else frozenset(partitions), message)


def _set_codes(fields: tuple[Field, ...], body: Body, code: int, partitions: frozenset[int] | None,
               message: str | None) -> int:
    count = 0
    partition = next((body.get(f.name) for f in fields if f.name in _PARTITION_KEYS and f.type == "int32"
                      and not f.array and f.tag is None), None)
    here = partitions is None or (partition is not None and partition in partitions)
    if here:
        for f in fields:
            if f.is_error_code and f.tag is None:
                body[f.name] = code
                count += 1
        if count and message is not None:
            for f in fields:
                if f.name == "error_message" and f.type == "string" and f.tag is None:
                    body[f.name] = message
    for f in fields:
        if f.type == "struct" and f.fields is not None and f.tag is None:
            value = body.get(f.name)
            for item in (value or ()) if f.array else ((value,) if value is not None else ()):
                count += _set_codes(f.fields, item, code, partitions, message)
    return count


def _role(fields: tuple[Field, ...] | None) -> str | None:
    if fields is None:
        return None
    names = {f.name for f in fields if f.tag is None}
    if names & {"name", "topic", "topic_name", "topic_id"} and any(
            f.entity_type == "topicName" or f.name == "topic_id" for f in fields):
        return "topic"
    if names & _PARTITION_KEYS:
        return "partition"
    return None


def _pair(target: Field, sources: tuple[Field, ...], only: bool) -> Field | None:
    """The request array that plays the role of response array ``target``."""
    candidates = [f for f in sources if f.array and f.tag is None]
    for f in candidates:
        if f.name == target.name and f.type == target.type:
            return f
    role = _role(target.fields)
    for f in candidates:
        if role is not None and f.type == "struct" and _role(f.fields) == role:
            return f
    if role == "partition":
        # OffsetFetch v1-v7 requests list partitions as bare indexes (PartitionIndexes).
        return next((f for f in candidates if f.type == "int32" and "partition" in f.name), None)
    # The one array of entities on each side (DescribeConfigs Resources -> Results, ...).
    structs = [f for f in candidates if f.type == "struct" and _role(f.fields) is None]
    if role is None and only and len(structs) == 1:
        return structs[0]
    # A list of names answered by a struct per name: FindCoordinator v4+ CoordinatorKeys -> Coordinators
    # (KIP-699), DescribeGroups Groups, DeleteGroups GroupsNames -> Results.
    strings = [f for f in candidates if f.type == "string"]
    if len(strings) == 1 and _string_key(target.fields or ()) is not None:
        return strings[0]
    return None


def _string_key(fields: tuple[Field, ...]) -> Field | None:
    return next((f for f in fields if f.type == "string" and not f.array and f.tag is None
                 and f.name in _OTHER_KEYS | _TOPIC_KEYS), None)


def _mirror(fields: tuple[Field, ...], sources: tuple[Field, ...], source: Body | int | str) -> Body:
    """A default struct of ``fields`` carrying the identity of the request struct ``source``."""
    out = default_struct(fields)
    if isinstance(source, str):  # one name of a list of names
        key = _string_key(fields)
        if key is not None:
            out[key.name] = source
        return out
    if isinstance(source, int):  # a bare partition index
        for f in fields:
            if f.name in _PARTITION_KEYS and f.type == "int32" and not f.array and f.tag is None:
                out[f.name] = source
                break
        return out
    by_name = {f.name: f for f in sources if f.tag is None}
    only = sum(1 for f in fields if f.array and f.type == "struct" and f.tag is None) == 1
    for f in fields:
        if f.tag is not None:
            continue
        if f.array and f.type == "struct":
            assert f.fields is not None
            paired = _pair(f, sources, only)
            if paired is None:
                continue
            items = source.get(paired.name) or []
            sub = paired.fields or ()
            out[f.name] = [_mirror(f.fields, sub, item) for item in items]
        elif not f.array and f.type != "struct":
            src = _identity_source(f, by_name)
            if src is not None and src.name in source:
                out[f.name] = source[src.name]
    return out


def _identity_source(f: Field, by_name: dict[str, Field]) -> Field | None:
    if f.name in _OTHER_KEYS:
        src = by_name.get(f.name)
        return src if src is not None and src.type == f.type else None
    if f.name in _PARTITION_KEYS and f.type == "int32":
        return next((s for s in by_name.values() if s.name in _PARTITION_KEYS and s.type == "int32"
                     and not s.array), None)
    if f.name == "topic_id" or (f.name in _TOPIC_KEYS and f.entity_type == "topicName"):
        want = "uuid" if f.name == "topic_id" else "string"
        return next((s for s in by_name.values() if s.type == want and not s.array
                     and (s.name == "topic_id" if want == "uuid" else s.entity_type == "topicName")), None)
    return None


def _apply_fixes(fields: tuple[Field, ...], body: Body, fixes: dict[str, Any]) -> None:
    for f in fields:
        if f.tag is not None:
            continue
        if f.name in fixes and not f.array and f.type != "struct":
            body[f.name] = fixes[f.name]
        elif f.type == "struct" and f.fields is not None:
            value = body.get(f.name)
            for item in (value or ()) if f.array else ((value,) if value is not None else ()):
                _apply_fixes(f.fields, item, fixes)


__all__ = ["DecodeError", "build_error_body", "error_response", "error_values", "set_error_codes"]


def api_versions_answer(correlation_id: int, error_code: int, api_keys: Collection[tuple[int, int, int]] = ()) -> bytes:
    """An ApiVersions response frame with a v0 body (``api_keys`` as (api key, min, max)), whatever
    the request's version: what a broker answers at an error, KIP-511's UNSUPPORTED_VERSION among
    them (clients read an ApiVersions answer carrying an error as v0; its header is v0 at every
    version)."""
    from kproxy.protocol.payloads import encode_response

    body = {"error_code": error_code,
            "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi} for k, lo, hi in api_keys]}
    payload = encode_response(correlation_id, ApiKey.API_VERSIONS, 0, body)
    return _SIZE.pack(len(payload)) + payload
