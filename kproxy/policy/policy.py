"""The rule policy of one client connection: kproxy.rules' decisions -> the session's verdicts.

The server gives each :class:`~kproxy.proxy.session.Session` a :class:`RulePolicy`, the
:class:`~kproxy.proxy.session.RequestPolicy` the session calls once per request, over the rule set
in force (:class:`~kproxy.policy.live_rules.LiveRules`, a :class:`~kproxy.policy.injector.FaultInjector`).
proxy/ never imports kproxy.rules (pyproject.toml's import contracts): this module is the translation.
Each action that hit writes its own part of the verdict
(:meth:`~kproxy.rules.actions.base.RuleAction.decide`, into a
:class:`~kproxy.rules.actions.draft.VerdictDraft`); the policy adds the request and response edits
(:mod:`kproxy.rules.apply`), counts and reports the faults (:mod:`kproxy.policy.faults`), and
turns the draft into a :class:`~kproxy.proxy.session.Verdict`.

Cost: a request of an api key no rule names costs one dict lookup (the policy's gate of that api
key, :meth:`RuleEngine.mentions` asked once per rule set and connection) and one emptiness test of
the leader epoch floors (:mod:`kproxy.protocol.leader_epochs`: empty unless a ``move_leader`` raised
an epoch the broker has not reached); see :class:`RulePolicy` for the others. A fault's details
are formatted only when its log line or the admin API's ring will read them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import Final, Protocol

from kproxy.logfmt import q
from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.faults import (
    FaultRecord,
    api_label,
    count,
    decided,
    log,
    note_action,
    over_budget,
)
from kproxy.policy.in_force import RuleInForce
from kproxy.policy.injector import STREAMS_CAP, FaultInjector, RulePlan
from kproxy.policy.peer import client_ip
from kproxy.policy.rule_toxics import WireOrders
from kproxy.protocol.api_keys import METADATA
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.headers import request_body_offset
from kproxy.protocol.leader_epochs import (
    REQUESTS,
    RESPONSES,
    LeaderEpochFloors,
    broker_epochs,
    floor_leader_epochs,
    unfloor_request_epochs,
)
from kproxy.protocol.record_faults import Selector
from kproxy.protocol.request_fields import RequestHeaderMemo
from kproxy.protocol.topic_ids import METADATA_TOPIC_IDS, TopicIdNames
from kproxy.proxy.commands import CloseConnection, CloseKind
from kproxy.proxy.session import Exchange, RuleDecision, Verdict
from kproxy.rules import Decision, RuleHit
from kproxy.rules.actions.base import HitKey, Step
from kproxy.rules.actions.draft import ResponseCharge, VerdictDraft
from kproxy.rules.apply import apply_to_request, apply_to_response
from kproxy.rules.frame_facts import FrameFacts


class _HasInjector(Protocol):
    """What a policy reads per request: kproxy.policy.live_rules.LiveRules (a protocol, not an
    import: live_rules builds policies, so it imports this module)."""

    @property
    def injector(self) -> FaultInjector | None: ...

    @property
    def counts(self) -> FaultStats: ...

    @property
    def recent(self) -> deque[FaultRecord] | None: ...

    @property
    def epoch_floors(self) -> LeaderEpochFloors: ...


# Per api key, what a policy does with a request (RulePolicy._gate): ignore it, decide it, or first ask
# whether its client may meet a rule at all (RulePolicy._admits: then ignore it or decide it).
_IGNORED, _OPEN, _SCOPED = range(3)


class _Delays:
    """The verdict of a fixed hit (the same for every request) whose actions' verdict parts read
    its draws alone (``delay``: :attr:`RulePlan.from_draws`), worked out once: the hit counter keys
    it counts, the decisions it notes on the exchange, and the verdict (None: it holds nothing,
    zero delays or a dry run). A :class:`Verdict` is a frozen value: one serves every request."""

    __slots__ = ("decisions", "keys", "verdict")

    def __init__(self, hit: RuleHit, plan: RulePlan, injector: FaultInjector, wire: WireOrders) -> None:
        draft = VerdictDraft()  # no buckets, no facts: these actions read neither
        if hit.dry_run:
            faults = list(plan.dry_faults)
        else:
            draft.hit(hit.delays_ms)
            for action, key in plan.deciders:  # what RulePolicy._verdict would run
                action.decide(draft, key)
            faults = draft.faults
        self.keys = tuple(key for key, _, _ in faults)
        self.decisions: tuple[RuleDecision, ...] = tuple(
            (key[0], key[1], detail, key[2] == "true") for key, detail, _ in faults)
        orders = wire.orders(injector, draft.wire) if draft.wire else ()
        self.verdict = Verdict(hold_s=draft.hold_s, response_delay_s=draft.response_delay_s, held_by=draft.held_by,
                               wire=orders) if draft.hold_s or draft.response_delay_s or orders else None


# (kind, the decision of every request when it is fixed, that decision worked out when it is delays alone)
_Gate = tuple[int, Decision | None, _Delays | None]
_GATES_CAP: Final = 1024  # api keys remembered per connection: a client cycling made-up api keys is read afresh
_NO_CLIENT: Final[object] = object()  # RulePolicy._admitted_for before any client id was read


def _open(injector: FaultInjector, decision: Decision | None, wire: WireOrders) -> _Gate:
    """The gate of requests a rule may apply to, with their fixed decision if they have one (the
    same for every request), worked out to the end (:class:`_Delays`) if it is delays alone."""
    if decision is None:
        return _OPEN, None, None
    hit = decision.hits[0]
    plan = injector.plans[hit.rule_id]
    return _OPEN, decision, _Delays(hit, plan, injector, wire) if plan.from_draws else None


class RulePolicy:
    """The :class:`~kproxy.proxy.session.RequestPolicy` of one connection.

    It reads the rule set in force from ``live`` at each request (one attribute read), so rules
    replaced while the connection is open apply from its next request.

    Cost per request of an api key some rule names (a request of no such key costs a dict lookup):
    the connection's count of that key's requests (the engine's stream ordinal); when only rules
    for some clients name it, whether those rules admit its client id and principal (remembered per
    api key for that client id, until the session writes another :attr:`principal`); and its
    client id and body offset, read once for the policy, the facts and the metrics (and compared
    in place with the last header read, not decoded again:
    :class:`~kproxy.protocol.requests.RequestHeaderMemo`). What each api key needs is looked up once per
    rule set and connection. A request decided like every other of its api key and client (the
    first rule it meets names no request key and draws nothing: :meth:`RuleEngine.fixed_decision`,
    :meth:`RuleEngine.client_decision`), by a rule of ``delay`` actions only, with no fault line
    to write nor ring to fill, is answered without building its facts or calling the engine.
    """

    __slots__ = ("_admitted", "_admitted_for", "_counted", "_drawn", "_floored", "_gates", "_headers", "_injector",
                 "_lasts", "_principal", "broker_id", "client_ip", "cluster", "counts", "live", "peer", "wire")

    def __init__(self, live: _HasInjector, peer: str, broker_id: int | None, cluster: str | None = None) -> None:
        self.live = live
        self.counts = live.counts  # one FaultStats for every generation of rules
        self.peer = peer
        self.client_ip = client_ip(peer)
        self.broker_id = broker_id
        self.cluster = cluster  # the connection's cluster (the config's clusters:): match.cluster
        self._headers = RequestHeaderMemo()
        # For the rule set in force (_injector): the gate of each api key met, and for the client id
        # _admitted_for, the gate of each api key met whose rules are for some clients only.
        self._injector: FaultInjector | None = None
        self._gates: dict[int, _Gate] = {}
        self._admitted: dict[int, _Gate] = {}
        self._admitted_for: object = _NO_CLIENT
        self._floored: Verdict | None = None  # the last verdict whose response edit keeps epoch floors
        self._drawn: dict[tuple[str, float, int], bool] = {}  # its toxicity draws (kproxy.rules.engine)
        self._counted: dict[object, int] = {}  # its per-connection schedule counters (kproxy.rules.engine)
        self._lasts: dict[tuple[str, Hashable], RuleInForce] = {}  # what connection-wide faults last as long as
        self.wire = WireOrders(live, live.counts)  # the byte-level toxics its rules ask for (kproxy.policy.rule_toxics)
        self._principal: str | None = None

    @property
    def principal(self) -> str | None:
        """The connection's principal, as the session last wrote it (None while unknown)."""
        return self._principal

    @principal.setter
    def principal(self, principal: str | None) -> None:
        # The gates admitted for the client were worked out for the principal before: afresh.
        self._principal, self._admitted, self._admitted_for = principal, {}, _NO_CLIENT

    def decide(self, exchange: Exchange) -> Verdict | None:
        verdict = self._decide(exchange)
        floors = self.live.epoch_floors
        if floors:  # empty unless a rule raised a leader epoch: the one test most requests pay
            return self._keep_epochs(exchange, verdict, floors)
        return verdict

    def _decide(self, exchange: Exchange) -> Verdict | None:
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
        frame = exchange.request
        client_id, body_offset = self._headers.read(frame, api_key, exchange.api_version)
        # Read once for all: the facts, the session (a Produce's acks) and the metrics read them from the exchange.
        exchange.client_id, exchange.request_body_offset = client_id, body_offset
        streams = injector.stream_ordinals
        stream = (client_id, self.broker_id, api_key)
        ordinal = streams.get(stream, 0)
        if not ordinal and len(streams) >= STREAMS_CAP:
            streams.clear()
        streams[stream] = ordinal + 1
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
                           topic_names=injector.topic_names, principal=self._principal,
                           connection_draws=self._drawn, connection_counts=self._counted, cluster=self.cluster)
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
            gate = _open(injector, engine.fixed_decision(api_key), self.wire)
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
            principal = self._principal
            if not engine.admits(api_key, client_id, self.client_ip, self.broker_id, principal, self.cluster):
                gate = (_IGNORED, None, None)
            else:
                gate = _open(injector, engine.client_decision(api_key, client_id, self.client_ip, self.broker_id,
                                                              principal, self.cluster), self.wire)
            if len(self._admitted) >= _GATES_CAP:
                self._admitted.clear()
            self._admitted[api_key] = gate
        return gate

    # -- a decision -> a verdict --------------------------------------------------------
    def _verdict(self, injector: FaultInjector, ex: Exchange, decision: Decision, facts: FrameFacts,
                 frame: bytes) -> Verdict | None:
        counts = self.counts
        draft = VerdictDraft(injector.engine.buckets, facts, ex.request_size)
        faults = draft.faults
        answer: bytes | None = None
        forward = True
        request = frame
        response_steps: list[tuple[str, RulePlan, Step | None]] | None = None
        scoped: dict[int, Selector] = {}  # faults (by index) of frame edits limited to the rule's partitions
        plans = injector.plans
        for hit in decision.hits:
            rule_id = hit.rule_id
            plan = plans[rule_id]
            if hit.dry_run:
                faults.extend(plan.dry_faults)
                continue
            if plan.deciders:
                draft.hit(hit.delays_ms)
                for action, key in plan.deciders:
                    action.decide(draft, key)
            if draft.closing is not None or answer is not None:
                continue
            merge: Step | None = None
            if plan.request_actions:
                outcome = apply_to_request(plan.request_actions, request, only=plan.only)
                request = outcome.frame
                if outcome.over_budget:
                    over_budget(counts, self.peer)
                for note in outcome.notes:
                    kind = note_action(note)
                    if plan.only is not None and kind in plan.scoped:
                        scoped[len(faults)] = plan.only
                    faults.append(((rule_id, kind, "false"), note, False))
                if outcome.answered and plan.respond_error is not None:
                    count(counts.injected_errors, (api_label(ex.api_key), plan.respond_error))
                if not outcome.forward:
                    forward = False
                    answer = outcome.answer
                    continue
                merge = outcome.merge
            if plan.response_actions or merge is not None:
                response_steps = response_steps or []
                response_steps.append((rule_id, plan, merge))
        self._report(draft, facts, ex, scoped)
        if draft.closing is not None:
            reason, abort = draft.closing
            return Verdict(close=CloseConnection(reason, CloseKind.DELIBERATE, abort=abort))
        throttle_ms = draft.throttle_ms
        on_response = self._on_response(ex, facts, response_steps or [], throttle_ms) \
            if (response_steps or throttle_ms) and forward else None
        if draft.response_charges and forward:
            on_response = _charging(injector.clock, facts, draft.response_charges, on_response)
        if answer is not None and throttle_ms:
            answer = apply_to_response((), answer, ex.api_key, ex.api_version, throttle_time_ms=throttle_ms).frame
        hold_s, response_delay_s, drop, blackhole = draft.hold_s, draft.response_delay_s, draft.drop, draft.blackhole
        if blackhole and not draft.blackhole_forwards:
            forward, answer = False, None  # a black hole: the request is read and goes nowhere
        wire = self.wire.orders(injector, draft.wire) if draft.wire else ()
        if (not forward or request is not frame or hold_s or response_delay_s or on_response is not None or drop
                or blackhole or wire or draft.close_delay_s):
            verdict = Verdict(answer=answer, forward=forward, request=None if request is frame else request,
                              hold_s=hold_s, response_delay_s=response_delay_s, on_response=on_response,
                              drop_response=drop, blackhole=blackhole, close_after_s=draft.close_after_s,
                              blackhole_lasts=self._lasting(draft.blackhole_by),
                              held_by=draft.held_by, wire=wire, close_delay_s=draft.close_delay_s,
                              close_delay_lasts=self._lasting(draft.close_delay_by))
            if on_response is not None and ex.api_key in RESPONSES and any(
                    plans[hit.rule_id].leader_moves for hit in decision.hits if not hit.dry_run):
                self._floored = verdict  # its response edit keeps the floors itself (_on_response)
            return verdict
        return None

    def _lasting(self, by: tuple[str, Hashable] | None) -> RuleInForce | None:
        """What a connection-wide fault (a black hole, a slow close) rule ``by`` started lasts as long
        as: that rule's action in force (one per rule and action, made once per connection; None: none)."""
        if by is None:
            return None
        lasting = self._lasts.get(by)
        if lasting is None:
            if len(self._lasts) >= _GATES_CAP:
                self._lasts.clear()
            lasting = self._lasts[by] = RuleInForce(self.live, by[0], by[1])
        return lasting

    # -- leader epochs that never go backwards ------------------------------------------
    def _keep_epochs(self, ex: Exchange, verdict: Verdict | None, floors: LeaderEpochFloors) -> Verdict | None:
        """``verdict`` with what the leader epoch floors ask of this exchange (there are some): a
        request's ``current_leader_epoch`` that only kproxy advertised goes to the broker as the
        broker's epoch, and an answer's current-leader epochs are kept at their floors, after the
        rules' own edits (kproxy.protocol.leader_epochs)."""
        api_key, api_version = ex.api_key, ex.api_version
        floored = verdict is not None and verdict is self._floored
        self._floored = None
        if verdict is not None and (verdict.answer is not None or not verdict.forward or verdict.close is not None):
            return verdict  # answered here, never forwarded: the rules wrote the answer
        request = None
        if api_key in REQUESTS:
            sent = verdict.request if verdict is not None and verdict.request is not None else ex.request
            offset = ex.request_body_offset if sent is ex.request else request_body_offset(sent, api_key, api_version)
            if offset is not None:
                try:
                    lowered = unfloor_request_epochs(sent, api_key, api_version, offset, floors).frame
                except ProtocolError:
                    lowered = sent  # forwarded as read: the broker is the judge of a body kproxy cannot read
                if lowered is not sent:
                    request = lowered
        edit = None
        if api_key in RESPONSES and not floored and api_version >= RESPONSES[api_key][0]:
            first = verdict.on_response if verdict is not None else None

            def edit(response: bytes) -> bytes:
                if first is not None:
                    response = first(response)
                return _floored_response(response, api_key, api_version, floors, None)

        if request is None and edit is None:
            return verdict
        if verdict is None:
            return Verdict(request=request, on_response=edit)
        return dataclasses.replace(verdict, request=request if request is not None else verdict.request,
                                   on_response=edit if edit is not None else verdict.on_response)

    def _on_response(self, ex: Exchange, facts: FrameFacts, steps: list[tuple[str, RulePlan, Step | None]],
                     throttle_ms: int) -> Callable[[bytes], bytes]:
        api_key, api_version = ex.api_key, ex.api_version
        counts = self.counts
        # The partitions whose leader epoch these rules raise: remembered as floors once edited.
        moved = frozenset().union(*(plan.leader_moves for _, plan, _ in steps))
        floors = self.live.epoch_floors if moved and api_key in RESPONSES else None

        def edit(response: bytes) -> bytes:
            broker: dict[tuple[str, int], int] | None = None
            if floors is not None:
                try:  # the epochs of the partitions the rules move, before they raise them
                    broker = broker_epochs(response, api_key, api_version, moved)
                except ProtocolError:
                    broker = None
            for i, (rule_id, plan, merge) in enumerate(steps):
                last = i == len(steps) - 1
                outcome = apply_to_response(plan.response_actions, response, api_key, api_version,
                                            throttle_time_ms=throttle_ms if last else None, only=plan.only,
                                            merge=merge, answering=self.broker_id)
                response = outcome.frame
                if outcome.over_budget:
                    over_budget(counts, self.peer)
                for note in outcome.notes:
                    kind = note_action(note)
                    self._fault((rule_id, kind, "false"), facts, note, ex, plan.only if kind in plan.scoped else None)
                for error in plan.response_errors:
                    count(counts.injected_errors, (api_label(api_key), error))
            if not steps and throttle_ms:
                response = apply_to_response((), response, api_key, api_version, throttle_time_ms=throttle_ms).frame
            if floors is not None:
                response = _floored_response(response, api_key, api_version, floors, broker)
            return response

        return edit

    # -- accounting ---------------------------------------------------------------------
    def _report(self, draft: VerdictDraft, facts: FrameFacts, ex: Exchange, scoped: dict[int, Selector]) -> None:
        """Count and report what the actions of one request did (``draft``'s faults and throttles);
        ``scoped``: the faults (by index) that acted on the partitions a selector chose only."""
        counts = self.counts
        if draft.throttled is not None:
            for rule_id, seconds in draft.throttled:
                counts.throttle_seconds[rule_id] = counts.throttle_seconds.get(rule_id, 0.0) + seconds
        for i, (key, detail, connection) in enumerate(draft.faults):
            if connection:
                count(counts.connection_faults, (key[0], key[1]))
            self._fault(key, facts, detail, ex, scoped.get(i))

    def _fault(self, key: HitKey, facts: FrameFacts, detail: str, ex: Exchange, only: Selector | None = None
               ) -> None:
        """Count one fault (``key``: rule id, action name, dry run), note it on the exchange (its
        capture row's ``rule_decisions``), and log it and keep it in the ring when either is on; they
        name the request's topics, or those of them ``only`` selects (an action on those alone)."""
        counts = self.counts
        counts.hits[key] = counts.hits.get(key, 0) + 1
        decided(ex, key, detail)
        recent = self.live.recent
        logged = log.isEnabledFor(logging.INFO)
        if recent is None and not logged:
            return  # the topic scan below is for the line and the ring alone
        rule_id, action, dry = key
        dry_run = dry == "true"
        topics = facts.topics() if only is None else _selected(facts.topics(), only)
        partitions = sorted({p for parts in topics.values() for p in parts})
        if recent is not None:  # a bounded deque: the oldest record falls out
            recent.append(FaultRecord(time.time(), rule_id, action, self.peer, facts.correlation_id,
                                      api_label(facts.api_key), tuple(sorted(topics)), tuple(partitions),
                                      detail, dry_run))
        if not logged:
            return
        log.info("event=fault rule=%s action=%s connection=%s correlation_id=%d api=%s topic=%s partition=%s "
                 "detail=%s%s", rule_id, action, self.peer, facts.correlation_id, api_label(facts.api_key),
                 q(",".join(sorted(topics))), q(",".join(map(str, partitions))), q(detail),
                 " dry_run=true" if dry_run else "")


