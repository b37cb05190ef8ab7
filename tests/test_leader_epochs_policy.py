"""Leader epoch floors kept by the policy (kproxy/policy/policy.py) for a real Session, sans-IO: a
``move_leader`` rule's raised epoch outlives the rule and its rule set, requests carrying it reach
the broker with the broker's own epoch, and a mutation that does not touch epochs records nothing."""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

import pytest

from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.live_rules import LiveRules
from kproxy.protocol import decode_request
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.session import Session
from kproxy.rules import load_text
from tests.support.clock import Clock
from tests.test_rules_session import Driver, body

METADATA, FETCH, LIST_OFFSETS = 3, 1, 2
TOPIC_ID = uuid.UUID("3f1d2c4b-0000-4000-8000-000000000002")

MOVE = """
rules:
  - id: election
    match: {api: metadata}
    actions:
      - mutate_metadata: {move_leader: [{topic: orders, partition: 0, to: 2}]}
"""


def metadata_request(correlation_id: int) -> bytes:
    return request_frame(METADATA, 12, correlation_id, topics=[{"name": "orders"}])


def metadata_answer(correlation_id: int, epoch: int, partitions: int = 2) -> bytes:
    return response_frame(METADATA, 12, correlation_id, brokers=[
        {"node_id": n, "host": f"b{n}", "port": 9092} for n in (1, 2)], topics=[
        {"name": "orders", "topic_id": TOPIC_ID, "partitions": [
            {"partition_index": p, "leader_id": 1, "leader_epoch": epoch, "replica_nodes": [1, 2],
             "isr_nodes": [1, 2], "offline_replicas": []} for p in range(partitions)]}])


def fetch_request(correlation_id: int, epoch: int) -> bytes:
    return request_frame(FETCH, 16, correlation_id, topics=[{"topic_id": TOPIC_ID, "partitions": [
        {"partition": 0, "current_leader_epoch": epoch, "fetch_offset": 0}]}])


def fetch_answer(correlation_id: int) -> bytes:
    return response_frame(FETCH, 16, correlation_id, responses=[
        {"topic_id": TOPIC_ID, "partitions": [{"partition_index": 0, "records": None}]}])


class Client:
    """A Driver and its next correlation id: one exchange at a time."""

    def __init__(self, driver: Driver) -> None:
        self.d = driver
        self.next_id = 1

    def metadata(self, broker_epoch: int) -> dict[tuple[int, int], int]:
        """(leader, epoch) per partition as the client sees a Metadata answer of ``broker_epoch``."""
        cid, self.next_id = self.next_id, self.next_id + 1
        self.d.client(metadata_request(cid))
        self.d.broker(metadata_answer(cid, broker_epoch))
        [topic] = body(METADATA, 12, self.d.to_client.pop())["topics"]
        return {p["partition_index"]: (p["leader_id"], p["leader_epoch"]) for p in topic["partitions"]}

    def fetch(self, epoch: int) -> int:
        """The current_leader_epoch the broker receives for a Fetch sent with ``epoch``."""
        cid, self.next_id = self.next_id, self.next_id + 1
        self.d.client(fetch_request(cid, epoch))
        sent = decode_request(self.d.upstream.pop()[4:]).body
        self.d.broker(fetch_answer(cid))
        self.d.to_client.pop()
        return int(sent["topics"][0]["partitions"][0]["current_leader_epoch"])


def test_the_raised_epoch_outlives_the_rule_until_the_brokers_own_reaches_it() -> None:
    d = Driver(MOVE)
    c = Client(d)
    assert not d.live.epoch_floors
    assert c.metadata(0) == {0: (2, 1), 1: (1, 0)}
    assert c.metadata(0) == {0: (2, 1), 1: (1, 0)}, "the rule's raise is stable, not one more per answer"
    # While the rule is on: a Fetch with the epoch kproxy advertised reaches the broker with its own.
    assert c.fetch(1) == 0
    assert d.live.epoch_floors.floor("orders", 0) is d.live.epoch_floors.floor(TOPIC_ID, 0)
    d.live.replace(None, origin="test")  # the rule ends: no rule set at all
    assert c.metadata(0) == {0: (1, 1), 1: (1, 0)}, "the broker's leader, at the epoch the client knows"
    assert c.fetch(1) == 0, "the broker's own epoch, as the last answer gave it"
    assert c.fetch(0) == 0
    assert c.metadata(1) == {0: (1, 1), 1: (1, 1)}
    assert not d.live.epoch_floors, "forgotten once the broker's epoch reached it"
    assert c.fetch(1) == 1


def test_floors_outlive_a_replaced_rule_set() -> None:
    d = Driver(MOVE)
    c = Client(d)
    c.metadata(3)
    d.live.replace(load_text(DELAY_PRODUCE), origin="test")
    assert c.metadata(3) == {0: (1, 4), 1: (1, 3)}


