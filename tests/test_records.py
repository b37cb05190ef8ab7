"""Tests for kproxy.protocol.records and kproxy.protocol.compression.

Cross-checks use kafka-python's own record builders and reader as the
independent implementation; kafka-python only ships gzip, so for snappy, lz4
and zstd its codec hooks are pointed at cramjam directly (kafka-python's own
xerial and old-LZ4 framing code still runs).
"""

from __future__ import annotations

import gzip
import struct
import time
import tracemalloc
import zlib
from types import SimpleNamespace
from typing import Any

import cramjam
import kafka.codec  # type: ignore[import-untyped]
import kafka.record.default_records as kdefault  # type: ignore[import-untyped]
import kafka.record.legacy_records as klegacy  # type: ignore[import-untyped]
import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from kproxy.protocol.compression import CODEC_NAMES, Codec, codec_name, compress, decompress, xxh32
from kproxy.protocol.errors import CorruptRecordsError, DecodeError, EncodeError, ProtocolError
from kproxy.protocol.records import (
    V2_HEADER_SIZE,
    BatchInfo,
    Record,
    TimestampType,
    compute_crc,
    count_records,
    decode_all,
    decode_records,
    encode_batch_v2,
    encode_message_set,
    iter_batches,
    v2_producer_head,
    verify_crc,
)

ALL_CODECS = [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]
LEGACY_CODECS = [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4]

# The Produce v0 example of the classic Kafka protocol guide ("A Guide To The
# Kafka Protocol"): one message, offset 0, message size 25, crc 0x73ACF77C,
# magic 0, attributes 0, null key, value "hello world".
GOLDEN_V0 = bytes.fromhex(
    "0000000000000000"  # offset
    "00000019"  # message size 25
    "73ACF77C"  # crc
    "00"  # magic
    "00"  # attributes
    "FFFFFFFF"  # key: null
    "0000000B"  # value length 11
    "68656C6C6F20776F726C64"  # "hello world"
)


def sample_records(n: int = 20, *, base: int = 0, ts: int = 1_700_000_000_000) -> list[Record]:
    return [
        Record(
            offset=base + i,
            timestamp=ts + 3 * i,
            key=None if i % 3 == 0 else f"key-{i}".encode(),
            value=None if i % 7 == 3 else (f"value-{i}-" * (i % 5 + 1)).encode(),
            headers=[] if i % 2 else [("trace", f"t{i}".encode()), ("null", None), ("ünï", b"")],
        )
        for i in range(n)
    ]


def only_batch(data: bytes | bytearray) -> BatchInfo:
    it = iter_batches(data)
    batches = list(it)
    assert it.truncated_tail == 0
    assert len(batches) == 1
    return batches[0]


def with_size(entry: bytes, size: int) -> bytes:
    """``entry`` with its size field replaced (so a truncated entry looks complete)."""
    return entry[:8] + struct.pack(">i", size) + entry[12:]


def reframe_v2(
    batch: bytes, payload: bytes, *, count: int | None = None, attributes: int | None = None
) -> bytes:
    """A v2 batch with the header of ``batch`` but another records section, lengths and CRC fixed."""
    header = bytearray(batch[:V2_HEADER_SIZE])
    struct.pack_into(">i", header, 8, V2_HEADER_SIZE - 12 + len(payload))
    if count is not None:
        struct.pack_into(">i", header, V2_HEADER_SIZE - 4, count)
    if attributes is not None:
        struct.pack_into(">h", header, 21, attributes)
    out = header + payload
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


def raw_record(body: bytes) -> bytes:
    """Length-prefix a v2 record body (length < 64, so a one-byte zig-zag varint)."""
    assert len(body) < 64
    return bytes([len(body) << 1]) + body


# --------------------------------------------------------------------- golden


