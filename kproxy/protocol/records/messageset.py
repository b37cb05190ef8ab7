"""Legacy message sets (magic 0 and 1): decoding messages (compressed wrappers too) and encoding them."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from kproxy.protocol.compression import Codec, codec_name, compress
from kproxy.protocol.errors import CorruptRecordsError, EncodeError
from kproxy.protocol.records.batch_layout import MAGIC_AT
from kproxy.protocol.records.budget import RECORD_COST, RecordBudget
from kproxy.protocol.records.entries import (
    _INT32,
    _INT64,
    _INT64_MAX,
    _INT64_MIN,
    _LEGACY_CRC_POS,
    _LEGACY_HEADER,
    _LEGACY_MAGIC_POS,
    _TIMESTAMP_TYPE_MASK,
    _UINT32,
    LOG_OVERHEAD,
    BatchInfo,
    BytesLike,
    Record,
    TimestampType,
    iter_batches,
    verify_crc,
)
from kproxy.protocol.records.fields import (
    _check_bytes,
    _check_range,
    _payload,
    _read_int32_bytes,
    _Reader,
)


class _Message(NamedTuple):
    offset: int
    magic: int
    attributes: int
    timestamp: int
    key: bytes | None
    value_start: int  # -1 when the value is null
    value_end: int


def _parse_message(buf: BytesLike, pos: int, end: int) -> _Message:
    """A legacy entry at ``buf[pos:end]`` (12-byte prefix included), sizes already checked."""
    offset, _, _, magic, attributes = _LEGACY_HEADER.unpack_from(buf, pos)
    p = pos + _LEGACY_HEADER.size
    timestamp = -1
    if magic == 1:
        (timestamp,) = _INT64.unpack_from(buf, p)
        p += 8
    key_start, key_end, p = _read_int32_bytes(buf, p, end, "key")
    value_start, value_end, p = _read_int32_bytes(buf, p, end, "value")
    if p != end:
        raise CorruptRecordsError(f"{end - p} bytes left after the message value", offset=p, field="value")
    key = None if key_start < 0 else bytes(buf[key_start:key_end])
    return _Message(offset, magic, attributes, timestamp, key, value_start, value_end)


def _inner_messages(
    batch: BatchInfo, max_decompressed: int, budget: RecordBudget | None = None
) -> Iterator[tuple[BatchInfo, _Reader]]:
    """The inner messages of a compressed legacy wrapper (header level), with error context."""
    data, pos, end, reader = _wrapper_payload(batch, max_decompressed, budget)
    return _inner_entries(batch, data, pos, end, reader)


def _wrapper_payload(
    batch: BatchInfo, max_decompressed: int, budget: RecordBudget | None = None
) -> tuple[BytesLike, int, int, _Reader]:
    """The decompressed value of a compressed legacy wrapper (charged to ``budget`` when given)."""
    wrapper = _parse_message(batch.buffer, batch.offset, batch.end)
    if wrapper.value_start < 0:
        raise CorruptRecordsError("compressed message has a null value", offset=batch.offset, field="value")
    return _payload(
        batch,
        wrapper.value_start,
        wrapper.value_end,
        max_decompressed,
        lz4_legacy_header=batch.magic == 0,
        budget=budget,
    )


def _inner_entries(
    batch: BatchInfo, data: BytesLike, pos: int, end: int, reader: _Reader
) -> Iterator[tuple[BatchInfo, _Reader]]:
    """The entries of a wrapper's decompressed value ``data[pos:end]``, checked against the wrapper."""
    inner = iter_batches(data, start=pos, end=end, allow_truncated_tail=False)
    while True:
        try:
            info = next(inner, None)
            if info is None:
                return
            if info.magic != batch.magic:
                raise CorruptRecordsError(
                    f"inner message magic {info.magic} differs from the wrapper's {batch.magic}",
                    offset=info.offset + MAGIC_AT,
                    field="magic",
                )
            if info.codec != Codec.NONE:
                raise CorruptRecordsError(
                    "nested compression in a legacy message set", offset=info.offset, field="attributes"
                )
        except CorruptRecordsError as exc:
            raise reader.relocate(exc) from exc
        yield info, reader


