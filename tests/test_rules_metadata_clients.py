"""Metadata mutations met by real clients (kafkajs and librdkafka) through kproxy in front of the real
broker: every answer is one a cluster in trouble could give, so what a client reports as delivered
is on the broker, and no answer lists zero brokers.

A partition ``hide_partitions`` hides is listed with no leader and LEADER_NOT_AVAILABLE (removed
from the answer, kafkajs resolved sends to it as successful without ever sending them), and
``hide_brokers`` never hides the broker answering, nor leaves an answer with no broker (a librdkafka
consumer then dropped every broker, bootstrap included, and never connected again).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from kproxy.protocol import MessageType, default_body
from kproxy.protocol.codes import ApiKey
from kproxy.testing import Broker, ProxyThread, running_proxy
from tests.support.delivered import Outcome, read_back
from tests.support.e2e import TANSU_NODE_ID, create_topic, produce_confluent, unique
from tests.support.kafkajs import run_node
from tests.support.rawkafka import RawKafka

PARTITIONS = 2
MUTATIONS = {
    "hide_partitions": "hide_partitions: [{{topic: {topic}, partition: 0}}]",
    "hide_brokers": f"hide_brokers: [{TANSU_NODE_ID}]",
    "shrink_isr": f"shrink_isr: [{{{{topic: {{topic}}, partition: 0, to: [{TANSU_NODE_ID}]}}}}]",
}


def mutating(topic: str, mutation: str) -> str:
    return f"""rules:
  - id: mutate
    match: {{api: [metadata, describe_cluster]}}
    actions:
      - mutate_metadata: {{{MUTATIONS[mutation].format(topic=topic)}}}
"""


@pytest.fixture
def mutated(tansu: Broker, tmp_path: Path) -> Iterator[Any]:
    """``mutated(mutation)``: (kproxy in front of Tansu with that mutation of every Metadata answer,
    a fresh topic of PARTITIONS partitions)."""
    opened: list[Any] = []

    def start(mutation: str) -> tuple[ProxyThread, str]:
        topic = unique(f"mutated-{mutation.replace('_', '-')}")
        create_topic(tansu.bootstrap, topic, PARTITIONS)
        path = tmp_path / f"rules-{len(opened)}.yaml"
        path.write_text(mutating(topic, mutation))
        cm = running_proxy(tansu.bootstrap, rules=str(path))
        opened.append(cm)
        return cm.__enter__(), topic

    yield start
    for cm in reversed(opened):
        cm.__exit__(None, None, None)


def produce_kafkajs(bootstrap: str, topic: str) -> list[Outcome]:
    return run_node("produce.js", {"brokers": [bootstrap], "topic": topic, "seconds": 4, "interval_ms": 20,
                                   "partitions": PARTITIONS, "wait_s": 8, "request_timeout_ms": 1500}, timeout=60)


def produce_librdkafka(bootstrap: str, topic: str) -> list[Outcome]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "message.timeout.ms": 8000, "topic.metadata.refresh.interval.ms": 1000})
    outcomes: list[Outcome] = []
    for i in range(200):
        outcome: Outcome = {"i": i, "partition": i % PARTITIONS, "acked": None, "error": None}
        outcomes.append(outcome)

        def report(err: Any, _msg: Any, outcome: Outcome = outcome) -> None:
            outcome["acked" if err is None else "error"] = time.time() if err is None else str(err)

        producer.produce(topic, value=f"v{i}".encode(), partition=i % PARTITIONS, on_delivery=report)
        producer.poll(0.02)
    producer.flush(15)
    return outcomes


CLIENTS = {"kafkajs": produce_kafkajs, "librdkafka": produce_librdkafka}


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_every_record_a_client_reports_delivered_under_a_metadata_mutation_is_on_the_broker(
        mutated: Any, tansu: Broker, client: str, mutation: str) -> None:
    proxy, topic = mutated(mutation)
    outcomes = CLIENTS[client](proxy.bootstrap, topic)
    delivered = {f"v{o['i']}".encode() for o in outcomes if o["acked"] is not None}
    written = set(read_back(tansu.bootstrap, topic, PARTITIONS))
    phantom = delivered - written
    assert not phantom, (f"{len(phantom)} of {len(delivered)} records reported delivered are not on the broker "
                         f"(e.g. {sorted(phantom)[:3]})")
    if mutation != "hide_partitions":  # nothing else keeps a partition from its leader
        assert len(delivered) == len(outcomes), f"{len(outcomes) - len(delivered)} records not delivered"
    elif client == "librdkafka":  # partition 1 was never hidden: its records go through
        assert {o["i"] for o in outcomes if o["partition"] == 1} <= {
            o["i"] for o in outcomes if o["acked"] is not None}
    # kafkajs retries a metadata refresh that lists a leaderless partition until its retries run out, and
    # sends nothing to the topic meanwhile: its sends fail, which is what it does in front of such a cluster.


def _broker_listener(proxy: ProxyThread) -> str:
    """kproxy's listener for the one broker, as its bootstrap answer advertises it."""
    raw = RawKafka(proxy.bootstrap)
    try:
        body = raw.request(int(ApiKey.METADATA), 1, {"topics": []})
    finally:
        raw.close()
    broker = body["brokers"][0]
    return f"{broker['host']}:{broker['port']}"


def test_no_answer_kproxy_writes_lists_zero_brokers_though_the_rule_hides_every_one(mutated: Any) -> None:
    proxy, _topic = mutated("hide_brokers")
    listeners = {"bootstrap": proxy.bootstrap, "broker": _broker_listener(proxy)}
    for name, address in listeners.items():
        raw = RawKafka(address)
        try:
            offered = {k["api_key"]: (k["min_version"], k["max_version"]) for k in raw.request(
                int(ApiKey.API_VERSIONS), 3,
                default_body(int(ApiKey.API_VERSIONS), 3, MessageType.REQUEST))["api_keys"]}
            metadata, cluster = offered[int(ApiKey.METADATA)], offered[int(ApiKey.DESCRIBE_CLUSTER)]
            for version in range(max(1, metadata[0]), metadata[1] + 1):
                request = default_body(int(ApiKey.METADATA), version, MessageType.REQUEST)
                request["topics"] = None
                body = raw.request(int(ApiKey.METADATA), version, request)
                assert [b["node_id"] for b in body["brokers"]] == [TANSU_NODE_ID], f"{name} Metadata v{version}"
            for version in range(cluster[0], cluster[1] + 1):
                body = raw.request(int(ApiKey.DESCRIBE_CLUSTER), version,
                                   default_body(int(ApiKey.DESCRIBE_CLUSTER), version, MessageType.REQUEST))
                assert [b["broker_id"] for b in body["brokers"]] == [TANSU_NODE_ID], \
                    f"{name} DescribeCluster v{version}"
        finally:
            raw.close()


def test_a_librdkafka_consumer_keeps_reading_while_every_broker_is_hidden(mutated: Any, tansu: Broker) -> None:
    proxy, topic = mutated("hide_brokers")
    produce_confluent(tansu.bootstrap, topic, [(None, f"r{i}".encode()) for i in range(50)])
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("hidden"),
                         "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 500,
                         "session.timeout.ms": 6000})
    got: set[bytes] = set()
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(got) < 50 and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=100, timeout=0.5):
                if msg.error() is None:
                    got.add(msg.value())
    finally:
        consumer.close()
    assert len(got) == 50, f"read {len(got)} of 50 records"
