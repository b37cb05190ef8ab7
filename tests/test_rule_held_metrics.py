"""Time a rule holds a response is the rule's, not kproxy's: a delay rule shows in
``kproxy_rule_held_seconds{rule,action}`` and stays out of ``kproxy_overhead_seconds`` (whose
alert, KproxyOverheadHigh, says "short of CPU" and must not fire through delay experiments).

A real kproxy in front of the real broker, a real producer, the metrics read from ``/metrics``.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from kproxy.testing import Broker, free_port, running_proxy
from tests.support.e2e import create_topic, unique

DELAY_MS = 50
RULES = """
rules:
  - id: slow-produce
    match: {{api: produce, topic: "{topic}"}}
    actions:
      - delay: {{ms: {ms}, at: {at}}}
"""


def samples(metrics: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    for n in range(count):
        producer.produce(topic, value=b"%d" % n)
        assert producer.flush(15) == 0  # one Produce request each


def run(tansu: Broker, tmp_path: Path, at: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    topic = unique(f"held-{at}")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(topic=topic, ms=DELAY_MS, at=at))
    metrics = f"127.0.0.1:{free_port()}"
    with running_proxy(tansu.bootstrap, rules=str(rules), metrics_listen=metrics) as proxy:
        create_topic(proxy.bootstrap, topic, 1)
        produce(proxy.bootstrap, topic, 8)
        return samples(metrics)


def mean_overhead(seen: dict[tuple[str, tuple[tuple[str, str], ...]], float], api: str) -> float:
    """kproxy's mean own time per request of ``api``: a mean, so that one request slowed by a busy
    machine does not decide (with the delay counted in, it would be over DELAY_MS)."""
    return seen["kproxy_overhead_seconds_sum", (("api", api),)] / seen["kproxy_overhead_seconds_count", (("api", api),)]


def test_a_response_delay_is_held_time_not_overhead(tansu: Broker, tmp_path: Path) -> None:
    seen = run(tansu, tmp_path, "response")
    held = (("action", "delay"), ("rule", "slow-produce"))
    count = seen["kproxy_rule_held_seconds_count", held]
    assert count >= 8, seen
    # at: response holds each answer exactly DELAY_MS after it came: the whole hold is the rule's.
    assert abs(seen["kproxy_rule_held_seconds_sum", held] - count * DELAY_MS / 1000) < 0.001 * count
    assert seen["kproxy_rule_held_seconds_bucket", (*held[:1], ("le", "0.025"), *held[1:])] == 0
    # kproxy's own time stays small: the 50 ms are not in it (every Produce was over 50 ms before).
    assert mean_overhead(seen, "produce") < DELAY_MS / 1000 / 4


def test_a_request_delay_is_held_time_not_overhead(tansu: Broker, tmp_path: Path) -> None:
    """at: request: the response leaves DELAY_MS after the request was read; the broker's part of
    that is the broker's, the rest the rule's."""
    seen = run(tansu, tmp_path, "request")
    held = (("action", "delay"), ("rule", "slow-produce"))
    assert seen["kproxy_rule_held_seconds_count", held] >= 8, seen
    assert mean_overhead(seen, "produce") < DELAY_MS / 1000 / 4
