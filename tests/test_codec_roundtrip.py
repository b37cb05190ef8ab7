"""Property tests: every message kind the tables know round-trips through the codec.

For each (api key, version, direction) of :func:`all_message_kinds`, a Hypothesis
strategy is derived from the schema's :class:`Field` tree. It generates valid
bodies (integers in range of their type, non-ASCII strings, None where the field
is nullable, uuids, bytes, records as opaque bytes or None, small arrays, nested
structs, known tagged fields sometimes present and sometimes absent, and, in
flexible versions only, unknown tagged fields under ``"_unknown_tags"``) and checks:

* ``decode(encode(body)) == body``;
* ``encode(decode(data)) == data``;
* ``skip(data, 0) == len(data)``;
* :func:`scan_body` accepts the bytes and accounts for every records field.
"""

from __future__ import annotations

import functools
import os
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.protocol import MessageType, codec, decode_body, encode_body, scan_body
from kproxy.protocol.message_schemas import Field, all_message_kinds, message_schema, supported_versions
from tests.support.matrix import matrix_cut

KINDS = all_message_kinds()
# test_roundtrip's share of them in this run (tests/support/matrix.py): every api's boundary versions
# in each direction, and a seeded sample of the rest.
ROUNDTRIP_KINDS = matrix_cut(KINDS, lambda k: k, "roundtrip")
# Per kind; raise it for a deeper run: KPROXY_CODEC_EXAMPLES=500 pytest tests/test_codec_roundtrip.py
# (a deep run is random; the default run is derandomized, so it is the same every time).
MAX_EXAMPLES = int(os.environ.get("KPROXY_CODEC_EXAMPLES", "15"))
DERANDOMIZE = "KPROXY_CODEC_EXAMPLES" not in os.environ

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}
MAX_TAG = 2**32 - 1  # tags are unsigned varints of at most 32 bits


def _kind_id(kind: tuple[int, int, MessageType]) -> str:
    api_key, version, direction = kind
    return f"{api_key}-v{version}-{'req' if direction is MessageType.REQUEST else 'resp'}"


def _scalar(field: Field, flexible: bool) -> st.SearchStrategy[Any]:
    t = field.type
    if t in INT_RANGES:
        lo, hi = INT_RANGES[t]
        return st.integers(lo, hi)
    if t == "bool":
        return st.booleans()
    if t == "float64":
        # NaN != NaN would break the value comparison; the byte checks cover the rest.
        return st.floats(allow_nan=False)
    if t == "uuid":
        return st.one_of(st.just(uuid.UUID(int=0)), st.uuids())
    if t == "string":
        return st.text(max_size=12)
    if t == "bytes":
        return st.binary(max_size=16)
    if t == "records":
        # Records stay opaque in the codec; null is accepted for them in every version.
        return st.one_of(st.none(), st.binary(max_size=48))
    if t == "struct":
        assert field.fields is not None
        return struct_strategy(field.fields, flexible)
    raise AssertionError(f"unexpected type {t}")


def value_strategy(field: Field, flexible: bool) -> st.SearchStrategy[Any]:
    if field.array:
        element = Field(field.name, field.type, False, False, None, None, field.fields, field.entity_type)
        strategy: st.SearchStrategy[Any] = st.lists(_scalar(element, flexible), max_size=3)
    else:
        strategy = _scalar(field, flexible)
    nullable_kind = field.array or field.type in ("string", "bytes", "struct")
    if field.nullable and nullable_kind:
        strategy = st.one_of(st.none(), strategy)
    return strategy


def struct_strategy(fields: tuple[Field, ...], flexible: bool) -> st.SearchStrategy[dict[str, Any]]:
    required = {f.name: value_strategy(f, flexible) for f in fields if f.tag is None}
    optional = {f.name: value_strategy(f, flexible) for f in fields if f.tag is not None}
    if flexible:
        known = {f.tag for f in fields if f.tag is not None}
        unknown_tag = st.integers(0, MAX_TAG).filter(lambda t: t not in known)
        optional["_unknown_tags"] = st.dictionaries(unknown_tag, st.binary(max_size=8), min_size=1, max_size=3)
    return st.fixed_dictionaries(required, optional=optional)


@functools.cache
def body_strategy(api_key: int, version: int, direction: MessageType) -> st.SearchStrategy[dict[str, Any]]:
    schema = message_schema(api_key, version, direction)
    assert schema is not None
    return struct_strategy(schema.fields, schema.flexible)


