"""The rule engine: a request's facts in, a :class:`Decision` out. No I/O, no clock.

Evaluation (:meth:`RuleEngine.evaluate`): the enabled rules are tried in file
order; the first that matches decides, unless it says ``continue: true``, in
which case later rules are tried too and every match is in the decision.

Cost: rules are indexed by api key when loaded, so a request whose api key no
rule names (and no rule is api-agnostic) costs one dict lookup. A request's
topics, partitions, acks, group id and transactional id are asked of the facts
only when a candidate rule matches on them, and after its cheap keys passed.

Order of the keys of one rule: api; client id, principal, client address and broker id
(the keys fixed for a client, cached: see :class:`RuleEngine`); topic patterns
(cached per topic list); version, acks, partitions, group id, transactional id, then request
size (the frame's length) and records (decoded within a budget); then the schedule's
time conditions (``after_seconds``, ``for_seconds``, ``window``); then its counters; then
``probability``. ``toxicity`` comes first of the request's keys: it is drawn once per connection
and rule, at the first request of the connection the rule is tried on (the facts'
``connection_draws`` keep it; facts with none, a capture's, draw it per request), so that a rule
acts on that share of connections, on every request it matches there. The counters
(``after_requests``, ``first``, ``every``) count, per rule, the requests that passed everything
before them, in the order this engine sees them; with ``per: connection``, per rule and
connection (the facts' ``connection_counts``, keyed by the rule's :class:`RuleState`, so an
edited rule counts afresh there too). A rule waiting on another (``schedule.after``) matches
nothing until that one has fired enough or ended.

Reproducibility contract. A probabilistic choice (``probability``, ``toxicity``, a delay's
jitter) is a pure function of::

    (seed, rule id, client id, broker id, api key, stream ordinal, draw index)

hashed with BLAKE2b to a uniform number in [0, 1). ``seed`` is the rule's own
``seed`` when it has one, else the file's. ``stream ordinal`` is the request's
ordinal among the requests of the same client id, broker and api key, over every
connection (see :class:`~kproxy.rules.request_facts.RequestFacts`), so the draws
of one client do not depend on how its requests interleave with other clients'
(a shared RNG would make them depend on scheduling), and a client that
reconnects draws afresh (an ordinal per connection drew the same for every new
connection's first request: a reset drawn there reset every reconnect). Same
seed and same per-client request sequences give the same draws; another seed
gives other draws.
Counters are shared by all connections, so schedules that count are
reproducible when the global order of matching requests is (one client, or
rules scoped by ``client_id``).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from kproxy.rules.actions.base import RuleAction
from kproxy.rules.bucket import Buckets
from kproxy.rules.model import Match, Rule, RuleSet
from kproxy.rules.patterns import UserPattern
from kproxy.rules.request_facts import IpAddress, RequestFacts


@dataclass(frozen=True, slots=True)
class RuleHit:
    """One matched rule. ``draw`` is the probability draw (None when the rule has no
    probability); ``delays_ms`` the delay of each action that takes one
    (:attr:`~kproxy.rules.actions.base.RuleAction.takes_delay`), in order."""

    rule_id: str
    actions: tuple[RuleAction, ...]
    dry_run: bool
    draw: float | None = None
    delays_ms: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    """What the rules say about one request: the hits in rule order (empty: forward as is)."""

    hits: tuple[RuleHit, ...] = ()

    @property
    def matched(self) -> bool:
        return bool(self.hits)

    def actions(self) -> tuple[RuleAction, ...]:
        """The actions to execute: those of hits that are not dry runs, in order."""
        return tuple(a for hit in self.hits if not hit.dry_run for a in hit.actions)


NO_DECISION = Decision()
_DRAW_SCALE = 1.0 / 2**64
_U64 = struct.Struct(">Q")


def draw(seed: int, rule_id: str, facts: RequestFacts, index: int) -> float:
    """The reproducible uniform draw in [0, 1) of the contract above."""
    key = (f"{seed}\x1f{rule_id}\x1f{facts.client_id}\x1f{facts.broker_id}\x1f{facts.api_key}"
           f"\x1f{facts.stream_ordinal}\x1f{index}").encode()
    return float(_U64.unpack(hashlib.blake2b(key, digest_size=8).digest())[0]) * _DRAW_SCALE


@dataclass(frozen=True, slots=True)
class _Peer:
    """A client's fixed keys, for :meth:`RuleEngine.admits` (what :meth:`_Compiled.peer_matches` reads)."""

    client_id: str | None
    client_ip: IpAddress | None
    broker_id: int | None
    principal: str | None = None
    cluster: str | None = None


