"""Kafka's wire primitives: varints, tagged-field sections, and the "malformed" signal.

The codec compiler (:mod:`kproxy.protocol.codegen`), the header readers, the
splicer and the proxy read and write these; this module is their one home.

* Unsigned varints (``UNSIGNED_VARINT``, KIP-482's compact lengths and tags) are
  LEB128 of at most 32 bits, so at most :data:`MAX_UVARINT_BYTES` bytes.
* Signed varints and varlongs (the record fields of RecordBatch v2, KIP-98) are
  zig-zag over LEB128, 32 and 64 bits. The records package reads them with its
  own bounded readers, which name the record field in their error
  (:mod:`kproxy.protocol.records.fields`); it writes them with :func:`write_varlong`.
* A tagged-field section (KIP-482) is an unsigned varint count, then per field
  its tag, its size and its bytes; tags strictly ascending.

Reading is canonical: bytes that would not re-encode to themselves (a varint
not in its shortest form, tags out of order or repeated) are :class:`Malformed`,
which keeps the codec's round-trip contract true for every input that decodes.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from kproxy.protocol.errors import DecodeError

MAX_UVARINT_BYTES = 5  # a Kafka unsigned varint carries at most 32 bits
MAX_VARLONG_BYTES = 10  # 64 bits in 7-bit groups


class Malformed(DecodeError):
    """Bytes that break a wire rule, raised where they are read (inside generated decoders too).

    A :class:`~kproxy.protocol.errors.DecodeError`, so callers catch one family; the
    public codec wrappers (:mod:`kproxy.protocol.messages`) re-raise it with the
    byte offset and field path they know.
    """


def read_uvarint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Decode an unsigned varint at ``pos`` (slow path: the caller inlines 1-byte values)."""
    result = 0
    shift = 0
    start = pos
    while True:
        if pos - start >= MAX_UVARINT_BYTES:
            raise Malformed(f"unsigned varint longer than {MAX_UVARINT_BYTES} bytes")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            if result > 0xFFFFFFFF:
                raise Malformed("unsigned varint above 32 bits")
            if b == 0 and pos - start > 1:
                # 0x80 0x00 also reads as 0, but would not re-encode to the same bytes.
                raise Malformed("unsigned varint not in its shortest form")
            return result, pos
        shift += 7


def write_uvarint(out: bytearray, n: int) -> None:
    """Append ``n`` (0..2**32-1) as an unsigned varint."""
    if n < 0 or n > 0xFFFFFFFF:
        raise struct.error(f"unsigned varint out of range: {n}")
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def uvarint_bytes(n: int) -> bytes:
    """``n`` as an unsigned varint, on its own."""
    out = bytearray()
    write_uvarint(out, n)
    return bytes(out)


def _read_zigzag(buf: bytes | bytearray | memoryview, pos: int, bits: int) -> tuple[int, int]:
    max_bytes = (bits + 6) // 7
    result = 0
    shift = 0
    start = pos
    while True:
        if pos - start >= max_bytes:
            raise Malformed(f"varint longer than {max_bytes} bytes")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            if result >> bits:
                raise Malformed(f"varint above {bits} bits")
            if b == 0 and pos - start > 1:
                raise Malformed("varint not in its shortest form")
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def read_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """A zig-zag varint (int32) at ``pos``: (value, next position)."""
    return _read_zigzag(buf, pos, 32)


def read_varlong(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """A zig-zag varlong (int64) at ``pos``: (value, next position)."""
    return _read_zigzag(buf, pos, 64)


def write_varlong(out: bytearray, v: int) -> None:
    """Append ``v`` zig-zag encoded: a varlong, and a varint for any int32 (same bytes).

    ``(v >> 63)`` is 0 or -1 for every value in int64 range, and equals ``v >> 31``
    for every int32, so one function serves both widths. The caller range-checks.
    """
    u = (v << 1) ^ (v >> 63)
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)


write_varint = write_varlong  # identical bytes for int32 values, see write_varlong


def read_tagged_fields(buf: bytes | bytearray | memoryview, pos: int) -> tuple[dict[int, bytes], int]:
    """The tagged-field section at ``pos`` as ``{tag: raw bytes}``, and the position after it.

    Tags must be strictly ascending and every field inside ``buf``.
    """
    count, pos = read_uvarint(buf, pos)
    tags: dict[int, bytes] = {}
    last = -1
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        if tag <= last:
            raise Malformed(f"tagged field {tag} out of order or repeated")
        last = tag
        size, pos = read_uvarint(buf, pos)
        if pos + size > len(buf):
            raise Malformed("tagged field runs past the end of the data")
        tags[tag] = bytes(buf[pos : pos + size])
        pos += size
    return tags, pos


def skip_tagged_fields(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """The position just past the tagged-field section at ``pos``, building nothing."""
    if buf[pos] == 0:  # the usual case: no tags
        return pos + 1
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
    if pos > len(buf):
        raise Malformed("tagged field runs past the end of the data")
    return pos


def write_tagged_fields(out: bytearray, tags: Mapping[int, bytes]) -> None:
    """Append a tagged-field section holding ``tags`` (written in ascending tag order)."""
    write_uvarint(out, len(tags))
    for tag in sorted(tags):
        data = tags[tag]
        write_uvarint(out, tag)
        write_uvarint(out, len(data))
        out += data
