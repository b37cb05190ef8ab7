"""Rules against the real broker with real clients: what a client sees when kproxy misbehaves on purpose."""

from __future__ import annotations

import json
import logging
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from kproxy.protocol import decode_response
from kproxy.protocol.builders import request_frame
from kproxy.server.logfmt import parse_logfmt
from kproxy.testing import Broker, ProxyThread, running_proxy
from tests.support.e2e import _recv_exactly, consume_confluent, create_topic, produce_confluent, unique
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


# A non-retriable error reaching the application, and a delay in measured latency: moved to
# tests/plugin/user_suite/test_faults.py, run through kproxy's pytest plugin as a user would.


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


# -- determinism ---------------------------------------------------------------------------------
METADATA = 3
LEADER_NOT_AVAILABLE = 5


def _metadata_errors(bootstrap: str, topic: str, n: int) -> dict[int, int]:
    """Send ``n`` Metadata requests one at a time on one raw connection; correlation id -> topic error."""
    host, port = bootstrap.rsplit(":", 1)
    out: dict[int, int] = {}
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for cid in range(1, n + 1):
            sock.sendall(request_frame(METADATA, 9, cid, client_id="determinism", topics=[{"name": topic}],
                                       allow_auto_topic_creation=False))
            (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
            response = decode_response(_recv_exactly(sock, size), METADATA, 9)
            assert response.header.correlation_id == cid
            out[cid] = response.body["topics"][0]["error_code"]
    return out


def test_same_seed_same_faults_other_seed_other_faults(with_rules: Any, caplog: pytest.LogCaptureFixture) -> None:
    topic = unique("rules-seed")
    runs = []
    for i, seed in enumerate((42, 42, 43)):  # the draw hashes seed, rule id, client id, api, ordinal
        proxy = with_rules(f"""
seed: {seed}
rules:
  - id: coin
    match: {{api: metadata, topic: "{topic}", probability: 0.5}}
    actions:
      - inject_error: {{error: LEADER_NOT_AVAILABLE}}
""")
        if i == 0:
            create_topic(proxy.bootstrap, topic, 1)
        caplog.clear()
        with caplog.at_level(logging.INFO, "kproxy.faults"):
            errors = _metadata_errors(proxy.bootstrap, topic, 40)
        logged = [int(f["correlation_id"]) for f in faults(caplog, "coin")]
        # What the client saw is what the fault log says, request by request.
        assert logged == [cid for cid, code in errors.items() if code == LEADER_NOT_AVAILABLE]
        assert {code for cid, code in errors.items() if cid not in logged} == {0}
        runs.append(logged)
    assert 5 < len(runs[0]) < 35
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_corrupted_fetched_records_fail_the_crc_check_of_the_consumer(with_rules: Any, tansu: Broker) -> None:
    topic = unique("rules-crc")
    proxy = with_rules(f"""
rules:
  - id: bitrot
    match: {{api: fetch, client_id: "{topic}-reader"}}
    actions:
      - corrupt_records: {{target: crc}}
""")
    create_topic(proxy.bootstrap, topic, 1)
    produce_confluent(proxy.bootstrap, topic, messages("crc", 10), acks="all")
    # Matched by client id: Fetch v13+ names topics by id, which the rules see as the id's text.
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("crc"), "check.crcs": True,
                         "client.id": f"{topic}-reader",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        errors, good = [], 0
        deadline = time.monotonic() + 15
        while not errors and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=100, timeout=0.5):
                if msg.error() is not None:
                    errors.append(msg.error())
                else:
                    good += 1
    finally:
        consumer.close()
    assert errors and good == 0, f"{good} records passed the CRC check; errors {errors}"
    # The same records read directly from the broker are intact.
    same_records(consume_confluent(tansu.bootstrap, topic, 1, 10), messages("crc", 10))
