"""Kafka's record compression codecs, with decompression bounded in memory.

Kafka compresses record data as a whole: the records section of a RecordBatch
(magic 2), or the value of a legacy wrapper message (magic 0/1). The codec id
lives in the low three bits of the batch/message attributes:

====  ========  ==============================================================
 id   name      wire format kproxy reads and writes
====  ========  ==============================================================
 0    none      the bytes as they are
 1    gzip      RFC 1952 (concatenated members accepted when reading)
 2    snappy    xerial block framing as the Java client writes it (read *and*
                write); plain raw snappy accepted when reading
 3    lz4       LZ4 frame format with independent blocks (the only kind the
                Java client can read); with ``lz4_legacy_header=True`` the
                broken header checksum of magic-0 messages (KAFKA-3160)
 4    zstd      zstd frames (Kafka allows zstd with magic 2 only; that rule is
                the record layer's business, not this module's)
====  ========  ==============================================================

Contracts
---------
* :func:`compress` raises :class:`~kproxy.protocol.errors.EncodeError` for an
  unknown codec id; its output is what a Java client would accept.
* :func:`decompress` raises only :class:`~kproxy.protocol.errors.CorruptRecordsError`:
  for an unknown codec id, for input the codec rejects, and for output that
  would exceed ``max_size`` bytes. ``offset`` in the error is a byte offset
  into ``data`` when the codec lets us know it (xerial blocks, LZ4 header),
  else 0.

Memory bound (decompression bombs)
----------------------------------
A few kilobytes of zstd can expand to gigabytes, so nothing here ever calls an
unbounded "decompress everything" API. Output never exceeds ``max_size + 1``
bytes, and peak memory of one call stays below about ``2 * max_size + len(data)``:

* gzip: :mod:`zlib`'s streaming decompressor with ``max_length``, so output
  stops at the limit;
* snappy: every raw block declares its uncompressed length up front; it is
  checked against the remaining budget *before* anything is allocated;
* lz4 and zstd: cramjam's ``decompress_into`` writes into a caller-sized
  buffer and fails once that buffer is full (it streams, it does not
  decompress everything first). The buffer starts small and grows four-fold up
  to ``max_size + 1``; a payload still filling that is refused.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Callable
from enum import IntEnum
from typing import Final

import cramjam

from kproxy.protocol.errors import CorruptRecordsError, EncodeError

__all__ = [
    "CODEC_NAMES",
    "DEFAULT_MAX_DECOMPRESSED",
    "Codec",
    "codec_name",
    "compress",
    "decompress",
    "xxh32",
]

BytesLike = bytes | bytearray | memoryview


class Codec(IntEnum):
    """Kafka's compression codec ids (``attributes & 0x07``)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


CODEC_NAMES: Final[dict[int, str]] = {
    Codec.NONE: "none",
    Codec.GZIP: "gzip",
    Codec.SNAPPY: "snappy",
    Codec.LZ4: "lz4",
    Codec.ZSTD: "zstd",
}

#: A sensible default limit for one batch's decompressed records: well above
#: Kafka's default ``message.max.bytes`` (about 1 MiB) and ``max.partition.fetch.bytes``,
#: small enough that a bomb cannot take the proxy down.
DEFAULT_MAX_DECOMPRESSED: Final = 64 * 1024 * 1024


def codec_name(codec: int) -> str:
    """Kafka's name for a codec id (``"unknown(7)"`` for ids Kafka does not define)."""
    return CODEC_NAMES.get(codec, f"unknown({codec})")


# --------------------------------------------------------------------------- compress


def compress(codec: int, data: BytesLike, *, lz4_legacy_header: bool = False) -> bytes:
    """Compress ``data`` the way the Java client does for ``codec``.

    ``lz4_legacy_header`` writes the incorrect LZ4 header checksum that magic-0
    messages carry (old brokers and clients expect it there; magic 1 and 2 use
    the correct one). Raises :class:`EncodeError` for an unknown codec id.
    """
    if codec == Codec.NONE:
        return bytes(data)
    if codec == Codec.GZIP:
        # mtime=0 keeps the output deterministic (byte-for-byte reproducible
        # fixtures); level 6 is java.util.zip's default.
        return gzip.compress(bytes(data), compresslevel=6, mtime=0)
    if codec == Codec.SNAPPY:
        return _xerial_snappy_compress(data)
    if codec == Codec.LZ4:
        return _lz4_compress(data, legacy_header=lz4_legacy_header)
    if codec == Codec.ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise EncodeError(f"unknown compression codec id {codec}", field="attributes.codec")


# xerial-snappy stream header: a marker byte, "SNAPPY", NUL, then version and
# minimum-compatible version as big-endian int32 (both 1 in every known writer).
_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER: Final = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
# snappy-java's default block size; each block is compressed independently.
_XERIAL_BLOCK_SIZE: Final = 32 * 1024


def _xerial_snappy_compress(data: BytesLike) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), _XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK_SIZE]))
        parts.append(struct.pack(">i", len(block)))
        parts.append(block)
    return b"".join(parts)


