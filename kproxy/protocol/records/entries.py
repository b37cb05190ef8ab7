"""Kafka record data: RecordBatch v2 (magic 2) and legacy MessageSets (magic 0 and 1).

A ``records`` field (Produce requests, Fetch responses, ...) holds a sequence of
*entries*. Every entry, whatever its magic, starts with the same 17 bytes, which
is what lets one walker handle mixed magics::

    offset  int64   base offset (v2) / message offset (v0, v1)
    size    int32   bytes that follow this field (batchLength / messageSize)
    ....    4 bytes partitionLeaderEpoch (v2) / crc (v0, v1)
    magic   int8    0, 1 or 2

RecordBatch v2 header (61 bytes), then the records, compressed as a whole::

    base_offset int64, batch_length int32, partition_leader_epoch int32, magic int8,
    crc uint32 (CRC-32C of everything from attributes to the end of the batch),
    attributes int16, last_offset_delta int32, base_timestamp int64, max_timestamp int64,
    producer_id int64, producer_epoch int16, base_sequence int32, records_count int32

    Record: length varint, attributes int8, timestamp_delta varlong, offset_delta varint,
            key_length varint (-1 = null) + key, value_length varint (-1 = null) + value,
            headers_count varint, then per header: key_length varint + key (UTF-8, never
            null), value_length varint (-1 = null) + value.   (varints are zig-zag)

Legacy message (v0/v1), after the 12-byte offset/size prefix::

    crc uint32 (CRC-32 of magic..end), magic int8, attributes int8,
    timestamp int64 (magic 1 only), key int32-length bytes, value int32-length bytes

    A compressed legacy message is a *wrapper*: its value is a compressed inner
    message set. For magic 1, inner offsets are relative and the wrapper carries the
    absolute offset of the *last* inner message; for magic 0 inner offsets are absolute.

What this module offers
-----------------------
* :func:`iter_batches` - lazy and cheap: reads only each entry's header (no CRC
  check, no decompression) and yields a :class:`BatchInfo`. A partial entry at the
  end (a broker cuts Fetch responses at the byte limit) ends iteration cleanly and
  is reported as :attr:`BatchIterator.truncated_tail`; it is not an error.
* :func:`verify_crc`, :func:`decode_records`, :func:`decode_all` - the expensive part,
  on demand.
* :func:`count_records` - records in a records field from the v2 headers alone.
* :func:`encode_batch_v2`, :func:`encode_message_set` - encoders for tests and
  fault injection, with correct lengths and CRCs.

Error contract: malformed input raises :class:`CorruptRecordsError` (a
:class:`DecodeError`) whose ``offset`` is a byte offset into the buffer the caller
passed (for a problem inside compressed records: the start of the compressed
payload, with the position in the decompressed bytes named in the reason).
Nothing allocates based on a length before checking it against the bytes
actually present, and decompression is capped by ``max_decompressed``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final, NamedTuple

from crc32c import crc32c

from kproxy.protocol.compression import DEFAULT_MAX_DECOMPRESSED, Codec, codec_name, compress, decompress
from kproxy.protocol.errors import CorruptRecordsError, EncodeError

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED",
    "LOG_OVERHEAD",
    "V2_HEADER_SIZE",
    "BatchInfo",
    "BatchIterator",
    "CountBudget",
    "Record",
    "TimestampType",
    "compute_crc",
    "count_records",
    "decode_all",
    "decode_records",
    "encode_batch_v2",
    "encode_message_set",
    "iter_batches",
    "verify_crc",
]

BytesLike = bytes | bytearray | memoryview
Header = tuple[str, bytes | None]

# ----------------------------------------------------------------------- layouts

#: offset int64 + size int32: the prefix every entry shares.
LOG_OVERHEAD: Final = 12
_V2_HEADER: Final = struct.Struct(">qiibIhiqqqhii")
#: Size of the RecordBatch v2 header, up to and including records_count.
V2_HEADER_SIZE: Final = _V2_HEADER.size  # 61
_MAGIC_POS: Final = 16  # same position for every magic, see the module docstring
_V2_CRC_POS: Final = 17
_V2_ATTRIBUTES_POS: Final = 21  # the CRC-32C covers from here to the end
_V2_MIN_BATCH_LENGTH: Final = V2_HEADER_SIZE - LOG_OVERHEAD  # 49

# offset, message_size, crc, magic, attributes (+ timestamp int64 for magic 1)
_LEGACY_HEADER: Final = struct.Struct(">qiIbb")
_LEGACY_CRC_POS: Final = 12
_LEGACY_MAGIC_POS: Final = 16  # the CRC-32 covers from here to the end
# crc + magic + attributes + key length + value length (+ 8 for the v1 timestamp)
_LEGACY_MIN_SIZE: Final = {0: 14, 1: 22}
_SMALLEST_ENTRY_SIZE: Final = 14

_CODEC_MASK: Final = 0x07
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
        return self.attributes & _CODEC_MASK

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
    magic = buf[pos + _MAGIC_POS]
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
        count = 1 if attributes & _CODEC_MASK == Codec.NONE else None
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
    raise CorruptRecordsError(f"unknown magic {magic}", offset=pos + _MAGIC_POS, field="magic")


# ------------------------------------------------------------------------- CRC


def compute_crc(batch: BatchInfo) -> int:
    """The CRC the entry's bytes actually have (CRC-32C for v2, CRC-32 for v0/v1)."""
    view = memoryview(batch.buffer)
    if batch.magic >= 2:
        return crc32c(view[batch.offset + _V2_ATTRIBUTES_POS : batch.end])
    return zlib.crc32(view[batch.offset + _LEGACY_MAGIC_POS : batch.end])


