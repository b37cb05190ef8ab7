"""RecordBatch v2 (magic 2, KIP-98): decoding the records of a batch and encoding batches."""

from __future__ import annotations

from collections.abc import Iterable

from crc32c import crc32c

from kproxy.protocol.compression import Codec, compress
from kproxy.protocol.errors import CorruptRecordsError, EncodeError
from kproxy.protocol.primitives import write_varlong
from kproxy.protocol.records.batch_layout import ATTRIBUTES_AT, CODEC_MASK, CRC_AT, V2_HEADER_SIZE
from kproxy.protocol.records.budget import RECORD_COST, RecordBudget
from kproxy.protocol.records.entries import (
    _CONTROL_MASK,
    _DELETE_HORIZON_MASK,
    _INT32_MAX,
    _INT32_MIN,
    _INT64_MAX,
    _INT64_MIN,
    _MIN_V2_RECORD,
    _TIMESTAMP_TYPE_MASK,
    _TRANSACTIONAL_MASK,
    _UINT32,
    _V2_HEADER,
    LOG_OVERHEAD,
    BatchInfo,
    BytesLike,
    Header,
    Record,
    TimestampType,
)
from kproxy.protocol.records.fields import (
    _check_bytes,
    _check_range,
    _payload,
    _read_varint,
    _read_varint_bytes,
    _read_varlong,
    _write_varint_bytes,
)


def decode_v2(batch: BatchInfo, max_decompressed: int, budget: RecordBudget | None = None) -> list[Record]:
    """The records of one v2 batch; with a ``budget``, the decompressed bytes and
    :data:`~kproxy.protocol.records.budget.RECORD_COST` per record are charged to it first."""
    data, pos, end, reader = _payload(
        batch, batch.offset + V2_HEADER_SIZE, batch.end, max_decompressed, budget=budget
    )
    if budget is not None:
        budget.spend(RECORD_COST * (batch.record_count or 0), offset=batch.offset)
    try:
        return _parse_v2_records(data, pos, end, batch)
    except CorruptRecordsError as exc:
        raise reader.relocate(exc) from exc


def _parse_v2_records(buf: BytesLike, pos: int, end: int, batch: BatchInfo) -> list[Record]:
    count = batch.record_count or 0
    if count > (end - pos) // _MIN_V2_RECORD:
        # Cheap early refusal: that many records cannot fit in these bytes.
        raise CorruptRecordsError(
            f"records_count {count} cannot fit in {end - pos} bytes of records", offset=pos, field="records"
        )
    base_offset = batch.base_offset
    base_timestamp = batch.base_timestamp
    # LOG_APPEND_TIME: the broker stamped the batch; records' own deltas are stale.
    log_append_time = batch.timestamp_type == TimestampType.LOG_APPEND_TIME
    records: list[Record] = []
    for index in range(count):
        where = f"records[{index}]"
        length, p = _read_varint(buf, pos, end, where + ".length")
        if length < 0 or length > end - p:
            raise CorruptRecordsError(
                f"record length {length} outside the {end - p} bytes left",
                offset=pos,
                field=where + ".length",
            )
        record_end = p + length
        if p >= record_end:
            raise CorruptRecordsError("record ends before its attributes", offset=p, field=where)
        p += 1  # attributes: unused by every Kafka version so far
        timestamp_delta, p = _read_varlong(buf, p, record_end, where + ".timestamp_delta")
        offset_delta, p = _read_varint(buf, p, record_end, where + ".offset_delta")
        key, p = _read_varint_bytes(buf, p, record_end, where + ".key")
        value, p = _read_varint_bytes(buf, p, record_end, where + ".value")
        header_count, p = _read_varint(buf, p, record_end, where + ".headers")
        # Each header takes at least two bytes (two length varints).
        if header_count < 0 or header_count > (record_end - p) // 2:
            raise CorruptRecordsError(
                f"header count {header_count} impossible in {record_end - p} bytes",
                offset=p,
                field=where + ".headers",
            )
        headers: list[Header] = []
        for h in range(header_count):
            hwhere = f"{where}.headers[{h}]"
            key_start = p
            raw_key, p = _read_varint_bytes(buf, p, record_end, hwhere + ".key")
            if raw_key is None:
                raise CorruptRecordsError("null header key", offset=key_start, field=hwhere + ".key")
            try:
                header_key = raw_key.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorruptRecordsError(
                    f"header key is not UTF-8: {exc.reason}", offset=key_start, field=hwhere + ".key"
                ) from exc
            header_value, p = _read_varint_bytes(buf, p, record_end, hwhere + ".value")
            headers.append((header_key, header_value))
        if p != record_end:
            raise CorruptRecordsError(
                f"record length {length} but its fields end {p - (record_end - length)} bytes in",
                offset=p,
                field=where,
            )
        timestamp = batch.max_timestamp if log_append_time else base_timestamp + timestamp_delta
        records.append(Record(base_offset + offset_delta, timestamp, key, value, headers))
        pos = record_end
    if pos != end:
        raise CorruptRecordsError(
            f"{end - pos} bytes left after the {count} records the header declares",
            offset=pos,
            field="records",
        )
    return records