_LZ4_MAGIC: Final = b"\x04\x22\x4d\x18"  # 0x184D2204 little-endian


def _lz4_compress(data: BytesLike, *, legacy_header: bool) -> bytes:
    # Kafka's Java reader decompresses every block on its own, so linked blocks
    # (cramjam's default) would be unreadable there; no content checksum either,
    # since older Java readers reject it.
    compressor = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
    compressor.compress(bytes(data))  # the streaming API takes bytes only
    frame = bytearray(bytes(compressor.finish()))
    if legacy_header:
        descriptor_end = 4 + _lz4_descriptor_length(frame)
        # The KAFKA-3160 bug: the checksum was computed over the magic number
        # *and* the descriptor instead of the descriptor alone.
        frame[descriptor_end] = (xxh32(bytes(frame[:descriptor_end])) >> 8) & 0xFF
    return bytes(frame)


def _lz4_descriptor_length(frame: BytesLike) -> int:
    """Bytes of the LZ4 frame descriptor between the magic number and the HC byte."""
    flg = frame[4]
    # FLG bit 3: an 8-byte content size follows BD; bit 0: a 4-byte dictionary id.
    return 2 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)


# ------------------------------------------------------------------------- decompress


def decompress(codec: int, data: BytesLike, *, max_size: int, lz4_legacy_header: bool = False) -> bytes:
    """Decompress ``data`` compressed with ``codec``, refusing output above ``max_size`` bytes.

    Accepts what Kafka clients and brokers write (see the module docstring).
    ``lz4_legacy_header`` ignores the LZ4 header checksum, as Kafka does for
    magic-0 messages whose writers computed it wrongly.

    Raises :class:`CorruptRecordsError` (never anything else) for an unknown
    codec, malformed input or too much output. Memory stays bounded by
    ``max_size``; see the module docstring.
    """
    if max_size < 0:
        raise ValueError("max_size must be >= 0")  # a programming error, not bad input
    if codec == Codec.NONE:
        if len(data) > max_size:
            raise _too_big(codec, max_size)
        return bytes(data)
    if codec == Codec.GZIP:
        return _gzip_decompress(data, max_size)
    if codec == Codec.SNAPPY:
        return _snappy_decompress(data, max_size)
    if codec == Codec.LZ4:
        if lz4_legacy_header:
            data = _lz4_repair_header(data)
        return _into_growing_buffer(cramjam.lz4.decompress_into, codec, data, max_size)
    if codec == Codec.ZSTD:
        return _into_growing_buffer(cramjam.zstd.decompress_into, codec, data, max_size)
    raise CorruptRecordsError(f"unknown compression codec id {codec}", offset=0)


def _too_big(codec: int, max_size: int) -> CorruptRecordsError:
    return CorruptRecordsError(
        f"{codec_name(codec)} data decompresses to more than the {max_size}-byte limit", offset=0
    )


def _gzip_decompress(data: BytesLike, max_size: int) -> bytes:
    out = bytearray()
    remaining = memoryview(data)
    consumed = 0
    # Java's GZIPInputStream reads concatenated members, so we do too.
    while True:
        # wbits 16+15: expect a gzip header and trailer (CRC-32 and size are checked).
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            # max_length bounds the output: at most one byte over the budget.
            chunk = inflater.decompress(remaining, max_size - len(out) + 1)
        except zlib.error as exc:
            raise CorruptRecordsError(f"bad gzip data: {exc}", offset=consumed) from exc
        out += chunk
        del chunk  # keep peak memory near one copy of the output, not two
        if len(out) > max_size:
            raise _too_big(Codec.GZIP, max_size)
        if not inflater.eof:
            raise CorruptRecordsError("truncated gzip data", offset=len(data))
        unused = len(inflater.unused_data)
        if unused == 0:
            return bytes(out)
        consumed = len(data) - unused
        remaining = remaining[len(remaining) - unused :]


def _snappy_decompress(data: BytesLike, max_size: int) -> bytes:
    view = memoryview(data)
    if len(view) >= len(_XERIAL_HEADER) and bytes(view[: len(_XERIAL_MAGIC)]) == _XERIAL_MAGIC:
        # Version fields are ignored on purpose: some writers put them in
        # little-endian, and there only ever was one xerial block format.
        out = bytearray()
        pos = len(_XERIAL_HEADER)
        while pos < len(view):
            if bytes(view[pos : pos + len(_XERIAL_MAGIC)]) == _XERIAL_MAGIC:
                # Concatenated streams (snappy-java reads them): a new header
                # where a block length would be. Unambiguous, since 0x82 would
                # make that length negative.
                if len(view) - pos < len(_XERIAL_HEADER):
                    raise CorruptRecordsError("truncated xerial snappy header", offset=pos)
                pos += len(_XERIAL_HEADER)
                continue
            if len(view) - pos < 4:
                raise CorruptRecordsError("truncated xerial snappy block length", offset=pos)
            (block_len,) = struct.unpack_from(">i", view, pos)
            if block_len < 0 or block_len > len(view) - pos - 4:
                raise CorruptRecordsError(
                    f"xerial snappy block length {block_len} outside the {len(view) - pos - 4} bytes left",
                    offset=pos,
                )
            out += _raw_snappy(view[pos + 4 : pos + 4 + block_len], max_size - len(out), pos + 4, max_size)
            pos += 4 + block_len
        return bytes(out)
    return _raw_snappy(view, max_size, 0, max_size)


