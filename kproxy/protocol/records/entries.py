"""The entries of a records field: their layouts, the values decoded from them, walking their headers, CRCs.

See :mod:`kproxy.protocol.records` for the wire format of every magic.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

from crc32c import crc32c

from kproxy.protocol.compression import Codec, codec_name
from kproxy.protocol.errors import CorruptRecordsError
from kproxy.protocol.records.batch_layout import (
    ATTRIBUTES_AT,
    CODEC_MASK,
    CRC_AT,
    FIELDS,
    MAGIC_AT,
    V2_HEADER_SIZE,
    header_struct,
)

BytesLike = bytes | bytearray | memoryview
Header = tuple[str, bytes | None]

# ----------------------------------------------------------------------- layouts

#: offset int64 + size int32: the prefix every entry shares.
LOG_OVERHEAD: Final = 12
_V2_HEADER: Final = header_struct(*(name for name, _, _ in FIELDS))  # every field, from the first byte
_V2_MIN_BATCH_LENGTH: Final = V2_HEADER_SIZE - LOG_OVERHEAD

# offset, message_size, crc, magic, attributes (+ timestamp int64 for magic 1)
_LEGACY_HEADER: Final = struct.Struct(">qiIbb")
_LEGACY_CRC_POS: Final = 12
_LEGACY_MAGIC_POS: Final = 16  # the CRC-32 covers from here to the end
# crc + magic + attributes + key length + value length (+ 8 for the v1 timestamp)
_LEGACY_MIN_SIZE: Final = {0: 14, 1: 22}
_SMALLEST_ENTRY_SIZE: Final = 14

_TIMESTAMP_TYPE_MASK: Final = 0x08
_TRANSACTIONAL_MASK: Final = 0x10
_CONTROL_MASK: Final = 0x20
_DELETE_HORIZON_MASK: Final = 0x40

_INT8: Final = struct.Struct(">b")
_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
_UINT32: Final = struct.Struct(">I")
_INT64: Final = struct.Struct(">q")

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# A v2 record needs at least 7 bytes: length, attributes, timestamp delta,
# offset delta, key length, value length, header count (one byte each).
_MIN_V2_RECORD: Final = 7


class TimestampType(IntEnum):
    """Kafka's timestamp types; magic 0 has none."""

    NO_TIMESTAMP_TYPE = -1
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


# ------------------------------------------------------------------------ values


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record (any magic).

    ``offset`` and ``timestamp`` are absolute (base + delta already applied; for a
    LOG_APPEND_TIME batch the timestamp is the batch's, as Kafka's consumer
    reports it). ``timestamp`` is -1 for magic 0. ``headers`` are
    ``(key, value)`` pairs, always empty below magic 2; they take part in ``==``
    but not in ``hash``.
    """

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[Header] = field(default_factory=list, hash=False)


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """Header-level view of one entry of a records field: a v2 batch or a legacy message.

    ``offset`` and ``length`` are the *byte* position and total size (12-byte
    prefix included) of the entry in ``buffer``, the object handed to
    :func:`iter_batches`; Kafka offsets are ``base_offset``/``last_offset``.

    For a legacy message, ``base_offset`` is the message's offset field. For a
    compressed legacy wrapper that is the offset of its *last* inner message, so
    ``last_offset`` is right and the first offset is only known after
    :func:`decode_records`. ``record_count`` is None for such a wrapper, 1 for a
    plain legacy message, the header's ``records_count`` for v2.
    ``base_timestamp``/``max_timestamp`` are the v1 message timestamp for magic 1
    and -1 for magic 0. Producer fields are -1 below magic 2.
    """

    offset: int
    length: int
    magic: int
    attributes: int
    crc: int
    base_offset: int
    last_offset_delta: int
    record_count: int | None
    partition_leader_epoch: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    buffer: BytesLike = field(repr=False, compare=False, hash=False)

    @property
    def end(self) -> int:
        """Byte position just past this entry in ``buffer``."""
        return self.offset + self.length

    @property
    def raw(self) -> memoryview:
        """The entry's bytes (a view into ``buffer``, no copy)."""
        return memoryview(self.buffer)[self.offset : self.end]

    @property
    def codec(self) -> int:
        """Compression codec id (see :class:`~kproxy.protocol.compression.Codec`)."""
        return self.attributes & CODEC_MASK

    @property
    def codec_name(self) -> str:
        return codec_name(self.codec)

    @property
    def timestamp_type(self) -> TimestampType:
        if self.magic == 0:
            return TimestampType.NO_TIMESTAMP_TYPE
        if self.attributes & _TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & _TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & _CONTROL_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        """v2 only: ``base_timestamp`` holds the delete horizon set by log compaction."""
        return self.magic >= 2 and bool(self.attributes & _DELETE_HORIZON_MASK)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


# ---------------------------------------------------------------- walking headers


