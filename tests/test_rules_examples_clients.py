"""Each file of rules/examples/, run by kproxy in front of a real broker, does to real clients what
its opening comment says a well-behaved client does with it.

Every test loads the example file itself. Where the file names brokers (``broker_id``) or waits
minutes (``after_seconds``), :func:`example_for_one_broker` reads that file and writes it again with
the broker ids mapped to the embedded Tansu's one node (111) and its schedule seconds scaled down,
nothing else changed; hidden-broker.yaml, which needs three brokers, runs unchanged against the
scripted cluster of tests/support/fakecluster.py. Clients: librdkafka (confluent-kafka) and, where it
has the API, kafka-python.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition
from kafka.errors import RecordListTooLargeError

from kproxy.logfmt import parse_logfmt
from kproxy.server.discovery import DISCOVERY_CLIENT_ID
from kproxy.testing import Broker, ProxyThread, proxy_config, run_tansu, running_proxy, running_server
from tests.support.e2e import TANSU_NODE_ID, create_topic, unique
from tests.support.fakecluster import PRODUCE, fake_cluster

EXAMPLES = Path(__file__).resolve().parent.parent / "rules" / "examples"
KeyValue = tuple[bytes | None, bytes | None]


# -- running an example ----------------------------------------------------------------------------
@pytest.fixture
def example(tansu: Broker) -> Iterator[Any]:
    """``example(path, upstream=None)``: a fresh kproxy in front of Tansu running that rule file."""
    stack: list[Any] = []

    def start(path: Path, upstream: str | None = None) -> ProxyThread:
        cm = running_proxy(upstream or tansu.bootstrap, rules=str(path))
        stack.append(cm)
        return cm.__enter__()

    yield start
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


def example_for_one_broker(name: str, tmp_path: Path, brokers: dict[int, int], seconds: float = 1.0) -> Path:
    """The example ``name`` with its ``broker_id`` values mapped by ``brokers`` and its schedule's
    ``after_seconds`` / ``for_seconds`` multiplied by ``seconds``; every other key as the file has it."""
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    for rule in doc["rules"]:
        match = rule["match"]
        if "broker_id" in match:
            match["broker_id"] = brokers[match["broker_id"]]
        schedule = match.get("schedule", {})
        for key in ("after_seconds", "for_seconds"):
            if key in schedule:
                schedule[key] = schedule[key] * seconds
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def faults(caplog: pytest.LogCaptureFixture, rule: str) -> list[dict[str, str]]:
    lines = [parse_logfmt(r.getMessage()) for r in caplog.records if r.name == "kproxy.faults"]
    return [line for line in lines if line.get("rule") == rule]


def request_versions(proxy: ProxyThread, api: str) -> set[int]:
    assert proxy.server is not None
    return {int(v) for (name, v) in proxy.call(lambda: list(proxy.server.stats.totals().requests)) if name == api}


def request_count(proxy: ProxyThread, api: str) -> int:
    assert proxy.server is not None
    counts = proxy.call(lambda: dict(proxy.server.stats.totals().requests))
    return sum(n for (name, _v), n in counts.items() if name == api)


# -- clients ------------------------------------------------------------------------------------------
def produce_each(bootstrap: str, topic: str, sent: list[tuple[int, bytes, bytes]], **config: Any) -> list[Any]:
    """librdkafka: produce ``(partition, key, value)`` in order; the delivery errors (none expected)."""
    producer = Producer({"bootstrap.servers": bootstrap, **config})
    errors: list[Any] = []
    for partition, key, value in sent:
        producer.produce(topic, key=key, value=value, partition=partition,
                         on_delivery=lambda err, _m: errors.append(err) if err else None)
        producer.poll(0)
    assert producer.flush(60) == 0, "messages still undelivered after 60 s"
    return errors


def consume_in_order(bootstrap: str, topic: str, partitions: int, count: int,
                     **config: Any) -> dict[int, list[tuple[int, bytes]]]:
    """librdkafka, no group: partition -> [(offset, key)] as delivered, from the start."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"), "enable.auto.commit": False,
                         **config})
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + 45
        while sum(map(len, got.values())) < count and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                assert msg.error() is None, msg.error()
                got[msg.partition()].append((msg.offset(), msg.key()))
        for msg in consumer.consume(num_messages=500, timeout=0.5):  # anything more would be a duplicate
            if msg.error() is None:
                got[msg.partition()].append((msg.offset(), msg.key()))
    finally:
        consumer.close()
    return got


