"""kproxy/rules/apply.py: a rule's actions done to request and response frames (sans-IO), and the
record faults against the real Tansu broker and kafka-python's record parser."""

from __future__ import annotations

import socket
import struct
import textwrap
import uuid
from typing import Any

import kafka.errors as kafka_errors
import pytest
import yaml
from kafka import TopicPartition
from kafka.consumer.fetcher import Fetcher
from kafka.record import MemoryRecords

from kproxy.protocol import decode_request, decode_response
from kproxy.protocol.errors import CorruptRecordsError
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.headers import decode_response_header
from kproxy.protocol.record_faults import CorruptTarget, corrupt_records, duplicate_records
from kproxy.protocol.records import Record, decode_all, encode_batch_v2
from kproxy.rules import RulesError, load_text
from kproxy.rules.actions.base import RuleAction
from kproxy.rules.actions.rewrite_addresses import RewriteAddresses, address_map
from kproxy.rules.apply import apply_to_request, apply_to_response, selector
from kproxy.testing import Broker
from tests.support.e2e import create_topic, unique
from tests.test_protocol_mutations import (
    api_versions_frame,
    fetch_response,
    metadata_frame,
    produce_request,
    produce_response,
    records_of,
)
from tests.test_rules_load import VALIDATOR

PRODUCE, FETCH, METADATA, API_VERSIONS = 0, 1, 3, 18
CORRUPT_MESSAGE, NOT_LEADER_OR_FOLLOWER, POLICY_VIOLATION = 2, 6, 44


def actions(yaml_actions: str, match: str = "{}") -> tuple[RuleAction, ...]:
    text = f"rules:\n  - id: r\n    match: {match}\n    actions:\n" + textwrap.indent(
        textwrap.dedent(yaml_actions).strip(), "      ") + "\n"
    (rule,) = load_text(text).rules
    return rule.actions


def response_body(api_key: int, version: int, frame: bytes) -> dict[str, Any]:
    return decode_response(frame[4:], api_key, version).body


# ------------------------------------------------------------------------------ inject_error


@pytest.mark.parametrize("version", [3, 9, 12])
def test_respond_answers_locally_with_the_request_correlation_id(version: int) -> None:
    frame = produce_request(version, encode_batch_v2([Record(0, 1, None, b"v", [])]))
    out = apply_to_request(actions("- inject_error: {error: NOT_LEADER_OR_FOLLOWER}", "{api: produce}"), frame)
    assert not out.forward and out.answer is not None and out.frame is frame
    got = decode_response(out.answer[4:], PRODUCE, version)
    assert got.header.correlation_id == 77
    codes = {p["error_code"] for t in got.body["responses"] for p in t["partition_responses"]}
    assert codes == {NOT_LEADER_OR_FOLLOWER}
    assert out.notes == ("inject_error NOT_LEADER_OR_FOLLOWER respond",)


def test_produce_acks_0_never_gets_an_answer() -> None:
    frame = produce_request(9, encode_batch_v2([Record(0, 1, None, b"v", [])]), acks=0)
    out = apply_to_request(actions("- inject_error: {error: 6}", "{api: produce}"), frame)
    assert not out.forward and out.answer is None
    assert "acks=0" in out.notes[0]


def test_replace_rewrites_the_broker_codes_of_chosen_partitions() -> None:
    frame = produce_response(9)
    acts = actions("- inject_error: {error: POLICY_VIOLATION, mode: replace, partitions: [2], message: no}",
                   "{api: produce}")
    assert apply_to_request(acts, produce_request(9)).forward  # replace acts on the response only
    out = apply_to_response(acts, frame, PRODUCE, 9)
    parts = response_body(PRODUCE, 9, out.frame)["responses"][0]["partition_responses"]
    assert [p["error_code"] for p in parts] == [0, 0, POLICY_VIOLATION]
    assert parts[2]["error_message"] == "no"
    assert out.notes == ("inject_error POLICY_VIOLATION replace: 1 changed",)


# ----------------------------------------------------------------------------------- records


