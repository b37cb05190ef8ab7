"""Cross-check the codec against two independent implementations from PyPI.

* ``kio`` (0.6.5): frozen dataclasses generated from Kafka's JSON specs, one module
  per (api, version, direction), serialized by ``kio.serial``.
* ``kafka-python`` (3.0.12): message classes built from Kafka's JSON specs at
  import time (``kafka.protocol.<area>.<api>``), plus the hand-written classes of
  ``kafka.protocol.old`` that still cover versions newer specs dropped
  (Produce v0-v2, Fetch v0-v3, ...).

Two directions, both generated programmatically over every kind both sides know:

* theirs -> ours: build a message with kio, serialize it with kio; our decode
  must give the same values (compared field by field, by position, so the two
  naming schemes need not agree) and our encode must give back the same bytes.
* ours -> theirs: build a body from our schema, encode it with our codec; the
  other library must parse it to the same values and serialize it back to the
  very same bytes.

Where a library is known to differ from the wire format, the kind is skipped
with a comment saying why.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import inspect
import io
import pkgutil
import re
import uuid
from collections.abc import Iterator
from typing import Any

import kafka.protocol.api_message as kafka_api_message
import kio.index as kio_index
import kio.schema.errors as kio_errors
import kio.schema.index as kio_schema_index
import kio.serial as kio_serial
import kio.serial._implicit_defaults as kio_defaults
import kio.serial._introspect as kio_introspect
import kio.serial.readers as kio_readers
import kio.static.primitive as kio_primitive
import pytest

from kproxy.protocol import (
    MessageType,
    RequestHeader,
    _tables,
    codec,
    decode_body,
    decode_request,
    decode_response,
    encode_body,
    encode_request,
    encode_response,
    request_header_version,
    response_header_version,
)
from kproxy.protocol.headers import decode_request_header, encode_request_header
from kproxy.protocol.message_schemas import Field, all_message_kinds, message_schema
from tests.support.matrix import matrix_cut

Kind = tuple[int, int, MessageType]
OUR_KINDS = set(all_message_kinds())
PROFILES = ("full", "single", "nulls")
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
ZERO_UUID = uuid.UUID(int=0)


def _kind_id(kind: Kind) -> str:
    api_key, version, direction = kind
    return f"{api_key}-v{version}-{'req' if direction is MessageType.REQUEST else 'resp'}"


# =====================================================================================
# Values built from our schema (the "ours -> theirs" direction)
# =====================================================================================

# Error codes both sides know; int16 fields draw from these so that a library that
# maps error codes to an enum (kio) can represent every value.
KNOWN_ERROR_CODES = sorted(
    code for code in _tables.ERRORS if code in {int(e) for e in kio_errors.ErrorCode}
)


class Counter:
    """Deterministic, distinct values: positional mix-ups show as value mismatches."""

    def __init__(self, seed: int) -> None:
        self.n = seed * 1000

    def next(self) -> int:
        self.n += 1
        return self.n


def our_scalar(field: Field, gen: Counter, profile: str) -> Any:
    n = gen.next()
    t = field.type
    if t == "int8":
        return n % 120 + 1
    if t == "int16":
        return KNOWN_ERROR_CODES[n % len(KNOWN_ERROR_CODES)]
    if t == "uint16":
        return (n * 37) % 65535 + 1
    if t == "int32":
        return (n * 7919) % (2**31 - 1) + 1
    if t == "int64":
        # Positive and modest: kio reads some int64 fields as timestamps since the epoch.
        return n * 1_000_003
    if t == "bool":
        return True
    if t == "float64":
        return n + 0.25
    if t == "uuid":
        return uuid.UUID(int=(n << 64) | n)
    if t == "string":
        return f"s{n}-é✓"
    if t == "bytes":
        return bytes([n % 256, 0, 255, 7])
    if t == "records":
        return b"opaque-records-" + str(n).encode()
    if t == "struct":
        assert field.fields is not None
        return our_struct(field.fields, gen, profile)
    raise AssertionError(t)


def our_value(field: Field, gen: Counter, profile: str) -> Any:
    nullable_kind = field.array or field.type in ("string", "bytes", "records", "struct")
    if profile == "nulls" and field.nullable and nullable_kind:
        return None
    if field.array:
        element = Field(field.name, field.type, False, False, None, None, field.fields, field.entity_type)
        count = {"full": 2, "single": 1, "nulls": 0}[profile]
        return [our_scalar(element, gen, profile) for _ in range(count)]
    return our_scalar(field, gen, profile)


def our_struct(fields: tuple[Field, ...], gen: Counter, profile: str) -> dict[str, Any]:
    out = {f.name: our_value(f, gen, profile) for f in fields if f.tag is None}
    if profile == "full":
        # Tagged fields with values that are never their defaults: libraries that only
        # write non-default tagged fields (kio) then write exactly what we wrote.
        for f in fields:
            if f.tag is not None:
                out[f.name] = our_value(f, gen, profile)
    return out


def our_body(kind: Kind, profile: str, seed: int = 1) -> dict[str, Any]:
    schema = message_schema(*kind)
    assert schema is not None
    return our_struct(schema.fields, Counter(seed), profile)


# Our values as comparable trees: a struct is ("struct", [untagged values], {tag: value}).
def our_tree(fields: tuple[Field, ...], value: dict[str, Any]) -> tuple[str, list[Any], dict[int, Any]]:
    untagged = [_our_field_tree(f, value[f.name]) for f in fields if f.tag is None]
    tagged = {f.tag: _our_field_tree(f, value[f.name]) for f in fields if f.tag is not None and f.name in value}
    return ("struct", untagged, tagged)  # type: ignore[return-value]


def _our_field_tree(field: Field, value: Any) -> Any:
    if value is None:
        return None
    if field.array:
        element = Field(field.name, field.type, False, False, None, None, field.fields, field.entity_type)
        return [_our_field_tree(element, v) for v in value]
    if field.type == "struct":
        assert field.fields is not None
        return our_tree(field.fields, value)
    return value


# =====================================================================================
# kio
# =====================================================================================


def _kio_kinds() -> list[Kind]:
    out = []
    for api_key, name in kio_schema_index.api_key_map.items():
        for version, entities in kio_schema_index.schema_name_map[name].items():
            for direction, entity_type in ((MessageType.REQUEST, "request"), (MessageType.RESPONSE, "response")):
                if not any(str(e).endswith(entity_type) for e in entities):
                    continue
                if (api_key, version, direction) in OUR_KINDS:
                    out.append((api_key, version, direction))
    return sorted(out)


KIO_KINDS = _kio_kinds()
# This run's share of them (tests/support/matrix.py): every api's boundary versions, a seeded sample of the rest.
KIO_RUN = matrix_cut(KIO_KINDS, lambda k: k, "kio")

# Kinds where kio follows a different spec than our tables, for a known reason.
KIO_SKIP: dict[Kind, str] = {
    # Share-group state RPCs were early access in the Kafka 4.0 snapshot our tables come
    # from; Kafka later added PartitionResult.LeaderEpoch to v0 without bumping the
    # version, and kio 0.6.5 follows the later layout.
    (87, 0, MessageType.RESPONSE): "ReadShareGroupStateSummaryResponse v0 changed after the 4.0 snapshot",
}


def kio_class(kind: Kind) -> type[Any]:
    api_key, version, direction = kind
    if direction is MessageType.REQUEST:
        return kio_index.load_request_schema(api_key, version)  # type: ignore[no-any-return]
    return kio_index.load_response_schema(api_key, version)  # type: ignore[no-any-return]


def kio_serialize(cls: type[Any], entity: Any) -> bytes:
    buf = io.BytesIO()
    kio_serial.entity_writer(cls)(buf, entity)
    return buf.getvalue()


def kio_parse(cls: type[Any], data: bytes) -> Any:
    entity, size = kio_serial.entity_reader(cls)(data, 0)
    assert size == len(data), f"kio read {size} of {len(data)} bytes"
    return entity


def _kio_tag(field: dataclasses.Field[Any]) -> int | None:
    tag = kio_introspect.get_field_tag(field)
    return None if tag is None else int(tag)


def _kio_scalar(kafka_type: str, typ: type, gen: Counter) -> Any:
    n = gen.next()
    prim = kio_primitive
    if kafka_type == "bool":
        return n % 2 == 0
    if kafka_type == "error_code":
        return kio_errors.ErrorCode(KNOWN_ERROR_CODES[n % len(KNOWN_ERROR_CODES)])
    if kafka_type in ("int8", "int16", "int32", "int64", "uint16"):
        low, high = typ.__low__, typ.__high__  # type: ignore[attr-defined]
        span = min(high - low, 2**40)
        value = low + (n * 2654435761) % span
        if n % 3 == 0:
            value = (low, high, 0)[n % 9 // 3]
        return typ(value)
    if kafka_type == "float64":
        return prim.f64(n / 8)
    if kafka_type == "string":
        return f"k{n}-ñ✓"
    if kafka_type in ("bytes", "records"):
        raw = bytes([n % 256, 1, 0, 255]) * (n % 3)
        return prim.Records(raw) if kafka_type == "records" else raw
    if kafka_type == "uuid":
        return uuid.UUID(int=(n << 70) | n)
    if kafka_type == "timedelta_i32":
        return prim.i32Timedelta.parse(datetime.timedelta(milliseconds=n * 13 - 500))
    if kafka_type == "timedelta_i64":
        return prim.i64Timedelta.parse(datetime.timedelta(milliseconds=n * 1_000_007))
    if kafka_type == "datetime_i64":
        return kio_readers.tz_aware_from_i64(prim.i64(1_700_000_000_000 + n))
    raise AssertionError(kafka_type)


def kio_build(cls: type[Any], gen: Counter, profile: str) -> Any:
    """An instance of a kio entity with every field set (profile picks nulls and sizes)."""
    values = {}
    for f in dataclasses.fields(cls):
        tag = _kio_tag(f)
        if tag is not None and profile != "full":
            # Its default, which kio leaves off the wire.
            values[f.name] = kio_defaults.get_tagged_field_default(f)
            continue
        optional = kio_introspect.is_optional(f)
        if profile == "nulls" and optional:
            values[f.name] = None
            continue
        shape = kio_introspect.classify_field(f)
        kafka_type = f.metadata.get("kafka_type")
        count = {"full": 2, "single": 1, "nulls": 0}[profile]
        if isinstance(shape, kio_introspect.PrimitiveField):
            values[f.name] = _kio_scalar(kafka_type, shape.type_, gen)
        elif isinstance(shape, kio_introspect.PrimitiveTupleField):
            inner = shape.type_
            if kafka_type == "uuid" or not isinstance(inner, type):
                inner = uuid.UUID
            values[f.name] = tuple(_kio_scalar(kafka_type, inner, gen) for _ in range(count))
        elif isinstance(shape, kio_introspect.EntityField):
            values[f.name] = kio_build(shape.type_, gen, profile)
        else:
            values[f.name] = tuple(kio_build(shape.type_, gen, profile) for _ in range(count))
    return cls(**values)


def _kio_value(kafka_type: str | None, value: Any) -> Any:
    if kafka_type == "uuid":
        return ZERO_UUID if value is None else value
    if kafka_type == "datetime_i64":
        return -1 if value is None else (value - EPOCH) // datetime.timedelta(milliseconds=1)
    if value is None:
        return None
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return value // datetime.timedelta(milliseconds=1)
    if kafka_type == "error_code":
        return int(value)
    if kafka_type in ("bytes", "records"):
        return bytes(value)
    if kafka_type == "string":
        return str(value)
    if kafka_type == "bool":
        return bool(value)
    if kafka_type == "float64":
        return float(value)
    return int(value)


def kio_tree(cls: type[Any], entity: Any) -> tuple[str, list[Any], dict[int, Any]]:
    untagged: list[Any] = []
    tagged: dict[int, Any] = {}
    for f in dataclasses.fields(cls):
        value = getattr(entity, f.name)
        tag = _kio_tag(f)
        if tag is not None and value == kio_defaults.get_tagged_field_default(f):
            continue  # kio writes only non-default tagged fields
        shape = kio_introspect.classify_field(f)
        kafka_type = f.metadata.get("kafka_type")
        if value is None and not isinstance(shape, kio_introspect.PrimitiveField):
            tree: Any = None
        elif isinstance(shape, kio_introspect.PrimitiveField):
            tree = _kio_value(kafka_type, value)
        elif isinstance(shape, kio_introspect.PrimitiveTupleField):
            tree = [_kio_value(kafka_type, v) for v in value]
        elif isinstance(shape, kio_introspect.EntityField):
            tree = kio_tree(shape.type_, value)
        else:
            tree = [kio_tree(shape.type_, v) for v in value]
        if tag is None:
            untagged.append(tree)
        else:
            tagged[tag] = tree
    return ("struct", untagged, tagged)


@pytest.mark.parametrize("kind", KIO_RUN, ids=_kind_id)
def test_kio_to_ours(kind: Kind) -> None:
    """kio builds and serializes; we decode to the same values and re-encode to the same bytes."""
    if kind in KIO_SKIP:
        pytest.skip(KIO_SKIP[kind])
    cls = kio_class(kind)
    schema = message_schema(*kind)
    assert schema is not None
    for seed, profile in enumerate(PROFILES):
        entity = kio_build(cls, Counter(seed + 1), profile)
        raw = kio_serialize(cls, entity)
        body = decode_body(*kind, raw)
        assert our_tree(schema.fields, body) == kio_tree(cls, entity), profile
        assert encode_body(*kind, body) == raw, profile


@pytest.mark.parametrize("kind", KIO_RUN, ids=_kind_id)
def test_ours_to_kio(kind: Kind) -> None:
    """We build and encode; kio parses the same values and serializes the same bytes."""
    if kind in KIO_SKIP:
        pytest.skip(KIO_SKIP[kind])
    cls = kio_class(kind)
    schema = message_schema(*kind)
    assert schema is not None
    for seed, profile in enumerate(PROFILES):
        body = our_body(kind, profile, seed + 1)
        raw = encode_body(*kind, body)
        entity = kio_parse(cls, raw)
        assert kio_tree(cls, entity) == our_tree(schema.fields, body), profile
        assert kio_serialize(cls, entity) == raw, profile


def test_kio_header_versions_agree() -> None:
    """kio records each message's header schema; its version must be the one we derive."""
    wrong = []
    for kind in KIO_KINDS:
        api_key, version, direction = kind
        theirs = int(kio_class(kind).__header_schema__.__version__)
        ours = (request_header_version(api_key, version) if direction is MessageType.REQUEST
                else response_header_version(api_key, version))
        if theirs != ours:
            wrong.append((_kind_id(kind), theirs, ours))
    assert wrong == []


