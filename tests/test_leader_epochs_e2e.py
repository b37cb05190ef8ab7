"""Leader epochs a client has seen never go backwards, with librdkafka against the embedded broker.

A ``move_leader`` rule raises a partition's leader epoch while it is on; once it ends the broker's
own (lower) epoch would read as outdated to a KIP-320 client, which then keeps the stale leader
and never delivers. kproxy keeps advertising the epoch it raised until the broker's passes it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from kproxy.testing import Broker, ProxyThread, running_proxy
from tests.support.e2e import TANSU_NODE_ID, consume_confluent, create_topic, unique

RULE_SECONDS = 4.0
MESSAGES = 200
DELIVERY_BOUND_S = 15.0  # after the rule ends (librdkafka retries and refreshes metadata within seconds)


@pytest.fixture
def moved_leader(tansu: Broker, tmp_path: Path) -> Iterator[tuple[ProxyThread, str, float]]:
    """A kproxy in front of Tansu whose rule moves the leader of ``topic``/0 to a node that does
    not exist, for RULE_SECONDS from the moment it is loaded; yields (proxy, topic, rule end)."""
    topic = unique("epochs")
    with running_proxy(tansu.bootstrap) as plain:
        create_topic(plain.bootstrap, topic, 1)
    path = tmp_path / "move.yaml"
    path.write_text(f"""
rules:
  - id: election
    match: {{api: metadata, schedule: {{for_seconds: {RULE_SECONDS}}}}}
    actions:
      - mutate_metadata: {{move_leader: [{{topic: "{topic}", partition: 0, to: {TANSU_NODE_ID + 1}}}]}}
""")
    with running_proxy(tansu.bootstrap, rules=str(path)) as proxy:
        injector = proxy.server.rules.injector
        assert injector is not None
        # The rule's schedule counts from its load, on the rules' clock (time.perf_counter).
        loaded = time.monotonic() - (time.perf_counter() - injector.engine.loaded_at)
        yield proxy, topic, loaded + RULE_SECONDS


def _produce_across(bootstrap: str, topic: str, rule_ends: float) -> list[float]:
    """Send MESSAGES, half while the rule is on and half from half a second after it ends; returns
    when each delivered message was reported, in seconds from the rule's end (waits at most
    DELIVERY_BOUND_S past the end)."""
    producer = Producer({"bootstrap.servers": bootstrap, "topic.metadata.refresh.interval.ms": 1000,
                         "message.timeout.ms": 120_000, "linger.ms": 5})
    delivered: list[float] = []
    errors: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        if err:
            errors.append(err)
        else:
            delivered.append(time.monotonic() - rule_ends)

    half = MESSAGES // 2
    for i in range(MESSAGES):
        if i == half:
            while time.monotonic() < rule_ends + 0.5:
                producer.poll(0.05)
        producer.produce(topic, value=f"m{i}".encode(), partition=0, on_delivery=report)
        producer.poll(0)
    deadline = rule_ends + DELIVERY_BOUND_S
    while len(delivered) + len(errors) < MESSAGES and time.monotonic() < deadline:
        producer.poll(0.05)
    producer.flush(0)
    assert not errors, f"delivery errors: {errors[:3]}"
    return delivered


def test_librdkafka_delivers_everything_after_a_moved_leader_rule_ends(
        moved_leader: tuple[ProxyThread, str, float]) -> None:
    proxy, topic, rule_ends = moved_leader
    delivered = _produce_across(proxy.bootstrap, topic, rule_ends)
    held = sorted(delivered)[:MESSAGES // 2]  # the half sent while the rule was on
    print(f"delivered {len(delivered)}/{MESSAGES}; the half sent under the rule "
          f"{held[-1] if held else float('nan'):.2f} s after it ended, the last "
          f"{max(delivered, default=float('nan')):.2f} s after")
    assert len(delivered) == MESSAGES, (f"{MESSAGES - len(delivered)} of {MESSAGES} still undelivered "
                                        f"{DELIVERY_BOUND_S:.0f} s after the rule ended")
    got = consume_confluent(proxy.bootstrap, topic, 1, MESSAGES)
    assert sorted(v for _, v in got) == sorted(f"m{i}".encode() for i in range(MESSAGES))
