"""Rules against the real broker with real clients: what a client sees when kproxy misbehaves on purpose."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer

from kproxy.server.logfmt import parse_logfmt
from tests.support.e2e import consume_confluent, create_topic, produce_confluent, unique
from tests.support.proxy import ProxyThread, running_proxy
from tests.support.tansu import Broker
from tests.test_e2e_clients import messages, same_records

PARTITIONS = 2


@pytest.fixture
def with_rules(tansu: Broker, tmp_path: Path) -> Iterator[Any]:
    """``with_rules(text)``: a fresh kproxy in front of Tansu running that rule file."""
    proxies: list[Any] = []

    def start(text: str) -> ProxyThread:
        path = tmp_path / f"rules-{len(proxies)}.yaml"
        path.write_text(text)
        cm = running_proxy(tansu.bootstrap, rules=str(path))
        proxy = cm.__enter__()
        proxies.append(cm)
        return proxy

    yield start
    for cm in reversed(proxies):
        cm.__exit__(None, None, None)


def faults(caplog: pytest.LogCaptureFixture, rule: str) -> list[dict[str, str]]:
    lines = [parse_logfmt(r.getMessage()) for r in caplog.records if r.name == "kproxy.faults"]
    return [line for line in lines if line.get("rule") == rule]


def test_retriable_errors_on_part_of_produce_are_retried_and_every_message_arrives_once(
        with_rules: Any, caplog: pytest.LogCaptureFixture) -> None:
    topic = unique("rules-retry")
    proxy = with_rules(f"""
seed: 42
rules:
  - id: flaky-leader
    match: {{api: produce, topic: "{topic}", probability: 0.3}}
    actions:
      - inject_error: {{error: NOT_LEADER_OR_FOLLOWER}}
""")
    create_topic(proxy.bootstrap, topic, PARTITIONS)
    sent = messages("retry", 300)
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        produce_confluent(proxy.bootstrap, topic, sent, acks="all",
                          **{"enable.idempotence": True, "linger.ms": 2, "batch.num.messages": 20})
    injected = faults(caplog, "flaky-leader")
    assert len(injected) >= 3, "the rule should have failed some Produce requests"
    assert {f["detail"] for f in injected} == {"inject_error NOT_LEADER_OR_FOLLOWER respond"}
    same_records(consume_confluent(proxy.bootstrap, topic, PARTITIONS, len(sent)), sent)


def test_a_non_retriable_error_reaches_the_application(with_rules: Any) -> None:
    topic = unique("rules-fatal")
    proxy = with_rules(f"""
rules:
  - id: denied
    match: {{api: produce, topic: "{topic}"}}
    actions:
      - inject_error: {{error: TOPIC_AUTHORIZATION_FAILED}}
""")
    create_topic(proxy.bootstrap, topic, 1)
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "message.timeout.ms": 10000})
    producer.produce(topic, value=b"x", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(15) == 0
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


def _produce_one_timed(bootstrap: str, topic: str, **config: Any) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **config})
    producer.produce(topic, value=b"warm-up")  # metadata and connections first
    assert producer.flush(15) == 0
    started = time.monotonic()
    producer.produce(topic, value=b"timed")
    assert producer.flush(15) == 0
    return time.monotonic() - started


def test_a_delay_shows_in_measured_latency(with_rules: Any) -> None:
    slow, fast = unique("rules-slow"), unique("rules-fast")
    proxy = with_rules(f"""
rules:
  - id: slow-produce
    match: {{api: produce, topic: "{slow}"}}
    actions:
      - delay: {{ms: 400}}
""")
    create_topic(proxy.bootstrap, slow, 1)
    create_topic(proxy.bootstrap, fast, 1)
    assert _produce_one_timed(proxy.bootstrap, fast) < 0.3
    assert 0.4 <= _produce_one_timed(proxy.bootstrap, slow) < 1.5


def test_drop_response_makes_the_client_time_out_and_retry(with_rules: Any, caplog: pytest.LogCaptureFixture) -> None:
    topic = unique("rules-drop")
    proxy = with_rules(f"""
rules:
  - id: lost-answer
    match: {{api: produce, topic: "{topic}", schedule: {{first: 1}}}}
    actions:
      - drop_response
""")
    create_topic(proxy.bootstrap, topic, 1)
    sent = messages("drop", 1)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        produce_confluent(proxy.bootstrap, topic, sent, acks="all",
                          **{"enable.idempotence": True, "request.timeout.ms": 2000, "socket.timeout.ms": 2000})
    elapsed = time.monotonic() - started
    assert len(faults(caplog, "lost-answer")) == 1
    assert elapsed >= 2.0, "the first answer was dropped: the client had to time out first"
    same_records(consume_confluent(proxy.bootstrap, topic, 1, len(sent)), sent)


def test_throttle_caps_throughput_and_the_client_reports_throttle_time(with_rules: Any) -> None:
    topic = unique("rules-quota")
    rate = 400_000
    proxy = with_rules(f"""
rules:
  - id: quota
    match: {{api: produce, topic: "{topic}"}}
    actions:
      - throttle: {{bytes_per_second: {rate}, burst_seconds: 0.05}}
""")
    create_topic(proxy.bootstrap, topic, 1)
    stats: list[dict[str, Any]] = []
    payload = b"v" * 10_000
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 5, "acks": "all",
                         "statistics.interval.ms": 500, "stats_cb": lambda s: stats.append(json.loads(s))})
    producer.produce(topic, value=b"warm-up")
    assert producer.flush(15) == 0
    total = 2_000_000
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
    elapsed = time.monotonic() - started
    measured = total / elapsed
    assert abs(measured - rate) / rate <= 0.10, f"measured {measured:.0f} B/s for a {rate} B/s throttle"
    producer.poll(1.0)  # one more statistics report
    throttles = [b["throttle"]["max"] for s in stats for b in s["brokers"].values() if b.get("nodeid", -1) >= 0]
    assert max(throttles) > 0, "librdkafka saw no throttle_time_ms"
