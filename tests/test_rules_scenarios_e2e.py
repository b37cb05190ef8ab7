"""Scenario keys with a real client: librdkafka (confluent-kafka) through kproxy in front of Tansu.

What a producer sees when a rule picks its requests by size (``request_bytes``) or by a record's
key and header (``record``, over librdkafka's own compressed batches): the error in the delivery
report of exactly those messages, and the others written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer

from kproxy.testing import Broker, running_proxy
from tests.support.e2e import consume_confluent, create_topic, unique


def deliver_each(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes, list[tuple[str, bytes]]]],
                 **config: Any) -> list[KafkaError | None]:
    """Produce each message in a Produce of its own (flushed one by one); each one's delivery error."""
    reports: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "message.timeout.ms": 15000,
                         "message.max.bytes": 2_000_000, **config})

    def report(err: KafkaError | None, _msg: Any) -> None:
        reports.append(err)

    for key, value, headers in messages:
        producer.produce(topic, key=key, value=value, headers=headers, on_delivery=report)
        assert producer.flush(20) == 0
    return reports


def test_a_produce_larger_than_request_bytes_fails_and_smaller_ones_are_written(tansu: Broker, tmp_path: Path
                                                                                ) -> None:
    topic = unique("big-produce")
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"""
rules:
  - id: big-produce
    match: {{api: produce, topic: "{topic}", request_bytes: {{min: 100000}}}}
    actions:
      - inject_error: {{error: MESSAGE_TOO_LARGE}}
""")
    with running_proxy(tansu.bootstrap, rules=str(rules)) as proxy:
        create_topic(proxy.bootstrap, topic, 1)
        reports = deliver_each(proxy.bootstrap, topic, [(b"small-1", b"x" * 100, []), (b"big", b"y" * 200_000, []),
                                                        (b"small-2", b"z" * 1000, [])])
        assert reports[0] is None and reports[2] is None
        error = reports[1]
        assert error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE and not error.retriable()
        assert sorted(k for k, _ in consume_confluent(proxy.bootstrap, topic, 1, 2)) == [b"small-1", b"small-2"]


def test_a_record_key_and_header_pick_one_users_records_in_compressed_batches(tansu: Broker, tmp_path: Path
                                                                             ) -> None:
    topic = unique("one-user")
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"""
rules:
  - id: one-user
    match: {{api: produce, topic: "{topic}", record: {{key: "user-3", header: tenant, header_value: acme}}}}
    actions:
      - inject_error: {{error: INVALID_RECORD}}
""")
    with running_proxy(tansu.bootstrap, rules=str(rules)) as proxy:
        create_topic(proxy.bootstrap, topic, 1)
        sent = [(b"user-%d" % i, b"v" * 50, [("tenant", b"acme" if i != 4 else b"globex")]) for i in range(1, 6)]
        sent.append((b"user-3", b"w", [("tenant", b"globex")]))  # the key, another tenant: written
        reports = deliver_each(proxy.bootstrap, topic, sent[:3], **{"compression.type": "lz4"})
        reports += deliver_each(proxy.bootstrap, topic, sent[3:], **{"compression.type": "gzip"})
        failed = [i for i, err in enumerate(reports) if err is not None]
        assert failed == [2], reports  # user-3 of tenant acme alone
        error = reports[2]
        assert error is not None and error.code() == KafkaError.INVALID_RECORD and not error.retriable()
        written = sorted(k for k, _ in consume_confluent(proxy.bootstrap, topic, 1, 5))
        assert written == [b"user-1", b"user-2", b"user-3", b"user-4", b"user-5"]
