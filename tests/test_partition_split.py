"""kproxy/protocol/partition_split.py: a rule's error on the topic-partitions it selects only.

For every API with a topics -> partitions request mirrored in its response, at its lowest and
highest version with that layout: the request split (the rest keeps its order, topics left
empty are dropped), and the broker's answer merged (or, read-only APIs, edited in place) equals
what a broker would answer when those partitions failed: the broker's entries for the others,
error entries for the selected, every partition of the request in the request's order.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from kproxy.protocol.codes import ApiKey
from kproxy.protocol.error_response import build_error_body
from kproxy.protocol.frame_builder import request_frame
from kproxy.protocol.headers import (
    ResponseHeader,
    decode_request_header,
    encode_response_header,
    response_header_version,
)
from kproxy.protocol.message_schemas import MessageType, supported_versions
from kproxy.protocol.messages import Body, decode_body, default_struct, require_codec
from kproxy.protocol.partition_split import (
    READ_ONLY_APIS,
    Layout,
    layout,
    replace_entries,
    replace_selected_codes,
    split_request,
)
from kproxy.protocol.topic_ids import TopicIdNames
from kproxy.rules import load_text
from kproxy.rules.actions.base import LocalAnswer, PartAnswer
from kproxy.rules.actions.inject_error import InjectError
from kproxy.rules.apply import selector

NOT_LEADER = 6
APIS = (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH,
        ApiKey.DELETE_RECORDS, ApiKey.OFFSET_FOR_LEADER_EPOCH, ApiKey.TXN_OFFSET_COMMIT,
        ApiKey.ADD_PARTITIONS_TO_TXN)
IDS = {"A": uuid.UUID(int=0xA), "B": uuid.UUID(int=0xB), "A2": uuid.UUID(int=0xA2)}
NAMES = TopicIdNames()
for _name, _id in IDS.items():
    NAMES.learn(_id, _name)
# The request: topic A partitions 0 and 1, B partition 0, A2 partition 2. The rule: `topic: "A*"`,
# partitions 0 and 2: A-0 and A2-2 are selected, A-1 and B-0 are not, and A2 is left empty.
TOPICS = (("A", (0, 1)), ("B", (0,)), ("A2", (2,)))
CHOSEN = {("A", 0), ("A2", 2)}


def _versions(api_key: int) -> list[int]:
    span = supported_versions(api_key)
    assert span is not None
    with_layout = [v for v in range(span[0], span[1] + 1) if layout(api_key, v) is not None]
    return sorted({with_layout[0], with_layout[-1]})


CASES = [pytest.param(int(k), v, id=f"{k.name.lower()}-v{v}") for k in APIS for v in _versions(k)]


def test_every_listed_api_has_a_layout_and_only_offset_fetch_v8_on_loses_it() -> None:
    assert [k for k in APIS if not _versions(k)] == []
    assert layout(ApiKey.OFFSET_FETCH, 8) is None  # groups -> topics -> partitions: not top-level
    assert layout(ApiKey.METADATA, 12) is None  # no partitions in the request
    lay = layout(ApiKey.FETCH, 18)
    assert lay is not None and lay.request_topics == "topics"  # not forgotten_topics_data


def _topic(lay: Layout, name: str) -> Any:
    return IDS[name] if lay.request_topic == "topic_id" else name


def _name(topic: Any) -> str:
    return next(n for n, i in IDS.items() if i == topic) if isinstance(topic, uuid.UUID) else str(topic)


def _request(api_key: int, version: int, lay: Layout, topics: Any = TOPICS, **values: Any) -> bytes:
    codec = require_codec(api_key, version, MessageType.REQUEST)
    field = next(f for f in codec.schema.fields if f.name == lay.request_topics)
    assert field.fields is not None
    parts_field = next(f for f in field.fields if f.name == lay.request_partitions)
    entries = []
    for name, parts in topics:
        entry = default_struct(field.fields)
        entry[lay.request_topic] = _topic(lay, name)
        if lay.request_index is None:
            entry[lay.request_partitions] = list(parts)
        else:
            assert parts_field.fields is not None
            entry[lay.request_partitions] = [{**default_struct(parts_field.fields), lay.request_index: p}
                                             for p in parts]
        entries.append(entry)
    values.setdefault("acks", -1)
    return request_frame(api_key, version, 7, **{lay.request_topics: entries}, **values)


def _request_body(frame: bytes) -> Body:
    header = decode_request_header(memoryview(frame)[4:])
    return decode_body(header.api_key, header.api_version, MessageType.REQUEST, frame, 4 + header.size)


def _broker_answer(api_key: int, version: int, request: Body, *, reverse: bool = False) -> Body:
    """What a broker answers without errors: every partition the request names, its data marked."""
    lay = layout(api_key, version)
    assert lay is not None
    body = build_error_body(api_key, version, request, NOT_LEADER, partitions={-1})  # no code set
    for topic in body[lay.response_topics]:
        for p in topic[lay.response_partitions]:
            p["error_code" if "error_code" in p else "partition_error_code"] = 0
            for mark in ("base_offset", "high_watermark", "offset", "end_offset", "committed_offset", "low_watermark"):
                if mark in p:
                    p[mark] = 1000 + p[lay.response_index]
    if reverse:
        body[lay.response_topics].reverse()
    return body


def _frame(api_key: int, version: int, body: Body) -> bytes:
    out = bytearray(b"\0\0\0\0")
    out += encode_response_header(ResponseHeader(7, response_header_version(api_key, version)))
    require_codec(api_key, version, MessageType.RESPONSE).encode_into(out, body)
    out[:4] = (len(out) - 4).to_bytes(4, "big")
    return bytes(out)


def _decode(api_key: int, version: int, frame: bytes) -> Body:
    from kproxy.protocol.headers import response_body_offset

    return decode_body(api_key, version, MessageType.RESPONSE, frame,
                       response_body_offset(frame, api_key, version, whole=True))


def _expected(api_key: int, version: int, request: Body) -> Body:
    """The oracle: the broker's entries, those of the selected partitions taken from an answer that
    fails every partition (what kproxy answers locally), in the request's order."""
    lay = layout(api_key, version)
    assert lay is not None
    good = _broker_answer(api_key, version, request)
    bad = build_error_body(api_key, version, request, NOT_LEADER,
                           partitions={p for _, parts in TOPICS for p in parts})
    for topic_good, topic_bad in zip(good[lay.response_topics], bad[lay.response_topics], strict=True):
        name = _name(topic_good[lay.response_topic])
        parts = topic_good[lay.response_partitions]
        for i, p in enumerate(parts):
            if (name, p[lay.response_index]) in CHOSEN:
                parts[i] = topic_bad[lay.response_partitions][i]
    return good


