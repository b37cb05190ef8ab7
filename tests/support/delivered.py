"""What clients report as delivered, and what the broker holds: read back from the broker itself."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from tests.support.e2e import unique

# One record's outcome as a test's producer reports it: {"i": n, "partition": p or None, "sent": epoch
# ms, "acked": epoch ms or None, "error": str or None} (tests/support/node/produce.js writes the same).
Outcome = dict[str, Any]


def read_back(bootstrap: str, topic: str, partitions: int, quiet_s: float = 2.0, limit_s: float = 30.0
              ) -> list[bytes]:
    """Every record value of ``topic``, read from the broker itself until no new record came for
    ``quiet_s`` (Tansu reports a partition's end offset as its last batch's first offset + 1, so
    the end offset cannot say when everything was read)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("read-back"),
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got: list[bytes] = []
        last_new = started = time.monotonic()
        while time.monotonic() - last_new < quiet_s and time.monotonic() - started < limit_s:
            for msg in consumer.consume(num_messages=500, timeout=0.2):
                assert msg.error() is None, f"read-back error: {msg.error()}"
                got.append(msg.value())
                last_new = time.monotonic()
        return got
    finally:
        consumer.close()
