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
from kafka import KafkaProducer
from kafka.errors import TopicAuthorizationFailedError

from kproxy.logfmt import parse_logfmt
from kproxy.protocol import decode_response
from kproxy.protocol.frame_builder import request_frame
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


def _fetch_versions(proxy: ProxyThread) -> set[int]:
    assert proxy.server is not None
    return {int(v) for (api, v) in proxy.call(lambda: list(proxy.server.stats.totals().requests)) if api == "fetch"}


def test_corrupted_fetched_records_fail_the_crc_check_of_the_consumer(with_rules: Any, tansu: Broker) -> None:
    """Matched by topic name though librdkafka's Fetch (v13+) names the topic by id only: kproxy
    learnt the id from the Metadata responses librdkafka read first (v10+ carry topic ids)."""
    topic = unique("rules-crc")
    proxy = with_rules(f"""
rules:
  - id: bitrot
    match: {{api: fetch, topic: "{topic}"}}
    actions:
      - corrupt_records: {{target: crc}}
""")
    create_topic(proxy.bootstrap, topic, 1)
    produce_confluent(proxy.bootstrap, topic, messages("crc", 10), acks="all")
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("crc"), "check.crcs": True,
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
    assert min(_fetch_versions(proxy)) >= 13, "librdkafka should name topics by id in Fetch here"
    assert errors and good == 0, f"{good} records passed the CRC check; errors {errors}"
    # The same records read directly from the broker are intact.
    same_records(consume_confluent(tansu.bootstrap, topic, 1, 10), messages("crc", 10))


def test_a_fetch_throttle_caps_the_consumer_on_response_bytes(with_rules: Any, tansu: Broker) -> None:
    """A broker's fetch quota is on the bytes it sends (KIP-13): so is kproxy's. The consumer's
    requests are tiny; what it reads is held to the rate, and librdkafka reports throttle time."""
    topic = unique("rules-fetch-quota")
    rate = 512 * 1024
    proxy = with_rules(f"""
rules:
  - id: fetch-quota
    match: {{api: fetch, topic: "{topic}"}}
    actions:
      - throttle: {{bytes_per_second: {rate}, burst_seconds: 0.05}}
""")
    create_topic(tansu.bootstrap, topic, 1)
    # Small batches, written straight to the broker: a Fetch returns whole batches up to its byte limit.
    value, count = b"f" * 10_000, 250
    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 5, "batch.size": 40_000})
    for _ in range(count):
        producer.produce(topic, value=value)
        producer.poll(0)
    assert producer.flush(30) == 0
    stats: list[dict[str, Any]] = []
    limit = 64 * 1024  # bytes per Fetch: ~40 Fetches for the topic
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("fetch-quota"),
                         "enable.auto.commit": False, "max.partition.fetch.bytes": limit, "fetch.max.bytes": limit,
                         "message.max.bytes": limit, "statistics.interval.ms": 500,
                         "stats_cb": lambda s: stats.append(json.loads(s))})
    received, first = 0, None
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30
        while received < count * len(value) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=100, timeout=0.2):
                assert msg.error() is None, msg.error()
                first = first or time.monotonic()
                received += len(msg.value())
        elapsed = time.monotonic() - (first or 0.0)
        consumer.poll(0.6)  # one more statistics report
    finally:
        consumer.close()
    assert received == count * len(value)
    measured = received / elapsed  # from the first record: a broker's quota, too, lets the first response go
    assert abs(measured - rate) / rate <= 0.10, f"measured {measured:.0f} B/s for a {rate} B/s fetch throttle"
    throttles = [b["throttle"]["max"] for s in stats for b in s["brokers"].values() if b.get("nodeid", -1) >= 0]
    assert max(throttles) > 0, "librdkafka saw no throttle_time_ms"