def _records_fields(fields: tuple[Field, ...]) -> bool:
    return any(f.type == "records" or (f.fields is not None and _records_fields(f.fields)) for f in fields)


def test_every_kind_is_covered() -> None:
    assert len(KINDS) > 600
    assert len(set(KINDS)) == len(KINDS)
    for kind in KINDS:
        assert codec(*kind) is not None


@pytest.mark.parametrize("kind", ROUNDTRIP_KINDS, ids=_kind_id)
@settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much, HealthCheck.large_base_example])
@given(data=st.data())
def test_roundtrip(kind: tuple[int, int, MessageType], data: st.DataObject) -> None:
    api_key, version, direction = kind
    body = data.draw(body_strategy(api_key, version, direction), label="body")
    the_codec = codec(api_key, version, direction)
    assert the_codec is not None

    raw = encode_body(api_key, version, direction, body)
    decoded = decode_body(api_key, version, direction, raw)
    assert decoded == body
    assert encode_body(api_key, version, direction, decoded) == raw
    assert the_codec.skip(raw, 0) == len(raw)

    # At an offset too, as when the body follows a header in the same buffer.
    prefixed = b"\x01\x02\x03" + raw
    assert the_codec.decode(prefixed, 3) == body
    assert the_codec.skip(prefixed, 3) == len(prefixed)

    scan = scan_body(api_key, version, direction, raw)
    for start, end in scan.records:
        assert 0 <= start < end <= len(raw)
    if not _records_fields(the_codec.schema.fields):
        assert scan.records == []
    for topic, partition, code in scan.entries:
        assert topic is None or isinstance(topic, str | uuid.UUID)
        assert partition is None or isinstance(partition, int)
        assert code is None or isinstance(code, int)