class RuleState:
    """A rule's schedule state in an engine: ``count``, the requests its counters have counted (per
    rule), and ``started``, the monotonic reading its time conditions (``after_seconds``,
    ``for_seconds``) count from (for a rule that waits on another, from its release). An engine
    built with a ``previous`` one shares the state objects of the rules both hold unchanged, so
    those rules carry on where they were."""

    __slots__ = ("count", "fired", "released", "started")

    def __init__(self, started: float) -> None:
        self.count = 0
        self.started = started
        self.fired = 0  # its hits, counted only when another rule waits on them (schedule.after)
        self.released = False  # a rule that waits on another: it no longer waits


class _Compiled:
    """A rule with what evaluation needs at hand, and its schedule state."""

    __slots__ = ("by_content", "decision", "delays", "fixed", "match", "peer_keys", "ramp_after_s", "request_keys",
                 "rule", "seed", "state", "waits_on", "watched")

    def __init__(self, rule: Rule, seed: int, state: RuleState) -> None:
        self.rule = rule
        self.match = m = rule.match
        self.seed = rule.seed if rule.seed is not None else seed
        self.delays = tuple(a for a in rule.actions if a.takes_delay)
        self.state = state
        # The keys on the request's size and records: one test for the rules without them.
        self.by_content = m.min_request_bytes is not None or m.max_request_bytes is not None or m.record is not None
        self.waits_on: _Compiled | None = None  # the rule its schedule.after names (None: none, or disabled)
        self.watched = False  # a rule waits on its hits
        # Keys fixed for a client connection, checked once per (api, client id, address, broker,
        # principal).
        self.peer_keys = any(v is not None for v in (m.client_id, m.principal, m.client_address, m.broker_ids,
                                                     m.clusters))
        # Keys that differ per request.
        self.request_keys = any(v is not None for v in (
            m.acks, m.topics, m.partitions, m.group_id, m.transactional_id, m.schedule, m.min_version,
            m.max_version, m.min_request_bytes, m.max_request_bytes, m.record))
        # Without a draw, a hit is always the same value: built once.
        fixed = m.probability is None and m.toxicity is None and not any(d.delay_varies for d in self.delays)
        # Where a ramping delay's ramp starts: the start of the rule's time conditions.
        self.ramp_after_s = m.schedule.after_s if m.schedule is not None else 0.0
        self.fixed = RuleHit(rule.id, rule.actions, rule.dry_run, None,
                             tuple(d.hit_delay_ms(0.0, 0.0) for d in self.delays)) if fixed else None
        self.decision = Decision((self.fixed,)) if self.fixed is not None else None

    def peer_matches(self, facts: _Peer | RequestFacts) -> bool:
        m = self.match
        if m.client_id is not None:
            cid = facts.client_id
            if cid is None or not m.client_id.fullmatch(cid):
                return False
        if m.principal is not None and not m.principal.matches(facts.principal):
            return False
        if m.client_address is not None:
            ip = facts.client_ip
            if ip is None or not any(ip in net for net in m.client_address):
                return False
        if m.clusters is not None and facts.cluster not in m.clusters:
            return False
        return m.broker_ids is None or facts.broker_id in m.broker_ids


_PEER_CACHE_MAX = 4096
_MEMO_TEXT_MAX = 255  # Kafka topic names are at most 249 characters


