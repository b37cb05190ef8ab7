"""The ``rewrite`` action: set fields, map their values, or map topic-name prefixes, in requests or responses.

YAML: ``- rewrite: {direction: request|response, set: {acks: 1}, map: {acks: {-1: 1}},
topic_prefix: {"old-": "new-"}}``. Field paths are dotted, ``[]`` for every element of an array
(``topics[].name``); a path that names no field of the rule's apis in any version is refused when
the rule file is loaded.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import yaml

from kproxy.protocol.codes import api_snake_name
from kproxy.protocol.field_rewrite import FieldEdit, rename_topics, rewrite_fields
from kproxy.protocol.message_schemas import MessageType, message_schema, supported_versions
from kproxy.protocol.mutation import Mutation
from kproxy.protocol.record_faults import Selector
from kproxy.protocol.records import RecordBudget
from kproxy.rules.actions.base import RuleAction, Step
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader, did_you_mean

_FIELD_PATH = re.compile(r"[a-z_][a-z0-9_]*(\[\])?(\.[a-z_][a-z0-9_]*(\[\])?)*")


class RewriteDirection(enum.Enum):
    REQUEST = "request"
    RESPONSE = "response"


@dataclass(frozen=True, slots=True)
class Rewrite(RuleAction):
    """Set fields (dotted paths, ``[]`` for every array element), map their values through a
    table (values not in it are kept), or map topic-name prefixes."""

    direction: RewriteDirection = RewriteDirection.REQUEST
    set_fields: tuple[tuple[str, object], ...] = ()
    topic_prefix: tuple[tuple[str, str], ...] = ()
    map_fields: tuple[tuple[str, tuple[tuple[object, object], ...]], ...] = ()

    kind: ClassVar[str] = "rewrite"
    keys: ClassVar[tuple[str, ...]] = ("direction", "set", "map", "topic_prefix")

    def __post_init__(self) -> None:
        if not self.set_fields and not self.topic_prefix and not self.map_fields:
            raise ValueError("give set, map or topic_prefix")

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw: dict[str, Any] = {}
        if "direction" in m:
            kw["direction"] = reader.choice(m["direction"], f"{path}.direction", RewriteDirection)
        if "set" in m:
            kw["set_fields"] = _set_fields(reader, m["set"], f"{path}.set")
        if "map" in m:
            kw["map_fields"] = _value_maps(reader, m["map"], f"{path}.map")
        if "topic_prefix" in m:
            prefixes = reader.string_map(m["topic_prefix"], f"{path}.topic_prefix", lambda n, p, t: t)
            kw["topic_prefix"] = prefixes if isinstance(prefixes, Bad) else tuple(prefixes)
        made = reader.made(at, path, kw, cls)
        if not isinstance(made, Rewrite) or apis is None:
            return made
        read: Rewrite | Bad = made
        for key in ("set", "map"):
            for key_node, _ in m[key].value if key in m else ():
                reason = _unknown_field_path(str(key_node.value), apis, made.direction)
                if reason is not None:
                    read = reader.fail(key_node, f"{path}.{key}.{key_node.value}", reason)
        return read

    @property
    def edits_request(self) -> bool:
        return self.direction is RewriteDirection.REQUEST

    @property
    def edits_response(self) -> bool:
        return self.direction is RewriteDirection.RESPONSE

    def request_step(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                     ) -> Step | None:
        return self._step(api_key, api_version, MessageType.REQUEST) if self.edits_request else None

    def response_step(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                      ) -> Step | None:
        return self._step(api_key, api_version, MessageType.RESPONSE) if self.edits_response else None

    def _step(self, api_key: int, api_version: int, direction: MessageType) -> Step:
        edits = [FieldEdit(path, value=value) for path, value in self.set_fields]
        edits += [FieldEdit(path, values=dict(table)) for path, table in self.map_fields]
        prefixes = self.topic_prefix

        def run(frame: bytes) -> Mutation:
            changed = 0
            if edits:
                frame, changed = rewrite_fields(frame, api_key, api_version, direction, edits)
            if prefixes:
                frame, renamed = rename_topics(frame, api_key, api_version, direction, prefixes)
                changed += renamed
            return Mutation(frame, changed)

        paths = ", ".join([e.path for e in edits] + ["topic names" for _ in prefixes[:1]])
        return f"rewrite {direction.name.lower()} {paths}", run


def _set_fields(reader: NodeReader, node: yaml.Node, path: str) -> Any:
    """``{field.path: value, ...}`` with scalar values."""
    if not isinstance(node, yaml.MappingNode):
        return reader.fail(node, path, "expected a map of field path to value")
    pairs: list[tuple[str, object]] = []
    failed: Bad | None = None
    for k, v in node.value:
        field_path = str(k.value)
        if not _FIELD_PATH.fullmatch(field_path):
            failed = reader.fail(k, f"{path}.{field_path}", "expected a field path such as 'acks' or 'topics[].name'")
            continue
        if not isinstance(v, yaml.ScalarNode):
            failed = reader.fail(v, f"{path}.{field_path}", "expected a scalar value")
            continue
        pairs.append((field_path, reader.scalar(v)))
    return failed if failed is not None else tuple(pairs)


def _value_maps(reader: NodeReader, node: yaml.Node, path: str) -> Any:
    """``{field.path: {old: new, ...}}`` with scalar olds and news."""
    if not isinstance(node, yaml.MappingNode) or not node.value:
        return reader.fail(node, path, "expected a map of field path to a map of old value to new value")
    out: list[tuple[str, tuple[tuple[object, object], ...]]] = []
    bad = False
    for k, v in node.value:
        field_path = str(k.value)
        where = f"{path}.{field_path}"
        if not _FIELD_PATH.fullmatch(field_path):
            bad = bool(reader.fail(k, where, "expected a field path such as 'acks' or 'topics[].name'"))
            continue
        if not isinstance(v, yaml.MappingNode) or not v.value:
            bad = bool(reader.fail(v, where, "expected a map of old value to new value, e.g. {-1: 1}"))
            continue
        if not all(isinstance(n, yaml.ScalarNode) for pair in v.value for n in pair):
            bad = bool(reader.fail(v, where, "old and new values are scalars"))
            continue
        out.append((field_path, tuple((reader.scalar(a), reader.scalar(b)) for a, b in v.value)))
    return BAD if bad else tuple(out)


def _unknown_field_path(path: str, apis: frozenset[int], direction: RewriteDirection) -> str | None:
    """Why ``path`` names no field of these APIs' messages in any version; None when it does."""
    side = MessageType.REQUEST if direction is RewriteDirection.REQUEST else MessageType.RESPONSE
    if path == "client_id" and side is MessageType.REQUEST:
        return None  # the request header's client id (kproxy/protocol/field_rewrite.py)
    for key in sorted(apis):
        known = supported_versions(key)
        names: set[str] = set()
        found = False
        for version in range(known[0], known[1] + 1) if known else ():
            schema = message_schema(key, version, side)
            fields = schema.fields if schema is not None else ()
            for i, part in enumerate(path.split(".")):
                name, is_list = part.removesuffix("[]"), part.endswith("[]")
                if i == 0:
                    names.update(f.name for f in fields)
                match = next((f for f in fields if f.name == name), None)
                if match is None or match.array != is_list:
                    break
                fields = match.fields or ()
            else:
                found = True
                break
        if not found:
            first = path.split(".")[0].removesuffix("[]")
            return (f"no field {path!r} in {api_snake_name(key)} {side.name.lower()}s of any version "
                    f"(arrays end in []){did_you_mean(first, sorted(names))}")
    return None