@pytest.mark.parametrize("client_id", ["c1", "", "klient-ü", None])
@pytest.mark.parametrize("header_version", [1, 2])
def test_kio_request_header_bytes(header_version: int, client_id: str | None) -> None:
    module = importlib.import_module(f"kio.schema.request_header.v{header_version}.header")
    header = module.RequestHeader(request_api_key=kio_primitive.i16(3), request_api_version=kio_primitive.i16(12),
                                  correlation_id=kio_primitive.i32(-5), client_id=client_id)
    raw = kio_serialize(module.RequestHeader, header)
    ours = RequestHeader(3, 12, -5, client_id, header_version, {})
    assert encode_request_header(ours) == raw
    decoded = decode_request_header(raw, header_version)
    assert (decoded.api_key, decoded.api_version, decoded.correlation_id, decoded.client_id) == (3, 12, -5, client_id)
    assert decoded.size == len(raw)


def test_kio_overlap_is_broad() -> None:
    apis = {k for k, _, _ in KIO_KINDS}
    assert len(KIO_KINDS) > 500
    for api_key in (0, 1, 2, 3, 8, 10, 11, 18, 19, 60):
        assert api_key in apis


# =====================================================================================
# kafka-python: message classes generated from the JSON specs
# =====================================================================================


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _kafka_python_classes() -> dict[tuple[int, MessageType], type]:
    import kafka.protocol as kp

    for info in pkgutil.walk_packages(kp.__path__, "kafka.protocol."):
        if ".old" in info.name or info.name.endswith((".generate_stubs",)):
            continue
        importlib.import_module(info.name)
    out: dict[tuple[int, MessageType], type] = {}
    for cls in _subclasses(kafka_api_message.ApiMessage):
        if getattr(cls, "_class_version", None) is not None:
            continue  # a versioned wrapper of a primary class
        direction = MessageType.REQUEST if cls.is_request() else MessageType.RESPONSE
        out[(cls.API_KEY, direction)] = cls
    return out


