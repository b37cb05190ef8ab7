"""Topic keys on requests that name topics by id (Fetch v13+, KIP-516): ids learnt from Metadata v10+ answers.

Sans-IO, with real Sessions and real frames; tests/test_rules_e2e.py shows the same with librdkafka
against the real broker.
"""

from __future__ import annotations

import uuid
from collections import deque

from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.live_rules import LiveRules
from kproxy.policy.policy import RulePolicy, TopicIdLearningPolicy
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.topic_ids import TopicIdNames
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.session import Session
from kproxy.rules import load_text
from tests.support.clock import Clock
from tests.test_rules_session import Driver, body

METADATA, FETCH = 3, 1
NOT_LEADER_OR_FOLLOWER = 6
ORDERS = uuid.UUID("6b1d2c3e-0000-4000-8000-000000000001")

RULES = """
rules:
  - id: orders-fetch
    match: {api: fetch, topic: "orders*"}
    actions:
      - inject_error: {error: NOT_LEADER_OR_FOLLOWER}
"""


def metadata(correlation_id: int, version: int = 12) -> bytes:
    return request_frame(METADATA, version, correlation_id, topics=[{"name": "orders", "topic_id": ORDERS}])


def metadata_answer(correlation_id: int, version: int = 12, topic_id: uuid.UUID = ORDERS) -> bytes:
    return response_frame(METADATA, version, correlation_id, brokers=[], topics=[
        {"error_code": 0, "name": "orders", "topic_id": topic_id, "partitions": []}])


def fetch_by_id(correlation_id: int, topic_id: uuid.UUID = ORDERS) -> bytes:
    return request_frame(FETCH, 13, correlation_id, topics=[
        {"topic_id": topic_id, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}]}])


def fetch_codes(response: bytes) -> list[int]:
    return [p["error_code"] for t in body(FETCH, 13, response)["responses"] for p in t["partitions"]]


def test_topic_id_names_learn_from_metadata_v10_and_later_only() -> None:
    names = TopicIdNames()
    assert names.learn_metadata(metadata_answer(1, version=9), 9) == 0  # no topic ids before v10
    assert names.learn_metadata(metadata_answer(1, version=12)[:-5], 12) is None  # cut short: nothing learnt
    assert names.learn_metadata(metadata_answer(1, topic_id=uuid.UUID(int=0)), 12) == 1
    assert dict(names) == {}  # the zero id means "no id"
    assert names.learn_metadata(metadata_answer(1), 12) == 1
    assert dict(names) == {ORDERS: "orders"}


def test_topic_id_names_are_bounded_oldest_first() -> None:
    names = TopicIdNames(cap=2)
    ids = [uuid.UUID(int=i) for i in (1, 2, 3)]
    for i, topic_id in enumerate(ids):
        names.learn(topic_id, f"t{i}")
    assert dict(names) == {ids[1]: "t1", ids[2]: "t2"}


def test_a_topic_key_matches_fetch_by_id_once_another_connection_read_metadata() -> None:
    clock = Clock()
    reader = Driver(RULES, clock)
    assert isinstance(reader.session.policy, TopicIdLearningPolicy)
    reader.client(fetch_by_id(1))
    assert len(reader.upstream) == 1, "an unknown id is not the topic: the request goes on"

    # Metadata is answered on another connection of the same rule set.
    other = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), clock=clock,
                    policy=reader.live.policy("127.0.0.1:6666"))
    other.receive_client(metadata(7), clock.now)
    other.receive_upstream(metadata_answer(7))
    assert dict(reader.injector.topic_names) == {ORDERS: "orders"}

    reader.client(fetch_by_id(2))
    assert len(reader.upstream) == 1, "now the rule matches: answered by kproxy, not forwarded"
    reader.broker(response_frame(FETCH, 13, 1, responses=[]))
    assert reader.answered() == [1, 2]
    assert fetch_codes(reader.to_client[1]) == [NOT_LEADER_OR_FOLLOWER]


def test_learnt_topic_ids_outlive_a_rule_replacement() -> None:
    d = Driver(RULES)
    d.client(metadata(1))
    d.broker(metadata_answer(1))
    d.live.replace(load_text(RULES.replace("orders-fetch", "orders-fetch-2")), origin="test")
    d.client(fetch_by_id(2))
    assert len(d.upstream) == 1, "the new rules know the id: the Fetch is answered by kproxy"
    assert d.answered() == [1, 2] and fetch_codes(d.to_client[1]) == [NOT_LEADER_OR_FOLLOWER]


def test_rules_that_cannot_meet_a_request_by_topic_id_read_no_metadata() -> None:
    live = LiveRules(load_text("rules:\n  - id: p\n    match: {api: produce}\n    actions: [drop_response]\n"),
                     counts=FaultStats())
    assert live.injector is not None and not live.injector.learns_topic_ids
    assert type(live.policy("127.0.0.1:5555")) is RulePolicy
    live.mutable = True  # rules that meet Fetch requests may arrive later
    assert type(live.policy("127.0.0.1:5555")) is TopicIdLearningPolicy


def test_a_fault_on_fetch_by_id_names_the_topic_once_its_id_is_learnt() -> None:
    """With no topic key, a rule acting on Fetch v13+ still has its fault lines and /faults records
    name the topics its requests name by id, once a Metadata answer taught them."""
    d = Driver("rules:\n  - id: f\n    match: {api: fetch}\n    actions: [{delay: {ms: 0}}]\n")
    d.live.recent = deque(maxlen=10)
    assert isinstance(d.session.policy, TopicIdLearningPolicy)
    d.client(fetch_by_id(1))
    d.client(metadata(2))
    d.broker(response_frame(FETCH, 13, 1, responses=[]), metadata_answer(2))
    d.client(fetch_by_id(3))
    assert [(r.correlation_id, r.topics) for r in d.live.recent] == [(1, (str(ORDERS),)), (3, ("orders",))]
