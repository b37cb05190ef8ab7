"""kproxy/rules/apply.py: a rule's actions done to request and response frames (sans-IO), and the
record faults against the real Tansu broker and kafka-python's record parser."""

from __future__ import annotations

import socket
import struct
import textwrap
from typing import Any

from kafka import TopicPartition
from kafka.consumer.fetcher import Fetcher
from kafka.record import MemoryRecords

from kproxy.protocol import decode_response
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.records import Record, decode_all, encode_batch_v2
from kproxy.rules import load_text
from kproxy.rules.actions.base import RuleAction
from kproxy.rules.apply import apply_to_request, apply_to_response
from tests.test_protocol_mutations import (
    fetch_response,
    metadata_frame,
    produce_request,
    produce_response,
    records_of,
)

PRODUCE, FETCH, METADATA, API_VERSIONS = 0, 1, 3, 18
CORRUPT_MESSAGE, NOT_LEADER_OR_FOLLOWER, POLICY_VIOLATION = 2, 6, 44


def actions(yaml_actions: str, match: str = "{}") -> tuple[RuleAction, ...]:
    text = f"rules:\n  - id: r\n    match: {match}\n    actions:\n" + textwrap.indent(
        textwrap.dedent(yaml_actions).strip(), "      ") + "\n"
    (rule,) = load_text(text).rules
    return rule.actions


def response_body(api_key: int, version: int, frame: bytes) -> dict[str, Any]:
    return decode_response(frame[4:], api_key, version).body


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


# -------------------------------------------------------------------- metadata, versions, throttle


def test_an_action_that_cannot_apply_leaves_the_frame_and_says_why() -> None:
    frame = response_frame(PRODUCE, 0, 4)  # Produce v0 answers have no throttle_time_ms
    out = apply_to_response((), frame, PRODUCE, 0, throttle_time_ms=100)
    assert out.frame is frame and "skipped" in out.notes[0]
    garbage = b"\0\0\0\3\0\0\0"
    request = apply_to_request(actions("- inject_error: {error: 6}"), garbage)
    assert request.frame is garbage and request.forward and "unreadable" in request.notes[0]
    unchanged = metadata_frame(9)
    assert apply_to_response(actions("- delay: {ms: 5}"), unchanged, METADATA, 9).frame is unchanged


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


def _kafka_python_consume(records: bytes, topic: str) -> list[bytes]:
    """What kafka-python's consumer makes of a Fetch partition's records (its Fetcher's own parser)."""
    parsed = Fetcher.PartitionRecords(0, TopicPartition(topic, 0), MemoryRecords(records), check_crcs=True)
    return [r.value for r in parsed.take()]
