"""Hostile and broken input: the codec must fail fast, cheaply, and only with ProtocolError.

* frame sizes: negative and over-limit prefixes are refused as soon as their four
  bytes are in, naming the size and the limit;
* truncation at every byte of a few frames (Produce v0, a flexible Metadata v12
  response, Fetch v12/v16 responses with records) gives a DecodeError with an offset;
* varints longer than 5 bytes or above 32 bits, lengths past the end, invalid UTF-8;
* huge array counts with little data: refused in well under a second, without
  allocating for the announced count;
* unknown api keys and versions: UnknownApiError, while peek_request still works;
* fuzz: random bytes and mutated valid bodies for random kinds; decode_body,
  scan_body and splice_body raise only ProtocolError subclasses (or succeed), and
  whatever decodes also scans, skips, re-encodes to the same bytes and splices
  (an identity splice giving back the input);
* MessageCodec.skip on truncated bodies (ProtocolError only, like every decoder);
* the round-trip contract: non-canonical bytes are refused, decodable edge cases
  (tags at their defaults, null structs, NaN payloads...) re-encode exactly;
* splice_body edits returning values the schema cannot hold: EncodeError.
"""

from __future__ import annotations

import os
import time
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.protocol import (
    DecodeError,
    FrameSizeError,
    FrameSplitter,
    MessageType,
    ProtocolError,
    RequestHeader,
    UnknownApiError,
    codec,
    decode_body,
    decode_request,
    decode_response,
    encode_body,
    encode_request,
    encode_response,
    peek_request,
    scan_body,
    splice_body,
)
from kproxy.protocol.framing import DEFAULT_MAX_FRAME_SIZE
from kproxy.protocol.message_schemas import Field, all_message_kinds, message_schema

REQ = MessageType.REQUEST
RESP = MessageType.RESPONSE
KINDS = all_message_kinds()
Kind = tuple[int, int, MessageType]

# From the project's protocol guides (../shared/seeds/000_*.txt, Produce v0 example):
# the request payload, after its 4-byte size prefix.
PRODUCE_V0_PAYLOAD = bytes.fromhex(
    "0000 0000 00000001 0003 666f6f"  # header v1: Produce v0, correlation id 1, "foo"
    "0001 000005dc 00000001 0004 74657374 00000001 00000000 00000025"
    "0000000000000000 00000019 73acf77c 00 00 ffffffff 0000000b 68656c6c6f20776f726c64"
)


def _kind_id(kind: Kind) -> str:
    return f"{kind[0]}-v{kind[1]}-{'req' if kind[2] is REQ else 'resp'}"


# -- a deterministic, fully populated body for any kind --------------------------------


def rich_value(field: Field, n: list[int]) -> Any:
    n[0] += 1
    k = n[0]
    if field.array:
        element = Field(field.name, field.type, False, False, None, None, field.fields, field.entity_type)
        return [rich_value(element, n) for _ in range(2)]
    t = field.type
    if t == "struct":
        assert field.fields is not None
        return rich_struct(field.fields, n)
    return {
        "int8": k % 100, "int16": k % 30000, "int32": k * 1009, "int64": k * 1_000_003, "uint16": k,
        "uint32": k, "bool": k % 2 == 0, "float64": k + 0.5, "uuid": uuid.UUID(int=k),
        "string": f"s{k}-é", "bytes": bytes([k % 256, 1, 2]), "records": b"R" * (k % 7 + 3),
    }[t]


def rich_struct(fields: tuple[Field, ...], n: list[int]) -> dict[str, Any]:
    return {f.name: rich_value(f, n) for f in fields}  # tagged fields included


def rich_body(kind: Kind) -> dict[str, Any]:
    schema = message_schema(*kind)
    assert schema is not None
    body = rich_struct(schema.fields, [0])
    if schema.flexible:
        body["_unknown_tags"] = {90: b"\x01\x02"}
    return body