def _raw_snappy(block: memoryview, budget: int, where: int, max_size: int) -> bytes:
    try:
        # The raw format starts with the uncompressed length: check it before
        # letting the decoder allocate that much.
        declared = cramjam.snappy.decompress_raw_len(block)
    except cramjam.DecompressionError as exc:
        raise CorruptRecordsError(f"bad snappy data: {exc}", offset=where) from exc
    if declared > budget:
        raise _too_big(Codec.SNAPPY, max_size)
    try:
        return bytes(cramjam.snappy.decompress_raw(block))
    except cramjam.DecompressionError as exc:
        raise CorruptRecordsError(f"bad snappy data: {exc}", offset=where) from exc


def _lz4_repair_header(data: BytesLike) -> bytes:
    """Replace a magic-0 LZ4 frame's (wrong) header checksum by the right one.

    Equivalent to Kafka's "ignore the flag descriptor checksum" for magic 0, but
    lets the frame decoder keep every other check.
    """
    if len(data) < 7 or bytes(data[:4]) != _LZ4_MAGIC:
        raise CorruptRecordsError("not an LZ4 frame (bad magic number)", offset=0)
    hc_pos = 4 + _lz4_descriptor_length(data)
    if hc_pos >= len(data):
        raise CorruptRecordsError("truncated LZ4 frame descriptor", offset=len(data))
    frame = bytearray(data)
    frame[hc_pos] = (xxh32(bytes(frame[4:hc_pos])) >> 8) & 0xFF
    return bytes(frame)


# The first output buffer for lz4/zstd; grown four-fold on overflow.
_INITIAL_OUTPUT: Final = 64 * 1024


def _into_growing_buffer(
    decompress_into: Callable[[BytesLike, bytearray], int], codec: int, data: BytesLike, max_size: int
) -> bytes:
    cap = max_size + 1  # one spare byte tells "exactly max_size" from "more than max_size"
    size = min(cap, max(_INITIAL_OUTPUT, 4 * len(data)))
    while True:
        out = bytearray(size)
        try:
            written = int(decompress_into(data, out))
        except (cramjam.DecompressionError, OSError, ValueError) as exc:
            reason = str(exc)
            # cramjam reports a full output buffer as "failed to write whole
            # buffer"; anything else is bad input, not worth a bigger retry
            # (which would zero-fill up to max_size for nothing). The test suite
            # pins this behaviour with payloads far above _INITIAL_OUTPUT.
            if "buffer" not in reason:
                raise CorruptRecordsError(f"bad {codec_name(codec)} data: {reason}", offset=0) from exc
            if size >= cap:
                raise _too_big(codec, max_size) from exc
            del out  # free before allocating the bigger one
            # Four-fold growth: total work stays under 4/3 of one pass at the cap.
            size = min(cap, size * 4)
            continue
        if written > max_size:
            raise _too_big(codec, max_size)
        del out[written:]
        return bytes(out)


# ----------------------------------------------------------------------------- xxh32

_P1: Final = 2654435761
_P2: Final = 2246822519
_P3: Final = 3266489917
_P4: Final = 668265263
_P5: Final = 374761393
_M32: Final = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32 of ``data`` (written from the xxHash specification).

    Only used for the LZ4 frame header checksum, i.e. on a handful of bytes, so
    plain Python is fast enough; cramjam does not expose xxHash.
    """
    n = len(data)
    pos = 0
    if n >= 16:
        v1 = (seed + _P1 + _P2) & _M32
        v2 = (seed + _P2) & _M32
        v3 = seed & _M32
        v4 = (seed - _P1) & _M32
        lanes = [v1, v2, v3, v4]
        while pos + 16 <= n:
            for i in range(4):
                (word,) = struct.unpack_from("<I", data, pos)
                lanes[i] = (_rotl((lanes[i] + word * _P2) & _M32, 13) * _P1) & _M32
                pos += 4
        h = (_rotl(lanes[0], 1) + _rotl(lanes[1], 7) + _rotl(lanes[2], 12) + _rotl(lanes[3], 18)) & _M32
    else:
        h = (seed + _P5) & _M32
    h = (h + n) & _M32
    while pos + 4 <= n:
        (word,) = struct.unpack_from("<I", data, pos)
        h = (_rotl((h + word * _P3) & _M32, 17) * _P4) & _M32
        pos += 4
    while pos < n:
        h = (_rotl((h + data[pos] * _P5) & _M32, 11) * _P1) & _M32
        pos += 1
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h