def keyed(tag: str, n: int, partitions: int) -> list[tuple[int, bytes, bytes]]:
    return [(i % partitions, f"{tag}-{i:05d}".encode(), f"{tag}:{i}".encode() * 20) for i in range(n)]


def assert_each_once_in_order(got: dict[int, list[tuple[int, bytes]]], sent: list[tuple[int, bytes, bytes]]) -> None:
    for partition, records in got.items():
        expected = [key for p, key, _v in sent if p == partition]
        assert [key for _o, key in records] == expected, (
            f"partition {partition}: {len(records)} records delivered for {len(expected)} sent, "
            "not each once in order")


# -- produce-errors-one-topic.yaml ----------------------------------------------------------------------
PRODUCE_ERRORS = EXAMPLES / "produce-errors-one-topic.yaml"


def test_produce_errors_librdkafka_retries_not_enough_replicas_and_keeps_each_message_once_in_order(
        example: Any, caplog: pytest.LogCaptureFixture) -> None:
    proxy = example(PRODUCE_ERRORS)
    topic = unique("orders")
    create_topic(proxy.bootstrap, topic, 2)
    sent = keyed("nes", 300, 2)
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        errors = produce_each(proxy.bootstrap, topic, sent, acks="all", **{"enable.idempotence": True,
                              "linger.ms": 2, "batch.num.messages": 10})
    hits = faults(caplog, "orders-not-enough-replicas")
    assert not errors, errors[:3]
    changed = [h for h in hits if "changed" in h["detail"]]
    assert len(changed) >= 3, "the rule should have failed some Produce requests"
    # A request for partition 1 alone is matched but left as the broker answered it ("skipped").
    assert {h["partition"] for h in changed} == {"0"}, "partition 0 fails alone"
    assert_each_once_in_order(consume_in_order(proxy.bootstrap, topic, 2, len(sent)), sent)


def test_produce_errors_kafka_python_retries_not_enough_replicas_and_keeps_each_message_once_in_order(
        example: Any, caplog: pytest.LogCaptureFixture) -> None:
    proxy = example(PRODUCE_ERRORS)
    topic = unique("orders")
    create_topic(proxy.bootstrap, topic, 2)
    sent = keyed("kp-nes", 200, 2)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all", enable_idempotence=True,
                             retry_backoff_ms=20, linger_ms=2)
    try:
        with caplog.at_level(logging.INFO, "kproxy.faults"):
            for start in range(0, len(sent), 20):  # ten flushes: ten Produce requests at least
                futures = [producer.send(topic, key=k, value=v, partition=p) for p, k, v in sent[start:start + 20]]
                producer.flush(timeout=30)
                for f in futures:
                    f.get(timeout=15)
    finally:
        producer.close(timeout=5)
    assert len(faults(caplog, "orders-not-enough-replicas")) >= 1
    assert_each_once_in_order(consume_in_order(proxy.bootstrap, topic, 2, len(sent)), sent)


def _audit_topic() -> str:
    return f"orders-audit-v{random.randrange(10**8, 10**9)}"  # matches orders-audit(-v[0-9]+)? whole


def test_produce_errors_record_list_too_large_reaches_the_librdkafka_delivery_callback(example: Any) -> None:
    proxy = example(PRODUCE_ERRORS)
    topic = _audit_topic()
    create_topic(proxy.bootstrap, topic, 1)
    reports: list[Any] = []
    # acks=1: orders-not-enough-replicas (acks: all) is the first rule and would take the request.
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": 1, "enable.idempotence": False,
                         "message.timeout.ms": 15000})
    started = time.monotonic()
    producer.produce(topic, value=b"audit", on_delivery=lambda err, _m: reports.append(err))
    assert producer.flush(20) == 0
    assert len(reports) == 1 and reports[0] is not None
    assert reports[0].code() == KafkaError.RECORD_LIST_TOO_LARGE and not reports[0].retriable()
    assert time.monotonic() - started < 5, "a non-retriable error is reported at once, not retried"


def test_produce_errors_record_list_too_large_reaches_the_kafka_python_application(example: Any) -> None:
    proxy = example(PRODUCE_ERRORS)
    topic = _audit_topic()
    create_topic(proxy.bootstrap, topic, 1)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks=1, request_timeout_ms=10000)
    try:
        with pytest.raises(RecordListTooLargeError):
            producer.send(topic, value=b"audit").get(timeout=15)
    finally:
        producer.close(timeout=5)


