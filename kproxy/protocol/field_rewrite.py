"""Generic field rewriting through the codec: the ``rewrite`` rule action.

A field is named by a path of snake_case field names, ``[]`` marking arrays
(every element is visited): ``acks``, ``topics[].name``,
``resources[].configs[].value``, ``topic_data[].partition_data[].index``. In a
request, ``client_id`` names the header's client id (no request body has a
top-level field of that name). A :class:`FieldEdit` either sets the value,
maps it through a table of values, or maps string prefixes; :func:`rename_topics`
maps the prefixes of every topic name (every field whose spec ``entityType``
is ``topicName``, at any depth).

Only the top-level fields a path starts with are decoded and re-encoded
(:func:`~kproxy.protocol.splice.splice_body`); the rest of the frame, including
bytes a client sent after a request body, is copied as is. Tagged fields are
edited only where they are on the wire (a path never adds one).

Bad input: :class:`~kproxy.protocol.errors.FieldRewriteError` for a path that
names nothing in this version or a value the field cannot hold;
:class:`~kproxy.protocol.errors.DecodeError` for a frame that does not parse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kproxy.protocol.errors import FieldRewriteError
from kproxy.protocol.headers import encode_request_header, response_body_offset
from kproxy.protocol.message_schemas import Field, MessageType, message_schema
from kproxy.protocol.mutation import Mutation, reframe, request_header
from kproxy.protocol.splice import Edit, splice_body

_UNSET: Any = object()
_INT_RANGES = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
_UINT_RANGES = {"uint16": 16, "uint32": 32}


@dataclass(frozen=True, slots=True)
class FieldEdit:
    """One edit of the fields a path reaches: exactly one of ``value`` (set),
    ``values`` (old value -> new value; others kept) or ``prefixes`` (for
    strings: the first ``(old, new)`` pair whose ``old`` starts the value
    replaces that prefix)."""

    path: str
    value: Any = _UNSET
    values: Mapping[Any, Any] | None = None
    prefixes: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        given = (self.value is not _UNSET) + (self.values is not None) + bool(self.prefixes)
        if given != 1:
            raise ValueError("a FieldEdit sets a value, maps values or maps prefixes: exactly one")

    def apply(self, old: Any, leaf: Field) -> Any:
        if self.value is not _UNSET:
            return coerce(self.value, leaf, self.path)
        if self.values is not None:
            return coerce(self.values[old], leaf, self.path) if old in self.values else old
        return map_prefix(old, self.prefixes)


def map_prefix(value: Any, prefixes: Sequence[tuple[str, str]]) -> Any:
    """``value`` with its first matching prefix replaced (non-strings and misses unchanged)."""
    if isinstance(value, str):
        for old, new in prefixes:
            if value.startswith(old):
                return new + value[len(old):]
    return value


def coerce(value: Any, leaf: Field, path: str) -> Any:
    """``value`` as the field's wire type, or :class:`FieldRewriteError` when it cannot be one."""
    t = leaf.type
    if value is None:
        if t in ("string", "bytes", "records") or leaf.nullable:
            return None
        raise FieldRewriteError(f"{path} ({t}) cannot be null", field=path)
    if t in _INT_RANGES or t in _UINT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldRewriteError(f"{path} is an {t}: {value!r} is not an integer", field=path)
        bits = _INT_RANGES.get(t)
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if bits else (0, 2 ** _UINT_RANGES[t] - 1)
        if not lo <= value <= hi:
            raise FieldRewriteError(f"{path} is an {t}: {value} is outside [{lo}, {hi}]", field=path)
        return value
    if t == "bool":
        if not isinstance(value, bool):
            raise FieldRewriteError(f"{path} is a bool: {value!r} is not true or false", field=path)
        return value
    if t == "float64":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FieldRewriteError(f"{path} is a float64: {value!r} is not a number", field=path)
        return float(value)
    if t == "string":
        if not isinstance(value, str):
            raise FieldRewriteError(f"{path} is a string: {value!r} is not one", field=path)
        return value
    if t in ("bytes", "records"):
        if isinstance(value, str):
            return value.encode("utf-8")
        if isinstance(value, bytes | bytearray):
            return bytes(value)
        raise FieldRewriteError(f"{path} is {t}: {value!r} is neither text nor bytes", field=path)
    raise FieldRewriteError(f"{path} is a {t}: only scalar fields can be rewritten", field=path)


def _parse(path: str) -> list[tuple[str, bool]]:
    return [(part.removesuffix("[]"), part.endswith("[]")) for part in path.split(".")]


def _resolve(fields: tuple[Field, ...], path: str) -> list[Field]:
    """The Field of each step of ``path``, or FieldRewriteError naming the first that is missing."""
    out: list[Field] = []
    for name, is_list in _parse(path):
        found = next((f for f in fields if f.name == name), None)
        if found is None or found.array != is_list:
            raise FieldRewriteError(f"no field {path!r} in this version (at {name!r}; arrays end in [])",
                                    field=path)
        out.append(found)
        fields = found.fields or ()
    leaf = out[-1]
    if leaf.type == "struct":
        raise FieldRewriteError(f"{path!r} is a struct: name one of its fields", field=path)
    return out