def test_record_actions_act_on_produce_requests_and_fetch_responses_only() -> None:
    batch = encode_batch_v2([Record(0, 1, b"k", b"\0\0\0\0\1v", [])])
    acts = actions("- corrupt_records: {target: value}\n- duplicate_records: {copies: 1}\n"
                   "- invalid_schema_id: {schema_id: 5}", "{api: [produce, fetch]}")
    request = produce_request(9, batch)
    out = apply_to_request(acts, request)
    assert out.forward and out.frame is not request
    for records in records_of(PRODUCE, 9, out.frame):
        # value flipped first (no longer wire format), so the schema id is left alone
        assert decode_all(records) == [Record(0, 1, b"k", b"\xff\0\0\0\1v", [])] * 2
    assert len(out.notes) == 2 and out.notes[0].startswith("corrupt_records value")
    fetch = fetch_response(12, batch)
    assert apply_to_response(acts, fetch, FETCH, 12).frame is not fetch
    produce_answer = produce_response(9)
    assert apply_to_response(acts, produce_answer, PRODUCE, 9).frame is produce_answer
    fetch_request = request_frame(FETCH, 12, 1)
    assert apply_to_request(acts, fetch_request).frame is fetch_request


def test_selector_from_the_match_limits_record_faults_to_its_topics() -> None:
    (rule,) = load_text("rules:\n  - id: r\n    match: {api: fetch, topic: 'ev*', partition: 1}\n"
                        "    actions: [corrupt_records]\n").rules
    batch = encode_batch_v2([Record(0, 1, None, b"v", [])])
    frame = response_frame(FETCH, 12, 1, responses=[
        {"topic": name, "partitions": [{"partition_index": p, "records": batch} for p in range(2)]}
        for name in ("events", "orders")])
    out = apply_to_response(rule.actions, frame, FETCH, 12, only=selector(rule.match))
    body = response_body(FETCH, 12, out.frame)
    changed = [(t["topic"], p["partition_index"]) for t in body["responses"] for p in t["partitions"]
               if p["records"] != batch]
    assert changed == [("events", 1)]
    by_id = selector(rule.match, {uuid.UUID(int=1): "events"})
    assert by_id is not None and by_id(uuid.UUID(int=1), 1) and not by_id(uuid.UUID(int=2), 1)


# -------------------------------------------------------------------- metadata, versions, throttle


def test_mutate_metadata_from_a_rule_file() -> None:
    acts = actions("""
        - mutate_metadata:
            hide_brokers: [3]
            move_leader: [{topic: orders, partition: 0, to: 2}]
            shrink_isr: [{topic: orders, partition: 1, to: [2]}]
            hide_partitions: [{topic: other, partition: 2}]
        """, "{api: metadata}")
    out = apply_to_response(acts, metadata_frame(12), METADATA, 12)
    body = response_body(METADATA, 12, out.frame)
    assert [b["node_id"] for b in body["brokers"]] == [1, 2]
    orders = body["topics"][0]["partitions"]
    assert [p["leader_id"] for p in orders] == [2, 2, -1]
    assert orders[1]["isr_nodes"] == [2]
    other = body["topics"][1]["partitions"]
    assert [(p["partition_index"], p["leader_id"], p["error_code"]) for p in other][2] == (2, -1, 5)


def test_downgrade_and_throttle_on_api_versions() -> None:
    acts = actions("- downgrade_api_versions: {produce: 7, fetch: 11}", "{api: api_versions}")
    frame = api_versions_frame(3)
    out = apply_to_response(acts, frame, API_VERSIONS, 3, throttle_time_ms=250)
    body = response_body(API_VERSIONS, 3, out.frame)
    assert [e["max_version"] for e in body["api_keys"]] == [7, 11, 12]
    assert body["throttle_time_ms"] == 250
    assert out.notes == ("downgrade_api_versions: 2 changed", "throttle throttle_time_ms=250: 1 changed")


def test_an_action_that_cannot_apply_leaves_the_frame_and_says_why() -> None:
    frame = response_frame(PRODUCE, 0, 4)  # Produce v0 answers have no throttle_time_ms
    out = apply_to_response((), frame, PRODUCE, 0, throttle_time_ms=100)
    assert out.frame is frame and "skipped" in out.notes[0]
    garbage = b"\0\0\0\3\0\0\0"
    request = apply_to_request(actions("- inject_error: {error: 6}"), garbage)
    assert request.frame is garbage and request.forward and "unreadable" in request.notes[0]
    unchanged = metadata_frame(9)
    assert apply_to_response(actions("- delay: {ms: 5}"), unchanged, METADATA, 9).frame is unchanged


# ------------------------------------------------------------------------------------ rewrite


