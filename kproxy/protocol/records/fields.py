"""Record fields: an entry's payload (decompressed when needed) and bounded readers and writers.

Every reader takes the end of the bytes it may read and the field path to name in
its :class:`~kproxy.protocol.errors.CorruptRecordsError`; nothing is allocated from
a length before it is checked against the bytes present.
"""

from __future__ import annotations

from kproxy.protocol.compression import Codec, codec_name, decompress
from kproxy.protocol.errors import CorruptRecordsError, EncodeError
from kproxy.protocol.primitives import write_varlong
from kproxy.protocol.records.batch_layout import ATTRIBUTES_AT
from kproxy.protocol.records.budget import RecordBudget
from kproxy.protocol.records.entries import (
    _INT32,
    _LEGACY_MAGIC_POS,
    BatchInfo,
    BytesLike,
)


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
    batch: BatchInfo,
    start: int,
    stop: int,
    max_decompressed: int,
    *,
    lz4_legacy_header: bool = False,
    budget: RecordBudget | None = None,
) -> tuple[BytesLike, int, int, _Reader]:
    """The (possibly decompressed) bytes at ``buffer[start:stop]`` and their bounds.

    With a ``budget``, decompression stops at what is left of it and the output is
    charged to it; a payload that does not decompress within what is left (too big
    for it, or not valid: either way not paid for) raises :class:`~kproxy.protocol.errors.OverBudgetError`.
    """
    codec = batch.codec
    if codec == Codec.NONE:
        return batch.buffer, start, stop, _Reader(None)
    if codec > Codec.ZSTD or (codec == Codec.ZSTD and batch.magic < 2):
        # Kafka never allowed zstd in legacy messages (it came with KIP-110, magic 2).
        raise CorruptRecordsError(
            f"compression codec {codec_name(codec)} is not valid with magic {batch.magic}",
            offset=batch.offset + (ATTRIBUTES_AT if batch.magic >= 2 else _LEGACY_MAGIC_POS + 1),
            field="attributes",
        )
    limit = max_decompressed if budget is None else budget.limit(max_decompressed)
    try:
        data = decompress(
            codec,
            memoryview(batch.buffer)[start:stop],
            max_size=limit,
            lz4_legacy_header=lz4_legacy_header,
        )
    except CorruptRecordsError as exc:
        if budget is not None and limit < max_decompressed:
            raise budget.give_up(start) from None
        raise CorruptRecordsError(exc.reason, offset=start + (exc.offset or 0), field="records") from exc
    if budget is not None:
        budget.remaining -= len(data)
    return data, 0, len(data), _Reader(start)


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


def _write_varint_bytes(out: bytearray, data: BytesLike | None) -> None:
    if data is None:
        write_varlong(out, -1)
        return
    write_varlong(out, len(data))
    out += data


# ---------------------------------------------------------------------- encoding


def _check_range(value: int, low: int, high: int, name: str) -> None:
    if not isinstance(value, int) or not low <= value <= high:
        raise EncodeError(f"{name}={value!r} outside [{low}, {high}]", field=name)


def _check_bytes(value: object, name: str) -> None:
    if value is not None and not isinstance(value, bytes | bytearray | memoryview):
        raise EncodeError(f"{name} must be bytes or None, not {type(value).__name__}", field=name)