class RuleEngine:
    """Evaluates a :class:`RuleSet`. Not thread-safe (schedule counters); one per event loop.

    ``loaded_at`` is the monotonic reading (same clock as ``RequestFacts.now``)
    that ``after_seconds`` and ``for_seconds`` count from.

    ``previous``: the engine this one replaces, when the rules it shares with it unchanged (the same
    rule, the same seed) are to carry on (an admin edit of one rule): they keep their
    :class:`RuleState` (counters, the start of their time conditions, which :meth:`start` leaves
    alone) and, through :meth:`adopt`, their token buckets (:attr:`buckets`, which the actions
    that hold by a quota charge: kproxy/rules/actions/throttle.py). Built in a worker thread: reading
    ``previous`` takes only references. Without it, every rule starts afresh.

    The keys that are fixed for a client (client id, address, broker id, and the principal when a
    rule names one) are checked once per (api key, client id, address, broker id[, principal]) and the rules
    that pass are remembered; topic patterns likewise once per such key and
    list of request topics (each cache holds at most 4096 entries and starts
    afresh when full). So a hundred rules for other clients or other topics
    cost a request a few dict lookups, not a hundred regex matches.
    """

    def __init__(self, rules: RuleSet, loaded_at: float = 0.0, previous: RuleEngine | None = None) -> None:
        self.rules = rules
        self.loaded_at = loaded_at
        self.buckets = Buckets()
        before: dict[str, _Compiled] = previous._compiled if previous is not None else {}
        compiled: list[_Compiled] = []
        fresh: list[RuleState] = []
        carried: list[str] = []
        for r in rules.rules:
            if not r.enabled:
                continue
            seed = r.seed if r.seed is not None else rules.seed
            old = before.get(r.id)
            if old is not None and old.seed == seed and old.rule == r:
                state = old.state
                carried.append(r.id)
            else:
                state = RuleState(loaded_at)
                fresh.append(state)
            compiled.append(_Compiled(r, rules.seed, state))
        self._compiled: dict[str, _Compiled] = {c.rule.id: c for c in compiled}
        for c in compiled:
            s = c.match.schedule
            if s is not None and s.after is not None:
                target = c.waits_on = self._compiled.get(s.after.rule)
                if target is not None:
                    # Its hits are counted at evaluate(): never skipped by a fixed decision.
                    target.watched = True
                    target.fixed = target.decision = None
        self._fresh = fresh
        # The ids of the rules carried on from ``previous`` (their state shared with it).
        self.carried = frozenset(carried)
        wildcard = tuple(c for c in compiled if c.match.apis is None)
        keys = {k for c in compiled if c.match.apis is not None for k in c.match.apis}
        self._any = wildcard
        self._by_api: dict[int, tuple[_Compiled, ...]] = {
            k: tuple(c for c in compiled if c.match.apis is None or k in c.match.apis) for k in keys}
        # Api keys with a rule that no client's fixed keys can exclude (every key, when an api-agnostic
        # rule is one): admits() is True without a lookup.
        self._all_unscoped = any(not c.peer_keys for c in wildcard)
        self._unscoped = frozenset(k for k, cs in self._by_api.items() if any(not c.peer_keys for c in cs))
        # Api keys whose decision is the same for every request (see fixed_decision).
        self._fixed = {k: _fixed_decision(cs) for k, cs in self._by_api.items()}
        self._any_fixed = _fixed_decision(wildcard)
        # Whether a rule reads the wall clock (a daily window): else RequestFacts.wall_time is never read.
        self.reads_wall_time = any(c.match.schedule is not None and c.match.schedule.window is not None
                                   for c in compiled)
        # Whether a rule names a principal: else the principal is no part of a client's cache key
        # and RequestFacts.principal is never read.
        self.reads_principal = any(c.match.principal is not None for c in compiled)
        # A rule names a cluster: a connection's cluster is one of its fixed keys (last in the peer key).
        self.reads_cluster = any(c.match.clusters is not None for c in compiled)
        self._by_peer: dict[tuple[object, ...], tuple[tuple[_Compiled, ...], bool]] = {}
        self._by_topics: dict[tuple[object, ...], tuple[_Compiled, ...]] = {}
        self._by_text: dict[tuple[int, str], bool] = {}

    def start(self, now: float) -> None:
        """Put the engine in force at ``now``: its time conditions count from then, but those of the
        rules carried on from ``previous``, which keep their start."""
        self.loaded_at = now
        for state in self._fresh:
            state.started = now

    def adopt(self, previous: RuleEngine) -> None:
        """Take over ``previous``'s token buckets of the rules carried on from it (at the swap, on
        the thread that charges buckets: requests decided by ``previous`` meanwhile are counted)."""
        if self.carried:
            self.buckets.adopt(previous.buckets, self.carried)

    def state(self, rule_id: str) -> RuleState | None:
        """The schedule state of an enabled rule (None: no such rule, or disabled)."""
        c = self._compiled.get(rule_id)
        return c.state if c is not None else None

    def mentions(self, api_key: int) -> bool:
        """Whether any enabled rule could match a request of this api key."""
        return bool(self._by_api.get(api_key, self._any))

    def admits(self, api_key: int, client_id: str | None, client_ip: IpAddress | None, broker_id: int | None,
               principal: str | None = None, cluster: str | None = None) -> bool:
        """Whether a rule of this api key passes a client's fixed keys (client id, address, broker
        id, principal): False means :meth:`evaluate` would decide nothing for any request of theirs with this
        api key, and touch no counter. One dict lookup once the client was met (the same cache as
        :meth:`evaluate`'s), so a caller can skip building a request's facts."""
        if self._all_unscoped or api_key in self._unscoped:
            return True
        return bool(self._peer_rules(api_key, client_id, client_ip, broker_id, principal, cluster)[0])

    def _peer_rules(self, api_key: int, client_id: str | None, client_ip: IpAddress | None, broker_id: int | None,
                    principal: str | None, cluster: str | None = None) -> tuple[tuple[_Compiled, ...], bool]:
        """The cache entry of :meth:`_peer_entry` for a client's fixed keys."""
        peer: tuple[object, ...] = ((api_key, client_id, client_ip, broker_id) if not self.reads_principal
                                    else (api_key, client_id, client_ip, broker_id, principal))
        if self.reads_cluster:
            peer += (cluster,)
        cached = self._by_peer.get(peer)
        if cached is None:
            candidates = self._by_api.get(api_key, self._any)
            cached = self._peer_entry(peer, candidates, _Peer(client_id, client_ip, broker_id, principal, cluster))
        return cached

    def admits_all(self, api_key: int) -> bool:
        """Whether :meth:`admits` is True for every client: a rule of this api key (or an
        api-agnostic one) has no client id, principal, address or broker key."""
        return self._all_unscoped or api_key in self._unscoped

    def fixed_decision(self, api_key: int) -> Decision | None:
        """The decision :meth:`evaluate` returns for *every* request of this api key, when it depends
        on nothing else; None when it may depend on the client or the request.

        That is when the first rule tried for the api key names no key but ``api`` (no client,
        topic, version or schedule key), draws nothing (no ``probability``, no jitter) and does not
        ``continue``: every request passes it and it decides alone, counting nothing. So a caller
        holding this decision may skip building the request's facts."""
        return self._fixed.get(api_key, self._any_fixed)

    def client_decision(self, api_key: int, client_id: str | None, client_ip: IpAddress | None,
                        broker_id: int | None, principal: str | None = None,
                        cluster: str | None = None) -> Decision | None:
        """:meth:`fixed_decision` for one client: the decision :meth:`evaluate` returns for every
        request of this api key from a client with these fixed keys (client id, address, broker id,
        principal), when it depends on nothing else; None when it may depend on the request.

        That is when the first rule of the api key that passes the client's fixed keys names no
        request key (topic, version, schedule...), draws nothing and does not ``continue``."""
        live = self._peer_rules(api_key, client_id, client_ip, broker_id, principal, cluster)[0]
        if not live or live[0].request_keys or live[0].rule.continue_:
            return None
        return live[0].decision

    def _peer_entry(self, peer: tuple[object, ...], candidates: tuple[_Compiled, ...], facts: _Peer | RequestFacts
                    ) -> tuple[tuple[_Compiled, ...], bool]:
        """The rules of ``candidates`` (``peer``'s api key's) that pass its fixed keys, and whether one has
        topic patterns; remembered for ``peer``."""
        live = tuple(c for c in candidates if not c.peer_keys or c.peer_matches(facts))
        cached = live, any(c.match.topics is not None for c in live)
        if len(self._by_peer) >= _PEER_CACHE_MAX:
            self._by_peer.clear()
        self._by_peer[peer] = cached
        return cached

    def evaluate(self, facts: RequestFacts) -> Decision:
        api_key = facts.api_key
        candidates = self._by_api.get(api_key, self._any)
        if not candidates:
            return NO_DECISION
        peer: tuple[object, ...] = (
            (api_key, facts.client_id, facts.client_ip, facts.broker_id) if not self.reads_principal
            else (api_key, facts.client_id, facts.client_ip, facts.broker_id, facts.principal))
        if self.reads_cluster:
            peer += (facts.cluster,)
        cached = self._by_peer.get(peer)
        if cached is None:
            cached = self._peer_entry(peer, candidates, facts)
        live, by_topic = cached
        if not live:
            return NO_DECISION
        if by_topic:
            live = self._topic_filter(peer, live, facts)
        hits: list[RuleHit] = []
        for c in live:
            hit = self._try(c, facts)
            if hit is not None:
                if c.watched:
                    c.state.fired += 1
                if not c.rule.continue_:
                    if not hits and hit is c.fixed:
                        assert c.decision is not None
                        return c.decision
                    hits.append(hit)
                    break
                hits.append(hit)
        return Decision(tuple(hits)) if hits else NO_DECISION

    def _topic_filter(self, peer: tuple[object, ...], live: tuple[_Compiled, ...], facts: RequestFacts
                      ) -> tuple[_Compiled, ...]:
        """The rules of ``live`` whose topic patterns match a topic of the request (cached per topic list)."""
        topics = tuple(facts.topics())
        key = (peer, topics)
        found = self._by_topics.get(key)
        if found is None:
            found = tuple(c for c in live if c.match.topics is None
                          or any(self._fullmatch(t.compiled, name) for t in c.match.topics for name in topics))
            if len(self._by_topics) >= _PEER_CACHE_MAX:
                self._by_topics.clear()
            self._by_topics[key] = found
        return found

    def _try(self, c: _Compiled, facts: RequestFacts) -> RuleHit | None:
        toxicity = c.match.toxicity
        if toxicity is not None and not _drawn_in(c, facts, toxicity):
            return None
        if c.request_keys and not self._matches(c, c.match, facts):
            return None
        if c.fixed is not None:
            return c.fixed
        p = c.match.probability
        d: float | None = None
        index = 0
        if p is not None:
            d = draw(c.seed, c.rule.id, facts, 0)
            index = 1
            if d >= p:
                return None
        delays = tuple(self._delay_ms(c, delay, facts, index + i) for i, delay in enumerate(c.delays))
        return RuleHit(c.rule.id, c.rule.actions, c.rule.dry_run, d, delays)

    def _released(self, c: _Compiled, now: float) -> bool:
        """Whether the rule ``c`` waits on (its ``schedule.after``) has fired enough or ended."""
        target = c.waits_on
        s = c.match.schedule
        if target is None or s is None or s.after is None:
            return False  # the rule it waits on is disabled: it never fires
        if s.after.fired is not None:
            return target.state.fired >= s.after.fired
        return has_ended(target, now)

    def released(self, rule_id: str) -> bool | None:
        """Whether a rule that waits on another no longer waits (None: it waits on none)."""
        c = self._compiled.get(rule_id)
        if c is None or c.match.schedule is None or c.match.schedule.after is None:
            return None
        return c.state.released

    def _delay_ms(self, c: _Compiled, action: RuleAction, facts: RequestFacts, index: int) -> float:
        """An action's delay for this request (:meth:`~kproxy.rules.actions.base.RuleAction.hit_delay_ms`),
        its draw hashed only when it reads one."""
        d = draw(c.seed, c.rule.id, facts, index) if action.delay_draws else 0.0
        return action.hit_delay_ms(facts.now - c.state.started - c.ramp_after_s, d)

    def _matches(self, c: _Compiled, m: Match, facts: RequestFacts) -> bool:
        if m.min_version is not None and facts.api_version < m.min_version:
            return False
        if m.max_version is not None and facts.api_version > m.max_version:
            return False
        if m.acks is not None and facts.acks() not in m.acks:
            return False
        if m.needs_topics and not self._topics_match(m, facts.topics()):
            return False
        if m.group_id is not None:
            group = facts.group_id()
            if group is None or not self._fullmatch(m.group_id, group):
                return False
        if m.transactional_id is not None:
            txn = facts.transactional_id()
            if txn is None or not self._fullmatch(m.transactional_id, txn):
                return False
        if c.by_content and not _content_matches(m, facts):
            return False
        s = m.schedule
        if s is not None:
            state = c.state
            if s.after is not None and not state.released:
                if not self._released(c, facts.now):
                    return False
                state.released, state.started = True, facts.now  # its time conditions count from now
            elapsed = facts.now - state.started
            if elapsed < s.after_s:
                return False
            if s.for_s is not None and (elapsed >= s.after_s + s.for_s if s.period_s is None
                                        else (elapsed - s.after_s) % s.period_s >= s.for_s):
                return False
            if s.window is not None and not s.window.contains(facts.wall_time):
                return False
            if s.counts:
                mine = facts.connection_counts if s.per_connection else None
                if mine is not None:
                    n = mine.get(state, 0)
                    if not n and len(mine) >= _DRAWN_MAX:
                        mine.clear()
                    mine[state] = n + 1
                else:
                    n = state.count
                    state.count = n + 1
                n -= s.after_requests
                if n < 0 or (s.first is not None and n >= s.first):
                    return False
                if s.every is not None and n % s.every:
                    return False
        return True

    def _fullmatch(self, pattern: UserPattern, text: str) -> bool:
        """``pattern.fullmatch(text)``, remembered for short texts. A group id, transactional id or
        topic meets the same patterns request after request, and one RE2 call through its binding
        costs what a dozen dict lookups do; the binding also lets the interpreter lock go for each
        match, and beside a busy Python thread (an off-loop rule build, the capture's writer) the
        loop thread then waits a switch interval to get it back. At most 4096 entries of at most 255
        characters (it starts afresh when full): bounded whatever texts clients send."""
        if len(text) > _MEMO_TEXT_MAX:
            return pattern.fullmatch(text)
        key = (id(pattern), text)  # the rule set, which holds the pattern, outlives this engine's use
        found = self._by_text.get(key)
        if found is None:
            found = pattern.fullmatch(text)
            if len(self._by_text) >= _PEER_CACHE_MAX:
                self._by_text.clear()
            self._by_text[key] = found
        return found

    def _topics_match(self, m: Match, topics: Mapping[str, frozenset[int]]) -> bool:
        for topic, partitions in topics.items():
            if m.topics is not None and not any(self._fullmatch(t.compiled, topic) for t in m.topics):
                continue
            if m.partitions is None or not m.partitions.isdisjoint(partitions):
                return True
        return False


