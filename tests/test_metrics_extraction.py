"""Error codes and record counts out of real message bytes: the partial decoder behind the metrics.

Messages are built with kproxy's codec (``default_body``/``encode_*``) and framed as they
travel; :func:`kproxy.protocol.scan.scan_body` and :class:`TrafficStats` then read them back
the way the proxy does (body offset from ``response_body_offset``, as the observer takes it).
One test per API family, over old, flexible and topic-id versions where they differ.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest

from kproxy.metrics.labels import OTHER
from kproxy.metrics.stats import StatsOptions, TrafficStats
from kproxy.protocol import MessageType, RequestHeader, default_body, encode_request, encode_response, frame
from kproxy.protocol.codes import error_code
from kproxy.protocol.compression import Codec
from kproxy.protocol.headers import request_header_version, response_body_offset
from kproxy.protocol.message_schemas import all_message_kinds, message_schema
from kproxy.protocol.messages import default_struct
from kproxy.protocol.records import Record, encode_batch_v2, encode_message_set
from kproxy.protocol.scan import BodyScan, scan_body

PRODUCE, FETCH, LIST_OFFSETS, METADATA, OFFSET_COMMIT = 0, 1, 2, 3, 8
FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, API_VERSIONS = 10, 11, 12, 18
RESP, REQ = MessageType.RESPONSE, MessageType.REQUEST


def code(name: str) -> int:
    value = error_code(name)
    assert value is not None, name
    return value


NONE = 0
NOT_LEADER = code("NOT_LEADER_OR_FOLLOWER")
UNKNOWN_TOPIC = code("UNKNOWN_TOPIC_OR_PARTITION")
OUT_OF_RANGE = code("OFFSET_OUT_OF_RANGE")
LEADER_NA = code("LEADER_NOT_AVAILABLE")


# -- building messages ------------------------------------------------------------------------
def element(api_key: int, version: int, direction: MessageType, *path: str) -> dict[str, Any]:
    """A default element of the (nested) array field at ``path``."""
    schema = message_schema(api_key, version, direction)
    assert schema is not None
    fields = schema.fields
    for name in path:
        field = next(f for f in fields if f.name == name and f.tag is None)
        assert field.fields is not None, name
        fields = field.fields
    return default_struct(fields)


def response(api_key: int, version: int, body: dict[str, Any]) -> tuple[bytes, int]:
    """The response as kproxy sees it: a whole frame, and where its body starts."""
    data = frame(encode_response(42, api_key, version, body))
    return data, response_body_offset(data, api_key, version)


def request(api_key: int, version: int, body: dict[str, Any]) -> bytes:
    header = RequestHeader(api_key, version, 42, "extraction-test", request_header_version(api_key, version))
    return frame(encode_request(header, body))


def scan(api_key: int, version: int, body: dict[str, Any]) -> BodyScan:
    data, offset = response(api_key, version, body)
    return scan_body(api_key, version, RESP, data, offset)


def stats_after(api_key: int, version: int, body: dict[str, Any], **options: Any) -> TrafficStats:
    stats = TrafficStats(StatsOptions(**options))
    data, offset = response(api_key, version, body)
    stats.response(stats.broker(1), api_key, version, data, offset, broker_seconds=0.002, overhead_seconds=0.00004)
    return stats


def name_topic(item: dict[str, Any], name_field: str, topic: str | uuid.UUID) -> None:
    """Set a topic struct's name, or its topic id in versions that only carry an id."""
    if isinstance(topic, uuid.UUID):
        item["topic_id"] = topic
    else:
        item[name_field] = topic


def batch(n: int, codec: int = Codec.NONE) -> bytes:
    return encode_batch_v2([Record(i, 1_700_000_000_000 + i, b"k", b"v" * 10) for i in range(n)], codec=codec)


# -- Produce -------------------------------------------------------------------------------------
PRODUCE_VERSIONS = [0, 3, 8, 9, 12, 13]


