"""Property tests of the rule engine over random rule sets and random request facts.

* Determinism: two engines built from the same rule set agree on every decision.
* Seeds matter: with probabilistic rules, another seed gives other decisions.
* Semantics: the indexed engine agrees with a naive reference evaluator written
  here from the documented contract (rules in order, first match stops unless
  ``continue``, disabled rules skipped, probability drawn from the seeded hash).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.rules import RuleEngine, RuleHit, RuleSet, StaticFacts
from kproxy.rules.actions.blackhole import Blackhole
from kproxy.rules.actions.delay import Delay
from kproxy.rules.actions.drop_response import DropResponse
from kproxy.rules.actions.inject_error import InjectError
from kproxy.rules.engine import draw
from kproxy.rules.model import Match, Rule, Schedule, TopicPattern
from kproxy.rules.patterns import compile_pattern

APIS = (0, 1, 3, 8, 11, 12)
CLIENTS = ("batch-1", "batch-2", "web", None)
TOPICS = ("orders", "orders-eu", "logs")

actions = st.lists(st.sampled_from([DropResponse(), Blackhole(), InjectError(6), Delay(5.0, 2.0), Delay(1.0)]),
                   min_size=1, max_size=3).map(tuple)
matches = st.builds(
    Match,
    apis=st.none() | st.frozensets(st.sampled_from(APIS), min_size=1, max_size=3),
    client_id=st.none() | st.sampled_from([compile_pattern("batch-.*"), compile_pattern("web")]),
    topics=st.none() | st.sampled_from([(TopicPattern("orders*"),), (TopicPattern("logs"),),
                                        (TopicPattern("orders-[a-z]+", is_regex=True),)]),
    partitions=st.none() | st.frozensets(st.integers(0, 3), min_size=1, max_size=2),
    probability=st.none() | st.sampled_from([0.1, 0.5, 0.9, 1.0]),
    schedule=st.none() | st.builds(Schedule, after_requests=st.integers(0, 3), first=st.none() | st.integers(1, 4),
                                   every=st.none() | st.integers(1, 3)),
)


@st.composite
def rule_sets(draw_: st.DrawFn) -> RuleSet:
    n = draw_(st.integers(1, 8))
    rules = tuple(Rule(id=f"r{i}", match=draw_(matches), actions=draw_(actions), enabled=draw_(st.booleans()),
                       continue_=draw_(st.booleans()), dry_run=draw_(st.booleans()),
                       seed=draw_(st.none() | st.integers(0, 3)))
                  for i in range(n))
    return RuleSet(rules, seed=draw_(st.integers(0, 2**31 - 1)))


facts_strategy = st.builds(
    StaticFacts,
    api_key=st.sampled_from(APIS),
    client_id=st.sampled_from(CLIENTS),
    stream_ordinal=st.integers(0, 10_000),
    topic_partitions=st.dictionaries(st.sampled_from(TOPICS), st.frozensets(st.integers(0, 3), max_size=3),
                                     max_size=2),
)
streams = st.lists(facts_strategy, min_size=1, max_size=40)


def reference(rules: RuleSet, facts: StaticFacts, counts: dict[str, int]) -> list[str]:
    """The contract, written plainly: no index, no caches. ``counts``: the schedule counters, per rule."""
    out: list[str] = []
    for rule in rules.rules:
        if not rule.enabled:
            continue
        m = rule.match
        if m.apis is not None and facts.api_key not in m.apis:
            continue
        if m.client_id is not None and (facts.client_id is None or not m.client_id.fullmatch(facts.client_id)):
            continue
        wants_topics = m.topics is not None or m.partitions is not None
        if wants_topics and not any((m.topics is None or any(t.matches(topic) for t in m.topics))
                                    and (m.partitions is None or parts & m.partitions)
                                    for topic, parts in facts.topics().items()):
            continue
        if m.schedule is not None:
            n = counts.get(rule.id, 0)
            counts[rule.id] = n + 1
            n -= m.schedule.after_requests
            if n < 0 or (m.schedule.first is not None and n >= m.schedule.first):
                continue
            if m.schedule.every is not None and n % m.schedule.every:
                continue
        if m.probability is not None:
            seed = rule.seed if rule.seed is not None else rules.seed
            if draw(seed, rule.id, facts, 0) >= m.probability:
                continue
        out.append(rule.id)
        if not rule.continue_:
            break
    return out


@settings(max_examples=200, deadline=None)
@given(rule_sets(), streams)
def test_same_rules_same_requests_same_decisions(rules: RuleSet, requests: list[StaticFacts]) -> None:
    a, b = RuleEngine(rules), RuleEngine(rules)
    assert [a.evaluate(f) for f in requests] == [b.evaluate(f) for f in requests]


@settings(max_examples=200, deadline=None)
@given(rule_sets(), streams)
def test_engine_agrees_with_the_reference(rules: RuleSet, requests: list[StaticFacts]) -> None:
    engine = RuleEngine(rules)
    counts: dict[str, int] = {}
    for facts in requests:
        decision = engine.evaluate(facts)
        assert [h.rule_id for h in decision.hits] == reference(rules, facts, counts)
        by_id = {r.id: r for r in rules.rules}
        for hit in decision.hits:
            rule = by_id[hit.rule_id]
            assert hit.actions == rule.actions and hit.dry_run == rule.dry_run
            assert len(hit.delays_ms) == sum(isinstance(a, Delay) for a in rule.actions)
        assert decision.actions() == tuple(a for h in decision.hits if not h.dry_run for a in h.actions)
        # At most the last hit may stop the walk; every earlier one said continue.
        assert all(by_id[h.rule_id].continue_ for h in decision.hits[:-1])


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), st.sampled_from([0.1, 0.5, 0.9]))
def test_different_seeds_give_different_decisions(seed_a: int, seed_b: int, p: float) -> None:
    if seed_a == seed_b:
        seed_b += 1
    rule = Rule(id="p", match=Match(probability=p), actions=(DropResponse(),))
    requests = [StaticFacts(api_key=0, client_id="c", stream_ordinal=i) for i in range(256)]
    a = [RuleEngine(RuleSet((rule,), seed_a)).evaluate(f).matched for f in requests]
    b = [RuleEngine(RuleSet((rule,), seed_b)).evaluate(f).matched for f in requests]
    # Two independent 256-long Bernoulli(p) sequences coincide with probability at most 0.82**256 < 1e-21.
    assert a != b


@settings(max_examples=100, deadline=None)
@given(rule_sets(), streams)
def test_decisions_are_a_function_of_each_request_alone(rules: RuleSet, requests: list[StaticFacts]) -> None:
    """Without schedules, a request's decision does not depend on the requests before it (nor on caches)."""
    rules = replace(rules, rules=tuple(r for r in rules.rules if r.match.schedule is None))
    engine = RuleEngine(rules)
    forward = [engine.evaluate(f) for f in requests]
    backward = [RuleEngine(rules).evaluate(f) for f in reversed(requests)][::-1]
    assert forward == backward