def _error(fn: Callable[..., Any], *args: Any) -> ProtocolError:
    """Call ``fn(*args)``; it must raise a ProtocolError (anything else fails the test)."""
    try:
        fn(*args)
    except ProtocolError as exc:
        return exc
    except Exception as exc:  # pragma: no cover - the assertion below says what went wrong
        raise AssertionError(f"expected a ProtocolError, got {type(exc).__name__}: {exc}") from exc
    raise AssertionError("expected a ProtocolError, nothing was raised")


# =====================================================================================
# Frame sizes
# =====================================================================================


@pytest.mark.parametrize("size", [-1, -2, -(2**31)])
def test_negative_frame_size(size: int) -> None:
    splitter = FrameSplitter()
    splitter.feed(size.to_bytes(4, "big", signed=True))
    exc = _error(splitter.next_frame)
    assert isinstance(exc, FrameSizeError)
    assert str(size) in str(exc)
    assert exc.offset == 0


@pytest.mark.parametrize(("size", "limit"), [(2**31 - 1, DEFAULT_MAX_FRAME_SIZE),
                                             (DEFAULT_MAX_FRAME_SIZE + 1, DEFAULT_MAX_FRAME_SIZE),
                                             (1001, 1000), (1, 0)])
def test_over_limit_frame_size_names_size_and_limit(size: int, limit: int) -> None:
    splitter = FrameSplitter(max_frame_size=limit)
    tracemalloc.start()
    try:
        splitter.feed(size.to_bytes(4, "big"))  # the prefix alone: no body yet
        exc = _error(splitter.next_frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(exc, FrameSizeError)
    assert str(size) in str(exc)
    assert str(limit) in str(exc)
    assert peak < 1_000_000  # nothing sized for the announced frame
    assert splitter.buffered == 4
    # pending_frame_size refuses it too, before any body byte arrives.
    assert isinstance(_error(splitter.pending_frame_size), FrameSizeError)


def test_frame_size_at_the_limit_is_accepted() -> None:
    splitter = FrameSplitter(max_frame_size=8)
    splitter.feed((8).to_bytes(4, "big") + b"12345678" + (0).to_bytes(4, "big"))
    assert splitter.next_frame() == b"12345678"
    assert splitter.next_frame() == b""
    assert splitter.next_frame() is None


def test_frame_size_error_offset_is_the_stream_offset() -> None:
    splitter = FrameSplitter(max_frame_size=100)
    good = (3).to_bytes(4, "big") + b"abc"
    splitter.feed(good + good + (101).to_bytes(4, "big") + b"x" * 10)
    assert splitter.next_frame() == b"abc"
    assert splitter.next_frame() == b"abc"
    exc = _error(splitter.next_frame)
    assert isinstance(exc, FrameSizeError)
    assert exc.offset == 2 * len(good)


def test_frames_fed_byte_by_byte() -> None:
    stream = b"".join((len(p)).to_bytes(4, "big") + p for p in (b"", b"a", b"bc" * 40_000, b"d"))
    splitter = FrameSplitter()
    got = []
    for i in range(0, len(stream), 997):
        splitter.feed(stream[i:i + 997])
        got.extend(splitter.frames())
    assert got == [b"", b"a", b"bc" * 40_000, b"d"]
    assert splitter.buffered == 0


# =====================================================================================
# Truncation at every byte
# =====================================================================================


def _metadata_v12_response_payload() -> bytes:
    body = rich_body((3, 12, RESP))
    body["topics"][1]["name"] = None
    return encode_response(77, 3, 12, body, header_tags={5: b"hdr"})


def _fetch_response_payload(version: int) -> bytes:
    body = rich_body((1, version, RESP))
    for topic in body["responses"]:
        for partition in topic["partitions"]:
            # Opaque to the codec; shaped like the start of a RecordBatch v2 anyway.
            partition["records"] = bytes(8) + (49).to_bytes(4, "big") + bytes(4) + b"\x02" + bytes(44)
    return encode_response(78, 1, version, body)


TRUNCATION_CASES = {
    "produce-v0-request": (PRODUCE_V0_PAYLOAD, lambda p: decode_request(p)),
    "metadata-v12-response": (_metadata_v12_response_payload(), lambda p: decode_response(p, 3, 12)),
    "fetch-v12-response": (_fetch_response_payload(12), lambda p: decode_response(p, 1, 12)),
    "fetch-v16-response": (_fetch_response_payload(16), lambda p: decode_response(p, 1, 16)),
}


@pytest.mark.parametrize("case", sorted(TRUNCATION_CASES))
def test_truncated_payloads_raise_decode_error_with_offset(case: str) -> None:
    payload, decode = TRUNCATION_CASES[case]
    decode(payload)  # the whole payload decodes
    for cut in range(len(payload)):
        exc = _error(decode, payload[:cut])
        assert isinstance(exc, DecodeError), (cut, exc)
        assert exc.offset is not None, (cut, exc)
        assert 0 <= exc.offset <= cut, (cut, exc)


BODY_CASES: list[tuple[Kind, bytes]] = [
    ((0, 0, REQ), PRODUCE_V0_PAYLOAD[13:]),
    ((3, 12, RESP), encode_body(3, 12, RESP, rich_body((3, 12, RESP)))),
    ((1, 12, RESP), _fetch_response_payload(12)[5:]),
    ((1, 16, RESP), _fetch_response_payload(16)[5:]),
    ((0, 9, REQ), encode_body(0, 9, REQ, rich_body((0, 9, REQ)))),
]


@pytest.mark.parametrize(("kind", "body"), BODY_CASES, ids=[_kind_id(k) for k, _ in BODY_CASES])
def test_truncated_bodies_fail_in_every_entry_point(kind: Kind, body: bytes) -> None:
    assert encode_body(*kind, decode_body(*kind, body)) == body
    the_codec = codec(*kind)
    assert the_codec is not None
    first = the_codec.schema.fields[0].name
    last = the_codec.schema.fields[-1].name
    for cut in range(len(body)):
        data = body[:cut]
        for fn in (decode_body, scan_body):
            exc = _error(fn, *kind, data)
            assert isinstance(exc, DecodeError), (cut, exc)
            assert exc.offset is not None and 0 <= exc.offset <= cut, (cut, exc)
        # splice_body reads up to its last edited field and copies the rest untouched
        # (by design: it does not validate bytes it does not need), so a truncated tail
        # may pass through; an identity edit must then give back the input (or None,
        # meaning "nothing to change").
        for name in (first, last):
            try:
                out, _ = splice_body(*kind, data, {name: lambda v: v})
            except ProtocolError as exc:
                assert isinstance(exc, DecodeError), (cut, exc)
                assert exc.offset is not None and 0 <= exc.offset <= cut, (cut, exc)
            else:
                assert out is None or out == data, (cut, name)
    # The whole body (cut == len(body), which the loop above stops short of): every entry
    # point accepts it, and an identity splice of either field gives back the input exactly.
    assert scan_body(*kind, body) is not None
    for name in (first, last):
        out, edited = splice_body(*kind, body, {name: lambda v: v})
        assert (out, edited) == (body, [name]), name


def test_skip_on_truncated_bodies_raises_protocol_error() -> None:
    """MessageCodec.skip is public: on bad bytes it must raise a ProtocolError too.

    errors.py: "Every decoder in kproxy.protocol raises only these (a bare ValueError,
    KeyError, IndexError or struct.error escaping is a bug)".
    """
    wrong = []
    for kind, body in BODY_CASES:
        the_codec = codec(*kind)
        assert the_codec is not None
        assert the_codec.skip(body, 0) == len(body)
        for cut in range(len(body)):
            try:
                end = the_codec.skip(body[:cut], 0)
            except ProtocolError:
                continue
            except Exception as exc:
                wrong.append((_kind_id(kind), cut, type(exc).__name__))
                continue
            assert end <= cut
    assert wrong == []


# =====================================================================================
# Varints, lengths, UTF-8
# =====================================================================================

TOO_LONG = b"\x80\x80\x80\x80\x80\x01"  # 6 bytes
ABOVE_32_BITS = b"\xff\xff\xff\xff\x7f"  # 5 bytes, value > 2**32 - 1


@pytest.mark.parametrize("varint", [TOO_LONG, b"\x81\x80\x80\x80\x80\x80\x80\x80\x80\x01", ABOVE_32_BITS],
                         ids=["6-bytes", "10-bytes", "above-32-bits"])
def test_overlong_varints(varint: bytes) -> None:
    cases: list[tuple[Kind, bytes]] = [
        # compact array count (Metadata v12 request topics)
        ((3, 12, REQ), varint + b"\x00\x00\x00"),
        # compact string length (ApiVersions v3 request software name)
        ((18, 3, REQ), varint + b"abc\x01\x00"),
        # tag-section count after two empty compact strings
        ((18, 3, REQ), b"\x01\x01" + varint),
        # tag number and tag size inside a tag section
        ((18, 3, REQ), b"\x01\x01\x01" + varint + b"\x00"),
        ((18, 3, REQ), b"\x01\x01\x01\x05" + varint),
    ]
    for kind, body in cases:
        for fn in (decode_body, scan_body):
            exc = _error(fn, *kind, body)
            assert isinstance(exc, DecodeError), body
            assert exc.offset is not None and 0 <= exc.offset <= len(body)
    # In a request header v2 tag section too.
    header = RequestHeader(18, 3, 1, "c", 2, {})
    payload = encode_request(header, {"client_software_name": "a", "client_software_version": "b"})
    broken = payload[:13] + varint + payload[14:]
    assert isinstance(_error(lambda: decode_request(broken)), DecodeError)


def test_varint_message_names_the_problem() -> None:
    exc = _error(lambda: decode_body(3, 12, REQ, TOO_LONG + b"\x00\x00\x00"))
    assert "varint" in str(exc)


@pytest.mark.parametrize(("kind", "body"), [
    # non-flexible string length 100, 3 bytes there
    ((3, 0, REQ), b"\x00\x00\x00\x01\x00\x64abc"),
    # non-flexible negative string length other than -1
    ((3, 0, REQ), b"\x00\x00\x00\x01\xff\xfeabc"),
    # non-flexible array count 2, one element
    ((3, 0, REQ), b"\x00\x00\x00\x02\x00\x01a"),
    # compact string length 100 (101 on the wire), 3 bytes there
    ((18, 3, REQ), b"\x65abc"),
    # records length past the end (Produce v3: txn id null, acks, timeout, 1 topic "t",
    # 1 partition 0, records of 1000 bytes with 2 present)
    ((0, 3, REQ), b"\xff\xff\x00\x01\x00\x00\x00\x01\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01"
                  b"\x00\x00\x00\x00\x00\x00\x03\xe8ab"),
    # bytes length past the end (SaslAuthenticate v0 request auth_bytes)
    ((36, 0, REQ), b"\x00\x00\x00\x10abc"),
    # tagged field size past the end (ApiVersions v3 request, one tag of 50 bytes)
    ((18, 3, REQ), b"\x01\x01\x01\x07\x32abc"),
    # uuid cut short (Metadata v12 request, one topic)
    ((3, 12, REQ), b"\x02\x00\x00\x00\x00"),
    # nullable struct marker, then nothing (ConsumerGroupHeartbeat v0 response assignment)
    ((68, 0, RESP), bytes(16) + b"\x01"),
    # trailing bytes after a whole body
    ((3, 0, REQ), b"\x00\x00\x00\x00\x00"),
], ids=["string", "negative-length", "array", "compact-string", "records", "bytes", "tag-size", "uuid",
        "nullable-struct", "trailing"])
def test_lengths_past_the_end(kind: Kind, body: bytes) -> None:
    for fn in (lambda: decode_body(*kind, body), lambda: scan_body(*kind, body)):
        exc = _error(fn)
        assert isinstance(exc, DecodeError)
        assert exc.offset is not None and 0 <= exc.offset <= len(body)


def test_invalid_utf8() -> None:
    # Metadata v0 request: one topic whose name is not UTF-8.
    body = b"\x00\x00\x00\x01\x00\x02\xc3\x28"
    exc = _error(lambda: decode_body(3, 0, REQ, body))
    assert isinstance(exc, DecodeError)
    assert "UTF-8" in str(exc)
    assert exc.field is not None and "name" in exc.field
    assert exc.offset is not None and 0 <= exc.offset <= len(body)
    # scan_body decodes topic names, so it refuses them too.
    assert isinstance(_error(lambda: scan_body(3, 0, REQ, body)), DecodeError)
    # Flexible: ApiVersions v3 request software name.
    assert isinstance(_error(lambda: decode_body(18, 3, REQ, b"\x03\xff\xfe\x01\x00")), DecodeError)
    # Lone surrogate encoded as UTF-8 (CESU style): not valid UTF-8 either.
    assert isinstance(_error(lambda: decode_body(18, 3, REQ, b"\x04\xed\xa0\x80\x01\x00")), DecodeError)
    # A request header's client id.
    payload = b"\x00\x03\x00\x00\x00\x00\x00\x01\x00\x02\xc3\x28\xff\xff\xff\xff"
    exc = _error(lambda: decode_request(payload))
    assert isinstance(exc, DecodeError)
    assert exc.field == "client_id"


# =====================================================================================
# Huge counts with little data
# =====================================================================================

HUGE_NON_FLEXIBLE = b"\x7f\xff\xff\xff"
HUGE_COMPACT = b"\xff\xff\xff\xff\x0f"  # 2**32 - 1, i.e. a count of 2**32 - 2

# (kind, body, whether the huge count sits inside a tagged field: scan_body skips tagged
# fields by their size without reading them, so only decode_body sees those counts)
HUGE_CASES: list[tuple[Kind, bytes, bool]] = [
    # struct arrays
    ((3, 0, REQ), HUGE_NON_FLEXIBLE + b"\x00\x01a", False),
    ((3, 12, REQ), HUGE_COMPACT + b"\x00" * 20, False),
    # int32 arrays (Metadata v0 response: 0 brokers, 1 topic, 1 partition, replica_nodes)
    ((3, 0, RESP), b"\x00\x00\x00\x00" + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x01t" + b"\x00\x00\x00\x01"
                   + b"\x00\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x01" + HUGE_NON_FLEXIBLE + b"\x00" * 8,
     False),
    # string arrays (DeleteTopics v4 request topic_names)
    ((20, 4, REQ), HUGE_COMPACT + b"\x02a" * 4, False),
    # uuid arrays: BrokerHeartbeat v1 request's tagged offline_log_dirs, a tag holding a
    # huge compact count
    ((63, 1, REQ), b"\x00" * 4 + b"\x00" * 8 + b"\x00" * 8 + b"\x00\x00" + b"\x01\x00\x05" + HUGE_COMPACT, True),
    # tag-section count
    ((18, 3, REQ), b"\x01\x01" + HUGE_COMPACT + b"\x00\x00", False),
    # records-length and bytes-length (non-flexible int32 lengths)
    ((36, 0, REQ), HUGE_NON_FLEXIBLE + b"abc", False),
]


@pytest.mark.parametrize(("kind", "body", "in_tag"), HUGE_CASES, ids=[_kind_id(k) for k, _, _ in HUGE_CASES])
def test_huge_counts_fail_fast_and_small(kind: Kind, body: bytes, in_tag: bool) -> None:
    the_codec = codec(*kind)
    assert the_codec is not None
    calls = {
        "decode": lambda: decode_body(*kind, body),
        "scan": lambda: scan_body(*kind, body),
        "splice": lambda: splice_body(*kind, body, {the_codec.schema.fields[-1].name: lambda v: v}),
    }
    for name, fn in calls.items():
        outcome: list[Any] = []
        tracemalloc.start()
        started = time.perf_counter()
        try:
            outcome.append(fn())
        except BaseException as exc:  # inspected below
            outcome.append(exc)
        finally:
            elapsed = time.perf_counter() - started
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert elapsed < 1.0, (name, elapsed)
        assert peak < 10_000_000, (name, peak)
        result = outcome[0]
        if isinstance(result, BaseException):
            assert isinstance(result, DecodeError), (name, result)
            continue
        # Only these may succeed: scan over a tagged field it skips by size, and a
        # splice that copies the bytes after its last edited field untouched.
        assert name == "splice" or (name == "scan" and in_tag), f"{name} accepted a huge count"
        if name == "splice":
            assert result[0] is None or result[0] == body


# =====================================================================================
# Unknown api keys and versions
# =====================================================================================


@pytest.mark.parametrize(("api_key", "version"), [(999, 0), (-1, 0), (3, 999), (18, 32767), (32767, 5)])
def test_unknown_apis(api_key: int, version: int) -> None:
    payload = (api_key.to_bytes(2, "big", signed=True) + version.to_bytes(2, "big") + (41).to_bytes(4, "big")
               + b"\x00\x01x" + b"\x00\x01\x02\x03")
    assert peek_request(payload) == (api_key, version, 41)
    exc = _error(lambda: decode_request(payload))
    assert isinstance(exc, UnknownApiError)
    assert isinstance(exc, DecodeError)
    assert (exc.api_key, exc.api_version) == (api_key, version)
    assert codec(api_key, version, REQ) is None
    for fn in (lambda: decode_body(api_key, version, REQ, b"\x00"),
               lambda: encode_body(api_key, version, RESP, {}),
               lambda: scan_body(api_key, version, RESP, b"\x00"),
               lambda: splice_body(api_key, version, REQ, b"\x00", {"x": lambda v: v}),
               lambda: decode_response(b"\x00\x00\x00\x29\x00", api_key, version)):
        assert isinstance(_error(fn), UnknownApiError)


def test_peek_request_on_short_frames() -> None:
    for n in range(8):
        exc = _error(peek_request, b"\x00" * n)
        assert isinstance(exc, DecodeError)


# =====================================================================================
# Fuzz
# =====================================================================================

# Raise for a deeper, random run: KPROXY_CODEC_FUZZ_EXAMPLES=20000 pytest tests/test_codec_malformed.py
FUZZ_EXAMPLES = int(os.environ.get("KPROXY_CODEC_FUZZ_EXAMPLES", "600"))
FUZZ_SETTINGS = settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
                         derandomize="KPROXY_CODEC_FUZZ_EXAMPLES" not in os.environ,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _check_everything(kind: Kind, data: bytes, edit_field: str) -> None:
    """decode, scan and splice either succeed or raise a ProtocolError; decodable implies the rest.

    (MessageCodec.skip is left out here: see test_skip_on_truncated_bodies_raises_protocol_error.)
    """
    the_codec = codec(*kind)
    assert the_codec is not None
    decoded: Any = None
    try:
        decoded = decode_body(*kind, data)
    except ProtocolError as exc:
        assert exc.offset is None or 0 <= exc.offset <= len(data)
    scanned = splice_ok = True
    try:
        scan_body(*kind, data)
    except ProtocolError:
        scanned = False
    try:
        splice_body(*kind, data, {edit_field: lambda v: v})
    except ProtocolError:
        splice_ok = False
    if decoded is not None:
        assert scanned and splice_ok
        assert the_codec.skip(data, 0) == len(data)
        # messages.py's contract, on whatever decodes: the exact bytes back.
        assert encode_body(*kind, decoded) == data
        # A splice that changes nothing gives back the input (None: the field is a tagged
        # one not on the wire, so there was nothing to splice).
        out, _ = splice_body(*kind, data, {edit_field: lambda v: v})
        assert out == data or (out is None and edit_field not in decoded), (out, edit_field)


@st.composite
def kind_and_field(draw: st.DrawFn) -> tuple[Kind, str]:
    kind = draw(st.sampled_from(KINDS))
    schema = message_schema(*kind)
    assert schema is not None
    names = [f.name for f in schema.fields] or ["absent"]
    return kind, draw(st.sampled_from(names))


@FUZZ_SETTINGS
@given(target=kind_and_field(), data=st.binary(max_size=80))
def test_fuzz_random_bytes(target: tuple[Kind, str], data: bytes) -> None:
    kind, field = target
    _check_everything(kind, data, field)


@st.composite
def mutated_body(draw: st.DrawFn) -> tuple[Kind, str, bytes]:
    kind, field = draw(kind_and_field())
    raw = bytearray(encode_body(*kind, rich_body(kind)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["set", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(len(raw) - 1, 0)))
        if op == "set" and raw:
            raw[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF, draw(st.integers(0, 255))]))
        elif op == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=6))
        elif op == "delete" and raw:
            del raw[at:at + draw(st.integers(1, 4))]
        elif op == "truncate":
            del raw[at:]
    return kind, field, bytes(raw)


