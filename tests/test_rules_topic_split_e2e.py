"""A topic-scoped inject_error hits the topic-partitions it names only: real clients, the real broker.

A client's request often carries several topics (librdkafka and kafka-python put every
partition led by a broker in one Produce or Fetch). A rule on ``topic: A*`` must fail A and
leave B of the same request alone: B's records written once and acknowledged, B's fetch
position never reset; the fault line names A only.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition

from tests.support.e2e import consume_confluent, create_topic, produce_confluent, unique
from tests.test_e2e_clients import messages, same_records
from tests.test_rules_e2e import faults, with_rules  # noqa: F401 (the fixture)

# ruff: noqa: F811 (the fixture named as a test argument)

EXAMPLES = Path(__file__).resolve().parent.parent / "rules" / "examples"


def _produce_both(bootstrap: str, batches: dict[str, list[Any]], **config: Any) -> dict[str, list[Any]]:
    """Produce to several topics through one kafka-python producer, lingering so that each Produce
    request carries all of them (kafka-python puts every partition a broker leads in one request;
    librdkafka sends one partition per Produce request); the delivery errors per topic. The first
    record of each topic goes alone first: the producer then knows every leader before the rest."""
    producer = KafkaProducer(**{"bootstrap_servers": bootstrap, "linger_ms": 200, "acks": "all",
                                "request_timeout_ms": 15000, **config})
    futures: list[tuple[str, Any]] = []
    try:
        longest = max(len(b) for b in batches.values())
        for i in range(longest):
            for topic, batch in batches.items():
                if i < len(batch):
                    key, value = batch[i]
                    futures.append((topic, producer.send(topic, key=key, value=value)))
            if i == 0:
                producer.flush(timeout=30)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)
    assert all(f.is_done for _, f in futures)
    errors: dict[str, list[Any]] = {topic: [] for topic in batches}
    for topic, f in futures:
        if f.exception is not None:
            errors[topic].append(f.exception)
    return errors


def _topics_named(lines: list[dict[str, str]]) -> set[str]:
    return {t for line in lines for t in line["topic"].split(",") if t}


def test_a_produce_error_on_one_topic_leaves_the_other_topic_of_the_request_written_and_acknowledged(
        with_rules: Any, caplog: pytest.LogCaptureFixture) -> None:
    a, b = unique("split-a"), unique("split-b")
    proxy = with_rules(f"""
rules:
  - id: a-refused
    match: {{api: produce, topic: "{a}"}}
    actions:
      - inject_error: {{error: INVALID_RECORD}}
""")
    create_topic(proxy.bootstrap, a, 1)
    create_topic(proxy.bootstrap, b, 1)
    sent_a, sent_b = messages("a", 50), messages("b", 50)
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        errors = _produce_both(proxy.bootstrap, {a: sent_a, b: sent_b}, retries=0)
    assert errors[b] == [], f"B's records were refused with A's error: {errors[b][:3]}"
    assert len(errors[a]) == len(sent_a)
    assert {type(e).__name__ for e in errors[a]} == {"InvalidRecordError"}
    lines = faults(caplog, "a-refused")
    assert lines and _topics_named(lines) == {a}, "the fault line names the selected topic only"
    assert any("1 of 2 partitions, the others forwarded" in line["detail"] for line in lines), \
        "no Produce request carried both topics"
    same_records(consume_confluent(proxy.bootstrap, b, 1, len(sent_b)), sent_b)
    assert consume_confluent(proxy.bootstrap, a, 1, 1, timeout=2) == []


def test_a_retriable_produce_error_on_one_topic_duplicates_nothing_of_the_other(
        with_rules: Any, caplog: pytest.LogCaptureFixture) -> None:
    a, b = unique("split-a"), unique("split-b")
    proxy = with_rules(f"""
rules:
  - id: a-not-leader
    match: {{api: produce, topic: "{a}", schedule: {{first: 3}}}}
    actions:
      - inject_error: {{error: NOT_LEADER_OR_FOLLOWER}}
""")
    create_topic(proxy.bootstrap, a, 1)
    create_topic(proxy.bootstrap, b, 1)
    sent_a, sent_b = messages("a", 100), messages("b", 100)
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        errors = _produce_both(proxy.bootstrap, {a: sent_a, b: sent_b}, retries=10, retry_backoff_ms=50,
                               enable_idempotence=False)
    assert errors == {a: [], b: []}
    lines = faults(caplog, "a-not-leader")
    assert len(lines) == 3 and _topics_named(lines) == {a}
    assert any("the others forwarded" in line["detail"] for line in lines)
    same_records(consume_confluent(proxy.bootstrap, b, 1, len(sent_b)), sent_b)
    same_records(consume_confluent(proxy.bootstrap, a, 1, len(sent_a)), sent_a)


def test_a_fetch_error_on_one_topic_leaves_the_other_topic_read_and_never_reset(
        with_rules: Any, caplog: pytest.LogCaptureFixture) -> None:
    a, b = unique("split-a"), unique("split-b")
    proxy = with_rules(f"""