def verify_crc(batch: BatchInfo) -> None:
    """Raise :class:`CorruptRecordsError` if the entry's stored CRC does not match its bytes.

    For a compressed legacy wrapper this checks the wrapper only; the inner
    messages are checked by :func:`decode_records` (``check_crc=True``).
    """
    actual = compute_crc(batch)
    if actual != batch.crc:
        where = _V2_CRC_POS if batch.magic >= 2 else _LEGACY_CRC_POS
        raise CorruptRecordsError(
            f"CRC mismatch: stored 0x{batch.crc:08x}, computed 0x{actual:08x}",
            offset=batch.offset + where,
            field="crc",
        )


# --------------------------------------------------------------------- decoding


def decode_records(
    batch: BatchInfo, *, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED, check_crc: bool = True
) -> list[Record]:
    """Every record of one entry, decompressing if needed.

    ``max_decompressed`` caps the decompressed size of the entry's records
    (memory stays bounded by it, see :mod:`kproxy.protocol.compression`).
    ``check_crc`` verifies the CRC first (and the inner messages' CRCs of a
    legacy wrapper), as Kafka's consumer does by default.

    Raises :class:`CorruptRecordsError` for any inconsistency: wrong CRC, bad
    compression, a record running past its length or the batch, a count that
    does not match, bytes left over, bad varints, invalid UTF-8 in a header key.
    """
    if check_crc:
        verify_crc(batch)
    if batch.magic >= 2:
        return _decode_v2(batch, max_decompressed)
    return _decode_legacy(batch, max_decompressed, check_crc)


def decode_all(
    data: BytesLike, *, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED, check_crc: bool = True
) -> list[Record]:
    """Records of every complete entry in ``data`` (a truncated tail is ignored, as Kafka does)."""
    out: list[Record] = []
    for batch in iter_batches(data):
        out.extend(decode_records(batch, max_decompressed=max_decompressed, check_crc=check_crc))
    return out


_V2_LENGTH_MAGIC = struct.Struct(">i4xb")  # batchLength, (partitionLeaderEpoch), magic
_V2_COUNT = struct.Struct(">i")  # recordsCount, at byte 57 of a v2 batch
_V2_FAST_MIN = 61  # a v2 batch header


