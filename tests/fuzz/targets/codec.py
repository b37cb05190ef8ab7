"""Fuzz targets of the codec: framing, headers, message bodies, scanners, splice, records.

Besides the contract every target keeps (tests/fuzz/targets/registry.py): a decoder that
accepts ``x`` must give back ``x`` when re-encoding what it decoded (the byte-exact round
trip that makes a proxy safe, kproxy/protocol/messages.py).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from typing import Any

from kproxy.protocol.errors import ProtocolError
from tests.fuzz.targets.registry import target

_KIND = struct.Struct(">H")


# -- message kinds: the first two bytes of an input pick one of the tables' (api, version, direction) ----
def _kinds() -> list[tuple[int, int, Any]]:
    from kproxy.protocol.message_schemas import all_message_kinds

    return all_message_kinds()


_KIND_CACHE: list[tuple[int, int, Any]] = []


def kind_of(data: bytes) -> tuple[tuple[int, int, Any], bytes]:
    """(api key, version, direction) chosen by ``data[:2]``, and the rest of ``data``."""
    if not _KIND_CACHE:
        _KIND_CACHE.extend(_kinds())
    if len(data) < 2:
        return _KIND_CACHE[0], b""
    (n,) = _KIND.unpack_from(data, 0)
    return _KIND_CACHE[n % len(_KIND_CACHE)], data[2:]


def sample_values() -> dict[str, Any]:
    """Non-default values for fields common across APIs, so seeds have populated arrays."""
    from kproxy.protocol.records import Record, encode_batch_v2

    batch = encode_batch_v2([Record(0, 1_700_000_000_000, b"k", b"v", [("h", b"1")])])
    partition = {"partition_index": 0, "index": 0, "partition": 0, "error_code": 6, "records": batch,
                 "high_watermark": 5, "partitions": [0, 1]}
    topic = {"name": "orders", "topic": "orders", "partitions": [partition],
             "partition_indexes": [0, 1], "partition_data": [partition]}
    return {"topics": [topic], "responses": [topic], "topic_data": [topic],
            "brokers": [{"node_id": 1, "host": "b1.internal", "port": 9092, "rack": "r"}],
            "coordinators": [{"key": "g", "node_id": 1, "host": "b1.internal", "port": 9092}],
            "host": "b1.internal", "port": 9092, "node_id": 1, "error_code": 0, "group_id": "g",
            "client_id": "c", "member_id": "m", "transactional_id": None, "acks": -1,
            "api_keys": [{"api_key": 3, "min_version": 0, "max_version": 12}],
            "mechanism": "PLAIN", "auth_bytes": b"\x00u\x00p"}


def message_seeds(kinds: list[tuple[int, int, Any]] | None = None) -> Iterator[tuple[tuple[int, int, Any], bytes]]:
    """A populated and a default body of each kind (populated where the shape allows it)."""
    from kproxy.protocol.frame_builder import body_of
    from kproxy.protocol.messages import default_body, encode_body

    values = sample_values()
    for kind in kinds if kinds is not None else _kinds():
        yield kind, encode_body(*kind, default_body(*kind))
        populated = None
        # A shared field name with another meaning in this kind: the default body is seed enough.
        with contextlib.suppress(ProtocolError, TypeError, AttributeError, KeyError):
            populated = encode_body(*kind, body_of(*kind, **values))
        if populated is not None:
            yield kind, populated


def _selected_message_seeds() -> Iterator[bytes]:
    kinds = _kinds()
    index = {kind: i for i, kind in enumerate(kinds)}
    for kind, body in message_seeds():
        yield _KIND.pack(index[kind]) + body


# -- frame splitter ------------------------------------------------------------------------------
def _framing_seeds() -> Iterator[bytes]:
    from kproxy.protocol.framing import frame

    yield b"\x03" + frame(b"abc") + frame(b"") + frame(b"x" * 40)
    yield b"\x10" + frame(b"y" * 300) + b"\x00\x00"
    yield b"\x01" + b"\x7f\xff\xff\xff"
    yield b"\x02" + b"\xff\xff\xff\xfe"


FUZZ_MAX_FRAME = 4096


@target(_framing_seeds)
def fuzz_framing(data: bytes) -> None:
    """FrameSplitter: the hot path (split) agrees with the reference path (next_raw) on any chunking."""
    from kproxy.protocol.errors import FrameSizeError
    from kproxy.protocol.framing import FrameSplitter

    if not data:
        return
    step = data[0] or 1
    stream = data[1:]
    fast, slow = FrameSplitter(FUZZ_MAX_FRAME), FrameSplitter(FUZZ_MAX_FRAME)
    fast_frames: list[bytes] = []
    slow_frames: list[bytes] = []
    fast_error = slow_error = False
    for i in range(0, len(stream), step):
        chunk = stream[i : i + step]
        if not fast_error:
            try:
                frames, whole, exact = fast.split(bytearray(chunk) if i % 2 else chunk)
                assert whole == chunk
                if exact:
                    assert b"".join(frames) == chunk, "split() said exact but the frames are not the chunk"
                fast_frames.extend(bytes(f) for f in frames)
            except FrameSizeError:
                fast_error = True
        if not slow_error:
            slow.feed(chunk)
            try:
                slow_frames.extend(slow.raw_frames())
            except FrameSizeError:
                slow_error = True
        assert fast.buffered <= len(stream), "the splitter holds more than it was given"
    assert fast_error == slow_error, "split() and next_raw() disagree on the frame size check"
    assert fast_frames == slow_frames, "split() and next_raw() cut the stream differently"
    assert stream.startswith(b"".join(fast_frames)), "frames are not the stream's prefix"
    if not fast_error:
        assert fast.consumed == len(b"".join(fast_frames))


# -- headers --------------------------------------------------------------------------------------
def _header_seeds() -> Iterator[bytes]:
    from kproxy.protocol.headers import RequestHeader, encode_request_header

    yield b"\x00" + encode_request_header(RequestHeader(3, 12, 7, "client", 2, {1: b"x"}))
    yield b"\x00" + encode_request_header(RequestHeader(0, 3, 8, None, 1))
    yield b"\x01" + struct.pack(">hhi", 3, 12, 7) + struct.pack(">i", 9) + b"\x01\x02\x01z"
    yield b"\x01" + struct.pack(">hhi", 18, 3, 7) + struct.pack(">i", 9)


@target(_header_seeds)
def fuzz_headers(data: bytes) -> None:
    """Request and response header decoders: only DecodeError escapes; decode-encode is byte-exact."""
    from kproxy.protocol.headers import (
        decode_request_header,
        decode_response_header,
        encode_request_header,
        encode_response_header,
        peek_correlation_id,
        peek_request,
        request_body_offset,
    )

    if not data:
        return
    rest = data[1:]
    if data[0] & 1 == 0:
        try:
            header = decode_request_header(rest)
        except ProtocolError:
            header = None
        if header is not None:
            assert encode_request_header(header) == rest[: header.size], "request header round trip"
            assert peek_request(rest) == header[:3]
            offset = request_body_offset(struct.pack(">i", len(rest)) + rest, header.api_key, header.api_version)
            assert offset == header.size + 4, "request_body_offset disagrees with decode_request_header"
        return
    if len(rest) < 4:
        return
    api_key, api_version = struct.unpack_from(">hh", rest, 0)
    payload = rest[4:]
    try:
        response = decode_response_header(payload, api_key, api_version)
    except ProtocolError:
        return
    assert encode_response_header(response) == payload[: response.size], "response header round trip"
    assert peek_correlation_id(payload) == response.correlation_id


# -- message bodies --------------------------------------------------------------------------------
@target(_selected_message_seeds)
def fuzz_messages(data: bytes) -> None:
    """Every message decoder (all (api, version, direction) kinds): errors are DecodeError; round trips exact."""
    from kproxy.protocol.messages import decode_body, encode_body

    kind, body = kind_of(data)
    try:
        value = decode_body(*kind, body)
    except ProtocolError:
        return
    assert encode_body(*kind, value) == body, f"round trip of {kind} changed the bytes"


@target(_selected_message_seeds)
def fuzz_scan(data: bytes) -> None:
    """Partial scanners: never a non-ProtocolError; a body the full decoder accepts always scans (in values
    mode too, where it reports what the plain scan does)."""
    from kproxy.protocol.messages import decode_body
    from kproxy.protocol.scan import scan_body

    kind, body = kind_of(data)
    try:
        decode_body(*kind, body)
        decodes = True
    except ProtocolError:
        decodes = False
    for errors_only, values in ((False, False), (True, False), (False, True), (True, True)):
        try:
            found = scan_body(*kind, body, errors_only=errors_only, values=values)
        except ProtocolError:
            assert not decodes, f"scan of {kind} ({errors_only=}, {values=}) refused a body that decodes"
            continue
        if values:  # the values mode (consumer lag's reads) reports what the plain walk does, and its reads
            plain = scan_body(*kind, body, errors_only=errors_only)
            assert (list(found.entries), found.records) == (plain.entries, plain.records)
            assert all(len(item) in (3, 4) for item in found.values)
        for start, end in found.records:
            assert 0 <= start <= end <= len(body)
        with contextlib.suppress(ProtocolError):
            found.record_count()


@target(_selected_message_seeds)
def fuzz_splice(data: bytes) -> None:
    """splice_body: identity edits of every top-level field give back the body's own bytes."""
    from kproxy.protocol.messages import decode_body, require_codec
    from kproxy.protocol.splice import splice_body

    kind, body = kind_of(data)
    names = [f.name for f in require_codec(*kind).schema.fields]
    if not names:
        return
    pick = names[len(body) % len(names)]
    for edits in ({pick: lambda v: v}, dict.fromkeys(names, lambda v: v)):
        try:
            out, _ = splice_body(*kind, body, edits)
        except ProtocolError:
            continue
        if out is not None:
            try:
                decode_body(*kind, body)
            except ProtocolError:
                continue  # splice reads only what it edits: trailing garbage elsewhere is not its to find
            assert out == body, f"identity splice of {kind} ({sorted(edits)}) changed the bytes"