def _chosen(topic: Any, partition: int) -> bool:
    return (_name(topic), partition) in CHOSEN


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_split_then_merge_is_what_a_broker_answers_with_those_partitions_failed(api_key: int, version: int) -> None:
    lay = layout(api_key, version)
    assert lay is not None
    frame = _request(api_key, version, lay)
    full = _request_body(frame)
    split = split_request(frame, _chosen)
    assert split is not None
    assert [(_name(t), p) for t, p in split.selected] == [("A", 0), ("A2", 2)]
    assert split.request is not None
    rest = _request_body(split.request)
    # The rest: A-1 and B-0, in order; A2 left empty is dropped; the other fields as they were.
    kept = [(_name(t[lay.request_topic]),
             [p if lay.request_index is None else p[lay.request_index] for p in t[lay.request_partitions]])
            for t in rest[lay.request_topics]]
    assert kept == [("A", [1]), ("B", [0])]
    assert {k: v for k, v in rest.items() if k != lay.request_topics} == \
        {k: v for k, v in full.items() if k != lay.request_topics}
    # The broker answers the rest, in its own order; the merge restores the request's.
    answer = _frame(api_key, version, _broker_answer(api_key, version, rest, reverse=True))
    merged = split.merge(answer, NOT_LEADER)
    assert merged.changed == 2
    assert _decode(api_key, version, merged.frame) == _expected(api_key, version, full)


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_read_only_answers_have_the_selected_entries_replaced(api_key: int, version: int) -> None:
    lay = layout(api_key, version)
    assert lay is not None
    full = _request_body(_request(api_key, version, lay))
    answer = _frame(api_key, version, _broker_answer(api_key, version, full))
    replaced = replace_entries(answer, api_key, version, NOT_LEADER, _chosen)
    assert replaced.changed == 2
    assert _decode(api_key, version, replaced.frame) == _expected(api_key, version, full)


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_replace_mode_replaces_the_selected_codes_only(api_key: int, version: int) -> None:
    lay = layout(api_key, version)
    assert lay is not None
    full = _request_body(_request(api_key, version, lay))
    answer = _broker_answer(api_key, version, full)
    edited = _decode(api_key, version, replace_selected_codes(_frame(api_key, version, answer), api_key, version,
                                                              NOT_LEADER, _chosen).frame)
    codes = [(_name(t[lay.response_topic]), p[lay.response_index],
              p.get("error_code", p.get("partition_error_code")))
             for t in edited[lay.response_topics] for p in t[lay.response_partitions]]
    assert codes == [("A", 0, NOT_LEADER), ("A", 1, 0), ("B", 0, 0), ("A2", 2, NOT_LEADER)]
    for topic in edited[lay.response_topics]:  # the broker's other values are kept
        for p in topic[lay.response_partitions]:
            for mark in ("base_offset", "offset", "end_offset", "committed_offset", "low_watermark"):
                if mark in p:
                    assert p[mark] == 1000 + p[lay.response_index]


