"""Client anomalies (``kproxy_client_anomalies_total``) with real clients, through a real kproxy, on Tansu.

Each detector is paired with the fault that provokes it, injected by kproxy's own rules (or, for the
producer policy and deprecated versions, a client configured so): the detector's series must appear
under the faulty client's id, and only there. The same clients on clean traffic leave the family
empty: every detector stays at zero.
"""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from kafka import KafkaConsumer
from prometheus_client.parser import text_string_to_metric_families

from kproxy.protocol import MessageType, default_body
from kproxy.protocol.codes import error_code
from kproxy.testing import Broker, ProxyThread, free_port, running_proxy
from tests.support.e2e import create_topic, unique
from tests.support.rawkafka import RawKafka

FAMILY = "kproxy_client_anomalies"
# A record big enough that a compressing producer's batch is compressed
# (kproxy.metrics.client_anomalies.UNCOMPRESSED_MIN_BYTES).
PAYLOAD = b"a compressible record " * 200
CHURN = 10  # connections closed within a minute that count as churn, in these tests
JOINS = 3  # JoinGroups of one group within a minute that count as a rebalance storm, in these tests
SESSION_MS = 6000
RETRIES = 5  # idempotent batches sent again within a minute that count as a retry storm, in these tests


def anomalies(port: int) -> dict[tuple[str, str], float] | None:
    """``(kind, client_id) -> count`` from kproxy's /metrics (None: the family is not exported)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    out: dict[tuple[str, str], float] | None = None
    for family in text_string_to_metric_families(text):
        if family.name == FAMILY:
            out = {}
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[(sample.labels["kind"], sample.labels["client_id"])] = sample.value
    return out


def wait_for(port: int, kind: str, client: str, timeout: float = 30.0) -> dict[tuple[str, str], float]:
    """Scrape until ``(kind, client)`` is counted (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        found = anomalies(port) or {}
        if found.get((kind, client), 0) >= 1:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"no {kind} anomaly of {client} within {timeout} s; counted: {found}")
        time.sleep(0.3)


@pytest.fixture
def proxy_with(tansu: Broker, tmp_path: Path) -> Iterator[Any]:
    """``proxy_with(rules_text)``: a fresh kproxy in front of Tansu, metrics on a port of its own, the
    producer policy on and churn counted from :data:`CHURN` closes; returns (proxy, metrics port)."""
    started: list[Any] = []

    def start(rules: str | None = None) -> tuple[ProxyThread, int]:
        port = free_port()
        options: dict[str, Any] = {"metrics_listen": f"127.0.0.1:{port}",
                                   "metrics__client_anomalies_churn_per_minute": CHURN,
                                   "metrics__client_anomalies_forbid_acks0": True,
                                   "metrics__client_anomalies_require_compression": True,
                                   "metrics__client_anomalies_rebalance_joins": JOINS,
                                   "metrics__client_anomalies_rebalance_window": 60,
                                   "metrics__client_anomalies_retries_per_minute": RETRIES}
        if rules is not None:
            path = tmp_path / f"rules-{len(started)}.yaml"
            path.write_text(rules)
            options["rules"] = str(path)
        cm = running_proxy(tansu.bootstrap, **options)
        proxy = cm.__enter__()
        started.append(cm)
        return proxy, port

    yield start
    for cm in reversed(started):
        cm.__exit__(None, None, None)


# -- the clients: each well-behaved unless kproxy's rules get in its way ------------------------------
def idempotent_producer(bootstrap: str, topic: str, client: str, count: int = 3) -> None:
    """A librdkafka idempotent producer (acks=all, lz4) sending ``count`` records, one by one."""
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client, "enable.idempotence": True,
                         "acks": "all", "compression.type": "lz4", "message.timeout.ms": 8000,
                         "retry.backoff.ms": 100})
    try:
        for i in range(count):
            producer.produce(topic, value=f"{client}-{i}".encode() + PAYLOAD)
            producer.flush(10)
    except KafkaException:
        pass  # a fatal error kproxy's rule provoked (fenced, out of order): the producer is done
    finally:
        producer.flush(5)


def plain_producer(bootstrap: str, topic: str, client: str, **config: Any) -> None:
    """A librdkafka producer (not idempotent) sending one record with ``config``."""
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client, "enable.idempotence": False,
                         "message.timeout.ms": 8000, **config})
    producer.produce(topic, value=PAYLOAD)
    producer.flush(10)