def test_caches_stay_right_past_their_bound() -> None:
    odd = Match(client_id=compile_pattern(r"c\d*[13579]"), topics=(TopicPattern("t1*"),))
    rules = RuleSet((Rule(id="odd", match=odd,
                          actions=(DropResponse(),)),))
    engine = RuleEngine(rules)
    for i in range(10_000):  # more clients and topic lists than the caches keep
        facts = StaticFacts(api_key=0, client_id=f"c{i}", topic_partitions={f"t{i % 20}": frozenset({0})})
        assert engine.evaluate(facts).matched == (i % 2 == 1 and f"t{i % 20}".startswith("t1")), i


def test_rule_hit_is_a_plain_value() -> None:
    hit = RuleHit("r", (DropResponse(),), False, 0.25, (3.0,))
    assert hit == RuleHit("r", (DropResponse(),), False, 0.25, (3.0,))
    assert hash(hit) == hash(RuleHit("r", (DropResponse(),), False, 0.25, (3.0,)))


@settings(max_examples=300, deadline=None)
@given(rule_sets(), streams)
def test_a_fixed_decision_is_what_evaluate_says_of_every_request(rules: RuleSet, requests: list[StaticFacts]) -> None:
    """RuleEngine.fixed_decision(api) and client_decision(api, client's keys) let the proxy skip a
    request's facts: each must be exactly evaluate()'s decision for every request of that api key
    (from that client), and evaluating must not have counted anything (the reference's schedule
    counters stay where they were)."""
    engine = RuleEngine(rules)
    counts: dict[str, int] = {}
    for facts in requests:
        fixed = engine.fixed_decision(facts.api_key)
        for_client = engine.client_decision(facts.api_key, facts.client_id, facts.client_ip, facts.broker_id)
        before = dict(counts)
        expected = reference(rules, facts, counts)
        decision = engine.evaluate(facts)
        assert [h.rule_id for h in decision.hits] == expected
        if fixed is not None:
            assert decision == fixed and for_client == fixed
        if for_client is not None:
            assert decision == for_client
            assert counts == before, "a fixed decision passed a rule with a schedule"


def test_fixed_decisions_are_found_only_where_nothing_else_decides() -> None:
    """Non-vacuity of the property above: which first rules make an api key's decision fixed."""
    def first(match: Match, continue_: bool = False, jitter_ms: float = 0.0) -> RuleEngine:
        rule = Rule(id="first", match=match, actions=(Delay(5.0, jitter_ms),), continue_=continue_)
        later = Rule(id="later", match=Match(apis=frozenset({3})), actions=(DropResponse(),))
        return RuleEngine(RuleSet((rule, later)))

    engine = first(Match(apis=frozenset({0})))
    assert [[h.rule_id for h in d.hits] if d else None for d in map(engine.fixed_decision, (0, 3, 12))] == \
        [["first"], ["later"], None]  # api 12: no rule names it
    assert first(Match()).fixed_decision(12) is not None  # an api-agnostic first rule decides every api key
    scoped = first(Match(client_id=compile_pattern("c.*")))
    assert scoped.fixed_decision(0) is None and scoped.client_decision(0, "d", None, None) is None
    decision = scoped.client_decision(0, "c1", None, None)
    assert decision is not None and [h.rule_id for h in decision.hits] == ["first"]
    for engine in [first(Match(client_id=compile_pattern("c"))), first(Match(topics=(TopicPattern("t"),))),
                   first(Match(probability=0.5)), first(Match(schedule=Schedule(every=2))),
                   first(Match(min_version=3)), first(Match(), continue_=True), first(Match(), jitter_ms=2.0)]:
        assert engine.fixed_decision(0) is None