def test_golden_produce_v0_message_decodes_and_reencodes() -> None:
    batch = only_batch(GOLDEN_V0)
    assert (batch.offset, batch.length, batch.magic, batch.attributes) == (0, 37, 0, 0)
    assert batch.crc == 0x73ACF77C
    assert batch.codec == Codec.NONE and batch.record_count == 1
    assert batch.timestamp_type == TimestampType.NO_TIMESTAMP_TYPE
    verify_crc(batch)
    records = decode_records(batch)
    assert records == [Record(offset=0, timestamp=-1, key=None, value=b"hello world", headers=[])]
    assert encode_message_set(records, magic=0) == GOLDEN_V0
    assert count_records(GOLDEN_V0) == 1


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: codec_name(c))
def test_v2_round_trip_every_codec(codec: int) -> None:
    records = sample_records(300, base=1000)
    data = encode_batch_v2(
        records,
        base_offset=1000,
        codec=codec,
        producer_id=4242,
        producer_epoch=7,
        base_sequence=99,
        is_transactional=True,
        partition_leader_epoch=12,
    )
    batch = only_batch(data)
    assert batch.magic == 2 and batch.codec == codec and batch.codec_name == CODEC_NAMES[codec]
    assert batch.record_count == 300 and batch.base_offset == 1000 and batch.last_offset == 1299
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (4242, 7, 99)
    assert batch.partition_leader_epoch == 12
    assert batch.is_transactional and not batch.is_control and not batch.has_delete_horizon
    assert batch.timestamp_type == TimestampType.CREATE_TIME
    assert batch.base_timestamp == records[0].timestamp
    assert batch.max_timestamp == max(r.timestamp for r in records)
    assert batch.raw == data and batch.end == len(data)
    verify_crc(batch)
    assert decode_records(batch) == records
    assert count_records(data) == 300


def test_v2_edge_values() -> None:
    records = [
        Record(5, -5, None, None, []),
        Record(6, 2**62, b"", b"", [("", None), ("k", b"")]),
        Record(2**31 + 4, -(2**62), b"\x00" * 300, b"\xff" * 20000, [("h" * 200, b"v" * 200)]),
    ]
    data = encode_batch_v2(records, base_offset=5, base_timestamp=0)
    assert decode_all(data) == records
    # A batch with no records (log compaction leaves those behind) is valid too.
    empty = encode_batch_v2([], base_offset=77)
    assert only_batch(empty).record_count == 0
    assert decode_all(empty) == [] and count_records(empty) == 0


def test_v2_flags_and_log_append_time() -> None:
    records = sample_records(3)
    data = encode_batch_v2(
        records,
        is_control=True,
        has_delete_horizon=True,
        timestamp_type=TimestampType.LOG_APPEND_TIME,
        max_timestamp=123456,
    )
    batch = only_batch(data)
    assert batch.is_control and batch.has_delete_horizon and not batch.is_transactional
    assert batch.timestamp_type == TimestampType.LOG_APPEND_TIME
    # With LOG_APPEND_TIME every record carries the batch's (broker's) timestamp.
    assert [r.timestamp for r in decode_records(batch)] == [123456] * 3


def test_decoders_accept_bytearray_and_memoryview() -> None:
    records = sample_records(10)
    data = encode_batch_v2(records, codec=Codec.LZ4) + encode_message_set([Record(50, 1, b"k", b"v")], 1, 1)
    for wrapped in (bytearray(data), memoryview(data)):
        assert decode_all(wrapped) == [*records, Record(50, 1, b"k", b"v")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(1, 1000),  # offset gap
            st.integers(-(2**40), 2**40),  # timestamp
            st.none() | st.binary(max_size=40),
            st.none() | st.binary(max_size=200),
            st.lists(st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=10)), max_size=3),
        ),
        max_size=25,
    ),
    st.sampled_from(ALL_CODECS),
    st.integers(0, 2**40),
)
def test_v2_round_trip_property(rows: list[Any], codec: int, base_offset: int) -> None:
    records, offset = [], base_offset
    for gap, ts, key, value, headers in rows:
        records.append(Record(offset, ts, key, value, list(headers)))
        offset += gap
    data = encode_batch_v2(records, base_offset=base_offset, codec=codec)
    assert decode_all(data) == records
    assert count_records(data) == len(records)


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", LEGACY_CODECS, ids=lambda c: codec_name(c))
def test_legacy_round_trip(magic: int, codec: int) -> None:
    records = [
        Record(100 + 2 * i, (5000 + i) if magic == 1 else -1, None if i % 2 else b"k%d" % i, b"v" * i or None)
        for i in range(12)
    ]
    data = encode_message_set(records, magic, codec)
    batches = list(iter_batches(data))
    if codec == Codec.NONE:
        assert [b.record_count for b in batches] == [1] * 12
        assert [b.base_offset for b in batches] == [r.offset for r in records]
    else:
        # One wrapper at the last offset; its count is unknown without decompression.
        assert len(batches) == 1 and batches[0].record_count is None
        assert batches[0].last_offset == records[-1].offset and batches[0].codec == codec
    for b in batches:
        verify_crc(b)
    assert decode_all(data) == records
    assert count_records(data) == 12


