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

What this package offers (import it from here; the modules split it by job)
---------------------------------------------------------------------------
:mod:`.batch_layout` (where each field of a v2 batch header sits: every header reader's
positions), :mod:`.entries` (values, header walking, CRCs), :mod:`.recordbatch`
(RecordBatch v2), :mod:`.messageset` (legacy message sets), :mod:`.counting`
(record counts), :mod:`.budget` (the :class:`RecordBudget` every per-frame
reader on the data path runs under), :mod:`.fields` (bounded field readers and
writers, payload decompression); :func:`decode_records` here dispatches by magic.

* :func:`iter_batches` - lazy and cheap: reads only each entry's header (no CRC
  check, no decompression) and yields a :class:`BatchInfo`. A partial entry at the
  end (a broker cuts Fetch responses at the byte limit) ends iteration cleanly and
  is reported as :attr:`BatchIterator.truncated_tail`; it is not an error.
* :func:`verify_crc`, :func:`decode_records`, :func:`decode_all` - the expensive part,
  on demand.
* :func:`count_records` - records in a records field from the v2 headers alone;
  :func:`one_batch_count` - the same for a range that is one v2 batch, read in place;
  :func:`v2_max_timestamp` - the latest write time the v2 batch headers of a range carry;
  :func:`v2_producer_head` - the producer id, epoch, base sequence, CRC and codec of a range's first
  v2 batch, read in place;
  :func:`v2_totals`, :func:`v2_batches` - records and bytes of a range's whole v2 batches (per
  batch, with its codec, for the second), read in place: the metrics' per-topic counts;
  :func:`v2_dated` - each whole v2 batch's offsets and write time, with the range's records.
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

from kproxy.protocol.compression import DEFAULT_MAX_DECOMPRESSED
from kproxy.protocol.records.batch_layout import V2_HEADER_SIZE
from kproxy.protocol.records.budget import DEFAULT_RECORD_BUDGET, RECORD_COST, RecordBudget
from kproxy.protocol.records.counting import (
    count_records,
    one_batch_count,
    one_batch_header,
    v2_batches,
    v2_dated,
    v2_max_timestamp,
    v2_producer_head,
    v2_totals,
)
from kproxy.protocol.records.entries import (
    LOG_OVERHEAD,
    BatchInfo,
    BatchIterator,
    BytesLike,
    Record,
    TimestampType,
    compute_crc,
    iter_batches,
    verify_crc,
)
from kproxy.protocol.records.messageset import decode_legacy, encode_message_set
from kproxy.protocol.records.recordbatch import decode_v2, encode_batch_v2

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED",
    "DEFAULT_RECORD_BUDGET",
    "LOG_OVERHEAD",
    "RECORD_COST",
    "V2_HEADER_SIZE",
    "BatchInfo",
    "BatchIterator",
    "Record",
    "RecordBudget",
    "TimestampType",
    "compute_crc",
    "count_records",
    "decode_all",
    "decode_records",
    "encode_batch_v2",
    "encode_message_set",
    "iter_batches",
    "one_batch_count",
    "one_batch_header",
    "v2_batches",
    "v2_dated",
    "v2_max_timestamp",
    "v2_producer_head",
    "v2_totals",
    "verify_crc",
]


# --------------------------------------------------------------------- decoding


def decode_records(
    batch: BatchInfo,
    *,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    check_crc: bool = True,
    budget: RecordBudget | None = None,
) -> list[Record]:
    """Every record of one entry, decompressing if needed.

    ``max_decompressed`` caps the decompressed size of the entry's records
    (memory stays bounded by it, see :mod:`kproxy.protocol.compression`).
    ``check_crc`` verifies the CRC first (and the inner messages' CRCs of a
    legacy wrapper), as Kafka's consumer does by default.

    Raises :class:`CorruptRecordsError` for any inconsistency: wrong CRC, bad
    compression, a record running past its length or the batch, a count that
    does not match, bytes left over, bad varints, invalid UTF-8 in a header key.

    With a ``budget`` (the frame's, see :mod:`.budget`), decompressed bytes and
    records are charged to it, and :class:`~kproxy.protocol.errors.OverBudgetError`
    is raised, before the records are built, when they do not fit in what is left.
    The data path always passes one; without, only ``max_decompressed`` bounds the work.
    """
    if check_crc:
        verify_crc(batch)
    if batch.magic >= 2:
        return decode_v2(batch, max_decompressed, budget)
    return decode_legacy(batch, max_decompressed, check_crc, budget)


def decode_all(
    data: BytesLike,
    *,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    check_crc: bool = True,
    budget: RecordBudget | None = None,
) -> list[Record]:
    """Records of every complete entry in ``data`` (a truncated tail is ignored, as Kafka does),
    within ``budget`` when given (see :func:`decode_records`)."""
    out: list[Record] = []
    for batch in iter_batches(data):
        out.extend(decode_records(batch, max_decompressed=max_decompressed, check_crc=check_crc, budget=budget))
    return out