KP_CLASSES = _kafka_python_classes()


def _kp_kinds() -> list[Kind]:
    out = []
    for (api_key, direction), cls in KP_CLASSES.items():
        for version in range(0, cls.max_version + 1):
            if (api_key, version, direction) in OUR_KINDS:
                out.append((api_key, version, direction))
    return sorted(out)


KP_KINDS = _kp_kinds()
KP_RUN = matrix_cut(KP_KINDS, lambda k: k, "kafka-python")

# Kinds where kafka-python's classes are known to differ from the wire format (none in
# 3.0.12; the ApiVersions error-code quirk is worked around in _kp_body).
KP_SKIP: dict[Kind, str] = {}


def kp_tree(struct: Any, obj: Any, version: int) -> tuple[str, list[Any], dict[int, Any]]:
    untagged = [_kp_field_tree(f, getattr(obj, f.name), version) for f in struct.untagged_fields(version)]
    present = obj.tags or set()
    tagged = {f.tag: _kp_field_tree(f, getattr(obj, f.name), version)
              for f in struct.tagged_fields(version)._fields if f.name in present}
    return ("struct", untagged, tagged)


def _kp_field_tree(field: Any, value: Any, version: int) -> Any:
    if value is None:
        return None
    if field.is_struct_array():
        return [kp_tree(field, v, version) for v in value]
    if field.is_struct():
        return kp_tree(field, value, version)
    if isinstance(value, list | tuple):
        return [_kp_scalar(v) for v in value]
    return _kp_scalar(value)


