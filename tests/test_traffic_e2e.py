"""Issue 24's traffic series against what real clients did, through kproxy, to the real Tansu broker.

What the clients do (:func:`clients_did`, once for the module):

* two librdkafka producers (confluent-kafka), client ids ``traffic-gzip`` and ``traffic-lz4``, one
  compression codec each, write to two topics of two partitions, flushing now and then (several
  batches), one after the other;
* a kafka-python consumer in a group subscribes to both topics, reads every record and commits;
* a librdkafka consumer (no group, partitions assigned) reads every record too: librdkafka fetches
  with Fetch v16, which names topics by id (KIP-516), kafka-python with v12, by name.

What they did is then read from the broker behind kproxy's back: one Fetch straight to Tansu gives
every batch as stored (its size, codec and record count), which is what the producers sent (their
statistics say no request was retried) and what each consumer received once. Every series of
kproxy's /metrics (a real scrape) must equal the numbers derived from those batches: bytes and
records per topic and per client, exactly; producer batches by client, codec and acks, and their
sizes; and, while each client was connected, ``kproxy_client_info`` with the software name and
version the library sends (from the library's own version calls), valued at its connections as
the operating system counts them, gone once it closed.

Consumer lag is issue 24's too, in another branch: its checks extend :class:`ClientsDid` (the group,
the committed offsets, the topics) and :func:`clients_did`'s steps.
"""

from __future__ import annotations

import gc
import json
import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
import kafka
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer

from kproxy.protocol.compression import Codec
from kproxy.testing import Broker, ProxyThread, free_port, running_proxy
from tests.support.e2e import _established_to, kproxy_ports
from tests.support.rawkafka import StoredBatch, stored_batches

PRODUCERS = {"traffic-gzip": ("gzip", Codec.GZIP), "traffic-lz4": ("lz4", Codec.LZ4)}
GROUP_READER, ASSIGNED_READER = "traffic-reader", "traffic-reader-rdkafka"
PARTITIONS = 2
MESSAGES = 60  # per producer, spread over both topics and partitions
RDKAFKA = ("confluent-kafka-python", f"{confluent_kafka.__version__}-rdkafka-{confluent_kafka.libversion()[0]}")
KAFKA_PYTHON = ("kafka-python", kafka.__version__)


