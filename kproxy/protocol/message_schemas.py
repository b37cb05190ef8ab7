"""Per-(api key, version) schemas, resolved from the generated tables.

``_tables.py`` holds every field with its version ranges, as the specs do. The
codec wants the opposite view: for one api key, one version and one direction,
the exact list of fields on the wire. :func:`message_schema` gives that view
(cached) as :class:`Field` trees, or ``None`` for a pair the tables do not know;
unknown pairs are data for the proxy, not errors.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any

from kproxy.protocol import _tables
from kproxy.protocol.codes import api_name

Range = tuple[int, int] | None


class MessageType(enum.IntEnum):
    """Which half of an exchange a message body is. Values index the tables."""

    REQUEST = 0
    RESPONSE = 1


FIXED_WIDTH = {"int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint16": 2, "uint32": 4, "float64": 8, "bool": 1}
STRUCT_FORMAT = {"int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint16": "H", "uint32": "I",
                 "float64": "d", "bool": "?"}
ERROR_CODE_FIELDS = frozenset({"error_code", "partition_error_code", "topic_config_error_code",
                               "acknowledge_error_code"})
PARTITION_FIELDS = frozenset({"partition_index", "partition", "partition_id"})


@dataclass(frozen=True, slots=True)
class Field:
    """One field as it is on the wire in one version.

    ``type`` is a primitive name (``int32``, ``string``, ``records``, ...) or
    ``struct``; ``array`` says it is a list of that. ``nullable`` is the spec's
    nullability in this version (decoders accept null everywhere, see codec).
    ``tag`` is set when the field is a tagged field in this version.
    """

    name: str
    type: str
    array: bool
    nullable: bool
    tag: int | None
    default: Any
    fields: tuple[Field, ...] | None
    entity_type: str | None

    @property
    def is_error_code(self) -> bool:
        return self.type == "int16" and not self.array and self.name in ERROR_CODE_FIELDS


@dataclass(frozen=True, slots=True)
class MessageSchema:
    """The body layout of one (api key, version, direction)."""

    api_key: int
    api_version: int
    direction: MessageType
    flexible: bool
    fields: tuple[Field, ...]

    @property
    def name(self) -> str:
        suffix = "Request" if self.direction is MessageType.REQUEST else "Response"
        return f"{api_name(self.api_key)}{suffix}"


def _in(rng: Range, version: int) -> bool:
    return rng is not None and rng[0] <= version <= rng[1]


def _resolve(raw_fields: tuple[Any, ...], version: int, flexible: bool) -> tuple[Field, ...]:
    out = []
    for name, ftype, versions, nullable, tag, tagged, default, sub, entity in raw_fields:
        is_tagged = flexible and tag is not None and _in(tagged, version)
        if not is_tagged and not _in(versions, version):
            continue
        array = ftype.startswith("[]")
        base = ftype[2:] if array else ftype
        out.append(Field(
            name=name,
            type=base,
            array=array,
            nullable=_in(nullable, version),
            tag=tag if is_tagged else None,
            default=default,
            fields=_resolve(sub, version, flexible) if sub is not None else None,
            entity_type=entity,
        ))
    return tuple(out)


@functools.cache
def message_schema(api_key: int, api_version: int, direction: MessageType) -> MessageSchema | None:
    """The schema of one message body, or ``None`` when the tables do not know it."""
    for first, last, first_flexible, raw_fields in _tables.MESSAGES.get((api_key, int(direction)), ()):
        if first <= api_version <= last:
            flexible = first_flexible is not None and api_version >= first_flexible
            return MessageSchema(api_key, api_version, MessageType(direction), flexible,
                                 _resolve(raw_fields, api_version, flexible))
    return None


@functools.cache
def supported_versions(api_key: int) -> tuple[int, int] | None:
    """The lowest and highest version the tables know for an api key (both directions)."""
    spans = [(v[0], v[1]) for d in (0, 1) for v in _tables.MESSAGES.get((api_key, d), ())]
    if not spans:
        return None
    return min(s[0] for s in spans), max(s[1] for s in spans)


def is_flexible(api_key: int, api_version: int) -> bool | None:
    """Whether a request of this version uses flexible encoding; ``None`` if unknown."""
    schema = message_schema(api_key, api_version, MessageType.REQUEST)
    return None if schema is None else schema.flexible


def known_api_keys() -> list[int]:
    return sorted(_tables.API_NAMES)


def all_message_kinds() -> list[tuple[int, int, MessageType]]:
    """Every (api key, version, direction) the tables know: what round-trip tests walk."""
    out: list[tuple[int, int, MessageType]] = []
    for (key, direction), variants in sorted(_tables.MESSAGES.items()):
        versions = sorted({v for first, last, _, _ in variants for v in range(first, last + 1)})
        out.extend((key, v, MessageType(direction)) for v in versions)
    return out