class CountBudget:
    """How much decompressed data :func:`count_records` may still produce, in bytes.

    v2 batches carry their record count in the header; a compressed legacy
    (magic 0/1) wrapper does not, so counting it means decompressing its value
    and walking every inner message header. Gzip shrinks a run of identical
    26-byte messages about a thousand-fold: 160 KB on the wire are 2.5 million
    messages to walk, seconds of CPU. A budget shared by every records field of
    one frame bounds what the frame can cost, however many wrappers it packs
    (an inner message is at least 26 bytes, so bytes bound the walk too).

    ``exhausted`` is set when a wrapper did not fit in what was left: the count
    stopped there and is incomplete.
    """

    __slots__ = ("exhausted", "remaining")

    def __init__(self, decompressed_bytes: int) -> None:
        self.remaining = decompressed_bytes
        self.exhausted = False


def count_records(
    data: BytesLike, *, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED, budget: CountBudget | None = None
) -> int:
    """Number of records in a records field; a truncated tail is not counted.

    v2 batches are counted from their headers without decompression. A
    compressed legacy wrapper has no count in its header, so its value is
    decompressed (within ``max_decompressed``) and the inner messages' headers
    are walked.

    With a ``budget``, a wrapper whose value does not decompress within what is
    left of it (too big for it, or not decompressible at all) is not paid for:
    the count stops before it, ``budget.exhausted`` is set and the records
    counted so far are returned. Without one, as before: only
    ``max_decompressed`` per wrapper bounds the work.
    """
    # Fast path for the usual case, v2 batches only: three fields per batch, no objects built.
    total = 0
    pos = 0
    end = len(data)
    while end - pos >= _V2_FAST_MIN:
        batch_length, magic = _V2_LENGTH_MAGIC.unpack_from(data, pos + 8)
        if magic != 2 or batch_length < _V2_FAST_MIN - 12 or pos + 12 + batch_length > end:
            break  # legacy, malformed or truncated: the general walk below decides
        total += _V2_COUNT.unpack_from(data, pos + 57)[0]
        pos += 12 + batch_length
    if pos >= end or end - pos < 12:
        return total
    for batch in iter_batches(data, start=pos):
        if batch.record_count is not None:
            total += batch.record_count
            continue
        inner = _count_wrapper(batch, max_decompressed, budget)
        if inner is None:
            return total
        total += inner
    return total


_LEGACY_SIZE_MAGIC_ATTRIBUTES: Final = struct.Struct(">i4xbb")  # message_size, (crc), magic, attributes


def _count_wrapper(batch: BatchInfo, max_decompressed: int, budget: CountBudget | None) -> int | None:
    """Inner messages of one compressed legacy wrapper; None when ``budget`` ran out."""
    limit = max_decompressed if budget is None else min(max_decompressed, budget.remaining)
    try:
        data, pos, end, reader = _wrapper_payload(batch, limit)
    except CorruptRecordsError:
        if budget is None or limit == max_decompressed:
            raise
        budget.remaining = 0  # too big for what was left, or not valid: either way, not paid for
        budget.exhausted = True
        return None
    if budget is not None:
        budget.remaining -= end - pos
    # Fast walk: message sizes only, for data that is well-formed. Anything odd goes
    # to the full walk, which names the problem exactly as decoding would.
    count = 0
    minimum = _LEGACY_MIN_SIZE[batch.magic]
    unpack = _LEGACY_SIZE_MAGIC_ATTRIBUTES.unpack_from
    while end - pos >= LOG_OVERHEAD + minimum:
        size, magic, attributes = unpack(data, pos + 8)
        if size < minimum or size > end - pos - LOG_OVERHEAD or magic != batch.magic or attributes & _CODEC_MASK:
            break
        pos += LOG_OVERHEAD + size
        count += 1
    if pos == end:
        return count
    return count + sum(1 for _ in _inner_entries(batch, data, pos, end, reader))


class _Reader:
    """Error context for parsing a buffer that may be a decompressed copy.

    Parsers raise with offsets into the buffer they read; when that buffer is
    decompressed data, :meth:`relocate` turns the error into one pointing at
    the compressed payload in the caller's buffer.
    """

    __slots__ = ("compressed_at",)

    def __init__(self, compressed_at: int | None) -> None:
        self.compressed_at = compressed_at

    def relocate(self, exc: CorruptRecordsError) -> CorruptRecordsError:
        if self.compressed_at is None:
            return exc
        return CorruptRecordsError(
            f"{exc.reason} (at byte {exc.offset} of the decompressed records)",
            offset=self.compressed_at,
            field=exc.field,
        )


