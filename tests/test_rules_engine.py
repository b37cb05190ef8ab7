"""The rule engine: order, laziness, schedules, seeded draws, throttling, facts from real frames."""

from __future__ import annotations

import ipaddress
import textwrap
import uuid
from collections.abc import Mapping
from dataclasses import replace

import pytest

from kproxy.protocol.frame_builder import request_frame
from kproxy.protocol.headers import decode_request_header
from kproxy.rules import NO_DECISION, RuleEngine, StaticFacts, load_text
from kproxy.rules.actions.delay import Delay
from kproxy.rules.bucket import TokenBucket
from kproxy.rules.engine import draw
from kproxy.rules.frame_facts import FrameFacts

PRODUCE, FETCH, METADATA, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT = 0, 1, 3, 10, 11, 12


def engine(text: str, loaded_at: float = 0.0) -> RuleEngine:
    return RuleEngine(load_text(textwrap.dedent(text)), loaded_at)


class Untouchable(StaticFacts):
    """Facts whose body-level accessors fail the test if the engine asks for them."""

    def topics(self) -> Mapping[str, frozenset[int]]:
        raise AssertionError("topics read")

    def acks(self) -> int | None:
        raise AssertionError("acks read")

    def group_id(self) -> str | None:
        raise AssertionError("group id read")

    def transactional_id(self) -> str | None:
        raise AssertionError("transactional id read")


def ids(e: RuleEngine, facts: StaticFacts) -> list[str]:
    return [h.rule_id for h in e.evaluate(facts).hits]


RULES = """\
    rules:
      - id: orders
        match: {api: produce, topic: "orders-*"}
        actions: [{inject_error: {error: NOT_LEADER_OR_FOLLOWER}}]
      - id: tag-all-produce
        continue: true
        match: {api: produce}
        actions: [{delay: {ms: 1}}]
      - id: off
        enabled: false
        match: {api: produce}
        actions: [drop_response]
      - id: watch
        dry_run: true
        continue: true
        match: {api: produce, acks: 0}
        actions: [close_connection]
      - id: last
        match: {api: [produce, fetch]}
        actions: [{delay: {ms: 2}}]
      - id: never-reached
        match: {api: produce}
        actions: [blackhole]
    """


def test_first_match_wins_and_continue_goes_on() -> None:
    e = engine(RULES)
    orders = StaticFacts(api_key=PRODUCE, topic_partitions={"orders-eu": frozenset({0})}, acks_value=-1)
    assert ids(e, orders) == ["orders"]
    other = replace(orders, topic_partitions={"logs": frozenset({0})})
    assert ids(e, other) == ["tag-all-produce", "last"]  # "off" is disabled; "never-reached" after a stop
    fire_and_forget = replace(other, acks_value=0)
    decision = e.evaluate(fire_and_forget)
    assert [h.rule_id for h in decision.hits] == ["tag-all-produce", "watch", "last"]
    assert [h.dry_run for h in decision.hits] == [False, True, False]
    assert decision.actions() == (Delay(1), Delay(2))  # a dry run matches but executes nothing
    assert ids(e, StaticFacts(api_key=FETCH)) == ["last"]


def test_a_request_no_rule_mentions_is_one_lookup_and_reads_nothing() -> None:
    e = engine(RULES)
    assert not e.mentions(METADATA)
    assert e.evaluate(Untouchable(api_key=METADATA)) is NO_DECISION
    assert e.evaluate(Untouchable(api_key=12345)) is NO_DECISION  # an api key no table knows


def test_body_facts_are_read_only_when_a_rule_needs_them_and_after_cheap_keys() -> None:
    e = engine("""\
        rules:
          - id: a
            match: {api: produce, client_id: "batch-.*", topic: "t"}
            actions: [drop_response]
          - id: b
            match: {api: fetch}
            actions: [drop_response]
        """)
    assert e.evaluate(Untouchable(api_key=PRODUCE, client_id="web-1")) is NO_DECISION
    assert ids(e, Untouchable(api_key=FETCH, client_id="batch-1")) == ["b"]
    with pytest.raises(AssertionError, match="topics read"):
        e.evaluate(Untouchable(api_key=PRODUCE, client_id="batch-1"))


