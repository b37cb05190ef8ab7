"""The rule model: frozen, slotted values that a loaded rule file becomes.

Every class validates its own invariants in ``__post_init__`` and raises
:class:`ValueError` with a short reason; :mod:`kproxy.rules.load` turns those
into ``file:line: key: reason`` problems. Nothing here reads files or clocks:
a :class:`RuleSet` is an immutable value that the engine indexes and a reload
swaps whole.

The actions a rule takes are :class:`~kproxy.rules.actions.base.RuleAction` values, one module
per kind in :mod:`kproxy.rules.actions`.

Names follow Kafka's vocabulary (api keys by their snake-case names, error
codes by their protocol names, ``acks``, ``transactional_id``...).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from kproxy.protocol.codes import ApiKey
from kproxy.protocol.records import Record
from kproxy.rules.actions.base import RuleAction
from kproxy.rules.patterns import UserPattern, compile_glob, compile_pattern

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


# ------------------------------------------------------------------------------ match


@dataclass(frozen=True, slots=True)
class TopicPattern:
    """A topic glob (``orders-*``, fnmatch syntax) or regex (RE2), matched against the whole name.
    Both compile to RE2 (:mod:`kproxy.rules.patterns`): linear in the name; ValueError when refused."""

    pattern: str
    is_regex: bool = False
    compiled: UserPattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        compiled = compile_pattern(self.pattern) if self.is_regex else compile_glob(self.pattern)
        object.__setattr__(self, "compiled", compiled)

    def matches(self, topic: str) -> bool:
        return self.compiled.fullmatch(topic)


PRINCIPAL_TYPE = "User:"  # the type Kafka's default principal builders give TLS and SASL clients


@dataclass(frozen=True, slots=True)
class PrincipalPattern:
    """A ``principal`` key: an RE2 pattern matched whole against the connection's principal as
    Kafka writes it in ACLs and kproxy in its log lines (``User:alice``, ``User:CN=app,O=acme``).
    A pattern that does not start with ``User:`` is matched against the name after it: ``alice``
    is ``User:alice``, and ``.*`` matches every known principal. An unknown principal matches
    no pattern."""

    pattern: str
    compiled: UserPattern = field(repr=False, compare=False)

    @property
    def whole(self) -> bool:
        """Whether the pattern is matched against the whole principal (it starts with ``User:``)."""
        return self.pattern.startswith(PRINCIPAL_TYPE)

    def subject(self, principal: str) -> str | None:
        """The text of ``principal`` this pattern is matched against (None: none can match)."""
        if self.whole:
            return principal
        return principal[len(PRINCIPAL_TYPE):] if principal.startswith(PRINCIPAL_TYPE) else None

    def matches(self, principal: str | None) -> bool:
        subject = None if principal is None else self.subject(principal)
        return subject is not None and self.compiled.fullmatch(subject)


@dataclass(frozen=True, slots=True)
class RecordMatch:
    """A ``record`` key: a Produce request matches when one of its records has a key matching
    ``key`` (RE2, whole, the key read as UTF-8) and a header named ``header`` (exactly) whose value
    matches ``header_value`` (when given), all on the same record. A null key matches no ``key``."""

    key: UserPattern | None = None
    header: str | None = None
    header_value: UserPattern | None = None

    def __post_init__(self) -> None:
        if self.header_value is not None and self.header is None:
            raise ValueError("header_value needs header (the header's name)")
        if self.key is None and self.header is None:
            raise ValueError("give key, header or both")

    def matches(self, record: Record) -> bool:
        if self.key is not None:
            key = record.key
            if key is None or not self.key.fullmatch(bytes(key).decode("utf-8", "replace")):
                return False
        if self.header is None:
            return True
        for name, value in record.headers:
            if name == self.header and (self.header_value is None or (
                    value is not None and self.header_value.fullmatch(bytes(value).decode("utf-8", "replace")))):
                return True
        return False


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """A daily UTC window, in seconds after midnight; ``end < start`` wraps past midnight."""

    start_s: int
    end_s: int

    def __post_init__(self) -> None:
        if not (0 <= self.start_s < 86400 and 0 <= self.end_s < 86400):
            raise ValueError("times of day are between 00:00 and 23:59:59")
        if self.start_s == self.end_s:
            raise ValueError("an empty window never matches (start equals end)")

    def contains(self, wall_time: float) -> bool:
        t = int(wall_time) % 86400
        if self.start_s < self.end_s:
            return self.start_s <= t < self.end_s
        return t >= self.start_s or t < self.end_s


@dataclass(frozen=True, slots=True)
class After:
    """A rule that waits on another (YAML ``schedule: {after: {rule: ID, fired: N}}`` or ``{rule:
    ID, ended: true}``): it matches nothing until rule ``rule`` has hit ``fired`` times (dry runs
    included), or has ended (:func:`ends`); then its time conditions count from the first request
    it meets after that. Checked against the other rules by :func:`sequence_problems`."""

    rule: str
    fired: int | None = None
    ended: bool = False

    def __post_init__(self) -> None:
        if (self.fired is None) == (not self.ended):
            raise ValueError("give one of fired: N or ended: true")
        if self.fired is not None and self.fired < 1:
            raise ValueError("fired must be >= 1")


@dataclass(frozen=True, slots=True)
class Schedule:
    """When a rule is live, counted over the requests that pass its other match keys.

    ``after_requests`` skips the first N such requests; ``first`` then takes at
    most N; ``every`` takes every Nth of those remaining (the 1st, N+1th...).
    ``after_s`` and ``for_s`` are seconds since the rule set was loaded;
    ``window`` is a daily UTC window. All given conditions must hold.
    ``period_s``: the ``for_s`` window comes back every that many seconds (flapping: 30 s of
    faults every 5 minutes is ``for_s`` 30, ``period_s`` 300), from ``after_s`` on.
    ``after``: the rule waits on another (:class:`After`).
    ``per_connection``: the counters count each connection's requests apart (YAML ``per:
    connection``: "the first Fetch of every new connection"), not the rule's over all connections.
    """

    after_requests: int = 0
    first: int | None = None
    every: int | None = None
    after_s: float = 0.0
    for_s: float | None = None
    window: TimeWindow | None = None
    per_connection: bool = False
    period_s: float | None = None
    after: After | None = None

    def __post_init__(self) -> None:
        if self.per_connection and not self.counts:
            raise ValueError("per: connection scopes the request counters: give first, every or after_requests")
        if self.after_requests < 0:
            raise ValueError("after_requests must be >= 0")
        if self.first is not None and self.first < 1:
            raise ValueError("first must be >= 1 (first: 0 never matches)")
        if self.every is not None and self.every < 1:
            raise ValueError("every must be >= 1")
        if self.after_s < 0:
            raise ValueError("after_seconds must be >= 0")
        if self.for_s is not None and self.for_s <= 0:
            raise ValueError("for_seconds must be > 0 (a zero duration never matches)")
        if self.period_s is not None:
            if self.for_s is None:
                raise ValueError("period_seconds repeats the for_seconds window: give for_seconds")
            if self.period_s <= self.for_s:
                raise ValueError("period_seconds must be above for_seconds (else the window never closes)")

    def in_time(self, elapsed: float) -> bool:
        """Whether ``after_s``, ``for_s`` and ``period_s`` hold ``elapsed`` seconds after the start."""
        if elapsed < self.after_s:
            return False
        if self.for_s is not None:
            since = elapsed - self.after_s
            if self.period_s is not None:
                since %= self.period_s
            if since >= self.for_s:
                return False
        return True

    @property
    def counts(self) -> bool:
        return self.after_requests > 0 or self.first is not None or self.every is not None


@dataclass(frozen=True, slots=True)
class Match:
    """What a request must be for a rule to apply; ``None`` means "any".

    Strings are RE2 patterns (:mod:`kproxy.rules.patterns`) matched whole: ``client_id: "batch-.*"``.
    A request matches when every given key matches; for ``topic`` and
    ``partition``, when at least one of the request's topic-partitions does.
    """

    apis: frozenset[int] | None = None
    min_version: int | None = None
    max_version: int | None = None
    client_id: UserPattern | None = None
    principal: PrincipalPattern | None = None
    client_address: tuple[IpNetwork, ...] | None = None
    broker_ids: frozenset[int] | None = None
    clusters: frozenset[str] | None = None  # the names of the clusters (config's clusters:) it applies to
    topics: tuple[TopicPattern, ...] | None = None
    partitions: frozenset[int] | None = None
    group_id: UserPattern | None = None
    transactional_id: UserPattern | None = None
    acks: frozenset[int] | None = None
    min_request_bytes: int | None = None  # the request frame's size, size prefix included
    max_request_bytes: int | None = None
    record: RecordMatch | None = None
    probability: float | None = None
    toxicity: float | None = None
    schedule: Schedule | None = None

    def __post_init__(self) -> None:
        if self.probability is not None and not 0.0 < self.probability <= 1.0:
            raise ValueError("probability must be in (0, 1]")
        if self.toxicity is not None and not 0.0 < self.toxicity <= 1.0:
            raise ValueError("toxicity must be in (0, 1]")
        if self.min_version is not None and self.max_version is not None and self.min_version > self.max_version:
            raise ValueError("min is above max")
        if (self.min_request_bytes is not None and self.max_request_bytes is not None
                and self.min_request_bytes > self.max_request_bytes):
            raise ValueError("request_bytes: min is above max")
        if self.acks is not None and not self.acks <= {-1, 0, 1}:
            raise ValueError("acks is -1 (all), 0 or 1")
        if self.acks is not None and self.apis is not None and ApiKey.PRODUCE not in self.apis:
            raise ValueError("acks only exists on produce requests")
        if self.record is not None and self.apis != frozenset({ApiKey.PRODUCE}):
            raise ValueError("record matches the records of Produce requests: give api: produce")

    @property
    def needs_topics(self) -> bool:
        return self.topics is not None or self.partitions is not None


# ------------------------------------------------------------------------------ rules

RULE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    match: Match
    actions: tuple[RuleAction, ...]
    description: str | None = None
    enabled: bool = True
    continue_: bool = False  # YAML ``continue``: go on to later rules after this one matches
    dry_run: bool = False  # match, count and log, but the session executes nothing
    seed: int | None = None

    def __post_init__(self) -> None:
        if not RULE_ID.fullmatch(self.id):
            raise ValueError("an id is letters, digits and . _ : - (not starting with a symbol)")
        if not self.actions:
            raise ValueError("a rule needs at least one action")
        for action in self.actions:
            reason = action.check(self.match.apis)
            if reason is not None:
                raise ValueError(reason)


def ends(rule: Rule) -> bool:
    """Whether a rule can end for good: its ``first`` (counted per rule) runs out, or its
    ``for_seconds`` window closes (with no ``period_seconds`` to bring it back)."""
    s = rule.match.schedule
    return s is not None and ((s.first is not None and not s.per_connection)
                              or (s.for_s is not None and s.period_s is None))


def sequence_problems(rules: tuple[Rule, ...] | list[Rule]) -> list[tuple[int, str]]:
    """What is wrong with the ``schedule.after`` keys of a rule list, as (index of the rule, reason):
    a rule waiting on no rule of the list, on itself, on a rule that never ends (``ended``), or in
    a cycle of rules waiting on each other."""
    by_id = {r.id: r for r in rules}
    out: list[tuple[int, str]] = []
    for i, rule in enumerate(rules):
        s = rule.match.schedule
        after = s.after if s is not None else None
        if after is None:
            continue
        target = by_id.get(after.rule)
        if target is None:
            out.append((i, f"names no rule {after.rule!r}"))
        elif target is rule:
            out.append((i, "a rule cannot wait on itself"))
        elif after.ended and not ends(target):
            out.append((i, f"rule {after.rule!r} never ends: give it for_seconds (without period_seconds) or "
                           "first (per rule), or wait on fired: N"))
        else:
            chain = [rule.id]
            while target is not None and target.match.schedule is not None and target.match.schedule.after:
                chain.append(target.id)
                if target is rule:
                    out.append((i, f"rules wait on each other in a cycle ({' -> '.join(chain)})"))
                    break
                if len(chain) > len(rules):
                    break
                target = by_id.get(target.match.schedule.after.rule)
    return out


@dataclass(frozen=True, slots=True)
class RuleSet:
    """An ordered, immutable list of rules and the global seed."""

    rules: tuple[Rule, ...] = ()
    seed: int = 0
    source: str | None = None  # the file it came from, for logs

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.id in seen:
                raise ValueError(f"duplicate rule id {rule.id!r}")
            seen.add(rule.id)