def _payload(
    batch: BatchInfo, start: int, stop: int, max_decompressed: int, *, lz4_legacy_header: bool = False
) -> tuple[BytesLike, int, int, _Reader]:
    """The (possibly decompressed) bytes at ``buffer[start:stop]`` and their bounds."""
    codec = batch.codec
    if codec == Codec.NONE:
        return batch.buffer, start, stop, _Reader(None)
    if codec > Codec.ZSTD or (codec == Codec.ZSTD and batch.magic < 2):
        # Kafka never allowed zstd in legacy messages (it came with KIP-110, magic 2).
        raise CorruptRecordsError(
            f"compression codec {codec_name(codec)} is not valid with magic {batch.magic}",
            offset=batch.offset + (_V2_ATTRIBUTES_POS if batch.magic >= 2 else _LEGACY_MAGIC_POS + 1),
            field="attributes",
        )
    try:
        data = decompress(
            codec,
            memoryview(batch.buffer)[start:stop],
            max_size=max_decompressed,
            lz4_legacy_header=lz4_legacy_header,
        )
    except CorruptRecordsError as exc:
        raise CorruptRecordsError(exc.reason, offset=start + (exc.offset or 0), field="records") from exc
    return data, 0, len(data), _Reader(start)


def _decode_v2(batch: BatchInfo, max_decompressed: int) -> list[Record]:
    data, pos, end, reader = _payload(batch, batch.offset + V2_HEADER_SIZE, batch.end, max_decompressed)
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


def _inner_messages(batch: BatchInfo, max_decompressed: int) -> Iterator[tuple[BatchInfo, _Reader]]:
    """The inner messages of a compressed legacy wrapper (header level), with error context."""
    data, pos, end, reader = _wrapper_payload(batch, max_decompressed)
    return _inner_entries(batch, data, pos, end, reader)


def _wrapper_payload(batch: BatchInfo, max_decompressed: int) -> tuple[BytesLike, int, int, _Reader]:
    """The decompressed value of a compressed legacy wrapper."""
    wrapper = _parse_message(batch.buffer, batch.offset, batch.end)
    if wrapper.value_start < 0:
        raise CorruptRecordsError("compressed message has a null value", offset=batch.offset, field="value")
    return _payload(
        batch, wrapper.value_start, wrapper.value_end, max_decompressed, lz4_legacy_header=batch.magic == 0
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
                    offset=info.offset + _MAGIC_POS,
                    field="magic",
                )
            if info.codec != Codec.NONE:
                raise CorruptRecordsError(
                    "nested compression in a legacy message set", offset=info.offset, field="attributes"
                )
        except CorruptRecordsError as exc:
            raise reader.relocate(exc) from exc
        yield info, reader


def _decode_legacy(batch: BatchInfo, max_decompressed: int, check_crc: bool) -> list[Record]:
    if batch.codec == Codec.NONE:
        msg = _parse_message(batch.buffer, batch.offset, batch.end)
        value = None if msg.value_start < 0 else bytes(batch.buffer[msg.value_start : msg.value_end])
        return [Record(msg.offset, msg.timestamp, msg.key, value, [])]
    messages: list[_Message] = []
    inner_buffer: BytesLike = b""
    for info, reader in _inner_messages(batch, max_decompressed):
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


# ----------------------------------------------------------------- primitives


def _read_int32_bytes(buf: BytesLike, p: int, end: int, name: str) -> tuple[int, int, int]:
    """(start, end, next) of int32-length-prefixed bytes; start -1 for null."""
    if end - p < 4:
        raise CorruptRecordsError(f"truncated {name} length", offset=p, field=name)
    (n,) = _INT32.unpack_from(buf, p)
    p += 4
    if n == -1:
        return -1, -1, p
    if n < 0 or n > end - p:
        raise CorruptRecordsError(
            f"{name} length {n} outside the {end - p} bytes left", offset=p - 4, field=name
        )
    return p, p + n, p + n


