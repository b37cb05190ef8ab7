"""The v2 batch header's one layout (kproxy/protocol/records/batch_layout.py) against batches another
implementation wrote (kafka-python's builder), and every reader built on it."""

from __future__ import annotations

import random
import struct

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from kproxy.metrics.client_anomalies import UNCOMPRESSED_MIN_BYTES, uncompressed
from kproxy.protocol.records import iter_batches, one_batch_header, v2_batches, v2_dated, v2_producer_head
from kproxy.protocol.records.batch_layout import FIELDS, V2_HEADER_SIZE, header_struct


def written_by_kafka_python(*, codec: int = 0, producer_id: int = 123_456_789_012, epoch: int = 7,
                            sequence: int = 42, base_offset: int = 1_000, records: int = 3,
                            value: bytes = b"v" * 100) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                        producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
                                        batch_size=1 << 20)
    for i in range(records):
        builder.append(i, 1_700_000_000_000 + 5 * i, b"k", value, [])
    batch = bytearray(builder.build())
    struct.pack_into(">q", batch, 0, base_offset)  # (the builder writes 0; the CRC does not cover it)
    return bytes(batch)


def test_every_field_read_at_its_position_is_the_value_kafka_python_wrote() -> None:
    batch = written_by_kafka_python(codec=1)
    every = header_struct(*(name for name, _, _ in FIELDS))
    assert every.size == V2_HEADER_SIZE
    values = dict(zip((name for name, _, _ in FIELDS), every.unpack_from(batch, 0), strict=True))
    info = next(iter_batches(batch))  # the full walker, built on the same layout
    assert values == {
        "base_offset": 1_000, "batch_length": len(batch) - 12, "partition_leader_epoch": info.partition_leader_epoch,
        "magic": 2, "crc": info.crc, "attributes": 1, "last_offset_delta": 2,
        "base_timestamp": 1_700_000_000_000, "max_timestamp": 1_700_000_000_010, "producer_id": 123_456_789_012,
        "producer_epoch": 7, "base_sequence": 42, "records_count": 3,
    }
    for name, at, _ in FIELDS:  # each alone, from its own position
        (alone,) = header_struct(name).unpack_from(batch, at)
        assert alone == values[name], name


def test_the_data_path_readers_agree_with_what_was_written() -> None:
    first = written_by_kafka_python(codec=0, base_offset=1_000, records=3)
    second = written_by_kafka_python(codec=1, base_offset=1_003, records=2, sequence=45)
    both = first + second
    dated: list[tuple[int, int, int]] = []
    assert v2_dated(both, 0, len(both), dated) == (5, len(both))
    assert dated == [(1_000, 1_002, 1_700_000_000_010), (1_003, 1_004, 1_700_000_000_005)]
    crc = next(iter_batches(first)).crc
    assert v2_producer_head(both, 0, len(both)) == (123_456_789_012, 7, 42, crc, 0)
    sizes: list[tuple[int, int, int]] = []
    assert v2_batches(both, 0, len(both), sizes) == len(both)
    assert sizes == [(len(first), 0, 3), (len(second), 1, 2)]
    assert one_batch_header(second, 0, len(second)) == (len(second), 1, 2)


def test_the_uncompressed_producer_detector_reads_the_codec_bits() -> None:
    plain = written_by_kafka_python(codec=0, value=b"x" * UNCOMPRESSED_MIN_BYTES)
    noise = random.Random(7).randbytes(UNCOMPRESSED_MIN_BYTES)  # (incompressible: the batch stays this big)
    gzipped = written_by_kafka_python(codec=1, value=noise)
    assert len(gzipped) >= UNCOMPRESSED_MIN_BYTES
    assert uncompressed(plain, [(0, len(plain), 0)])
    assert not uncompressed(gzipped, [(0, len(gzipped), 0)])


def test_a_struct_names_fields_in_header_order_and_only_real_ones() -> None:
    assert header_struct("magic", "crc", "attributes").format == ">bIh"
    assert header_struct("batch_length", "magic").format == ">i4xb"  # the leader epoch skipped
    with pytest.raises(ValueError, match="no field 'producer'"):
        header_struct("producer")
    with pytest.raises(ValueError, match="header order"):
        header_struct("crc", "magic")
