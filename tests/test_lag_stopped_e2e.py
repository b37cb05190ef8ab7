"""Consumer lag where it matters most, with real clients through a real kproxy on the real Tansu broker.

* A partition that only producers use through kproxy (no consumer fetches it there): its
  ``kproxy_partition_high_watermark`` comes from the Produce answers alone, and is exactly the
  partition's end: the offset after the last record the producers' delivery reports name, and the
  high watermark Tansu itself gives a consumer reading it directly. librdkafka (batches of several
  records, acks=all) and kafka-python (acks=1) producers, two partitions. (Tansu answers ListOffsets
  latest with its last batch's first offset + 1: with batches of several records that is not the
  end, so the reference here is what Tansu's Fetch answers say, read without kproxy.)
* A kafka-python consumer that stops polling but stays alive (its heartbeat thread goes on until
  ``max_poll_interval_ms``, set longer than the test): its lag stays exported well past the
  staleness window (5 s here), equal to what was produced less what it committed, and grows as
  more is produced (the watermark from the Produce answers: the consumer fetches nothing more).
  Once it closes (LeaveGroup), its series go within the window, not before.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition

from kproxy.testing import Broker, free_port, running_proxy
from tests.support.e2e import create_topic, unique
from tests.test_lag_e2e import scrape, series, wait_for

STALE_AFTER = 5.0  # seconds: kproxy's staleness window here (300 s by default)


def end_offsets_read_directly(tansu: Broker, topic: str, partitions: int, records: int) -> dict[int, int]:
    """The high watermark of each partition as Tansu's own Fetch answers give it, read without kproxy
    (the consumer's cached watermark after reading all ``records``)."""
    consumer = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": unique("direct"),
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        read = 0
        deadline = time.monotonic() + 30
        while read < records and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                read += 1
        assert read == records
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1] for p in range(partitions)}
    finally:
        consumer.close()


def test_a_partition_only_produced_through_kproxy_gets_its_watermark_from_the_produce_answers(tansu: Broker) -> None:
    port = free_port()
    topic = unique("produced")
    with running_proxy(tansu.bootstrap, metrics_listen=f"127.0.0.1:{port}") as proxy:
        create_topic(proxy.bootstrap, topic, 2)
        delivered: dict[int, int] = {}

        def report(error: Any, message: Any) -> None:
            assert error is None, error
            delivered[message.partition()] = max(delivered.get(message.partition(), -1), message.offset())

        librdkafka = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "linger.ms": 50,
                               "client.id": "lag-batches"})
        for round_ in range(4):  # batches of 5 records (one flush each), on both partitions
            for i in range(5):
                for partition in (0, 1):
                    librdkafka.produce(topic, value=f"r{round_}-{i}".encode(), partition=partition, on_delivery=report)
            assert librdkafka.flush(10) == 0
        kafka_python = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks=1, linger_ms=20)
        try:
            futures = [kafka_python.send(topic, value=b"k%d" % i, partition=1) for i in range(7)]
            for future in futures:
                meta = future.get(timeout=15)
                delivered[1] = max(delivered[1], meta.offset)
        finally:
            kafka_python.close(5)
        expected = {p: offset + 1 for p, offset in delivered.items()}
        assert expected == {0: 20, 1: 27}

        metrics = wait_for(port, lambda m: len(series(m, "kproxy_partition_high_watermark", topic=topic)) == 2,
                           "the watermarks of both partitions")
        assert series(metrics, "kproxy_partition_high_watermark", topic=topic) == {
            (("partition", str(p)),): end for p, end in expected.items()}
        # No Fetch crossed kproxy: the Produce answers are the only source.
        apis = {dict(k).get("api") for k in metrics["kproxy_requests"]}
        assert "produce" in apis and "fetch" not in apis and "list_offsets" not in apis
    # The broker's own reading agrees (checked directly, without kproxy).
    assert end_offsets_read_directly(tansu, topic, 2, sum(expected.values())) == expected


def test_a_consumer_that_stops_polling_keeps_its_lag_while_its_heartbeats_cross_kproxy(tansu: Broker) -> None:
    port = free_port()
    topic, group = unique("stalled"), unique("stalled-group")
    with running_proxy(tansu.bootstrap, metrics_listen=f"127.0.0.1:{port}", metrics__consumer_lag_partitions=True,
                       metrics__consumer_lag_stale_after=STALE_AFTER) as proxy:
        create_topic(proxy.bootstrap, topic, 1)
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 0, "client.id": "lag-producer"})

        def produce(n: int) -> None:
            for i in range(n):
                producer.produce(topic, value=b"v%d" % i, partition=0)
            assert producer.flush(10) == 0

        produce(10)
        # The consumer's application reads and commits the first 10, then stops polling; the client lives
        # on (its heartbeat thread beats every second until max_poll_interval_ms, longer than this test).
        consumer = KafkaConsumer(topic, bootstrap_servers=proxy.bootstrap, group_id=group, enable_auto_commit=False,
                                 auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=1000,
                                 max_poll_interval_ms=180_000, request_timeout_ms=15000)
        try:
            read = 0
            deadline = time.monotonic() + 45
            while read < 10 and time.monotonic() < deadline:
                read += sum(len(r) for r in consumer.poll(timeout_ms=500).values())
            consumer.commit()
            committed = consumer.committed(KTopicPartition(topic, 0))
            assert (read, committed) == (10, 10)
            stopped_at = time.monotonic()

            def lag(metrics: dict[str, Any]) -> Any:
                return series(metrics, "kproxy_consumergroup_lag", group=group).get(
                    (("partition", "0"), ("topic", topic)))

            # Past three windows with no commit, the lag stays, equal to what was produced less committed,
            # growing with each record produced (5 more every 3 s).
            produced = 10
            while time.monotonic() < stopped_at + 3 * STALE_AFTER + 1:
                produce(5)
                produced += 5
                metrics = wait_for(port, lambda m, want=produced - committed: lag(m) == want,
                                   f"a lag of {produced - committed}", timeout=10)
                assert series(metrics, "kproxy_consumergroup_committed_offset", group=group) == {
                    (("partition", "0"), ("topic", topic)): committed}
                time.sleep(3)
            assert produced - committed >= 30
        finally:
            consumer.close()  # LeaveGroup (nothing to commit: auto-commit is off)
        left_at = time.monotonic()
        # Left: no more sightings. The series go within the window, not before.
        while True:
            metrics = scrape(port)
            if not series(metrics, "kproxy_consumergroup_committed_offset", group=group):
                break
            assert time.monotonic() < left_at + STALE_AFTER + 5, "the series outlived the window after LeaveGroup"
            time.sleep(0.25)
        assert time.monotonic() > left_at + STALE_AFTER - 2.5, "gone before the window ended"
        assert not series(metrics, "kproxy_consumergroup_lag", group=group)
        assert not series(metrics, "kproxy_consumergroup_lag_sum", group=group)