@FUZZ_SETTINGS
@given(case=mutated_body())
def test_fuzz_mutated_valid_bodies(case: tuple[Kind, str, bytes]) -> None:
    kind, field, data = case
    _check_everything(kind, data, field)


def test_rich_bodies_are_valid() -> None:
    """The fuzz seeds themselves round-trip (so mutations start from real messages)."""
    for kind in KINDS:
        raw = encode_body(*kind, rich_body(kind))
        assert encode_body(*kind, decode_body(*kind, raw)) == raw


# =====================================================================================
# The round-trip contract on decodable, non-canonical bytes
# =====================================================================================
# messages.py promises encode_body(decode_body(data)) == data "for every byte string
# that decodes". A codec keeps it either by re-encoding exactly or by refusing bytes it
# could not reproduce. The first group is bytes Kafka's own writers never produce:
# kproxy refuses each (a decoder that starts accepting one must then re-encode it exactly;
# this test says which way it went). The second group decodes, each with something an
# encoder could easily normalise away, and must come back byte for byte.

REFUSED: dict[str, tuple[Kind, bytes]] = {
    # Metadata v4 request: null topics, allow_auto_topic_creation = 0x02 (true, not 0x01)
    "bool-byte-2": ((3, 4, REQ), b"\xff\xff\xff\xff\x02"),
    # ApiVersions v3 request: software name length as a 2-byte varint (0x81 0x00 = 1 -> "")
    "non-minimal-varint-length": ((18, 3, REQ), b"\x81\x00\x01\x00"),
    # ApiVersions v3 request: unknown tags 9 then 8 (out of order on the wire)
    "tags-out-of-order": ((18, 3, REQ), b"\x01\x01\x02\x09\x01a\x08\x01b"),
    # ApiVersions v3 request: unknown tag 9 twice, different values
    "duplicate-unknown-tag": ((18, 3, REQ), b"\x01\x01\x02\x09\x01a\x09\x01b"),
    # ConsumerGroupHeartbeat v0 response: throttle, error code, null error message, null
    # member id, epoch, interval, then the nullable struct 'assignment' with presence
    # marker 0x00 (not 0x01), no topic partitions, empty tag sections.
    "nullable-struct-marker-0": ((68, 0, RESP), bytes(16) + b"\x00\x01\x00\x00"),
    # ApiVersions v3 response (error 0, no api keys, throttle 0): tag 3 (zk_migration_ready,
    # a bool) announced as 2 bytes, the bool and a stray byte after it
    "known-tag-longer-than-its-value": ((18, 3, RESP), b"\x00\x00\x01\x00\x00\x00\x00\x01\x03\x02\x01\x00"),
}

