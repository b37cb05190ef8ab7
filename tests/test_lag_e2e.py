"""Consumer lag with real clients, through a real kproxy, on the real Tansu broker.

A librdkafka producer writes 8 records to each of a topic's two partitions; a kafka-python consumer
group (``stopped``) reads them, committing as it reads, and is stopped; the producer writes 12 more
to each partition; a librdkafka consumer group (``live``) reads everything and reads on. kproxy's
series must then say exactly what the clients did:

* ``kproxy_consumergroup_lag{group=stopped}`` per partition is the records produced there less the
  offset the group committed (its consumer's own ``committed()``), and ``lag_sum`` their sum;
  ``kproxy_consumergroup_committed_offset`` and ``kproxy_partition_high_watermark`` are those
  two numbers; the live group's lag is 0;
* produced further, the stopped group's lag grows by exactly that (the live group's Fetch answers
  carry the new watermarks) and the live group's comes back to 0 as it reads them;
* the stopped group committing no more, its series disappear after the staleness window (small
  here) while the live group's stay;
* the run's capture (schema version 3) holds the same: the lag computed offline from its records,
  up to one scrape, is that scrape's.

Tansu reports a partition's end offset (ListOffsets latest) as its last batch's first offset + 1,
not its last offset + 1 (checked directly against Tansu before anything goes through kproxy: with
batches of several records the two differ, so a lag read from ListOffsets would be off). The
producer therefore sends one record per batch, where both are the number of records produced;
the test checks that on the broker itself first. (kproxy reads Fetch answers' ``high_watermark``,
which Tansu gives right; it reads ListOffsets latest answers too.)
"""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition
from prometheus_client.parser import text_string_to_metric_families

from kproxy.testing import Broker, free_port, running_proxy
from tests.support.e2e import create_topic, unique

PARTITIONS = 2
PER_PARTITION = 20
FIRST = 8  # records per partition the stopped group reads and commits before it stops
MORE = 3  # produced to each partition later
STALE_AFTER = 15.0  # seconds: kproxy's staleness window in this test (300 s by default)
KAFKA_PYTHON_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000, "max_poll_interval_ms": 10000}


def produce(producer: Producer, topic: str, per_partition: int, tag: str) -> None:
    """``per_partition`` records to each partition, one record per batch (flushed one by one)."""
    for i in range(per_partition):
        for partition in range(PARTITIONS):
            producer.produce(topic, value=f"{tag}-{i}".encode(), partition=partition)
            assert producer.flush(10) == 0


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
            for f in text_string_to_metric_families(text)}