def _kp_scalar(value: Any) -> Any:
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, set | frozenset):
        # kafka-python turns authorized-operations int32 bitfields into sets of bit numbers.
        return sum(1 << bit for bit in value)
    return value


def _kp_body(kind: Kind, profile: str, seed: int) -> dict[str, Any]:
    body = our_body(kind, profile, seed)
    if kind[0] == 18 and kind[2] is MessageType.RESPONSE:
        # kafka-python decodes any ApiVersions response whose error code is not 0 as v0
        # (what a broker sends for UNSUPPORTED_VERSION); keep it 0 to test the real layout.
        body["error_code"] = 0
    return body


@pytest.mark.parametrize("kind", KP_RUN, ids=_kind_id)
def test_ours_to_kafka_python(kind: Kind) -> None:
    """We encode; kafka-python decodes the same values and re-encodes the same bytes."""
    if kind in KP_SKIP:
        pytest.skip(KP_SKIP[kind])
    api_key, version, direction = kind
    cls = KP_CLASSES[(api_key, direction)]
    schema = message_schema(*kind)
    assert schema is not None
    for seed, profile in enumerate(PROFILES):
        body = _kp_body(kind, profile, seed + 1)
        raw = encode_body(*kind, body)
        message = cls.decode(raw, version=version)
        message._header = None  # decode leaves it unset; some classes' encode reads it
        assert kp_tree(cls._struct, message, version) == our_tree(schema.fields, body), profile
        assert bytes(message.encode()) == raw, profile