def decode_legacy(
    batch: BatchInfo, max_decompressed: int, check_crc: bool, budget: RecordBudget | None = None
) -> list[Record]:
    """The records of one legacy entry; a wrapper's inner messages are charged to ``budget``
    (:data:`~kproxy.protocol.records.budget.RECORD_COST` each, on top of the decompressed bytes)."""
    if batch.codec == Codec.NONE:
        msg = _parse_message(batch.buffer, batch.offset, batch.end)
        value = None if msg.value_start < 0 else bytes(batch.buffer[msg.value_start : msg.value_end])
        return [Record(msg.offset, msg.timestamp, msg.key, value, [])]
    messages: list[_Message] = []
    inner_buffer: BytesLike = b""
    for info, reader in _inner_messages(batch, max_decompressed, budget):
        if budget is not None:
            budget.spend(RECORD_COST, offset=batch.offset)
        inner_buffer = info.buffer
        try:
            if check_crc:
                verify_crc(info)
            messages.append(_parse_message(inner_buffer, info.offset, info.end))
        except CorruptRecordsError as exc:
            raise reader.relocate(exc) from exc
    if not messages:
        return []
    # Magic 1: inner offsets are relative and the wrapper holds the last one's
    # absolute offset. Magic 0: inner offsets are absolute already. A negative
    # base means no offset was assigned yet (a producer writes its wrappers at
    # offset 0): keep the inner offsets then, as Kafka's own iterator does.
    shift = batch.base_offset - messages[-1].offset if batch.magic >= 1 else 0
    if shift < 0:
        shift = 0
    log_append_time = batch.timestamp_type == TimestampType.LOG_APPEND_TIME
    return [
        Record(
            m.offset + shift,
            batch.base_timestamp if log_append_time else m.timestamp,
            m.key,
            None if m.value_start < 0 else bytes(inner_buffer[m.value_start : m.value_end]),
            [],
        )
        for m in messages
    ]


def _encode_message(
    out: bytearray,
    offset: int,
    magic: int,
    attributes: int,
    timestamp: int,
    key: BytesLike | None,
    value: BytesLike | None,
) -> None:
    start = len(out)
    out += bytes(LOG_OVERHEAD + 4)  # offset, size and crc, filled in below
    out.append(magic)
    out.append(attributes)
    if magic == 1:
        out += _INT64.pack(timestamp)
    for part in (key, value):
        if part is None:
            out += _INT32.pack(-1)
        else:
            out += _INT32.pack(len(part))
            out += part
    size = len(out) - start - LOG_OVERHEAD
    struct.pack_into(">qi", out, start, offset, size)
    crc = zlib.crc32(memoryview(out)[start + _LEGACY_MAGIC_POS :])
    _UINT32.pack_into(out, start + _LEGACY_CRC_POS, crc)


def encode_message_set(
    messages: Iterable[Record],
    magic: int = 1,
    codec: int = Codec.NONE,
    *,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
) -> bytes:
    """A legacy (magic 0 or 1) message set holding ``messages``, with correct CRC-32s.

    Uncompressed: one entry per message at its own offset. Compressed: a single
    wrapper at the last message's offset whose value is the compressed inner set
    (inner offsets relative to the first message for magic 1, absolute for magic
    0; wrapper timestamp = largest inner timestamp), as brokers store them.
    Magic 0 ignores timestamps and headers must be empty; gzip, snappy and lz4
    only (Kafka never allowed zstd below magic 2). ``timestamp_type`` sets the
    attributes bit for magic 1.

    Raises :class:`EncodeError` for values that do not fit the format.
    """
    msgs = list(messages)
    if magic not in (0, 1):
        raise EncodeError(f"legacy magic must be 0 or 1, not {magic!r}", field="magic")
    if codec not in (Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4):
        raise EncodeError(f"codec {codec_name(codec)} is not valid with magic {magic}", field="codec")
    ts_bit = _TIMESTAMP_TYPE_MASK if magic == 1 and timestamp_type == TimestampType.LOG_APPEND_TIME else 0
    for index, msg in enumerate(msgs):
        where = f"messages[{index}]"
        _check_range(msg.offset, _INT64_MIN, _INT64_MAX, where + ".offset")
        if magic == 1:
            _check_range(msg.timestamp, _INT64_MIN, _INT64_MAX, where + ".timestamp")
        _check_bytes(msg.key, where + ".key")
        _check_bytes(msg.value, where + ".value")
        if msg.headers:
            raise EncodeError("legacy messages cannot carry headers", field=where + ".headers")
    out = bytearray()
    if codec == Codec.NONE:
        for msg in msgs:
            _encode_message(out, msg.offset, magic, ts_bit, msg.timestamp, msg.key, msg.value)
        return bytes(out)
    if not msgs:
        return b""
    first = msgs[0].offset
    inner = bytearray()
    for msg in msgs:
        inner_offset = msg.offset - first if magic == 1 else msg.offset
        _encode_message(inner, inner_offset, magic, 0, msg.timestamp, msg.key, msg.value)
    value = compress(codec, inner, lz4_legacy_header=magic == 0)
    wrapper_timestamp = max(m.timestamp for m in msgs) if magic == 1 else -1
    _encode_message(out, msgs[-1].offset, magic, codec | ts_bit, wrapper_timestamp, None, value)
    return bytes(out)