def test_rewrite_request_fields_and_topic_prefixes() -> None:
    acts = actions("- rewrite: {set: {acks: 1, client_id: other}, topic_prefix: {'orders': 'staging-orders'}}",
                   "{api: produce}")
    out = apply_to_request(acts, produce_request(9))
    got = decode_request(out.frame[4:])
    assert got.header.client_id == "other" and got.body["acks"] == 1
    assert got.body["topic_data"][0]["name"] == "staging-orders"


def test_rewrite_response_direction_leaves_requests_alone() -> None:
    acts = actions("- rewrite: {direction: response, set: {throttle_time_ms: 9}}", "{api: metadata}")
    request = request_frame(METADATA, 12, 1)
    assert apply_to_request(acts, request).frame is request
    out = apply_to_response(acts, metadata_frame(12), METADATA, 12)
    assert response_body(METADATA, 12, out.frame)["throttle_time_ms"] == 9


def test_rewrite_addresses_by_map_and_by_pattern() -> None:
    by_map = actions("- rewrite_addresses: {map: {'b1:9091': 'proxy-a:1'}}")
    by_pattern = actions("- rewrite_addresses: {pattern: '^b(\\d):90', replacement: 'node-\\1.example:80'}")
    first = response_body(METADATA, 12, apply_to_response(by_map, metadata_frame(12), METADATA, 12).frame)
    assert [(b["host"], b["port"]) for b in first["brokers"]] == [("proxy-a", 1), ("b2", 9092), ("b3", 9093)]
    second = response_body(METADATA, 12, apply_to_response(by_pattern, metadata_frame(12), METADATA, 12).frame)
    assert [(b["host"], b["port"]) for b in second["brokers"]] == [
        ("node-1.example", 8091), ("node-2.example", 8092), ("node-3.example", 8093)]
    mapping = address_map(RewriteAddresses(mapping=(("[::1]:9092", "h:1"),)))
    assert mapping("::1", 9092) == ("h", 1) and mapping("::1", 9093) is None


# ------------------------------------------------------------------- the real broker, real parser


def _exchange(bootstrap: str, frame: bytes) -> bytes:
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(frame)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return buf


def _produce(bootstrap: str, topic: str, records: bytes) -> int:
    frame = request_frame(PRODUCE, 9, 21, acks=-1, timeout_ms=5000,
                          topic_data=[{"name": topic, "partition_data": [{"index": 0, "records": records}]}])
    answer = _exchange(bootstrap, frame)
    body = decode_response(answer[4:], PRODUCE, 9).body
    return int(body["responses"][0]["partition_responses"][0]["error_code"])


