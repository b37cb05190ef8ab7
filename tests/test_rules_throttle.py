"""The throttle's charging model (kproxy/rules/bucket.py) in a real Session, sans-IO: Fetch pays
for the bytes it is sent, after the answer is seen; the next Fetch waits for the debt; and the
throttle time reported is a broker's (KIP-13's formula, each request at its turn)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.rules.actions.throttle import Throttle, charged_on_response, split_throttle
from kproxy.rules.bucket import TokenBucket, broker_throttle_s
from tests.test_rules_session import Driver, body, produce, rules

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
