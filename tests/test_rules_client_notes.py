"""The facts rules/README.md states under "What a client sees", measured with real clients
(librdkafka via confluent-kafka, kafka-python) through kproxy in front of the embedded broker.
The facts the example files state are checked in tests/test_rules_examples_clients.py."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from kafka import KafkaProducer

from kproxy.testing import Broker, ProxyThread, running_proxy
from tests.support.e2e import create_topic, unique


@pytest.fixture
def with_rules(tansu: Broker, tmp_path: Path) -> Iterator[Any]:
    """``with_rules(text)``: a fresh kproxy in front of Tansu running that rule file."""
    stack: list[Any] = []

    def start(text: str) -> ProxyThread:
        path = tmp_path / f"rules-{len(stack)}.yaml"
        path.write_text(text)
        cm = running_proxy(tansu.bootstrap, rules=str(path))
        stack.append(cm)
        return cm.__enter__()

    yield start
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


@pytest.mark.parametrize("action", ["close_connection", "reset_connection"])
def test_a_closed_or_reset_connection_is_recovered_from_within_a_second(with_rules: Any, action: str) -> None:
    """The first Produce is answered by a FIN (close) or an RST (reset): librdkafka reconnects after
    reconnect.backoff.ms and sends it again; kafka-python likewise (reconnect_backoff_ms)."""
    took: dict[str, float] = {}
    for client in ("librdkafka", "kafka-python"):
        topic = unique(action.replace("_", "-"))
        proxy = with_rules(f"""
rules:
  - id: hang-up
    match: {{api: produce, topic: "{topic}", schedule: {{first: 1}}}}
    actions:
      - {action}
""")
        create_topic(proxy.bootstrap, topic, 1)
        if client == "librdkafka":
            producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "enable.idempotence": True,
                                 "reconnect.backoff.ms": 100})
            producer.list_topics(topic, timeout=10)
            reports: list[Any] = []
            started = time.monotonic()
            producer.produce(topic, value=b"librdkafka", on_delivery=lambda err, _m, r=reports: r.append(err))
            assert producer.flush(15) == 0
            took[client] = time.monotonic() - started
            assert reports == [None]
        else:
            kp = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all", reconnect_backoff_ms=50,
                               retry_backoff_ms=50)
            try:
                kp.partitions_for(topic)
                started = time.monotonic()
                kp.send(topic, value=b"kafka-python").get(timeout=15)
                took[client] = time.monotonic() - started
            finally:
                kp.close(timeout=5)
    print(f"{action}: delivered after " + ", ".join(f"{s:.3f} s ({c})" for c, s in took.items()))
    assert all(s < 1.0 for s in took.values()), took


def test_corrupted_values_keep_a_valid_crc_and_reach_a_crc_checking_consumer_silently(with_rules: Any) -> None:
    """``target: value`` re-computes the batch CRC: ``check.crcs=true`` does not catch it."""
    topic = unique("bitflip")
    proxy = with_rules(f"""
rules:
  - id: flip
    match: {{api: fetch, topic: "{topic}"}}
    actions:
      - corrupt_records: {{target: value}}
""")
    create_topic(proxy.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": proxy.bootstrap})
    sent = [b"value %02d" % i for i in range(10)]
    for value in sent:
        producer.produce(topic, value=value)
    assert producer.flush(15) == 0
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("flip"), "check.crcs": True,
                         "enable.auto.commit": False})
    got: list[bytes] = []
    errors: list[Any] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 15
        while len(got) < len(sent) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=100, timeout=0.3):
                if msg.error() is None:
                    got.append(msg.value())
                else:
                    errors.append(msg.error())
    finally:
        consumer.close()
    assert not errors, errors
    assert len(got) == len(sent) and all(g != s for g, s in zip(got, sent, strict=True)), (got, sent)



@pytest.mark.parametrize("timeout_setting", ["request.timeout.ms", "socket.timeout.ms"])
def test_what_bounds_librdkafka_waiting_for_a_produce_answer(with_rules: Any, timeout_setting: str) -> None:
    """``delay`` forwards the request at once and holds the answer 2.5 s. librdkafka's
    ``request.timeout.ms`` is the broker's acknowledgement timeout, sent in the request: set to 1 s it
    does not stop the client waiting, which ``socket.timeout.ms`` bounds: set to 1 s, librdkafka gives
    the request up and sends the records again, and without idempotence the broker stores them twice."""
    topic = unique("late")
    proxy = with_rules(f"""