def test_nothing_selected_and_everything_selected() -> None:
    lay = layout(ApiKey.PRODUCE, 9)
    assert lay is not None
    frame = _request(ApiKey.PRODUCE, 9, lay)
    none = split_request(frame, lambda t, p: False)
    assert none is not None and none.selected == () and none.request is frame
    every = split_request(frame, lambda t, p: True)
    assert every is not None and len(every.selected) == 4 and every.request is None
    assert split_request(request_frame(ApiKey.METADATA, 12, 1, topics=[]), lambda t, p: True) is None


# ----------------------------------------------------------------------------- the action

RULE = """
rules:
  - id: a-only
    match: {topic: "A*", partition: [0, 2]}
    actions:
      - inject_error: {error: NOT_LEADER_OR_FOLLOWER}
"""


def _only() -> Any:
    rule = load_text(RULE).rules[0]
    return selector(rule.match, NAMES)


def _answer(frame: bytes) -> LocalAnswer | PartAnswer | str:
    action = load_text(RULE).rules[0].actions[0]
    assert isinstance(action, InjectError)
    return action.answer_request(frame, decode_request_header(memoryview(frame)[4:]), _only())


@pytest.mark.parametrize("version", [3, 9, 12, 13])
def test_produce_forwards_the_other_topics_and_merges_the_answer(version: int) -> None:
    lay = layout(ApiKey.PRODUCE, version)
    assert lay is not None
    frame = _request(ApiKey.PRODUCE, version, lay)
    answer = _answer(frame)
    assert isinstance(answer, PartAnswer) and answer.merge is not None
    assert "2 of 4 partitions" in answer.note
    rest = _request_body(answer.request)
    assert [_name(t[lay.request_topic]) for t in rest["topic_data"]] == ["A", "B"]
    broker = _frame(ApiKey.PRODUCE, version, _broker_answer(ApiKey.PRODUCE, version, rest))
    merged = _decode(ApiKey.PRODUCE, version, answer.merge[1](broker).frame)
    assert merged == _expected(ApiKey.PRODUCE, version, _request_body(frame))


