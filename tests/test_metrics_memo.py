"""The metrics' error-scan memo counts what the full scan counts, every time."""

from __future__ import annotations

from kproxy.metrics.stats import SCAN_MEMO_BODY_MAX, SCAN_MEMO_BYTES, TrafficStats
from kproxy.protocol.builders import response_frame
from kproxy.protocol.tables import ApiKey, error_class, error_code

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
