"""One rule set at work: :class:`FaultInjector` (the engine, the counters, the per-rule plans).

The server builds one per rule set (:class:`~kproxy.policy.live_rules.LiveRules`), shared by every
connection: schedule counters and throttle buckets are global, as a broker's quotas are. What a
verdict needs of each rule is worked out once per rule set (:class:`RulePlan`), from what each
action says of itself (:class:`~kproxy.rules.actions.base.RuleAction`'s hooks and flags).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.faults import DRY_RUN_DETAIL
from kproxy.protocol.api_keys import FETCH
from kproxy.protocol.codes import api_snake_name, error_name
from kproxy.protocol.record_faults import Selector
from kproxy.protocol.topic_ids import TopicIdNames
from kproxy.rules import RuleEngine, RuleSet
from kproxy.rules.actions.base import HitKey, RuleAction
from kproxy.rules.actions.draft import Fault
from kproxy.rules.apply import selector
from kproxy.rules.model import Rule, Schedule

STREAMS_CAP = 100_000  # FaultInjector.stream_ordinals' keys at most


class FaultInjector:
    """One rule set at work: the engine, the counters, the fault log."""

    def __init__(self, rules: RuleSet, *, counts: FaultStats | None = None,
                 clock: Callable[[], float] = time.perf_counter, topic_names: TopicIdNames | None = None,
                 register: bool = True, previous: FaultInjector | None = None) -> None:
        """Build the engine and the per-rule plans.

        ``previous``: the injector this one is to replace, when the rules both hold unchanged are to
        carry on (:class:`~kproxy.rules.engine.RuleEngine`'s ``previous``; :meth:`carry_on` finishes
        the hand-over at the swap).

        ``register=False`` leaves ``counts`` untouched, so the build may run in a worker thread
        while the trio thread scrapes and counts (kproxy.policy.live_rules.LiveRules.prepare);
        :meth:`register_series` must then be called on the trio thread before the injector is used.
        """
        self.rules = rules
        self.clock = clock
        before: RuleEngine | None = previous.engine if previous is not None else None
        self.engine: RuleEngine = RuleEngine(rules, loaded_at=clock(), previous=before)
        self.previous = previous  # dropped by carry_on
        self.counts = counts if counts is not None else FaultStats()
        self._enabled = enabled = [r for r in rules.rules if r.enabled]
        # Topic ids -> names for requests that name topics by id (Fetch v13+), learnt from Metadata
        # answers when a rule can meet such a request: to match its topic key by name, and to name
        # the topics of its fault lines and /faults records. A replacing rule set is given the old map.
        self.topic_names = topic_names if topic_names is not None else TopicIdNames()
        self.learns_topic_ids = any(r.match.topics is not None or r.match.apis is None or FETCH in r.match.apis
                                    for r in enabled)
        self.plans: dict[str, RulePlan] = {r.id: RulePlan(r, self.topic_names) for r in enabled}
        # The rules whose state the admin listing shows (live_state): a counter, a time window, a ramp...
        self.stateful: tuple[Rule, ...] = tuple(r for r in enabled if has_live_state(r))
        self.rule_ids = frozenset(r.id for r in rules.rules)  # whose counter series a replacement keeps
        # When it went in force (wall clock; None until then) and each hit series' count at that moment:
        # the hits "since load" the admin API shows are the counts less these (note_load).
        self.loaded_wall: float | None = None
        # The wall time the rules carried on from ``previous`` went in force (carry_on): each keeps its own.
        self.started_wall: dict[str, float] = {}
        self.hits_at_load: dict[HitKey, int] = {}
        self.load_noted = False
        # The engine's stream ordinals: per (client id, broker id, api key), the requests seen over
        # every connection since this rule set was put in force. A reconnecting client carries on
        # counting, so a draw that hit a connection's first request is not drawn again for the
        # next connection's first (a reset drawn so would reset every reconnect for ever).
        # Bounded: past STREAMS_CAP keys (a client inventing ids) it starts again.
        self.stream_ordinals: dict[tuple[str | None, int | None, int], int] = {}
        # Series born at zero: an alert's increase() sees the first fault, not only the second, and
        # dashboards show every loaded rule. Listed here (a worker thread's work for a big set), in rule
        # order; register_series adds those not there yet.
        hits: dict[HitKey, int] = {}
        conns: dict[tuple[str, str], int] = {}
        throttles: dict[str, float] = {}
        errors: dict[tuple[str, str], int] = {}
        held: dict[tuple[str, str], None] = {}  # kproxy_rule_held_seconds: histograms, made by counts
        for rule in enabled:
            for action, key in zip(rule.actions, self.plans[rule.id].keys, strict=True):
                name = key[1]
                hits[key] = 0
                if rule.dry_run:
                    continue
                if action.counts_connection_fault:
                    conns[rule.id, name] = 0
                if action.counts_throttled:
                    throttles[rule.id] = 0.0
                if action.counts_held:
                    held[rule.id, name] = None
                code = action.injected_error
                if code is not None:
                    errors.update(((api_snake_name(api), error_name(code)), 0) for api in sorted(rule.match.apis or ()))
        self.series = (hits, conns, throttles, errors)
        self.held_series = list(held)
        if register:
            self.register_series()

    def carry_on(self, now: float, wall: float) -> None:
        """Go in force at ``now`` (monotonic) and ``wall`` (wall clock), replacing ``previous``
        (trio thread, at the swap): the rules carried on keep their schedules and counters (shared
        already), their throttle buckets, their hits "since load" and their load time; every client
        keeps its stream ordinals, so the carried rules' seeded draws go on where they were. The
        others start now."""
        self.engine.start(now)
        self.loaded_wall = wall
        previous, self.previous = self.previous, None
        if previous is None:
            return
        carried = self.engine.carried
        if carried:
            self.engine.adopt(previous.engine)
            self.stream_ordinals = previous.stream_ordinals
            old_wall = previous.loaded_wall if previous.loaded_wall is not None else wall
            self.started_wall = {r: previous.started_wall.get(r, old_wall) for r in carried}
            at_load = previous.hits_at_load
            self.hits_at_load.update((k, at_load[k]) for k in self.series[0] if k[0] in carried and k in at_load)

    def live_state(self, now: float) -> dict[str, dict[str, Any]]:
        """What the admin listing shows of each rule with state (:func:`has_live_state`) at ``now``
        (this injector's clock): its counter, whether its time window is open and when that changes,
        its ramps' values, ... (trio thread: counters are read as they are)."""
        engine = self.engine
        out: dict[str, dict[str, Any]] = {}
        for rule in self.stateful:
            state = engine.state(rule.id)
            if state is None:
                continue
            out[rule.id] = rule_state(rule, state.count, now - state.started, engine.released(rule.id))
        return out

    def started(self, rule_id: str) -> float | None:
        """The wall time rule ``rule_id`` went in force (its own when carried on; None: not in force yet)."""
        return self.started_wall.get(rule_id, self.loaded_wall)

    @property
    def enabled_rules(self) -> int:
        """How many of its rules are enabled (``kproxy_rules_loaded``)."""
        return len(self._enabled)

    def note_load(self, chunk: int = 0) -> Iterator[None]:
        """Remember the count of each of its hit series as it goes in force (a rule still loaded from
        the set before has counted already), ``chunk`` series per step (0: all at once), yielding
        between steps. Trio thread only, as counting is."""
        hits = self.counts.hits
        keys = list(self.series[0])
        step = chunk or len(keys) or 1
        at_load = self.hits_at_load
        for start in range(0, len(keys), step):
            # A rule carried on keeps the count it had when it first went in force (carry_on).
            at_load.update((k, hits.get(k, 0)) for k in keys[start:start + step] if k not in at_load)
            yield
        self.load_noted = True

    def register_series(self) -> None:
        """Put this rule set's counter series in ``counts`` (trio thread only: scrapes read them there);
        counts already there are kept."""
        for _ in self.series_steps():
            pass

    def series_steps(self, chunk: int = 0) -> Iterator[None]:
        """:meth:`register_series`, ``chunk`` series per step (0: all at once), yielding between steps
        (kproxy.policy.live_rules gives the loop a turn there). Counting never needs a series registered."""
        counts = self.counts
        counts.rules_loaded = len(self._enabled)
        tables: tuple[dict[Any, Any], ...] = (counts.hits, counts.connection_faults, counts.throttle_seconds,
                                              counts.injected_errors)
        series: tuple[dict[Any, Any], ...] = self.series
        for table, new in zip(tables, series, strict=True):
            items = list(new.items())
            step = chunk or len(items) or 1
            for start in range(0, len(items), step):
                table.update({k: v for k, v in items[start:start + step] if k not in table})
                yield
        step = chunk or len(self.held_series) or 1
        for start in range(0, len(self.held_series), step):
            for key in self.held_series[start:start + step]:
                counts.held_histogram(key)
            yield


class RulePlan:
    """What a verdict needs of one rule, worked out once per rule set, not per request.

    ``keys``: each action's hit counter key, in order; ``deciders``: the actions with a verdict
    part (:attr:`~kproxy.rules.actions.base.RuleAction.decides`) and their keys; ``dry_faults``:
    what a dry run of the rule reports; ``request_actions`` and ``response_actions``: what
    kproxy.rules.apply runs on the request and on the response (empty: nothing to call);
    ``respond_error``/``response_errors``: the error names counted in injected_errors when the
    request is answered locally (the first to answer) or its response edited; ``only``: the
    partitions the rule's ``topic``/``partition`` keys select for the record actions and inject_error;
    ``scoped``: the kinds of its actions that act on those only (their faults name them);
    ``from_draws``: every action's verdict part reads the hit's draws alone (a fixed hit's verdict
    is then worked out once: kproxy.policy.policy's ``_Delays``); ``leader_moves``: the (topic,
    partition) pairs whose leader epoch the rule's response edits raise (``move_leader``), whose
    epochs the policy then remembers as floors (kproxy.protocol.leader_epochs); ``acting``: the
    actions it takes (none in a dry run) and ``schedule`` its schedule, which say whether a
    byte-level toxic it installed is still in force (kproxy.policy.rule_toxics).
    """

    __slots__ = ("acting", "deciders", "dry_faults", "from_draws", "keys", "leader_moves", "only",
                 "request_actions", "respond_error", "response_actions", "response_errors", "schedule", "scoped")

    def __init__(self, rule: Rule, topic_names: TopicIdNames) -> None:
        dry = "true" if rule.dry_run else "false"
        self.keys: tuple[HitKey, ...] = tuple((rule.id, a.kind, dry) for a in rule.actions)
        self.deciders: tuple[tuple[RuleAction, HitKey], ...] = tuple(
            (a, key) for a, key in zip(rule.actions, self.keys, strict=True) if a.decides)
        self.dry_faults: tuple[Fault, ...] = tuple((key, DRY_RUN_DETAIL, False) for key in self.keys)
        self.from_draws = all(a.verdict_from_draws for a in rule.actions)
        self.acting: tuple[RuleAction, ...] = () if rule.dry_run else rule.actions
        self.schedule = rule.match.schedule
        self.request_actions = tuple(a for a in rule.actions if a.edits_request)
        self.response_actions = tuple(a for a in rule.actions if a.edits_response)
        self.leader_moves: frozenset[tuple[str, int]] = frozenset().union(
            *(a.leader_moves for a in self.response_actions))
        self.respond_error = next((error_name(a.injected_error) for a in rule.actions
                                   if a.answers and a.injected_error is not None), None)
        self.response_errors = tuple(error_name(a.injected_error) for a in self.response_actions
                                     if a.injected_error is not None)
        # topic_names is the injector's own map, filled as connections learn ids: read when the selector runs.
        self.only: Selector | None = selector(rule.match, topic_names)
        self.scoped = frozenset(a.kind for a in rule.actions if a.partition_scoped) if self.only else frozenset()


def has_live_state(rule: Rule) -> bool:
    """Whether a rule has state the admin listing shows: a schedule or scenario key (a counter, a
    time window, a request size, or an action's own: a ramping delay, a principal quota)."""
    m = rule.match
    s = m.schedule
    return ((s is not None and (s.counts or s.for_s is not None or s.after_s > 0 or s.after is not None))
            or m.min_request_bytes is not None or m.max_request_bytes is not None
            or any(a.has_live_state for a in rule.actions))


def rule_state(rule: Rule, count: int, elapsed: float, released: bool | None = None) -> dict[str, Any]:
    """A rule's live state as JSON (:meth:`FaultInjector.live_state`), ``elapsed`` seconds after its
    schedule's start, having counted ``count`` requests (per rule); ``released``: whether a rule
    waiting on another no longer waits (its time window is shown once it no longer does). Its
    actions' own state (:meth:`~kproxy.rules.actions.base.RuleAction.live_state`: a ramp's value)
    counts from the start of its time conditions, as the engine's delays do (after ``after_seconds``)."""
    m = rule.match
    out: dict[str, Any] = {}
    s = m.schedule
    if s is not None and s.after is not None:
        out["waits_on"] = s.after.rule
        out["released"] = bool(released)
    if s is not None and s.counts:
        if s.per_connection:
            out["per"] = "connection"
        else:
            out["counted"] = count
    if s is not None and (s.for_s is not None or s.after_s > 0) and (s.after is None or released):
        out["window_open"], out["window_changes_in_seconds"] = _window(s, elapsed)
    if m.min_request_bytes is not None or m.max_request_bytes is not None:
        out["request_bytes"] = {k: v for k, v in (("min", m.min_request_bytes), ("max", m.max_request_bytes))
                                if v is not None}
    since = elapsed - (s.after_s if s is not None else 0.0)
    for a in rule.actions:
        if a.has_live_state:
            a.live_state(since, out)
    return out


def _window(s: Schedule, elapsed: float) -> tuple[bool, float | None]:
    """Whether a schedule's ``after_seconds``/``for_seconds``/``period_seconds`` window is open
    ``elapsed`` seconds after its start, and in how many seconds that changes (None: never)."""
    if elapsed < s.after_s:
        return False, round(s.after_s - elapsed, 3)
    if s.for_s is None:
        return True, None
    since = elapsed - s.after_s
    if s.period_s is not None:
        since %= s.period_s
    if since < s.for_s:
        return True, round(s.for_s - since, 3)
    return False, None if s.period_s is None else round(s.period_s - since, 3)


__all__ = ["FaultInjector", "RulePlan", "has_live_state", "rule_state"]