def _fetch(bootstrap: str, topic: str) -> bytes:
    frame = request_frame(FETCH, 11, 22, replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=1 << 20,
                          isolation_level=0, topics=[{"topic": topic, "partitions": [
                              {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}])
    return _exchange(bootstrap, frame)


def test_a_produce_with_a_corrupted_batch_never_reaches_a_consumer_intact(tansu: Broker) -> None:
    """Sent over a raw socket straight to Tansu. Kafka answers CORRUPT_MESSAGE; Tansu 0.6 stores the batch
    without checking its CRC, and then every consumer's CRC check fails on it. Either is the client-visible
    effect of a corrupted batch; what the broker did is asserted exactly."""
    topic = unique("corrupt")
    create_topic(tansu.bootstrap, topic, partitions=1)
    batch = encode_batch_v2([Record(i, 1_700_000_000_000, None, b"value-%d" % i, []) for i in range(3)])
    frame = produce_request(9, batch, topics=(topic,))
    broken = records_of(PRODUCE, 9, corrupt_records(frame, PRODUCE, 9, CorruptTarget.CRC).frame)[0]
    code = _produce(tansu.bootstrap, topic, broken)
    assert code in (CORRUPT_MESSAGE, 0)
    if code == 0:
        stored = records_of(FETCH, 11, _fetch(tansu.bootstrap, topic))[0]
        assert stored == broken  # byte for byte what was sent, CRC still wrong
        assert not MemoryRecords(stored).next_batch().validate_crc()
        with pytest.raises(CorruptRecordsError):
            decode_all(stored)


def test_a_value_flipped_with_a_valid_crc_is_stored_and_read_back_flipped(tansu: Broker) -> None:
    topic = unique("flipped")
    create_topic(tansu.bootstrap, topic, partitions=1)
    batch = encode_batch_v2([Record(i, 1_700_000_000_000, None, b"value-%d" % i, []) for i in range(3)])
    frame = produce_request(9, batch, topics=(topic,))
    flipped = records_of(PRODUCE, 9, corrupt_records(frame, PRODUCE, 9, CorruptTarget.VALUE).frame)[0]
    assert _produce(tansu.bootstrap, topic, flipped) == 0
    answer = _fetch(tansu.bootstrap, topic)
    assert decode_response_header(answer[4:], FETCH, 11).correlation_id == 22
    stored = records_of(FETCH, 11, answer)[0]
    assert MemoryRecords(stored).next_batch().validate_crc()
    assert [r.value for r in decode_all(stored)] == [b"\x89alue-%d" % i for i in range(3)]


def _kafka_python_consume(records: bytes, topic: str) -> list[bytes]:
    """What kafka-python's consumer makes of a Fetch partition's records (its Fetcher's own parser)."""
    parsed = Fetcher.PartitionRecords(0, TopicPartition(topic, 0), MemoryRecords(records), check_crcs=True)
    return [r.value for r in parsed.take()]


def test_fetch_response_from_tansu_corrupted_raises_kafka_pythons_crc_error(tansu: Broker) -> None:
    topic = unique("fetchcrc")
    create_topic(tansu.bootstrap, topic, partitions=1)
    batch = encode_batch_v2([Record(i, 1_700_000_000_000, b"k", b"v%d" % i, []) for i in range(5)])
    assert _produce(tansu.bootstrap, topic, batch) == 0
    answer = _fetch(tansu.bootstrap, topic)
    assert _kafka_python_consume(records_of(FETCH, 11, answer)[0], topic) == [b"v%d" % i for i in range(5)]
    broken = records_of(FETCH, 11, corrupt_records(answer, FETCH, 11).frame)[0]
    with pytest.raises(kafka_errors.CorruptRecordError, match="crc"):
        _kafka_python_consume(broken, topic)
    # A duplicated batch passes the CRC check and the parser yields its records twice: it drops records
    # below the fetch offset only before the first one it keeps (itertools.dropwhile in PartitionRecords).
    doubled = records_of(FETCH, 11, duplicate_records(answer, FETCH, 11).frame)[0]
    assert _kafka_python_consume(doubled, topic) == [b"v%d" % i for i in range(5)] * 2


def test_a_duplicated_produce_batch_is_stored_twice(tansu: Broker) -> None:
    """Without an idempotent producer nothing tells the copies apart: the broker appends both
    (Kafka 3.x refuses more than one batch per partition in Produce v3+ with INVALID_RECORD, 87)."""
    topic = unique("dup")
    create_topic(tansu.bootstrap, topic, partitions=1)
    batch = encode_batch_v2([Record(i, 1_700_000_000_000, None, b"v%d" % i, []) for i in range(3)])
    frame = produce_request(9, batch, topics=(topic,))
    doubled = records_of(PRODUCE, 9, duplicate_records(frame, PRODUCE, 9).frame)[0]
    code = _produce(tansu.bootstrap, topic, doubled)
    assert code in (0, 87)
    if code == 0:
        stored = decode_all(records_of(FETCH, 11, _fetch(tansu.bootstrap, topic))[0])
        assert [(r.offset, r.value) for r in stored] == [(i, b"v%d" % (i % 3)) for i in range(6)]


def test_rewrite_maps_scalar_values_by_a_table() -> None:
    text = """
        - rewrite:
            map: {acks: {-1: 1}, "topic_data[].partition_data[].index": {1: 5, 7: 8}}
        """
    acts = actions(text, "{api: produce}")
    document = yaml.safe_load("rules:\n  - id: r\n    match: {api: produce}\n    actions:\n"
                              + textwrap.indent(textwrap.dedent(text).strip(), "      "))
    assert not list(VALIDATOR.iter_errors(document))  # the JSON Schema agrees with the loader
    got = decode_request(apply_to_request(acts, produce_request(9, acks=-1)).frame[4:]).body
    assert got["acks"] == 1 and [p["index"] for p in got["topic_data"][0]["partition_data"]] == [0, 5]
    assert decode_request(apply_to_request(acts, produce_request(9, acks=0)).frame[4:]).body["acks"] == 0


def test_rewrite_map_paths_are_checked_like_set_paths() -> None:
    with pytest.raises(RulesError, match="no field 'ack'"):
        actions("- rewrite: {map: {ack: {0: 1}}}", "{api: produce}")