def _read_uvarint(buf: BytesLike, pos: int, end: int, bits: int, name: str) -> tuple[int, int]:
    """An unsigned LEB128 value of at most ``bits`` bits: (value, next position).

    Kafka's varints are 32-bit, its varlongs 64-bit, hence at most 5 and 10
    bytes; those carry 35 and 70 bits, so the excess top bits must be zero.
    """
    max_bytes = (bits + 6) // 7
    result = 0
    shift = 0
    p = pos
    for _ in range(max_bytes):
        if p >= end:
            raise CorruptRecordsError(f"truncated {name} varint", offset=pos, field=name)
        b = buf[p]
        p += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >> bits:
                raise CorruptRecordsError(f"{name} varint out of range", offset=pos, field=name)
            return result, p
        shift += 7
    raise CorruptRecordsError(f"{name} varint longer than {max_bytes} bytes", offset=pos, field=name)


def _read_varint(buf: BytesLike, pos: int, end: int, name: str) -> tuple[int, int]:
    """A zig-zag varint (int32) at ``pos``: (value, next position)."""
    if pos < end:
        b = buf[pos]
        if b < 0x80:  # the common one-byte case, without the loop
            return (b >> 1) ^ -(b & 1), pos + 1
    u, p = _read_uvarint(buf, pos, end, 32, name)
    return (u >> 1) ^ -(u & 1), p


def _read_varlong(buf: BytesLike, pos: int, end: int, name: str) -> tuple[int, int]:
    """A zig-zag varlong (int64) at ``pos``: (value, next position)."""
    u, p = _read_uvarint(buf, pos, end, 64, name)
    return (u >> 1) ^ -(u & 1), p


def _read_varint_bytes(buf: BytesLike, pos: int, end: int, name: str) -> tuple[bytes | None, int]:
    n, p = _read_varint(buf, pos, end, name)
    if n == -1:
        return None, p
    if n < 0 or n > end - p:
        raise CorruptRecordsError(
            f"{name} length {n} outside the {end - p} bytes left", offset=pos, field=name
        )
    return bytes(buf[p : p + n]), p + n


def _write_uvarint(out: bytearray, u: int) -> None:
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)


def _write_varint(out: bytearray, v: int) -> None:
    # Zig-zag: small magnitudes of either sign get short encodings. (v >> 63) is
    # 0 or -1 for any value in int64 range, so this serves varint and varlong.
    _write_uvarint(out, (v << 1) ^ (v >> 63))


def _write_varint_bytes(out: bytearray, data: BytesLike | None) -> None:
    if data is None:
        _write_varint(out, -1)
        return
    _write_varint(out, len(data))
    out += data


# ---------------------------------------------------------------------- encoding


def _check_range(value: int, low: int, high: int, name: str) -> None:
    if not isinstance(value, int) or not low <= value <= high:
        raise EncodeError(f"{name}={value!r} outside [{low}, {high}]", field=name)


def _check_bytes(value: object, name: str) -> None:
    if value is not None and not isinstance(value, bytes | bytearray | memoryview):
        raise EncodeError(f"{name} must be bytes or None, not {type(value).__name__}", field=name)


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
    _check_range(codec, 0, _CODEC_MASK, "codec")
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
        _write_varint(record, timestamp_delta)
        _write_varint(record, offset_delta)
        _write_varint_bytes(record, rec.key)
        _write_varint_bytes(record, rec.value)
        _write_varint(record, len(rec.headers))
        for h, (header_key, header_value) in enumerate(rec.headers):
            if not isinstance(header_key, str):
                raise EncodeError("header key must be str", field=f"{where}.headers[{h}].key")
            _check_bytes(header_value, f"{where}.headers[{h}].value")
            _write_varint_bytes(record, header_key.encode("utf-8"))
            _write_varint_bytes(record, header_value)
        _write_varint(body, len(record))
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
    _UINT32.pack_into(out, _V2_CRC_POS, crc32c(memoryview(out)[_V2_ATTRIBUTES_POS:]))
    return bytes(out)


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