def wait_until(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


# -- /metrics as Prometheus reads it ------------------------------------------------------------------------
def scrape(address: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """kproxy's /metrics: metric name -> sorted label pairs -> value."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for line in text.split("\n"):  # (not splitlines: a label value may hold \v, \f, \x1c...)
        m = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if m is not None:
            labels = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or "")))
            out.setdefault(m.group(1), {})[labels] = float(m.group(3))
    return out


def sample(metrics: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str) -> float | None:
    return metrics.get(name, {}).get(tuple(sorted(labels.items())))


def client_info(address: str, client_id: str) -> dict[tuple[str, str], float]:
    """``kproxy_client_info`` of one client id: (software name, version) -> value."""
    return {(d["software_name"], d["software_version"]): v
            for key, v in scrape(address).get("kproxy_client_info", {}).items()
            if (d := dict(key))["client_id"] == client_id}


def open_connections(proxy: ProxyThread) -> int:
    """Client connections to kproxy's listeners, as the operating system counts them (ESTABLISHED)."""
    return sum(len(_established_to(port)) for port in kproxy_ports(proxy))


# -- what the clients did -------------------------------------------------------------------------------------
@dataclass
class ClientsDid:
    proxy: ProxyThread
    metrics: str  # kproxy's metrics address
    topics: dict[str, int]  # name -> partitions
    group: str
    produced: dict[str, int] = field(default_factory=dict)  # client id -> records delivered
    consumed: dict[str, int] = field(default_factory=dict)  # client id -> records read
    committed: dict[tuple[str, int], int] = field(default_factory=dict)  # the group's offsets, as committed
    # client id -> (kproxy_client_info of it while it was connected, its connections then)
    info: dict[str, tuple[dict[tuple[str, str], float], int]] = field(default_factory=dict)
    info_after_close: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)
    stored: list[StoredBatch] = field(default_factory=list)  # every batch, read from the broker directly


def seen_while_open(did: ClientsDid, client_id: str, software: tuple[str, str]) -> None:
    """Note ``client_id``'s kproxy_client_info while it is the only client connected, once kproxy counts
    as many connections for it as the operating system shows (kproxy hears of a connection a moment
    after it opens: up to 20 s are given; the last reading is noted either way, for the test to judge)."""
    deadline = time.monotonic() + 20
    while True:
        connections = open_connections(did.proxy)
        info = client_info(did.metrics, client_id)
        if (connections and info.get(software) == connections) or time.monotonic() > deadline:
            did.info[client_id] = (info, connections)
            return
        time.sleep(0.1)


def gone_after_close(did: ClientsDid, client_id: str) -> None:
    """Note ``client_id``'s kproxy_client_info once its connections are closed (kproxy hears of a
    close a moment after the operating system: up to 10 s are given for it to go)."""
    wait_until(f"{client_id}'s connections to close", lambda: open_connections(did.proxy) == 0)
    deadline = time.monotonic() + 10
    while (info := client_info(did.metrics, client_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    did.info_after_close[client_id] = info


def produce(did: ClientsDid, client_id: str, codec: str) -> None:
    producer = send(did, client_id, codec)
    seen_while_open(did, client_id, RDKAFKA)
    del producer
    gc.collect()  # rd_kafka_destroy: its connections close now
    gone_after_close(did, client_id)


def send(did: ClientsDid, client_id: str, codec: str) -> Producer:
    """``MESSAGES`` records from one producer, all delivered, none retried; the producer, still open."""
    stats: list[dict[str, Any]] = []
    delivered: list[bool] = []
    producer = Producer({"bootstrap.servers": did.proxy.bootstrap, "client.id": client_id, "compression.type": codec,
                         "linger.ms": 5, "acks": "all", "statistics.interval.ms": 100,
                         "stats_cb": lambda s: stats.append(json.loads(s))})
    topics = list(did.topics)
    for i in range(MESSAGES):
        producer.produce(topics[i % 2], partition=(i // 2) % PARTITIONS, key=f"{client_id}-{i}".encode(),
                         value=(f"{codec}-{i}-" * 20).encode(),
                         on_delivery=lambda err, _m: delivered.append(err is None))
        if i % 15 == 14:
            producer.flush(10)  # several requests, several batches per partition
    assert producer.flush(15) == 0
    assert delivered == [True] * MESSAGES
    did.produced[client_id] = MESSAGES
    before = len(stats)

    def fresh_stats() -> bool:  # a statistics report made after the last send
        producer.poll(0.1)
        return len(stats) > before + 1

    wait_until("librdkafka statistics", fresh_stats)
    retries = sum(b.get("txretries", 0) for b in stats[-1]["brokers"].values())
    assert retries == 0, "a retried Produce is sent twice: the expected numbers below assume none"
    return producer


def consume_in_a_group(did: ClientsDid) -> None:
    expected = sum(did.produced.values())
    consumer = KafkaConsumer(*did.topics, bootstrap_servers=did.proxy.bootstrap, group_id=did.group,
                             client_id=GROUP_READER, auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        read = 0
        deadline = time.monotonic() + 90  # Tansu delays a new group's first rebalance
        while read < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                read += len(records)
        assert read == expected, f"read {read} of {expected}"
        consumer.commit()
        for topic, partitions in did.topics.items():
            for p in range(partitions):
                committed = consumer.committed(kafka.TopicPartition(topic, p))
                assert committed is not None
                did.committed[(topic, p)] = committed
        did.consumed[GROUP_READER] = read
        seen_while_open(did, GROUP_READER, KAFKA_PYTHON)
    finally:
        consumer.close()
    gone_after_close(did, GROUP_READER)


def consume_assigned(did: ClientsDid) -> None:
    expected = sum(did.produced.values())
    consumer = Consumer({"bootstrap.servers": did.proxy.bootstrap, "group.id": f"unused-{did.group}",
                         "client.id": ASSIGNED_READER, "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, n in did.topics.items() for p in range(n)])
        read = 0
        deadline = time.monotonic() + 40
        while read < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                read += 1
        assert read == expected, f"read {read} of {expected}"
        did.consumed[ASSIGNED_READER] = read
        seen_while_open(did, ASSIGNED_READER, RDKAFKA)
    finally:
        consumer.close()
    gone_after_close(did, ASSIGNED_READER)


@pytest.fixture(scope="module")
def clients_did(tansu: Broker) -> Iterator[ClientsDid]:
    metrics = f"127.0.0.1:{free_port()}"
    with running_proxy(tansu.bootstrap, metrics_listen=metrics, metrics__topic_label=True,
                       metrics__client_id_label=True) as proxy:
        tag = uuid.uuid4().hex[:8]
        did = ClientsDid(proxy, metrics, {f"traffic-{tag}-a": PARTITIONS, f"traffic-{tag}-b": PARTITIONS},
                         group=f"traffic-group-{tag}")
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
        for future in admin.create_topics([NewTopic(t, n, 1) for t, n in did.topics.items()]).values():
            future.result(15)
        del admin
        gc.collect()
        wait_until("the admin client's connections to close", lambda: open_connections(proxy) == 0)
        for client_id, (codec, _) in PRODUCERS.items():
            produce(did, client_id, codec)
        consume_in_a_group(did)
        consume_assigned(did)
        did.stored = stored_batches(tansu.bootstrap, did.topics)
        yield did


# -- the series against what the clients did ---------------------------------------------------------------
def test_the_broker_holds_what_the_producers_sent(clients_did: ClientsDid) -> None:
    """The ground truth the other tests compare with: every record delivered is stored, in batches
    of the producer's codec (so a batch's codec says which producer sent it)."""
    did = clients_did
    assert sum(b.records for b in did.stored) == sum(did.produced.values())
    codecs = {codec for _, codec in PRODUCERS.values()}
    assert {b.codec for b in did.stored} == codecs
    for client_id, (_, codec) in PRODUCERS.items():
        assert sum(b.records for b in did.stored if b.codec == codec) == did.produced[client_id]
    assert len(did.stored) > 2 * len(did.topics) * PARTITIONS, "several batches per partition"


def test_bytes_and_records_per_topic(clients_did: ClientsDid) -> None:
    did = clients_did
    metrics = scrape(did.metrics)
    readers = len(did.consumed)
    for topic in did.topics:
        batches = [b for b in did.stored if b.topic == topic]
        size, records = sum(b.size for b in batches), sum(b.records for b in batches)
        assert sample(metrics, "kproxy_topic_bytes_total", topic=topic, direction="produce") == size
        assert sample(metrics, "kproxy_topic_records_total", topic=topic, direction="produce") == records
        # Each consumer received every batch once (v12 by name, v16 by id: both are this topic).
        assert sample(metrics, "kproxy_topic_bytes_total", topic=topic, direction="fetch") == readers * size
        assert sample(metrics, "kproxy_topic_records_total", topic=topic, direction="fetch") == readers * records
    total = sum(b.records for b in did.stored)
    assert sample(metrics, "kproxy_records_total", api="produce") == total
    assert sample(metrics, "kproxy_records_total", api="fetch") == readers * total


def test_bytes_and_records_per_client(clients_did: ClientsDid) -> None:
    did = clients_did
    metrics = scrape(did.metrics)
    for client_id, (_, codec) in PRODUCERS.items():
        batches = [b for b in did.stored if b.codec == codec]
        assert sample(metrics, "kproxy_client_bytes_total", client_id=client_id, direction="produce") == sum(
            b.size for b in batches)
        assert sample(metrics, "kproxy_client_records_total", client_id=client_id, direction="produce") == sum(
            b.records for b in batches)
        assert sample(metrics, "kproxy_client_bytes_total", client_id=client_id, direction="fetch") is None
    size, records = sum(b.size for b in did.stored), sum(b.records for b in did.stored)
    for reader in (GROUP_READER, ASSIGNED_READER):
        assert sample(metrics, "kproxy_client_bytes_total", client_id=reader, direction="fetch") == size
        assert sample(metrics, "kproxy_client_records_total", client_id=reader, direction="fetch") == records
        assert did.consumed[reader] == records


def test_producer_batches_by_codec_and_acks(clients_did: ClientsDid) -> None:
    did = clients_did
    metrics = scrape(did.metrics)
    batches = metrics.get("kproxy_produce_batches_total", {})
    assert {dict(k)["client_id"] for k in batches} == set(PRODUCERS)
    for client_id, (name, codec) in PRODUCERS.items():
        stored = [b for b in did.stored if b.codec == codec]
        # acks=all is -1 on the wire.
        assert sample(metrics, "kproxy_produce_batches_total", client_id=client_id, compression=name,
                      acks="-1") == len(stored)
        assert sample(metrics, "kproxy_produce_batch_bytes_count", compression=name) == len(stored)
        assert sample(metrics, "kproxy_produce_batch_bytes_sum", compression=name) == sum(b.size for b in stored)
        assert sample(metrics, "kproxy_produce_batch_bytes_bucket", compression=name, le="+Inf") == len(stored)


def test_client_software_as_the_libraries_send_it(clients_did: ClientsDid) -> None:
    did = clients_did
    expected = {**dict.fromkeys(PRODUCERS, RDKAFKA), GROUP_READER: KAFKA_PYTHON, ASSIGNED_READER: RDKAFKA}
    for client_id, software in expected.items():
        info, connections = did.info[client_id]
        assert info == {software: connections}, client_id
        assert did.info_after_close[client_id] == {}, client_id
