"""A produce quota against the real broker with librdkafka: the rate it keeps and the throttle time it reports.

A broker takes a client's requests one at a time and mutes a throttled client for its throttle
time (KIP-219), so each answer reports what its own bytes cost over the quota window (KIP-13's
formula, kproxy/rules/bucket.py), whatever the client has in flight. librdkafka pipelines five
Produce requests by default: each answer must still report about one request's worth (a 60 KB
request at 256 KiB/s: ~230 ms), not the wait of the five ahead of it (1.1 s per answer for
64 KiB batches, 15 s for librdkafka's default 1 MB batches), and the rate stays the quota's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from kproxy.rules.bucket import broker_throttle_s
from kproxy.testing import Broker, running_proxy
from tests.support.e2e import create_topic, unique

RATE = 256 * 1024
BATCH_BYTES = 65536
PAYLOAD = b"v" * 10_000
SECONDS = 11  # at the quota: the rate is measured over at least 10 s


@pytest.mark.parametrize("in_flight", [5, 1])
def test_a_produce_quota_keeps_its_rate_and_reports_a_broker_s_throttle_time(
        tansu: Broker, tmp_path: Path, in_flight: int) -> None:
    topic = unique("rules-quota-pipelined")
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"""
rules:
  - id: quota
    match: {{api: produce, topic: "{topic}"}}
    actions:
      - throttle: {{bytes_per_second: {RATE}, burst_seconds: 0.05}}
""")
    create_topic(tansu.bootstrap, topic, 1)
    stats: list[dict[str, Any]] = []
    with running_proxy(tansu.bootstrap, rules=str(rules)) as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "linger.ms": 5,
                             "batch.size": BATCH_BYTES, "max.in.flight.requests.per.connection": in_flight,
                             "statistics.interval.ms": 500, "stats_cb": lambda s: stats.append(json.loads(s))})
        producer.produce(topic, value=b"warm-up")
        assert producer.flush(15) == 0
        count = SECONDS * RATE // len(PAYLOAD)
        started = time.monotonic()
        for _ in range(count):
            while True:
                try:
                    producer.produce(topic, value=PAYLOAD)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        assert producer.flush(60) == 0
        elapsed = time.monotonic() - started
        producer.poll(1.0)  # one more statistics report
    measured = count * len(PAYLOAD) / elapsed
    # librdkafka's throttle window: the throttle_time_ms of every answer in each 500 ms report.
    reported = [b["throttle"]["max"] for s in stats for b in s["brokers"].values() if b.get("nodeid", -1) >= 0]
    print(f"in flight {in_flight}: {measured:.0f} B/s for {RATE} over {elapsed:.1f} s; largest throttle_time_ms "
          f"per report {reported}")
    assert elapsed >= 10
    assert abs(measured - RATE) / RATE <= 0.05, f"measured {measured:.0f} B/s for a {RATE} B/s quota"
    # A broker's formula for the largest request (a batch and its headers) at a window already at
    # the quota: its own bytes' time. Five in flight must not make it five times that.
    bound_ms = broker_throttle_s((RATE * 0.05 + BATCH_BYTES + 1024) / 0.05, RATE, 0.05) * 1000
    assert 0 < max(reported) <= bound_ms, f"throttle_time_ms up to {max(reported)}, a broker says <= {bound_ms:.0f}"
    busy = [ms for ms in reported if ms > 0]
    assert max(busy[len(busy) // 2:]) <= max(busy[: len(busy) // 2]) + 5, "the reported throttle time grows"
