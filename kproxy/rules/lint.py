"""Rules that load but can never act: the warnings of ``kproxy rules check``.

A rule file can be valid and still hold a rule that does nothing. Two kinds are found without
traffic, from the rules and Kafka's message schemas alone:

* **shadowed**: an earlier rule matches every request this one matches and stops evaluation (it
  is enabled, has no ``continue: true``, no ``probability`` and no ``schedule``), so the engine
  never reaches this one (:mod:`kproxy.rules.engine`: the first matching rule decides). A dry-run
  rule stops evaluation as well. "Every request" is decided key by key, conservatively: a key
  of the earlier rule covers this one's when it is absent, or names a superset (apis, versions,
  broker ids, partitions, acks, addresses), or the same pattern, or a match-all one (``*``,
  ``.*``, taken to match every name: Kafka's names hold no newline), or a pattern matching this
  one's literal value (``orders-*`` covers ``orders-eu``).
  A pair it cannot decide is not reported: a warning is always true.
* **unsatisfiable for an api**: the rule names an api whose requests cannot pass one of its
  keys: an ``api_version`` range outside the versions kproxy knows for it, or a ``topic``,
  ``partition``, ``group_id`` or ``transactional_id`` that no version of its requests (in the
  rule's range) carries as the rules read it (:func:`kproxy.protocol.scan.request_names_topics`,
  :func:`kproxy.rules.frame_facts.reads_fact`).

A topic named by a literal (``topic: order``) where the traffic says ``orders`` cannot be told
from a file: the admin API's listing says which rules have never fired since they were loaded
(docs/ADMIN.md).

Each warning is a :class:`~kproxy.rules.load.Problem` at the line of the rule (or of its key),
printed ``file:line: warning: key: reason``; warnings never make a file invalid.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import yaml

from kproxy.protocol.codes import api_snake_name
from kproxy.protocol.message_schemas import supported_versions
from kproxy.protocol.scan import request_names_topics
from kproxy.rules.frame_facts import reads_fact
from kproxy.rules.load import YAML_LOADER, Problem, RulesError, load_text
from kproxy.rules.model import Match, PrincipalPattern, Rule, TopicPattern
from kproxy.rules.patterns import UserPattern
from kproxy.rules.reading import DEFAULT_MAX_BYTES, read_rule_file
from kproxy.rules.sources import load_path, rule_files

_MATCH_ALL = frozenset({".*", "(?s).*", "User:.*"})
_GLOB_SPECIALS = frozenset("*?[")
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


@dataclass(frozen=True)
class _Placed:
    """A rule and where it is written: its file, its ``rules[i]`` path, and the lines of its
    item and of each of its match keys."""

    rule: Rule
    file: str
    path: str
    line: int
    key_lines: dict[str, int]

    @property
    def where(self) -> str:
        return f"{self.path} ({self.rule.id!r}, {self.file}:{self.line})"


def warnings_of_paths(paths: Sequence[str], max_bytes: int = DEFAULT_MAX_BYTES) -> list[Problem]:
    """The warnings of every rule file or directory in ``paths`` (a directory's files merged in
    name order, as ``kproxy run --rules DIR`` merges them). Paths that do not load are skipped:
    their problems are :func:`kproxy.rules.sources.check_paths`'."""
    found: list[Problem] = []
    for path in paths:
        try:
            load_path(path, max_bytes)  # as a whole: a directory's files may each load and not merge
            files = rule_files(path) if os.path.isdir(path) else [path]
            placed = [p for file in files for p in _placed(file, read_rule_file(file, max_bytes))]
        except (OSError, RulesError):
            continue
        found.extend(warnings_of(placed))
    return found


def warnings_of_text(text: str, source: str = "<rules>") -> list[Problem]:
    """The warnings of one rule file's text (which must load: :class:`RulesError` otherwise)."""
    return warnings_of(_placed(source, text))


def warnings_of(placed: Sequence[_Placed]) -> list[Problem]:
    found: list[Problem] = []
    stoppers: list[_Placed] = []
    for p in placed:
        found.extend(_unsatisfiable(p))
        shadow = next((s for s in stoppers if covers(s.rule.match, p.rule.match)), None)
        if shadow is not None:
            found.append(Problem(p.file, p.line, p.path,
                                 f"rule {p.rule.id!r} is shadowed by {shadow.where}: that rule matches every "
                                 f"request this one matches and stops evaluation (no 'continue: true'), so this "
                                 f"one never acts"))
        if _stops_every_match(p.rule):
            stoppers.append(p)
    return found


def _stops_every_match(rule: Rule) -> bool:
    """Whether the rule, wherever its keys match, is a hit that ends evaluation."""
    m = rule.match
    return (rule.enabled and not rule.continue_ and m.probability is None and m.toxicity is None
            and m.schedule is None)


# -- one rule against its apis --------------------------------------------------------------
def _unsatisfiable(p: _Placed) -> Iterable[Problem]:
    m = p.rule.match
    if m.apis is None:
        return
    for api in sorted(m.apis):
        name = api_snake_name(api)
        known = supported_versions(api)
        if known is None:
            continue
        lo, hi = max(known[0], m.min_version or 0), min(known[1], known[1] if m.max_version is None else m.max_version)
        if lo > hi:
            yield _at(p, "api_version", f"{name} requests are v{known[0]}-v{known[1]} (the versions kproxy knows): "
                                        f"rule {p.rule.id!r} never matches them")
            continue
        versions = range(lo, hi + 1)
        names = [request_names_topics(api, v) for v in versions]
        if m.topics is not None and not any(t for t, _ in names):
            yield _at(p, "topic", f"{name} requests{_of(versions, known)} name no topic: "
                                  f"rule {p.rule.id!r} never matches them")
        elif m.partitions is not None and not any(q for _, q in names):
            yield _at(p, "partition", f"{name} requests{_of(versions, known)} name no partition: "
                                      f"rule {p.rule.id!r} never matches them")
        for key in ("group_id", "transactional_id"):
            if getattr(m, key) is not None and not any(reads_fact(api, v, key) for v in versions):
                yield _at(p, key, f"{name} requests{_of(versions, known)} carry no {key.replace('_', ' ')}: "
                                  f"rule {p.rule.id!r} never matches them")


