"""The throttle's charging model (kproxy/rules/bucket.py) in a real Session, sans-IO: Fetch pays
for the bytes it is sent, after the answer is seen; the next Fetch waits for the debt."""

from __future__ import annotations

from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.rules.actions.throttle import Throttle
from kproxy.rules.bucket import charged_on_response, split_throttle
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
