"""Fault-injection rules wired into sessions: kproxy.rules' decisions -> the session's verdicts.

The server builds one :class:`FaultInjector` per rule set (one :class:`~kproxy.rules.RuleEngine`,
shared by every connection: schedule counters and throttle buckets are global, as a broker's
quotas are) and gives each :class:`~kproxy.proxy.session.Session` a :class:`RulePolicy`, the
:class:`~kproxy.proxy.session.RequestPolicy` the session calls once per request. proxy/ never
imports kproxy.rules (pyproject.toml's import contracts): this module is the translation.

Cost: a request of an api key no rule names costs one dict lookup (:meth:`RuleEngine.mentions`).

Every fault done (dry runs included, marked ``dry_run=true``) is one log line::

    event=fault rule=ID action=NAME connection=PEER correlation_id=N api=... topic=... partition=... detail=...

so a run can be explained afterwards, and two runs with one seed compared line by line.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kproxy.metrics.stats import FaultStats
from kproxy.protocol.tables import api_snake_name, error_name
from kproxy.proxy.commands import CloseConnection, CloseKind
from kproxy.proxy.session import Exchange, Verdict
from kproxy.rules import Decision, RuleEngine, RuleHit, RuleSet
from kproxy.rules.apply import apply_to_request, apply_to_response, selector
from kproxy.rules.bucket import charged_on_response, split_throttle
from kproxy.rules.facts import METADATA, METADATA_TOPIC_IDS, FrameFacts, TopicIdNames
from kproxy.rules.model import (
    Blackhole,
    Delay,
    DelayPoint,
    DropResponse,
    InjectError,
    InjectMode,
    ResetConnection,
    Rule,
    SlowClose,
    Throttle,
    action_name,
)
from kproxy.rules.model import CloseConnection as CloseRule
from kproxy.server.logfmt import q

log = logging.getLogger("kproxy.faults")

# Actions the session times or ends the connection for; apply.py's functions ignore them.
_CONNECTION_ACTIONS = (DropResponse, CloseRule, ResetConnection, Blackhole, SlowClose)
_SESSION_ACTIONS = (Delay, Throttle, *_CONNECTION_ACTIONS)


class FaultInjector:
    """One rule set at work: the engine, the counters, the fault log."""

    def __init__(self, rules: RuleSet, *, counts: FaultStats | None = None,
                 clock: Callable[[], float] = time.perf_counter, topic_names: TopicIdNames | None = None) -> None:
        self.rules = rules
        self.clock = clock
        self.engine = RuleEngine(rules, loaded_at=clock())
        self.by_id: dict[str, Rule] = {r.id: r for r in rules.rules}
        self.counts = counts = counts if counts is not None else FaultStats()
        enabled = [r for r in rules.rules if r.enabled]
        # Topic ids -> names for requests that name topics by id (Fetch v13+); learnt only when a
        # rule has a topic key to match them with. A replacing rule set is given the old map.
        self.topic_names = topic_names if topic_names is not None else TopicIdNames()
        self.learns_topic_ids = any(r.match.topics is not None for r in enabled)
        counts.rules_loaded = len(enabled)
        # Series born at zero: an alert's increase() sees the first fault, not only the second, and
        # dashboards show every loaded rule.
        for rule in enabled:
            for action in rule.actions:
                name = action_name(action)
                counts.hits.setdefault((rule.id, name, "true" if rule.dry_run else "false"), 0)
                if rule.dry_run:
                    continue
                if isinstance(action, _CONNECTION_ACTIONS):
                    counts.connection_faults.setdefault((rule.id, name), 0)
                elif isinstance(action, Throttle):
                    counts.throttle_seconds.setdefault(rule.id, 0.0)
                elif isinstance(action, InjectError):
                    for api in sorted(rule.match.apis or ()):
                        counts.injected_errors.setdefault((api_snake_name(api), error_name(action.error_code)), 0)



@dataclass(frozen=True, slots=True)
class FaultRecord:
    """One fault done (or, ``dry_run``, only matched): what the fault log line says, kept in
    :attr:`~kproxy.server.live_rules.LiveRules.recent` for the admin API's ``/faults``."""

    time: float  # wall clock, seconds since the epoch
    rule: str
    action: str
    connection: str
    correlation_id: int
    api: str
    topics: tuple[str, ...]
    partitions: tuple[int, ...]
    detail: str
    dry_run: bool


class _PeerIPv4(ipaddress.IPv4Address):
    """A connection's client address with its hash computed once: the engine keys its per-peer cache
    with it on every request (kproxy/rules/engine.py), and ipaddress hashes ``hex(int(ip))`` on every
    call (~0.5 µs). Equal, and hashing equal, to the plain address."""

    __slots__ = ("_hash",)

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


