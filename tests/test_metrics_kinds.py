"""The metrics' per-kind counters: the labels and bytes exported, the response body found from the kind's header."""

from __future__ import annotations

from kproxy.metrics.stats import TrafficStats
from kproxy.protocol.builders import response_frame
from kproxy.protocol.frames import encode_response
from kproxy.protocol.framing import frame
from kproxy.protocol.tables import ApiKey, error_code

HEARTBEAT = int(ApiKey.HEARTBEAT)


def test_body_offset_found_for_a_flexible_header_with_tags() -> None:
    """Response header v1 with a tagged field: the body starts after it (no offset given)."""
    body = {"throttle_time_ms": 0, "error_code": error_code("REBALANCE_IN_PROGRESS")}
    payload = encode_response(7, HEARTBEAT, 4, body, header_tags={5: b"abc"})
    stats = TrafficStats()
    stats.response(HEARTBEAT, 4, frame(payload), 0, 0.001, 0.0001)
    plain = response_frame(HEARTBEAT, 4, 8, throttle_time_ms=0, error_code=error_code("REBALANCE_IN_PROGRESS"))
    stats.response(HEARTBEAT, 4, plain, 0, 0.001, 0.0001)
    assert stats.errors == {("heartbeat", "REBALANCE_IN_PROGRESS"): 2}
    assert not stats.undecodable_responses.get("heartbeat")


def test_labels_and_bytes_as_exported() -> None:
    stats = TrafficStats()
    stats.request(HEARTBEAT, 4, 40, None)
    stats.request(HEARTBEAT, 3, 30, None)
    stats.request(HEARTBEAT, 999, 10, None)  # past the highest version kproxy knows: folded
    stats.request(999, 0, 5, None)  # unknown api
    stats.request(HEARTBEAT, 1000, 10, None)
    assert stats.requests == {("heartbeat", 4): 1, ("heartbeat", 3): 1, ("heartbeat", "other"): 2,
                              ("unknown", "other"): 1}
    assert stats.byte_counts == {("heartbeat", "request"): 90, ("unknown", "request"): 5}
    assert len(stats._folded) == 2 and len(stats._kinds) == 2  # folded versions add no kinds