def test_produce_acks_0_forwards_the_rest_and_drops_the_selected_unanswered() -> None:
    lay = layout(ApiKey.PRODUCE, 9)
    assert lay is not None
    answer = _answer(_request(ApiKey.PRODUCE, 9, lay, acks=0))
    assert isinstance(answer, PartAnswer) and answer.merge is None
    assert [t["name"] for t in _request_body(answer.request)["topic_data"]] == ["A", "B"]
    every = _answer(_request(ApiKey.PRODUCE, 9, lay, topics=(("A", (0,)),), acks=0))
    assert isinstance(every, LocalAnswer) and every.frame is None


def test_every_partition_selected_is_answered_locally_with_partition_codes_only() -> None:
    lay = layout(ApiKey.FETCH, 12)
    assert lay is not None
    answer = _answer(_request(ApiKey.FETCH, 12, lay, topics=(("A", (0,)), ("A2", (2, 0)))))
    assert isinstance(answer, LocalAnswer) and answer.frame is not None
    body = _decode(ApiKey.FETCH, 12, answer.frame)
    assert body["error_code"] == 0  # the request did not fail: its partitions did
    assert [p["error_code"] for t in body["responses"] for p in t["partitions"]] == [NOT_LEADER] * 3


def test_fetch_is_forwarded_whole_and_its_answer_edited() -> None:
    lay = layout(ApiKey.FETCH, 13)
    assert lay is not None
    frame = _request(ApiKey.FETCH, 13, lay, max_wait_ms=500, session_id=12, session_epoch=3)
    answer = _answer(frame)
    assert isinstance(answer, PartAnswer) and answer.merge is not None
    sent = _request_body(answer.request)
    assert answer.request is frame  # every partition: the fetch session stays whole
    broker = _broker_answer(ApiKey.FETCH, 13, sent)
    broker["session_id"] = 12
    for t in broker["responses"]:
        for p in t["partitions"]:
            p["records"] = b"\0" * 8
    edited = _decode(ApiKey.FETCH, 13, answer.merge[1](_frame(ApiKey.FETCH, 13, copy.deepcopy(broker))).frame)
    assert edited["session_id"] == 12
    got = {(_name(t["topic_id"]), p["partition_index"]): p for t in edited["responses"] for p in t["partitions"]}
    for key, p in got.items():
        if key in CHOSEN:
            assert (p["error_code"], p["records"], p["high_watermark"]) == (NOT_LEADER, b"", -1)
        else:
            assert (p["error_code"], p["records"], p["high_watermark"]) == (0, b"\0" * 8, 1000 + key[1])


def test_a_topic_id_kproxy_cannot_name_is_not_selected() -> None:
    lay = layout(ApiKey.FETCH, 13)
    assert lay is not None
    stranger = uuid.UUID(int=0xDEAD)
    frame = request_frame(ApiKey.FETCH, 13, 1, topics=[
        {"topic_id": stranger, "partitions": [{"partition": 0}]},
        {"topic_id": IDS["A"], "partitions": [{"partition": 0}]}])
    split = split_request(frame, _only())
    assert split is not None and split.selected == ((IDS["A"], 0),)
    assert _answer(request_frame(ApiKey.FETCH, 13, 1, topics=[
        {"topic_id": stranger, "partitions": [{"partition": 0}]}])) == \
        "inject_error NOT_LEADER_OR_FOLLOWER respond: skipped (no partition of the request is selected)"


def test_read_only_apis_are_the_ones_without_side_effects() -> None:
    assert {ApiKey(k).name for k in READ_ONLY_APIS if k in ApiKey._value2member_map_} >= {
        "FETCH", "LIST_OFFSETS", "OFFSET_FETCH", "OFFSET_FOR_LEADER_EPOCH"}
    assert not READ_ONLY_APIS & {ApiKey.PRODUCE, ApiKey.OFFSET_COMMIT, ApiKey.TXN_OFFSET_COMMIT,
                                 ApiKey.DELETE_RECORDS, ApiKey.ADD_PARTITIONS_TO_TXN}


