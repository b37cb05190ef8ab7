"""A user's tests of their own Kafka code against faults, with kproxy's pytest plugin.

Nothing here imports kproxy: the ``kproxy`` fixture comes from the plugin's entry point. One
kproxy serves the session and each test adds its rules; tests/plugin/test_pytest_plugin.py runs
this suite in a pytest process of its own, as a user does (tests/plugin/test_fixture.py uses the
same fixture in kproxy's own test process).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def new_topic(bootstrap: str, partitions: int = 1) -> str:
    name = f"user-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(20)
    return name


def produce_one_timed(bootstrap: str, topic: str) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    producer.produce(topic, value=b"warm-up")  # metadata and connections first
    assert producer.flush(15) == 0
    started = time.monotonic()
    producer.produce(topic, value=b"timed")
    assert producer.flush(15) == 0
    return time.monotonic() - started


def test_a_non_retriable_error_reaches_the_application(kproxy: Any) -> None:
    topic = new_topic(kproxy.bootstrap)
    rule = kproxy.add_rule({"match": {"api": "produce", "topic": topic},
                            "actions": [{"inject_error": {"error": "TOPIC_AUTHORIZATION_FAILED"}}]})
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": kproxy.bootstrap, "message.timeout.ms": 10000})
    producer.produce(topic, value=b"x", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(15) == 0
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert kproxy.hits(rule) == 1
    assert [f["detail"] for f in kproxy.faults(rule)] == ["inject_error TOPIC_AUTHORIZATION_FAILED respond"]


def test_leaves_a_rule_behind(kproxy: Any) -> None:
    kproxy.add_rule({"id": "left-behind", "match": {"api": "metadata"}, "actions": [{"delay": {"ms": 1}}]})


def test_starts_with_no_rules(kproxy: Any) -> None:
    """Runs after test_leaves_a_rule_behind (file order): its rule was removed when it ended."""
    assert kproxy.admin.rules()["rules"] == []
