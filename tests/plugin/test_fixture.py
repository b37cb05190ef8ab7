"""The pytest plugin's ``kproxy`` fixture used directly, in this process: rules a test adds, their
counts and faults, what the admin API refuses. Its session kproxy runs over the test session's
broker (``kproxy_process``, tests/conftest.py); test_pytest_plugin.py runs a user's suite in a
pytest process of its own, the plugin loaded from its entry point.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from kproxy.admin.api_client import AdminRefused
from kproxy.testing.fixture import Kproxy
from tests.plugin.user_suite.test_faults import new_topic, produce_one_timed


def test_a_delay_shows_in_measured_latency_only_while_its_rule_is_in_force(kproxy: Kproxy) -> None:
    slow, fast = new_topic(kproxy.bootstrap), new_topic(kproxy.bootstrap)
    with kproxy.rule({"match": {"api": "produce", "topic": slow}, "actions": [{"delay": {"ms": 400}}]}):
        assert produce_one_timed(kproxy.bootstrap, fast) < 0.3
        assert 0.4 <= produce_one_timed(kproxy.bootstrap, slow) < 1.5
    assert produce_one_timed(kproxy.bootstrap, slow) < 0.3, "the rule ended with its block"


def test_a_rule_in_dry_run_counts_and_does_nothing(kproxy: Kproxy) -> None:
    topic = new_topic(kproxy.bootstrap)
    rule = kproxy.add_rule({"match": {"api": "produce", "topic": topic},
                            "actions": [{"inject_error": {"error": "TOPIC_AUTHORIZATION_FAILED"}}]})
    kproxy.dry_run(rule)
    producer = Producer({"bootstrap.servers": kproxy.bootstrap})
    producer.produce(topic, value=b"x")
    assert producer.flush(15) == 0
    assert (kproxy.hits(rule), kproxy.hits(rule, dry_run=True)) == (0, 1)


def test_an_invalid_rule_fails_with_the_field_at_fault(kproxy: Kproxy) -> None:
    with pytest.raises(AdminRefused) as refused:
        kproxy.add_rule({"match": {"api": "produce"}, "actions": [{"delay": {"msec": 5}}]})
    found = [(e["path"], e["reason"], e.get("hint")) for e in refused.value.errors]
    assert found == [("actions[0].delay.msec", "unknown key", "did you mean 'ms'?"),
                     ("actions[0].delay.ms", "missing (milliseconds)", None)]


def test_hits_stay_readable_after_the_rule_is_gone(kproxy: Kproxy) -> None:
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