def test_legacy_v1_log_append_time_wrapper() -> None:
    records = [Record(i, 10 + i, None, b"x") for i in range(4)]
    data = encode_message_set(records, 1, Codec.GZIP, timestamp_type=TimestampType.LOG_APPEND_TIME)
    batch = only_batch(data)
    assert batch.timestamp_type == TimestampType.LOG_APPEND_TIME and batch.base_timestamp == 13
    assert [r.timestamp for r in decode_records(batch)] == [13] * 4


def test_mixed_magics_in_one_records_field() -> None:
    parts = [
        encode_message_set([Record(0, -1, None, b"a")], 0),
        encode_message_set([Record(1, 5, None, b"b"), Record(2, 6, None, b"c")], 1, Codec.SNAPPY),
        encode_batch_v2(sample_records(5, base=3), base_offset=3, codec=Codec.ZSTD),
        encode_message_set([Record(8, 9, b"k", b"d")], 1),
    ]
    data = b"".join(parts)
    batches = list(iter_batches(data))
    assert [b.magic for b in batches] == [0, 1, 2, 1]
    assert [b.offset for b in batches] == [sum(map(len, parts[:i])) for i in range(4)]
    assert [r.offset for r in decode_all(data)] == list(range(9))
    assert count_records(data) == 9


# ------------------------------------------------------------- kafka-python