def rewrite_fields(frame: bytes, api_key: int, api_version: int, direction: MessageType,
                   edits: Sequence[FieldEdit]) -> Mutation:
    """Apply ``edits`` to a request or response frame (size prefix included).

    ``changed`` counts values that differ afterwards; with none the same frame
    object is returned. Every path is checked against this version's schema
    before anything is edited.
    """
    schema = message_schema(api_key, api_version, direction)
    if schema is None:
        raise FieldRewriteError(f"no schema for api key {api_key} v{api_version} {direction.name.lower()}s")
    header_edits = [e for e in edits if e.path == "client_id" and direction is MessageType.REQUEST
                    and not any(f.name == "client_id" for f in schema.fields)]
    body_edits = [e for e in edits if e not in header_edits]
    plans = [(e, _resolve(schema.fields, e.path)) for e in body_edits]
    count = [0]
    by_top: dict[str, list[tuple[FieldEdit, list[Field]]]] = {}
    for edit, steps in plans:
        by_top.setdefault(steps[0].name, []).append((edit, steps))
    splice_edits = {name: _top_edit(group, count) for name, group in by_top.items()}
    new_header: bytes | None = None
    if direction is MessageType.REQUEST:
        header = request_header(frame)
        offset = 4 + header.size
        client_id = header.client_id
        for edit in header_edits:
            if header.header_version < 1:
                raise FieldRewriteError("request header v0 has no client_id", field="client_id")
            client_id = edit.apply(client_id, Field("client_id", "string", False, True, None, None, None, None))
        if client_id != header.client_id:
            count[0] += 1
            new_header = encode_request_header(header._replace(client_id=client_id))
    else:
        offset = response_body_offset(frame, api_key, api_version, whole=True)
    new_body: bytes | None = None
    if splice_edits:
        new_body, _ = splice_body(api_key, api_version, direction, frame, splice_edits, offset)
    if not count[0]:
        return Mutation(frame, 0)
    return Mutation(reframe(frame, offset, new_body if new_body is not None else frame[offset:], new_header),
                    count[0])


def _top_edit(group: list[tuple[FieldEdit, list[Field]]], count: list[int]) -> Edit:
    def edit(value: Any) -> Any:
        for fe, steps in group:
            value = _walk(value, steps, 0, fe, count)
        return value

    return edit


def _walk(value: Any, steps: list[Field], i: int, fe: FieldEdit, count: list[int]) -> Any:
    """``value`` (of ``steps[i]``) with the edit applied below it."""
    step = steps[i]
    if value is None:
        return None
    if i == len(steps) - 1:
        if step.array:
            return [_leaf(item, step, fe, count) for item in value]
        return _leaf(value, step, fe, count)
    child = steps[i + 1]
    for item in value if step.array else (value,):
        if child.name in item:
            item[child.name] = _walk(item[child.name], steps, i + 1, fe, count)
    return value


def _leaf(old: Any, leaf: Field, fe: FieldEdit, count: list[int]) -> Any:
    element = Field(leaf.name, leaf.type, False, leaf.nullable, None, None, None, leaf.entity_type)
    new = fe.apply(old, element)
    if new != old or type(new) is not type(old):
        count[0] += 1
    return new


def rename_topics(frame: bytes, api_key: int, api_version: int, direction: MessageType,
                  prefixes: Sequence[tuple[str, str]]) -> Mutation:
    """Map the prefixes of every topic name in a request or response (``orders-`` -> ``staging-orders-``).

    Topic names are the fields the specs mark ``entityType: topicName``, at
    any depth; topic ids are not touched. ``changed`` counts renamed names.
    """
    schema = message_schema(api_key, api_version, direction)
    if schema is None:
        raise FieldRewriteError(f"no schema for api key {api_key} v{api_version} {direction.name.lower()}s")
    count = [0]
    tops = [f for f in schema.fields if _has_topic_name(f)]
    if not tops:
        return Mutation(frame, 0)

    def editor(f: Field) -> Edit:
        return lambda value: _rename(value, f, prefixes, count)

    offset = 4 + request_header(frame).size if direction is MessageType.REQUEST else \
        response_body_offset(frame, api_key, api_version, whole=True)
    new_body, _ = splice_body(api_key, api_version, direction, frame, {f.name: editor(f) for f in tops}, offset)
    if new_body is None or not count[0]:
        return Mutation(frame, 0)
    return Mutation(reframe(frame, offset, new_body), count[0])


def _has_topic_name(f: Field) -> bool:
    if f.entity_type == "topicName" and f.type == "string":
        return True
    return any(_has_topic_name(sub) for sub in f.fields or ())


def _rename(value: Any, f: Field, prefixes: Sequence[tuple[str, str]], count: list[int]) -> Any:
    if value is None:
        return None
    if f.type == "string" and f.entity_type == "topicName":
        items = value if f.array else [value]
        renamed = [map_prefix(v, prefixes) for v in items]
        count[0] += sum(1 for a, b in zip(items, renamed, strict=True) if a != b)
        return renamed if f.array else renamed[0]
    if f.type == "struct" and f.fields is not None:
        for item in value if f.array else (value,):
            for sub in f.fields:
                if sub.name in item and _has_topic_name(sub):
                    item[sub.name] = _rename(item[sub.name], sub, prefixes, count)
    return value


__all__ = ["FieldEdit", "coerce", "map_prefix", "rename_topics", "rewrite_fields"]