def _of(versions: range, known: tuple[int, int]) -> str:
    """The versions a sentence is about, when the rule narrowed them."""
    if (versions.start, versions.stop - 1) == known:
        return ""
    return f" v{versions.start}" if len(versions) == 1 else f" v{versions.start}-v{versions.stop - 1}"


def _at(p: _Placed, key: str, reason: str) -> Problem:
    return Problem(p.file, p.key_lines.get(key, p.line), f"{p.path}.match.{key}", reason)


# -- one match covering another -----------------------------------------------------------
def covers(a: Match, b: Match) -> bool:
    """Whether every request ``b``'s keys let through, ``a``'s keys let through too (probability
    and schedule aside: the caller asks only of an ``a`` with neither). Conservative: False when
    it cannot tell."""
    return (_superset(a.apis, b.apis) and _versions_cover(a, b)
            and _pattern_covers(a.client_id, b.client_id) and _principal_covers(a.principal, b.principal)
            and _addresses_cover(a.client_address, b.client_address) and _superset(a.broker_ids, b.broker_ids)
            and _superset(a.clusters, b.clusters)
            and _topics_cover(a.topics, b.topics) and _superset(a.partitions, b.partitions)
            and _pattern_covers(a.group_id, b.group_id) and _pattern_covers(a.transactional_id, b.transactional_id)
            and _superset(a.acks, b.acks) and _sizes_cover(a, b) and (a.record is None or a.record == b.record))


def _sizes_cover(a: Match, b: Match) -> bool:
    """``a``'s ``request_bytes`` bounds hold for every size ``b``'s let through."""
    low = a.min_request_bytes is None or (b.min_request_bytes is not None
                                          and b.min_request_bytes >= a.min_request_bytes)
    high = a.max_request_bytes is None or (b.max_request_bytes is not None
                                           and b.max_request_bytes <= a.max_request_bytes)
    return low and high


def _superset(a: frozenset[int] | frozenset[str] | None, b: frozenset[int] | frozenset[str] | None) -> bool:
    return a is None or (b is not None and b <= a)


def _versions_cover(a: Match, b: Match) -> bool:
    low = a.min_version is None or (b.min_version is not None and b.min_version >= a.min_version)
    high = a.max_version is None or (b.max_version is not None and b.max_version <= a.max_version)
    return low and high


def _pattern_covers(a: UserPattern | None, b: UserPattern | None) -> bool:
    """(A request without the value, a client with no client id say, passes no pattern.)"""
    if a is None:
        return True
    if b is None:
        return False
    return a.pattern in _MATCH_ALL or a.pattern == b.pattern or (_PLAIN.issuperset(b.pattern)
                                                                 and a.fullmatch(b.pattern))


def _principal_covers(a: PrincipalPattern | None, b: PrincipalPattern | None) -> bool:
    """(Any pattern needs a known principal, and every known principal is a ``User:``.)"""
    if a is None:
        return True
    return b is not None and (a.pattern in _MATCH_ALL or a.pattern == b.pattern)


def _addresses_cover(a: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] | None,
                     b: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] | None) -> bool:
    if a is None:
        return True
    if b is None:
        return False
    return all(any(n.version == m.version and n.subnet_of(m) for m in a) for n in b)  # type: ignore[arg-type]


def _topics_cover(a: tuple[TopicPattern, ...] | None, b: tuple[TopicPattern, ...] | None) -> bool:
    """(A request naming no topic passes no topic key.)"""
    if a is None:
        return True
    if b is None:
        return False
    if any(t.compiled.pattern in _MATCH_ALL for t in a):
        return True
    return all(any(t == s or (not s.is_regex and not _GLOB_SPECIALS & set(s.pattern) and t.matches(s.pattern))
                   for t in a) for s in b)


# -- where each rule is written -------------------------------------------------------------
def _placed(file: str, text: str) -> list[_Placed]:
    """The rules of one file (loaded: :class:`RulesError` when it does not), each with its lines."""
    rules = load_text(text, file).rules
    items = _rule_nodes(text)
    out: list[_Placed] = []
    for i, (rule, node) in enumerate(zip(rules, items, strict=True)):
        match = _value(node, "match")
        key_lines = {k.value: v.start_mark.line + 1 for k, v in match.value} if isinstance(match, yaml.MappingNode) \
            else {}
        out.append(_Placed(rule, file, f"rules[{i}]", node.start_mark.line + 1, key_lines))
    return out


def _rule_nodes(text: str) -> list[yaml.Node]:
    loader = YAML_LOADER(text)
    try:
        root = loader.get_single_node()
    finally:
        loader.dispose()
    rules = _value(root, "rules")
    return list(rules.value) if isinstance(rules, yaml.SequenceNode) else []


def _value(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)


__all__ = ["covers", "warnings_of", "warnings_of_paths", "warnings_of_text"]
