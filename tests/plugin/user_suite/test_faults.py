"""A user's tests of their own Kafka code against faults, with kproxy's pytest plugin.

Nothing here imports kproxy: the ``kproxy`` fixture comes from the plugin's entry point. Moved here
from tests/test_rules_e2e.py (kproxy's own end-to-end rule tests), where they started one kproxy per
rule file; here one kproxy serves the session and each test adds its rules.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
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


def test_a_delay_shows_in_measured_latency_only_while_its_rule_is_in_force(kproxy: Any) -> None:
    slow, fast = new_topic(kproxy.bootstrap), new_topic(kproxy.bootstrap)
    with kproxy.rule({"match": {"api": "produce", "topic": slow}, "actions": [{"delay": {"ms": 400}}]}):
        assert produce_one_timed(kproxy.bootstrap, fast) < 0.3
        assert 0.4 <= produce_one_timed(kproxy.bootstrap, slow) < 1.5
    assert produce_one_timed(kproxy.bootstrap, slow) < 0.3, "the rule ended with its block"


def test_a_rule_in_dry_run_counts_and_does_nothing(kproxy: Any) -> None:
    topic = new_topic(kproxy.bootstrap)
    rule = kproxy.add_rule({"match": {"api": "produce", "topic": topic},
                            "actions": [{"inject_error": {"error": "TOPIC_AUTHORIZATION_FAILED"}}]})
    kproxy.dry_run(rule)
    producer = Producer({"bootstrap.servers": kproxy.bootstrap})
    producer.produce(topic, value=b"x")
    assert producer.flush(15) == 0
    assert (kproxy.hits(rule), kproxy.hits(rule, dry_run=True)) == (0, 1)


def test_leaves_a_rule_behind(kproxy: Any) -> None:
    kproxy.add_rule({"id": "left-behind", "match": {"api": "metadata"}, "actions": [{"delay": {"ms": 1}}]})


def test_starts_with_no_rules(kproxy: Any) -> None:
    """Runs after test_leaves_a_rule_behind (file order): its rule was removed when it ended."""
    assert kproxy.admin.rules()["rules"] == []


def test_an_invalid_rule_fails_with_the_field_at_fault(kproxy: Any) -> None:
    from kproxy.admin.client import AdminRefused

    with pytest.raises(AdminRefused) as refused:
        kproxy.add_rule({"match": {"api": "produce"}, "actions": [{"delay": {"msec": 5}}]})
    found = [(e["path"], e["reason"], e.get("hint")) for e in refused.value.errors]
    assert found == [("actions[0].delay.msec", "unknown key", "did you mean 'ms'?"),
                     ("actions[0].delay.ms", "missing (milliseconds)", None)]


def test_hits_stay_readable_after_the_rule_is_gone(kproxy: Any) -> None:
    """The count at removal, whether the ``with`` block or remove_rule() removed it; a rule added
    again under the same id counts afresh."""
    topic = new_topic(kproxy.bootstrap)
    spec = {"id": "after-block", "match": {"api": "produce", "topic": topic}, "actions": [{"delay": {"ms": 1}}]}
    with kproxy.rule(spec) as rule:
        produce_one_timed(kproxy.bootstrap, topic)  # two produce requests
    assert kproxy.hits(rule) == 2
    produce_one_timed(kproxy.bootstrap, topic)
    assert kproxy.hits(rule) == 2, "counted after its removal"
    again = kproxy.add_rule(spec)
    assert kproxy.hits(again) == 0
    produce_one_timed(kproxy.bootstrap, topic)
    kproxy.remove_rule(again)
    assert kproxy.hits(again) == 2