def committing_consumer(bootstrap: str, topic: str, client: str) -> None:
    """A librdkafka group member that reads what there is and commits it by hand, twice."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "client.id": client, "group.id": unique("anomaly-group"),
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        read = None
        while read is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                read = message
        assert read is not None, "the consumer read nothing"
        for _ in range(2):
            # A failed commit: the answer kproxy's rule gave (the detector's business), or the rejoin after it.
            with contextlib.suppress(KafkaException):
                consumer.commit(message=read, asynchronous=False)
    finally:
        consumer.close()


class GroupMember:
    """A librdkafka group member polling in a thread until :meth:`close` (heartbeats every 500 ms)."""

    def __init__(self, bootstrap: str, topic: str, client: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "client.id": client,
                                  "group.id": unique("anomaly-member"), "auto.offset.reset": "earliest",
                                  "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500,
                                  "socket.timeout.ms": 3000})
        self.consumer.subscribe([topic])
        self.assigned = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.consumer.poll(0.2)
            if self.consumer.assignment():
                self.assigned.set()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)
        closer = threading.Thread(target=self.consumer.close, daemon=True)  # bounded: its LeaveGroup may hang
        closer.start()
        closer.join(15)


def reconnecting_producer(bootstrap: str, topic: str, client: str, seconds: float = 4.0) -> None:
    """A librdkafka producer that reconnects quickly when a connection is lost, sending one record
    for ``seconds`` at most."""
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client, "reconnect.backoff.ms": 20,
                         "reconnect.backoff.max.ms": 100, "compression.type": "lz4",
                         "message.timeout.ms": int(seconds * 1000)})
    producer.produce(topic, value=PAYLOAD)
    producer.flush(seconds + 2)


def test_clean_traffic_from_every_client_counts_no_anomaly(proxy_with: Any) -> None:
    proxy, port = proxy_with()
    topic = unique("anomaly-clean")
    create_topic(proxy.bootstrap, topic, 1)
    idempotent_producer(proxy.bootstrap, topic, "clean-idempotent")
    plain_producer(proxy.bootstrap, topic, "clean-plain", acks="all", **{"compression.type": "zstd"})
    committing_consumer(proxy.bootstrap, topic, "clean-consumer")
    reconnecting_producer(proxy.bootstrap, topic, "clean-reconnects")
    member = GroupMember(proxy.bootstrap, topic, "clean-member")
    try:
        assert member.assigned.wait(30), "the member got no partition"
    finally:
        member.close()  # LeaveGroup answered: it left, it did not vanish
    # Another member heartbeats over two session timeouts after that: kproxy looks at the members meanwhile.
    other = GroupMember(proxy.bootstrap, topic, "clean-member")
    try:
        assert other.assigned.wait(30), "the member got no partition"
        time.sleep(SESSION_MS / 1000 * 2)
    finally:
        other.close()
    assert anomalies(port) == {}, "clean traffic counted anomalies"


def test_producer_fenced_and_sequence_errors_are_counted_for_their_producer(proxy_with: Any) -> None:
    proxy, port = proxy_with("""
rules:
  - id: fenced
    match: {api: produce, client_id: fenced-producer, schedule: {first: 1}}
    actions:
      - inject_error: {error: PRODUCER_FENCED}
  - id: out-of-order
    match: {api: produce, client_id: sequence-producer, schedule: {first: 1}}
    actions:
      - inject_error: {error: OUT_OF_ORDER_SEQUENCE_NUMBER}
""")
    topic = unique("anomaly-producer")
    create_topic(proxy.bootstrap, topic, 1)
    idempotent_producer(proxy.bootstrap, topic, "fenced-producer", count=1)
    idempotent_producer(proxy.bootstrap, topic, "sequence-producer", count=1)
    idempotent_producer(proxy.bootstrap, topic, "bystander", count=2)
    wait_for(port, "producer_fenced", "fenced-producer")
    found = wait_for(port, "producer_sequence", "sequence-producer")
    assert sorted(found) == [("producer_fenced", "fenced-producer"), ("producer_sequence", "sequence-producer")]


def test_commits_answered_illegal_generation_count_as_stale_generation(proxy_with: Any) -> None:
    proxy, port = proxy_with("""
rules:
  - id: stale
    match: {api: offset_commit, client_id: stale-consumer, schedule: {first: 1}}
    actions:
      - inject_error: {error: ILLEGAL_GENERATION}
""")
    topic = unique("anomaly-commit")
    create_topic(proxy.bootstrap, topic, 1)
    idempotent_producer(proxy.bootstrap, topic, "writer", count=1)
    committing_consumer(proxy.bootstrap, topic, "stale-consumer")
    committing_consumer(proxy.bootstrap, topic, "fresh-consumer")
    found = wait_for(port, "stale_generation", "stale-consumer")
    # (After the injected answer the member rejoins; a commit of the old generation meanwhile is the
    # broker's own ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID, rightly counted too.)
    assert list(found) == [("stale_generation", "stale-consumer")]


def test_connections_closed_by_a_rule_count_as_churn(proxy_with: Any) -> None:
    proxy, port = proxy_with("""
rules:
  - id: churn
    match: {api: metadata, client_id: churner}
    actions:
      - close_connection