def _charging(clock: Callable[[], float], facts: FrameFacts, charges: list[ResponseCharge],
              edit: Callable[[bytes], bytes] | None) -> Callable[[bytes], bytes]:
    """The response edit of a request whose actions charge its response's size (``charges``: a
    draft's ``response_charges``, as a throttle does a Fetch under a byte rate): ``edit`` (if any),
    then the size charged to each, at the time the broker's answer is seen, the longest throttle
    time that earns reported in its throttle_time_ms (never lowering a larger one already there)."""
    api_key, api_version = facts.api_key, facts.api_version

    def charge(response: bytes) -> bytes:
        if edit is not None:
            response = edit(response)
        facts.now = clock()  # when the broker's answer is seen: the usage happens now
        # The answer leaves as it came (KIP-219): only the throttle time is reported; the next request waits for it.
        size = len(response)
        throttled = max(c(size) for c in charges)
        if throttled > 0:
            response = apply_to_response((), response, api_key, api_version,
                                         throttle_time_ms=round(throttled * 1000)).frame
        return response

    return charge


def _selected(topics: Mapping[str, frozenset[int]], only: Selector) -> Mapping[str, frozenset[int]]:
    """The topics and partitions of a request that ``only`` selects (a topic read without
    partitions is kept: the selector needs one to judge)."""
    out: dict[str, frozenset[int]] = {}
    for topic, partitions in topics.items():
        chosen = frozenset(p for p in partitions if only(topic, p)) if partitions else partitions
        if chosen or not partitions:
            out[topic] = chosen
    return out