def test_cheap_keys() -> None:
    e = engine("""\
        rules:
          - id: a
            match: {api: metadata, api_version: {min: 4, max: 9}, client_address: "10.1.0.0/16", broker_id: [1, 2]}
            actions: [drop_response]
        """)
    good = StaticFacts(api_key=METADATA, api_version=4, client_ip=ipaddress.ip_address("10.1.2.3"), broker_id=2)
    assert ids(e, good) == ["a"]
    assert ids(e, replace(good, api_version=10)) == []
    assert ids(e, replace(good, api_version=3)) == []
    assert ids(e, replace(good, client_ip=ipaddress.ip_address("10.2.0.1"))) == []
    assert ids(e, replace(good, client_ip=None)) == []
    assert ids(e, replace(good, broker_id=0)) == []


def test_topics_partitions_groups_and_transactions() -> None:
    e = engine("""\
        rules:
          - id: p
            match: {api: produce, topic: {regex: "pay(ment)?s"}, partition: [1, 3], transactional_id: "tx-.*"}
            actions: [drop_response]
          - id: g
            match: {api: [join_group, heartbeat], group_id: "payments-.*"}
            actions: [drop_response]
        """)
    produce = StaticFacts(api_key=PRODUCE, topic_partitions={"other": frozenset({1}), "payments": frozenset({3})},
                          transactional="tx-9")
    assert ids(e, produce) == ["p"]
    assert ids(e, replace(produce, topic_partitions={"payments": frozenset({0})})) == []
    assert ids(e, replace(produce, topic_partitions={"other": frozenset({1})})) == []
    assert ids(e, replace(produce, transactional=None)) == []
    assert ids(e, StaticFacts(api_key=HEARTBEAT, group="payments-a")) == ["g"]
    assert ids(e, StaticFacts(api_key=JOIN_GROUP, group="orders")) == []


def test_schedule_counts_the_requests_that_pass_the_other_keys() -> None:
    e = engine("""\
        rules:
          - id: s
            match: {api: fetch, client_id: c, schedule: {after_requests: 2, first: 5, every: 2}}
            actions: [drop_response]
        """)
    hits = []
    for i in range(12):
        e.evaluate(StaticFacts(api_key=FETCH, client_id="other"))  # not counted: fails client_id
        hits.append(bool(e.evaluate(StaticFacts(api_key=FETCH, client_id="c", stream_ordinal=i)).hits))
    # skip 2; of the next 5 (ordinals 2-6) every 2nd starting with the first: 2, 4, 6
    assert [i for i, hit in enumerate(hits) if hit] == [2, 4, 6]


def test_admits_agrees_with_evaluate_and_counts_nothing() -> None:
    """``admits`` is what a caller checks before building a request's facts: False only when
    ``evaluate`` would decide nothing for that client, and neither call counts a schedule for
    a client its keys exclude."""
    e = engine("""\
        rules:
          - id: batch-first
            match: {api: fetch, client_id: "batch-.*", schedule: {first: 1}}
            actions: [drop_response]
          - id: lan
            match: {api: metadata, client_address: "10.1.0.0/16"}
            actions: [drop_response]
          - id: any-produce
            match: {api: produce}
            actions: [drop_response]
        """)
    lan, wan = ipaddress.ip_address("10.1.2.3"), ipaddress.ip_address("192.0.2.1")
    cases = [(FETCH, "web-1", None), (FETCH, "batch-1", None), (FETCH, None, None), (METADATA, "web-1", lan),
             (METADATA, "web-1", wan), (PRODUCE, None, None), (HEARTBEAT, "batch-1", lan)]
    for _ in range(3):  # met, then remembered: the same answer
        for api, client, ip in cases[:1] + cases[2:]:
            admitted = e.admits(api, client, ip, None)
            decided = e.evaluate(Untouchable(api_key=api, client_id=client, client_ip=ip)).matched
            assert admitted == decided, (api, client, ip)
    assert [e.admits(api, client, ip, None) for api, client, ip in cases] == [
        False, True, False, True, False, True, False]
    # The web client's fetches counted nothing: the batch client's first fetch is still the first.
    assert ids(e, StaticFacts(api_key=FETCH, client_id="batch-1")) == ["batch-first"]
    assert ids(e, StaticFacts(api_key=FETCH, client_id="batch-1")) == []
    everyone = engine("""\
        rules:
          - id: all
            match: {}
            actions: [{delay: {ms: 0}}]
        """)
    assert everyone.admits(HEARTBEAT, "web-1", wan, None) and everyone.admits(12345, None, None, 3)