def test_produce_errors_other_topics_of_the_same_request_are_untouched(example: Any) -> None:
    """kafka-python puts both topics' batches in one Produce request (linger_ms; librdkafka 2.16
    sent one request per partition here): the audit topic's RECORD_LIST_TOO_LARGE must reach its
    message only, the other topic's message is written."""
    proxy = example(PRODUCE_ERRORS)
    audit, other = _audit_topic(), unique("invoices")
    create_topic(proxy.bootstrap, audit, 1)
    create_topic(proxy.bootstrap, other, 1)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks=1, linger_ms=200, request_timeout_ms=10000)
    try:
        producer.partitions_for(audit)
        producer.partitions_for(other)  # both topics known: their batches are ready together
        futures = {topic: producer.send(topic, value=b"x") for topic in (audit, other)}
        producer.flush(timeout=20)
        with pytest.raises(RecordListTooLargeError):
            futures[audit].get(timeout=5)
        assert futures[other].get(timeout=5).offset >= 0
    finally:
        producer.close(timeout=5)
    assert request_count(proxy, "produce") == 1, "both batches should have gone in one Produce request"


# -- leader-election-storm.yaml ------------------------------------------------------------------------
STORM = EXAMPLES / "leader-election-storm.yaml"


def test_leader_election_storm_librdkafka_idempotent_producer_and_group_consumer_lose_and_repeat_nothing(
        example: Any, caplog: pytest.LogCaptureFixture) -> None:
    proxy = example(STORM)
    topic = unique("storm")
    create_topic(proxy.bootstrap, topic, 2)
    sent = keyed("storm", 300, 2)
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        errors = produce_each(proxy.bootstrap, topic, sent, acks="all", **{"enable.idempotence": True,
                              "linger.ms": 2, "batch.num.messages": 10, "retry.backoff.ms": 20})
        assert not errors, errors[:3]
        assert_each_once_in_order(consume_in_order(proxy.bootstrap, topic, 2, len(sent), **{
            "fetch.wait.max.ms": 50}), sent)
    assert faults(caplog, "produce-not-leader") and faults(caplog, "fetch-not-leader")
    assert faults(caplog, "metadata-leader-not-available")


def test_leader_election_storm_kafka_python_producer_and_consumer_lose_and_repeat_nothing(
        example: Any, caplog: pytest.LogCaptureFixture) -> None:
    proxy = example(STORM)
    topic = unique("storm-kp")
    create_topic(proxy.bootstrap, topic, 2)
    sent = keyed("kp-storm", 200, 2)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all", enable_idempotence=True,
                             retry_backoff_ms=20, linger_ms=2)
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        try:
            for start in range(0, len(sent), 20):
                futures = [producer.send(topic, key=k, value=v, partition=p) for p, k, v in sent[start:start + 20]]
                producer.flush(timeout=30)
                for f in futures:
                    f.get(timeout=15)
        finally:
            producer.close(timeout=5)
        consumer = KafkaConsumer(bootstrap_servers=proxy.bootstrap, group_id=None, enable_auto_commit=False,
                                 auto_offset_reset="earliest", retry_backoff_ms=20, fetch_max_wait_ms=50,
                                 max_partition_fetch_bytes=1024)  # dozens of Fetches: some meet the rule
        got: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
        try:
            consumer.assign([KTopicPartition(topic, p) for p in (0, 1)])
            deadline = time.monotonic() + 45
            while sum(map(len, got.values())) < len(sent) and time.monotonic() < deadline:
                for tp, records in consumer.poll(timeout_ms=300).items():
                    got[tp.partition].extend((r.offset, r.key) for r in records)
            for tp, records in consumer.poll(timeout_ms=500).items():
                got[tp.partition].extend((r.offset, r.key) for r in records)
        finally:
            consumer.close()
    assert faults(caplog, "produce-not-leader") and faults(caplog, "fetch-not-leader")
    assert_each_once_in_order(got, sent)