@pytest.mark.parametrize("kind", [(0, 3), (0, 9), (0, 11), (1, 4), (1, 12), (1, 16)])
def test_scan_reports_each_records_range(kind: tuple[int, int]) -> None:
    """The (start, end) pairs a scan reports are exactly the non-empty records values."""
    api_key, version = kind
    direction = MessageType.REQUEST if api_key == 0 else MessageType.RESPONSE
    schema = message_schema(api_key, version, direction)
    assert schema is not None

    @settings(max_examples=30, deadline=None, database=None, derandomize=DERANDOMIZE,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(body=body_strategy(api_key, version, direction))
    def check(body: dict[str, Any]) -> None:
        raw = encode_body(api_key, version, direction, body)
        found = [raw[start:end] for start, end in scan_body(api_key, version, direction, raw).records]
        expected = [r for r in _collect_records(schema.fields, body) if r]
        assert found == expected

    check()


def _collect_records(fields: tuple[Field, ...], value: dict[str, Any]) -> list[bytes]:
    """Records values of a body in wire order (tagged fields hold none in any spec)."""
    out: list[bytes] = []
    for f in fields:
        if f.tag is not None:
            continue
        v = value[f.name]
        items = (v or []) if f.array else [v]
        for item in items:
            if f.type == "records" and item is not None:
                out.append(item)
            elif f.type == "struct" and item is not None:
                assert f.fields is not None
                out.extend(_collect_records(f.fields, item))
    return out


@pytest.mark.parametrize("kind", KINDS[::7], ids=_kind_id)
def test_null_accepted_for_non_nullable_fields(kind: tuple[int, int, MessageType]) -> None:
    """Null strings, bytes and arrays round-trip even where the spec says non-nullable."""
    the_codec = codec(*kind)
    assert the_codec is not None
    body = _all_null(the_codec.schema.fields)
    raw = the_codec.encode(body)
    assert the_codec.decode(raw) == body
    assert the_codec.encode(the_codec.decode(raw)) == raw


def _all_null(fields: tuple[Field, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        if f.tag is not None:
            continue
        if f.array or f.type in ("string", "bytes", "records"):
            out[f.name] = None
        elif f.type == "struct":
            assert f.fields is not None
            out[f.name] = None if f.nullable else _all_null(f.fields)
        elif f.type == "uuid":
            out[f.name] = uuid.UUID(int=1)
        elif f.type == "float64":
            out[f.name] = 1.5
        elif f.type == "bool":
            out[f.name] = True
        else:
            out[f.name] = 1
    return out


def _tagged_fields(fields: tuple[Field, ...], path: str = "") -> list[tuple[str, Field]]:
    out = []
    for f in fields:
        if f.tag is not None:
            out.append((path + f.name, f))
        if f.fields is not None:
            out.extend(_tagged_fields(f.fields, f"{path}{f.name}."))
    return out


def test_schema_tags_are_ints() -> None:
    """Field.tag is the tag number: an int, for every tagged field of every kind.

    (Kafka's BrokerHeartbeatRequest.json spells one tag as the string "0"; a table
    that keeps it a string breaks every lookup by the wire's integer tag.)
    """
    wrong = [(_kind_id(kind), path, f.tag) for kind in KINDS
             for path, f in _tagged_fields(message_schema(*kind).fields)  # type: ignore[union-attr]
             if type(f.tag) is not int]
    assert wrong == []


def test_splice_edits_tagged_offline_log_dirs() -> None:
    """The practical effect of a string tag: splice_body cannot find the field on the wire."""
    from kproxy.protocol import default_body, splice_body

    body = default_body(63, 1, MessageType.REQUEST)
    body["offline_log_dirs"] = [uuid.UUID(int=1)]
    raw = encode_body(63, 1, MessageType.REQUEST, body)
    new, edited = splice_body(63, 1, MessageType.REQUEST, raw, {"offline_log_dirs": lambda dirs: []})
    assert edited == ["offline_log_dirs"]
    assert decode_body(63, 1, MessageType.REQUEST, new)["offline_log_dirs"] == []


# -- splicing node_endpoints (KIP-951) keeps every other tag -------------------------------------
# Produce v10+ and Fetch v16+ responses carry node_endpoints as top-level tag 0; a broker
# may send other tags after it (a newer Kafka's fields are unknown tags to kproxy), and
# partitions carry tags of their own. Rewriting the endpoints must keep all of them.
OTHER_TOP_TAGS = {1: b"\x01\x02", 42: b"", 300: b"t" * 130}  # 300 and 130: two-byte varints


def _kip951_body(api_key: int, version: int) -> dict[str, Any]:
    from kproxy.protocol.frame_builder import response_body

    leader = {"leader_id": 2, "leader_epoch": 9}
    if api_key == 0:
        responses = [{"name": "orders", "partition_responses": [
            {"index": 0, "error_code": 6, "base_offset": 5, "current_leader": leader,
             "_unknown_tags": {7: b"p"}}]}]
    else:
        responses = [{"topic_id": uuid.UUID(int=77), "partitions": [
            {"partition_index": 0, "error_code": 6, "high_watermark": 5, "records": None,
             "current_leader": leader, "_unknown_tags": {9: b"q"}}]}]
    body = response_body(api_key, version, responses=responses, node_endpoints=[
        {"node_id": 2, "host": "b2.internal", "port": 9093, "rack": None},
        {"node_id": 3, "host": "b3.internal", "port": 9094, "rack": "r3"}])
    body["_unknown_tags"] = dict(OTHER_TOP_TAGS)
    return body


def _kip951_kinds() -> list[tuple[int, int]]:
    produce, fetch = supported_versions(0), supported_versions(1)
    assert produce is not None and fetch is not None
    return [(0, v) for v in range(10, produce[1] + 1)] + [(1, v) for v in range(16, fetch[1] + 1)]


@pytest.mark.parametrize(("api_key", "version"), _kip951_kinds())
def test_splice_of_node_endpoints_keeps_the_other_tags(api_key: int, version: int) -> None:
    from kproxy.protocol import splice_body

    body = _kip951_body(api_key, version)
    raw = encode_body(api_key, version, MessageType.RESPONSE, body)
    assert decode_body(api_key, version, MessageType.RESPONSE, raw) == body  # the input has every tag

    def move(endpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**e, "host": "kproxy.test", "port": 40000 + e["node_id"]} for e in endpoints]

    new, edited = splice_body(api_key, version, MessageType.RESPONSE, raw, {"node_endpoints": move})
    assert edited == ["node_endpoints"]
    assert new is not None
    expected = {**body, "node_endpoints": move(body["node_endpoints"])}
    got = decode_body(api_key, version, MessageType.RESPONSE, new)
    assert got.get("_unknown_tags") == OTHER_TOP_TAGS, "top-level tags other than node_endpoints were lost"
    assert got == expected
    assert new == encode_body(api_key, version, MessageType.RESPONSE, expected)
    # A splice that changes nothing gives back the input, byte for byte.
    same, _ = splice_body(api_key, version, MessageType.RESPONSE, raw, {"node_endpoints": lambda v: v})
    assert same == raw
