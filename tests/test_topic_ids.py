"""Topic ids learnt once (kproxy.protocol.topic_ids) for the rules, the capture and the metrics alike,
read from Metadata answers by a reader that decodes only (id, name) pairs: what a full decode gives."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.capture.record_builder import RecordBuilder
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.headers import decode_request_header, response_body_offset
from kproxy.protocol.message_schemas import MessageType, supported_versions
from kproxy.protocol.messages import decode_body
from kproxy.protocol.topic_ids import TopicIdNames, topic_id_pairs
from kproxy.rules.frame_facts import FrameFacts

METADATA, FETCH = 3, 1
ORDERS = uuid.UUID("6b1d2c3e-0000-4000-8000-000000000001")


def _answer(version: int = 12, topic_id: uuid.UUID = ORDERS, name: str = "orders") -> bytes:
    return response_frame(METADATA, version, 1, brokers=[], topics=[
        {"error_code": 0, "name": name, "topic_id": topic_id, "partitions": []}])


def test_learn_metadata_counts_names_and_says_when_it_cannot_read() -> None:
    names = TopicIdNames()
    assert names.learn_metadata(_answer(version=9), 9) == 0  # no ids before v10: nothing to read
    assert names.learn_metadata(_answer()[:-5], 12) is None  # cut short: unreadable, nothing learnt
    assert names == {}
    assert names.learn_metadata(_answer(), 12) == 1
    assert names.learn_metadata(_answer(name="orders-2"), 12, body_offset=9) == 1  # where the body starts, given
    assert names == {ORDERS: "orders-2"}
    assert names.learn_metadata(_answer(), 12) == 1
    assert names == {ORDERS: "orders"}
    assert names.name(ORDERS) == "orders" and names.name("t") == "t" and names.name(None) is None
    other = uuid.UUID(int=7)
    assert names.name(other) == str(other), "an id not learnt reads as its text"


def test_forgetting_the_oldest_is_counted() -> None:
    names = TopicIdNames(cap=2)
    ids = [uuid.UUID(int=i) for i in (1, 2, 3)]
    for i, topic_id in enumerate(ids):
        names.learn(topic_id, f"t{i}")
    names.learn(ids[2], "t2")  # known already: nothing forgotten
    assert dict(names) == {ids[1]: "t1", ids[2]: "t2"}
    assert names.forgotten == 1


def test_one_map_serves_the_rules_facts_and_the_capture() -> None:
    names = TopicIdNames()
    assert names.learn_metadata(_answer(), 12) == 1
    fetch = request_frame(FETCH, 13, 2, topics=[{"topic_id": ORDERS, "partitions": [{"partition": 0}]}])
    header = decode_request_header(memoryview(fetch)[4:])
    assert dict(FrameFacts(fetch, header, topic_names=names).topics()) == {"orders": frozenset({0})}
    builder = RecordBuilder(names)
    assert builder.topics is names
    assert builder.topics.name(ORDERS) == "orders"


def test_the_same_metadata_answer_again_is_not_decoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients refresh metadata with the same answer: a big one is decoded once (a full decode of
    100,000 partitions holds the event loop ~0.7 s), unless it differs or ids were forgotten since."""
    import kproxy.protocol.topic_ids as topic_ids

    decoded: list[int] = []
    real = topic_ids.topic_id_pairs

    def counting(*args: object, **kwargs: object) -> object:
        decoded.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(topic_ids, "topic_id_pairs", counting)
    names = TopicIdNames(cap=1)
    answer = _answer()
    again = answer[:8].replace(answer[4:8], b"\x00\x00\x00\x63") + answer[8:]  # another correlation id
    assert names.learn_metadata(answer, 12) == 1
    assert names.learn_metadata(again, 12) == 1
    assert len(decoded) == 1, "the same answer was decoded twice"
    other = _answer(topic_id=uuid.UUID(int=9), name="payments")
    assert names.learn_metadata(other, 12) == 1  # a different answer: read, and ORDERS forgotten (cap 1)
    assert names == {uuid.UUID(int=9): "payments"}
    assert names.learn_metadata(answer, 12) == 1  # read again: what it taught was forgotten
    assert names == {ORDERS: "orders"} and len(decoded) == 3


METADATA_VERSIONS = range(10, supported_versions(METADATA)[1] + 1)  # type: ignore[index]
_partition = st.fixed_dictionaries({"partition_index": st.integers(0, 2**31 - 1), "leader_id": st.integers(-1, 9),
                                    "replica_nodes": st.lists(st.integers(0, 9), max_size=4),
                                    "isr_nodes": st.lists(st.integers(0, 9), max_size=4),
                                    "offline_replicas": st.lists(st.integers(0, 9), max_size=2)})
_topic = st.fixed_dictionaries({"error_code": st.sampled_from([0, 3, 29]),
                                "name": st.one_of(st.none(), st.text(min_size=0, max_size=30)),
                                "topic_id": st.uuids(), "is_internal": st.booleans(),
                                "partitions": st.lists(_partition, max_size=4)})


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(list(METADATA_VERSIONS)), topics=st.lists(_topic, max_size=6),
       brokers=st.lists(st.fixed_dictionaries({"node_id": st.integers(0, 9), "host": st.text(max_size=20),
                                               "port": st.integers(1, 65535), "rack": st.none()}), max_size=3),
       cut=st.one_of(st.none(), st.integers(1, 40)))
def test_the_pairs_reader_finds_what_a_full_decode_finds(version: int, topics: list[dict[str, Any]],
                                                         brokers: list[dict[str, Any]], cut: int | None) -> None:
    frame = response_frame(METADATA, version, 1, brokers=brokers, topics=topics, cluster_id="c")
    offset = response_body_offset(frame, METADATA, version)
    if cut is not None:
        frame = frame[:max(len(frame) - cut, offset)]  # the body cut short (the header whole)
    found = topic_id_pairs(frame, offset, version)
    try:
        body = decode_body(METADATA, version, MessageType.RESPONSE, frame, offset)
    except Exception:
        assert cut is not None
        # Cut short: unreadable, unless the cut fell only in what the reader skips and does not check
        # (nothing is; trailing tagged fields are read): never pairs a full decode would not give.
        assert found is None
        return
    assert found == [(t["topic_id"], t["name"]) for t in body["topics"] if t["name"] is not None]


def test_the_pairs_reader_refuses_versions_without_a_schema() -> None:
    assert topic_id_pairs(_answer(), 9, 99) is None
