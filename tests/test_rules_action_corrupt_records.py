"""The ``corrupt_records`` action (kproxy/rules/actions/corrupt_records.py) through its interface:
its edits of real frames (limited to the partitions its rule selects), in a real Session, and what
a real broker and client make of them. The byte-level edits themselves: tests/test_protocol_mutations.py."""

from __future__ import annotations

import uuid

import kafka.errors as kafka_errors
import pytest
from kafka.record import MemoryRecords

from kproxy.protocol import encode_request, frame
from kproxy.protocol.errors import CorruptRecordsError
from kproxy.protocol.frame_builder import request_body, response_frame
from kproxy.protocol.headers import RequestHeader, decode_response_header
from kproxy.protocol.record_faults import CorruptTarget, corrupt_records, duplicate_records
from kproxy.protocol.records import Record, decode_all, encode_batch_v2
from kproxy.rules import load_text
from kproxy.rules.apply import apply_to_response, selector
from kproxy.testing import Broker
from tests.support.e2e import create_topic, unique
from tests.test_protocol_mutations import produce_request, records_of
from tests.test_rules_apply import (
    CORRUPT_MESSAGE,
    FETCH,
    PRODUCE,
    _fetch,
    _kafka_python_consume,
    _produce,
    response_body,
)
from tests.test_rules_session import Driver, rules


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


def test_an_edited_request_goes_upstream_not_the_chunk_it_came_in() -> None:
    from kproxy.protocol.records import Record, encode_batch_v2

    batch = encode_batch_v2([Record(0, 1_700_000_000_000, b"k", b"v")])
    body = request_body(PRODUCE, 9, transactional_id=None, acks=-1, timeout_ms=1500,
                        topic_data=[{"name": "orders", "partition_data": [{"index": 0, "records": batch}]}])
    original = frame(encode_request(RequestHeader(PRODUCE, 9, 1, "producer-1", 2), body))
    d = Driver(rules("corrupt_records: {target: crc}", "{api: produce}"))
    d.client(original)  # the chunk holds exactly this one frame
    [sent] = d.upstream
    assert len(sent) == len(original) and sent != original