@pytest.fixture
def kafka_codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give kafka-python snappy, lz4 and zstd through cramjam (it ships gzip only)."""
    fake_snappy = SimpleNamespace(
        compress=lambda b: bytes(cramjam.snappy.compress_raw(bytes(b))),
        decompress=lambda b: bytes(cramjam.snappy.decompress_raw(bytes(b))),
    )

    def lz4_encode(payload: bytes) -> bytes:
        c = cramjam.lz4.Compressor(block_linked=False)
        c.compress(bytes(payload))
        return bytes(c.finish())

    def lz4_decode(payload: bytes) -> bytes:
        return bytes(cramjam.lz4.decompress(bytes(payload)))

    fake_xxhash = SimpleNamespace(
        xxh32=lambda d: SimpleNamespace(digest=lambda: xxh32(bytes(d)).to_bytes(4, "big"))
    )
    monkeypatch.setattr(kafka.codec, "snappy", fake_snappy)
    monkeypatch.setattr(kafka.codec, "xxhash", fake_xxhash)
    monkeypatch.setattr(kafka.codec, "has_lz4", lambda: True)
    monkeypatch.setattr(kafka.codec, "has_zstd", lambda: True)
    monkeypatch.setattr(kafka.codec, "lz4_encode", lz4_encode)
    monkeypatch.setattr(kafka.codec, "lz4_decode", lz4_decode)
    for module in (kdefault, klegacy):
        monkeypatch.setattr(module, "lz4_encode", lz4_encode)
        monkeypatch.setattr(module, "lz4_decode", lz4_decode)
    monkeypatch.setattr(kdefault, "zstd_encode", lambda p: bytes(cramjam.zstd.compress(bytes(p))))
    monkeypatch.setattr(kdefault, "zstd_decode", lambda p: bytes(cramjam.zstd.decompress(bytes(p))))


def kafka_python_records(data: bytes) -> list[Record]:
    out = []
    reader = MemoryRecords(data)
    while reader.has_next():
        batch = reader.next_batch()
        assert batch.validate_crc()
        for r in batch:
            headers = [(k, None if v is None else bytes(v)) for k, v in (r.headers or [])]
            key = None if r.key is None else bytes(r.key)
            value = None if r.value is None else bytes(r.value)
            out.append(Record(r.offset, r.timestamp if r.timestamp is not None else -1, key, value, headers))
    return out


@pytest.mark.usefixtures("kafka_codecs")
@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: codec_name(c))
def test_kafka_python_v2_batches_decode(codec: int) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    builder.set_producer_state(producer_id=77, producer_epoch=3, base_sequence=10, is_transactional=True)
    expected = []
    for i in range(50):
        key = None if i % 4 == 0 else b"key-%d" % i
        value = None if i == 7 else b"compressible value " * 10 + b"%d" % i
        headers = [(f"h{i}", b"x" * i), ("n", None)] if i % 3 else []
        builder.append(i, timestamp=1_600_000_000_000 + i, key=key, value=value, headers=headers)
        expected.append(Record(i, 1_600_000_000_000 + i, key, value, headers))
    data = bytes(builder.build())
    batch = only_batch(data)
    assert batch.codec == codec and batch.record_count == 50
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (77, 3, 10)
    assert batch.is_transactional
    verify_crc(batch)
    assert decode_records(batch) == expected
    assert count_records(data) == 50


@pytest.mark.usefixtures("kafka_codecs")
@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", LEGACY_CODECS, ids=lambda c: codec_name(c))
def test_kafka_python_legacy_batches_decode(magic: int, codec: int) -> None:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    expected = []
    for i in range(20):
        key = None if i % 2 else b"k%d" % i
        value = b"legacy value %d " % i * 4
        builder.append(i, timestamp=1_500_000_000_000 + i, key=key, value=value)
        expected.append(Record(i, 1_500_000_000_000 + i if magic else -1, key, value, []))
    data = bytes(builder.build())
    for batch in iter_batches(data):
        assert batch.magic == magic and batch.codec == codec
        verify_crc(batch)
    ours = decode_all(data)
    assert ours == kafka_python_records(data)
    assert ours == expected
    assert count_records(data) == 20


@pytest.mark.usefixtures("kafka_codecs")
@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: codec_name(c))
def test_our_v2_batches_read_by_kafka_python(codec: int) -> None:
    records = sample_records(200, base=500)
    data = encode_batch_v2(
        records, base_offset=500, codec=codec, producer_id=1, producer_epoch=0, base_sequence=0
    )
    assert kafka_python_records(data) == records


@pytest.mark.usefixtures("kafka_codecs")
@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", LEGACY_CODECS, ids=lambda c: codec_name(c))
def test_our_message_sets_read_by_kafka_python(magic: int, codec: int) -> None:
    records = [
        Record(40 + i, (900 + i) if magic else -1, b"k" if i % 2 else None, b"v%d" % i * 9) for i in range(15)
    ]
    data = encode_message_set(records, magic, codec)
    assert kafka_python_records(data) == records


# ------------------------------------------------------------- truncation


def test_iteration_stops_cleanly_at_every_truncation_point() -> None:
    parts = [
        encode_message_set([Record(0, 1, b"k", b"v")], 1),
        encode_batch_v2(sample_records(4, base=1), base_offset=1, codec=Codec.GZIP),
        GOLDEN_V0,
        encode_batch_v2(sample_records(3, base=5), base_offset=5),
    ]
    data = b"".join(parts)
    ends = [sum(len(p) for p in parts[: i + 1]) for i in range(len(parts))]
    for cut in range(len(data) + 1):
        it = iter_batches(data[:cut])
        got = list(it)
        complete = [e for e in ends if e <= cut]
        assert [b.end for b in got] == complete, cut
        assert it.truncated_tail == cut - (complete[-1] if complete else 0)
        assert it.position + it.truncated_tail == cut
        # Decoding what is complete works; counting ignores the tail.
        decode_all(data[:cut])
        count_records(data[:cut])
        strict = iter_batches(data[:cut], allow_truncated_tail=False)
        if it.truncated_tail:
            with pytest.raises(CorruptRecordsError) as exc_info:
                list(strict)
            assert exc_info.value.offset == it.position
        else:
            assert len(list(strict)) == len(got)


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(encode_batch_v2(sample_records(6)), id="v2-none"),
        pytest.param(encode_batch_v2(sample_records(6), codec=Codec.GZIP), id="v2-gzip"),
        pytest.param(encode_batch_v2(sample_records(6), codec=Codec.SNAPPY), id="v2-snappy"),
        pytest.param(encode_batch_v2(sample_records(6), codec=Codec.LZ4), id="v2-lz4"),
        pytest.param(encode_batch_v2(sample_records(6), codec=Codec.ZSTD), id="v2-zstd"),
        pytest.param(GOLDEN_V0, id="v0"),
        pytest.param(encode_message_set([Record(0, 1, b"key", b"value")], 1), id="v1"),
        pytest.param(encode_message_set([Record(i, i, None, b"x") for i in range(3)], 1, 1), id="v1-gzip"),
        pytest.param(encode_message_set([Record(i, -1, None, b"x") for i in range(3)], 0, 3), id="v0-lz4"),
    ],
)
def test_truncated_entry_claiming_to_be_complete_is_corrupt(entry: bytes) -> None:
    """Cut an entry at every byte and fix its size field: decoding must fail with our error."""
    for cut in range(12, len(entry)):
        forged = with_size(entry[:cut], cut - 12)
        with pytest.raises(CorruptRecordsError) as exc_info:
            for batch in iter_batches(forged):
                decode_records(batch, check_crc=False)
        assert exc_info.value.offset is not None and 0 <= exc_info.value.offset <= len(forged)
        # With the CRC check on, the same input fails too (earlier, on the CRC).
        with pytest.raises(CorruptRecordsError):
            for batch in iter_batches(forged):
                decode_records(batch)


# ------------------------------------------------------------ corruption


@pytest.mark.parametrize("magic", [0, 1, 2])
def test_bad_crc_detected(magic: int) -> None:
    if magic == 2:
        data = bytearray(encode_batch_v2(sample_records(5), codec=Codec.SNAPPY))
        crc_pos = 17
    else:
        data = bytearray(encode_message_set([Record(0, 3, b"key", b"value")], magic))
        crc_pos = 12
    good = only_batch(bytes(data))
    assert compute_crc(good) == good.crc
    data[-1] ^= 0x01
    batch = only_batch(bytes(data))
    assert compute_crc(batch) != batch.crc
    with pytest.raises(CorruptRecordsError, match="CRC") as exc_info:
        verify_crc(batch)
    assert exc_info.value.offset == crc_pos and exc_info.value.field == "crc"
    with pytest.raises(CorruptRecordsError, match="CRC"):
        decode_records(batch)


def test_bad_inner_crc_of_legacy_wrapper_detected() -> None:
    inner = bytearray(encode_message_set([Record(0, 1, None, b"a"), Record(1, 2, None, b"b")], 1))
    inner[-1] ^= 0xFF  # corrupt the second inner message's value
    value = compress(Codec.GZIP, bytes(inner))
    body = struct.pack(">bbqii", 1, Codec.GZIP, 2, -1, len(value)) + value
    wrapper = struct.pack(">qiI", 1, len(body) + 4, 0) + body
    wrapper = wrapper[:12] + struct.pack(">I", zlib.crc32(wrapper[16:])) + wrapper[16:]
    batch = only_batch(wrapper)
    verify_crc(batch)  # the wrapper itself is fine
    with pytest.raises(CorruptRecordsError, match="CRC") as exc_info:
        decode_records(batch)
    assert "decompressed" in str(exc_info.value)
    assert len(decode_records(batch, check_crc=False)) == 2


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d[:16] + b"\x07" + d[17:], "unknown magic"),
        (lambda d: with_size(d, -1), "below the minimum"),
        (lambda d: with_size(d, 13), "below the minimum"),
        (lambda d: with_size(d[: 12 + 40], 40), "below the v2 header size"),
        (lambda d: d[:57] + struct.pack(">i", -3) + d[61:], "negative records_count"),
    ],
    ids=["magic", "negative-size", "tiny-size", "short-v2", "negative-count"],
)
def test_corrupt_headers_raise_on_iteration(mutate: Any, match: str) -> None:
    data = mutate(encode_batch_v2(sample_records(3)))
    with pytest.raises(CorruptRecordsError, match=match) as exc_info:
        list(iter_batches(data))
    assert exc_info.value.offset is not None


BASE_V2 = encode_batch_v2([Record(0, 0, None, b"v")])


@pytest.mark.parametrize(
    ("payload", "count", "match"),
    [
        # attributes, ts delta, offset delta, key -1, value len 1 'v', 1 header, key len -1 (null key)
        (raw_record(b"\x00\x00\x00\x01\x02v\x02\x01\x01"), 1, "null header key"),
        (raw_record(b"\x00\x00\x00\x01\x02v\x02\x02\xff\x01"), 1, "not UTF-8"),
        (raw_record(b"\x00\x00\x00\x01\x02v\x01"), 1, "header count"),
        (raw_record(b"\x00\x00\x00\x01\x02v\x00\x00"), 1, "fields end"),
        (raw_record(b"\x00\x00\x00\x03\x02v\x00"), 1, "key length"),
        (raw_record(b"\x00\x00\x00\x01\x0cv\x00"), 1, "value length"),
        (raw_record(b"\x00" + b"\x80" * 10 + b"\x00\x00\x01\x02v\x00"), 1, "longer than 10"),
        (raw_record(b"\x00\x00\x80\x80\x80\x80\x80\x00\x01\x02v\x00"), 1, "longer than 5"),
        (raw_record(b"\x00\x00\xff\xff\xff\xff\x7f\x01\x02v\x00"), 1, "out of range"),
        (raw_record(b"\x00\x00\x00\x01\x02v\x00"), 2, "cannot fit|outside"),
        (raw_record(b"\x00\x00\x00\x01\x02v\x00") + b"\x00" * 7, 1, "left after"),
        (b"\x03" + b"\x00" * 8, 1, "record length"),
        (b"\x80\x80\x80\x80\x80\x80\x80", 1, "longer than 5"),
        (b"\x00" * 7, 1, "before its attributes"),
    ],
)
def test_malformed_v2_records(payload: bytes, count: int, match: str) -> None:
    for codec in (Codec.NONE, Codec.GZIP):
        body = payload if codec == Codec.NONE else compress(codec, payload)
        data = reframe_v2(BASE_V2, body, count=count, attributes=codec)
        batch = only_batch(data)
        verify_crc(batch)
        with pytest.raises(CorruptRecordsError, match=match) as exc_info:
            decode_records(batch)
        err = exc_info.value
        assert err.offset is not None and V2_HEADER_SIZE <= err.offset <= len(data)
        if codec != Codec.NONE:
            assert err.offset == V2_HEADER_SIZE and "decompressed" in err.reason


def test_sanity_of_raw_record_helper() -> None:
    data = reframe_v2(BASE_V2, raw_record(b"\x00\x02\x00\x01\x02v\x02\x02h\x01"), count=1)
    assert decode_all(data) == [Record(0, 1, None, b"v", [("h", None)])]


def test_bad_codecs_are_corrupt() -> None:
    with pytest.raises(CorruptRecordsError, match="not valid"):
        decode_all(reframe_v2(BASE_V2, b"whatever", attributes=5))
    with pytest.raises(CorruptRecordsError, match="bad gzip"):
        decode_all(reframe_v2(BASE_V2, b"not gzip at all", attributes=Codec.GZIP))
    # zstd was never valid in a legacy message.
    body = struct.pack(">bbii", 0, Codec.ZSTD, -1, 3) + b"abc"
    entry = struct.pack(">qiI", 0, len(body) + 4, zlib.crc32(body)) + body
    with pytest.raises(CorruptRecordsError, match="not valid with magic 0"):
        decode_all(entry)


def legacy_wrapper(magic: int, inner: bytes, codec: int = Codec.GZIP, *, value: bytes | None = b"") -> bytes:
    if value == b"":
        value = compress(codec, inner)
    ts = struct.pack(">q", 0) if magic == 1 else b""
    vbytes = struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    body = struct.pack(">bb", magic, codec) + ts + struct.pack(">i", -1) + vbytes
    return struct.pack(">qiI", 9, len(body) + 4, zlib.crc32(body)) + body


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        (legacy_wrapper(1, encode_message_set([Record(0, -1, None, b"a")], 0)), "differs from the wrapper"),
        (legacy_wrapper(1, encode_message_set([Record(0, 1, None, b"a")], 1, Codec.GZIP)), "nested"),
        (legacy_wrapper(1, b"", value=None), "null value"),
        (legacy_wrapper(1, GOLDEN_V0[:-3]), "truncated entry"),
        (legacy_wrapper(0, GOLDEN_V0 + b"\x00"), "truncated entry"),
    ],
    ids=["magic-mismatch", "nested", "null-value", "truncated-inner", "trailing-inner"],
)
def test_malformed_legacy_wrappers(entry: bytes, match: str) -> None:
    with pytest.raises(CorruptRecordsError, match=match):
        decode_all(entry)
    if match != "null value":
        with pytest.raises(CorruptRecordsError):
            count_records(entry)


def test_legacy_message_with_bytes_after_value() -> None:
    forged = with_size(GOLDEN_V0 + b"\x00\x00", 27)
    forged = forged[:12] + struct.pack(">I", zlib.crc32(forged[16:])) + forged[16:]
    with pytest.raises(CorruptRecordsError, match="left after the message value"):
        decode_all(forged)


@settings(max_examples=250, deadline=None)
@given(st.data())
def test_fuzzed_input_raises_only_protocol_errors(data: st.DataObject) -> None:
    seeds = [
        encode_batch_v2(sample_records(4), codec=data.draw(st.sampled_from(ALL_CODECS))),
        encode_message_set(
            [Record(i, i, b"k", b"v" * i) for i in range(3)], 1, data.draw(st.sampled_from(LEGACY_CODECS))
        ),
        GOLDEN_V0,
    ]
    buf = bytearray(data.draw(st.sampled_from(seeds)))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    blob = bytes(buf)
    try:
        for batch in iter_batches(blob):
            compute_crc(batch)
            decode_records(batch, check_crc=False, max_decompressed=1 << 20)
        count_records(blob, max_decompressed=1 << 20)
    except ProtocolError as exc:
        assert isinstance(exc, DecodeError)
        assert exc.offset is not None


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_protocol_errors(blob: bytes) -> None:
    try:
        decode_all(blob, check_crc=False, max_decompressed=1 << 20)
        count_records(blob, max_decompressed=1 << 20)
    except ProtocolError as exc:
        assert exc.offset is not None


# ---------------------------------------------------------- count_records


def test_count_records_reads_v2_headers_only() -> None:
    good = encode_batch_v2(sample_records(9), codec=Codec.ZSTD)
    # Same header, garbage where the compressed records should be: counting must
    # not look there.
    garbage = reframe_v2(good, b"\x00" * 40)
    data = (
        good
        + garbage
        + encode_message_set([Record(i, 1, None, b"v") for i in range(4)], 1)
        + encode_message_set([Record(i, 1, None, b"v") for i in range(6)], 1, Codec.LZ4)
        + encode_message_set([Record(i, -1, None, b"v") for i in range(2)], 0, Codec.LZ4)
        + good[:30]  # truncated tail
    )
    assert count_records(data) == 9 + 9 + 4 + 6 + 2
    assert count_records(b"") == 0


# ------------------------------------------------------------ bombs


def test_decompression_bomb_refused_with_bounded_memory() -> None:
    # 256 concatenated zstd frames of 16 MiB of zeros: ~140 KB that would
    # expand to 4 GiB if decompressed without a limit.
    bomb = compress(Codec.ZSTD, bytes(16 << 20)) * 256
    assert len(bomb) < 1 << 20
    tracemalloc.start()
    try:
        started = time.perf_counter()
        with pytest.raises(CorruptRecordsError, match="limit"):
            decompress(Codec.ZSTD, bomb, max_size=4 << 20)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20
    assert elapsed < 2.0


@pytest.mark.parametrize("codec", ALL_CODECS[1:], ids=lambda c: codec_name(c))
def test_batch_bigger_than_max_decompressed_is_refused(codec: int) -> None:
    data = encode_batch_v2([Record(0, 0, None, bytes(3 << 20))], codec=codec)
    assert len(data) < 1 << 20
    batch = only_batch(data)
    with pytest.raises(CorruptRecordsError, match="limit") as exc_info:
        decode_records(batch, max_decompressed=1 << 20)
    assert exc_info.value.offset == V2_HEADER_SIZE
    assert decode_records(batch, max_decompressed=4 << 20)[0].value == bytes(3 << 20)
    assert count_records(data) == 1


# ------------------------------------------------------------ compression


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: codec_name(c))
@pytest.mark.parametrize("size", [0, 1, 1000, 300_000, 2_000_003])
def test_codec_round_trip_and_exact_limit(codec: int, size: int) -> None:
    # Partly compressible, larger than the first output buffer, odd sizes.
    payload = (bytes(range(256)) * (size // 256 + 1))[:size]
    packed = compress(codec, payload)
    assert decompress(codec, packed, max_size=size) == payload
    if size:
        with pytest.raises(CorruptRecordsError, match="limit"):
            decompress(codec, packed, max_size=size - 1)


def test_snappy_framing() -> None:
    payload = b"snappy " * 20000
    packed = compress(Codec.SNAPPY, payload)
    assert packed.startswith(b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01")
    # Plain raw snappy, as some non-Java clients write it, is accepted too.
    raw = bytes(cramjam.snappy.compress_raw(payload))
    assert decompress(Codec.SNAPPY, raw, max_size=len(payload)) == payload
    # Concatenated xerial streams (snappy-java reads them).
    assert decompress(Codec.SNAPPY, packed + packed, max_size=2 * len(payload)) == payload * 2
    with pytest.raises(CorruptRecordsError, match="block length"):
        decompress(Codec.SNAPPY, packed[:-10], max_size=len(payload))


def test_lz4_frames_are_java_compatible_and_legacy_header() -> None:
    payload = b"lz4 " * 100_000
    frame = compress(Codec.LZ4, payload)
    flg = frame[4]
    assert flg & 0x20, "blocks must be independent: Kafka's Java reader rejects linked blocks"
    assert not flg & 0x04, "no content checksum"
    assert frame[6] == (xxh32(frame[4:6]) >> 8) & 0xFF
    legacy = compress(Codec.LZ4, payload, lz4_legacy_header=True)
    # KAFKA-3160: the magic-0 header checksum covers the magic number too.
    assert legacy[6] == (xxh32(legacy[0:6]) >> 8) & 0xFF and legacy[6] != frame[6]
    assert decompress(Codec.LZ4, legacy, max_size=len(payload), lz4_legacy_header=True) == payload
    with pytest.raises(CorruptRecordsError):
        decompress(Codec.LZ4, legacy, max_size=len(payload))


def test_xxh32_matches_lz4_block_checksums() -> None:
    # cramjam's frames carry XXH32 block checksums: an independent check of the
    # long-input path (the header checksum above covers the short one).
    frame = compress(Codec.LZ4, bytes(range(256)) * 50)
    (size,) = struct.unpack_from("<I", frame, 7)
    size &= 0x7FFFFFFF
    block = frame[11 : 11 + size]
    assert struct.unpack_from("<I", frame, 11 + size)[0] == xxh32(block)
    assert xxh32(b"") == 0x02CC5D05  # the specification's empty-input value


def test_gzip_members_and_garbage() -> None:
    a, b = gzip.compress(b"first "), gzip.compress(b"second")
    assert decompress(Codec.GZIP, a + b, max_size=100) == b"first second"
    with pytest.raises(CorruptRecordsError):
        decompress(Codec.GZIP, a + b"junk", max_size=100)
    with pytest.raises(CorruptRecordsError, match="truncated"):
        decompress(Codec.GZIP, a[:-3], max_size=100)


@pytest.mark.parametrize("codec", ALL_CODECS[1:], ids=lambda c: codec_name(c))
def test_garbage_is_corrupt_for_every_codec(codec: int) -> None:
    for junk in (b"", b"\x00", b"definitely not compressed data" * 3, bytes(range(256))):
        try:
            out = decompress(codec, junk, max_size=1 << 16)
        except CorruptRecordsError:
            continue
        # Some codecs accept a few byte strings (raw snappy "\x00" is empty data); then it must be small.
        assert len(out) <= 1 << 16


def test_unknown_codec_ids() -> None:
    with pytest.raises(CorruptRecordsError, match="unknown"):
        decompress(6, b"x", max_size=10)
    with pytest.raises(EncodeError, match="unknown"):
        compress(6, b"x")
    assert codec_name(6) == "unknown(6)" and codec_name(Codec.ZSTD) == "zstd"
    with pytest.raises(CorruptRecordsError, match="limit"):
        decompress(Codec.NONE, b"abc", max_size=2)


# --------------------------------------------------------------- encoders


def test_encoder_validation() -> None:
    with pytest.raises(EncodeError, match="increasing"):
        encode_batch_v2([Record(1, 0, None, b"a"), Record(1, 0, None, b"b")])
    with pytest.raises(EncodeError, match="offset_delta"):
        encode_batch_v2([Record(0, 0, None, b"a")], base_offset=5)
    with pytest.raises(EncodeError, match="header key"):
        encode_batch_v2([Record(0, 0, None, b"a", [(b"k", b"v")])])  # type: ignore[list-item]
    with pytest.raises(EncodeError, match="bytes"):
        encode_batch_v2([Record(0, 0, "text", b"a")])  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match="producer_epoch"):
        encode_batch_v2([], producer_epoch=1 << 20)
    with pytest.raises(EncodeError, match="zstd"):
        encode_message_set([Record(0, 0, None, b"a")], 1, Codec.ZSTD)
    with pytest.raises(EncodeError, match="magic"):
        encode_message_set([Record(0, 0, None, b"a")], 2)
    with pytest.raises(EncodeError, match="headers"):
        encode_message_set([Record(0, 0, None, b"a", [("h", None)])], 1)
    assert encode_message_set([], 1, Codec.GZIP) == b""


def test_record_and_batch_info_are_frozen_and_hashable() -> None:
    rec = Record(0, 0, None, b"a", [("h", b"v")])
    assert hash(rec) == hash(Record(0, 0, None, b"a", []))  # headers are not hashed
    assert rec != Record(0, 0, None, b"a", [])  # ...but they are compared
    batch = only_batch(GOLDEN_V0)
    with pytest.raises(AttributeError):
        batch.offset = 3  # type: ignore[misc]
    assert batch == only_batch(bytearray(GOLDEN_V0))  # the buffer is not part of equality
    hash(batch)


def test_the_producer_head_of_a_ranges_first_v2_batch_is_read_in_place() -> None:
    first = encode_batch_v2([Record(0, 1, b"k", b"v" * 300)], codec=Codec.ZSTD, producer_id=4321, producer_epoch=7,
                            base_sequence=99)
    second = encode_batch_v2([Record(1, 2, b"k", b"v")], producer_id=1, base_sequence=1)
    data = b"xx" + first + second
    (info,) = list(iter_batches(first))
    assert v2_producer_head(data, 2, len(data)) == (4321, 7, 99, info.crc, int(Codec.ZSTD))  # the first batch's
    assert v2_producer_head(data, 2 + len(first), len(data))[:3] == (1, -1, 1)  # type: ignore[index]
    assert v2_producer_head(data, 2, 2 + 60) is None  # shorter than a v2 batch header
    legacy = encode_message_set([Record(0, 1, b"k", b"v" * 100)], 1, Codec.NONE)
    assert v2_producer_head(legacy, 0, len(legacy)) is None  # magic 1: no producer
