"""Counting the records of a records field, cheaply, within a frame's :class:`RecordBudget`."""

from __future__ import annotations

import struct
from typing import Final

from kproxy.protocol.compression import DEFAULT_MAX_DECOMPRESSED
from kproxy.protocol.errors import OverBudgetError
from kproxy.protocol.records.batch_layout import (
    BATCH_LENGTH_AT,
    CODEC_MASK,
    MAGIC_AT,
    MAX_TIMESTAMP_AT,
    RECORDS_COUNT_AT,
    V2_HEADER_SIZE,
    header_struct,
)
from kproxy.protocol.records.budget import RecordBudget
from kproxy.protocol.records.entries import (
    _LEGACY_MIN_SIZE,
    LOG_OVERHEAD,
    BatchInfo,
    BytesLike,
    iter_batches,
)
from kproxy.protocol.records.messageset import _inner_entries, _wrapper_payload

_V2_LENGTH_MAGIC: Final = header_struct("batch_length", "magic")  # at BATCH_LENGTH_AT
_V2_COUNT: Final = header_struct("records_count")  # at RECORDS_COUNT_AT
_V2_FAST_MIN: Final = V2_HEADER_SIZE


def count_records(
    data: BytesLike, *, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED, budget: RecordBudget | None = None
) -> int:
    """Number of records in a records field; a truncated tail is not counted.

    v2 batches are counted from their headers without decompression. A
    compressed legacy wrapper has no count in its header, so its value is
    decompressed (within ``max_decompressed``) and the inner messages' headers
    are walked.

    With a ``budget`` (see :mod:`kproxy.protocol.records.budget`: counting is
    charged the decompressed bytes, which bound the walk too, an inner message
    being at least 26 bytes), a wrapper whose value does not decompress within
    what is left of it (too big for it, or not decompressible at all) is not
    paid for: the count stops before it, ``budget.exhausted`` is set and the
    records counted so far are returned. Without one, only ``max_decompressed``
    per wrapper bounds the work: for offline tools, never the data path.
    """
    # Fast path for the usual case, v2 batches only: three fields per batch, no objects built.
    total = 0
    pos = 0
    end = len(data)
    while end - pos >= _V2_FAST_MIN:
        batch_length, magic = _V2_LENGTH_MAGIC.unpack_from(data, pos + BATCH_LENGTH_AT)
        if magic != 2 or batch_length < _V2_FAST_MIN - 12 or pos + 12 + batch_length > end:
            break  # legacy, malformed or truncated: the general walk below decides
        count = _V2_COUNT.unpack_from(data, pos + RECORDS_COUNT_AT)[0]
        if count < 0:
            break  # malformed: the general walk refuses it (a count is never negative)
        total += count
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


def one_batch_count(data: BytesLike, start: int, end: int) -> int | None:
    """The record count in the header of ``data[start:end]`` when that range is exactly one v2
    batch (what a producer sends per partition), read in place: what :func:`count_records` of the
    range returns, without slicing it. None for any other range (:func:`count_records` decides)."""
    if end - start >= _V2_FAST_MIN:
        batch_length, magic = _V2_LENGTH_MAGIC.unpack_from(data, start + BATCH_LENGTH_AT)
        if magic == 2 and start + 12 + batch_length == end:
            count = int(_V2_COUNT.unpack_from(data, start + RECORDS_COUNT_AT)[0])
            return count if count >= 0 else None
    return None


_V2_LENGTH_MAGIC_ATTRIBUTES: Final = header_struct("batch_length", "magic", "attributes")  # at BATCH_LENGTH_AT


def v2_totals(data: BytesLike, start: int, end: int) -> tuple[int, int, int]:
    """``(records, bytes, stop)`` of the whole v2 batches that open ``data[start:end]``, from their
    headers alone, read in place: records as their ``records_count`` fields say, bytes as the
    batches take on the wire. ``stop`` is where the walk ended: ``end`` when the range was whole v2
    batches; otherwise where a legacy entry, a malformed one or a truncated tail (a broker cuts
    Fetch responses at the byte limit) starts, which the caller may hand to :func:`count_records`."""
    records = 0
    pos = start
    unpack = _V2_LENGTH_MAGIC.unpack_from
    count = _V2_COUNT.unpack_from
    while end - pos >= _V2_FAST_MIN:
        batch_length, magic = unpack(data, pos + BATCH_LENGTH_AT)
        if magic != 2 or batch_length < _V2_FAST_MIN - 12 or pos + 12 + batch_length > end:
            break
        n = count(data, pos + RECORDS_COUNT_AT)[0]
        if n < 0:
            break  # malformed: left to the caller (count_records refuses it)
        records += n
        pos += 12 + batch_length
    return records, pos - start, pos


_V2_MAX_TIMESTAMP: Final = header_struct("max_timestamp")  # at MAX_TIMESTAMP_AT


def v2_max_timestamp(data: BytesLike, start: int, end: int) -> int:
    """The latest ``maxTimestamp`` (milliseconds since the epoch) of the whole v2 batches that open
    ``data[start:end]``, read in place from their headers (no record touched, nothing decompressed);
    -1 when the range opens with no v2 batch (a legacy message set, a truncated or malformed header)."""
    latest = -1
    pos = start
    unpack = _V2_LENGTH_MAGIC.unpack_from
    timestamp = _V2_MAX_TIMESTAMP.unpack_from
    while end - pos >= _V2_FAST_MIN:
        batch_length, magic = unpack(data, pos + BATCH_LENGTH_AT)
        if magic != 2 or batch_length < _V2_FAST_MIN - 12 or pos + 12 + batch_length > end:
            break
        t = int(timestamp(data, pos + MAX_TIMESTAMP_AT)[0])
        if t > latest:
            latest = t
        pos += 12 + batch_length
    return latest