class TopicIdLearningPolicy(RulePolicy):
    """A :class:`RulePolicy` that also learns topic ids from Metadata v10+ responses into the
    injector's :class:`~kproxy.protocol.topic_ids.TopicIdNames` (shared by every connection), so a
    ``topic`` key matches requests that name topics by id (Fetch v13+), and their faults name
    their topics. Given to connections only when rules that can meet such requests are or may be
    in force
    (:meth:`kproxy.policy.live_rules.LiveRules.policy`). Its cost per request: a method call
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


def _floored_response(response: bytes, api_key: int, api_version: int, floors: LeaderEpochFloors,
                      broker: dict[tuple[str, int], int] | None) -> bytes:
    """``response`` with its current-leader epochs kept at their floors (``broker``: the broker's own
    epochs of the partitions a rule may have raised in it); an answer kproxy cannot read goes on as
    it is."""
    try:
        return floor_leader_epochs(response, api_key, api_version, floors, raised=broker).frame
    except ProtocolError:
        return response


def _learning_topic_ids(verdict: Verdict | None, names: TopicIdNames, api_version: int) -> Verdict:
    """``verdict`` with the broker's Metadata answer read for topic ids first (before any rule edits it)."""
    edit = verdict.on_response if verdict is not None else None

    def learn(response: bytes) -> bytes:
        names.learn_metadata(response, api_version)
        return response if edit is None else edit(response)

    return Verdict(on_response=learn) if verdict is None else dataclasses.replace(verdict, on_response=learn)


__all__ = ["RulePolicy", "TopicIdLearningPolicy"]