def produce_response(version: int, topics: dict[str | uuid.UUID, list[tuple[int, int]]]) -> dict[str, Any]:
    body = default_body(PRODUCE, version, RESP)
    for topic, partitions in topics.items():
        item = element(PRODUCE, version, RESP, "responses")
        name_topic(item, "name", topic)
        for index, err in partitions:
            part = element(PRODUCE, version, RESP, "responses", "partition_responses")
            part.update(index=index, error_code=err)
            item["partition_responses"].append(part)
        body["responses"].append(item)
    return body


def topic_key(version: int, api_key: int, name: str) -> str | uuid.UUID:
    """The topic as a Produce/Fetch response carries it: its name, or (v13+) an id."""
    item = element(api_key, version, RESP, "responses")
    uses_id = "topic_id" in item and not {"name", "topic"} & item.keys()
    return uuid.uuid5(uuid.NAMESPACE_DNS, name) if uses_id else name


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_response_codes_per_partition(version: int) -> None:
    orders, audit = topic_key(version, PRODUCE, "orders"), topic_key(version, PRODUCE, "audit")
    body = produce_response(version, {orders: [(0, NONE), (1, NOT_LEADER), (2, NOT_LEADER)],
                                      audit: [(0, UNKNOWN_TOPIC)]})
    found = scan(PRODUCE, version, body)
    assert found.entries == [(orders, 0, NONE), (orders, 1, NOT_LEADER), (orders, 2, NOT_LEADER),
                             (audit, 0, UNKNOWN_TOPIC)]
    assert found.errors() == [(orders, 1, NOT_LEADER), (orders, 2, NOT_LEADER), (audit, 0, UNKNOWN_TOPIC)]

    stats = stats_after(PRODUCE, version, body, topic_label=True)
    assert stats.broker(1).responses == {("produce", version): 1}
    assert stats.broker(1).errors == {("produce", "NOT_LEADER_OR_FOLLOWER"): 2,
                                      ("produce", "UNKNOWN_TOPIC_OR_PARTITION"): 1}
    assert stats.topic_errors == {("produce", str(orders), "NOT_LEADER_OR_FOLLOWER"): 2,
                                  ("produce", str(audit), "UNKNOWN_TOPIC_OR_PARTITION"): 1}
    latency = stats.broker(1).broker_latency["produce"]
    assert latency.counts[latency.bounds.index(0.0025)] == 1


@pytest.mark.parametrize("version", [3, 7, 9, 11])
def test_produce_request_records_are_counted(version: int) -> None:
    body = default_body(PRODUCE, version, REQ)
    body.update(acks=-1, timeout_ms=1000)
    topic = element(PRODUCE, version, REQ, "topic_data")
    topic["name"] = "orders"
    p0 = element(PRODUCE, version, REQ, "topic_data", "partition_data")
    p0.update(index=0, records=batch(3))
    p1 = element(PRODUCE, version, REQ, "topic_data", "partition_data")
    # Two batches in one partition, one of them compressed: counted from headers, not decompressed.
    p1.update(index=1, records=batch(2) + batch(4, Codec.ZSTD))
    topic["partition_data"] = [p0, p1]
    body["topic_data"] = [topic]
    data = request(PRODUCE, version, body)

    stats = TrafficStats()
    stats.request(stats.broker(1), PRODUCE, version, len(data), "client", data)
    assert stats.records == {"produce": 9}
    assert stats.broker(1).requests == {("produce", version): 1}
    assert stats.byte_counts == {("produce", "request"): len(data)}


def test_produce_request_with_legacy_message_sets_counts_inner_messages() -> None:
    body = default_body(PRODUCE, 2, REQ)
    topic = element(PRODUCE, 2, REQ, "topic_data")
    part = element(PRODUCE, 2, REQ, "topic_data", "partition_data")
    messages = [Record(i, 1_700_000_000_000, None, b"x") for i in range(5)]
    part.update(index=0, records=encode_message_set(messages, magic=1, codec=Codec.GZIP)
                + encode_message_set(messages[:2], magic=1))
    topic.update(name="legacy", partition_data=[part])
    body["topic_data"] = [topic]
    data = request(PRODUCE, 2, body)
    stats = TrafficStats()
    stats.request(stats.broker(1), PRODUCE, 2, len(data), None, data)
    assert stats.records == {"produce": 7}


