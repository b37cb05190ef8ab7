"""End to end with real clients: confluent-kafka (librdkafka) and kafka-python, through kproxy, to Tansu.

Every test makes its own topic, produces through kproxy, reads everything back
through kproxy and compares the exact (key, value) multiset, so a lost,
duplicated or corrupted record fails it. Data produced with one client is read
back with the other, so both clients' Produce and Fetch paths are crossed.
After each test, kproxy's log must show no connection it had to close for a
protocol error (a desynchronised stream, a response it could not rewrite).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition
from kafka.admin import NewTopic as KNewTopic

from kproxy.testing import Broker, ProxyThread
from tests.support.e2e import (
    PROXY_HOST,
    TANSU_NODE_ID,
    BrokerConnections,
    KeyValue,
    assert_kproxy_endpoint,
    assert_only_kproxy_reaches_broker,
    connections_total,
    consume_confluent,
    consume_kafka_python,
    create_topic,
    fetch_batch_codecs,
    fetch_batches,
    no_protocol_errors_in_kproxy,
    produce_confluent,
    unique,
)

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
PARTITIONS = 3
# Short group timeouts: Tansu completes a first JoinGroup only after a delay that
# grows with them (kafka-python's defaults make it wait ~20 s or more).
KAFKA_PYTHON_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000, "max_poll_interval_ms": 10000}
CONFLUENT_GROUP = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}


@pytest.fixture(autouse=True)
def _no_protocol_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    with no_protocol_errors_in_kproxy(caplog):
        yield


def messages(tag: str, n: int, size: int = 200) -> list[KeyValue]:
    """Distinct keys; compressible values of ``size`` bytes."""
    return [(f"{tag}-{i:05d}".encode(), (f"{tag}:{i}:" * (size // 8 + 1)).encode()[:size]) for i in range(n)]


def same_records(got: list[KeyValue], sent: list[KeyValue]) -> None:
    """Exact multiset equality, with a readable difference on failure."""
    got_c, sent_c = Counter(got), Counter(sent)
    missing, extra = sent_c - got_c, got_c - sent_c
    assert not missing and not extra, (f"{sum(missing.values())} records missing (e.g. {list(missing)[:3]}), "
                                       f"{sum(extra.values())} unexpected or duplicated (e.g. {list(extra)[:3]})")


@contextlib.contextmanager
def kafka_python_producer(bootstrap: str, topic: str, batch: list[KeyValue],
                          **config: object) -> Iterator[KafkaProducer]:
    """Produce ``batch``, wait for every future, keep the producer open for the block."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=15000, **config)
    try:
        futures = [producer.send(topic, key=k, value=v) for k, v in batch]
        producer.flush(timeout=30)
        for f in futures:
            f.get(timeout=15)  # raises the broker's (or the connection's) error, if any
        yield producer
    finally:
        producer.close(timeout=10)


def produce_kafka_python(bootstrap: str, topic: str, batch: list[KeyValue], **config: object) -> None:
    with kafka_python_producer(bootstrap, topic, batch, **config):
        pass


# -- topics -------------------------------------------------------------------------------------
def test_topics_created_through_kproxy_exist_on_the_broker(proxy: ProxyThread, tansu: Broker) -> None:
    before = connections_total(proxy)
    topic = unique("e2e-create")
    create_topic(proxy.bootstrap, topic, partitions=4)
    kp_topic = unique("e2e-create-kp")
    kp_admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap, request_timeout_ms=15000)
    try:
        kp_admin.create_topics([KNewTopic(kp_topic, num_partitions=2, replication_factor=1)], timeout_ms=15000)
        listed_kp = set(kp_admin.list_topics())
    finally:
        kp_admin.close()

    # Seen through kproxy, by both clients ...
    md = AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=15)
    assert len(md.topics[topic].partitions) == 4
    assert len(md.topics[kp_topic].partitions) == 2
    assert {topic, kp_topic} <= listed_kp
    for partition in md.topics[topic].partitions.values():
        assert partition.leader == TANSU_NODE_ID
    for broker in md.brokers.values():
        assert_kproxy_endpoint(proxy, tansu, broker.host, broker.port, f"metadata broker {broker.id}")
    # ... and on the broker itself (the requests really went upstream).
    direct = AdminClient({"bootstrap.servers": tansu.bootstrap}).list_topics(timeout=15)
    assert len(direct.topics[topic].partitions) == 4
    assert len(direct.topics[kp_topic].partitions) == 2
    assert connections_total(proxy) > before