rules:
  - id: a-out-of-range
    match: {{api: fetch, topic: "{a}*"}}
    actions:
      - inject_error: {{error: OFFSET_OUT_OF_RANGE}}
""")
    create_topic(proxy.bootstrap, a, 1)
    create_topic(proxy.bootstrap, b, 1)
    sent_a, sent_b = messages("a", 20), messages("b", 300)
    produce_confluent(proxy.bootstrap, a, sent_a)
    produce_confluent(proxy.bootstrap, b, sent_b)
    # "error": an out-of-range partition is reported to the application instead of being reset,
    # so a reset of B would show as an error naming B.
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("split-reader"),
                         "enable.auto.commit": False, "auto.offset.reset": "error",
                         "max.partition.fetch.bytes": 4_000})
    got_b: list[Any] = []
    reset: list[tuple[str, int]] = []
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        try:
            consumer.assign([TopicPartition(a, 0, OFFSET_BEGINNING), TopicPartition(b, 0, OFFSET_BEGINNING)])
            deadline = time.monotonic() + 30
            while (len(got_b) < len(sent_b) or not reset) and time.monotonic() < deadline:
                for msg in consumer.consume(num_messages=500, timeout=0.5):
                    if msg.error() is not None:
                        reset.append((msg.topic(), msg.partition()))
                    elif msg.topic() == b:
                        got_b.append((msg.key(), msg.value()))
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                if msg.error() is None and msg.topic() == b:
                    got_b.append((msg.key(), msg.value()))
        finally:
            consumer.close()
    assert reset and {t for t, _ in reset} == {a}, f"offset errors: {reset[:5]}"
    same_records(got_b, sent_b)
    lines = faults(caplog, "a-out-of-range")
    assert lines and _topics_named(lines) == {a}
    assert any("request forwarded whole" in line["detail"] for line in lines), \
        "no Fetch request carried both topics"


def test_the_one_topic_example_leaves_other_topics_untouched(with_rules: Any,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """rules/examples/produce-errors-one-topic.yaml: "other topics are untouched". One record per
    batch (kafka-python splits a batch refused with RECORD_LIST_TOO_LARGE and retries the halves,
    which is not what is tested here), idempotence off (an idempotent kafka-python producer takes
    a non-retriable error as fatal and aborts every batch)."""
    audit = f"orders-audit-v{int(time.time() * 1000) % 10**9}"
    other = unique("payments")
    proxy = with_rules((EXAMPLES / "produce-errors-one-topic.yaml").read_text())
    create_topic(proxy.bootstrap, audit, 1)
    create_topic(proxy.bootstrap, other, 1)
    sent = messages("pay", 20)
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        errors = _produce_both(proxy.bootstrap, {audit: messages("audit", 20), other: sent},
                               enable_idempotence=False, batch_size=100, linger_ms=5)
    assert errors[other] == []
    assert len(errors[audit]) == 3, "the rule refuses the first three requests naming the topic"
    lines = faults(caplog, "orders-audit-too-large")
    assert len(lines) == 3 and _topics_named(lines) == {audit}
    assert any("the others forwarded" in line["detail"] for line in lines)
    same_records(consume_confluent(proxy.bootstrap, other, 1, len(sent)), sent)


def test_kafka_python_reads_the_other_topic_while_one_topic_fetch_fails(with_rules: Any,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    a, b = unique("split-a"), unique("split-b")
    proxy = with_rules(f"""
rules:
  - id: a-not-leader
    match: {{api: fetch, topic: "{a}"}}
    actions:
      - inject_error: {{error: NOT_LEADER_OR_FOLLOWER}}
""")
    create_topic(proxy.bootstrap, a, 1)
    create_topic(proxy.bootstrap, b, 1)
    sent_b = messages("b", 200)
    produce_confluent(proxy.bootstrap, a, messages("a", 20))
    produce_confluent(proxy.bootstrap, b, sent_b)
    consumer = KafkaConsumer(bootstrap_servers=proxy.bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", request_timeout_ms=15000, max_partition_fetch_bytes=4000)
    got: dict[str, list[Any]] = {a: [], b: []}
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        try:
            tps = [KTopicPartition(a, 0), KTopicPartition(b, 0)]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            deadline = time.monotonic() + 30
            while len(got[b]) < len(sent_b) and time.monotonic() < deadline:
                for tp, records in consumer.poll(timeout_ms=500).items():
                    got[tp.topic].extend((r.key, r.value) for r in records)
            for tp, records in consumer.poll(timeout_ms=300).items():
                got[tp.topic].extend((r.key, r.value) for r in records)
        finally:
            consumer.close()
    same_records(got[b], sent_b)
    assert got[a] == [], "A's Fetch entries carry the error, never records"
    lines = faults(caplog, "a-not-leader")
    assert lines and _topics_named(lines) == {a}
    assert any("request forwarded whole" in line["detail"] for line in lines)