def test_malformed_produce_request_counts_nothing_and_does_not_raise() -> None:
    body = default_body(PRODUCE, 9, REQ)
    topic = element(PRODUCE, 9, REQ, "topic_data")
    part = element(PRODUCE, 9, REQ, "topic_data", "partition_data")
    part.update(index=0, records=batch(3))
    topic.update(name="t", partition_data=[part])
    body["topic_data"] = [topic]
    data = request(PRODUCE, 9, body)
    stats = TrafficStats()
    stats.request(stats.broker(1), PRODUCE, 9, len(data) - 7, None, data[:-7])   # truncated
    assert stats.records == {}
    assert stats.broker(1).requests == {("produce", 9): 1}


# -- Fetch -----------------------------------------------------------------------------------------
FETCH_VERSIONS = [0, 4, 7, 11, 12, 13, 16]


def fetch_response(version: int, topics: dict[str | uuid.UUID, list[tuple[int, int, bytes | None]]],
                   top_error: int = NONE) -> dict[str, Any]:
    body = default_body(FETCH, version, RESP)
    if "error_code" in body:
        body["error_code"] = top_error
    for topic, partitions in topics.items():
        item = element(FETCH, version, RESP, "responses")
        name_topic(item, "topic", topic)
        for index, err, records in partitions:
            part = element(FETCH, version, RESP, "responses", "partitions")
            part.update(partition_index=index, error_code=err, records=records)
            item["partitions"].append(part)
        body["responses"].append(item)
    return body


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_response_codes_per_partition_and_records(version: int) -> None:
    t = topic_key(version, FETCH, "events")
    body = fetch_response(version, {t: [(0, NONE, batch(5) + batch(2, Codec.GZIP)), (1, OUT_OF_RANGE, None),
                                        (2, NOT_LEADER, b"")]})
    found = scan(FETCH, version, body)
    partitions = [e for e in found.entries if e[1] is not None]
    assert partitions == [(t, 0, NONE), (t, 1, OUT_OF_RANGE), (t, 2, NOT_LEADER)]
    assert len(found.records) == 1   # null and empty records fields are not noted
    assert found.record_count() == 7

    stats = stats_after(FETCH, version, body)
    assert stats.broker(1).errors == {("fetch", "OFFSET_OUT_OF_RANGE"): 1, ("fetch", "NOT_LEADER_OR_FOLLOWER"): 1}
    assert stats.records == {"fetch": 7}


GARBAGE = [
    pytest.param(b"\xde\xad\xbe\xef" * 40, id="noise"),
    pytest.param(bytes(8) + b"\xff\xff\xff\xf0" + bytes(60), id="negative-size"),
    pytest.param(bytes(8) + b"\x00\x00\x00\x40" + bytes(4) + b"\x07" + bytes(59), id="unknown-magic"),
    pytest.param(batch(3)[:-5], id="truncated-batch"),
]


@pytest.mark.parametrize("garbage", GARBAGE)
@pytest.mark.parametrize("version", [4, 12, 13])
def test_fetch_records_are_skipped_not_decoded(version: int, garbage: bytes) -> None:
    """The scan steps over the records bytes by their length: garbage there changes nothing."""
    t = topic_key(version, FETCH, "events")
    body = fetch_response(version, {t: [(0, NONE, garbage), (1, NOT_LEADER, None)]})
    data, offset = response(FETCH, version, body)
    found = scan_body(FETCH, version, RESP, data, offset)
    assert [e for e in found.entries if e[1] is not None] == [(t, 0, NONE), (t, 1, NOT_LEADER)]
    (start, end), = found.records
    assert data[start:end] == garbage

    # Metrics never fail the exchange over records they cannot count.
    stats = TrafficStats()
    stats.response(stats.broker(1), FETCH, version, data, offset, 0.5, 0.0001)
    assert stats.broker(1).errors == {("fetch", "NOT_LEADER_OR_FOLLOWER"): 1}
    assert stats.broker(1).responses == {("fetch", version): 1}
    assert stats.records.get("fetch", 0) == 0   # corrupt entries are not counted, a truncated tail neither