def series(metrics: dict[str, Any], family: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of ``family`` carrying ``labels``, keyed by their other labels."""
    out = {}
    for key, value in metrics.get(family, {}).items():
        found = dict(key)
        if all(found.get(k) == v for k, v in labels.items()):
            out[tuple((k, v) for k, v in key if k not in labels)] = value
    return out


def wait_for(port: int, check: Any, what: str, timeout: float = 30.0) -> dict[str, Any]:
    """Scrape until ``check(metrics)`` holds (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = scrape(port)
        if check(metrics):
            return metrics
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s; last scrape: "
                                 f"{ {k: v for k, v in metrics.items() if 'consumergroup' in k or 'watermark' in k} }")
        time.sleep(0.3)


class LiveConsumer:
    """A librdkafka consumer group member reading on in a thread (auto-commit every 500 ms)."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                                  "enable.auto.commit": True, "auto.commit.interval.ms": 500,
                                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000})
        self.consumer.subscribe([topic])
        self.group = group
        self.read = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            message = self.consumer.poll(0.2)
            if message is not None and not message.error():
                self.read += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)
        self.consumer.close()


def test_lag_equals_produced_minus_committed_for_a_stopped_group(tansu: Broker, tmp_path: Path) -> None:
    port = free_port()
    topic, live_group, stopped_group = unique("lag"), unique("live"), unique("stopped")
    with running_proxy(tansu.bootstrap, metrics_listen=f"127.0.0.1:{port}", metrics__consumer_lag_partitions=True,
                       metrics__consumer_lag_stale_after=STALE_AFTER, capture__dir=str(tmp_path)) as proxy:
        bootstrap = proxy.bootstrap
        create_topic(bootstrap, topic, PARTITIONS)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1,
                             "client.id": "lag-producer"})
        live = LiveConsumer(bootstrap, topic, live_group)  # reading from the start (its group joined early)
        try:
            at, metrics = _lag_of_a_stopped_group(tansu, bootstrap, port, topic, producer, live, stopped_group)
        finally:
            live.close()
    # Offline, from the capture of the same run (complete once kproxy stopped): the last committed offsets
    # and watermarks recorded before that scrape give the lag the live series gave then.
    offline = capture_lag(tmp_path, at)
    live_lag = {(dict(k)["group"], dict(k)["topic"], int(dict(k)["partition"])): v
                for k, v in metrics["kproxy_consumergroup_lag"].items()}
    assert {k: v for k, v in offline.items() if k in live_lag} == live_lag
    assert {k[0] for k in live_lag} >= {live_group, stopped_group}


def capture_lag(directory: Path, until: float) -> dict[tuple[str, str, int], int]:
    """Lag per (group, topic, partition) from a capture's records released up to ``until`` (wall clock)."""
    import pyarrow.parquet as pq

    committed: dict[tuple[str, str, int], int] = {}
    marks: dict[tuple[str, int], int] = {}
    rows = [r for f in sorted(directory.rglob("capture-*.parquet")) for r in pq.read_table(f).to_pylist()]
    for row in sorted((r for r in rows if r["response_time"] is not None), key=lambda r: r["response_time"]):
        if row["response_time"].timestamp() > until:
            break
        for p in row["partitions"]:
            if p["committed_offset"] is not None:
                committed[(p["group_id"], p["topic"], p["partition"])] = p["committed_offset"]
            if p["high_watermark"] is not None:
                marks[(p["topic"], p["partition"])] = p["high_watermark"]
    return {key: max(0, marks[key[1:]] - offset) for key, offset in committed.items() if key[1:] in marks}


def _lag_of_a_stopped_group(tansu: Broker, bootstrap: str, port: int, topic: str, producer: Producer,
                            live: LiveConsumer, stopped_group: str) -> tuple[float, dict[str, Any]]:
    """The test's traffic and live checks; returns a scrape of them (and its wall time) that the capture
    must agree with."""
    live_group = live.group
    produce(producer, topic, FIRST, "a")

    # The stopped group: kafka-python, committing after each poll, stopped once it has read the records
    # there are so far: the second half, produced after, is its lag.
    stopped = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=stopped_group, enable_auto_commit=False,
                            auto_offset_reset="earliest", request_timeout_ms=15000, **KAFKA_PYTHON_GROUP)
    try:
        read = 0
        deadline = time.monotonic() + 45
        while read < PARTITIONS * FIRST and time.monotonic() < deadline:
            for records in stopped.poll(timeout_ms=500, max_records=3).values():
                read += len(records)
            stopped.commit()
            last_commit = time.monotonic()
        committed = {p: stopped.committed(KTopicPartition(topic, p)) for p in range(PARTITIONS)}
    finally:
        stopped.close()
    assert committed == dict.fromkeys(range(PARTITIONS), FIRST)

    produce(producer, topic, PER_PARTITION - FIRST, "b")
    # The broker itself, without kproxy: one record per batch, so its end offsets are the counts.
    probe = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": unique("probe")})
    try:
        assert [probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)] == [PER_PARTITION] * PARTITIONS
    finally:
        probe.close()

    def caught_up(metrics: dict[str, Any]) -> bool:
        return (series(metrics, "kproxy_consumergroup_lag_sum", group=live_group) == {(("topic", topic),): 0}
                and len(series(metrics, "kproxy_consumergroup_lag", group=stopped_group)) == PARTITIONS)

    metrics = wait_for(port, caught_up, "the live group caught up and the stopped group's lag exported")
    expected = {(("partition", str(p)), ("topic", topic)): PER_PARTITION - c for p, c in committed.items()}
    assert series(metrics, "kproxy_consumergroup_lag", group=stopped_group) == expected
    assert series(metrics, "kproxy_consumergroup_lag_sum", group=stopped_group) == {
        (("topic", topic),): PARTITIONS * PER_PARTITION - sum(committed.values())}
    assert series(metrics, "kproxy_consumergroup_committed_offset", group=stopped_group) == {
        (("partition", str(p)), ("topic", topic)): c for p, c in committed.items()}
    assert series(metrics, "kproxy_partition_high_watermark", topic=topic) == {
        (("partition", str(p)),): PER_PARTITION for p in range(PARTITIONS)}

    # Produced further: the stopped group's lag grows by exactly that; the live group's is back to 0.
    produce(producer, topic, MORE, "c")
    total = PER_PARTITION + MORE

    def moved_on(metrics: dict[str, Any]) -> bool:
        return (series(metrics, "kproxy_partition_high_watermark", topic=topic)
                == {(("partition", str(p)),): total for p in range(PARTITIONS)}
                and series(metrics, "kproxy_consumergroup_lag_sum", group=live_group) == {(("topic", topic),): 0})

    metrics = wait_for(port, moved_on, "the new watermarks seen and the live group caught up again")
    at, moved = time.time(), metrics
    assert series(metrics, "kproxy_consumergroup_lag_sum", group=stopped_group) == {
        (("topic", topic),): PARTITIONS * total - sum(committed.values())}

    # The stopped group commits no more: its series go after the window; the live group's stay
    # (a record a second keeps it committing and fetching).
    deadline = time.monotonic() + STALE_AFTER + 30
    while True:
        produce(producer, topic, 1, "d")
        metrics = scrape(port)
        if not any(series(metrics, family, group=stopped_group) for family in (
                "kproxy_consumergroup_lag", "kproxy_consumergroup_lag_sum",
                "kproxy_consumergroup_committed_offset")):
            assert time.monotonic() > last_commit + STALE_AFTER - 1, "gone before the window ended"
            break
        assert time.monotonic() < deadline, "the stopped group's series outlived the staleness window"
        time.sleep(1.0)
    live_lag = series(metrics, "kproxy_consumergroup_lag_sum", group=live_group)
    assert set(live_lag) == {(("topic", topic),)} and live_lag[(("topic", topic),)] <= 2 * PARTITIONS
    assert live.read >= PARTITIONS * total
    return at, moved