def test_schedule_time_conditions() -> None:
    e = engine("""\
        rules:
          - id: t
            match: {schedule: {after_seconds: 10, for_seconds: 5}}
            actions: [drop_response]
          - id: night
            match: {schedule: {window: {start: "22:00", end: "02:00"}}}
            actions: [drop_response]
        """, loaded_at=1000.0)
    at = lambda now, wall=12 * 3600.0: ids(e, StaticFacts(api_key=FETCH, now=now, wall_time=wall))  # noqa: E731
    assert at(1009.9) == [] and at(1010) == ["t"] and at(1014.9) == ["t"] and at(1015) == []
    late = 2000.0
    assert at(late, 23 * 3600) == ["night"] and at(late, 86400 * 3 + 3600) == ["night"]
    assert at(late, 2 * 3600) == [] and at(late, 21 * 3600) == []


def test_probability_rate_and_reproducible_draws() -> None:
    text = """\
        seed: 42
        rules:
          - id: p
            match: {api: produce, probability: 0.3}
            actions: [{delay: {ms: 100, jitter_ms: 20}}]
        """
    a, b = engine(text), engine(text)
    facts = [StaticFacts(api_key=PRODUCE, client_id="c", stream_ordinal=i) for i in range(4000)]
    first = [a.evaluate(f) for f in facts]
    assert first == [b.evaluate(f) for f in facts]
    rate = sum(d.matched for d in first) / len(facts)
    assert 0.27 < rate < 0.33
    delays = [d.hits[0].delays_ms[0] for d in first if d.matched]
    assert all(80 <= x <= 120 for x in delays) and len(set(delays)) > 100
    other = engine(text.replace("seed: 42", "seed: 43"))
    assert [other.evaluate(f).matched for f in facts] != [d.matched for d in first]


def test_draws_do_not_depend_on_how_connections_interleave() -> None:
    text = """\
        rules:
          - id: p
            match: {probability: 0.5}
            actions: [drop_response]
        """
    streams = {c: [StaticFacts(api_key=FETCH, client_id=c, stream_ordinal=i) for i in range(50)] for c in "ab"}
    one_by_one = engine(text)
    alone = {c: [one_by_one.evaluate(f).matched for f in fs] for c, fs in streams.items()}
    mixed = engine(text)
    together: dict[str, list[bool]] = {"a": [], "b": []}
    for fa, fb in zip(streams["a"], streams["b"], strict=True):
        together["b"].append(mixed.evaluate(fb).matched)
        together["a"].append(mixed.evaluate(fa).matched)
    assert together == alone
    assert alone["a"] != alone["b"]  # the client id is part of the key


def test_rule_seed_overrides_the_file_seed() -> None:
    facts = StaticFacts(api_key=FETCH, client_id="c", stream_ordinal=3)
    assert draw(7, "r", facts, 0) == draw(7, "r", facts, 0)
    assert draw(7, "r", facts, 0) != draw(8, "r", facts, 0)
    text = "seed: {}\nrules:\n  - id: r\n    seed: 7\n    match: {{probability: 0.5}}\n    actions: [blackhole]\n"
    runs = [[engine(text.format(s)).evaluate(replace(facts, stream_ordinal=i)).matched for i in range(64)]
            for s in (1, 2)]
    assert runs[0] == runs[1]


# -- throttling ----------------------------------------------------------------------------------
def test_token_bucket_holds_the_long_run_rate() -> None:
    rate = 1_000_000.0
    bucket = TokenBucket(rate, rate, now=0.0)
    now, sent = 0.0, 0
    for _ in range(500):  # a sender that honours every delay it is given
        now += bucket.take(65536, now)
        sent += 65536
    assert abs(sent / now - rate) / rate < 0.05  # the first second's burst is the only excess
    assert bucket.take(0, now) == 0.0 or bucket.tokens(now) < 0