class BatchIterator(Iterator[BatchInfo]):
    """Iterator over the entries of a records field; see :func:`iter_batches`.

    After it is exhausted, :attr:`truncated_tail` is the number of bytes at the
    end that do not form a complete entry (0 when the data ended cleanly) and
    :attr:`position` where that tail starts.
    """

    __slots__ = ("_allow_truncated_tail", "_buffer", "_done", "_end", "position", "truncated_tail")

    def __init__(self, data: BytesLike, start: int, end: int, allow_truncated_tail: bool) -> None:
        self._buffer = data
        self._end = end
        self._allow_truncated_tail = allow_truncated_tail
        self._done = False
        self.position = start
        self.truncated_tail = 0

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> BatchInfo:
        if self._done:
            raise StopIteration
        try:
            info = _read_entry_header(self._buffer, self.position, self._end)
        except CorruptRecordsError:
            self._done = True
            raise
        if info is None:
            self._done = True
            tail = self._end - self.position
            if tail and not self._allow_truncated_tail:
                raise CorruptRecordsError(f"truncated entry: {tail} trailing bytes", offset=self.position)
            self.truncated_tail = tail
            raise StopIteration
        self.position = info.end
        return info


def iter_batches(
    data: BytesLike, *, start: int = 0, end: int | None = None, allow_truncated_tail: bool = True
) -> BatchIterator:
    """Walk the entries (v2 batches and legacy messages, mixed) of ``data[start:end]``.

    Lazy and cheap: one struct read per entry, no CRC check, no decompression,
    no copy (each :class:`BatchInfo` refers to ``data``). Byte offsets (in
    BatchInfo and in errors) are positions in ``data``.

    A partial entry at the end stops iteration and is reported in the returned
    iterator's ``truncated_tail``; with ``allow_truncated_tail=False`` (Produce
    requests, where clients never truncate) it raises instead. Raises
    :class:`CorruptRecordsError` for a complete-looking entry that cannot be
    right: a negative or too-small size, an unknown magic, a negative v2
    ``records_count``.
    """
    stop = len(data) if end is None else end
    if not 0 <= start <= stop <= len(data):
        raise ValueError(f"bad bounds start={start} end={end} for {len(data)} bytes")
    return BatchIterator(data, start, stop, allow_truncated_tail)


def _read_entry_header(buf: BytesLike, pos: int, end: int) -> BatchInfo | None:
    """BatchInfo for the entry at ``pos``, or None when fewer bytes remain than it needs."""
    remaining = end - pos
    if remaining < LOG_OVERHEAD:
        return None
    (size,) = _INT32.unpack_from(buf, pos + 8)
    if size < _SMALLEST_ENTRY_SIZE:
        # Can't be a truncation artefact: the size field itself is complete.
        raise CorruptRecordsError(f"entry size {size} is below the minimum", offset=pos + 8, field="size")
    if size > remaining - LOG_OVERHEAD:
        return None
    length = LOG_OVERHEAD + size
    magic = buf[pos + MAGIC_AT]
    if magic == 2:
        if size < _V2_MIN_BATCH_LENGTH:
            raise CorruptRecordsError(
                f"batch_length {size} is below the v2 header size", offset=pos + 8, field="batch_length"
            )
        (
            base_offset,
            _,
            leader_epoch,
            _,
            crc,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        ) = _V2_HEADER.unpack_from(buf, pos)
        if count < 0:
            raise CorruptRecordsError(
                f"negative records_count {count}", offset=pos + V2_HEADER_SIZE - 4, field="records_count"
            )
        return BatchInfo(
            offset=pos,
            length=length,
            magic=2,
            attributes=attributes,
            crc=crc,
            base_offset=base_offset,
            last_offset_delta=last_offset_delta,
            record_count=count,
            partition_leader_epoch=leader_epoch,
            base_timestamp=base_timestamp,
            max_timestamp=max_timestamp,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            buffer=buf,
        )
    if magic in (0, 1):
        if size < _LEGACY_MIN_SIZE[magic]:
            raise CorruptRecordsError(
                f"message_size {size} is below the magic {magic} minimum",
                offset=pos + 8,
                field="message_size",
            )
        offset, _, crc, _, attributes = _LEGACY_HEADER.unpack_from(buf, pos)
        timestamp = _INT64.unpack_from(buf, pos + _LEGACY_HEADER.size)[0] if magic == 1 else -1
        count = 1 if attributes & CODEC_MASK == Codec.NONE else None
        return BatchInfo(
            offset=pos,
            length=length,
            magic=magic,
            attributes=attributes,
            crc=crc,
            base_offset=offset,
            last_offset_delta=0,
            record_count=count,
            partition_leader_epoch=-1,
            base_timestamp=timestamp,
            max_timestamp=timestamp,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            buffer=buf,
        )
    raise CorruptRecordsError(f"unknown magic {magic}", offset=pos + MAGIC_AT, field="magic")


# ------------------------------------------------------------------------- CRC


def compute_crc(batch: BatchInfo) -> int:
    """The CRC the entry's bytes actually have (CRC-32C for v2, CRC-32 for v0/v1)."""
    view = memoryview(batch.buffer)
    if batch.magic >= 2:
        return crc32c(view[batch.offset + ATTRIBUTES_AT : batch.end])
    return zlib.crc32(view[batch.offset + _LEGACY_MAGIC_POS : batch.end])


def verify_crc(batch: BatchInfo) -> None:
    """Raise :class:`CorruptRecordsError` if the entry's stored CRC does not match its bytes.

    For a compressed legacy wrapper this checks the wrapper only; the inner
    messages are checked by :func:`decode_records` (``check_crc=True``).
    """
    actual = compute_crc(batch)
    if actual != batch.crc:
        where = CRC_AT if batch.magic >= 2 else _LEGACY_CRC_POS
        raise CorruptRecordsError(
            f"CRC mismatch: stored 0x{batch.crc:08x}, computed 0x{actual:08x}",
            offset=batch.offset + where,
            field="crc",
        )