# -- slow-broker.yaml --------------------------------------------------------------------------------------
def test_slow_broker_clients_keep_working_half_a_second_late(example: Any, tmp_path: Path) -> None:
    proxy = example(example_for_one_broker("slow-broker.yaml", tmp_path, {1: TANSU_NODE_ID}))
    topic = unique("slow")
    create_topic(proxy.bootstrap, topic, 1)
    latencies: list[float] = []
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(6):
        sent_at = time.monotonic()
        producer.produce(topic, key=b"%d" % i, value=b"slow",
                         on_delivery=lambda err, _m, t=sent_at: latencies.append(-1 if err else time.monotonic() - t))
        assert producer.flush(15) == 0
    assert len(latencies) == 6 and min(latencies) > 0
    median = sorted(latencies)[3]
    print(f"slow-broker: librdkafka produce latencies {[round(x, 3) for x in latencies]}")
    assert 0.3 < median < 2.0, f"median produce latency {median:.3f} s for a 500 +- 150 ms delay"
    got = consume_in_order(proxy.bootstrap, topic, 1, 6)
    assert [k for _o, k in got[0]] == [b"%d" % i for i in range(6)]
    kp = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all")
    try:
        started = time.monotonic()
        kp.send(topic, value=b"kp").get(timeout=15)
        assert time.monotonic() - started > 0.3
    finally:
        kp.close(timeout=5)


# -- quota-throttling.yaml ---------------------------------------------------------------------------------
QUOTA = EXAMPLES / "quota-throttling.yaml"
MIB = 1 << 20