""")
    topic = unique("anomaly-churn")
    create_topic(proxy.bootstrap, topic, 1)
    reconnecting_producer(proxy.bootstrap, topic, "churner")
    reconnecting_producer(proxy.bootstrap, topic, "calm")
    assert wait_for(port, "connection_churn", "churner") == {("connection_churn", "churner"): 1}


def test_producer_policy_and_deprecated_versions_are_counted_once_per_connection(proxy_with: Any) -> None:
    proxy, port = proxy_with()
    topic = unique("anomaly-policy")
    create_topic(proxy.bootstrap, topic, 1)
    plain_producer(proxy.bootstrap, topic, "fire-and-forget", acks=0, **{"compression.type": "lz4"})
    plain_producer(proxy.bootstrap, topic, "uncompressed", acks="all", **{"compression.type": "none"})
    plain_producer(proxy.bootstrap, topic, "compliant", acks="all", **{"compression.type": "lz4"})
    # kafka-python told the broker is 0.10.1 speaks Metadata v2, which Kafka 4 no longer takes.
    old = KafkaConsumer(bootstrap_servers=proxy.bootstrap, client_id="old-client", api_version=(0, 10, 1),
                        request_timeout_ms=5000)
    try:
        old.topics()
    finally:
        old.close()
    wait_for(port, "acks0_producer", "fire-and-forget")
    wait_for(port, "uncompressed_producer", "uncompressed")
    found = wait_for(port, "deprecated_version", "old-client")
    assert found == {("acks0_producer", "fire-and-forget"): 1, ("uncompressed_producer", "uncompressed"): 1,
                     ("deprecated_version", "old-client"): 1}


def test_rebalances_forced_by_a_rule_count_as_a_rebalance_storm(proxy_with: Any) -> None:
    proxy, port = proxy_with("""
rules:
  - id: storm
    match: {api: heartbeat, client_id: storming}
    actions:
      - inject_error: {error: REBALANCE_IN_PROGRESS}
""")
    topic = unique("anomaly-storm")
    create_topic(proxy.bootstrap, topic, 1)
    member, calm = GroupMember(proxy.bootstrap, topic, "storming"), GroupMember(proxy.bootstrap, topic, "steady")
    try:
        found = wait_for(port, "rebalance_storm", "storming", timeout=60)
    finally:
        member.close()
        calm.close()
    assert list(found) == [("rebalance_storm", "storming")]


def test_a_member_whose_leave_group_never_arrives_counts_as_vanished(proxy_with: Any) -> None:
    proxy, port = proxy_with("""
rules:
  - id: lost-leave
    match: {api: leave_group, client_id: vanishing}
    actions:
      - blackhole
""")
    topic = unique("anomaly-vanish")
    create_topic(proxy.bootstrap, topic, 1)
    leaving, staying = GroupMember(proxy.bootstrap, topic, "vanishing"), GroupMember(proxy.bootstrap, topic, "staying")
    try:
        assert leaving.assigned.wait(30) and staying.assigned.wait(30), "the members got no partition"
        leaving.close()  # its LeaveGroup is blackholed: the broker expires its session
        # The staying member's heartbeats go on: kproxy looks at the members meanwhile.
        found = wait_for(port, "vanished_member", "vanishing", timeout=30)
    finally:
        staying.close()
    assert list(found) == [("vanished_member", "vanishing")]


def test_the_brokers_own_answer_counts_under_the_connections_client_id(proxy_with: Any) -> None:
    """A commit for a member the group does not know, answered by Tansu itself (UNKNOWN_MEMBER_ID):
    forwarded, so its answer comes after kproxy let the request's frame go."""
    proxy, port = proxy_with()
    topic = unique("anomaly-broker")
    create_topic(proxy.bootstrap, topic, 1)
    raw = RawKafka(proxy.bootstrap, "raw-committer")
    try:
        raw.request(18, 3, default_body(18, 3, MessageType.REQUEST))  # the commit is not the connection's first
        body = default_body(8, 8, MessageType.REQUEST)
        body.update(group_id=unique("anomaly-group"), generation_id_or_member_epoch=3, member_id="gone",
                    topics=[{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                            "committed_leader_epoch": -1, "committed_metadata": ""}]}])
        answer = raw.request(8, 8, body)
    finally:
        raw.close()
    assert [p["error_code"] for t in answer["topics"] for p in t["partitions"]] == [error_code("UNKNOWN_MEMBER_ID")]
    assert wait_for(port, "stale_generation", "raw-committer") == {("stale_generation", "raw-committer"): 1}


def test_batches_sent_again_and_again_count_as_a_retry_storm(proxy_with: Any) -> None:
    proxy, port = proxy_with("""
rules:
  - id: refuse
    match: {api: produce, client_id: retrier, schedule: {first: 8}}
    actions:
      - inject_error: {error: NOT_LEADER_OR_FOLLOWER}
""")
    topic = unique("anomaly-retry")
    create_topic(proxy.bootstrap, topic, 1)
    idempotent_producer(proxy.bootstrap, topic, "retrier", count=1)  # retried until the rule lets it through
    idempotent_producer(proxy.bootstrap, topic, "one-shot", count=3)
    assert wait_for(port, "retry_storm", "retrier") == {("retry_storm", "retrier"): 1}
