"""The metrics' per-kind counters on the per-broker series: the labels, bytes and histograms
exported from them, and the response body found from the kind's header layout."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from kproxy.metrics.exposition import LiveGauges, make_registry
from kproxy.metrics.stats import TrafficStats, kind_key
from kproxy.protocol.codes import ApiKey, error_code
from kproxy.protocol.frame_builder import response_frame
from kproxy.protocol.framing import frame
from kproxy.protocol.payloads import encode_response
from tests.test_metrics_counting import sample

HEARTBEAT = int(ApiKey.HEARTBEAT)
API_VERSIONS = int(ApiKey.API_VERSIONS)
REBALANCING = error_code("REBALANCE_IN_PROGRESS")


def exposition(stats: TrafficStats) -> str:
    return generate_latest(make_registry(stats, LiveGauges)).decode()


def test_body_offset_found_for_a_flexible_header_with_tags() -> None:
    """Response header v1 with a tagged field: the body starts after it (no offset given); and the
    usual v1 header, with no tags."""
    stats = TrafficStats()
    broker = stats.broker(1)
    body = {"throttle_time_ms": 0, "error_code": REBALANCING}
    stats.response(broker, HEARTBEAT, 4, frame(encode_response(7, HEARTBEAT, 4, body, header_tags={5: b"abc"})), 0,
                   0.001, 0.0001)
    stats.response(broker, HEARTBEAT, 4, response_frame(HEARTBEAT, 4, 8, **body), 0, 0.001, 0.0001)
    assert broker.errors == {("heartbeat", "REBALANCE_IN_PROGRESS"): 2}
    assert not stats.undecodable_responses.get("heartbeat")


def test_api_versions_answers_with_header_v0_at_flexible_versions() -> None:
    """ApiVersions v3 is flexible, yet its response header is v0 (KIP-511: a client must read it before
    it knows what the broker speaks): the body starts right after the correlation id."""
    stats = TrafficStats()
    broker = stats.broker(None)
    answer = response_frame(API_VERSIONS, 3, 1, error_code=error_code("UNSUPPORTED_VERSION"))
    stats.response(broker, API_VERSIONS, 3, answer, 0, 0.001, 0.0001)
    assert broker.errors == {("api_versions", "UNSUPPORTED_VERSION"): 1}


def test_unreadable_header_tags_make_the_response_undecodable() -> None:
    """Tags that run past the frame: counted as undecodable, never raised."""
    stats = TrafficStats()
    broker = stats.broker(1)
    cut = frame(encode_response(7, HEARTBEAT, 4, {"throttle_time_ms": 0, "error_code": 0}))[:8] + b"\x02\x05"
    stats.response(broker, HEARTBEAT, 4, cut, 0, 0.001, 0.0001)
    assert stats.undecodable_responses == {"heartbeat": 1}
    assert broker.responses == {("heartbeat", 4): 1} and not broker.errors


def test_labels_and_bytes_as_exported() -> None:
    stats = TrafficStats()
    one, two = stats.broker(1), stats.broker(2)
    stats.request(one, HEARTBEAT, 4, 40, None)
    stats.request(one, HEARTBEAT, 3, 30, None)
    stats.request(one, HEARTBEAT, 999, 10, None)  # past the highest version kproxy knows: folded
    stats.request(one, HEARTBEAT, -1, 10, None)  # a negative version: folded too, not a kind of its own
    stats.request(one, 999, 0, 5, None)  # unknown api
    stats.request(two, HEARTBEAT, 4, 7, None)
    assert one.requests == {("heartbeat", 4): 1, ("heartbeat", 3): 1, ("heartbeat", "other"): 2,
                            ("unknown", "other"): 1}
    assert two.requests == {("heartbeat", 4): 1}
    assert stats.byte_counts == {("heartbeat", "request"): 97, ("unknown", "request"): 5}  # every broker's
    assert set(one.kinds) == {kind_key(HEARTBEAT, 4), kind_key(HEARTBEAT, 3)}  # folded pairs add no kinds
    assert set(one.folded) == {"heartbeat", "unknown"}
    text = exposition(stats)
    assert sample(text, "kproxy_requests_total", api="heartbeat", version="4", node_id="1") == 1
    assert sample(text, "kproxy_requests_total", api="heartbeat", version="4", node_id="2") == 1
    assert sample(text, "kproxy_requests_total", api="heartbeat", version="other", node_id="1") == 2
    assert sample(text, "kproxy_bytes_total", api="heartbeat", direction="request") == 97
    assert sample(text, "kproxy_bytes_total", api="heartbeat", direction="response") is None  # none yet
    assert sample(text, "kproxy_responses_total", api="heartbeat", version="4", node_id="1") is None


def test_histograms_by_api_per_broker_and_overhead_across_brokers() -> None:
    """Versions of one api share the broker's latency histogram; kproxy's overhead histogram is the api's
    across brokers, as exported before the kinds held them."""
    stats = TrafficStats()
    one, two = stats.broker(1), stats.broker(2)
    for broker, version, seconds in ((one, 4, 0.001), (one, 3, 0.5), (two, 4, 2.0)):
        stats.response(broker, HEARTBEAT, version, response_frame(HEARTBEAT, version, 1, error_code=0), 0,
                       seconds, 0.0001)
    stats.response(one, HEARTBEAT, 4, response_frame(HEARTBEAT, 4, 1, error_code=0), 0, None, 0.0001)  # local
    assert one.kinds[kind_key(HEARTBEAT, 4)].broker is one.kinds[kind_key(HEARTBEAT, 3)].broker
    assert one.kinds[kind_key(HEARTBEAT, 4)].overhead is two.kinds[kind_key(HEARTBEAT, 4)].overhead
    text = exposition(stats)
    assert sample(text, "kproxy_broker_latency_seconds_count", api="heartbeat", node_id="1") == 2
    assert sample(text, "kproxy_broker_latency_seconds_bucket", api="heartbeat", node_id="1", le="0.001") == 1
    assert sample(text, "kproxy_broker_latency_seconds_count", api="heartbeat", node_id="2") == 1
    assert sample(text, "kproxy_overhead_seconds_count", api="heartbeat") == 4
    assert sample(text, "kproxy_responses_total", api="heartbeat", version="4", node_id="1") == 2
    total = stats.totals()
    assert total.responses == {("heartbeat", 4): 3, ("heartbeat", 3): 1}
    assert total.broker_latency["heartbeat"].sum == pytest.approx(2.501)