def test_quota_throttling_holds_a_batch_producer_to_1_mib_per_second_and_librdkafka_reports_it(
        example: Any) -> None:
    proxy = example(QUOTA)
    topic = unique("quota")
    create_topic(proxy.bootstrap, topic, 1)
    stats: list[dict[str, Any]] = []
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": "batch-loader", "linger.ms": 5,
                         "statistics.interval.ms": 500, "stats_cb": lambda s: stats.append(json.loads(s))})
    payload = b"q" * 10_000

    def send(total: int) -> float:
        started = time.monotonic()
        for _ in range(total // len(payload)):
            while True:
                try:
                    producer.produce(topic, value=payload)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        assert producer.flush(30) == 0
        return time.monotonic() - started

    send(MIB + MIB // 2)  # the bucket's one second of burst, spent
    total = 3 * MIB
    measured = total / send(total)
    producer.poll(1.0)
    print(f"quota-throttling: librdkafka batch-loader {measured / MIB:.3f} MiB/s for 1 MiB/s")
    assert abs(measured - MIB) / MIB <= 0.10, f"{measured:.0f} B/s for a {MIB} B/s quota"
    throttles = [b["throttle"]["max"] for s in stats for b in s["brokers"].values() if b.get("nodeid", -1) >= 0]
    assert max(throttles) > 0, "librdkafka saw no throttle_time_ms"


def test_quota_throttling_holds_a_batch_consumer_to_20_fetches_a_second_and_leaves_others_alone(
        example: Any) -> None:
    proxy = example(QUOTA)
    topic = unique("quota-fetch")
    create_topic(proxy.bootstrap, topic, 1)

    def fetches_per_second(client_id: str) -> float:
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("q"), "client.id": client_id,
                             "fetch.wait.max.ms": 10, "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            consumer.consume(timeout=1.0)  # connected and fetching
            before, started = request_count(proxy, "fetch"), time.monotonic()
            while time.monotonic() - started < 3.0:
                consumer.consume(timeout=0.2)
            return (request_count(proxy, "fetch") - before) / (time.monotonic() - started)
        finally:
            consumer.close()

    batch, other = fetches_per_second("batch-reader"), fetches_per_second("dashboard")
    print(f"quota-throttling: batch-reader {batch:.1f} fetches/s, dashboard {other:.1f} fetches/s")
    assert batch <= 20 * 1.15, f"{batch:.1f} fetches a second for a quota of 20"
    assert other > 2 * batch, "a client outside the rule should fetch as fast as it likes"


# -- protocol-downgrade.yaml ---------------------------------------------------------------------------------
def test_protocol_downgrade_librdkafka_and_kafka_python_keep_working_at_the_advertised_versions(
        example: Any) -> None:
    proxy = example(EXAMPLES / "protocol-downgrade.yaml")
    topic = unique("downgrade")
    create_topic(proxy.bootstrap, topic, 1)
    sent = keyed("old", 20, 1)
    assert not produce_each(proxy.bootstrap, topic, sent, acks="all")
    assert_each_once_in_order(consume_in_order(proxy.bootstrap, topic, 1, len(sent)), sent)
    kp = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all")
    try:
        kp.send(topic, key=b"kp", value=b"old").get(timeout=15)
    finally:
        kp.close(timeout=5)
    consumer = KafkaConsumer(bootstrap_servers=proxy.bootstrap, group_id=None, auto_offset_reset="earliest")
    try:
        consumer.assign([KTopicPartition(topic, 0)])
        read: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(read) < len(sent) + 1 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=300).values():
                read.extend(r.key for r in records)
    finally:
        consumer.close()
    assert read == [k for _p, k, _v in sent] + [b"kp"]
    caps = {"produce": 8, "fetch": 11, "metadata": 9}
    seen = {api: request_versions(proxy, api) for api in caps}
    print(f"protocol-downgrade: versions used {seen}")
    for api, cap in caps.items():
        assert seen[api] and max(seen[api]) == cap, f"{api}: versions {seen[api]} for an advertised maximum {cap}"


# -- consumer-group-rebalance-chaos.yaml -------------------------------------------------------------------
def test_rebalance_chaos_a_librdkafka_group_loses_no_committed_offset_and_has_no_gaps(
        example: Any, caplog: pytest.LogCaptureFixture) -> None:
    proxy = example(EXAMPLES / "consumer-group-rebalance-chaos.yaml")
    topic, group = unique("payments-topic"), unique("payments")
    create_topic(proxy.bootstrap, topic, 1)
    sent = keyed("pay", 200, 1)
    assert not produce_each(proxy.bootstrap, topic, sent)
    keys = [k for _p, k, _v in sent]

    def run(enough: Callable[[list[bytes]], bool]) -> tuple[list[bytes], int, list[str]]:
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": group, "enable.auto.commit": False,
                             "auto.offset.reset": "earliest", "heartbeat.interval.ms": 100,
                             "session.timeout.ms": 10000, "fetch.max.bytes": 4096, "message.max.bytes": 4096,
                             "max.partition.fetch.bytes": 4096})
        read: list[bytes] = []
        commit_errors: list[str] = []
        committed = -1
        try:
            consumer.subscribe([topic])
            # Generous: the example's slow joins and moved coordinators make each rejoin take seconds, more
            # on a loaded machine; the loop ends as soon as the member has read enough.
            deadline = time.monotonic() + 90
            while not enough(read) and time.monotonic() < deadline:
                batch = [m for m in consumer.consume(num_messages=2, timeout=0.3) if m.error() is None]
                if not batch:
                    continue
                read.extend(m.key() for m in batch)
                try:
                    done = consumer.commit(asynchronous=False)
                    committed = max(committed, *(tp.offset for tp in done or []))
                except Exception as err:  # what reaches the application is what is measured
                    commit_errors.append(str(err))
        finally:
            consumer.close()
        return read, committed, commit_errors

    with caplog.at_level(logging.INFO, "kproxy.faults"):
        first, committed, errors_1 = run(lambda read: len(read) >= 100)
        # The rules go on refusing commits and moving the coordinator while the second member reads, so
        # it too may read records again: it reads until it has seen every record past the committed offset.
        second, _c, errors_2 = run(lambda read: set(keys[max(committed, 0):]) <= set(read))
    hits = {r: len(faults(caplog, r)) for r in ("heartbeat-rebalance", "commit-coordinator-moved",
                                                "find-coordinator-flaps", "slow-join")}
    print(f"rebalance chaos: rule hits {hits}; first consumer read {len(first)} (committed up to {committed}), second "
          f"{len(second)}; commit errors reaching the application: {errors_1 + errors_2}")
    # A commit the rules refused leaves its records uncommitted: after the rebalance the member reads
    # them again (at least once), so a step back is allowed; a step forward past the next record is a gap.
    order = [keys.index(k) for k in first]
    assert order[0] == 0 and all(b == a + 1 or b <= a for a, b in itertools.pairwise(order)), \
        f"the first member read a gap or out of order: {order}"
    assert second and second[0] in keys[:max(order) + 2], "the second member started past the committed offset"
    order = [keys.index(k) for k in second]
    assert order[0] <= committed, f"the second member started at {order[0]}, past the committed offset {committed}"
    assert all(b == a + 1 or b <= a for a, b in itertools.pairwise(order)), f"a gap after the rejoin: {order}"
    assert set(first) | set(second) == set(keys), "records never read"
    assert hits["slow-join"] and hits["heartbeat-rebalance"] and hits["commit-coordinator-moved"]


# -- duplicated-and-corrupted-records.yaml -------------------------------------------------------------------
DUPLICATED = EXAMPLES / "duplicated-and-corrupted-records.yaml"


