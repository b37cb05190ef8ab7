"""Fault-injection rules wired into sessions: kproxy.rules' decisions -> the session's verdicts.

The server builds one :class:`FaultInjector` per rule set (one :class:`~kproxy.rules.RuleEngine`,
shared by every connection: schedule counters and throttle buckets are global, as a broker's
quotas are) and gives each :class:`~kproxy.proxy.session.Session` a :class:`RulePolicy`, the
:class:`~kproxy.proxy.session.RequestPolicy` the session calls once per request. proxy/ never
imports kproxy.rules (pyproject.toml's import contracts): this module is the translation.

Cost: a request of an api key no rule names costs one dict lookup (the policy's gate of that api
key, :meth:`RuleEngine.mentions` asked once per rule set and connection); see :class:`RulePolicy`
for the others. What a verdict needs of each rule is worked out once per rule set
(:class:`RulePlan`), and a fault's details are formatted only when its log line or the admin
API's ring will read them.

Size (over the ~500 lines the project aims for): one job, decisions into verdicts, whose parts
(the per-rule plan, the per-connection gates, the verdict builder, the accounting of faults, the
response-side throttle charge) read each other's private state per request; split across modules
they would need that state public, and a module boundary on the per-request path costs attribute
lookups for nothing. The part that could stand alone, the peer address parsing, is 40 lines.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from kproxy.host_port import split_host_port
from kproxy.logfmt import q
from kproxy.metrics.fault_stats import FaultStats
from kproxy.protocol.record_faults import Selector
from kproxy.protocol.request_fields import RequestHeaderMemo
from kproxy.protocol.tables import api_snake_name, error_name
from kproxy.protocol.topic_ids import METADATA, METADATA_TOPIC_IDS, TopicIdNames
from kproxy.proxy.commands import CloseConnection, CloseKind
from kproxy.proxy.session import Exchange, RuleDecision, Verdict
from kproxy.ratelimit import LogRateLimit
from kproxy.rules import Decision, RuleEngine, RuleHit, RuleSet
from kproxy.rules.apply import apply_to_request, apply_to_response, selector
from kproxy.rules.bucket import charged_on_response, split_throttle
from kproxy.rules.facts import FrameFacts
from kproxy.rules.model import (
    Action,
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

log = logging.getLogger("kproxy.faults")
_OVER_BUDGET_LOG = LogRateLimit(60.0)  # the first frame over its records budget, then one line a minute

# Actions the session times or ends the connection for; apply.py's functions ignore them.
_CONNECTION_ACTIONS = (DropResponse, CloseRule, ResetConnection, Blackhole, SlowClose)
_SESSION_ACTIONS = (Delay, Throttle, *_CONNECTION_ACTIONS)


class FaultInjector:
    """One rule set at work: the engine, the counters, the fault log."""

    def __init__(self, rules: RuleSet, *, counts: FaultStats | None = None,
                 clock: Callable[[], float] = time.perf_counter, topic_names: TopicIdNames | None = None,
                 register: bool = True) -> None:
        """Build the engine and the per-rule plans.

        ``register=False`` leaves ``counts`` untouched, so the build may run in a worker thread
        while the trio thread scrapes and counts (kproxy.server.live_rules.LiveRules.prepare);
        :meth:`register_series` must then be called on the trio thread before the injector is used.
        """
        self.rules = rules
        self.clock = clock
        self.engine = RuleEngine(rules, loaded_at=clock())
        self.counts = counts if counts is not None else FaultStats()
        self._enabled = enabled = [r for r in rules.rules if r.enabled]
        # Topic ids -> names for requests that name topics by id (Fetch v13+); learnt only when a
        # rule has a topic key to match them with. A replacing rule set is given the old map.
        self.topic_names = topic_names if topic_names is not None else TopicIdNames()
        self.learns_topic_ids = any(r.match.topics is not None for r in enabled)
        self.plans: dict[str, RulePlan] = {r.id: RulePlan(r, self.topic_names) for r in enabled}
        self.rule_ids = frozenset(r.id for r in rules.rules)  # whose counter series a replacement keeps
        # Series born at zero: an alert's increase() sees the first fault, not only the second, and
        # dashboards show every loaded rule. Listed here (a worker thread's work for a big set), in rule
        # order; register_series adds those not there yet.
        hits: dict[HitKey, int] = {}
        conns: dict[tuple[str, str], int] = {}
        throttles: dict[str, float] = {}
        errors: dict[tuple[str, str], int] = {}
        held: dict[tuple[str, str], None] = {}  # kproxy_rule_held_seconds: histograms, made by counts
        for rule in enabled:
            for _, action, (_, name, _) in self.plans[rule.id].steps:
                hits[rule.id, name, "true" if rule.dry_run else "false"] = 0
                if rule.dry_run:
                    continue
                if isinstance(action, _CONNECTION_ACTIONS):
                    conns[rule.id, name] = 0
                elif isinstance(action, Throttle):
                    throttles[rule.id] = 0.0
                    held[rule.id, name] = None
                elif isinstance(action, Delay):
                    held[rule.id, name] = None
                elif isinstance(action, InjectError):
                    errors.update(((api_snake_name(api), error_name(action.error_code)), 0)
                                  for api in sorted(rule.match.apis or ()))
        self.series = (hits, conns, throttles, errors)
        self.held_series = list(held)
        if register:
            self.register_series()

    def register_series(self) -> None:
        """Put this rule set's counter series in ``counts`` (trio thread only: scrapes read them there);
        counts already there are kept."""
        for _ in self.series_steps():
            pass

    def series_steps(self, chunk: int = 0) -> Iterator[None]:
        """:meth:`register_series`, ``chunk`` series per step (0: all at once), yielding between steps
        (kproxy.server.live_rules gives the loop a turn there). Counting never needs a series registered."""
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


# What RulePolicy._verdict does for an action, one int compare each (not a chain of isinstance).
_DELAY_REQUEST, _DELAY_RESPONSE, _THROTTLE, _DROP, _CLOSE, _RESET, _BLACKHOLE, _SLOW_CLOSE, _EDIT = range(9)
_KINDS: dict[type, int] = {Throttle: _THROTTLE, DropResponse: _DROP, CloseRule: _CLOSE, ResetConnection: _RESET,
                           Blackhole: _BLACKHOLE, SlowClose: _SLOW_CLOSE}
HitKey = tuple[str, str, str]  # (rule id, action name, dry run "true"/"false"): FaultStats.hits' key


class RulePlan:
    """What a verdict needs of one rule, worked out once per rule set, not per request.

    ``steps``: per action, in order, its kind (what the session does), the action and its hit
    counter key; ``request_actions`` and ``response_actions``: what kproxy.rules.apply runs on the
    request and on the response (empty: nothing to call); ``only``: the partitions the rule's
    ``topic``/``partition`` keys select for the record actions; ``delays_only``: every action is a
    ``delay`` (a verdict of holds alone).
    """

    __slots__ = ("delays_only", "only", "request_actions", "respond_error", "response_actions", "response_errors",
                 "steps")

    def __init__(self, rule: Rule, topic_names: TopicIdNames) -> None:
        dry = "true" if rule.dry_run else "false"
        self.steps: tuple[tuple[int, Action, HitKey], ...] = tuple(
            (_kind(a), a, (rule.id, action_name(a), dry)) for a in rule.actions)
        self.delays_only = all(isinstance(a, Delay) for a in rule.actions)
        self.request_actions = tuple(a for a in rule.actions if not isinstance(a, _SESSION_ACTIONS))
        self.response_actions = tuple(a for a in rule.actions if _response_side(a))
        # The error counted (injected_errors) when the request is answered locally: the first to answer.
        self.respond_error = next((error_name(a.error_code) for a in rule.actions
                                   if isinstance(a, InjectError) and a.mode is InjectMode.RESPOND), None)
        self.response_errors = tuple(error_name(a.error_code) for a in self.response_actions
                                     if isinstance(a, InjectError))
        # topic_names is the injector's own map, filled as connections learn ids: read when the selector runs.
        self.only: Selector | None = selector(rule.match, topic_names)


def _kind(action: Action) -> int:
    if isinstance(action, Delay):
        return _DELAY_REQUEST if action.at is DelayPoint.REQUEST else _DELAY_RESPONSE
    return _KINDS.get(type(action), _EDIT)


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
    host = split_host_port(peer)[0]
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


# Per api key, what a policy does with a request (RulePolicy._gate): ignore it, decide it, or first ask
# whether its client may meet a rule at all (RulePolicy._admits: then ignore it or decide it).
_IGNORED, _OPEN, _SCOPED = range(3)


class _Delays:
    """The verdict of a fixed hit (the same for every request) whose actions are delays alone,
    worked out once: the hit counter keys it counts, and the verdict (None: it holds nothing, zero
    delays or a dry run). A :class:`Verdict` is a frozen value: one serves every request."""

    __slots__ = ("decisions", "keys", "verdict")

    def __init__(self, hit: RuleHit, plan: RulePlan) -> None:
        self.keys = tuple(key for _, _, key in plan.steps)
        self.decisions: tuple[RuleDecision, ...] = tuple(
            (key[0], key[1], "dry run: nothing done" if hit.dry_run else
             f"{ms:.1f}ms at {'request' if kind == _DELAY_REQUEST else 'response'}", hit.dry_run)
            for (kind, _, key), ms in zip(plan.steps, hit.delays_ms, strict=True))
        hold_s = response_delay_s = longest = 0.0
        held_by: tuple[str, str] | None = None
        for (kind, _, key), ms in zip(plan.steps, hit.delays_ms, strict=True):  # RulePolicy._verdict's sums
            if kind == _DELAY_REQUEST:
                hold_s += ms / 1000
            else:
                response_delay_s += ms / 1000
            if ms > longest:
                longest, held_by = ms, (key[0], key[1])
        self.verdict = Verdict(hold_s=hold_s, response_delay_s=response_delay_s, held_by=held_by) \
            if (hold_s or response_delay_s) and not hit.dry_run else None


# (kind, the decision of every request when it is fixed, that decision worked out when it is delays alone)
_Gate = tuple[int, Decision | None, _Delays | None]
_GATES_CAP = 1024  # api keys remembered per connection: a client cycling made-up api keys is read afresh
_NO_CLIENT: object = object()  # RulePolicy._admitted_for before any client id was read


def _open(injector: FaultInjector, decision: Decision | None) -> _Gate:
    """The gate of requests a rule may apply to, with their fixed decision if they have one (the
    same for every request), worked out to the end (:class:`_Delays`) if it is delays alone."""
    if decision is None:
        return _OPEN, None, None
    hit = decision.hits[0]
    plan = injector.plans[hit.rule_id]
    return _OPEN, decision, _Delays(hit, plan) if plan.delays_only else None


class RulePolicy:
    """The :class:`~kproxy.proxy.session.RequestPolicy` of one connection.

    It reads the rule set in force from ``live`` at each request (one attribute read), so rules
    replaced while the connection is open apply from its next request.

    Cost per request of an api key some rule names (a request of no such key costs a dict lookup):
    the connection's count of that key's requests (the engine's stream ordinal); when only rules
    for some clients name it, whether those rules admit its client id (remembered per api key for
    that client id); and its client id and body offset, read once for the policy, the facts and the
    metrics (and compared in place with the last header read, not decoded again:
    :class:`~kproxy.protocol.request_fields.RequestHeaderMemo`). What each api key needs is looked up once per
    rule set and connection. A request decided like every other of its api key and client (the
    first rule it meets names no request key and draws nothing: :meth:`RuleEngine.fixed_decision`,
    :meth:`RuleEngine.client_decision`), by a rule of ``delay`` actions only, with no fault line
    to write nor ring to fill, is answered without building its facts or calling the engine.
    """

    __slots__ = ("_admitted", "_admitted_for", "_gates", "_headers", "_injector", "_ordinals", "broker_id",
                 "client_ip", "counts", "live", "peer")

    def __init__(self, live: _HasInjector, peer: str, broker_id: int | None) -> None:
        self.live = live
        self.counts = live.counts  # one FaultStats for every generation of rules
        self.peer = peer
        self.client_ip = _client_ip(peer)
        self.broker_id = broker_id
        self._ordinals: dict[int, int] = {}  # api key -> requests seen (the engine's stream ordinal)
        self._headers = RequestHeaderMemo()
        # For the rule set in force (_injector): the gate of each api key met, and for the client id
        # _admitted_for, the gate of each api key met whose rules are for some clients only.
        self._injector: FaultInjector | None = None
        self._gates: dict[int, _Gate] = {}
        self._admitted: dict[int, _Gate] = {}
        self._admitted_for: object = _NO_CLIENT

    def decide(self, exchange: Exchange) -> Verdict | None:
        injector = self.live.injector
        if injector is None:
            return None
        if injector is not self._injector:  # another rule set: what each api key needs is looked up again
            self._injector, self._gates, self._admitted = injector, {}, {}
        api_key = exchange.api_key
        gate = self._gates.get(api_key)
        if gate is None:
            gate = self._gate(injector, api_key)
        kind, fixed, delays = gate
        if kind == _IGNORED:
            return None
        ordinal = self._ordinals.get(api_key, 0)
        self._ordinals[api_key] = ordinal + 1
        frame = exchange.request
        client_id, body_offset = self._headers.read(frame, api_key, exchange.api_version)
        # Read once for all: the facts, the session (a Produce's acks) and the metrics read them from the exchange.
        exchange.client_id, exchange.request_body_offset = client_id, body_offset
        if kind == _SCOPED:
            admitted = self._admitted.get(api_key) if client_id == self._admitted_for else None
            kind, fixed, delays = admitted if admitted is not None else self._admits(injector, api_key, client_id)
            if kind == _IGNORED:
                return None  # every rule of this api is for other clients: nothing more to read
        if body_offset is None:
            return None  # forwarded as read: the broker is the judge of a header kproxy cannot read
        if delays is not None and self.live.recent is None and not log.isEnabledFor(logging.INFO):
            # What evaluate() and _verdict() would say, and nothing to report: no facts needed.
            hits = self.counts.hits
            for key in delays.keys:
                hits[key] = hits.get(key, 0) + 1
            exchange.rule_decisions = delays.decisions
            return delays.verdict
        engine = injector.engine
        # The facts read the session's parse (api key, version, correlation id, client id): no
        # header is decoded again here.
        facts = FrameFacts(frame, exchange, client_ip=self.client_ip, broker_id=self.broker_id,
                           stream_ordinal=ordinal, now=exchange.read_at,
                           wall_time=time.time() if engine.reads_wall_time else 0.0,
                           topic_names=injector.topic_names)
        decision = fixed if fixed is not None else engine.evaluate(facts)  # a fixed one is evaluate()'s
        if not decision.hits:
            return None
        # The injector goes along: a request keeps the rules it was decided by, even if they are
        # replaced before its response comes back.
        return self._verdict(injector, exchange, decision, facts, frame)

    def _gate(self, injector: FaultInjector, api_key: int) -> _Gate:
        """What requests of ``api_key`` need under ``injector``'s rules (remembered)."""
        engine = injector.engine
        gate: _Gate
        if not engine.mentions(api_key):
            gate = (_IGNORED, None, None)
        elif not engine.admits_all(api_key):
            gate = (_SCOPED, None, None)
        else:
            gate = _open(injector, engine.fixed_decision(api_key))
        if len(self._gates) >= _GATES_CAP:
            self._gates.clear()
        self._gates[api_key] = gate
        return gate

    def _admits(self, injector: FaultInjector, api_key: int, client_id: str | None) -> _Gate:
        """The gate of a request's api key for this client, when rules of it are for some clients
        only (``_IGNORED``: none is for this one); remembered per api key for its client id (which
        :meth:`decide` looks up first)."""
        if client_id != self._admitted_for:  # a client may change its client id: its own answers
            self._admitted, self._admitted_for = {}, client_id
        gate = self._admitted.get(api_key)
        if gate is None:
            engine = injector.engine
            if not engine.admits(api_key, client_id, self.client_ip, self.broker_id):
                gate = (_IGNORED, None, None)
            else:
                gate = _open(injector, engine.client_decision(api_key, client_id, self.client_ip, self.broker_id))
            if len(self._admitted) >= _GATES_CAP:
                self._admitted.clear()
            self._admitted[api_key] = gate
        return gate

    # -- a decision -> a verdict --------------------------------------------------------
    def _verdict(self, injector: FaultInjector, ex: Exchange, decision: Decision, facts: FrameFacts,
                 frame: bytes) -> Verdict | None:
        counts = self.counts
        hits = counts.hits
        # Whether a fault is reported (a log line, a ring record): details are formatted only then.
        report = self.live.recent is not None or log.isEnabledFor(logging.INFO)
        close: CloseConnection | None = None
        answer: bytes | None = None
        forward = True
        request = frame
        hold_s = response_delay_s = longest_s = 0.0  # longest_s: the largest single hold, charged held_by
        held_by: tuple[str, str] | None = None
        throttle_ms = 0
        response_charges: list[tuple[str, Throttle]] | None = None  # (rule id, byte rate) charged with the size
        drop = blackhole = False
        close_after: float | None = None
        response_steps: list[tuple[str, RulePlan]] | None = None
        plans = injector.plans
        for hit in decision.hits:
            rule_id = hit.rule_id
            plan = plans[rule_id]
            if hit.dry_run:
                for _, _, key in plan.steps:
                    if report:
                        self._fault(key, facts, "dry run: nothing done", ex)
                    else:
                        hits[key] = hits.get(key, 0) + 1
                        _decided(ex, key, "dry run: nothing done")
                continue
            d = 0
            for kind, action, key in plan.steps:
                if kind <= _DELAY_RESPONSE:
                    ms = hit.delays_ms[d]
                    d += 1
                    if kind == _DELAY_REQUEST:
                        hold_s += ms / 1000
                    else:
                        response_delay_s += ms / 1000
                    if ms / 1000 > longest_s:
                        longest_s, held_by = ms / 1000, (rule_id, key[1])
                    detail = f"{ms:.1f}ms at {'request' if kind == _DELAY_REQUEST else 'response'}"
                    if report:
                        self._fault(key, facts, detail, ex)
                    else:
                        hits[key] = hits.get(key, 0) + 1
                        _decided(ex, key, detail)
                elif kind == _THROTTLE:
                    assert isinstance(action, Throttle)
                    if charged_on_response(ex.api_key, action):
                        delay, reported, by_bytes = _throttle_on_response(injector, rule_id, action, facts)
                        response_charges = response_charges or []
                        response_charges.append((rule_id, by_bytes))
                    else:
                        delay = reported = injector.engine.throttle_delay_s(rule_id, action, facts, ex.request_size)
                    if delay > 0:
                        hold_s += delay
                        if delay > longest_s:
                            longest_s, held_by = delay, (rule_id, key[1])
                        throttle_ms = max(throttle_ms, round(reported * 1000))
                        counts.throttle_seconds[rule_id] = counts.throttle_seconds.get(rule_id, 0.0) + delay
                        self._fault(key, facts, f"held {delay * 1000:.1f}ms", ex)
                elif kind == _DROP:
                    drop = True
                    self._kill(key, facts, "the response will be swallowed", ex)
                elif kind in (_CLOSE, _RESET):
                    abort = kind == _RESET
                    close = close or CloseConnection(f"rule {rule_id}: {key[1]}", CloseKind.DELIBERATE, abort=abort)
                    self._kill(key, facts, "RST" if abort else "FIN", ex)
                elif kind == _BLACKHOLE:
                    blackhole = True
                    self._kill(key, facts, "no more answers on this connection", ex)
                elif kind == _SLOW_CLOSE:
                    assert isinstance(action, SlowClose)
                    blackhole = True
                    close_after = action.ms / 1000
                    self._kill(key, facts, f"no more answers on this connection, closing in {action.ms:g}ms", ex)
            if close is not None or answer is not None:
                continue
            if plan.request_actions:  # none: apply_to_request would hand the frame back as it is
                outcome = apply_to_request(plan.request_actions, request, only=plan.only)
                request = outcome.frame
                if outcome.over_budget:
                    _over_budget(counts, self.peer)
                for note in outcome.notes:
                    self._fault((rule_id, _note_action(note), "false"), facts, note, ex)
                if not outcome.forward:
                    forward = False
                    answer = outcome.answer
                    if plan.respond_error is not None:
                        _count(counts.injected_errors, (facts_api(ex), plan.respond_error))
                    continue
            if plan.response_actions:
                response_steps = response_steps or []
                response_steps.append((rule_id, plan))
        if close is not None:
            return Verdict(close=close)
        on_response = self._on_response(ex, facts, response_steps or [], throttle_ms) \
            if (response_steps or throttle_ms) and forward else None
        if response_charges and forward:
            on_response = _charging_response(injector, ex, facts, response_charges, on_response)
        if answer is not None and throttle_ms:
            answer = apply_to_response((), answer, ex.api_key, ex.api_version, throttle_time_ms=throttle_ms).frame
        if (not forward or request is not frame or hold_s or response_delay_s or on_response is not None or drop
                or blackhole):
            return Verdict(answer=answer, forward=forward, request=None if request is frame else request,
                           hold_s=hold_s, response_delay_s=response_delay_s, on_response=on_response,
                           drop_response=drop, blackhole=blackhole, close_after_s=close_after, held_by=held_by)
        return None

    def _on_response(self, ex: Exchange, facts: FrameFacts, steps: list[tuple[str, RulePlan]], throttle_ms: int
                     ) -> Callable[[bytes], bytes]:
        api_key, api_version = ex.api_key, ex.api_version
        counts = self.counts

        def edit(response: bytes) -> bytes:
            for i, (rule_id, plan) in enumerate(steps):
                last = i == len(steps) - 1
                outcome = apply_to_response(plan.response_actions, response, api_key, api_version,
                                            throttle_time_ms=throttle_ms if last else None, only=plan.only)
                response = outcome.frame
                if outcome.over_budget:
                    _over_budget(counts, self.peer)
                for note in outcome.notes:
                    self._fault((rule_id, _note_action(note), "false"), facts, note, ex)
                for error in plan.response_errors:
                    _count(counts.injected_errors, (facts_api(ex), error))
            if not steps and throttle_ms:
                response = apply_to_response((), response, api_key, api_version, throttle_time_ms=throttle_ms).frame
            return response

        return edit

    # -- accounting ---------------------------------------------------------------------
    def _kill(self, key: HitKey, facts: FrameFacts, detail: str, ex: Exchange) -> None:
        _count(self.counts.connection_faults, (key[0], key[1]))
        self._fault(key, facts, detail, ex)

    def _fault(self, key: HitKey, facts: FrameFacts, detail: str, ex: Exchange) -> None:
        """Count one fault (``key``: rule id, action name, dry run), note it on the exchange (its
        capture row's ``rule_decisions``), and log it and keep it in the ring when either is on."""
        counts = self.counts
        counts.hits[key] = counts.hits.get(key, 0) + 1
        _decided(ex, key, detail)
        recent = self.live.recent
        logged = log.isEnabledFor(logging.INFO)
        if recent is None and not logged:
            return  # the topic scan below is for the line and the ring alone
        rule_id, action, dry = key
        dry_run = dry == "true"
        topics = facts.topics()
        partitions = sorted({p for parts in topics.values() for p in parts})
        if recent is not None:  # a bounded deque: the oldest record falls out
            recent.append(FaultRecord(time.time(), rule_id, action, self.peer, facts.correlation_id,
                                      _api_label(facts.api_key), tuple(sorted(topics)), tuple(partitions),
                                      detail, dry_run))
        if not logged:
            return
        log.info("event=fault rule=%s action=%s connection=%s correlation_id=%d api=%s topic=%s partition=%s "
                 "detail=%s%s", rule_id, action, self.peer, facts.correlation_id, _api_label(facts.api_key),
                 q(",".join(sorted(topics))), q(",".join(map(str, partitions))), q(detail),
                 " dry_run=true" if dry_run else "")


class TopicIdLearningPolicy(RulePolicy):
    """A :class:`RulePolicy` that also learns topic ids from Metadata v10+ responses into the
    injector's :class:`~kproxy.protocol.topic_ids.TopicIdNames` (shared by every connection), so a
    ``topic`` key matches requests that name topics by id (Fetch v13+). Given to connections
    only when rules with a topic key are or may be in force
    (:meth:`kproxy.server.live_rules.LiveRules.policy`). Its cost per request: a method call
    and a comparison; per Metadata v10+ response: one decode (rare: clients refresh metadata
    every few minutes, or after an error)."""

    __slots__ = ()

    def decide(self, exchange: Exchange) -> Verdict | None:
        verdict = RulePolicy.decide(self, exchange)
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


def _over_budget(counts: FaultStats, peer: str) -> None:
    """A frame's record actions gave up (kproxy.protocol.records.budget): counted, logged rate-limited."""
    counts.records_over_budget += 1
    held = _OVER_BUDGET_LOG.due()
    if held is not None:
        log.warning("event=records_over_budget reader=rules connection=%s frames=%d", peer, held)


def _decided(ex: Exchange, key: HitKey, detail: str) -> None:
    """Note one action done (or matched, in a dry run) on the exchange, for its observers."""
    ex.rule_decisions = (*ex.rule_decisions, (key[0], key[1], detail, key[2] == "true"))


def _count(table: dict[tuple[str, str], int], key: tuple[str, str]) -> None:
    table[key] = table.get(key, 0) + 1


def facts_api(ex: Exchange) -> str:
    return _api_label(ex.api_key)


_API_LABELS: dict[int, str] = {}


def _api_label(api_key: int) -> str:
    """:func:`api_snake_name`, remembered (it runs a regex substitution: ~1 µs a fault line). Bounded:
    a rule for every api key sees whatever keys clients make up."""
    found = _API_LABELS.get(api_key)
    if found is None:
        found = api_snake_name(api_key)
        if len(_API_LABELS) < 1024:
            _API_LABELS[api_key] = found
    return found


def _note_action(note: str) -> str:
    """The action name a note of kproxy.rules.apply starts with (``inject_error NOT_LEADER...: ...``)."""
    return note.split(" ", 1)[0].split(":", 1)[0]


def _response_side(action: object) -> bool:
    if isinstance(action, InjectError):
        return action.mode is InjectMode.REPLACE
    return not isinstance(action, _SESSION_ACTIONS)


__all__ = ["FaultInjector", "FaultRecord", "RulePolicy", "TopicIdLearningPolicy"]
