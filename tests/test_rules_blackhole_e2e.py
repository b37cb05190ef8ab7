"""``blackhole`` (with and without ``close_after_ms``) against the real broker with real producers:
what reaches the topic.

A black hole is a partitioned network: by default neither the request hit nor any later request
of the connection reaches the broker, so a producer without idempotence that re-sends after its
timeout writes each record once (records in the topic == records acknowledged). ``forward: true``
keeps "written but never answered": the same producer then duplicates what the broker wrote
behind its back, which is what proves the switch does something.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka import KafkaProducer

from kproxy.protocol.frame_builder import request_frame
from kproxy.testing import Broker, ProxyThread, running_proxy
from tests.support.e2e import consume_confluent, create_topic, unique

MESSAGES = 200


@pytest.fixture
def holed(tansu: Broker, tmp_path: Path) -> Iterator[Any]:
    """``holed(action)``: (kproxy in front of Tansu, topic) where the third Produce to the topic
    meets ``action``, once: the connection it came on is the hole, the client's next one is not."""
    opened: list[Any] = []

    def start(action: str) -> tuple[ProxyThread, str]:
        topic = unique("rules-hole")
        path = tmp_path / f"rules-{len(opened)}.yaml"
        path.write_text(f"""
rules:
  - id: hole
    match: {{api: produce, topic: "{topic}", schedule: {{after_requests: 2, first: 1}}}}
    actions:
      - {action}
""")
        create_topic(tansu.bootstrap, topic, 1)
        cm = running_proxy(tansu.bootstrap, rules=str(path))
        opened.append(cm)
        return cm.__enter__(), topic

    yield start
    for cm in reversed(opened):
        cm.__exit__(None, None, None)


def in_topic(tansu: Broker, topic: str) -> Counter[bytes | None]:
    """Every record of the topic's partition 0, read from the broker itself, counted by value."""
    return Counter(value for _, value in consume_confluent(tansu.bootstrap, topic, 1, 10**6, timeout=3))


def produce_librdkafka(bootstrap: str, topic: str, **config: Any) -> tuple[int, float]:
    """MESSAGES records, acks=all and no idempotence, small batches (so several Produce requests are
    in flight when the hole opens); (how many were acknowledged, seconds until the last report)."""
    acked: list[int] = []
    failed: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                         "linger.ms": 5, "batch.num.messages": 10, "message.timeout.ms": 60000, **config})
    started = time.monotonic()
    for i in range(MESSAGES):
        producer.produce(topic, value=f"v{i}".encode(),
                         on_delivery=lambda err, _msg: failed.append(err) if err else acked.append(1))
        if i % 20 == 0:
            producer.poll(0.01)
    assert producer.flush(90) == 0
    assert not failed, f"delivery errors: {failed[:3]}"
    return len(acked), time.monotonic() - started


@pytest.mark.parametrize("action", ["blackhole", "blackhole: {close_after_ms: 1500}"])
def test_a_black_hole_writes_nothing_so_a_producer_without_idempotence_writes_each_record_once(
        holed: Any, tansu: Broker, action: str) -> None:
    proxy, topic = holed(action)
    # socket.timeout.ms is what ends librdkafka's wait on a silent connection (measured: a 2 s
    # setting recovers in 2.3-2.6 s; request.timeout.ms alone re-sends on the same silent
    # connection until socket.timeout.ms, 60 s by default). close_after_ms ends it first.
    acked, seconds = produce_librdkafka(proxy.bootstrap, topic, **{"socket.timeout.ms": 2000})
    written = in_topic(tansu, topic)
    assert acked == MESSAGES
    assert sum(written.values()) == acked, f"{sum(written.values()) - acked} records written the client never knew of"
    assert set(written) == {f"v{i}".encode() for i in range(MESSAGES)}
    assert seconds < 15, f"recovery took {seconds:.1f} s"


@pytest.mark.parametrize("action", ["blackhole: {forward: true}", "blackhole: {close_after_ms: 1500, forward: true}"])
def test_forward_true_writes_what_it_never_answers_and_the_retries_duplicate_it(
        holed: Any, tansu: Broker, action: str) -> None:
    proxy, topic = holed(action)
    acked, _ = produce_librdkafka(proxy.bootstrap, topic, **{"socket.timeout.ms": 2000})
    written = in_topic(tansu, topic)
    assert acked == MESSAGES and set(written) == {f"v{i}".encode() for i in range(MESSAGES)}
    duplicates = sum(written.values()) - acked
    assert duplicates > 0, "forward: true should have let the broker write the unanswered requests"


@pytest.mark.parametrize(("action", "duplicated"), [("blackhole", False), ("blackhole: {forward: true}", True)])
def test_kafka_python_recovers_after_request_timeout_ms_and_duplicates_only_when_forwarded(
        holed: Any, tansu: Broker, action: str, duplicated: bool) -> None:
    proxy, topic = holed(action)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all", enable_idempotence=False,
                             linger_ms=5, batch_size=200, request_timeout_ms=3000)
    try:
        started = time.monotonic()
        futures = [producer.send(topic, value=f"v{i}".encode()) for i in range(MESSAGES)]
        producer.flush(timeout=60)
        seconds = time.monotonic() - started
        assert all(f.succeeded() for f in futures)
    finally:
        producer.close(timeout=5)
    written = in_topic(tansu, topic)
    assert set(written) == {f"v{i}".encode() for i in range(MESSAGES)}
    assert (sum(written.values()) > MESSAGES) is duplicated
    # kafka-python closes a connection whose request timed out: request_timeout_ms bounds its wait.
    assert 3.0 <= seconds < 15, f"recovery took {seconds:.1f} s"


METADATA = 3


def _silent_until_closed(sock: socket.socket, limit: float) -> float:
    """Seconds until kproxy closes ``sock``, asserting it sent nothing before (at most ``limit``)."""
    started = time.monotonic()
    sock.settimeout(limit)
    assert sock.recv(1) == b"", "a black hole answered"
    return time.monotonic() - started


def test_the_idle_and_frame_timeouts_still_end_a_black_holed_connection(tansu: Broker, tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  - id: hole\n    match: {api: metadata}\n    actions: [blackhole]\n")
    request = request_frame(METADATA, 9, 1, client_id="hole", topics=[], allow_auto_topic_creation=False)
    with running_proxy(tansu.bootstrap, rules=str(path), limits__idle_timeout=1.0, limits__frame_timeout=0.3) as proxy:
        host, port = proxy.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(request)
            assert 0.9 <= _silent_until_closed(sock, 10) < 5, "idle_timeout should end the silent connection"
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(request + request[:10])  # then a frame that never completes
            assert _silent_until_closed(sock, 10) < 0.9, "frame_timeout should end it before idle_timeout"