# -- records ----------------------------------------------------------------------------------------
def _record_seeds() -> Iterator[bytes]:
    from kproxy.protocol.compression import Codec
    from kproxy.protocol.records import Record, encode_batch_v2, encode_message_set

    records = [Record(10 + i, 1_700_000_000_000 + i, b"k%d" % i, b"v" * i, [("h", b"x")]) for i in range(3)]
    legacy = [Record(10 + i, 1_700_000_000_000 + i, b"k", b"v%d" % i) for i in range(3)]
    for codec in Codec:
        yield encode_batch_v2(records, base_offset=10, codec=codec)
        if codec != Codec.ZSTD:  # legacy messages predate zstd (KIP-110 ties it to magic 2)
            yield encode_message_set(legacy, magic=1, codec=codec)
    yield encode_message_set([Record(r.offset, -1, r.key, r.value) for r in legacy], magic=0, codec=Codec.GZIP)
    yield encode_batch_v2(records, base_offset=10) + encode_message_set(legacy, magic=1)[:-5]


@target(_record_seeds)
def fuzz_records(data: bytes) -> None:
    """Record decoders (v2 batches, legacy message sets, compressed wrappers): only CorruptRecordsError."""
    from kproxy.protocol.records import count_records, decode_records, iter_batches

    budget = 1 << 20  # decompression is capped: memory per input stays bounded
    with contextlib.suppress(ProtocolError):
        count_records(data, max_decompressed=budget)
    try:
        batches = list(iter_batches(data))
    except ProtocolError:
        return
    for batch in batches:
        assert 0 <= batch.offset < batch.end <= len(data)
        try:
            checked = decode_records(batch, max_decompressed=budget, check_crc=True)
        except ProtocolError:
            checked = None
        try:
            unchecked = decode_records(batch, max_decompressed=budget, check_crc=False)
        except ProtocolError:
            assert checked is None, "records that decode with their CRC checked fail without the check"
            continue
        if checked is not None:
            assert checked == unchecked, "checking the CRC changed the records read"