@pytest.mark.parametrize("version", [7, 12, 16])
def test_fetch_top_level_error(version: int) -> None:
    body = fetch_response(version, {}, top_error=code("FETCH_SESSION_ID_NOT_FOUND"))
    assert scan(FETCH, version, body).entries == [(None, None, code("FETCH_SESSION_ID_NOT_FOUND"))]
    assert stats_after(FETCH, version, body).broker(1).errors == {("fetch", "FETCH_SESSION_ID_NOT_FOUND"): 1}


# -- ListOffsets, OffsetCommit ------------------------------------------------------------------------
@pytest.mark.parametrize("version", [0, 1, 5, 6, 7])
def test_list_offsets_codes_per_partition(version: int) -> None:
    body = default_body(LIST_OFFSETS, version, RESP)
    item = element(LIST_OFFSETS, version, RESP, "topics")
    item["name"] = "orders"
    for index, err in [(0, NONE), (1, code("OFFSET_NOT_AVAILABLE")), (2, NOT_LEADER)]:
        part = element(LIST_OFFSETS, version, RESP, "topics", "partitions")
        part.update(partition_index=index, error_code=err)
        item["partitions"].append(part)
    body["topics"] = [item]
    assert scan(LIST_OFFSETS, version, body).entries == [
        ("orders", 0, NONE), ("orders", 1, code("OFFSET_NOT_AVAILABLE")), ("orders", 2, NOT_LEADER)]
    assert stats_after(LIST_OFFSETS, version, body).broker(1).errors == {
        ("list_offsets", "OFFSET_NOT_AVAILABLE"): 1, ("list_offsets", "NOT_LEADER_OR_FOLLOWER"): 1}


@pytest.mark.parametrize("version", [0, 2, 7, 8, 9])
def test_offset_commit_codes_per_partition(version: int) -> None:
    body = default_body(OFFSET_COMMIT, version, RESP)
    for name, codes in [("a", [NONE, code("OFFSET_METADATA_TOO_LARGE")]), ("b", [code("ILLEGAL_GENERATION")])]:
        item = element(OFFSET_COMMIT, version, RESP, "topics")
        item["name"] = name
        for index, err in enumerate(codes):
            part = element(OFFSET_COMMIT, version, RESP, "topics", "partitions")
            part.update(partition_index=index, error_code=err)
            item["partitions"].append(part)
        body["topics"].append(item)
    assert scan(OFFSET_COMMIT, version, body).entries == [
        ("a", 0, NONE), ("a", 1, code("OFFSET_METADATA_TOO_LARGE")), ("b", 0, code("ILLEGAL_GENERATION"))]
    assert stats_after(OFFSET_COMMIT, version, body, topic_label=True).topic_errors == {
        ("offset_commit", "a", "OFFSET_METADATA_TOO_LARGE"): 1, ("offset_commit", "b", "ILLEGAL_GENERATION"): 1}


# -- Metadata --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [0, 1, 9, 10, 12, 13])
def test_metadata_topic_and_partition_codes(version: int) -> None:
    body = default_body(METADATA, version, RESP)
    healthy = element(METADATA, version, RESP, "topics")
    healthy.update(name="healthy", error_code=NONE)
    for index, err in [(0, NONE), (1, LEADER_NA)]:
        part = element(METADATA, version, RESP, "topics", "partitions")
        part.update(partition_index=index, error_code=err)
        healthy["partitions"].append(part)
    missing = element(METADATA, version, RESP, "topics")
    missing.update(name="missing", error_code=UNKNOWN_TOPIC)
    body["topics"] = [healthy, missing]

    found = scan(METADATA, version, body)
    expected: list[tuple[str | None, int | None, int]] = [
        ("healthy", 0, NONE), ("healthy", 1, LEADER_NA), ("healthy", None, NONE), ("missing", None, UNKNOWN_TOPIC)]
    if "error_code" in body:   # v13 adds a top-level code
        expected.append((None, None, NONE))
    assert Counter(found.entries) == Counter(expected)
    assert found.topics() == ["healthy", "missing"]
    stats = stats_after(METADATA, version, body, topic_label=True)
    assert stats.broker(1).errors == {("metadata", "LEADER_NOT_AVAILABLE"): 1,
                                      ("metadata", "UNKNOWN_TOPIC_OR_PARTITION"): 1}
    assert stats.topic_errors == {("metadata", "healthy", "LEADER_NOT_AVAILABLE"): 1,
                                  ("metadata", "missing", "UNKNOWN_TOPIC_OR_PARTITION"): 1}