@pytest.mark.parametrize("kind", KP_RUN, ids=_kind_id)
def test_kafka_python_whole_payloads(kind: Kind) -> None:
    """Header and body together: kafka-python frames our body; we read the payload back."""
    if kind in KP_SKIP:
        pytest.skip(KP_SKIP[kind])
    api_key, version, direction = kind
    cls = KP_CLASSES[(api_key, direction)]
    body = _kp_body(kind, "full", 7)
    message = cls.decode(encode_body(*kind, body), version=version)
    if direction is MessageType.REQUEST:
        message.with_header(correlation_id=123456, client_id="kp-ü")
        payload = bytes(message.encode(header=True))
        request = decode_request(payload)
        assert request.header.api_key == api_key
        assert request.header.api_version == version
        assert request.header.correlation_id == 123456
        assert request.header.client_id == "kp-ü"
        assert request.header.header_version == request_header_version(api_key, version)
        assert request.body == body
        assert encode_request(request.header, request.body) == payload
    else:
        message.with_header(correlation_id=-7)
        payload = bytes(message.encode(header=True))
        response = decode_response(payload, api_key, version)
        assert response.header.correlation_id == -7
        assert response.body == body
        assert encode_response(-7, api_key, version, response.body) == payload


def test_kafka_python_overlap_is_broad() -> None:
    apis = {k for k, _, _ in KP_KINDS}
    for api_key in (0, 1, 2, 3, 8, 10, 11, 18, 19, 60):
        assert api_key in apis