# -- kafka-python: another client's handling of the same faults --------------------------------------
def test_kafka_python_retries_errors_after_the_broker_wrote_and_its_idempotence_keeps_every_message_once(
        with_rules: Any, caplog: pytest.LogCaptureFixture) -> None:
    """``mode: replace``: the broker has the records when kafka-python is told NOT_LEADER_OR_FOLLOWER;
    its retries (idempotent by default since 3.0) must not write them twice."""
    topic = unique("rules-kp-retry")
    proxy = with_rules(f"""
rules:
  - id: kp-flaky-leader
    match: {{api: produce, topic: "{topic}", schedule: {{every: 3}}}}
    actions:
      - inject_error: {{error: NOT_LEADER_OR_FOLLOWER, mode: replace}}
""")
    create_topic(proxy.bootstrap, topic, PARTITIONS)
    sent = messages("kp-retry", 300)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all", retry_backoff_ms=20,
                             request_timeout_ms=15000)
    try:
        with caplog.at_level(logging.INFO, "kproxy.faults"):
            # Ten flushes: at least ten Produce requests however kafka-python batches under load.
            for start in range(0, len(sent), 30):
                futures = [producer.send(topic, key=k, value=v) for k, v in sent[start:start + 30]]
                producer.flush(timeout=30)
                for f in futures:
                    f.get(timeout=15)
    finally:
        producer.close(timeout=5)
    assert len(faults(caplog, "kp-flaky-leader")) >= 3, "the rule should have failed some Produce requests"
    same_records(consume_confluent(proxy.bootstrap, topic, PARTITIONS, len(sent)), sent)


def test_a_non_retriable_error_reaches_the_kafka_python_application(with_rules: Any) -> None:
    topic = unique("rules-kp-fatal")
    proxy = with_rules(f"""
rules:
  - id: kp-denied
    match: {{api: produce, topic: "{topic}"}}
    actions:
      - inject_error: {{error: TOPIC_AUTHORIZATION_FAILED}}
""")
    create_topic(proxy.bootstrap, topic, 1)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, request_timeout_ms=10000)
    try:
        future = producer.send(topic, value=b"x")
        with pytest.raises(TopicAuthorizationFailedError):
            future.get(timeout=15)
    finally:
        producer.close(timeout=5)


def test_drop_response_makes_kafka_python_time_out_and_retry(with_rules: Any,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    topic = unique("rules-kp-drop")
    proxy = with_rules(f"""
rules:
  - id: kp-lost-answer
    match: {{api: produce, topic: "{topic}", schedule: {{first: 1}}}}
    actions:
      - drop_response
""")
    create_topic(proxy.bootstrap, topic, 1)
    sent = messages("kp-drop", 1)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, "kproxy.faults"):
        # A request timeout closes kafka-python's connection; the retry goes on a new one.
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all", request_timeout_ms=2000,
                                 delivery_timeout_ms=20000, retry_backoff_ms=50)
        try:
            producer.send(topic, key=sent[0][0], value=sent[0][1]).get(timeout=20)
        finally:
            producer.close(timeout=5)
    elapsed = time.monotonic() - started
    assert len(faults(caplog, "kp-lost-answer")) == 1
    assert elapsed >= 2.0, "the first answer was dropped: the client had to time out first"
    same_records(consume_confluent(proxy.bootstrap, topic, 1, len(sent)), sent)


def test_a_produce_throttle_caps_kafka_python_which_reports_and_honours_throttle_time(with_rules: Any) -> None:
    """kafka-python, unlike librdkafka, backs off by itself for the throttle_time_ms it is given
    (KIP-219, brokers 2.0+): the rate must still be the rule's, not lower."""
    topic = unique("rules-kp-quota")
    rate = 400_000
    proxy = with_rules(f"""
rules:
  - id: kp-quota
    match: {{api: produce, topic: "{topic}"}}
    actions:
      - throttle: {{bytes_per_second: {rate}, burst_seconds: 0.05}}
""")
    create_topic(proxy.bootstrap, topic, 1)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, linger_ms=5, acks="all", request_timeout_ms=15000)
    try:
        producer.send(topic, value=b"warm-up").get(timeout=15)
        payload, total = b"v" * 10_000, 2_000_000
        started = time.monotonic()
        futures = [producer.send(topic, value=payload) for _ in range(total // len(payload))]
        producer.flush(timeout=30)
        for f in futures:
            f.get(timeout=1)
        elapsed = time.monotonic() - started
        metrics = producer.metrics()
    finally:
        producer.close(timeout=5)
    measured = total / elapsed
    print(f"kafka-python under a {rate} B/s throttle: {measured:.0f} B/s, throttle-time-max "
          f"{metrics['producer-metrics']['throttle-time-max']} ms")
    assert abs(measured - rate) / rate <= 0.10, f"measured {measured:.0f} B/s for a {rate} B/s throttle"
    assert metrics["producer-metrics"]["throttle-time-max"] > 0, "kafka-python saw no throttle_time_ms"