# -- produce with every acks setting -------------------------------------------------------------
@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_confluent_produce_acks(proxy: ProxyThread, tansu: Broker, acks: str) -> None:
    topic = unique(f"e2e-rdk-acks{acks}")
    create_topic(proxy.bootstrap, topic, PARTITIONS)
    sent = messages(f"acks{acks}", 300)
    # Small batches: many Produce requests pipelined on one connection. The producer stays
    # open until the records are read: with acks=0, "delivered" only means "written".
    producer = produce_confluent(proxy.bootstrap, topic, sent, acks=acks,
                                 **{"linger.ms": 2, "batch.num.messages": 20, "enable.idempotence": False})
    same_records(consume_kafka_python(proxy.bootstrap, topic, PARTITIONS, len(sent)), sent)
    del producer


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_kafka_python_produce_acks(proxy: ProxyThread, tansu: Broker, acks: int | str) -> None:
    topic = unique(f"e2e-kp-acks{acks}")
    create_topic(proxy.bootstrap, topic, PARTITIONS)
    sent = messages(f"kp-acks{acks}", 300)
    with kafka_python_producer(proxy.bootstrap, topic, sent, acks=acks, linger_ms=2, batch_size=2048,
                               enable_idempotence=False):
        same_records(consume_confluent(proxy.bootstrap, topic, PARTITIONS, len(sent)), sent)


# -- idempotence ------------------------------------------------------------------------------------
def test_confluent_idempotent_producer(proxy: ProxyThread, tansu: Broker) -> None:
    topic = unique("e2e-rdk-idem")
    create_topic(proxy.bootstrap, topic, PARTITIONS)
    sent = messages("idem", 200)
    produce_confluent(proxy.bootstrap, topic, sent, acks="all", **{"enable.idempotence": True, "linger.ms": 2,
                                                                    "batch.num.messages": 25})
    same_records(consume_confluent(proxy.bootstrap, topic, PARTITIONS, len(sent)), sent)
    batches = fetch_batches(proxy.bootstrap, topic, PARTITIONS)
    # Every batch carries the producer id InitProducerId handed out through kproxy, with sequences.
    assert batches and all(b.producer_id >= 0 and b.base_sequence >= 0 for b in batches), batches
    assert len({b.producer_id for b in batches}) == 1


def test_kafka_python_idempotent_producer(proxy: ProxyThread, tansu: Broker) -> None:
    topic = unique("e2e-kp-idem")
    create_topic(proxy.bootstrap, topic, PARTITIONS)
    sent = messages("kp-idem", 200)
    produce_kafka_python(proxy.bootstrap, topic, sent, acks="all", enable_idempotence=True, linger_ms=2,
                         batch_size=2048)
    same_records(consume_kafka_python(proxy.bootstrap, topic, PARTITIONS, len(sent)), sent)
    batches = fetch_batches(proxy.bootstrap, topic, PARTITIONS)
    assert batches and all(b.producer_id >= 0 and b.base_sequence >= 0 for b in batches), batches
    assert len({b.producer_id for b in batches}) == 1


def test_confluent_transactions(proxy: ProxyThread, tansu: Broker) -> None:
    """InitProducerId, the transaction coordinator, AddPartitionsToTxn and EndTxn, all through kproxy."""
    topic = unique("e2e-rdk-txn")
    create_topic(proxy.bootstrap, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "transactional.id": unique("e2e-txn-id")})
    producer.init_transactions(20)
    committed: list[KeyValue] = []
    for round_, outcome in enumerate(["commit", "abort", "commit"]):
        batch = messages(f"txn{round_}-{outcome}", 20)
        producer.begin_transaction()
        for key, value in batch:
            producer.produce(topic, key=key, value=value)
        if outcome == "commit":
            producer.commit_transaction(20)
            committed += batch
        else:
            producer.abort_transaction(20)
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("e2e-txn-reader"),
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        got: list[KeyValue] = []
        deadline = time.monotonic() + 30
        while len(got) < len(committed) and time.monotonic() < deadline:
            got += [(m.key(), m.value()) for m in consumer.consume(num_messages=200, timeout=0.5)
                    if m.error() is None]
        got += [(m.key(), m.value()) for m in consumer.consume(num_messages=200, timeout=0.5) if m.error() is None]
    finally:
        consumer.close()
    same_records(got, committed)
    batches = fetch_batches(proxy.bootstrap, topic, PARTITIONS)
    assert batches and all(b.transactional and b.producer_id >= 0 for b in batches), batches