# =====================================================================================
# kafka-python: the hand-written classes of kafka.protocol.old (old versions)
# =====================================================================================


def _old_classes() -> dict[Kind, type]:
    import kafka.protocol.old as old

    out: dict[Kind, type] = {}
    for info in pkgutil.walk_packages(old.__path__, "kafka.protocol.old."):
        module = importlib.import_module(info.name)
        for name, cls in vars(module).items():
            match = re.fullmatch(r"\w+(Request|Response)_v(\d+)", name)
            if not (match and inspect.isclass(cls) and cls.__module__ == info.name):
                continue
            direction = MessageType.REQUEST if match.group(1) == "Request" else MessageType.RESPONSE
            version = int(match.group(2))
            if getattr(cls, "API_VERSION", None) != version:
                continue
            kind = (cls.API_KEY, version, direction)
            schema = message_schema(*kind)
            # Flexible bodies are covered above; the old classes treat tags differently.
            if schema is not None and not schema.flexible:
                out[kind] = cls
    return out


OLD_CLASSES = _old_classes()

# Old classes known to differ from the wire format (not from us).
OLD_SKIP: dict[Kind, str] = {
    # kafka-python's DescribeLogDirsRequest_v0 declares partitions as one int32; the spec
    # (and every broker) has an array of int32 there.
    (35, 0, MessageType.REQUEST): "kafka-python old class: partitions is int32, not []int32",
}


def _old_leaves(value: Any) -> Iterator[Any]:
    """Scalars of an old-style decoded value in wire order.

    The old classes nest differently from the specs in places (Metadata v0 topics are
    bare strings, not structs of one name), so values are compared as flat sequences;
    the byte comparison checks the structure.
    """
    if isinstance(value, list | tuple):
        for v in value:
            yield from _old_leaves(v)
    else:
        yield _kp_scalar(value)


def _our_leaves(fields: tuple[Field, ...], value: dict[str, Any]) -> Iterator[Any]:
    for f in fields:
        assert f.tag is None
        v = value[f.name]
        if v is None:
            yield None
        elif f.type == "struct":
            assert f.fields is not None
            for item in v if f.array else [v]:
                yield from _our_leaves(f.fields, item)
        elif f.array:
            yield from v
        else:
            yield v