class _PeerIPv6(ipaddress.IPv6Address):
    """:class:`_PeerIPv4` for IPv6."""

    __slots__ = ("_hash",)

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


def _client_ip(peer: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    host = peer.rpartition(":")[0].strip("[]")
    for kind in (_PeerIPv4, _PeerIPv6):
        try:
            return kind(host)
        except ValueError:
            continue
    return None


class _HasInjector(Protocol):
    """What a policy reads per request: kproxy.server.live_rules.LiveRules (a protocol, not an
    import: live_rules builds policies, so it imports this module)."""

    @property
    def injector(self) -> FaultInjector | None: ...

    @property
    def counts(self) -> FaultStats: ...

    @property
    def recent(self) -> deque[FaultRecord] | None: ...


class RulePolicy:
    """The :class:`~kproxy.proxy.session.RequestPolicy` of one connection.

    It reads the rule set in force from ``live`` at each request (one attribute read), so rules
    replaced while the connection is open apply from its next request.
    """

    __slots__ = ("_ordinals", "broker_id", "client_ip", "counts", "live", "peer")

    def __init__(self, live: _HasInjector, peer: str, broker_id: int | None) -> None:
        self.live = live
        self.counts = live.counts  # one FaultStats for every generation of rules
        self.peer = peer
        self.client_ip = _client_ip(peer)
        self.broker_id = broker_id
        self._ordinals: dict[int, int] = {}  # api key -> requests seen (the engine's stream ordinal)

    def decide(self, exchange: Exchange) -> Verdict | None:
        injector = self.live.injector
        if injector is None:
            return None
        engine = injector.engine
        api_key = exchange.api_key
        if not engine.mentions(api_key):
            return None
        ordinal = self._ordinals.get(api_key, 0)
        self._ordinals[api_key] = ordinal + 1
        if not engine.admits(api_key, exchange.client_id, self.client_ip, self.broker_id):
            return None  # every rule of this api is for other clients: nothing more to read (one dict lookup)
        if exchange.request_body_offset is None:
            return None  # forwarded as read: the broker is the judge of a header kproxy cannot read
        frame = exchange.request
        # The facts read the session's parse (api key, version, correlation id; the client id when a
        # rule asks for it): no header is decoded again here.
        facts = FrameFacts(frame, exchange, client_ip=self.client_ip, broker_id=self.broker_id,
                           stream_ordinal=ordinal, now=exchange.read_at, wall_time=time.time(),
                           topic_names=injector.topic_names)
        decision = engine.evaluate(facts)
        if not decision.matched:
            return None
        # The injector goes along: a request keeps the rules it was decided by, even if they are
        # replaced before its response comes back.
        return self._verdict(injector, exchange, decision, facts, frame)

    # -- a decision -> a verdict --------------------------------------------------------
    def _verdict(self, injector: FaultInjector, ex: Exchange, decision: Decision, facts: FrameFacts,
                 frame: bytes) -> Verdict | None:
        counts = self.counts
        close: CloseConnection | None = None
        answer: bytes | None = None
        forward = True
        request = frame
        hold_s = response_delay_s = 0.0
        throttle_ms = 0
        response_charges: list[tuple[str, Throttle]] = []  # (rule id, byte rate) charged with the response size
        drop = blackhole = False
        close_after: float | None = None
        response_steps: list[tuple[RuleHit, Rule]] = []
        for hit in decision.hits:
            rule = injector.by_id[hit.rule_id]
            if hit.dry_run:
                for action in hit.actions:
                    self._fault(hit, action_name(action), facts, "dry run: nothing done", dry_run=True)
                continue
            delays = iter(hit.delays_ms)
            for action in hit.actions:
                name = action_name(action)
                if isinstance(action, Delay):
                    ms = next(delays)
                    if action.at is DelayPoint.REQUEST:
                        hold_s += ms / 1000
                    else:
                        response_delay_s += ms / 1000
                    self._fault(hit, name, facts, f"{ms:.1f}ms at {action.at.value}")
                elif isinstance(action, Throttle):
                    if charged_on_response(ex.api_key, action):
                        delay, reported, by_bytes = _throttle_on_response(injector, hit.rule_id, action, facts)
                        response_charges.append((hit.rule_id, by_bytes))
                    else:
                        delay = reported = injector.engine.throttle_delay_s(hit.rule_id, action, facts,
                                                                            ex.request_size)
                    if delay > 0:
                        hold_s += delay
                        throttle_ms = max(throttle_ms, round(reported * 1000))
                        key = hit.rule_id
                        counts.throttle_seconds[key] = counts.throttle_seconds.get(key, 0.0) + delay
                        self._fault(hit, name, facts, f"held {delay * 1000:.1f}ms")
                elif isinstance(action, DropResponse):
                    drop = True
                    self._kill(hit, name, facts, "the response will be swallowed")
                elif isinstance(action, CloseRule | ResetConnection):
                    abort = isinstance(action, ResetConnection)
                    close = close or CloseConnection(f"rule {hit.rule_id}: {name}", CloseKind.DELIBERATE,
                                                     abort=abort)
                    self._kill(hit, name, facts, "RST" if abort else "FIN")
                elif isinstance(action, Blackhole | SlowClose):
                    blackhole = True
                    if isinstance(action, SlowClose):
                        close_after = action.ms / 1000
                    self._kill(hit, name, facts, "no more answers on this connection"
                               + (f", closing in {action.ms:g}ms" if isinstance(action, SlowClose) else ""))
            if close is not None or answer is not None:
                continue
            outcome = apply_to_request([a for a in hit.actions if not isinstance(a, _SESSION_ACTIONS)], request,
                                       only=selector(rule.match, facts.topic_names))
            request = outcome.frame
            for note in outcome.notes:
                self._fault(hit, _note_action(note), facts, note)
            if not outcome.forward:
                forward = False
                answer = outcome.answer
                for action in hit.actions:
                    if isinstance(action, InjectError) and action.mode is InjectMode.RESPOND:
                        _count(counts.injected_errors, (facts_api(ex), error_name(action.error_code)))
                        break
            elif any(_response_side(a) for a in hit.actions):
                response_steps.append((hit, rule))
        if close is not None:
            return Verdict(close=close)
        on_response = self._on_response(ex, facts, response_steps, throttle_ms) \
            if (response_steps or throttle_ms) and forward else None
        if response_charges and forward:
            on_response = _charging_response(injector, ex, facts, response_charges, on_response)
        if answer is not None and throttle_ms:
            answer = apply_to_response((), answer, ex.api_key, ex.api_version, throttle_time_ms=throttle_ms).frame
        if (not forward or request is not frame or hold_s or response_delay_s or on_response is not None or drop
                or blackhole):
            return Verdict(answer=answer, forward=forward, request=None if request is frame else request,
                           hold_s=hold_s, response_delay_s=response_delay_s, on_response=on_response,
                           drop_response=drop, blackhole=blackhole, close_after_s=close_after)
        return None

    def _on_response(self, ex: Exchange, facts: FrameFacts, steps: list[tuple[RuleHit, Rule]], throttle_ms: int
                     ) -> Callable[[bytes], bytes]:
        api_key, api_version = ex.api_key, ex.api_version
        counts = self.counts

        def edit(response: bytes) -> bytes:
            for i, (hit, rule) in enumerate(steps):
                last = i == len(steps) - 1
                actions = [a for a in hit.actions if _response_side(a)]
                outcome = apply_to_response(actions, response, api_key, api_version,
                                            throttle_time_ms=throttle_ms if last else None,
                                            only=selector(rule.match, facts.topic_names))
                response = outcome.frame
                for note in outcome.notes:
                    self._fault(hit, _note_action(note), facts, note)
                for action in actions:
                    if isinstance(action, InjectError):
                        _count(counts.injected_errors, (facts_api(ex), error_name(action.error_code)))
            if not steps and throttle_ms:
                response = apply_to_response((), response, api_key, api_version, throttle_time_ms=throttle_ms).frame
            return response

        return edit

    # -- accounting ---------------------------------------------------------------------
    def _kill(self, hit: RuleHit, name: str, facts: FrameFacts, detail: str) -> None:
        _count(self.counts.connection_faults, (hit.rule_id, name))
        self._fault(hit, name, facts, detail)

    def _fault(self, hit: RuleHit, action: str, facts: FrameFacts, detail: str, *, dry_run: bool = False) -> None:
        counts = self.counts
        key = (hit.rule_id, action, "true" if dry_run else "false")
        counts.hits[key] = counts.hits.get(key, 0) + 1
        recent = self.live.recent
        logged = log.isEnabledFor(logging.INFO)
        if recent is None and not logged:
            return  # the topic scan below is for the line and the ring alone
        topics = facts.topics()
        partitions = sorted({p for parts in topics.values() for p in parts})
        if recent is not None:  # a bounded deque: the oldest record falls out
            recent.append(FaultRecord(time.time(), hit.rule_id, action, self.peer, facts.correlation_id,
                                      api_snake_name(facts.api_key), tuple(sorted(topics)), tuple(partitions),
                                      detail, dry_run))
        if not logged:
            return
        log.info("event=fault rule=%s action=%s connection=%s correlation_id=%d api=%s topic=%s partition=%s "
                 "detail=%s%s", hit.rule_id, action, self.peer, facts.correlation_id, api_snake_name(facts.api_key),
                 q(",".join(sorted(topics))), q(",".join(map(str, partitions))), q(detail),
                 " dry_run=true" if dry_run else "")


class TopicIdLearningPolicy(RulePolicy):
    """A :class:`RulePolicy` that also learns topic ids from Metadata v10+ responses into the
    injector's :class:`~kproxy.rules.facts.TopicIdNames` (shared by every connection), so a
    ``topic`` key matches requests that name topics by id (Fetch v13+). Given to connections
    only when rules with a topic key are or may be in force
    (:meth:`kproxy.server.live_rules.LiveRules.policy`). Its cost per request: a method call
    and a comparison; per Metadata v10+ response: one decode (rare: clients refresh metadata
    every few minutes, or after an error)."""

    __slots__ = ()

    def decide(self, exchange: Exchange) -> Verdict | None:
        verdict = super().decide(exchange)
        if exchange.api_key != METADATA or exchange.api_version < METADATA_TOPIC_IDS:
            return verdict
        injector = self.live.injector
        if injector is None or not injector.learns_topic_ids:
            return verdict
        return _learning_topic_ids(verdict, injector.topic_names, exchange.api_version)


def _learning_topic_ids(verdict: Verdict | None, names: TopicIdNames, api_version: int) -> Verdict:
    """``verdict`` with the broker's Metadata answer read for topic ids first (before any rule edits it)."""
    edit = verdict.on_response if verdict is not None else None

    def learn(response: bytes) -> bytes:
        names.learn_metadata(response, api_version)
        return response if edit is None else edit(response)

    return Verdict(on_response=learn) if verdict is None else dataclasses.replace(verdict, on_response=learn)


# -- throttles charged with response sizes (Fetch: kproxy/rules/bucket.py) ----------------------------
def _throttle_on_response(injector: FaultInjector, rule_id: str, throttle: Throttle, facts: FrameFacts
                          ) -> tuple[float, float, Throttle]:
    """A Fetch under a byte rate: the seconds to hold it (the byte debt left by earlier responses,
    or its request rate's delay), the part of that to report as throttle_time_ms (the request
    rate's only: the byte debt was reported by the response that made it), and the byte rate alone."""
    engine = injector.engine
    by_bytes, by_requests = split_throttle(throttle)
    assert by_bytes is not None
    reported = engine.throttle_delay_s(rule_id, by_requests, facts, 1) if by_requests is not None else 0.0
    debt = engine.throttle_delay_s(rule_id, by_bytes, facts, 0)  # nothing charged: what is owed now
    return max(debt, reported), reported, by_bytes


def _charging_response(injector: FaultInjector, ex: Exchange, facts: FrameFacts, charges: list[tuple[str, Throttle]],
                       edit: Callable[[bytes], bytes] | None) -> Callable[[bytes], bytes]:
    """``edit`` (if any), then the response's size charged to each byte rate, the resulting debt
    reported in its throttle_time_ms (never lowering a larger one already there)."""
    api_key, api_version = ex.api_key, ex.api_version

    def charge(response: bytes) -> bytes:
        if edit is not None:
            response = edit(response)
        facts.now = injector.clock()  # when the broker's answer is seen: the usage happens now
        debt = max(injector.engine.throttle_delay_s(rule_id, by_bytes, facts, len(response))
                   for rule_id, by_bytes in charges)
        if debt > 0:
            response = apply_to_response((), response, api_key, api_version,
                                         throttle_time_ms=round(debt * 1000)).frame
        return response

    return charge


def _count(table: dict[tuple[str, str], int], key: tuple[str, str]) -> None:
    table[key] = table.get(key, 0) + 1


def facts_api(ex: Exchange) -> str:
    return api_snake_name(ex.api_key)


def _note_action(note: str) -> str:
    """The action name a note of kproxy.rules.apply starts with (``inject_error NOT_LEADER...: ...``)."""
    return note.split(" ", 1)[0].split(":", 1)[0]


def _response_side(action: object) -> bool:
    if isinstance(action, InjectError):
        return action.mode is InjectMode.REPLACE
    return not isinstance(action, _SESSION_ACTIONS)


__all__ = ["FaultInjector", "FaultRecord", "RulePolicy", "TopicIdLearningPolicy"]