_V2_DATED: Final = header_struct("base_offset", "batch_length", "magic", "last_offset_delta", "max_timestamp",
                                 "records_count")  # a whole header, from its first byte


def v2_dated(data: BytesLike, start: int, end: int, out: list[tuple[int, int, int]]) -> tuple[int, int]:
    """Append ``(base offset, last offset, max timestamp)`` of each whole v2 batch that opens
    ``data[start:end]`` to ``out``, read in place, one read of each header (when its records were
    written: :func:`kproxy.protocol.offset_reads.batches_written`); returns ``(records, stop)``, its
    records and where counting them stopped, as :func:`v2_totals` gives them (a negative
    ``records_count`` stops the count, not the dates), for :func:`count_records` to go on from."""
    records = 0
    counted = -1  # where the count stopped, while it has not
    pos = start
    unpack = _V2_DATED.unpack_from
    header = _V2_FAST_MIN
    # (typed: compiled, the arithmetic is then on native ints)
    base: int
    batch_length: int
    magic: int
    delta: int
    stamp: int
    n: int
    while end - pos >= header:
        base, batch_length, magic, delta, stamp, n = unpack(data, pos)
        if magic != 2 or batch_length < header - 12 or pos + 12 + batch_length > end:
            break
        out.append((base, base + delta, stamp))
        if counted < 0:
            if n < 0:
                counted = pos
            else:
                records += n
        pos += 12 + batch_length
    return records, pos if counted < 0 else counted


def v2_batches(data: BytesLike, start: int, end: int, out: list[tuple[int, int, int]]) -> int:
    """Append ``(bytes, codec, records)`` of each whole v2 batch that opens ``data[start:end]`` to
    ``out`` (the codec is the low 3 bits of the batch's attributes, ``Codec``), read in place from
    the headers; returns where the walk stopped, as :func:`v2_totals` does."""
    pos = start
    unpack = _V2_LENGTH_MAGIC_ATTRIBUTES.unpack_from
    count = _V2_COUNT.unpack_from
    while end - pos >= _V2_FAST_MIN:
        batch_length, magic, attributes = unpack(data, pos + BATCH_LENGTH_AT)
        if magic != 2 or batch_length < _V2_FAST_MIN - 12 or pos + 12 + batch_length > end:
            break
        n = count(data, pos + RECORDS_COUNT_AT)[0]
        if n < 0:
            break  # malformed: left to the caller (count_records refuses it)
        out.append((12 + batch_length, attributes & CODEC_MASK, n))
        pos += 12 + batch_length
    return pos


_V2_PRODUCER_HEAD: Final = header_struct("magic", "crc", "attributes", "producer_id", "producer_epoch",
                                         "base_sequence")  # at MAGIC_AT


def v2_producer_head(data: BytesLike, start: int, end: int) -> tuple[int, int, int, int, int] | None:
    """``(producer id, producer epoch, base sequence, CRC, codec)`` of the v2 batch that opens
    ``data[start:end]``, read in place from its header (the codec: the low 3 bits of its attributes,
    ``Codec``); None when the range opens with no v2 batch header (a legacy message set, too short).
    The first batch only, as the live detectors read a Produce request's range (a producer's batch)."""
    if end - start < _V2_FAST_MIN:
        return None
    magic, crc, attributes, producer, epoch, sequence = _V2_PRODUCER_HEAD.unpack_from(data, start + MAGIC_AT)
    if magic != 2:
        return None
    return producer, epoch, sequence, crc, attributes & CODEC_MASK


def one_batch_header(data: BytesLike, start: int, end: int) -> tuple[int, int, int] | None:
    """``(bytes, codec, records)`` of ``data[start:end]`` when that range is exactly one v2 batch
    (what a producer sends per partition), read in place: what :func:`v2_batches` gives for it in
    one call. None for any other range (the walk decides)."""
    if end - start >= _V2_FAST_MIN:
        batch_length, magic, attributes = _V2_LENGTH_MAGIC_ATTRIBUTES.unpack_from(data, start + BATCH_LENGTH_AT)
        if magic == 2 and start + 12 + batch_length == end and batch_length >= _V2_FAST_MIN - 12:
            count = int(_V2_COUNT.unpack_from(data, start + RECORDS_COUNT_AT)[0])
            if count >= 0:
                return end - start, attributes & CODEC_MASK, count
    return None


_LEGACY_SIZE_MAGIC_ATTRIBUTES: Final = struct.Struct(">i4xbb")  # message_size, (crc), magic, attributes


def _count_wrapper(batch: BatchInfo, max_decompressed: int, budget: RecordBudget | None) -> int | None:
    """Inner messages of one compressed legacy wrapper; None when ``budget`` ran out."""
    try:
        data, pos, end, reader = _wrapper_payload(batch, max_decompressed, budget)
    except OverBudgetError:
        return None
    # Fast walk: message sizes only, for data that is well-formed. Anything odd goes
    # to the full walk, which names the problem exactly as decoding would.
    count = 0
    minimum = _LEGACY_MIN_SIZE[batch.magic]
    unpack = _LEGACY_SIZE_MAGIC_ATTRIBUTES.unpack_from
    while end - pos >= LOG_OVERHEAD + minimum:
        size, magic, attributes = unpack(data, pos + BATCH_LENGTH_AT)
        if size < minimum or size > end - pos - LOG_OVERHEAD or magic != batch.magic or attributes & CODEC_MASK:
            break
        pos += LOG_OVERHEAD + size
        count += 1
    if pos == end:
        return count
    return count + sum(1 for _ in _inner_entries(batch, data, pos, end, reader))
