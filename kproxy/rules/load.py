"""Rule files (YAML) to a :class:`~kproxy.rules.model.RuleSet`, with every problem reported.

The loader walks PyYAML's *composed* node tree (``yaml.compose``) rather than
the constructed Python objects, because nodes keep their line numbers. It
never stops at the first problem: it collects all of them and raises one
:class:`RulesError` whose ``problems`` each print as::

    rules.yaml:7: rules[0].match.topc: unknown key (did you mean 'topic'?)

Unknown keys, api names and Kafka error names get a did-you-mean from
:mod:`difflib`. The format is documented in ``rules/README.md`` and described
by ``rules/kproxy-rules.schema.json``.

Size (over the ~500 lines the project aims for), to be split next: the node-walking helpers and
the per-action parameter readers are separable (a ``load_actions`` module), and will be split
once the rules wiring has settled; today one walker keeps every error message's path format in
one place.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

from kproxy.protocol import _tables
from kproxy.protocol.schema import Direction, message_schema, supported_versions
from kproxy.protocol.tables import ApiKey, api_key, api_snake_name, error_code
from kproxy.rules.model import (
    ACTION_APIS,
    ACTION_NAMES,
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
    IpNetwork,
    Match,
    MutateMetadata,
    PartitionRef,
    RecordTarget,
    ResetConnection,
    Rewrite,
    RewriteAddresses,
    RewriteDirection,
    Rule,
    RuleSet,
    Schedule,
    SlowClose,
    Throttle,
    ThrottleScope,
    TimeWindow,
    TopicPattern,
)

T = TypeVar("T")

TOP_KEYS = ("seed", "rules")
RULE_KEYS = ("id", "description", "enabled", "continue", "dry_run", "seed", "match", "actions")
MATCH_KEYS = ("api", "api_version", "client_id", "client_address", "broker_id", "topic", "partition", "group_id",
              "transactional_id", "acks", "probability", "schedule")
SCHEDULE_KEYS = ("after_requests", "after_seconds", "for_seconds", "every", "first", "window")
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
API_NAMES = tuple(api_snake_name(k) for k in _tables.API_NAMES)
_FIELD_PATH = re.compile(r"[a-z_][a-z0-9_]*(\[\])?(\.[a-z_][a-z0-9_]*(\[\])?)*")
_TIME_OF_DAY = re.compile(r"([01]?\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?")
_INT32 = (-(2**31), 2**31 - 1)


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong in a rule file, printed as ``file:line: key.path: reason``."""

    file: str
    line: int
    key: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.key}: {self.reason}"


class RulesError(Exception):
    """A rule file that cannot be loaded; ``problems`` lists every problem found, in file order."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.file, p.line))
        super().__init__("\n".join(str(p) for p in self.problems))


class _Bad:
    """Marks a value that already produced a problem (so nothing downstream repeats it)."""


BAD = _Bad()


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_text(text: str, source: str = "<rules>") -> RuleSet:
    """Parse rule-file text; raises :class:`RulesError` listing every problem."""
    return _Loader(source).load(text)


def load_data(data: Any, source: str = "<data>") -> RuleSet:
    """Load a rule file already parsed (JSON from the admin API: ``{"rules": [...], "seed": N}``)
    with the same checks and messages as a file. Problems' lines are of the YAML this function
    renders and mean nothing to the caller; their key paths do."""
    try:
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError as exc:
        raise RulesError([Problem(source, 0, "(data)", f"not plain data: {exc}")]) from None
    return load_text(text, source)


def load_file(path: str) -> RuleSet:
    """Read and parse a rule file; an unreadable file is one problem at line 0."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RulesError([Problem(path, 0, "(file)", f"cannot read: {reason}")]) from None
    return load_text(text, path)