_API_VERSIONS_V3_RESPONSE_HEAD = b"\x00\x00\x01\x00\x00\x00\x00"  # error 0, no api keys, throttle 0


def _alter_client_quotas_v1(value_bits: int) -> bytes:
    """AlterClientQuotas v1 request: one entry (entity type "u", null name), one op ("k",
    the float64 with these bits, remove false), validate_only false."""
    return (b"\x02\x02\x02u\x00\x00\x02\x02k" + value_bits.to_bytes(8, "big")
            + b"\x00\x00\x00\x00\x00")


DECODABLE: dict[str, tuple[Kind, bytes]] = {
    # ApiVersions v3 request: unknown tags 8 and 9, in order, one of them empty
    "unknown-tags-in-order": ((18, 3, REQ), b"\x01\x01\x02\x08\x00\x09\x01a"),
    # ... and the largest tag number (2**32 - 1, a 5-byte varint)
    "largest-unknown-tag": ((18, 3, REQ), b"\x01\x01\x01\xff\xff\xff\xff\x0f\x00"),
    # ApiVersions v3 response: every known tag on the wire at its default value
    # (supported_features [], finalized_features_epoch -1, finalized_features [],
    # zk_migration_ready false); an encoder that leaves defaults out would drop them
    "known-tags-at-their-defaults": ((18, 3, RESP), _API_VERSIONS_V3_RESPONSE_HEAD + b"\x04"
                                     b"\x00\x01\x01" + b"\x01\x08" + b"\xff" * 8 + b"\x02\x01\x01" + b"\x03\x01\x00"),
    # Fetch v16 response: no partitions, node_endpoints (tag 0) present and empty
    "empty-node-endpoints-tag": ((1, 16, RESP), bytes(10) + b"\x01" + b"\x01\x00\x01\x01"),
    # ConsumerGroupHeartbeat v0 response: null error message and member id, null assignment
    "null-nullable-struct": ((68, 0, RESP), bytes(16) + b"\xff\x00"),
    # float64 values whose bits a float round trip could change
    "float-negative-zero": ((49, 1, REQ), _alter_client_quotas_v1(0x8000_0000_0000_0000)),
    "float-nan-with-payload": ((49, 1, REQ), _alter_client_quotas_v1(0x7FF8_0000_0000_0123)),
    "float-signalling-nan": ((49, 1, REQ), _alter_client_quotas_v1(0x7FF0_0000_0000_0001)),
    "float-negative-nan": ((49, 1, REQ), _alter_client_quotas_v1(0xFFF8_0000_0000_0000)),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_non_canonical_bytes_are_refused(case: str) -> None:
    kind, data = REFUSED[case]
    exc = _error(decode_body, *kind, data)
    assert isinstance(exc, DecodeError)
    assert exc.offset is not None and 0 <= exc.offset <= len(data)


@pytest.mark.parametrize("case", sorted(DECODABLE))
def test_decodable_bytes_reencode_exactly(case: str) -> None:
    kind, data = DECODABLE[case]
    body = decode_body(*kind, data)  # these decode: a DecodeError fails the test
    assert encode_body(*kind, body) == data
    assert codec(*kind).skip(data, 0) == len(data)  # type: ignore[union-attr]
    for name in body:
        if name != "_unknown_tags":
            out, _ = splice_body(*kind, data, {name: lambda v: v})
            assert out == data, name


# =====================================================================================
# splice_body with edits that return values the schema cannot hold
# =====================================================================================


@pytest.mark.parametrize(("field", "value"), [
    ("brokers", 5),                      # not a list: TypeError escapes today
    ("brokers", [{"node_id": 1}]),       # struct missing fields: KeyError escapes today
    ("throttle_time_ms", 2**40),         # out of int32 range: reported as a DecodeError today
], ids=["not-a-list", "missing-fields", "out-of-range"])
def test_splice_with_unencodable_edit_raises_encode_error(field: str, value: Any) -> None:
    """The body is fine, the edit's value is not: that is an EncodeError (errors.py:
    "values handed to an encoder do not fit the schema"), never a bare TypeError or
    KeyError, nor a DecodeError blaming the body."""
    from kproxy.protocol import EncodeError, default_body

    raw = encode_body(3, 12, RESP, default_body(3, 12, RESP))
    exc = _error(splice_body, 3, 12, RESP, raw, {field: lambda _: value})
    assert isinstance(exc, EncodeError), repr(exc)
