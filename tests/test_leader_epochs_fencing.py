"""Leader epochs in requests, with librdkafka against a scripted cluster that checks them as a Kafka
broker does (tests/support/fakecluster.py): the embedded Tansu broker accepts any epoch, so it
cannot show this.

A broker answers UNKNOWN_LEADER_EPOCH to a Fetch whose ``current_leader_epoch`` is above its own
and FENCED_LEADER_EPOCH to one below (KIP-320). A ``move_leader`` rule advertises an epoch above
the broker's; the consumer's Fetches carrying it must reach the broker with the broker's own, both
while the rule is on and after it ends (when kproxy keeps advertising the raised epoch).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition

from kproxy.protocol.codes import ErrorCode
from kproxy.protocol.frame_builder import response_body
from kproxy.testing import proxy_config, running_server
from tests.support.fakecluster import FETCH, FakeBroker, FakeCluster, Received, fake_cluster

UNKNOWN_LEADER_EPOCH, FENCED_LEADER_EPOCH = int(ErrorCode.UNKNOWN_LEADER_EPOCH), int(ErrorCode.FENCED_LEADER_EPOCH)
RULE_SECONDS = 3.0
RULES = f"""
rules:
  - id: election
    match: {{api: metadata, schedule: {{for_seconds: {RULE_SECONDS}}}}}
    actions:
      - mutate_metadata: {{move_leader: [{{topic: orders, partition: 0, to: 1}}]}}
"""


def epoch_checking_fetch(cluster: FakeCluster, seen: list[tuple[int, int]]) -> Any:
    """A Fetch handler that serves every partition from any node (the test is about epochs, not
    leadership) and checks ``current_leader_epoch`` against the topic's as a broker does; ``seen``
    gets (epoch sent, error answered) per partition."""

    async def fetch(broker: FakeBroker, received: Received) -> Any:
        responses = []
        for item in received.body["topics"]:
            topic = next(t for t in cluster.topics.values() if t.topic_id == item.get("topic_id")
                         or t.name == item.get("topic"))
            partitions = []
            for p in item["partitions"]:
                epoch = p["current_leader_epoch"]
                code = (UNKNOWN_LEADER_EPOCH if epoch > topic.leader_epoch else
                        FENCED_LEADER_EPOCH if 0 <= epoch < topic.leader_epoch else 0)
                seen.append((epoch, code))
                partitions.append({"partition_index": p["partition"], "error_code": code, "high_watermark": 0,
                                   "records": b""})
            responses.append({"topic": item.get("topic"), "topic_id": item.get("topic_id"),
                              "partitions": partitions})
        await trio.sleep(0.05)  # a broker's fetch wait, kept short
        return response_body(FETCH, received.api_version, responses=responses)

    return fetch


def consume_librdkafka(bootstrap: str, seconds: float) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "epochs", "enable.auto.commit": False,
                         "topic.metadata.refresh.interval.ms": 500, "fetch.error.backoff.ms": 50})
    try:
        consumer.assign([TopicPartition("orders", 0, 0)])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            consumer.poll(0.1)
    finally:
        consumer.close()


def consume_kafka_python(bootstrap: str, seconds: float) -> None:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             metadata_max_age_ms=500, request_timeout_ms=5000, fetch_max_wait_ms=50)
    try:
        tp = KTopicPartition("orders", 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            consumer.poll(timeout_ms=100)
    finally:
        consumer.close()


@pytest.mark.parametrize("consume", [consume_librdkafka, consume_kafka_python], ids=["librdkafka", "kafka-python"])
async def test_fetches_carry_the_brokers_epoch_while_the_rule_is_on_and_after(tmp_path: Path, consume: Any) -> None:
    rules = tmp_path / "election.yaml"
    rules.write_text(RULES)
    seen: list[tuple[int, int]] = []
    async with fake_cluster((0, 1)) as cluster:
        cluster.add_topic("orders", [0])  # leader epoch 7
        cluster.handlers[FETCH] = epoch_checking_fetch(cluster, seen)
        async with running_server(proxy_config(cluster.bootstrap, rules=str(rules))) as server:
            await trio.to_thread.run_sync(consume, f"127.0.0.1:{server.bootstrap_port}", RULE_SECONDS + 3)
    refused = [s for s in seen if s[1]]
    print(f"{len(seen)} partition fetches, {len(refused)} refused for their epoch")
    assert len(seen) >= 10, "the consumer should have fetched all along"
    assert not refused, f"fetches refused for an epoch the broker never had: {refused[:5]}"
    assert {epoch for epoch, _ in seen} <= {7, -1}
