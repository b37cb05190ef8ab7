"""What the code :mod:`kproxy.protocol.codegen` generates runs with: its namespace.

The generated functions call a few checks by name (a length past the end of the data, an array
count the bytes left cannot hold, a bool byte other than 0 or 1: each a
:class:`~kproxy.protocol.primitives.Malformed`), the wire's varint functions, and ``struct`` readers and
writers for arrays of ints compiled once per count. :data:`BASE_NAMESPACE` names them as the
generated source does; :func:`min_wire_size` is what the compiler checks array counts against.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from kproxy.protocol.message_schemas import FIXED_WIDTH, STRUCT_FORMAT, Field
from kproxy.protocol.primitives import Malformed, read_uvarint, uvarint_bytes, write_uvarint

UNKNOWN_TAGS = "_unknown_tags"


def check_len(buf: bytes, end: int) -> None:
    """Refuse a length that runs past the end of the data."""
    if end > len(buf):
        raise Malformed(f"length runs {end - len(buf)} bytes past the end of the data")


def check_count(n: int, pos: int, buf: bytes, min_size: int) -> None:
    """Refuse a count that cannot fit the bytes left (2**31 claimed with 4 bytes of data)."""
    if n * min_size > len(buf) - pos:
        raise Malformed(f"array of {n} elements cannot fit in the {len(buf) - pos} bytes left")


def read_bool(byte: int) -> bool:
    """A bool byte; only 0 and 1 re-encode to themselves."""
    if byte > 1:
        raise Malformed(f"bool byte {byte} is neither 0 nor 1")
    return byte == 1


# Decoding reads bools as unsigned bytes, so that a byte of 2 is caught rather than folded into True.
DECODE_FORMAT = {**STRUCT_FORMAT, "bool": "B"}


def uuid_from(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=raw)


# Arrays of ints are read and written with one struct call; formats of small counts are
# compiled once here rather than looked up by format string on every array.
ARRAY_CACHE = 256
_ARRAY_UNPACK = {c: [struct.Struct(f">{n}{c}").unpack_from for n in range(ARRAY_CACHE)]
                 for c in set(STRUCT_FORMAT.values())}
_ARRAY_PACK = {c: [struct.Struct(f">{n}{c}").pack for n in range(ARRAY_CACHE)]
               for c in set(STRUCT_FORMAT.values())}

BASE_NAMESPACE: dict[str, Any] = {
    "Malformed": Malformed,
    "read_uvarint": read_uvarint,
    "write_uvarint": write_uvarint,
    "uvarint_bytes": uvarint_bytes,
    "_check_len": check_len,
    "_count": check_count,
    "_uuid_from": uuid_from,
    "_bool": read_bool,
    "UUID": uuid.UUID,
    "unpack_from": struct.unpack_from,
    "pack": struct.pack,
    "UNKNOWN_TAGS": UNKNOWN_TAGS,
    **{f"AU_{ord(c)}": v for c, v in _ARRAY_UNPACK.items()},
    **{f"AP_{ord(c)}": v for c, v in _ARRAY_PACK.items()},
}


def min_wire_size(field: Field, flexible: bool) -> int:
    """The fewest bytes a value of this field can take (for array-count sanity checks)."""
    if field.array:
        return 1 if flexible else 4
    if field.type in FIXED_WIDTH:
        return FIXED_WIDTH[field.type]
    if field.type == "uuid":
        return 16
    if field.type == "struct":
        assert field.fields is not None
        own = sum(min_wire_size(f, flexible) for f in field.fields if f.tag is None)
        return (1 if field.nullable else 0) + own + (1 if flexible else 0)
    if field.type == "string":
        return 1 if flexible else 2
    return 1 if flexible else 4  # bytes, records
