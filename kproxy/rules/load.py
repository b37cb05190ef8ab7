"""Rule files (YAML) to a :class:`~kproxy.rules.model.RuleSet`, with every problem reported.

The loader walks PyYAML's *composed* node tree (``yaml.compose``) rather than
the constructed Python objects, because nodes keep their line numbers. It
never stops at the first problem: it collects all of them and raises one
:class:`RulesError` whose ``problems`` each print as::

    rules.yaml:7: rules[0].match.topc: unknown key (did you mean 'topic'?)

Unknown keys, api names and Kafka error names get a did-you-mean from
:mod:`difflib`. The format is documented in ``rules/README.md`` and described
by ``rules/kproxy-rules.schema.json``.

The loader is three layers, one module each: :mod:`kproxy.rules.yaml_nodes` (node readers that
record problems), :mod:`kproxy.rules.load_actions` (each action's parameters) and this module
(the document, rules and match keys; the public entry points). One reader object walks a file
through all three, so every message's path format (``rules[0].actions[1].delay.ms``) is the same.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, TypeVar

import yaml

from kproxy.rules.load_actions import INT32, ActionReader
from kproxy.rules.model import (
    IpNetwork,
    Match,
    Rule,
    RuleSet,
    Schedule,
    TimeWindow,
    TopicPattern,
)
from kproxy.rules.yaml_nodes import BAD, Bad, Problem, RulesError, did_you_mean, node_text

T = TypeVar("T")

TOP_KEYS = ("seed", "rules")
RULE_KEYS = ("id", "description", "enabled", "continue", "dry_run", "seed", "match", "actions")
MATCH_KEYS = ("api", "api_version", "client_id", "client_address", "broker_id", "topic", "partition", "group_id",
              "transactional_id", "acks", "probability", "schedule")
SCHEDULE_KEYS = ("after_requests", "after_seconds", "for_seconds", "every", "first", "window")
_TIME_OF_DAY = re.compile(r"([01]?\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?")


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


class _Loader(ActionReader):
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
                seed = self.integer(top["seed"], "seed", *INT32)
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
            if not isinstance(rule, Bad):
                out.append(rule)
        return out

    def rule(self, node: yaml.Node, path: str, seen: dict[str, int]) -> Rule | Bad:
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
        seed: Any = self.integer(m["seed"], f"{path}.seed", *INT32) if "seed" in m else None
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
        if any(isinstance(p, Bad) for p in parts) or not actions:
            return BAD
        return self.build(node, path, lambda: Rule(
            id=rule_id, match=match, actions=tuple(actions), description=description, enabled=enabled,
            continue_=cont, dry_run=dry_run, seed=seed))

    # -- match ------------------------------------------------------------------------
    def match(self, node: yaml.Node, path: str) -> Match | Bad:
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
                                                lambda n, p: self.integer(n, p, 0, INT32[1]))
        if "topic" in m:
            kw["topics"] = self.one_or_many(m["topic"], f"{path}.topic", self.topic, container=tuple)
        if "partition" in m:
            kw["partitions"] = self.one_or_many(m["partition"], f"{path}.partition",
                                                lambda n, p: self.integer(n, p, 0, INT32[1]))
        for key in ("group_id", "transactional_id"):
            if key in m:
                kw[key] = self.regex(m[key], f"{path}.{key}")
        if "acks" in m:
            kw["acks"] = self.one_or_many(m["acks"], f"{path}.acks", self.acks)
        if "probability" in m:
            kw["probability"] = self.number(m["probability"], f"{path}.probability")
        if "schedule" in m:
            kw["schedule"] = self.schedule(m["schedule"], f"{path}.schedule")
        if any(isinstance(v, Bad) for v in kw.values()):
            return BAD
        # Point at the key a model check is about, when there is one.
        where = next((k for k in ("probability", "acks", "api_version") if k in m), None)
        at = m[where] if where else node
        return self.build(at, f"{path}.{where}" if where else path, lambda: Match(**kw))

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

    def topic(self, node: yaml.Node, path: str) -> TopicPattern | Bad:
        if isinstance(node, yaml.MappingNode):
            m = self.mapping(node, path, ("regex", "glob"))
            if m is None:
                return BAD
            if len(m) != 1:
                return self.fail(node, path, "give exactly one of regex or glob")
            kind, value = next(iter(m.items()))
            text = self.string(value, f"{path}.{kind}")
            if isinstance(text, Bad):
                return BAD
            if kind == "regex" and isinstance(self.regex(value, f"{path}.regex"), Bad):
                return BAD
            source: str = text
            return self.build(value, f"{path}.{kind}", lambda: TopicPattern(source, is_regex=kind == "regex"))
        text = self.string(node, path)
        if isinstance(text, Bad):
            return BAD
        glob: str = text
        return self.build(node, path, lambda: TopicPattern(glob))  # a glob too long is refused

    def acks(self, node: yaml.Node, path: str) -> int | Bad:
        value = self.scalar(node)
        if value == "all":
            return -1
        if isinstance(value, int) and not isinstance(value, bool) and value in (-1, 0, 1):
            return value
        return self.fail(node, path, f"acks is all, -1, 0 or 1, got {node_text(node, value)}")

    def cidr(self, node: yaml.Node, path: str) -> IpNetwork | Bad:
        text = self.string(node, path)
        if isinstance(text, Bad):
            return BAD
        try:
            return ipaddress.ip_network(text, strict=False)
        except ValueError as exc:
            return self.fail(node, path, f"not an address or CIDR block: {exc}")

    def schedule(self, node: yaml.Node, path: str) -> Schedule | Bad:
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
        if any(isinstance(v, Bad) for v in kw.values()):
            return BAD
        return self.build(node, path, lambda: Schedule(**kw))

    def window(self, node: yaml.Node, path: str) -> TimeWindow | Bad:
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
        if any(isinstance(t, Bad) for t in times):
            return BAD
        return self.build(node, path, lambda: TimeWindow(times[0], times[1]))



__all__ = ["Problem", "RulesError", "did_you_mean", "load_data", "load_file", "load_text"]