@pytest.fixture(scope="module")
def own_broker() -> Iterator[Broker]:
    """A broker of this module's own: the example names its topics ("events", "payments") exactly."""
    with run_tansu() as broker:
        create_topic(broker.bootstrap, "events", 1)
        create_topic(broker.bootstrap, "payments", 1)
        # One record of 900 bytes per batch, so one batch per Fetch of at most 1000 bytes below:
        # hundreds of Fetches for the rules' draws.
        producer = Producer({"bootstrap.servers": broker.bootstrap, "batch.num.messages": 1, "linger.ms": 0})
        for i in range(600):
            producer.produce("events", key=b"e%05d" % i, value=(b"event %d " % i).ljust(900, b"e"))
            producer.poll(0)
        for i in range(150):
            # Confluent wire format: magic 0, schema id 7, payload.
            producer.produce("payments", key=b"p%05d" % i,
                             value=b"\0" + struct.pack(">i", 7) + (b"pay %d " % i).ljust(900, b"p"))
            producer.poll(0)
        assert producer.flush(60) == 0
        yield broker


ONE_BATCH = {"message.max.bytes": 1000, "fetch.max.bytes": 1000, "max.partition.fetch.bytes": 1,
             "fetch.wait.max.ms": 10}


def read_events(bootstrap: str, topic: str, count: int, deadline: float = 45.0,
                **config: Any) -> tuple[list[tuple[int, bytes]], list[Any]]:
    """librdkafka, no group, one batch per Fetch: (offset, value) delivered and the errors, in order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("events"), "client.id": "events-reader",
                         "enable.auto.commit": False, **ONE_BATCH, **config})
    got: list[tuple[int, bytes]] = []
    errors: list[Any] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        until = time.monotonic() + deadline
        while (not got or got[-1][0] < count - 1) and time.monotonic() < until:
            for msg in consumer.consume(num_messages=100, timeout=0.3):
                if msg.error() is not None:
                    errors.append(msg.error())
                else:
                    got.append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    return got, errors


def test_duplicated_batches_reach_the_librdkafka_application_and_a_bad_crc_passes_unchecked(
        own_broker: Broker, example: Any, caplog: pytest.LogCaptureFixture) -> None:
    """librdkafka 2.16 hands each copy of a duplicated batch to the application (the same offsets
    again, right after the first), so the application must skip offsets below its position
    itself. ``check.crcs`` is off by default: a batch whose CRC is wrong (its records intact) passes."""
    proxy = example(DUPLICATED, own_broker.bootstrap)
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        got, errors = read_events(proxy.bootstrap, "events", 600)
    duplicated = faults(caplog, "fetch-duplicates")
    corrupted = faults(caplog, "fetch-corrupt-crc")
    offsets = [o for o, _v in got]
    repeated = len(offsets) - len(set(offsets))
    print(f"duplicated-and-corrupted: {len(duplicated)} Fetch answers duplicated, {len(corrupted)} with a bad CRC; "
          f"librdkafka delivered {repeated} offsets twice, errors {errors}")
    assert len(duplicated) >= 5 and corrupted
    assert repeated > 0, "librdkafka skipped the copies"
    assert sorted(set(offsets)) == list(range(600)), "an offset skipped"
    assert not errors


def test_a_bad_crc_is_surfaced_by_librdkafka_with_check_crcs(
        own_broker: Broker, example: Any, caplog: pytest.LogCaptureFixture) -> None:
    """``check.crcs=true``: the first bad CRC reaches the application as _BAD_MSG."""
    proxy = example(DUPLICATED, own_broker.bootstrap)
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        got, errors = read_events(proxy.bootstrap, "events", 600, deadline=8.0, **{"check.crcs": True})
    corrupted = faults(caplog, "fetch-corrupt-crc")
    offsets = [o for o, _v in got]
    print(f"check.crcs=true: {len(corrupted)} bad CRCs sent, errors {[str(e) for e in errors]}; "
          f"{600 - len(set(offsets))} offsets not delivered within 8 s")
    assert corrupted, "the rule's 1 % draw should have hit one of ~300 Fetches"
    assert errors and errors[0].code() == KafkaError._BAD_MSG


def test_an_unknown_schema_id_fails_the_deserializer_of_exactly_the_edited_records(
        own_broker: Broker, example: Any, caplog: pytest.LogCaptureFixture) -> None:
    known = {7}
    proxy = example(DUPLICATED, own_broker.bootstrap)
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        got, errors = read_events(proxy.bootstrap, "payments", 150)
    assert not errors
    unknown = [offset for offset, value in got if struct.unpack(">i", value[1:5])[0] not in known]
    print(f"invalid_schema_id: offsets with an unknown schema id {unknown}")
    edited = [int(f["detail"].rsplit(": ", 1)[1].split()[0]) for f in faults(caplog, "payments-unknown-schema")]
    assert edited and sum(edited) == len(unknown), f"the fault lines count {edited} records edited"
    assert all(struct.unpack(">i", v[1:5])[0] == 999999 and v[0] == 0 for o, v in got if o in unknown)
    assert [o for o, _v in got] == list(range(150)), "the other records pass unchanged, in order"


# -- broken-broker.yaml ---------------------------------------------------------------------------------------
# A `probability` draw is keyed on the request's ordinal among its client id's requests of that api
# (kproxy/rules/engine.py), over every connection: keyed per connection, the draw that reset the
# first Fetch of a connection reset the first Fetch of every new one, and librdkafka's consumer was
# reset 43 times in 45 s and read nothing (tests/test_rules_draws_reconnect.py).
def test_broken_broker_an_idempotent_producer_loses_and_duplicates_nothing(
        example: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Minutes become seconds (1/30): resets and dropped Fetch answers from the start, the blackhole
    from 2 s to 3 s, the slow close at 3 s; the last rule (every request closed from 4 s on) leaves a
    one-broker cluster nothing to fall back on, so the producer and the consumer finish before it."""
    path = example_for_one_broker("broken-broker.yaml", tmp_path, {2: TANSU_NODE_ID}, seconds=1 / 30)
    doc = yaml.safe_load(path.read_text())
    doc["rules"][-1]["match"]["schedule"]["after_seconds"] = 600
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    bootstrap = example(path).bootstrap
    topic = unique("broken")
    create_topic(bootstrap, topic, 1)
    sent = keyed("broken", 120, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "request.timeout.ms": 800, "socket.timeout.ms": 800, "reconnect.backoff.ms": 50,
                         "linger.ms": 0})
    errors: list[Any] = []
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        for _p, key, value in sent:  # over ~4 s: through the blackhole and the slow close
            producer.produce(topic, key=key, value=value, on_delivery=lambda e, _m: errors.append(e) if e else None)
            producer.poll(0.03)
        assert producer.flush(30) == 0
        assert not errors, errors[:3]
        # A dropped Fetch answer holds the partition until librdkafka gives the request up: socket.timeout.ms.
        got = consume_in_order(bootstrap, topic, 1, len(sent), **{"fetch.wait.max.ms": 50,
                                                                  "socket.timeout.ms": 1500})
    assert faults(caplog, "broker-2-resets") and faults(caplog, "broker-2-blackhole-after-a-minute")
    assert_each_once_in_order(got, sent)