class _Loader:
    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[Problem] = []
        self._yaml: yaml.SafeLoader | None = None

    # -- reporting ------------------------------------------------------------------
    def fail(self, node: yaml.Node, key: str, reason: str) -> _Bad:
        self.problems.append(Problem(self.source, node.start_mark.line + 1, key, reason))
        return BAD

    def build(self, node: yaml.Node, key: str, make: Callable[[], T]) -> T | _Bad:
        """Construct a model value; its own ValueError becomes a problem at ``node``."""
        try:
            return make()
        except ValueError as exc:
            return self.fail(node, key, str(exc))

    # -- the document ---------------------------------------------------------------
    def load(self, text: str) -> RuleSet:
        try:
            self._yaml = yaml.SafeLoader(text)
            root = self._yaml.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else 0
            raise RulesError([Problem(self.source, line, "(yaml)", str(exc.problem or exc.context))]) from None
        except yaml.YAMLError as exc:
            raise RulesError([Problem(self.source, 0, "(yaml)", str(exc))]) from None
        if root is None:
            raise RulesError([Problem(self.source, 1, "(file)", "empty rule file: expected 'rules:'")])
        top = self.mapping(root, "", TOP_KEYS)
        seed: Any = 0
        rules: list[Rule] = []
        if top is not None:
            if "seed" in top:
                seed = self.integer(top["seed"], "seed", *_INT32)
            if "rules" not in top:
                self.fail(root, "rules", "missing (a list of rules)")
            else:
                rules = self.rules(top["rules"])
        if self.problems:
            raise RulesError(self.problems)
        return RuleSet(tuple(rules), seed if isinstance(seed, int) else 0, self.source)

    def rules(self, node: yaml.Node) -> list[Rule]:
        out: list[Rule] = []
        items = self.sequence(node, "rules")
        seen: dict[str, int] = {}
        for i, item in enumerate(items):
            rule = self.rule(item, f"rules[{i}]", seen)
            if not isinstance(rule, _Bad):
                out.append(rule)
        return out

    def rule(self, node: yaml.Node, path: str, seen: dict[str, int]) -> Rule | _Bad:
        m = self.mapping(node, path, RULE_KEYS)
        if m is None:
            return BAD
        rule_id: Any = BAD
        if "id" not in m:
            self.fail(node, f"{path}.id", "missing (every rule needs an id)")
        else:
            rule_id = self.string(m["id"], f"{path}.id")
            if isinstance(rule_id, str):
                if rule_id in seen:
                    self.fail(m["id"], f"{path}.id", f"duplicate rule id {rule_id!r} (first at line {seen[rule_id]})")
                else:
                    seen[rule_id] = m["id"].start_mark.line + 1
        description: Any = self.string(m["description"], f"{path}.description") if "description" in m else None
        enabled: Any = self.boolean(m["enabled"], f"{path}.enabled") if "enabled" in m else True
        cont: Any = self.boolean(m["continue"], f"{path}.continue") if "continue" in m else False
        dry_run: Any = self.boolean(m["dry_run"], f"{path}.dry_run") if "dry_run" in m else False
        seed: Any = self.integer(m["seed"], f"{path}.seed", *_INT32) if "seed" in m else None
        match: Any = BAD
        if "match" not in m:
            self.fail(node, f"{path}.match", "missing (use 'match: {}' to match every request)")
        else:
            match = self.match(m["match"], f"{path}.match")
        actions: list[Any] = []
        if "actions" not in m:
            self.fail(node, f"{path}.actions", "missing (a list of one or more actions)")
        else:
            items = self.sequence(m["actions"], f"{path}.actions")
            if not items and isinstance(m["actions"], yaml.SequenceNode):
                self.fail(m["actions"], f"{path}.actions", "empty: a rule needs at least one action")
            apis = match.apis if isinstance(match, Match) else None
            actions = [self.action(item, f"{path}.actions[{j}]", apis) for j, item in enumerate(items)]
        parts = (rule_id, description, enabled, cont, dry_run, seed, match, *actions)
        if any(isinstance(p, _Bad) for p in parts) or not actions:
            return BAD
        return self.build(node, path, lambda: Rule(
            id=rule_id, match=match, actions=tuple(actions), description=description, enabled=enabled,
            continue_=cont, dry_run=dry_run, seed=seed))

    # -- match ------------------------------------------------------------------------
    def match(self, node: yaml.Node, path: str) -> Match | _Bad:
        m = self.mapping(node, path, MATCH_KEYS)
        if m is None:
            return BAD
        kw: dict[str, Any] = {}
        if "api" in m:
            kw["apis"] = self.one_or_many(m["api"], f"{path}.api", self.api)
        if "api_version" in m:
            kw["min_version"], kw["max_version"] = self.version_range(m["api_version"], f"{path}.api_version")
        if "client_id" in m:
            kw["client_id"] = self.regex(m["client_id"], f"{path}.client_id")
        if "client_address" in m:
            kw["client_address"] = self.one_or_many(m["client_address"], f"{path}.client_address", self.cidr,
                                                    container=tuple)
        if "broker_id" in m:
            kw["broker_ids"] = self.one_or_many(m["broker_id"], f"{path}.broker_id",
                                                lambda n, p: self.integer(n, p, 0, _INT32[1]))
        if "topic" in m:
            kw["topics"] = self.one_or_many(m["topic"], f"{path}.topic", self.topic, container=tuple)
        if "partition" in m:
            kw["partitions"] = self.one_or_many(m["partition"], f"{path}.partition",
                                                lambda n, p: self.integer(n, p, 0, _INT32[1]))
        for key in ("group_id", "transactional_id"):
            if key in m:
                kw[key] = self.regex(m[key], f"{path}.{key}")
        if "acks" in m:
            kw["acks"] = self.one_or_many(m["acks"], f"{path}.acks", self.acks)
        if "probability" in m:
            kw["probability"] = self.number(m["probability"], f"{path}.probability")
        if "schedule" in m:
            kw["schedule"] = self.schedule(m["schedule"], f"{path}.schedule")
        if any(isinstance(v, _Bad) for v in kw.values()):
            return BAD
        # Point at the key a model check is about, when there is one.
        where = next((k for k in ("probability", "acks", "api_version") if k in m), None)
        at = m[where] if where else node
        return self.build(at, f"{path}.{where}" if where else path, lambda: Match(**kw))

    def api(self, node: yaml.Node, path: str) -> int | _Bad:
        value = self.scalar(node)
        if isinstance(value, int) and not isinstance(value, bool):
            if value not in _tables.API_NAMES:
                return self.fail(node, path, f"unknown api key {value}")
            return value
        if isinstance(value, str):
            key = api_key(value)
            if key is None:
                return self.fail(node, path, f"unknown api {value!r}{did_you_mean(value.lower(), API_NAMES)}")
            return key
        return self.fail(node, path, f"expected an api name or key, got {_kind(node, value)}")

    def version_range(self, node: yaml.Node, path: str) -> tuple[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            m = self.mapping(node, path, ("min", "max"))
            if m is None:
                return BAD, BAD
            lo = self.integer(m["min"], f"{path}.min", 0, 2**15 - 1) if "min" in m else None
            hi = self.integer(m["max"], f"{path}.max", 0, 2**15 - 1) if "max" in m else None
            if lo is None and hi is None:
                return self.fail(node, path, "give min, max or both"), BAD
            return lo, hi
        v = self.integer(node, path, 0, 2**15 - 1)
        return v, v

    def topic(self, node: yaml.Node, path: str) -> TopicPattern | _Bad:
        if isinstance(node, yaml.MappingNode):
            m = self.mapping(node, path, ("regex", "glob"))
            if m is None:
                return BAD
            if len(m) != 1:
                return self.fail(node, path, "give exactly one of regex or glob")
            kind, value = next(iter(m.items()))
            text = self.string(value, f"{path}.{kind}")
            if isinstance(text, _Bad):
                return BAD
            if kind == "regex" and isinstance(self.regex(value, f"{path}.regex"), _Bad):
                return BAD
            return TopicPattern(text, is_regex=kind == "regex")
        text = self.string(node, path)
        return BAD if isinstance(text, _Bad) else TopicPattern(text)

    def acks(self, node: yaml.Node, path: str) -> int | _Bad:
        value = self.scalar(node)
        if value == "all":
            return -1
        if isinstance(value, int) and not isinstance(value, bool) and value in (-1, 0, 1):
            return value
        return self.fail(node, path, f"acks is all, -1, 0 or 1, got {_show(node, value)}")

    def cidr(self, node: yaml.Node, path: str) -> IpNetwork | _Bad:
        text = self.string(node, path)
        if isinstance(text, _Bad):
            return BAD
        try:
            return ipaddress.ip_network(text, strict=False)
        except ValueError as exc:
            return self.fail(node, path, f"not an address or CIDR block: {exc}")

    def schedule(self, node: yaml.Node, path: str) -> Schedule | _Bad:
        m = self.mapping(node, path, SCHEDULE_KEYS)
        if m is None:
            return BAD
        if not m:
            return self.fail(node, path, "empty schedule")
        kw: dict[str, Any] = {}
        if "after_requests" in m:
            kw["after_requests"] = self.integer(m["after_requests"], f"{path}.after_requests", 0)
        if "first" in m:
            kw["first"] = self.integer(m["first"], f"{path}.first", 1,
                                       reason="first must be >= 1 (first: 0 never matches)")
        if "every" in m:
            kw["every"] = self.integer(m["every"], f"{path}.every", 1)
        if "after_seconds" in m:
            kw["after_s"] = self.number(m["after_seconds"], f"{path}.after_seconds", 0.0)
        if "for_seconds" in m:
            kw["for_s"] = self.number(m["for_seconds"], f"{path}.for_seconds", 0.0, exclusive=True,
                                      reason="for_seconds must be > 0 (a zero duration never matches)")
        if "window" in m:
            kw["window"] = self.window(m["window"], f"{path}.window")
        if any(isinstance(v, _Bad) for v in kw.values()):
            return BAD
        return self.build(node, path, lambda: Schedule(**kw))

    def window(self, node: yaml.Node, path: str) -> TimeWindow | _Bad:
        m = self.mapping(node, path, ("start", "end"))
        if m is None:
            return BAD
        times: list[Any] = []
        for key in ("start", "end"):
            if key not in m:
                times.append(self.fail(node, f"{path}.{key}", "missing (a UTC time of day, \"HH:MM\")"))
                continue
            # The raw text: YAML 1.1 would read an unquoted 10:30 as the base-60 number 630.
            raw = m[key]
            found = _TIME_OF_DAY.fullmatch(raw.value) if isinstance(raw, yaml.ScalarNode) else None
            if found is None:
                times.append(self.fail(raw, f"{path}.{key}", "expected a UTC time of day \"HH:MM\" or \"HH:MM:SS\""))
                continue
            h, mi, s = found.groups()
            times.append(int(h) * 3600 + int(mi) * 60 + int(s or 0))
        if any(isinstance(t, _Bad) for t in times):
            return BAD
        return self.build(node, path, lambda: TimeWindow(times[0], times[1]))

    # -- actions ------------------------------------------------------------------------
    def action(self, node: yaml.Node, path: str, apis: frozenset[int] | None) -> Action | _Bad:
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
        maker: Callable[[dict[str, yaml.Node], yaml.Node, str], Action | _Bad] = getattr(self, f"act_{name}")
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

    def _made(self, at: yaml.Node, path: str, kw: dict[str, Any], make: Callable[..., T]) -> T | _Bad:
        if any(isinstance(v, _Bad) for v in kw.values()):
            return BAD
        return self.build(at, path, lambda: make(**kw))

    def _required(self, m: dict[str, yaml.Node], at: yaml.Node, path: str, key: str, what: str) -> yaml.Node | None:
        if key not in m:
            self.fail(at, f"{path}.{key}", f"missing ({what})")
            return None
        return m[key]

    def act_inject_error(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
        kw: dict[str, Any] = {}
        err = self._required(m, at, path, "error", "a Kafka error name or code")
        kw["error_code"] = BAD if err is None else self.error(err, f"{path}.error")
        if "partitions" in m:
            kw["partitions"] = self.one_or_many(m["partitions"], f"{path}.partitions",
                                                lambda n, p: self.integer(n, p, 0, _INT32[1]))
        if "message" in m:
            kw["message"] = self.string(m["message"], f"{path}.message")
        if "mode" in m:
            kw["mode"] = self.choice(m["mode"], f"{path}.mode", InjectMode)
        return self._made(at, path, kw, InjectError)

    def error(self, node: yaml.Node, path: str) -> int | _Bad:
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
        return self.fail(node, path, f"expected a Kafka error name or code, got {_kind(node, value)}")

    def act_delay(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
        kw: dict[str, Any] = {}
        ms = self._required(m, at, path, "ms", "milliseconds")
        kw["ms"] = BAD if ms is None else self.number(ms, f"{path}.ms", 0.0)
        if "jitter_ms" in m:
            kw["jitter_ms"] = self.number(m["jitter_ms"], f"{path}.jitter_ms", 0.0)
        if "distribution" in m:
            kw["distribution"] = self.choice(m["distribution"], f"{path}.distribution", Distribution)
        if "at" in m:
            kw["at"] = self.choice(m["at"], f"{path}.at", DelayPoint)
        return self._made(at, path, kw, Delay)

    def act_throttle(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
        kw: dict[str, Any] = {}
        for key in ("bytes_per_second", "requests_per_second"):
            if key in m:
                kw[key] = self.number(m[key], f"{path}.{key}", 0.0, exclusive=True)
        if "scope" in m:
            kw["scope"] = self.choice(m["scope"], f"{path}.scope", ThrottleScope)
        if "burst_seconds" in m:
            kw["burst_s"] = self.number(m["burst_seconds"], f"{path}.burst_seconds", 0.0, exclusive=True)
        return self._made(at, path, kw, Throttle)

    def act_drop_response(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
        return DropResponse()

    def act_close_connection(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
        return CloseConnection()

    def act_reset_connection(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
        return ResetConnection()

    def act_blackhole(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
        return Blackhole()

    def act_slow_close(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
        ms = self._required(m, at, path, "ms", "milliseconds to hold the connection before closing it")
        return self._made(at, path, {"ms": BAD if ms is None else self.number(ms, f"{path}.ms", 0.0, exclusive=True)},
                          SlowClose)

    def act_corrupt_records(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
        kw = {"target": self.choice(m["target"], f"{path}.target", RecordTarget)} if "target" in m else {}
        return self._made(at, path, kw, CorruptRecords)

    def act_duplicate_records(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
        kw = {"copies": self.integer(m["copies"], f"{path}.copies", 1, 1000)} if "copies" in m else {}
        return self._made(at, path, kw, DuplicateRecords)

    def act_invalid_schema_id(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
        kw = {"schema_id": self.integer(m["schema_id"], f"{path}.schema_id", *_INT32)} if "schema_id" in m else {}
        return self._made(at, path, kw, InvalidSchemaId)

    def act_rewrite_addresses(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
        kw: dict[str, Any] = {}
        if "map" in m:
            pairs = self.string_map(m["map"], f"{path}.map", self.host_port)
            kw["mapping"] = pairs if isinstance(pairs, _Bad) else tuple(pairs)
        if "pattern" in m:
            kw["pattern"] = self.regex(m["pattern"], f"{path}.pattern")
        if "replacement" in m:
            kw["replacement"] = self.string(m["replacement"], f"{path}.replacement")
        return self._made(at, path, kw, RewriteAddresses)

    def host_port(self, node: yaml.Node, path: str, text: str) -> str | _Bad:
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            return self.fail(node, path, f"expected host:port, got {text!r}")
        return text

    def act_mutate_metadata(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
        kw: dict[str, Any] = {}
        if "hide_brokers" in m:
            kw["hide_brokers"] = self.one_or_many(m["hide_brokers"], f"{path}.hide_brokers",
                                                  lambda n, p: self.integer(n, p, 0, _INT32[1]))
        if "hide_partitions" in m:
            kw["hide_partitions"] = self.items(m["hide_partitions"], f"{path}.hide_partitions",
                                               lambda n, p: self.partition_ref(n, p, ())[0])
        if "move_leader" in m:
            kw["move_leader"] = self.items(m["move_leader"], f"{path}.move_leader",
                                           lambda n, p: self.partition_ref(n, p, ("to",), self.node_id))
        if "shrink_isr" in m:
            kw["shrink_isr"] = self.items(m["shrink_isr"], f"{path}.shrink_isr",
                                          lambda n, p: self.partition_ref(n, p, ("to",), self.node_ids))
        return self._made(at, path, kw, MutateMetadata)

    def node_id(self, node: yaml.Node, path: str) -> int | _Bad:
        return self.integer(node, path, 0, _INT32[1])

    def node_ids(self, node: yaml.Node, path: str) -> tuple[int, ...] | _Bad:
        got: tuple[int, ...] | _Bad = self.one_or_many(node, path, self.node_id, container=tuple)
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
                got.append(self.integer(m[key], f"{path}.partition", 0, _INT32[1]))
            else:
                assert read is not None
                got.append(read(m[key], f"{path}.{key}"))
        if any(isinstance(g, _Bad) for g in got):
            return BAD
        ref = PartitionRef(got[0], got[1])
        return (ref,) if not extra else (ref, got[2])

    def downgrade(self, body: yaml.Node | None, at: yaml.Node, path: str) -> Action | _Bad:
        if not isinstance(body, yaml.MappingNode):
            return self.fail(body or at, path, "expected a map of api name to max version, e.g. {produce: 7}")
        out: list[tuple[int, int]] = []
        bad = False
        for key_node, value_node in body.value:
            name = str(key_node.value)
            key = self.api(key_node, f"{path}.{name}")
            top = self.integer(value_node, f"{path}.{name}", 0, 2**15 - 1)
            if isinstance(key, _Bad) or isinstance(top, _Bad):
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

    def act_rewrite(self, m: dict[str, yaml.Node], at: yaml.Node, path: str) -> Action | _Bad:
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
            kw["topic_prefix"] = prefixes if isinstance(prefixes, _Bad) else tuple(prefixes)
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

    # -- primitives -----------------------------------------------------------------------
    def scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return BAD
        assert self._yaml is not None
        return self._yaml.construct_object(node, deep=True)

    def mapping(self, node: yaml.Node, path: str, keys: Sequence[str]) -> dict[str, yaml.Node] | None:
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, path or "(top)", f"expected a mapping, got {_kind(node, self.scalar(node))}")
            return None
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            where = f"{path}.{key}" if path else key
            if key not in keys:
                self.fail(key_node, where, f"unknown key{did_you_mean(key, keys)}")
            elif key in out:
                self.fail(key_node, where, f"duplicate key (first at line {out[key].start_mark.line + 1})")
            else:
                out[key] = value_node
        return out

    def sequence(self, node: yaml.Node, path: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, path, f"expected a list, got {_kind(node, self.scalar(node))}")
            return []
        return list(node.value)

    def items(self, node: yaml.Node, path: str, read: Callable[[yaml.Node, str], Any]) -> tuple[Any, ...] | _Bad:
        got = [read(n, f"{path}[{i}]") for i, n in enumerate(self.sequence(node, path))]
        if not isinstance(node, yaml.SequenceNode) or any(isinstance(g, _Bad) for g in got):
            return BAD
        return tuple(got)

    def one_or_many(self, node: yaml.Node, path: str, read: Callable[[yaml.Node, str], Any],
                    container: Callable[[list[Any]], Any] = frozenset) -> Any:
        """A single value or a list of them (``api: produce`` or ``api: [produce, fetch]``)."""
        if isinstance(node, yaml.SequenceNode):
            got = [read(n, f"{path}[{i}]") for i, n in enumerate(node.value)]
            if not got:
                return self.fail(node, path, "empty list: it would never match")
        else:
            got = [read(node, path)]
        if any(isinstance(g, _Bad) for g in got):
            return BAD
        return container(got)

    def string_map(self, node: yaml.Node, path: str, check: Callable[[yaml.Node, str, str], Any]) -> Any:
        if not isinstance(node, yaml.MappingNode) or not node.value:
            return self.fail(node, path, "expected a non-empty map of strings")
        out: list[tuple[str, str]] = []
        bad = False
        for k, v in node.value:
            key = self.string(k, f"{path}.{k.value}")
            value = self.string(v, f"{path}.{k.value}")
            if isinstance(key, _Bad) or isinstance(value, _Bad):
                bad = True
                continue
            if isinstance(check(k, f"{path}.{key}", key), _Bad) or isinstance(check(v, f"{path}.{key}", value), _Bad):
                bad = True
                continue
            out.append((key, value))
        return BAD if bad else out

    def string(self, node: yaml.Node, path: str) -> str | _Bad:
        value = self.scalar(node)
        if isinstance(value, bool | int | float) and isinstance(node, yaml.ScalarNode) and node.style is None:
            # What was written: YAML 1.1 reads an id `off` as false and a topic `1e3` as 1000.0.
            return str(node.value)
        if not isinstance(value, str):
            return self.fail(node, path, f"expected a string, got {_kind(node, value)}")
        return value

    def boolean(self, node: yaml.Node, path: str) -> bool | _Bad:
        value = self.scalar(node)
        if not isinstance(value, bool):
            return self.fail(node, path, f"expected true or false, got {_kind(node, value)}")
        return value

    def integer(self, node: yaml.Node, path: str, lo: int | None = None, hi: int | None = None,
                reason: str | None = None) -> int | _Bad:
        value = self.scalar(node)
        if not isinstance(value, int) or isinstance(value, bool):
            return self.fail(node, path, f"expected an integer, got {_kind(node, value)}")
        if lo is not None and value < lo:
            return self.fail(node, path, reason or f"must be >= {lo}, got {value}")
        if hi is not None and value > hi:
            return self.fail(node, path, f"must be <= {hi}, got {value}")
        return value

    def number(self, node: yaml.Node, path: str, lo: float | None = None, exclusive: bool = False,
               reason: str | None = None) -> float | _Bad:
        value = self.scalar(node)
        if not isinstance(value, int | float) or isinstance(value, bool):
            return self.fail(node, path, f"expected a number, got {_kind(node, value)}")
        if value != value or value in (float("inf"), float("-inf")):
            return self.fail(node, path, "expected a finite number")
        if lo is not None and (value <= lo if exclusive else value < lo):
            return self.fail(node, path, reason or f"must be {'>' if exclusive else '>='} {lo:g}, "
                                                   f"got {value}")
        return float(value)

    def regex(self, node: yaml.Node, path: str) -> re.Pattern[str] | _Bad:
        text = self.string(node, path)
        if isinstance(text, _Bad):
            return BAD
        try:
            return re.compile(text)
        except re.error as exc:
            return self.fail(node, path, f"bad regex: {exc}")

    def choice(self, node: yaml.Node, path: str, kind: Any) -> Any:
        value = self.scalar(node)
        names = [member.value for member in kind]
        if isinstance(value, str) and value in names:
            return kind(value)
        shown = _show(node, value)
        return self.fail(node, path, f"expected one of {', '.join(names)}, got {shown}"
                                     f"{did_you_mean(str(value), names) if isinstance(value, str) else ''}")


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


def _kind(node: yaml.Node, value: Any) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if value is None:
        return "nothing (null)"
    name = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(type(value))
    return f"{name} {_show(node, value)}" if name else f"{type(value).__name__} {node.value!r}"


def _show(node: yaml.Node, value: Any) -> str:
    return repr(node.value) if isinstance(node, yaml.ScalarNode) else _kind(node, value)