# ------------------------------------------------------------------ through a session (the policy)

SESSION_RULES = """
rules:
  - id: orders-respond
    match: {api: produce, topic: "orders*"}
    actions:
      - inject_error: {error: NOT_LEADER_OR_FOLLOWER}
      - delay: {ms: 50}
  - id: orders-replace
    match: {api: list_offsets, topic: "orders*"}
    actions:
      - inject_error: {error: NOT_LEADER_OR_FOLLOWER, mode: replace}
"""


def _two_topic_produce(correlation_id: int, acks: int = -1) -> bytes:
    return request_frame(ApiKey.PRODUCE, 9, correlation_id, transactional_id=None, acks=acks, timeout_ms=1500,
                         topic_data=[{"name": "orders", "partition_data": [{"index": 0, "records": None}]},
                                     {"name": "payments", "partition_data": [{"index": 0, "records": None}]}])


def test_a_session_forwards_the_rest_merges_the_answer_and_reports_the_selected_topic_only() -> None:
    from collections import deque

    from kproxy.protocol.frame_builder import response_frame
    from tests.test_rules_session import Driver, body

    d = Driver(SESSION_RULES)
    d.live.recent = deque(maxlen=10)
    d.client(_two_topic_produce(1))
    assert len(d.upstream) == 1 and d.to_client == []
    sent = _request_body(d.upstream[0])
    assert [t["name"] for t in sent["topic_data"]] == ["payments"]
    d.broker(response_frame(ApiKey.PRODUCE, 9, 1, responses=[
        {"name": "payments", "partition_responses": [{"index": 0, "error_code": 0, "base_offset": 7}]}]))
    d.tick(0.05)  # the rule's delay holds the answer: delays stay per request
    (answer,) = d.to_client
    got = [(t["name"], p["error_code"], p["base_offset"])
           for t in body(ApiKey.PRODUCE, 9, answer)["responses"] for p in t["partition_responses"]]
    assert got == [("orders", NOT_LEADER, -1), ("payments", 0, 7)]
    assert d.live.counts.injected_errors[("produce", "NOT_LEADER_OR_FOLLOWER")] == 1
    assert d.live.counts.hits[("orders-respond", "inject_error", "false")] == 1
    records = [(r.action, r.topics) for r in d.live.recent or ()]
    # The error names the selected topic; the delay holds the whole request and names it whole.
    assert sorted(records) == [("delay", ("orders", "payments")), ("inject_error", ("orders",))]

    d.client(_two_topic_produce(2, acks=0))  # acks=0: the rest forwarded, nothing answered
    assert [t["name"] for t in _request_body(d.upstream[1])["topic_data"]] == ["payments"]
    d.tick(1)
    assert len(d.to_client) == 1


def test_a_session_replaces_the_selected_codes_only() -> None:
    from kproxy.protocol.frame_builder import response_frame
    from tests.test_rules_session import Driver, body

    d = Driver(SESSION_RULES)
    d.client(request_frame(ApiKey.LIST_OFFSETS, 7, 1, replica_id=-1, topics=[
        {"name": "orders", "partitions": [{"partition_index": 0}]},
        {"name": "payments", "partitions": [{"partition_index": 0}]}]))
    assert len(d.upstream) == 1
    d.broker(response_frame(ApiKey.LIST_OFFSETS, 7, 1, topics=[
        {"name": n, "partitions": [{"partition_index": 0, "error_code": 0, "offset": 42}]}
        for n in ("orders", "payments")]))
    (answer,) = d.to_client
    got = [(t["name"], p["error_code"], p["offset"])
           for t in body(ApiKey.LIST_OFFSETS, 7, answer)["topics"] for p in t["partitions"]]
    assert got == [("orders", NOT_LEADER, 42), ("payments", 0, 42)]
