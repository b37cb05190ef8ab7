"""Counting the records of a records field, cheaply, within a frame's :class:`RecordBudget`."""

from __future__ import annotations

import struct
from typing import Final

from librt.strings import read_i16_be, read_i32_be, read_i64_be

from kproxy.protocol.compression import DEFAULT_MAX_DECOMPRESSED
from kproxy.protocol.errors import OverBudgetError
from kproxy.protocol.records.batch_layout import (
    ATTRIBUTES_AT,
    BASE_OFFSET_AT,
    BASE_SEQUENCE_AT,
    BATCH_LENGTH_AT,
    CODEC_MASK,
    CRC_AT,
    LAST_OFFSET_DELTA_AT,
    MAGIC_AT,
    MAX_TIMESTAMP_AT,
    PRODUCER_EPOCH_AT,
    PRODUCER_ID_AT,
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


# The v2 header readers below take ``bytes`` (a frame as the proxy reads it) and read each field
# with librt's in-place reads, which mypyc compiles to a load: per frame they run several times,
# where a struct read costs a method call and a tuple. The range they are given lies within
# ``data``; they read no field past ``end`` (each checks a whole header is there first).


def one_batch_count(data: bytes, start: int, end: int) -> int | None:
    """The record count in the header of ``data[start:end]`` when that range is exactly one v2
    batch (what a producer sends per partition), read in place: what :func:`count_records` of the
    range returns, without slicing it. None for any other range (:func:`count_records` decides)."""
    if end - start >= _V2_FAST_MIN:
        batch_length: int = read_i32_be(data, start + BATCH_LENGTH_AT)
        if data[start + MAGIC_AT] == 2 and start + 12 + batch_length == end:
            count: int = read_i32_be(data, start + RECORDS_COUNT_AT)
            return count if count >= 0 else None
    return None


def v2_totals(data: bytes, start: int, end: int) -> tuple[int, int, int]:
    """``(records, bytes, stop)`` of the whole v2 batches that open ``data[start:end]``, from their
    headers alone, read in place: records as their ``records_count`` fields say, bytes as the
    batches take on the wire. ``stop`` is where the walk ended: ``end`` when the range was whole v2
    batches; otherwise where a legacy entry, a malformed one or a truncated tail (a broker cuts
    Fetch responses at the byte limit) starts, which the caller may hand to :func:`count_records`."""
    records = 0
    pos = start
    while end - pos >= _V2_FAST_MIN:
        batch_length: int = read_i32_be(data, pos + BATCH_LENGTH_AT)
        if data[pos + MAGIC_AT] != 2 or batch_length < _V2_FAST_MIN - 12 or pos + 12 + batch_length > end:
            break
        n: int = read_i32_be(data, pos + RECORDS_COUNT_AT)
        if n < 0:
            break  # malformed: left to the caller (count_records refuses it)
        records += n
        pos += 12 + batch_length
    return records, pos - start, pos


def v2_max_timestamp(data: bytes, start: int, end: int) -> int:
    """The latest ``maxTimestamp`` (milliseconds since the epoch) of the whole v2 batches that open
    ``data[start:end]``, read in place from their headers (no record touched, nothing decompressed);
    -1 when the range opens with no v2 batch (a legacy message set, a truncated or malformed header)."""
    latest = -1
    pos = start
    while end - pos >= _V2_FAST_MIN:
        batch_length: int = read_i32_be(data, pos + BATCH_LENGTH_AT)
        if data[pos + MAGIC_AT] != 2 or batch_length < _V2_FAST_MIN - 12 or pos + 12 + batch_length > end:
            break
        t: int = read_i64_be(data, pos + MAX_TIMESTAMP_AT)
        if t > latest:
            latest = t
        pos += 12 + batch_length
    return latest


def v2_dated(data: bytes, start: int, end: int, out: list[tuple[int, int, int]]) -> tuple[int, int]:
    """Append ``(base offset, last offset, max timestamp)`` of each whole v2 batch that opens
    ``data[start:end]`` to ``out``, read in place, one read of each header (when its records were
    written: :func:`kproxy.protocol.offset_reads.batches_written`); returns ``(records, stop)``, its
    records and where counting them stopped, as :func:`v2_totals` gives them (a negative
    ``records_count`` stops the count, not the dates), for :func:`count_records` to go on from."""
    records = 0
    counted = -1  # where the count stopped, while it has not
    pos = start
    while end - pos >= _V2_FAST_MIN:
        batch_length: int = read_i32_be(data, pos + BATCH_LENGTH_AT)
        if data[pos + MAGIC_AT] != 2 or batch_length < _V2_FAST_MIN - 12 or pos + 12 + batch_length > end:
            break
        base: int = read_i64_be(data, pos + BASE_OFFSET_AT)
        delta: int = read_i32_be(data, pos + LAST_OFFSET_DELTA_AT)
        stamp: int = read_i64_be(data, pos + MAX_TIMESTAMP_AT)
        out.append((base, base + delta, stamp))
        if counted < 0:
            n: int = read_i32_be(data, pos + RECORDS_COUNT_AT)
            if n < 0:
                counted = pos
            else:
                records += n
        pos += 12 + batch_length
    return records, pos if counted < 0 else counted


def v2_batches(data: bytes, start: int, end: int, out: list[tuple[int, int, int]]) -> int:
    """Append ``(bytes, codec, records)`` of each whole v2 batch that opens ``data[start:end]`` to
    ``out`` (the codec is the low 3 bits of the batch's attributes, ``Codec``), read in place from
    the headers; returns where the walk stopped, as :func:`v2_totals` does."""
    pos = start
    while end - pos >= _V2_FAST_MIN:
        batch_length: int = read_i32_be(data, pos + BATCH_LENGTH_AT)
        if data[pos + MAGIC_AT] != 2 or batch_length < _V2_FAST_MIN - 12 or pos + 12 + batch_length > end:
            break
        n: int = read_i32_be(data, pos + RECORDS_COUNT_AT)
        if n < 0:
            break  # malformed: left to the caller (count_records refuses it)
        out.append((12 + batch_length, data[pos + ATTRIBUTES_AT + 1] & CODEC_MASK, n))
        pos += 12 + batch_length
    return pos


def v2_producer_head(data: bytes, start: int, end: int) -> tuple[int, int, int, int, int] | None:
    """``(producer id, producer epoch, base sequence, CRC, codec)`` of the v2 batch that opens
    ``data[start:end]``, read in place from its header (the codec: the low 3 bits of its attributes,
    ``Codec``); None when the range opens with no v2 batch header (a legacy message set, too short).
    The first batch only, as the live detectors read a Produce request's range (a producer's batch)."""
    if end - start < _V2_FAST_MIN or data[start + MAGIC_AT] != 2:
        return None
    producer: int = read_i64_be(data, start + PRODUCER_ID_AT)
    epoch: int = read_i16_be(data, start + PRODUCER_EPOCH_AT)
    sequence: int = read_i32_be(data, start + BASE_SEQUENCE_AT)
    crc: int = read_i32_be(data, start + CRC_AT)  # an unsigned int32, read as signed
    return producer, epoch, sequence, crc & 0xFFFFFFFF, data[start + ATTRIBUTES_AT + 1] & CODEC_MASK


def one_batch_header(data: bytes, start: int, end: int) -> tuple[int, int, int] | None:
    """``(bytes, codec, records)`` of ``data[start:end]`` when that range is exactly one v2 batch
    (what a producer sends per partition), read in place: what :func:`v2_batches` gives for it in
    one call. None for any other range (the walk decides)."""
    if end - start >= _V2_FAST_MIN:
        batch_length: int = read_i32_be(data, start + BATCH_LENGTH_AT)
        if data[start + MAGIC_AT] == 2 and start + 12 + batch_length == end and batch_length >= _V2_FAST_MIN - 12:
            count: int = read_i32_be(data, start + RECORDS_COUNT_AT)
            if count >= 0:
                return end - start, data[start + ATTRIBUTES_AT + 1] & CODEC_MASK, count
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
