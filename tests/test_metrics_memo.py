"""The metrics' error-scan memo counts what the full scan counts, every time."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kproxy.metrics.stats import SCAN_MEMO_BODY_MAX, SCAN_MEMO_BYTES, TrafficStats
from kproxy.metrics.traffic_observer import MetricsObserver
from kproxy.protocol.codes import ApiKey, error_class, error_code
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.session import Session

METADATA, HEARTBEAT, PRODUCE = int(ApiKey.METADATA), int(ApiKey.HEARTBEAT), int(ApiKey.PRODUCE)
UNKNOWN_TOPIC = error_code("UNKNOWN_TOPIC_OR_PARTITION")
CLASS = error_class(UNKNOWN_TOPIC)


def metadata(correlation_id: int, topic_error: int, name: str = "orders") -> bytes:
    return response_frame(METADATA, 1, correlation_id, brokers=[
        {"node_id": 0, "host": "b0", "port": 9092, "rack": None}], controller_id=0, topics=[
        {"error_code": topic_error, "name": name, "is_internal": False, "partitions": []}])


def test_a_repeated_failing_answer_is_counted_every_time() -> None:
    """Metadata answers repeat byte for byte (only the correlation id differs): the remembered
    scan must still count each one's errors."""
    stats = TrafficStats()
    for cid in range(5):
        stats.response(stats.broker(0), METADATA, 1, metadata(cid, UNKNOWN_TOPIC), 8, 0.001, 0.0001)
    assert stats.broker(0).errors == {("metadata", "UNKNOWN_TOPIC_OR_PARTITION"): 5}
    assert stats.broker(0).responses_with_errors == {("metadata", CLASS): 5}
    assert stats.broker(0).responses == {("metadata", 1): 5}


def test_a_changed_answer_is_scanned_again() -> None:
    stats = TrafficStats()
    stats.response(stats.broker(0), METADATA, 1, metadata(1, 0), 8, 0.001, 0.0001)
    stats.response(stats.broker(0), METADATA, 1, metadata(2, UNKNOWN_TOPIC), 8, 0.001, 0.0001)
    stats.response(stats.broker(0), METADATA, 1, metadata(3, 0), 8, 0.001, 0.0001)
    assert stats.broker(0).errors == {("metadata", "UNKNOWN_TOPIC_OR_PARTITION"): 1}


def test_the_memo_stays_within_its_bytes() -> None:
    stats = TrafficStats()
    for i in range(2000):
        body = metadata(i, UNKNOWN_TOPIC, name=f"topic-{i:05d}-" + "x" * 200)
        stats.response(stats.broker(0), METADATA, 1, body, 8, 0.001, 0.0001)
    memo = stats._scan_memos[(METADATA, 1)]
    assert 0 < memo.bytes <= SCAN_MEMO_BYTES
    assert stats.broker(0).errors == {("metadata", "UNKNOWN_TOPIC_OR_PARTITION"): 2000}


def big_metadata(correlation_id: int, failing: int) -> bytes:
    """A Metadata answer over SCAN_MEMO_BODY_MAX (remembered by hash), ``failing`` topics in error."""
    topics = [{"error_code": UNKNOWN_TOPIC if i < failing else 0, "name": f"t{i:04d}-" + "y" * 200,
               "is_internal": False, "partitions": []} for i in range(400)]
    return response_frame(METADATA, 1, correlation_id, brokers=[
        {"node_id": 0, "host": "b0", "port": 9092, "rack": None}], controller_id=0, topics=topics)


def test_big_answers_are_remembered_by_hash_and_counted_every_time() -> None:
    stats = TrafficStats()
    assert len(big_metadata(0, 1)) > SCAN_MEMO_BODY_MAX
    for cid in range(3):
        stats.response(stats.broker(0), METADATA, 1, big_metadata(cid, 2), 8, 0.001, 0.0001)
    stats.response(stats.broker(0), METADATA, 1, big_metadata(9, 5), 8, 0.001, 0.0001)  # changed: scanned again
    assert stats.broker(0).errors == {("metadata", "UNKNOWN_TOPIC_OR_PARTITION"): 3 * 2 + 5}
    assert all(isinstance(k, tuple) for k in stats._scan_memos[(METADATA, 1)].results)


# -- through a session: the rewritten body is the scan memo's key ----------------------------------
API_VERSIONS = int(ApiKey.API_VERSIONS)


def api_versions(correlation_id: int, error: int = 0) -> bytes:
    return response_frame(API_VERSIONS, 3, correlation_id, error_code=error, api_keys=[
        {"api_key": METADATA, "min_version": 0, "max_version": 12},
        {"api_key": API_VERSIONS, "min_version": 0, "max_version": 3}])


def observed_session(stats: TrafficStats) -> Session:
    return Session(ResponseRewriter(AddressMap("kproxy.test", 40000)),
                   observer=MetricsObserver(stats).for_broker(0))


def exchange(session: Session, api_key: int, api_version: int, correlation_id: int, answer: bytes) -> None:
    session.receive_client(request_frame(api_key, api_version, correlation_id))
    session.receive_upstream(answer)
    session.report()


@pytest.mark.parametrize(("api_key", "version", "answer"), [
    (API_VERSIONS, 3, lambda cid: api_versions(cid)),
    (METADATA, 1, lambda cid: metadata(cid, UNKNOWN_TOPIC)),
])
def test_a_repeated_rewritten_answer_is_remembered_under_the_rewrite_memos_body(
        api_key: int, version: int, answer: Callable[[int], bytes]) -> None:
    """Answers the proxy rewrites (ApiVersions caps, Metadata brokers) are keyed in the scan memo by
    the rewrite memo's own body object: one entry, no slice of each response hashed and compared."""
    stats = TrafficStats()
    session = observed_session(stats)
    for cid in range(5):
        exchange(session, api_key, version, cid, answer(cid))
    (key,) = stats._scan_memos[(api_key, version)].results
    rewritten = [body for (_, _, _), (body, _) in session.rewriter._memo.items()]
    assert any(key is body for body in rewritten)
    assert stats.broker(0).responses == {(("api_versions" if api_key == API_VERSIONS else "metadata"), version): 5}


def test_answers_through_a_session_are_counted_as_the_full_scan_counts() -> None:
    """Every response's errors are counted, repeated or changed, ApiVersions included, as the stats
    count the same frames given alone (no memo key from the session)."""
    stats, alone = TrafficStats(), TrafficStats()
    session = observed_session(stats)
    errors = [0, 31, 31, 0, 31]  # CLUSTER_AUTHORIZATION_FAILED (UNSUPPORTED_VERSION answers are v0 bodies)
    for cid, error in enumerate(errors):
        exchange(session, API_VERSIONS, 3, cid, api_versions(cid, error))
        exchange(session, METADATA, 1, 100 + cid, metadata(100 + cid, UNKNOWN_TOPIC if error else 0))
    for ex_api, version, frames in ((API_VERSIONS, 3, [api_versions(c, e) for c, e in enumerate(errors)]),
                                     (METADATA, 1, [metadata(c, UNKNOWN_TOPIC if e else 0)
                                                    for c, e in enumerate(errors)])):
        for f in frames:
            alone.response(alone.broker(0), ex_api, version, f, 0, 0.001, 0.0001)
    assert stats.broker(0).errors == alone.broker(0).errors
    assert stats.broker(0).responses_with_errors == alone.broker(0).responses_with_errors
    assert stats.broker(0).errors[("metadata", "UNKNOWN_TOPIC_OR_PARTITION")] == 3
    assert sum(n for (api, _), n in stats.broker(0).errors.items() if api == "api_versions") == 3
