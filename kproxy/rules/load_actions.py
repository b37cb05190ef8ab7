"""The parameters of each rule action (``inject_error``, ``delay``, ...), read from YAML nodes.

:class:`ActionReader` turns one ``actions:`` entry into a :mod:`kproxy.rules.model` action,
reporting problems as :class:`~kproxy.rules.yaml_nodes.NodeReader` does. The keys each action
takes are :data:`ACTION_KEYS`; rules/README.md documents them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from kproxy.host_port import parse_host_port
from kproxy.protocol import _tables
from kproxy.protocol.schema import Direction, message_schema, supported_versions
from kproxy.protocol.tables import ApiKey, api_snake_name, error_code
from kproxy.rules.model import (
    ACTION_APIS,
    ACTION_NAMES,
    MAX_DURATION_MS,
    MAX_DURATION_S,
    MAX_RATE,
    MIN_BYTES_PER_SECOND,
    MIN_REQUESTS_PER_SECOND,
    Action,
    Blackhole,
    CloseConnection,
    CorruptRecords,
    Delay,
    DelayPoint,
    Distribution,
    DowngradeApiVersions,
    DropResponse,
    DuplicateRecords,
    InjectError,
    InjectMode,
    InvalidSchemaId,
    MutateMetadata,
    PartitionRef,
    RecordTarget,
    ResetConnection,
    Rewrite,
    RewriteAddresses,
    RewriteDirection,
    SlowClose,
    Throttle,
    ThrottleScope,
)
from kproxy.rules.patterns import UserPattern, parse_replacement
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader, did_you_mean, node_kind

T = TypeVar("T")

ACTION_KEYS: dict[str, tuple[str, ...]] = {
    "inject_error": ("error", "partitions", "message", "mode"),
    "delay": ("ms", "jitter_ms", "distribution", "at"),
    "throttle": ("bytes_per_second", "requests_per_second", "scope", "burst_seconds"),
    "drop_response": (),
    "close_connection": (),
    "reset_connection": (),
    "blackhole": (),
    "slow_close": ("ms",),
    "corrupt_records": ("target",),
    "duplicate_records": ("copies",),
    "invalid_schema_id": ("schema_id",),
    "rewrite_addresses": ("map", "pattern", "replacement"),
    "mutate_metadata": ("hide_brokers", "hide_partitions", "move_leader", "shrink_isr"),
    "downgrade_api_versions": (),  # a map of api name -> max version, checked by name
    "rewrite": ("direction", "set", "map", "topic_prefix"),
}
ERROR_NAMES = tuple(name for name, _ in _tables.ERRORS.values())
_FIELD_PATH = re.compile(r"[a-z_][a-z0-9_]*(\[\])?(\.[a-z_][a-z0-9_]*(\[\])?)*")
INT32 = (-(2**31), 2**31 - 1)


class ActionReader(NodeReader):
    """The action readers of the rules loader (one ``act_<name>`` method per action)."""

    # -- actions ------------------------------------------------------------------------
    def action(self, node: yaml.Node, path: str, apis: frozenset[int] | None) -> Action | Bad:
        if isinstance(node, yaml.ScalarNode) and isinstance(self.scalar(node), str) and node.value in ACTION_KEYS:
            name, body = node.value, None  # a bare name: `- drop_response`
        elif isinstance(node, yaml.MappingNode) and len(node.value) == 1:
            key_node, body = node.value[0]
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else ""
            if name not in ACTION_KEYS:
                return self.fail(key_node, f"{path}.{name}",
                                 f"unknown action{did_you_mean(name, tuple(ACTION_KEYS))}")
        else:
            return self.fail(node, path, "an action is a mapping with one key, the action's name "
                                         "(e.g. '- delay: {ms: 100}')")
        kind = ACTION_NAMES[name]
        allowed = ACTION_APIS.get(kind)
        if allowed is not None and (apis is None or not apis <= allowed):
            names = ", ".join(sorted(api_snake_name(k) for k in allowed))
            return self.fail(node, f"{path}.{name}", f"acts on {names} only: restrict match.api to them")
        apath = f"{path}.{name}"
        if name == "downgrade_api_versions":
            return self.downgrade(body, node, apath)
        if body is None or (isinstance(body, yaml.ScalarNode) and body.tag == "tag:yaml.org,2002:null"):
            m: dict[str, yaml.Node] | None = {}
            at = node
        else:
            m = self.mapping(body, apath, ACTION_KEYS[name])
            at = body
        if m is None:
            return BAD
        maker: Callable[[dict[str, yaml.Node], yaml.Node, str], Action | Bad] = getattr(self, f"act_{name}")
        made = maker(m, at, apath)
        if isinstance(made, Rewrite) and apis is not None:
            direction = made.direction
            for key in ("set", "map"):
                for key_node, _ in m[key].value if key in m else ():
                    reason = _unknown_field_path(str(key_node.value), apis, direction)
                    if reason is not None:
                        made = self.fail(key_node, f"{apath}.{key}.{key_node.value}", reason)
        if (isinstance(made, InjectError) and made.partitions is not None and made.mode is InjectMode.RESPOND
                and (apis is None or ApiKey.PRODUCE in apis)):
            return self.fail(m.get("partitions", at), f"{apath}.partitions",
                             "a partial Produce failure needs mode: replace (answering without forwarding "
                             "would acknowledge records that were never written)")
        return made

    def _made(self, at: yaml.Node, path: str, kw: dict[str, Any], make: Callable[..., T]) -> T | Bad:
        if any(isinstance(v, Bad) for v in kw.values()):
            return BAD
        return self.build(at, path, lambda: make(**kw))

    def _required(self, m: dict[str, yaml.Node], at: yaml.Node, path: str, key: str, what: str) -> yaml.Node | None:
        if key not in m:
            self.fail(at, f"{path}.{key}", f"missing ({what})")
            return None
        return m[key]

    def act_inject_error(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        kw: dict[str, Any] = {}
        err = self._required(m, at, path, "error", "a Kafka error name or code")
        kw["error_code"] = BAD if err is None else self.error(err, f"{path}.error")
        if "partitions" in m:
            kw["partitions"] = self.one_or_many(m["partitions"], f"{path}.partitions",
                                                lambda n, p: self.integer(n, p, 0, INT32[1]))
        if "message" in m:
            kw["message"] = self.string(m["message"], f"{path}.message")
        if "mode" in m:
            kw["mode"] = self.choice(m["mode"], f"{path}.mode", InjectMode)
        return self._made(at, path, kw, InjectError)

    def error(self, node: yaml.Node, path: str) -> int | Bad:
        value = self.scalar(node)
        if isinstance(value, int) and not isinstance(value, bool):
            if value == 0:
                return self.fail(node, path, "NONE (0) is not an error")
            if not -(2**15) <= value < 2**15:
                return self.fail(node, path, f"{value} is not an int16 error code")
            return value
        if isinstance(value, str):
            code = error_code(value)
            if code is None:
                return self.fail(node, path, f"unknown Kafka error {value!r}{did_you_mean(value.upper(), ERROR_NAMES)}")
            if code == 0:
                return self.fail(node, path, "NONE (0) is not an error")
            return code
        return self.fail(node, path, f"expected a Kafka error name or code, got {node_kind(node, value)}")

    def act_delay(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        kw: dict[str, Any] = {}
        ms = self._required(m, at, path, "ms", "milliseconds")
        kw["ms"] = BAD if ms is None else self.number(ms, f"{path}.ms", 0.0, hi=MAX_DURATION_MS)
        if "jitter_ms" in m:
            kw["jitter_ms"] = self.number(m["jitter_ms"], f"{path}.jitter_ms", 0.0, hi=MAX_DURATION_MS)
        if "distribution" in m:
            kw["distribution"] = self.choice(m["distribution"], f"{path}.distribution", Distribution)
        if "at" in m:
            kw["at"] = self.choice(m["at"], f"{path}.at", DelayPoint)
        return self._made(at, path, kw, Delay)

    def act_throttle(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        kw: dict[str, Any] = {}
        # Bounded both ways: the hold a throttle imposes is debt / rate (see MIN_BYTES_PER_SECOND).
        for key, least in (("bytes_per_second", MIN_BYTES_PER_SECOND),
                           ("requests_per_second", MIN_REQUESTS_PER_SECOND)):
            if key in m:
                kw[key] = self.number(m[key], f"{path}.{key}", least, hi=MAX_RATE)
        if "scope" in m:
            kw["scope"] = self.choice(m["scope"], f"{path}.scope", ThrottleScope)
        if "burst_seconds" in m:
            kw["burst_s"] = self.number(m["burst_seconds"], f"{path}.burst_seconds", 0.0, exclusive=True,
                                        hi=MAX_DURATION_S)
        return self._made(at, path, kw, Throttle)

    def act_drop_response(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        return DropResponse()

    def act_close_connection(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        return CloseConnection()

    def act_reset_connection(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        return ResetConnection()

    def act_blackhole(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        return Blackhole()

    def act_slow_close(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        ms = self._required(m, at, path, "ms", "milliseconds to hold the connection before closing it")
        return self._made(at, path, {"ms": BAD if ms is None else self.number(ms, f"{path}.ms", 0.0, exclusive=True,
                                                                              hi=MAX_DURATION_MS)},
                          SlowClose)

    def act_corrupt_records(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        kw = {"target": self.choice(m["target"], f"{path}.target", RecordTarget)} if "target" in m else {}
        return self._made(at, path, kw, CorruptRecords)

    def act_duplicate_records(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        kw = {"copies": self.integer(m["copies"], f"{path}.copies", 1, 1000)} if "copies" in m else {}
        return self._made(at, path, kw, DuplicateRecords)

    def act_invalid_schema_id(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        kw = {"schema_id": self.integer(m["schema_id"], f"{path}.schema_id", *INT32)} if "schema_id" in m else {}
        return self._made(at, path, kw, InvalidSchemaId)

    def act_rewrite_addresses(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        kw: dict[str, Any] = {}
        if "map" in m:
            pairs = self.string_map(m["map"], f"{path}.map", self.host_port)
            kw["mapping"] = pairs if isinstance(pairs, Bad) else tuple(pairs)
        if "pattern" in m:
            kw["pattern"] = self.regex(m["pattern"], f"{path}.pattern", captures=True)
        if "replacement" in m:
            kw["replacement"] = self.string(m["replacement"], f"{path}.replacement")
            pattern, replacement = kw.get("pattern"), kw["replacement"]
            if isinstance(pattern, UserPattern) and isinstance(replacement, str):
                # Checked here for the replacement's own line (the model checks it again).
                checked = self.build(m["replacement"], f"{path}.replacement",
                                     lambda: parse_replacement(pattern, replacement))
                kw["replacement"] = BAD if isinstance(checked, Bad) else replacement
        return self._made(at, path, kw, RewriteAddresses)

    def host_port(self, node: yaml.Node, path: str, text: str) -> str | Bad:
        try:
            parse_host_port(text)
        except ValueError as exc:
            return self.fail(node, path, str(exc))
        return text

    def act_mutate_metadata(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        kw: dict[str, Any] = {}
        if "hide_brokers" in m:
            kw["hide_brokers"] = self.one_or_many(m["hide_brokers"], f"{path}.hide_brokers",
                                                  lambda n, p: self.integer(n, p, 0, INT32[1]))
        if "hide_partitions" in m:
            kw["hide_partitions"] = self.items(m["hide_partitions"], f"{path}.hide_partitions",
                                               self.partition_alone)
        if "move_leader" in m:
            kw["move_leader"] = self.items(m["move_leader"], f"{path}.move_leader",
                                           lambda n, p: self.partition_ref(n, p, ("to",), self.node_id))
        if "shrink_isr" in m:
            kw["shrink_isr"] = self.items(m["shrink_isr"], f"{path}.shrink_isr",
                                          lambda n, p: self.partition_ref(n, p, ("to",), self.node_ids))
        return self._made(at, path, kw, MutateMetadata)

    def partition_alone(self, node: yaml.Node, path: str) -> PartitionRef | Bad:
        """A ``{topic, partition}`` entry (BAD, not a tuple, when it does not read)."""
        got = self.partition_ref(node, path, ())
        return got if isinstance(got, Bad) else got[0]

    def node_id(self, node: yaml.Node, path: str) -> int | Bad:
        return self.integer(node, path, 0, INT32[1])

    def node_ids(self, node: yaml.Node, path: str) -> tuple[int, ...] | Bad:
        got: tuple[int, ...] | Bad = self.one_or_many(node, path, self.node_id, container=tuple)
        return got

    def partition_ref(self, node: yaml.Node, path: str, extra: tuple[str, ...],
                      read: Callable[[yaml.Node, str], Any] | None = None) -> Any:
        m = self.mapping(node, path, ("topic", "partition", *extra))
        if m is None:
            return BAD
        got: list[Any] = []
        for key in ("topic", "partition", *extra):
            if key not in m:
                got.append(self.fail(node, f"{path}.{key}", "missing"))
            elif key == "topic":
                got.append(self.string(m[key], f"{path}.topic"))
            elif key == "partition":
                got.append(self.integer(m[key], f"{path}.partition", 0, INT32[1]))
            else:
                assert read is not None
                got.append(read(m[key], f"{path}.{key}"))
        if any(isinstance(g, Bad) for g in got):
            return BAD
        ref = PartitionRef(got[0], got[1])
        return (ref,) if not extra else (ref, got[2])

    def downgrade(self, body: yaml.Node | None, at: yaml.Node, path: str) -> Action | Bad:
        if not isinstance(body, yaml.MappingNode):
            return self.fail(body or at, path, "expected a map of api name to max version, e.g. {produce: 7}")
        out: list[tuple[int, int]] = []
        bad = False
        for key_node, value_node in body.value:
            name = str(key_node.value)
            key = self.api(key_node, f"{path}.{name}")
            top = self.integer(value_node, f"{path}.{name}", 0, 2**15 - 1)
            if isinstance(key, Bad) or isinstance(top, Bad):
                bad = True
                continue
            known = supported_versions(key)
            if known is not None and top < known[0]:
                bad = True
                self.fail(value_node, f"{path}.{name}",
                          f"{api_snake_name(key)} has no version below {known[0]}; {top} would leave none")
                continue
            out.append((key, top))
        if bad:
            return BAD
        return self.build(at, path, lambda: DowngradeApiVersions(tuple(out)))

    def act_rewrite(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | Bad:
        kw: dict[str, Any] = {}
        if "direction" in m:
            kw["direction"] = self.choice(m["direction"], f"{path}.direction", RewriteDirection)
        if "set" in m:
            node = m["set"]
            if not isinstance(node, yaml.MappingNode):
                kw["set_fields"] = self.fail(node, f"{path}.set", "expected a map of field path to value")
            else:
                pairs: list[tuple[str, object]] = []
                for k, v in node.value:
                    field_path = str(k.value)
                    if not _FIELD_PATH.fullmatch(field_path):
                        kw["set_fields"] = self.fail(k, f"{path}.set.{field_path}",
                                                     "expected a field path such as 'acks' or 'topics[].name'")
                        continue
                    if not isinstance(v, yaml.ScalarNode):
                        kw["set_fields"] = self.fail(v, f"{path}.set.{field_path}", "expected a scalar value")
                        continue
                    pairs.append((field_path, self.scalar(v)))
                kw.setdefault("set_fields", tuple(pairs))
        if "map" in m:
            kw["map_fields"] = self.value_maps(m["map"], f"{path}.map")
        if "topic_prefix" in m:
            prefixes = self.string_map(m["topic_prefix"], f"{path}.topic_prefix", lambda n, p, t: t)
            kw["topic_prefix"] = prefixes if isinstance(prefixes, Bad) else tuple(prefixes)
        return self._made(at, path, kw, Rewrite)

    def value_maps(self, node: yaml.Node, path: str) -> Any:
        """``{field.path: {old: new, ...}}`` with scalar olds and news."""
        if not isinstance(node, yaml.MappingNode) or not node.value:
            return self.fail(node, path, "expected a map of field path to a map of old value to new value")
        out: list[tuple[str, tuple[tuple[object, object], ...]]] = []
        bad = False
        for k, v in node.value:
            field_path = str(k.value)
            where = f"{path}.{field_path}"
            if not _FIELD_PATH.fullmatch(field_path):
                bad = bool(self.fail(k, where, "expected a field path such as 'acks' or 'topics[].name'"))
                continue
            if not isinstance(v, yaml.MappingNode) or not v.value:
                bad = bool(self.fail(v, where, "expected a map of old value to new value, e.g. {-1: 1}"))
                continue
            if not all(isinstance(n, yaml.ScalarNode) for pair in v.value for n in pair):
                bad = bool(self.fail(v, where, "old and new values are scalars"))
                continue
            out.append((field_path, tuple((self.scalar(a), self.scalar(b)) for a, b in v.value)))
        return BAD if bad else tuple(out)


def _unknown_field_path(path: str, apis: frozenset[int], direction: RewriteDirection) -> str | None:
    """Why ``path`` names no field of these APIs' messages in any version; None when it does."""
    side = Direction.REQUEST if direction is RewriteDirection.REQUEST else Direction.RESPONSE
    if path == "client_id" and side is Direction.REQUEST:
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


