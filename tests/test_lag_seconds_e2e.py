"""Consumer lag in seconds and the time to catch up, with real clients through a real kproxy on Tansu.

A librdkafka producer writes 10 records a second to one partition throughout (its delivery reports
give each record's offset and its CreateTime). A kafka-python consumer reads the first records,
commits and stops polling (its client lives on: its heartbeat thread keeps the group), then
resumes at a known pace, 30 records a second, committing twice a second, until it is caught up.

* While it is stopped, ``kproxy_consumergroup_lag_seconds`` is how long ago the first record it has
  not committed was written (its CreateTime, from the delivery report) within 1.5 s (kproxy keeps a
  write time a second per partition: the nearest it saw), rising at 1 s/s; the per-partition
  series says the same.
* Once it resumes (past one rate window: kproxy measures rates over 5 s at least, and the first
  window after the pause still holds the pause),
  ``kproxy_consumergroup_catchup_seconds`` is within 20 % of the time it then really took to catch up
  (its lag over 30 - 10 records a second); caught up, lag seconds and catch-up time are 0.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import Producer
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition

from kproxy.testing import Broker, free_port, running_proxy
from tests.support.e2e import create_topic, unique
from tests.test_lag_e2e import scrape, series, wait_for

PRODUCE_RATE = 10.0  # records a second, throughout
CONSUME_RATE = 30.0  # records a second, once the consumer resumes
STOPPED = 30.0  # seconds the consumer stays stopped


class Writer:
    """A producer thread writing PRODUCE_RATE records a second until stopped (bounded: 120 s), noting
    each record's offset and CreateTime (ms) from its delivery report."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "client.id": "lag-seconds"})
        self.topic = topic
        self.written: dict[int, int] = {}  # offset -> CreateTime (ms)
        self.stop = threading.Event()
        self.errors: list[Any] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def report(self, error: Any, message: Any) -> None:
        if error is not None:
            self.errors.append(error)
        else:
            self.written[message.offset()] = message.timestamp()[1]

    def run(self) -> None:
        started = time.monotonic()
        n = 0
        while not self.stop.is_set() and time.monotonic() < started + 120:
            self.producer.produce(self.topic, value=b"v%d" % n, partition=0, on_delivery=self.report)
            n += 1
            self.producer.poll(0)
            self.stop.wait(max(0.0, started + n / PRODUCE_RATE - time.monotonic()))
        self.producer.flush(10)

    def end(self) -> int:
        """The offset after the last record delivered so far."""
        return max(self.written, default=-1) + 1


def test_lag_seconds_rise_at_1_s_a_second_and_the_catchup_time_comes_true(tansu: Broker) -> None:
    port = free_port()
    topic, group = unique("lagsec"), unique("lagsec-group")
    with running_proxy(tansu.bootstrap, metrics_listen=f"127.0.0.1:{port}",
                       metrics__consumer_lag_partitions=True) as proxy:
        create_topic(proxy.bootstrap, topic, 1)
        writer = Writer(proxy.bootstrap, topic)
        writer.thread.start()
        consumer = KafkaConsumer(topic, bootstrap_servers=proxy.bootstrap, group_id=group, enable_auto_commit=False,
                                 auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=1000,
                                 max_poll_interval_ms=180_000, request_timeout_ms=15000, max_poll_records=5)
        tp = KTopicPartition(topic, 0)
        try:
            # Read what there is (the group's join takes a few seconds), commit, stop polling.
            read = 0
            deadline = time.monotonic() + 45
            while read < 20 and time.monotonic() < deadline:
                read += sum(len(r) for r in consumer.poll(timeout_ms=200).values())
            consumer.commit()
            committed = consumer.committed(tp)
            assert committed is not None and committed >= 20
            stopped_at = time.monotonic()

            def lag_seconds(metrics: dict[str, Any]) -> Any:
                return series(metrics, "kproxy_consumergroup_lag_seconds", group=group).get((("topic", topic),))

            first = wait_for(port, lambda m: (lag_seconds(m) or 0) > 0, "a lag in seconds")
            assert committed in writer.written, "the first record not committed was not delivered yet"
            samples = []
            while time.monotonic() < stopped_at + STOPPED:
                before = time.time()
                metrics = first if not samples else scrape(port)
                after = time.time()
                seconds = lag_seconds(metrics)
                truth = (before + after) / 2 - writer.written[committed] / 1000
                assert abs(seconds - truth) < 1.5, (seconds, truth)
                per_partition = series(metrics, "kproxy_consumergroup_partition_lag_seconds", group=group)
                assert abs(per_partition[(("partition", "0"), ("topic", topic))] - seconds) < 0.1
                # A stopped group gains nothing: no catch-up time (past the window it was still reading in).
                if time.monotonic() > stopped_at + 6:
                    assert not series(metrics, "kproxy_consumergroup_catchup_seconds", group=group)
                samples.append((after, seconds))
                time.sleep(1.0)
            (t0, s0), (t1, s1) = samples[0], samples[-1]
            assert t1 - t0 > STOPPED - 4
            assert abs((s1 - s0) / (t1 - t0) - 1.0) < 0.1, samples  # 1 s a second

            # Resume at CONSUME_RATE, committing twice a second, until caught up.
            resumed_at = time.monotonic()
            consumed = 0
            last_commit = resumed_at
            estimate: tuple[float, float] | None = None  # (when, catch-up seconds scraped)
            caught_up_at = None
            while time.monotonic() < resumed_at + 60:
                due = int((time.monotonic() - resumed_at) * CONSUME_RATE) - consumed
                if due > 0:
                    batch = consumer.poll(timeout_ms=50, max_records=min(due, 5))
                    consumed += sum(len(r) for r in batch.values())
                else:
                    time.sleep(0.01)
                now = time.monotonic()
                if now - last_commit >= 0.5:
                    consumer.commit()
                    last_commit = now
                    if consumer.position(tp) >= writer.end() - 2:  # within what the producer just wrote
                        caught_up_at = now
                        break
                    if estimate is None and now > resumed_at + 6.5:
                        catchup = series(scrape(port), "kproxy_consumergroup_catchup_seconds", group=group)
                        assert (("topic", topic),) in catchup, "no catch-up time while the group gains"
                        estimate = (now, catchup[(("topic", topic),)])
            assert caught_up_at is not None and estimate is not None, (caught_up_at, estimate)
            took = caught_up_at - estimate[0]
            print(f"lag seconds rose {(s1 - s0) / (t1 - t0):.3f} s/s over {t1 - t0:.1f} s; catch-up estimated "
                  f"{estimate[1]:.1f} s, took {took:.1f} s")
            assert took > 3, "caught up too soon to judge the estimate"
            assert abs(estimate[1] - took) <= 0.2 * took, (estimate[1], took)

            # Caught up: 0 seconds behind, 0 to catch up (the consumer keeps reading what comes).
            def caught_up(metrics: dict[str, Any]) -> bool:
                for _ in range(3):
                    consumer.poll(timeout_ms=100)
                consumer.commit()
                return (lag_seconds(metrics) == 0 and series(metrics, "kproxy_consumergroup_catchup_seconds",
                                                             group=group) == {(("topic", topic),): 0.0})
            writer.stop.set()
            writer.thread.join(15)
            consumer.poll(timeout_ms=500)
            consumer.commit()
            wait_for(port, caught_up, "lag seconds and catch-up time of 0", timeout=15)
        finally:
            writer.stop.set()
            writer.thread.join(15)
            consumer.close()
        assert not writer.errors