def encode_batch_v2(
    records: Iterable[Record],
    *,
    base_offset: int = 0,
    codec: int = Codec.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    partition_leader_epoch: int = -1,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    last_offset_delta: int | None = None,
    has_delete_horizon: bool = False,
) -> bytes:
    """One RecordBatch v2 holding ``records``, with correct lengths and CRC-32C.

    Record offsets are absolute: each is stored as ``record.offset - base_offset``
    and must be strictly increasing and within int32 of ``base_offset``.
    ``base_timestamp`` defaults to the first record's timestamp (as the Java
    producer does), ``max_timestamp`` to the largest one, ``last_offset_delta``
    to the last record's delta; for an empty batch they default to -1, -1, 0.
    The records section is compressed with ``codec`` (snappy xerial-framed, lz4
    with independent blocks, as the Java client writes them).

    Raises :class:`EncodeError` for values that do not fit the format.
    """
    recs = list(records)
    _check_range(base_offset, _INT64_MIN, _INT64_MAX, "base_offset")
    _check_range(partition_leader_epoch, _INT32_MIN, _INT32_MAX, "partition_leader_epoch")
    _check_range(producer_id, _INT64_MIN, _INT64_MAX, "producer_id")
    _check_range(producer_epoch, -(2**15), 2**15 - 1, "producer_epoch")
    _check_range(base_sequence, _INT32_MIN, _INT32_MAX, "base_sequence")
    _check_range(codec, 0, CODEC_MASK, "codec")
    if base_timestamp is None:
        base_timestamp = recs[0].timestamp if recs else -1
    if max_timestamp is None:
        max_timestamp = max((r.timestamp for r in recs), default=-1)
    _check_range(base_timestamp, _INT64_MIN, _INT64_MAX, "base_timestamp")
    _check_range(max_timestamp, _INT64_MIN, _INT64_MAX, "max_timestamp")

    body = bytearray()
    record = bytearray()
    previous_delta = -1
    for index, rec in enumerate(recs):
        where = f"records[{index}]"
        offset_delta = rec.offset - base_offset
        _check_range(offset_delta, 0, _INT32_MAX, where + ".offset_delta")
        if offset_delta <= previous_delta:
            raise EncodeError("record offsets must be strictly increasing", field=where + ".offset")
        previous_delta = offset_delta
        timestamp_delta = rec.timestamp - base_timestamp
        _check_range(timestamp_delta, _INT64_MIN, _INT64_MAX, where + ".timestamp_delta")
        _check_bytes(rec.key, where + ".key")
        _check_bytes(rec.value, where + ".value")
        record.clear()
        record.append(0)  # attributes
        write_varlong(record, timestamp_delta)
        write_varlong(record, offset_delta)
        _write_varint_bytes(record, rec.key)
        _write_varint_bytes(record, rec.value)
        write_varlong(record, len(rec.headers))
        for h, (header_key, header_value) in enumerate(rec.headers):
            if not isinstance(header_key, str):
                raise EncodeError("header key must be str", field=f"{where}.headers[{h}].key")
            _check_bytes(header_value, f"{where}.headers[{h}].value")
            _write_varint_bytes(record, header_key.encode("utf-8"))
            _write_varint_bytes(record, header_value)
        write_varlong(body, len(record))
        body += record
    if last_offset_delta is None:
        last_offset_delta = previous_delta if recs else 0
    _check_range(last_offset_delta, _INT32_MIN, _INT32_MAX, "last_offset_delta")

    attributes = codec
    if timestamp_type == TimestampType.LOG_APPEND_TIME:
        attributes |= _TIMESTAMP_TYPE_MASK
    if is_transactional:
        attributes |= _TRANSACTIONAL_MASK
    if is_control:
        attributes |= _CONTROL_MASK
    if has_delete_horizon:
        attributes |= _DELETE_HORIZON_MASK
    payload = compress(codec, body) if codec != Codec.NONE else bytes(body)
    batch_length = V2_HEADER_SIZE - LOG_OVERHEAD + len(payload)
    _check_range(batch_length, 0, _INT32_MAX, "batch_length")

    out = bytearray(V2_HEADER_SIZE)
    _V2_HEADER.pack_into(
        out,
        0,
        base_offset,
        batch_length,
        partition_leader_epoch,
        2,  # magic
        0,  # crc: computed over the finished batch below
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(recs),
    )
    out += payload
    _UINT32.pack_into(out, CRC_AT, crc32c(memoryview(out)[ATTRIBUTES_AT:]))
    return bytes(out)