@pytest.mark.parametrize("action", ["mutate_metadata: {hide_brokers: [2]}",
                                    "mutate_metadata: {shrink_isr: [{topic: orders, partition: 0, to: [1]}]}",
                                    "mutate_metadata: {move_leader: [{topic: orders, partition: 0, to: 1}]}"])
def test_a_mutation_that_does_not_raise_an_epoch_records_nothing(action: str) -> None:
    # The last: the leader it names is the broker's own, so nothing moves and no epoch is raised.
    d = Driver(f"rules:\n  - id: r\n    match: {{api: metadata}}\n    actions:\n      - {action}\n")
    c = Client(d)
    assert c.metadata(0)[0][1] == 0
    assert c.fetch(0) == 0
    d.live.replace(None, origin="test")
    c.metadata(0)
    assert not d.live.epoch_floors


def test_a_dry_run_raises_nothing() -> None:
    d = Driver(MOVE.replace("match: {api: metadata}", "match: {api: metadata}\n    dry_run: true"))
    assert Client(d).metadata(0) == {0: (1, 0), 1: (1, 0)}
    assert not d.live.epoch_floors


def test_list_offsets_carrying_the_raised_epoch_reaches_the_broker_with_its_own() -> None:
    d = Driver(MOVE)
    c = Client(d)
    c.metadata(2)
    d.client(request_frame(LIST_OFFSETS, 7, 50, topics=[{"name": "orders", "partitions": [
        {"partition_index": 0, "current_leader_epoch": 3, "timestamp": -1},
        {"partition_index": 1, "current_leader_epoch": 0, "timestamp": -1}]}]))
    sent = decode_request(d.upstream.pop()[4:]).body
    assert [p["current_leader_epoch"] for p in sent["topics"][0]["partitions"]] == [2, 0]


# -- cost -----------------------------------------------------------------------------------------
DELAY_PRODUCE = "rules:\n  - id: p\n    match: {api: produce}\n    actions:\n      - delay: {ms: 1}\n"


_THROTTLES = itertools.count(1)  # a throttle time never sent before: a new answer


def _exchange_cost(live: LiveRules, answer: bytes, rounds: int, *, same: bool = True) -> float:
    """Seconds per Metadata exchange (request in, answer out) through a session with ``live``'s
    policy; ``same``: the broker's answer is the same every time (as at each refresh of a client),
    else its throttle time differs (a new answer each time)."""
    d = Driver(DELAY_PRODUCE)
    d.live = live
    d.session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), clock=d.clock,
                        policy=live.policy("127.0.0.1:5555"))
    start = time.perf_counter()
    for cid in range(1, rounds + 1):
        d.client(metadata_request(cid))
        # Metadata v12: size, correlation id, the header's tag section (1 byte), then throttle_time_ms.
        throttle = answer[9:13] if same else next(_THROTTLES).to_bytes(4, "big")
        d.broker(answer[:4] + cid.to_bytes(4, "big") + answer[8:9] + throttle + answer[13:])
        d.to_client.clear()
    return (time.perf_counter() - start) / rounds


def test_cost_of_a_1000_partition_metadata_answer_with_and_without_floors(capsys: Any) -> None:
    answer = metadata_answer(0, 0, partitions=1000)
    empty = LiveRules(load_text(DELAY_PRODUCE), counts=FaultStats(), clock=Clock())
    elsewhere = LiveRules(load_text(DELAY_PRODUCE), counts=FaultStats(), clock=Clock())
    elsewhere.epoch_floors.raised("payments", uuid.uuid4(), 0, 5)  # a floor on a topic this answer does not name
    populated = LiveRules(load_text(DELAY_PRODUCE), counts=FaultStats(), clock=Clock())
    populated.epoch_floors.raised("orders", TOPIC_ID, 0, 5)
    without, other, repeated = (min(_exchange_cost(live, answer, 20) for _ in range(3))
                                for live in (empty, elsewhere, populated))
    fresh = min(_exchange_cost(populated, answer, 10, same=False) for _ in range(3))
    with capsys.disabled():
        print(f"\n1,000-partition Metadata exchange: {without * 1e3:.2f} ms with no floor, "
              f"{other * 1e3:.2f} ms with a floor on another topic; with one on its topic "
              f"{fresh * 1e3:.2f} ms for a new answer, {repeated * 1e3:.2f} ms for the same answer again")
    assert len(populated.epoch_floors) == 2, "still below the floor: kept"
    assert other < 3 * without + 0.001, "a floor on another topic costs a byte search, not a decode"
    assert repeated < fresh, "the same answer again is not decoded again"
