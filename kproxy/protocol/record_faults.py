"""Record-level faults on Produce requests and Fetch responses: corrupt, duplicate, bad schema ids.

Each function takes a whole frame (size prefix included): a Produce (0)
request or a Fetch (1) response, with the api version of the request. It
edits the ``records`` fields of the chosen partitions (all by default; ``only``
is a ``(topic, partition) -> bool`` test, the topic being a name, or a
:class:`uuid.UUID` in versions that identify topics by id), through the
top-level topics array only (:func:`~kproxy.protocol.splice.splice_body`):
the rest of the frame is copied byte for byte, and inside a records field
every entry it does not change is copied too.

* :func:`corrupt_records` with :attr:`CorruptTarget.CRC` flips the last byte of
  every entry (v2 batch or legacy message) and leaves the stored CRC as it
  was: the CRC no longer matches (brokers answer CORRUPT_MESSAGE, consumers
  raise their CRC error). With a field target it flips the first byte of each
  record's key, value or header values (or shifts the batch timestamps) and
  recomputes the CRC-32C, so the batch is valid and the *data* is wrong.
  Compressed batches are decompressed, edited and recompressed with the same
  codec (:mod:`kproxy.protocol.compression`). Legacy (magic 0 and 1) messages
  take the key, value and (magic 1) timestamp targets too, compressed wrappers
  included (inner messages and wrapper get new CRC-32s); they have no headers.
* :func:`duplicate_records` repeats every entry ``copies`` more times, bytes
  unchanged (same offsets and producer sequence numbers).
* :func:`replace_schema_ids` writes a schema id into every record value in the
  Confluent wire format (magic byte 0, 4-byte big-endian schema id, payload).

Reading records to edit them runs under one
:class:`~kproxy.protocol.records.RecordBudget` per frame (``budget``; a fresh one
of the default size when not given): the bytes decompressed and each record
edited are charged to it, and a frame that needs more raises
:class:`~kproxy.protocol.errors.OverBudgetError` before anything is changed (the
caller forwards the frame as it came). Legacy wrappers nested in wrappers are
refused, as Kafka refuses them.

Every function returns a :class:`~kproxy.protocol.mutation.Mutation` whose
``changed`` counts the entries (CRC, duplicate) or records (field targets,
schema ids) changed; the same frame object when nothing was. Bad input:
:class:`~kproxy.protocol.errors.RecordsMutationError` for an API without
records or record bytes that cannot be walked (a truncated batch at the end of
a Fetch partition is not that: it is copied as it is).
"""

from __future__ import annotations

import enum
import struct
import uuid
import zlib
from collections.abc import Callable
from typing import Any

from crc32c import crc32c

from kproxy.protocol.compression import DEFAULT_MAX_DECOMPRESSED, Codec, compress, decompress
from kproxy.protocol.errors import CorruptRecordsError, RecordsMutationError
from kproxy.protocol.headers import response_body_offset
from kproxy.protocol.message_schemas import Field, MessageType, message_schema
from kproxy.protocol.mutation import Mutation, reframe, request_header
from kproxy.protocol.records import RECORD_COST, V2_HEADER_SIZE, BatchInfo, RecordBudget, iter_batches
from kproxy.protocol.records.batch_layout import (
    ATTRIBUTES_AT,
    BASE_TIMESTAMP_AT,
    BATCH_LENGTH_AT,
    CODEC_MASK,
    CRC_AT,
    MAX_TIMESTAMP_AT,
)
from kproxy.protocol.splice import splice_body

PRODUCE, FETCH = 0, 1
Selector = Callable[[str | uuid.UUID | None, int], bool]
_LEGACY_CRC_POS, _LEGACY_MAGIC_POS = 12, 16  # (a legacy message's: kproxy/protocol/records/__init__.py)
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT64 = struct.Struct(">q")
#: Shift of the timestamp target: one year back, past any broker's
#: ``log.message.timestamp.before.max.ms`` default... and plainly wrong to a consumer.
DEFAULT_TIMESTAMP_SHIFT_MS = -365 * 24 * 3600 * 1000