TOXICITY_DRAW = -1  # the draw index of toxicity: apart from probability's (0) and the delays' (1 on)
_DRAWN_MAX = 4096  # rules a connection remembers its toxicity draw for (rule sets edited again and again)


def _drawn_in(c: _Compiled, facts: RequestFacts, toxicity: float) -> bool:
    """Whether the connection of ``facts`` is among the ``toxicity`` share rule ``c`` acts on: drawn
    at its first request tried on the rule, then remembered in its ``connection_draws``."""
    drawn = facts.connection_draws
    if drawn is None:
        return draw(c.seed, c.rule.id, facts, TOXICITY_DRAW) < toxicity
    key = (c.rule.id, toxicity, c.seed)  # the same rule edited to another share draws afresh
    hit = drawn.get(key)
    if hit is None:
        if len(drawn) >= _DRAWN_MAX:
            drawn.clear()
        hit = drawn[key] = draw(c.seed, c.rule.id, facts, TOXICITY_DRAW) < toxicity
    return hit


def _content_matches(m: Match, facts: RequestFacts) -> bool:
    """``request_bytes`` (the frame's size), then ``record`` (its records, decoded within a budget)."""
    size = facts.request_bytes
    if m.min_request_bytes is not None and size < m.min_request_bytes:
        return False
    if m.max_request_bytes is not None and size > m.max_request_bytes:
        return False
    if m.record is not None:
        records = facts.records()
        if records is None or not any(m.record.matches(r) for r in records):
            return False
    return True


def has_ended(c: _Compiled, now: float) -> bool:
    """Whether rule ``c`` has ended for good (kproxy.rules.model.ends): its ``first`` ran out (per
    rule), or its ``for_seconds`` window closed (once it no longer waits on another rule, if it did)."""
    s = c.match.schedule
    if s is None:
        return False
    state = c.state
    if s.first is not None and not s.per_connection and state.count >= s.after_requests + s.first:
        return True
    if s.for_s is None or s.period_s is not None or (s.after is not None and not state.released):
        return False
    return now - state.started >= s.after_s + s.for_s


def _fixed_decision(candidates: tuple[_Compiled, ...]) -> Decision | None:
    """The decision of :meth:`RuleEngine.evaluate` for these candidates (an api key's, in order) if
    it is the same for every request: their first passes any client's fixed keys (it has none),
    survives the topic filter (no topic key), matches any request (no request key) with a fixed
    hit, and stops there (no ``continue``)."""
    if not candidates:
        return None
    first = candidates[0]
    if first.peer_keys or first.request_keys or first.rule.continue_:
        return None
    return first.decision


