"""Rewrite a few top-level fields of a body without re-encoding the rest.

A Metadata response of 100,000 partitions is megabytes; the proxy only has to
change its ``brokers`` list. :func:`splice_body` skips the fields it was not
asked about (by length, no values built), decodes the named ones, hands each
to its edit function, encodes the result and joins the untouched byte ranges
around it. Top-level *tagged* fields (``node_endpoints`` of Produce v10+ and
Fetch v16+ responses, KIP-951) are handled the same way inside the tag section.

Edit functions receive the decoded value and return the new value; they may
mutate and return the same object.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

from kproxy.protocol.errors import DecodeError, EncodeError
from kproxy.protocol.message_schemas import MessageType
from kproxy.protocol.messages import MessageCodec, require_codec
from kproxy.protocol.primitives import Malformed, read_uvarint, write_uvarint

Edit = Callable[[Any], Any]
_FAILURES = (Malformed, struct.error, IndexError, ValueError, OverflowError)
_ENCODE_FAILURES = (struct.error, KeyError, TypeError, AttributeError, ValueError, OverflowError, IndexError)


def splice_body(api_key: int, api_version: int, direction: MessageType, data: bytes,
                edits: Mapping[str, Edit], offset: int = 0) -> tuple[bytes | None, list[str]]:
    """Apply ``edits`` (top-level field name -> edit) to the body at ``data[offset:]``.

    Returns ``(new_bytes, edited_field_names)``: ``new_bytes`` covers
    ``data[offset:]`` only (the caller keeps its header); it is ``None`` when
    none of the fields is present in this version or on the wire (nothing is
    copied: a multi-megabyte Fetch response without node endpoints costs a walk
    of its partitions, not a copy).
    Raises :class:`DecodeError` on malformed bodies.
    """
    codec, steps, tagged = _plan(api_key, api_version, direction, frozenset(edits))
    pieces: list[bytes] = []
    done: list[str] = []
    mark = offset
    pos = offset
    try:
        for name, decode, encode, skip, edited in steps:
            if not edited:
                pos = skip(data, pos)
                continue
            value, end = decode(data, pos)
            out = bytearray()
            _encode_edit(encode, out, edits[name](value), codec, name)
            pieces.append(data[mark:pos])
            pieces.append(bytes(out))
            mark = pos = end
            done.append(name)
        if tagged:
            pos = _splice_tags(codec, data, pos, tagged, edits, pieces, mark, done)
            mark = pos
    except _FAILURES as exc:
        codec.decode(data, offset)  # raises a DecodeError that says where
        raise DecodeError(f"malformed body: {exc}", offset=pos) from None
    if not done:
        return None, done
    pieces.append(data[mark:])
    return b"".join(pieces), done


Step = tuple[str, Callable[..., Any], Callable[..., Any], Callable[..., Any], bool]
_plans: dict[tuple[int, int, MessageType, frozenset[str]], tuple[MessageCodec, list[Step], dict[int, Any]]] = {}


def _plan(api_key: int, api_version: int, direction: MessageType, names: frozenset[str]
          ) -> tuple[MessageCodec, list[Step], dict[int, Any]]:
    """The walk for one (message kind, set of edited fields), worked out once.

    Steps are the top-level regular fields up to the last edited one (without
    tagged edits the rest is copied as is); ``tagged`` maps tag -> field for
    edited tagged fields of flexible versions.
    """
    key = (api_key, api_version, direction, names)
    found = _plans.get(key)
    if found is None:
        codec = require_codec(api_key, api_version, direction)
        fields = codec.schema.fields
        tagged = {f.tag: f for f in fields if f.tag is not None and f.name in names} if codec.schema.flexible else {}
        regular = [f for f in fields if f.tag is None]
        wanted = [i for i, f in enumerate(regular) if f.name in names]
        stop = len(regular) if tagged or not wanted else wanted[-1] + 1
        steps = [(f.name, *codec.field_functions(f.name), f.name in names) for f in regular[:stop]]
        found = (codec, steps, tagged)
        if len(_plans) < 4096:  # edit sets come from code, not traffic; the bound is a safety net
            _plans[key] = found
    return found


def _encode_edit(encode: Callable[..., Any], out: bytearray, value: Any, codec: Any, name: str) -> None:
    """Encode an edited value; a value the schema cannot hold is the edit's fault: EncodeError."""
    try:
        encode(out, value)
    except _ENCODE_FAILURES as exc:
        what = f"missing field {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
        raise EncodeError(f"cannot encode the edited {name} of {codec.schema.name} v{codec.schema.api_version}: "
                          f"{what}", field=name) from None


def _splice_tags(codec: Any, data: bytes, pos: int, tagged: dict[int, Any], edits: Mapping[str, Edit],
                 pieces: list[bytes], mark: int, done: list[str]) -> int:
    """Rewrite the chosen tagged fields of the top-level tag section starting at ``pos``.

    Appends to ``pieces`` everything from ``mark`` up to the end of the section
    and returns that end.
    """
    count, pos = read_uvarint(data, pos)
    out = bytearray()
    changed = False
    section_start = pos
    for _ in range(count):
        start = pos
        tag, pos = read_uvarint(data, pos)
        size, pos = read_uvarint(data, pos)
        end = pos + size
        if end > len(data):
            raise Malformed("tagged field runs past the end of the body")
        field = tagged.get(tag)
        if field is None:
            out += data[start:end]
        else:
            decode, encode, _ = codec.field_functions(field.name)
            value, stop = decode(data, pos)
            if stop != end:
                raise Malformed(f"tagged field {tag} size mismatch")
            sub = bytearray()
            _encode_edit(encode, sub, edits[field.name](value), codec, field.name)
            write_uvarint(out, tag)
            write_uvarint(out, len(sub))
            out += sub
            changed = True
            done.append(field.name)
        pos = end
    if changed:
        pieces.append(data[mark:section_start])
        pieces.append(bytes(out))
    else:
        pieces.append(data[mark:pos])
    return pos