# -- hidden-broker.yaml -----------------------------------------------------------------------------------------
def _produce_orders_0(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 3000, "enable.idempotence": False,
                         "topic.metadata.refresh.interval.ms": 500})
    producer.produce("orders", value=b"x", partition=0)
    producer.flush(6)


async def test_hidden_broker_librdkafka_never_reaches_broker_3_and_sends_orders_0_to_broker_1() -> None:
    """Three scripted brokers (1, 2, 3); orders/0 is led by 3. Broker 1 answers NOT_LEADER_OR_FOLLOWER
    (it is not the leader): librdkafka refreshes its metadata and retries there, never on broker 3."""
    async with fake_cluster((1, 2, 3)) as cluster:
        cluster.add_topic("orders", [3, 2])
        config = proxy_config(cluster.bootstrap, rules=str(EXAMPLES / "hidden-broker.yaml"))
        async with running_server(config) as server:
            await trio.to_thread.run_sync(_produce_orders_0, f"127.0.0.1:{server.bootstrap_port}")
    produced = [r.node_id for r in cluster.received if r.api_key == PRODUCE and r.request is not None]
    assert produced and set(produced) == {1}, f"Produce for orders/0 reached nodes {produced}"
    client_requests_to_3 = [r for r in cluster.of(3) if r.request is not None
                            and r.request.header.client_id != DISCOVERY_CLIENT_ID]
    assert not client_requests_to_3, f"the hidden broker was reached: {client_requests_to_3[:3]}"