def test_metadata_topic_label_is_capped() -> None:
    """Hostile input (a topic name per request) cannot grow the topic label past the cap."""
    stats = TrafficStats(StatsOptions(topic_label=True, label_cap=3))
    for i in range(50):
        body = default_body(METADATA, 9, RESP)
        item = element(METADATA, 9, RESP, "topics")
        item.update(name=f"probe-{i}", error_code=UNKNOWN_TOPIC)
        body["topics"] = [item]
        data, offset = response(METADATA, 9, body)
        stats.response(stats.broker(1), METADATA, 9, data, offset, 0.001, 0.00001)
    topics = {topic for _, topic, _ in stats.topic_errors}
    assert topics == {"probe-0", "probe-1", "probe-2", OTHER}
    assert stats.topic_errors[("metadata", OTHER, "UNKNOWN_TOPIC_OR_PARTITION")] == 47
    assert stats.broker(1).errors == {("metadata", "UNKNOWN_TOPIC_OR_PARTITION"): 50}


# -- top-level error codes -------------------------------------------------------------------------
TOP_LEVEL = [
    (FIND_COORDINATOR, 0, "find_coordinator", "COORDINATOR_NOT_AVAILABLE"),
    (FIND_COORDINATOR, 3, "find_coordinator", "COORDINATOR_LOAD_IN_PROGRESS"),
    (JOIN_GROUP, 0, "join_group", "UNKNOWN_MEMBER_ID"),
    (JOIN_GROUP, 5, "join_group", "MEMBER_ID_REQUIRED"),
    (JOIN_GROUP, 9, "join_group", "REBALANCE_IN_PROGRESS"),
    (HEARTBEAT, 4, "heartbeat", "REBALANCE_IN_PROGRESS"),
    (API_VERSIONS, 0, "api_versions", "UNSUPPORTED_VERSION"),
    (API_VERSIONS, 3, "api_versions", "UNSUPPORTED_VERSION"),
]


@pytest.mark.parametrize(("api_key", "version", "api", "error"), TOP_LEVEL)
def test_top_level_error_code(api_key: int, version: int, api: str, error: str) -> None:
    body = default_body(api_key, version, RESP)
    body["error_code"] = code(error)
    assert scan(api_key, version, body).entries == [(None, None, code(error))]
    stats = stats_after(api_key, version, body, topic_label=True)
    assert stats.broker(1).errors == {(api, error): 1}
    assert stats.topic_errors == {}     # no topic, nothing to label


@pytest.mark.parametrize("version", [4, 5, 6])
def test_find_coordinator_batched_codes_per_key(version: int) -> None:
    body = default_body(FIND_COORDINATOR, version, RESP)
    for key, err in [("g1", NONE), ("g2", code("COORDINATOR_NOT_AVAILABLE")), ("g3", code("NOT_COORDINATOR"))]:
        item = element(FIND_COORDINATOR, version, RESP, "coordinators")
        item.update(key=key, error_code=err)
        body["coordinators"].append(item)
    assert scan(FIND_COORDINATOR, version, body).entries == [
        (None, None, NONE), (None, None, code("COORDINATOR_NOT_AVAILABLE")), (None, None, code("NOT_COORDINATOR"))]
    assert stats_after(FIND_COORDINATOR, version, body).broker(1).errors == {
        ("find_coordinator", "COORDINATOR_NOT_AVAILABLE"): 1, ("find_coordinator", "NOT_COORDINATOR"): 1}


# -- what TrafficStats does around the scan -------------------------------------------------------
def test_success_counts_no_error() -> None:
    body = produce_response(9, {"t": [(0, NONE), (1, NONE)]})
    stats = stats_after(PRODUCE, 9, body)
    assert stats.broker(1).errors == {}
    assert stats.broker(1).responses == {("produce", 9): 1}