# -- compression ------------------------------------------------------------------------------------
@pytest.mark.parametrize("codec", CODECS)
def test_confluent_compressed_batches(proxy: ProxyThread, tansu: Broker, codec: str) -> None:
    topic = unique(f"e2e-rdk-{codec}")
    create_topic(proxy.bootstrap, topic, PARTITIONS)
    sent = messages(f"rdk-{codec}", 150, size=400)
    produce_confluent(proxy.bootstrap, topic, sent, acks="all", **{"compression.type": codec, "linger.ms": 10})
    # The broker holds batches in exactly that codec: kproxy passed them through untouched.
    assert set(fetch_batch_codecs(proxy.bootstrap, topic, PARTITIONS)) == {CODEC_IDS[codec]}
    same_records(consume_kafka_python(proxy.bootstrap, topic, PARTITIONS, len(sent)), sent)
    same_records(consume_confluent(proxy.bootstrap, topic, PARTITIONS, len(sent)), sent)


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_compressed_batches(proxy: ProxyThread, tansu: Broker, codec: str) -> None:
    topic = unique(f"e2e-kp-{codec}")
    create_topic(proxy.bootstrap, topic, PARTITIONS)
    sent = messages(f"kp-{codec}", 150, size=400)
    produce_kafka_python(proxy.bootstrap, topic, sent, acks="all", linger_ms=10,
                         compression_type=None if codec == "none" else codec)
    assert set(fetch_batch_codecs(proxy.bootstrap, topic, PARTITIONS)) == {CODEC_IDS[codec]}
    same_records(consume_confluent(proxy.bootstrap, topic, PARTITIONS, len(sent)), sent)
    same_records(consume_kafka_python(proxy.bootstrap, topic, PARTITIONS, len(sent)), sent)


# -- consumer groups and committed offsets -----------------------------------------------------------
def _next_offsets(consumed: list[tuple[int, int]]) -> dict[int, int]:
    """partition -> the offset after the last one consumed (what a commit records)."""
    out: dict[int, int] = {}
    for partition, offset in consumed:
        out[partition] = max(out.get(partition, 0), offset + 1)
    return out


def test_confluent_consumer_group_commits_offsets(proxy: ProxyThread, tansu: Broker) -> None:
    seen = BrokerConnections(tansu).start()
    topic, group = unique("e2e-rdk-group"), unique("e2e-rdk-g")
    create_topic(proxy.bootstrap, topic, PARTITIONS)
    sent = messages("grp", 90)
    produce_confluent(proxy.bootstrap, topic, sent, acks="all")

    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", **CONFLUENT_GROUP})
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    try:
        consumer.subscribe([topic])
        got: list[KeyValue] = []
        positions: list[tuple[int, int]] = []
        deadline = time.monotonic() + 45
        while len(got) < len(sent) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=200, timeout=0.5):
                assert msg.error() is None, msg.error()
                got.append((msg.key(), msg.value()))
                positions.append((msg.partition(), msg.offset()))
        same_records(got, sent)
        expected = _next_offsets(positions)

        committed = consumer.commit(asynchronous=False)
        assert committed is not None and all(tp.error is None for tp in committed), committed
        assert {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=15)} == expected

        # The admin view of the same group, through kproxy.
        result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                   request_timeout=15)[group].result(timeout=20)
        assert {tp.partition: tp.offset for tp in result.topic_partitions if tp.topic == topic} == expected
        listed = admin.list_consumer_groups(request_timeout=15).result(timeout=20)
        assert group in {g.group_id for g in listed.valid}
        description = admin.describe_consumer_groups([group], request_timeout=15)[group].result(timeout=20)
        assert description.group_id == group
        assert description.state == ConsumerGroupState.STABLE
        coordinator = description.coordinator
        assert coordinator.id == TANSU_NODE_ID
        assert_kproxy_endpoint(proxy, tansu, coordinator.host, coordinator.port, "group coordinator")
        for broker in consumer.list_topics(topic, timeout=15).brokers.values():
            assert_kproxy_endpoint(proxy, tansu, broker.host, broker.port, "consumer's metadata")
        # With the consumer, the admin client and their connections all open: none is direct.
        assert_only_kproxy_reaches_broker(proxy, seen)

        # Tansu's DescribeGroups lists no members (and names the member id as the protocol),
        # directly as through kproxy: compare with the broker's own answer instead.
        direct_admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
        direct = direct_admin.describe_consumer_groups([group], request_timeout=15)[group].result(timeout=20)
        assert (description.state, description.partition_assignor, description.is_simple_consumer_group,
                len(description.members)) == (direct.state, direct.partition_assignor,
                                              direct.is_simple_consumer_group, len(direct.members))
        assert (coordinator.host, coordinator.port) != (direct.coordinator.host, direct.coordinator.port)
    finally:
        consumer.close()

    # A new member of the group resumes after the committed offsets: it sees only new records.
    more = messages("grp-more", 12)
    produce_confluent(proxy.bootstrap, topic, more, acks="all")
    resumed = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": group, "enable.auto.commit": False,
                        "auto.offset.reset": "earliest", **CONFLUENT_GROUP})
    try:
        resumed.subscribe([topic])
        got = []
        deadline = time.monotonic() + 45
        while len(got) < len(more) and time.monotonic() < deadline:
            for msg in resumed.consume(num_messages=100, timeout=0.5):
                assert msg.error() is None, msg.error()
                got.append((msg.key(), msg.value()))
        for msg in resumed.consume(num_messages=100, timeout=0.5):
            got.append((msg.key(), msg.value()))
        same_records(got, more)
    finally:
        resumed.close()