def test_token_bucket_refills_and_caps_and_ignores_a_backwards_clock() -> None:
    bucket = TokenBucket(10, 20, now=0)
    assert bucket.take(20, 0) == 0
    assert bucket.take(10, 0) == pytest.approx(1.0)
    assert bucket.tokens(0.5) == pytest.approx(-5)
    assert bucket.tokens(0.1) == pytest.approx(-5)
    assert bucket.tokens(100) == 20
    with pytest.raises(ValueError):
        TokenBucket(0, 1, now=0)


# -- facts from real frames ---------------------------------------------------------------------
def frame_facts(frame: bytes, **kw: object) -> FrameFacts:
    return FrameFacts(frame, decode_request_header(memoryview(frame)[4:]), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [3, 7, 9, 11])
def test_produce_facts(version: int) -> None:
    frame = request_frame(PRODUCE, version, 5, client_id="batch-1", transactional_id="tx-1", acks=0,
                          timeout_ms=100, topic_data=[{"name": "orders", "partition_data": [
                              {"index": 2, "records": None}, {"index": 4, "records": None}]}])
    facts = frame_facts(frame, broker_id=1, stream_ordinal=9)
    assert (facts.api_key, facts.api_version, facts.correlation_id, facts.client_id) == (0, version, 5, "batch-1")
    assert facts.topics() == {"orders": frozenset({2, 4})}
    assert facts.acks() == 0 and facts.transactional_id() == "tx-1" and facts.group_id() is None
    e = engine("""\
        rules:
          - id: r
            match: {api: produce, topic: orders, partition: 4, acks: 0, transactional_id: "tx-.*",
                    client_id: "batch-.*"}
            actions: [drop_response]
        """)
    assert ids(e, facts) == ["r"]  # type: ignore[arg-type]


def test_produce_topics_are_remembered_per_scan_and_read_only() -> None:
    """A producer's requests name the same partitions again and again: the second read finds the
    first's mapping (shared, so read-only); other partitions read as themselves."""

    def produce(correlation_id: int, *partitions: int) -> bytes:
        return request_frame(PRODUCE, 7, correlation_id, client_id="p", transactional_id=None, acks=1,
                             timeout_ms=100, topic_data=[{"name": "orders", "partition_data": [
                                 {"index": p, "records": None} for p in partitions]}])

    first = frame_facts(produce(1, 0, 1)).topics()
    again = frame_facts(produce(2, 0, 1)).topics()
    assert again is first and again == {"orders": frozenset({0, 1})}
    assert frame_facts(produce(3, 2)).topics() == {"orders": frozenset({2})}
    with pytest.raises(TypeError):
        first["orders"] = frozenset()  # type: ignore[index]


def test_facts_read_requests_with_trailing_bytes_and_survive_garbage() -> None:
    frame = request_frame(METADATA, 12, 1, topics=[{"name": "a", "topic_id": uuid.UUID(int=0)}])
    padded = (len(frame) - 4 + 3).to_bytes(4, "big") + frame[4:] + b"\x01\x02\x03"
    assert frame_facts(padded).topics() == {"a": frozenset()}
    broken = frame[:-3]
    broken = (len(broken) - 4).to_bytes(4, "big") + broken[4:]
    facts = frame_facts(broken)
    assert facts.topics() == {} and facts.group_id() is None


def test_group_facts() -> None:
    join = request_frame(JOIN_GROUP, 5, 1, group_id="payments-1", member_id="", protocol_type="consumer")
    assert frame_facts(join).group_id() == "payments-1"
    old = request_frame(FIND_COORDINATOR, 2, 1, key="payments-2", key_type=0)
    assert frame_facts(old).group_id() == "payments-2"
    txn = request_frame(FIND_COORDINATOR, 2, 1, key="tx", key_type=1)
    assert frame_facts(txn).group_id() is None


def test_fetch_topic_ids_resolve_to_names_when_known() -> None:
    topic_id = uuid.UUID(int=77)
    frame = request_frame(FETCH, 13, 1, replica_id=-1, topics=[
        {"topic_id": topic_id, "partitions": [{"partition": 1, "fetch_offset": 0, "partition_max_bytes": 1}]}])
    assert frame_facts(frame).topics() == {str(topic_id): frozenset({1})}
    assert frame_facts(frame, topic_names={topic_id: "events"}).topics() == {"events": frozenset({1})}