rules:
  - id: late
    match: {{api: produce, topic: "{topic}", schedule: {{first: 1}}}}
    actions:
      - delay: {{ms: 2500}}
""")
    create_topic(proxy.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "enable.idempotence": False,
                         timeout_setting: 1000, "message.timeout.ms": 20000, "retry.backoff.ms": 50})
    producer.list_topics(topic, timeout=10)
    reports: list[Any] = []
    started = time.monotonic()
    producer.produce(topic, value=b"late", on_delivery=lambda err, _m: reports.append(err))
    assert producer.flush(25) == 0
    elapsed = time.monotonic() - started
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("late"), "enable.auto.commit": False})
    stored = 0
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            stored += sum(1 for m in consumer.consume(num_messages=10, timeout=0.3) if m.error() is None)
    finally:
        consumer.close()
    print(f"delay 2500 ms, {timeout_setting}=1000: delivered {reports} after {elapsed:.2f} s, {stored} stored")
    assert reports == [None]
    if timeout_setting == "request.timeout.ms":
        assert elapsed >= 2.4 and stored == 1, "librdkafka waited for the held answer"
    else:
        assert elapsed < 2.4, "socket.timeout.ms gave the request up before the answer came"
        assert stored == 2, "the retry wrote the records a second time"


# kafka-python in a process of its own: what it does on a bad CRC is not bounded by its poll timeout.
KAFKA_PYTHON_READER = """
import sys
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import CorruptRecordError
consumer = KafkaConsumer(bootstrap_servers=sys.argv[1], group_id=None, auto_offset_reset="earliest")
consumer.assign([TopicPartition(sys.argv[2], 0)])
read = 0
while read < 10:
    print("poll", flush=True)
    try:
        read += sum(len(records) for records in consumer.poll(timeout_ms=300).values())
    except CorruptRecordError as err:
        print("raised", type(err).__name__, flush=True)
print("read", read, flush=True)
"""


def test_a_bad_crc_stops_kafka_python_inside_poll(with_rules: Any) -> None:
    """kafka-python 3.0 checks CRCs by default (check_crcs): one Fetch answer with a bad CRC (the
    next ones intact) raises CorruptRecordError from ``poll``, and the next ``poll(timeout_ms=300)``
    did not return within 15 s."""
    topic = unique("kp-crc")
    proxy = with_rules(f"""
rules:
  - id: bitrot-once
    match: {{api: fetch, topic: "{topic}", schedule: {{first: 1}}}}
    actions:
      - corrupt_records: {{target: crc}}
""")
    create_topic(proxy.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": proxy.bootstrap})
    for i in range(10):
        producer.produce(topic, value=b"record %02d" % i)
    assert producer.flush(15) == 0
    reader = subprocess.Popen([sys.executable, "-c", KAFKA_PYTHON_READER, proxy.bootstrap, topic],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        out, _ = reader.communicate(timeout=15)
        finished = True
    except subprocess.TimeoutExpired:
        reader.kill()
        out, _ = reader.communicate()
        finished = False
    lines = out.splitlines()
    print(f"kafka-python on a bad CRC: finished={finished}, output {lines[-3:]}")
    assert "raised CorruptRecordError" in lines
    assert not finished and lines[-1] == "poll", "kafka-python returned from poll: update rules/README.md"