def test_unknown_error_code_gets_a_bounded_name() -> None:
    body = default_body(HEARTBEAT, 4, RESP)
    body["error_code"] = 9999
    assert stats_after(HEARTBEAT, 4, body).broker(1).errors == {("heartbeat", "UNKNOWN_ERROR_CODE_9999"): 1}


def test_undecodable_response_is_counted_not_raised() -> None:
    body = produce_response(9, {"t": [(0, NOT_LEADER)]})
    data, offset = response(PRODUCE, 9, body)
    stats = TrafficStats()
    node = stats.broker(1)
    stats.response(node, PRODUCE, 9, data[:offset + 6], offset, 0.001, 0.00001)  # truncated inside the partitions
    stats.response(node, 1000, 0, data, offset, 0.001, 0.00001)                   # an api kproxy does not know
    assert stats.broker(1).errors == {}
    assert stats.undecodable_responses == {"produce": 1, stats.api(1000): 1}
    assert sum(stats.broker(1).responses.values()) == 2


def test_error_scan_stops_after_the_last_field_that_can_hold_an_error() -> None:
    """The metrics scan does not walk (nor check) what follows the last error-bearing field:
    a response damaged only there still has its error codes counted."""
    body = produce_response(9, {"t": [(0, NOT_LEADER)]})
    data, offset = response(PRODUCE, 9, body)
    stats = TrafficStats()
    stats.response(stats.broker(1), PRODUCE, 9, data[:-3], offset, 0.001, 0.00001)       # throttle_time_ms cut short
    stats.response(stats.broker(1), PRODUCE, 9, data + b"\0\0", offset, 0.001, 0.00001)  # bytes left over
    assert stats.broker(1).errors == {("produce", "NOT_LEADER_OR_FOLLOWER"): 2}
    assert stats.undecodable_responses == {}


def test_scanning_can_be_turned_off() -> None:
    body = produce_response(9, {"t": [(0, NOT_LEADER)]})
    stats = stats_after(PRODUCE, 9, body, scan_responses=False)
    assert stats.broker(1).errors == {}
    assert stats.broker(1).responses == {("produce", 9): 1}


def test_every_response_kind_scans_its_default_body() -> None:
    """No (api, version) response the codec knows trips the scanner: defaults scan to no error."""
    kinds = [(k, v) for k, v, d in all_message_kinds() if d is RESP]
    assert len(kinds) > 300
    for api_key, version in kinds:
        found = scan(api_key, version, default_body(api_key, version, RESP))
        assert all(not c for _, _, c in found.entries), (api_key, version, found.entries)


# -- error classes: routine codes are not failures ------------------------------------------------
@pytest.mark.parametrize(("api_key", "version", "api", "error", "klass"), [
    (JOIN_GROUP, 5, "join_group", "MEMBER_ID_REQUIRED", "routine"),
    (HEARTBEAT, 4, "heartbeat", "REBALANCE_IN_PROGRESS", "routine"),
    (FIND_COORDINATOR, 3, "find_coordinator", "COORDINATOR_LOAD_IN_PROGRESS", "retriable"),
    (JOIN_GROUP, 0, "join_group", "UNKNOWN_MEMBER_ID", "error"),
    (API_VERSIONS, 3, "api_versions", "UNSUPPORTED_VERSION", "error"),
])
def test_responses_with_errors_by_class(api_key: int, version: int, api: str, error: str, klass: str) -> None:
    body = default_body(api_key, version, RESP)
    body["error_code"] = code(error)
    assert stats_after(api_key, version, body).broker(1).responses_with_errors == {(api, klass): 1}


def test_a_response_counts_once_under_its_worst_class() -> None:
    """Per-partition codes can outnumber responses; responses_with_errors never does."""
    body = produce_response(9, {"orders": [(i, code("NOT_LEADER_OR_FOLLOWER")) for i in range(5)],
                                "audit": [(0, code("TOPIC_AUTHORIZATION_FAILED"))]})
    stats = stats_after(PRODUCE, 9, body)
    assert sum(stats.broker(1).errors.values()) == 6
    assert stats.broker(1).responses_with_errors == {("produce", "error"): 1}