def test_kafka_python_consumer_group_commits_offsets(proxy: ProxyThread, tansu: Broker) -> None:
    seen = BrokerConnections(tansu).start()
    topic, group = unique("e2e-kp-group"), unique("e2e-kp-g")
    create_topic(proxy.bootstrap, topic, PARTITIONS)
    sent = messages("kp-grp", 90)
    produce_kafka_python(proxy.bootstrap, topic, sent, acks="all")

    consumer = KafkaConsumer(topic, bootstrap_servers=proxy.bootstrap, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", request_timeout_ms=15000, **KAFKA_PYTHON_GROUP)
    admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap, request_timeout_ms=15000)
    try:
        got: list[KeyValue] = []
        positions: list[tuple[int, int]] = []
        deadline = time.monotonic() + 45
        while len(got) < len(sent) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((r.key, r.value) for r in records)
                positions.extend((r.partition, r.offset) for r in records)
        same_records(got, sent)
        expected = _next_offsets(positions)

        consumer.commit()
        assert {p: consumer.committed(KTopicPartition(topic, p)) for p in range(PARTITIONS)} == expected
        offsets = admin.list_group_offsets({group: None})[group]
        assert {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == topic} == expected
        assert group in {g["group_id"] for g in admin.list_groups()}

        # Every broker and the coordinator the client knows of are kproxy's.
        cluster = consumer._client.cluster  # kafka-python keeps its metadata here
        brokers = cluster.brokers()
        assert brokers
        for broker in brokers:
            assert_kproxy_endpoint(proxy, tansu, broker.host, broker.port, f"kafka-python broker {broker}")
        coordinator = cluster.broker_metadata(cluster.get_coordinator(group))
        assert coordinator is not None
        assert_kproxy_endpoint(proxy, tansu, coordinator.host, coordinator.port, "kafka-python coordinator")
        for node in admin.describe_cluster()["brokers"]:
            assert_kproxy_endpoint(proxy, tansu, node["host"], node["port"], "describe_cluster broker")
        assert_only_kproxy_reaches_broker(proxy, seen)
    finally:
        consumer.close()
        admin.close()

    more = messages("kp-grp-more", 12)
    produce_kafka_python(proxy.bootstrap, topic, more, acks="all")
    resumed = KafkaConsumer(topic, bootstrap_servers=proxy.bootstrap, group_id=group, enable_auto_commit=False,
                            auto_offset_reset="earliest", request_timeout_ms=15000, **KAFKA_PYTHON_GROUP)
    try:
        got = []
        deadline = time.monotonic() + 45
        while len(got) < len(more) and time.monotonic() < deadline:
            for records in resumed.poll(timeout_ms=500).values():
                got.extend((r.key, r.value) for r in records)
        for records in resumed.poll(timeout_ms=300).values():
            got.extend((r.key, r.value) for r in records)
        same_records(got, more)
    finally:
        resumed.close()


def test_clients_learn_only_kproxy_addresses(proxy: ProxyThread, tansu: Broker) -> None:
    """Metadata as each client sees it: the only broker is node 111, at a kproxy port."""
    assert proxy.bootstrap.rsplit(":", 1)[0] == PROXY_HOST
    md = AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=15)
    assert set(md.brokers) == {TANSU_NODE_ID}
    for broker in md.brokers.values():
        assert_kproxy_endpoint(proxy, tansu, broker.host, broker.port, "librdkafka metadata")
    admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap, request_timeout_ms=15000)
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    assert [b["broker_id"] for b in cluster["brokers"]] == [TANSU_NODE_ID]
    for node in cluster["brokers"]:
        assert_kproxy_endpoint(proxy, tansu, node["host"], node["port"], "kafka-python describe_cluster")
    assert str(tansu.port) not in repr(md.brokers) + repr(cluster)