@pytest.mark.parametrize("kind", sorted(OLD_CLASSES), ids=_kind_id)
def test_ours_to_kafka_python_old_classes(kind: Kind) -> None:
    if kind in OLD_SKIP:
        pytest.skip(OLD_SKIP[kind])
    cls = OLD_CLASSES[kind]
    schema = message_schema(*kind)
    assert schema is not None
    for seed, profile in enumerate(("full", "single")):
        body = our_body(kind, profile, seed + 1)
        raw = encode_body(*kind, body)
        values = cls.SCHEMA.decode(io.BytesIO(raw))
        assert list(_old_leaves(values)) == list(_our_leaves(schema.fields, body)), profile
        assert bytes(cls(*values).encode()) == raw, profile


def test_old_classes_cover_old_versions() -> None:
    for kind in [(0, 0, MessageType.REQUEST), (0, 2, MessageType.RESPONSE), (1, 0, MessageType.REQUEST),
                 (1, 3, MessageType.RESPONSE), (2, 0, MessageType.REQUEST), (8, 1, MessageType.REQUEST),
                 (19, 1, MessageType.REQUEST), (11, 0, MessageType.RESPONSE)]:
        assert kind in OLD_CLASSES


# =====================================================================================
# Hand-built messages from kafka-python's old classes (theirs -> ours) for old versions
# =====================================================================================


def _old(kind: Kind) -> type:
    return OLD_CLASSES[kind]


def test_kafka_python_old_produce_v0_to_ours() -> None:
    message_set = bytes(range(40))
    cls = _old((0, 0, MessageType.REQUEST))
    raw = bytes(cls(required_acks=-1, timeout=30000, topics=[("tøpic", [(3, message_set)])]).encode())
    body = decode_body(0, 0, MessageType.REQUEST, raw)
    assert body == {"acks": -1, "timeout_ms": 30000,
                    "topic_data": [{"name": "tøpic", "partition_data": [{"index": 3, "records": message_set}]}]}
    assert encode_body(0, 0, MessageType.REQUEST, body) == raw


def test_kafka_python_old_fetch_v3_to_ours() -> None:
    cls = _old((1, 3, MessageType.REQUEST))
    raw = bytes(cls(replica_id=-1, max_wait_time=500, min_bytes=1, max_bytes=52428800,
                    topics=[("a", [(0, 42, 1048576), (1, 7, 1024)])]).encode())
    body = decode_body(1, 3, MessageType.REQUEST, raw)
    assert body["replica_id"] == -1
    assert body["max_wait_ms"] == 500
    assert body["max_bytes"] == 52428800
    assert body["topics"][0]["topic"] == "a"
    assert body["topics"][0]["partitions"][1] == {"partition": 1, "fetch_offset": 7, "partition_max_bytes": 1024}
    assert encode_body(1, 3, MessageType.REQUEST, body) == raw


def test_kafka_python_old_metadata_v0_response_to_ours() -> None:
    cls = _old((3, 0, MessageType.RESPONSE))
    raw = bytes(cls(brokers=[(1, "broker-1", 9092), (2, "broker-2", 9093)],
                    topics=[(0, "t", [(0, 0, 1, [1, 2], [1])])]).encode())
    body = decode_body(3, 0, MessageType.RESPONSE, raw)
    assert body["brokers"][1] == {"node_id": 2, "host": "broker-2", "port": 9093}
    assert body["topics"][0]["partitions"][0]["replica_nodes"] == [1, 2]
    assert encode_body(3, 0, MessageType.RESPONSE, body) == raw


def test_codec_for_every_crosschecked_kind_exists() -> None:
    for kind in KIO_KINDS + KP_KINDS + sorted(OLD_CLASSES):
        assert codec(*kind) is not None
