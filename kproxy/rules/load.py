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

from kproxy.host_port import CLUSTER_NAME_RULE, DNS_LABEL
from kproxy.logfmt import excerpt
from kproxy.rules.load_actions import ActionReader
from kproxy.rules.model import (
    After,
    IpNetwork,
    Match,
    PrincipalPattern,
    RecordMatch,
    Rule,
    RuleSet,
    Schedule,
    TimeWindow,
    TopicPattern,
    sequence_problems,
)
from kproxy.rules.reading import DEFAULT_MAX_BYTES, read_rule_file
from kproxy.rules.yaml_nodes import BAD, INT32, Bad, Problem, RulesError, did_you_mean, node_text
from kproxy.yaml_reader import YAML_LOADER, YamlRefused, compose

T = TypeVar("T")

TOP_KEYS = ("seed", "rules")
RULE_KEYS = ("id", "description", "enabled", "continue", "dry_run", "seed", "match", "actions")
MATCH_KEYS = ("api", "api_version", "client_id", "principal", "client_address", "broker_id", "cluster", "topic",
              "partition",
              "group_id", "transactional_id", "acks", "request_bytes", "record", "probability", "toxicity", "schedule")
SCHEDULE_KEYS = ("after_requests", "after_seconds", "for_seconds", "every", "first", "window", "per",
                 "period_seconds", "after")
_TIME_OF_DAY = re.compile(r"([01]?\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?")


def load_text(text: str, source: str = "<rules>") -> RuleSet:
    """Parse rule-file text; raises :class:`RulesError` listing every problem."""
    return _Loader(source).load(text)


def load_data(data: Any, source: str = "<data>", *, partial: bool = False) -> RuleSet:
    """Load a rule file already parsed (JSON from the admin API: ``{"rules": [...], "seed": N}``)
    with the same checks and messages as a file. ``partial``: the rules are some of a set (the
    admin API's one rule), so a ``schedule.after`` naming a rule not among them is the caller's to
    check (:func:`kproxy.rules.model.sequence_problems` over the whole set).

    Its nodes are built from the data (:func:`data_node`), not rendered as YAML and composed again:
    that round trip is slow for many rules, and with libyaml the compose is one C call that
    holds the GIL (every other thread, the trio loop among them) throughout. Node "lines" are
    numbered in the order of the data: problems' lines mean nothing to the caller; their key paths do."""
    try:
        root = data_node(data)
    except TypeError as exc:
        raise RulesError([Problem(source, 0, "(data)", f"not plain data: {exc}")]) from None
    loader = _Loader(source)
    loader.numbered = False
    loader.partial = partial
    try:
        return loader.document(root)
    finally:
        # The YAML loader that constructed the scalars never parsed: its state is a bound method of
        # itself, a cycle holding every node through constructed_objects. Broken here, so the tree is
        # freed at once (a build off the loop may be frozen out of the collector: kproxy/offloop.py).
        if loader._yaml is not None:
            loader._yaml.constructed_objects.clear()
            loader._yaml.dispose()


