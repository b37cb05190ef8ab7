"""The ``throttle`` action (kproxy/rules/actions/throttle.py) through its interface: its reader and
bounds, its buckets per scope, and its charging model (kproxy/rules/bucket.py) in a real Session,
sans-IO: Fetch pays for the bytes it is sent, after the answer is seen; the next Fetch waits for the
debt; and the throttle time reported is a broker's (KIP-13's formula, each request at its turn).
With real clients and a broker: tests/test_rules_throttle_e2e.py."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.rules import RuleEngine, RulesError, RuleSet, StaticFacts, load_text
from kproxy.rules.actions.base import MAX_DURATION_S
from kproxy.rules.actions.throttle import (
    MAX_RATE,
    MIN_BYTES_PER_SECOND,
    MIN_REQUESTS_PER_SECOND,
    Throttle,
    ThrottleScope,
    charged_on_response,
    split_throttle,
)
from kproxy.rules.bucket import TokenBucket, broker_throttle_s
from kproxy.rules.load import load_data
from tests.test_rules_scenarios import USER_QUOTA, problems, valid_for_editors
from tests.test_rules_session import PRODUCE, Driver, body, produce, produce_answer, rules

FETCH = 1


def fetch(correlation_id: int) -> bytes:
    return request_frame(FETCH, 12, correlation_id, topics=[
        {"topic": "logs", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}]}])


def fetch_answer(correlation_id: int, pad: int) -> bytes:
    return response_frame(FETCH, 12, correlation_id, responses=[
        {"topic": "logs", "partitions": [{"partition_index": 0, "high_watermark": 1,
                                          "aborted_transactions": [{"producer_id": i, "first_offset": 0}
                                                                   for i in range(pad)]}]}])


def throttle_ms(response: bytes) -> int:
    return int(body(FETCH, 12, response)["throttle_time_ms"])


def test_fetch_is_charged_its_response_size_and_the_next_fetch_waits_for_the_debt() -> None:
    d = Driver(rules("throttle: {bytes_per_second: 1000, burst_seconds: 0.001}", "{api: fetch}"))
    d.client(fetch(1))
    answer = fetch_answer(1, pad=100)  # ~1.6 KB: far more than the request
    d.broker(answer)
    # The first answer leaves at once (the debt comes after it), telling the client what it owes.
    assert d.answered() == [1]
    owed_ms = len(answer) - 1  # 1 byte a millisecond, past a 1-byte bucket
    assert abs(throttle_ms(d.to_client[0]) - owed_ms) <= 1
    d.client(fetch(2))
    d.broker(fetch_answer(2, pad=0))
    assert d.answered() == [1], "the next Fetch waits for the debt"
    d.tick(owed_ms / 1000 - 0.05)
    assert d.answered() == [1]
    d.tick(0.06)
    assert d.answered() == [1, 2]


def test_produce_is_still_charged_its_request_size() -> None:
    d = Driver(rules("throttle: {bytes_per_second: 1000, burst_seconds: 0.01}", "{api: produce}"))
    first = produce(1, -1)
    d.client(first)
    assert charged_on_response(0, Throttle(bytes_per_second=1000)) is False
    d.broker(response_frame(0, 9, 1, responses=[]))
    assert d.answered() == [], "held at once for its own bytes"
    d.tick(len(first) / 1000)
    assert d.answered() == [1]


def test_a_request_rate_on_fetch_is_still_charged_per_request() -> None:
    d = Driver(rules("throttle: {requests_per_second: 2, burst_seconds: 0.5}", "{api: fetch}"))
    d.client(fetch(1), fetch(2))
    d.broker(fetch_answer(1, 0), fetch_answer(2, 0))
    assert d.answered() == [1]  # one token saved; the second request waits half a second
    d.tick(0.51)
    assert d.answered() == [1, 2]
    assert throttle_ms(d.to_client[1]) == 500


def test_split_throttle_separates_the_two_rates() -> None:
    both = Throttle(bytes_per_second=10, requests_per_second=2)
    by_bytes, by_requests = split_throttle(both)
    assert by_bytes == Throttle(bytes_per_second=10) and by_requests == Throttle(requests_per_second=2)
    assert split_throttle(Throttle(bytes_per_second=10)) == (Throttle(bytes_per_second=10), None)
    assert split_throttle(Throttle(requests_per_second=2)) == (None, Throttle(requests_per_second=2))


# -- the throttle time a broker reports (KIP-13, KIP-124, KIP-219) -----------------------------------
def test_the_broker_formula_is_the_idle_time_that_brings_the_observed_rate_back_to_the_quota() -> None:
    for observed, quota, window in ((2000.0, 1000.0, 1.0), (1500.0, 1000.0, 11.0), (1e6, 262144.0, 0.05)):
        idle = broker_throttle_s(observed, quota, window)
        assert observed * window / (window + idle) == pytest.approx(quota)
    assert broker_throttle_s(2000.0, 1000.0, 11.0) == pytest.approx(11.0)  # twice the quota: one more window
    assert broker_throttle_s(999.0, 1000.0, 11.0) == 0.0 == broker_throttle_s(1000.0, 1000.0, 11.0)


def test_a_bucket_reports_the_formula_over_its_window_of_burst_seconds() -> None:
    bucket = TokenBucket(1000.0, 500.0, now=0.0)  # a window of 0.5 s
    hold, reported = bucket.charge(1200.0, 0.0)
    observed = 1200.0 / 0.5  # all it remembers, over its window
    assert reported == pytest.approx(broker_throttle_s(observed, 1000.0, 0.5)) == pytest.approx(0.7)
    assert hold == pytest.approx(reported)


def _plain_bucket_holds(rate: float, capacity: float, reads: list[tuple[float, float]]) -> list[float]:
    """The holds of a bucket charged at read time with no turns (what a request's release time
    must stay: the rate it keeps)."""
    tokens, stamp, out = capacity, 0.0, []
    for now, amount in reads:
        if now > stamp:
            tokens, stamp = min(capacity, tokens + (now - stamp) * rate), now
        tokens -= amount
        out.append(max(0.0, -tokens / rate))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.5), st.floats(0, 5000)), min_size=1, max_size=40),
       st.floats(0.01, 2.0))
def test_turns_change_what_is_reported_never_when_a_request_is_released(
        steps: list[tuple[float, float]], burst_s: float) -> None:
    rate = 1000.0
    reads, now = [], 0.0
    for gap, amount in steps:
        now += gap
        reads.append((now, amount))
    bucket = TokenBucket(rate, rate * burst_s, now=0.0)
    charged = [bucket.charge(amount, at) for at, amount in reads]
    for (hold, reported), plain, (_, amount) in zip(charged, _plain_bucket_holds(rate, rate * burst_s, reads),
                                                    reads, strict=True):
        assert hold == pytest.approx(plain, abs=1e-6)
        assert 0.0 <= reported <= amount / rate + 1e-9, "a request is told its own bytes' time at most"
        assert reported <= hold + 1e-9


def test_five_pipelined_produce_requests_are_each_told_their_own_throttle_not_the_queue_s() -> None:
    d = Driver(rules("throttle: {bytes_per_second: 1000, burst_seconds: 0.001}", "{api: produce}"))
    frames = [produce(i, -1) for i in range(1, 6)]
    size = len(frames[0])
    read_at = d.clock.now
    d.client(*frames)  # read at once, as a client with five in flight sends them
    d.broker(*(response_frame(0, 9, i, responses=[]) for i in range(1, 6)))
    for k in range(1, 6):  # answer k leaves once k requests' bytes are paid (past a 1-byte bucket)
        release = read_at + (k * size - 1) / 1000
        d.tick(release - 0.001 - d.clock.now)
        assert d.answered() == list(range(1, k))
        d.tick(0.002)
        assert d.answered() == list(range(1, k + 1))
    reported = [body(0, 9, f)["throttle_time_ms"] for f in d.to_client]
    assert reported[0] == round(size - 1)  # past a 1-byte bucket
    assert reported[1:] == [size] * 4, "each is its own bytes' time, as a broker muting the channel says"


def test_throttle_holds_like_a_quota_and_reports_throttle_time_ms() -> None:
    d = Driver(rules("throttle: {bytes_per_second: 1000, burst_seconds: 0.01}", "{api: produce}"))
    first = produce(1, -1)
    d.client(first)
    d.broker(produce_answer(1))
    # A 10-byte bucket; the request's bytes past it are paid back at 1000 B/s.
    expected_ms = round(len(first) - 10)  # ms: 1 byte a millisecond
    assert d.to_client == []
    d.tick(expected_ms / 1000 + 0.001)
    assert d.answered() == [1]
    assert body(PRODUCE, 9, d.to_client[0])["throttle_time_ms"] == expected_ms


def test_throttle_scopes() -> None:
    e = RuleEngine(load_text("rules:\n  - id: q\n    match: {}\n    actions: [{throttle: {requests_per_second: 1}}]\n"))
    per_client = Throttle(requests_per_second=1, scope=ThrottleScope.CLIENT_ID)
    a, b = StaticFacts(api_key=PRODUCE, client_id="a"), StaticFacts(api_key=PRODUCE, client_id="b")
    assert per_client.charge(e.buckets, "q", a, 10)[0] == 0
    assert per_client.charge(e.buckets, "q", b, 10)[0] == 0  # its own bucket
    assert per_client.charge(e.buckets, "q", a, 10)[0] == pytest.approx(1.0)
    glob = Throttle(bytes_per_second=100, scope=ThrottleScope.GLOBAL)
    assert glob.charge(e.buckets, "g", a, 100)[0] == 0
    assert glob.charge(e.buckets, "g", b, 50)[0] == pytest.approx(0.5)
    topic = Throttle(bytes_per_second=100, scope=ThrottleScope.TOPIC)
    t1 = replace(a, topic_partitions={"t1": frozenset({0})})
    assert topic.charge(e.buckets, "t", t1, 150)[0] == pytest.approx(0.5)
    assert topic.charge(e.buckets, "t", replace(a, topic_partitions={"t2": frozenset({0})}), 150)[0] \
        == pytest.approx(0.5)


def test_a_throttle_rate_that_would_overflow_is_refused_from_the_admin_json() -> None:
    """JSON reads 5e-324 as a float (YAML 1.1 wants 5.0e-324): the admin API's path. On main it was
    accepted and every matching request ended its connection (round(inf) on the hold)."""
    with pytest.raises(RulesError) as caught:
        load_data({"rules": [{"id": "tiny", "match": {"api": "api_versions"},
                              "actions": [{"throttle": {"bytes_per_second": 5e-324}}]}]})
    (problem,) = caught.value.problems
    assert (problem.key, problem.reason) == ("rules[0].actions[0].throttle.bytes_per_second",
                                             "must be >= 1, got 5e-324")


@pytest.mark.parametrize(("rate_key", "rate"), [("bytes_per_second", MIN_BYTES_PER_SECOND),
                                                ("bytes_per_second", MAX_RATE),
                                                ("requests_per_second", MIN_REQUESTS_PER_SECOND),
                                                ("requests_per_second", MAX_RATE)])
@pytest.mark.parametrize("burst_s", [1e-9, MAX_DURATION_S])
def test_a_throttle_at_its_bounds_holds_for_a_finite_time(rate_key: str, rate: float, burst_s: float) -> None:
    """What the loader accepts cannot overflow at run time: the hold (debt / rate) of the biggest
    request kproxy reads, and the throttle_time_ms made of it, stay finite."""
    throttle = Throttle(**{rate_key: rate}, burst_s=burst_s)  # type: ignore[arg-type]
    engine = RuleEngine(RuleSet())
    for i in range(3):
        facts = StaticFacts(api_key=0, client_id="c", now=float(i))
        hold = throttle.charge(engine.buckets, "r", facts, 2**31 - 1)[0]
        assert math.isfinite(hold) and hold >= 0
        assert round(hold * 1000) >= 0


def test_scope_principal_is_checked_by_the_loader_and_the_editors_schema() -> None:
    assert valid_for_editors(USER_QUOTA)
    assert problems(USER_QUOTA.replace("scope: principal", "scope: principle"))[0].startswith(
        "r.yaml:5: rules[0].actions[0].throttle.scope: ")
    assert not valid_for_editors(USER_QUOTA.replace("scope: principal", "scope: user"))


def test_the_listing_and_the_what_if_ask_a_throttle_through_its_hooks() -> None:
    """Its buckets are shared by every connection (the what-if replays such rules in one order),
    the what-if charges it what a request would be held, and a principal quota is listed."""
    per_user = Throttle(requests_per_second=1, scope=ThrottleScope.PRINCIPAL)
    assert per_user.shares_state and per_user.has_live_state
    shown: dict[str, object] = {}
    per_user.live_state(0.0, shown)
    assert shown == {"throttle_scope": "principal"}
    assert not Throttle(requests_per_second=1).has_live_state
    buckets = RuleEngine(RuleSet()).buckets
    alice = StaticFacts(api_key=PRODUCE, client_id="a", principal="User:alice")
    bob = StaticFacts(api_key=PRODUCE, client_id="a", principal="User:bob")
    assert per_user.whatif_hold_s(buckets, "q", alice, 10) == 0
    assert per_user.whatif_hold_s(buckets, "q", bob, 10) == 0  # another principal: another bucket
    assert per_user.whatif_hold_s(buckets, "q", alice, 10) == pytest.approx(1.0)