class CorruptTarget(enum.Enum):
    CRC = "crc"  # break the CRC: the batch is refused as corrupt
    KEY = "key"  # flip the first byte of every non-empty key, CRC kept valid
    VALUE = "value"  # flip the first byte of every non-empty value, CRC kept valid
    HEADERS = "headers"  # flip the first byte of every non-empty header value, CRC kept valid
    TIMESTAMP = "timestamp"  # shift base and max timestamps of the batch, CRC kept valid


# ------------------------------------------------------------------------------ frames


def _records_path(api_key: int, api_version: int, direction: MessageType) -> tuple[Field, Field]:
    """(topics array field, partitions array field) of the message holding ``records``."""
    schema = message_schema(api_key, api_version, direction)
    if schema is not None:
        for top in schema.fields:
            if top.array and top.fields is not None:
                for part in top.fields:
                    if part.array and part.fields is not None and any(f.name == "records" for f in part.fields):
                        return top, part
    raise RecordsMutationError(f"api key {api_key} v{api_version} {direction.name.lower()}s carry no records")


def edit_records_fields(frame: bytes, api_key: int, api_version: int,
                        edit: Callable[[bytes], tuple[bytes, int]], only: Selector | None = None) -> Mutation:
    """Apply ``edit`` (records bytes -> (new bytes, changes)) to the records of each chosen
    partition of a Produce request or Fetch response frame."""
    if api_key == PRODUCE:
        direction = MessageType.REQUEST
        offset = 4 + request_header(frame).size
    elif api_key == FETCH:
        direction = MessageType.RESPONSE
        offset = response_body_offset(frame, api_key, api_version, whole=True)
    else:
        raise RecordsMutationError(f"records faults act on Produce requests and Fetch responses, not api key "
                                   f"{api_key}")
    top, part = _records_path(api_key, api_version, direction)
    count = [0]

    def topics(value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for topic in value or ():
            key = topic.get("name", topic.get("topic", topic.get("topic_id")))
            for p in topic.get(part.name) or ():
                index = p.get("index", p.get("partition_index", p.get("partition", -1)))
                records = p.get("records")
                if not records or (only is not None and not only(key, index)):
                    continue
                new, n = edit(records)
                if n:
                    p["records"] = new
                    count[0] += n
        return value

    new_body, _ = splice_body(api_key, api_version, direction, frame, {top.name: topics}, offset)
    if new_body is None or not count[0]:
        return Mutation(frame, 0)
    return Mutation(reframe(frame, offset, new_body), count[0])


def corrupt_records(frame: bytes, api_key: int, api_version: int, target: CorruptTarget = CorruptTarget.CRC, *,
                    only: Selector | None = None, timestamp_shift_ms: int = DEFAULT_TIMESTAMP_SHIFT_MS,
                    budget: RecordBudget | None = None) -> Mutation:
    """Corrupt the record batches of a Produce request or Fetch response (see the module docstring)."""
    if target is CorruptTarget.CRC:  # the entries' headers only: nothing decompressed, nothing to charge
        return edit_records_fields(frame, api_key, api_version, break_crc, only)
    spend = RecordBudget() if budget is None else budget
    patch = _field_patcher(target)
    shift = timestamp_shift_ms if target is CorruptTarget.TIMESTAMP else 0
    return edit_records_fields(frame, api_key, api_version, lambda data: edit_batches(data, patch, shift, spend),
                               only)


def duplicate_records(frame: bytes, api_key: int, api_version: int, copies: int = 1, *,
                      only: Selector | None = None) -> Mutation:
    """Repeat every entry of the chosen records fields ``copies`` more times."""
    if copies < 1:
        raise RecordsMutationError(f"copies must be >= 1, not {copies}")
    return edit_records_fields(frame, api_key, api_version, lambda data: repeat_batches(data, copies), only)


def replace_schema_ids(frame: bytes, api_key: int, api_version: int, schema_id: int, *,
                       only: Selector | None = None, budget: RecordBudget | None = None) -> Mutation:
    """Write ``schema_id`` into every Confluent wire-format record value of the chosen partitions."""
    if not -(2**31) <= schema_id < 2**31:
        raise RecordsMutationError(f"a schema id is an int32, not {schema_id}")
    new_id = _INT32.pack(schema_id)
    spend = RecordBudget() if budget is None else budget
    return edit_records_fields(frame, api_key, api_version,
                               lambda data: edit_batches(data, _schema_id_patcher(new_id), 0, spend), only)


# ---------------------------------------------------------------------- records fields


def _entries(data: bytes) -> tuple[list[BatchInfo], int]:
    """The complete entries of a records field and where its truncated tail (if any) starts."""
    try:
        it = iter_batches(data)
        batches = list(it)
    except CorruptRecordsError as exc:
        raise RecordsMutationError(f"cannot walk the record batches: {exc.reason}", offset=exc.offset,
                                   field=exc.field) from None
    return batches, it.position


def break_crc(data: bytes) -> tuple[bytes, int]:
    """Flip the last byte of every entry, leaving its stored CRC: (new bytes, entries changed).

    The last byte is covered by the CRC of every magic (CRC-32C from the v2
    attributes on, CRC-32 from the legacy magic byte on) and sits inside the
    entry's length, so framing and offsets stay intact and only the checksum fails.
    """
    batches, _ = _entries(data)
    if not batches:
        return data, 0
    out = bytearray(data)
    for batch in batches:
        out[batch.end - 1] ^= 0xFF
    return bytes(out), len(batches)


def repeat_batches(data: bytes, copies: int) -> tuple[bytes, int]:
    """Each complete entry followed by ``copies`` copies of itself; a truncated tail kept last."""
    batches, tail = _entries(data)
    if not batches:
        return data, 0
    out = bytearray()
    for batch in batches:
        out += bytes(batch.raw) * (copies + 1)
    out += data[tail:]
    return bytes(out), len(batches)


# Where one record's parts sit in a buffer: (key start, key length, value start, value length,
# [(header value start, length)...]); a null key or value has length -1.
Span = tuple[int, int, int, int, list[tuple[int, int]]]
# A patcher edits records in place at the given spans; it returns how many records it changed.
Patcher = Callable[[bytearray, list[Span]], int]


def edit_batches(data: bytes, patch: Patcher | None, timestamp_shift_ms: int = 0,
                 budget: RecordBudget | None = None) -> tuple[bytes, int]:
    """Apply ``patch`` to every record and/or shift timestamps by ``timestamp_shift_ms``,
    decompressing and recompressing as needed; each changed v2 batch gets a new length and
    CRC-32C, each changed legacy message (and its compressed wrapper) a new size and CRC-32.
    A truncated tail is copied as it is. Decompressed bytes and patched records are charged to
    ``budget`` (a fresh default one when None): :class:`OverBudgetError` past it."""
    if budget is None:
        budget = RecordBudget()
    batches, _ = _entries(data)
    out = bytearray()
    changed = 0
    mark = 0
    for batch in batches:
        if batch.magic == 2:
            new, n = _edit_batch(batch, patch, timestamp_shift_ms, budget)
        else:
            new, n = _edit_legacy(bytearray(batch.raw), patch, timestamp_shift_ms, budget)
        if n:
            out += data[mark:batch.offset]
            out += new
            mark = batch.end
            changed += n
    if not changed:
        return data, 0
    out += data[mark:]
    return bytes(out), changed


def _edit_batch(batch: BatchInfo, patch: Patcher | None, timestamp_shift_ms: int, budget: RecordBudget
                ) -> tuple[bytes, int]:
    raw = bytearray(batch.raw)
    header = raw[:V2_HEADER_SIZE]
    changed = 0
    if timestamp_shift_ms:
        for pos in (BASE_TIMESTAMP_AT, MAX_TIMESTAMP_AT):
            (ts,) = _INT64.unpack_from(header, pos)
            if ts >= 0:
                _INT64.pack_into(header, pos, ts + timestamp_shift_ms)
                changed = batch.record_count or 1
    payload = raw[V2_HEADER_SIZE:]
    codec = batch.codec
    if patch is not None and batch.record_count:
        budget.spend(RECORD_COST * batch.record_count, offset=batch.offset)
        records = bytearray(payload if codec == Codec.NONE else
                            _inflate(codec, payload, batch.offset, budget, "cannot decompress a batch"))
        n = patch(records, record_spans(records, batch.record_count))
        if n:
            changed += n
            payload = bytearray(records if codec == Codec.NONE else compress(codec, records))
    if not changed:
        return b"", 0
    new = header + payload
    _INT32.pack_into(new, BATCH_LENGTH_AT, len(new) - 12)
    _UINT32.pack_into(new, CRC_AT, crc32c(bytes(new[ATTRIBUTES_AT:])))
    return bytes(new), changed


# ------------------------------------------------------------------------ v2 records


def _uvarint(buf: bytearray, pos: int) -> tuple[int, int]:
    result = shift = 0
    for _ in range(10):
        if pos >= len(buf):
            break
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
    raise RecordsMutationError("bad varint in a record", offset=pos)


def _varint(buf: bytearray, pos: int) -> tuple[int, int]:
    u, pos = _uvarint(buf, pos)
    return (u >> 1) ^ -(u & 1), pos


def record_spans(buf: bytearray, count: int) -> list[Span]:
    """The :data:`Span` of each record of an uncompressed v2 records section."""
    out: list[Span] = []
    pos = 0
    for _ in range(count):
        length, pos = _varint(buf, pos)
        end = pos + length
        if length < 1 or end > len(buf):
            raise RecordsMutationError("record length runs past its batch", offset=pos)
        p = pos + 1  # attributes
        _, p = _uvarint(buf, p)  # timestamp delta
        _, p = _uvarint(buf, p)  # offset delta
        key_len, p = _varint(buf, p)
        key_at = p
        p += max(key_len, 0)
        value_len, p = _varint(buf, p)
        value_at = p
        p += max(value_len, 0)
        n_headers, p = _varint(buf, p)
        headers: list[tuple[int, int]] = []
        for _ in range(max(n_headers, 0)):
            hkey_len, p = _varint(buf, p)
            p += max(hkey_len, 0)
            hvalue_len, p = _varint(buf, p)
            headers.append((p, hvalue_len))
            p += max(hvalue_len, 0)
        if p != end:
            raise RecordsMutationError("record fields do not end where its length says", offset=p)
        out.append((key_at, key_len, value_at, value_len, headers))
        pos = end
    return out


def _field_patcher(target: CorruptTarget) -> Patcher | None:
    if target is CorruptTarget.TIMESTAMP:
        return None

    def patch(buf: bytearray, spans: list[Span]) -> int:
        changed = 0
        for key_at, key_len, value_at, value_len, headers in spans:
            if target is CorruptTarget.KEY:
                spots = [(key_at, key_len)]
            elif target is CorruptTarget.VALUE:
                spots = [(value_at, value_len)]
            else:
                spots = headers
            hit = False
            for at, length in spots:
                if length > 0:
                    buf[at] ^= 0xFF
                    hit = True
            changed += hit
        return changed

    return patch


def _schema_id_patcher(new_id: bytes) -> Patcher:
    def patch(buf: bytearray, spans: list[Span]) -> int:
        changed = 0
        for _, _, value_at, value_len, _ in spans:
            if value_len >= 5 and buf[value_at] == 0 and buf[value_at + 1:value_at + 5] != new_id:
                buf[value_at + 1:value_at + 5] = new_id
                changed += 1
        return changed

    return patch


# ---------------------------------------------------------------------- legacy messages


def _inflate(codec: int, payload: bytes | bytearray, offset: int, budget: RecordBudget, what: str, *,
             lz4_legacy_header: bool = False) -> bytes:
    """A compressed payload, decompressed within what is left of ``budget`` and charged to it;
    ``what`` starts the error for a payload that is not valid."""
    limit = budget.limit(DEFAULT_MAX_DECOMPRESSED)
    try:
        out = decompress(codec, bytes(payload), max_size=limit, lz4_legacy_header=lz4_legacy_header)
    except CorruptRecordsError as exc:
        if limit < DEFAULT_MAX_DECOMPRESSED:  # too big for what was left, or not valid: not paid for
            raise budget.give_up(offset) from None
        raise RecordsMutationError(f"{what}: {exc.reason}", offset=offset) from None
    budget.remaining -= len(out)
    return out


def _edit_legacy(entry: bytearray, patch: Patcher | None, timestamp_shift_ms: int, budget: RecordBudget, *,
                 inner: bool = False) -> tuple[bytes, int]:
    """One legacy message (12-byte prefix included), edited: a plain message in place, a
    compressed wrapper through its decompressed inner messages (``inner``: this message is one
    of those, and must not be compressed). Returns (bytes, records changed)."""
    magic, attributes = entry[_LEGACY_MAGIC_POS], entry[_LEGACY_MAGIC_POS + 1]
    ts_at = _LEGACY_MAGIC_POS + 2
    key_len_at = ts_at + (8 if magic == 1 else 0)
    try:
        (key_len,) = _INT32.unpack_from(entry, key_len_at)
        value_len_at = key_len_at + 4 + max(key_len, 0)
        (value_len,) = _INT32.unpack_from(entry, value_len_at)
    except struct.error:
        raise RecordsMutationError("legacy message shorter than its fields", offset=key_len_at) from None
    value_at = value_len_at + 4
    if value_at + max(value_len, 0) != len(entry):
        raise RecordsMutationError("legacy message fields do not end where its size says", offset=value_at)
    changed = 0
    if timestamp_shift_ms and magic == 1:
        (ts,) = _INT64.unpack_from(entry, ts_at)
        if ts >= 0:
            _INT64.pack_into(entry, ts_at, ts + timestamp_shift_ms)
            changed = 1
    codec = attributes & CODEC_MASK
    if codec == Codec.NONE:
        if patch is not None:
            changed = max(changed, patch(entry, [(key_len_at + 4, key_len, value_at, value_len, [])]))
    elif inner:  # Kafka refuses a compressed message inside a compressed wrapper; so does the editor
        raise RecordsMutationError("nested compression in a legacy message set", offset=_LEGACY_MAGIC_POS + 1)
    elif value_len > 0:
        new_set, n = _edit_legacy_set(entry[value_at:], codec, magic, patch, timestamp_shift_ms, budget)
        if n:
            entry = entry[:value_len_at] + _INT32.pack(len(new_set)) + new_set
            changed = n
    if not changed:
        return b"", 0
    _INT32.pack_into(entry, BATCH_LENGTH_AT, len(entry) - 12)
    _UINT32.pack_into(entry, _LEGACY_CRC_POS, zlib.crc32(bytes(entry[_LEGACY_MAGIC_POS:])))
    return bytes(entry), changed


def _edit_legacy_set(value: bytearray, codec: int, magic: int, patch: Patcher | None,
                     timestamp_shift_ms: int, budget: RecordBudget) -> tuple[bytes, int]:
    """A compressed wrapper's value with its inner messages edited (recompressed alike); the
    value decompressed within ``budget``, each inner message charged :data:`RECORD_COST`."""
    legacy_lz4 = magic == 0  # magic 0 carries Kafka's old, wrong LZ4 header checksum
    inner = _inflate(codec, value, 0, budget, "cannot read a compressed legacy message", lz4_legacy_header=legacy_lz4)
    # Walked lazily, charged as it goes: a list of every entry first was a BatchInfo per inner
    # message of a bomb (hundreds of MB) before a single one was charged.
    entries = iter_batches(inner, allow_truncated_tail=False)
    out = bytearray()
    changed = 0
    while True:
        try:
            info = next(entries, None)
        except CorruptRecordsError as exc:
            raise RecordsMutationError(f"cannot read a compressed legacy message: {exc.reason}") from None
        if info is None:
            break
        budget.spend(RECORD_COST)
        if info.magic != magic:
            raise RecordsMutationError("inner legacy message of another magic than its wrapper")
        new, n = _edit_legacy(bytearray(info.raw), patch, timestamp_shift_ms, budget, inner=True)
        out += new if n else info.raw
        changed += n
    if not changed:
        return b"", 0
    return compress(codec, out, lz4_legacy_header=legacy_lz4), changed


__all__ = ["CorruptTarget", "Selector", "corrupt_records", "duplicate_records", "edit_records_fields",
           "replace_schema_ids"]