def load_file(path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> RuleSet:
    """Read and parse a rule file; a file that cannot be read (missing, not a regular file, over
    ``max_bytes``, not UTF-8: :func:`kproxy.rules.reading.read_rule_file`) is one problem at line 0."""
    return load_text(read_rule_file(path, max_bytes), path)


def release_nodes(root: yaml.Node, fan_out: int = 64) -> None:
    """Free a composed node tree a little at a time.

    Left to reference counting, the tree of a file of 100,000 rules (millions of nodes and marks)
    is freed in one cascade of deallocations that holds the GIL for seconds, stalling the event
    loop whatever thread drops it. Here the items of every big list (more than ``fan_out``, such as
    the rules) are popped one by one, so each cascade is one item's subtree and the interpreter can
    switch threads in between.
    """
    big: list[yaml.Node] = [root] if isinstance(root, yaml.CollectionNode) else []  # a scalar file: nothing to do
    while big:
        items = big.pop().value
        while items:
            item = items.pop()
            for child in item if isinstance(item, tuple) else (item,):  # a mapping's items are (key, value)
                if isinstance(child, yaml.CollectionNode) and len(child.value) > fan_out:
                    big.append(child)


_TAG = "tag:yaml.org,2002:"


def data_node(value: Any) -> yaml.Node:
    """The YAML node of plain data (dicts with string keys, lists, str, int, float, bool, None), as
    composing its YAML would give it; TypeError for anything else. Each node's line is the one it
    would have in the block-style YAML of the data, so problems are reported in the data's order."""
    line = [0]

    def scalar(v: Any, at: int) -> yaml.ScalarNode:
        mark = yaml.Mark("<data>", 0, at, 0, None, 0)
        if isinstance(v, bool):
            return yaml.ScalarNode(_TAG + "bool", "true" if v else "false", mark, mark)
        if isinstance(v, int):
            return yaml.ScalarNode(_TAG + "int", str(v), mark, mark)
        if isinstance(v, float):
            text = ".nan" if v != v else ".inf" if v == float("inf") else "-.inf" if v == -float("inf") else repr(v)
            return yaml.ScalarNode(_TAG + "float", text, mark, mark)
        if v is None:
            return yaml.ScalarNode(_TAG + "null", "null", mark, mark)
        if isinstance(v, str):
            return yaml.ScalarNode(_TAG + "str", v, mark, mark)
        raise TypeError(f"{type(v).__name__} is not plain data")

    def node(v: Any) -> yaml.Node:
        mark = yaml.Mark("<data>", 0, line[0], 0, None, 0)  # a block collection starts at its first item
        if isinstance(v, dict):
            pairs: list[tuple[yaml.Node, yaml.Node]] = []
            for k, x in v.items():
                at = line[0]
                line[0] += 1
                # key: scalar on one line; key: followed by a collection on the lines below
                pairs.append((scalar(k, at), node(x) if isinstance(x, dict | list) and x else scalar_or(x, at)))
            line[0] += not v
            return yaml.MappingNode(_TAG + "map", pairs, mark, mark)
        if isinstance(v, list):
            items: list[yaml.Node] = []
            for x in v:
                if isinstance(x, dict | list) and x:
                    items.append(node(x))  # "- key: ...": its first line is the dash's
                else:
                    items.append(scalar_or(x, line[0]))
                    line[0] += 1
            line[0] += not v
            return yaml.SequenceNode(_TAG + "seq", items, mark, mark)
        node_ = scalar(v, line[0])
        line[0] += 1
        return node_

    def scalar_or(v: Any, at: int) -> yaml.Node:
        """A scalar at line ``at``, or an empty collection written inline there ({} or [])."""
        if isinstance(v, dict | list):
            mark = yaml.Mark("<data>", 0, at, 0, None, 0)
            return (yaml.MappingNode(_TAG + "map", [], mark, mark) if isinstance(v, dict)
                    else yaml.SequenceNode(_TAG + "seq", [], mark, mark))
        return scalar(v, at)

    return node(value)


class _Loader(ActionReader):
    # Whether node lines are a file's. Data's nodes (load_data) are numbered in the data's order,
    # lines of no document the caller has: a message then points to a key path, never to a line.
    numbered = True
    partial = False  # the rules are some of a set: sequences (schedule.after) checked by the caller

    # -- the document ---------------------------------------------------------------
    def load(self, text: str) -> RuleSet:
        try:
            self._yaml, root = compose(text)  # (kproxy's one YAML reader: syntax, depth and aliases bounded)
        except YamlRefused as exc:
            raise RulesError([Problem(self.source, exc.line, "(yaml)", exc.reason)]) from None
        if root is None:
            raise RulesError([Problem(self.source, 1, "(file)", "empty rule file: expected 'rules:'")])
        try:
            return self.document(root)
        finally:
            objects = self._yaml.constructed_objects  # node -> value, one per scalar read: emptied one by one
            while objects:  # too (a clear() of 800,000 entries is one long GIL hold)
                objects.popitem()
            release_nodes(root)

    def document(self, root: yaml.Node) -> RuleSet:
        """The rule set of a composed document (or of nodes built from data: :func:`load_data`)."""
        if self._yaml is None:
            self._yaml = yaml.SafeLoader("")  # constructs the scalars of nodes that were not composed
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
        seen: dict[str, str] = {}
        where: list[tuple[yaml.Node, str]] = []
        for i, item in enumerate(items):
            rule = self.rule(item, f"rules[{i}]", seen)
            if not isinstance(rule, Bad):
                out.append(rule)
                where.append((item, f"rules[{i}]"))
        if not self.partial and not self.problems:  # a rule that did not load is no missing rule
            for index, reason in sequence_problems(out):
                self.fail(where[index][0], f"{where[index][1]}.match.schedule.after", reason)
        return out

    def rule(self, node: yaml.Node, path: str, seen: dict[str, str]) -> Rule | Bad:
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
                    self.fail(m["id"], f"{path}.id", f"duplicate rule id {rule_id!r} (first at {seen[rule_id]})")
                else:
                    seen[rule_id] = f"line {m['id'].start_mark.line + 1}" if self.numbered else f"{path}.id"
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
        if "principal" in m:
            kw["principal"] = self.principal(m["principal"], f"{path}.principal")
        if "client_address" in m:
            kw["client_address"] = self.one_or_many(m["client_address"], f"{path}.client_address", self.cidr,
                                                    container=tuple)
        if "broker_id" in m:
            kw["broker_ids"] = self.one_or_many(m["broker_id"], f"{path}.broker_id",
                                                lambda n, p: self.integer(n, p, 0, INT32[1]))
        if "cluster" in m:
            kw["clusters"] = self.one_or_many(m["cluster"], f"{path}.cluster", self.cluster)
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
        if "record" in m:
            kw["record"] = self.record(m["record"], f"{path}.record")
        if "request_bytes" in m:
            kw["min_request_bytes"], kw["max_request_bytes"] = self.size_range(m["request_bytes"],
                                                                               f"{path}.request_bytes")
        for key in ("probability", "toxicity"):
            if key in m:
                kw[key] = self.number(m[key], f"{path}.{key}")
        if "schedule" in m:
            kw["schedule"] = self.schedule(m["schedule"], f"{path}.schedule")
        if any(isinstance(v, Bad) for v in kw.values()):
            return BAD
        # Point at the key a model check is about, when there is one.
        where = next((k for k in ("probability", "toxicity", "acks", "api_version", "request_bytes", "record")
                      if k in m), None)
        at = m[where] if where else node
        return self.build(at, f"{path}.{where}" if where else path, lambda: Match(**kw))

    def principal(self, node: yaml.Node, path: str) -> PrincipalPattern | Bad:
        compiled = self.regex(node, path)
        if isinstance(compiled, Bad):
            return BAD
        return PrincipalPattern(compiled.pattern, compiled)

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

    def record(self, node: yaml.Node, path: str) -> RecordMatch | Bad:
        m = self.mapping(node, path, ("key", "header", "header_value"))
        if m is None:
            return BAD
        kw: dict[str, Any] = {}
        if "key" in m:
            kw["key"] = self.regex(m["key"], f"{path}.key")
        if "header" in m:
            kw["header"] = self.string(m["header"], f"{path}.header")
        if "header_value" in m:
            kw["header_value"] = self.regex(m["header_value"], f"{path}.header_value")
        return self.made(node, path, kw, RecordMatch)

    def size_range(self, node: yaml.Node, path: str) -> tuple[Any, Any]:
        """``{min: N, max: N}`` (either or both) of a byte count, bounds included."""
        if not isinstance(node, yaml.MappingNode):
            return self.fail(node, path, "expected {min: BYTES, max: BYTES} (either or both)"), BAD
        m = self.mapping(node, path, ("min", "max"))
        if m is None:
            return BAD, BAD
        lo = self.integer(m["min"], f"{path}.min", 0, INT32[1]) if "min" in m else None
        hi = self.integer(m["max"], f"{path}.max", 0, INT32[1]) if "max" in m else None
        if lo is None and hi is None:  # said once: an unknown key was reported already
            return (self.fail(node, path, "give min, max or both") if not node.value else BAD), BAD
        return lo, hi

    def cluster(self, node: yaml.Node, path: str) -> str | Bad:
        """A cluster's name, as the config's ``clusters:`` names it."""
        name = self.string(node, path)
        if isinstance(name, Bad) or DNS_LABEL.fullmatch(name) is not None:
            return name
        return self.fail(node, path, f"a cluster's name is {CLUSTER_NAME_RULE}, got {excerpt(name)}")

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
        if "after" in m:
            kw["after"] = self.after(m["after"], f"{path}.after")
        if "period_seconds" in m:
            kw["period_s"] = self.number(m["period_seconds"], f"{path}.period_seconds", 0.0, exclusive=True)
        if "per" in m:
            per = self.string(m["per"], f"{path}.per")
            if per not in ("connection", "rule") and not isinstance(per, Bad):
                per = self.fail(m["per"], f"{path}.per", f"per is connection or rule, got {per!r}")
            if per == "connection" and not any(k in m for k in ("first", "every", "after_requests")):
                per = self.fail(m["per"], f"{path}.per", "per: connection scopes the request counters: give "
                                                         "first, every or after_requests")
            kw["per_connection"] = per if isinstance(per, Bad) else per == "connection"
        if any(isinstance(v, Bad) for v in kw.values()):
            return BAD
        return self.build(node, path, lambda: Schedule(**kw))

    def after(self, node: yaml.Node, path: str) -> After | Bad:
        m = self.mapping(node, path, ("rule", "fired", "ended"))
        if m is None:
            return BAD
        kw: dict[str, Any] = {}
        rule = self.required(m, node, path, "rule", "the id of the rule to wait on")
        kw["rule"] = BAD if rule is None else self.string(rule, f"{path}.rule")
        if "fired" in m:
            kw["fired"] = self.integer(m["fired"], f"{path}.fired", 1)
        if "ended" in m:
            ended = self.boolean(m["ended"], f"{path}.ended")
            if ended is False:
                ended = self.fail(m["ended"], f"{path}.ended", "ended is true, or leave it out")
            kw["ended"] = ended
        if ("fired" in m) == ("ended" in m):
            return self.fail(node, path, "give one of fired: N or ended: true")
        return self.made(node, path, kw, After)

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



__all__ = ["YAML_LOADER", "Problem", "RulesError", "data_node", "did_you_mean", "load_data", "load_file", "load_text"]
