"""The clients of the soak (tests/test_soak.py), each one step of traffic at a time.

A :class:`Worker` thread repeats one client's ``step`` until told to stop; each client keeps
what it saw in the shared :class:`Observed`, which the soak's checks read afterwards. Nothing
here asserts: a worker keeps the first exception of its step for the test to raise.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from kafka.admin import KafkaAdminClient

from kproxy.protocol import decode_response
from kproxy.protocol.frame_builder import request_frame
from tests.support.e2e import unique
from tests.support.resilience import recv_frame, vm_rss_kb

API_VERSIONS, METADATA, LIST_OFFSETS = 18, 3, 2


@dataclass
class Observed:
    """What the soak's clients saw: where the broker put each produce, what the group consumed,
    the answers that reached the wrong request, kproxy's RSS once a second."""

    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # value -> (partition, offset)
    produce_errors: list[str] = field(default_factory=list)
    consumed: dict[tuple[int, int], bytes] = field(default_factory=dict)
    duplicates: list[tuple[int, int]] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    raw_requests: int = 0
    rss: list[int] = field(default_factory=list)

    def acked_where(self) -> dict[tuple[int, int], bytes]:
        """(partition, offset) -> value of every acknowledged produce."""
        return {where: value for value, where in self.acked.items()}


class Worker(threading.Thread):
    """Runs ``step`` until ``stop`` is set; the first exception is kept in ``error``."""

    def __init__(self, name: str, step: Callable[[], None], stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.step, self.stop = step, stop
        self.error: BaseException | None = None
        self.steps = 0

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
                self.steps += 1
        except BaseException as exc:
            self.error = exc


class IdempotentProducer:
    """A confluent-kafka producer (idempotent, acks=all) writing keyed records ``TAG-N``, 20 a step;
    the broker's (partition, offset) of each acknowledged one goes to ``observed.acked``."""

    def __init__(self, bootstrap: str, topic: str, tag: str, observed: Observed) -> None:
        self.topic, self.tag, self.observed = topic, tag.encode(), observed
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 5, "message.timeout.ms": 60000})
        self.sent = 0

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.observed.produce_errors.append(str(err))
        else:
            self.observed.acked[msg.value()] = (msg.partition(), msg.offset())

    def step(self) -> None:
        for _ in range(20):
            n = self.sent
            try:
                self.producer.produce(self.topic, key=b"%d" % (n % 17), value=b"%s-%d" % (self.tag, n),
                                      on_delivery=self._on_delivery)
            except BufferError:
                break
            self.sent += 1
        self.producer.poll(0.01)

    def flush(self, timeout: float) -> int:
        """Messages still unacknowledged after ``timeout`` seconds."""
        return int(self.producer.flush(timeout))


class GroupConsumer:
    """A confluent-kafka consumer group member reading the topic as it is written into
    ``observed.consumed``; an offset handed over twice goes to ``observed.duplicates``."""

    def __init__(self, bootstrap: str, topic: str, group: str, observed: Observed) -> None:
        self.observed = observed
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "auto.offset.reset": "earliest", "enable.auto.commit": True,
                                  "session.timeout.ms": 10000})
        self.consumer.subscribe([topic])

    def step(self) -> None:
        for msg in self.consumer.consume(num_messages=500, timeout=0.2):
            if msg.error() is not None:
                continue  # informational events (partition EOF); errors show as missing records
            where = (msg.partition(), msg.offset())
            if where in self.observed.consumed:
                self.observed.duplicates.append(where)
            self.observed.consumed[where] = msg.value()

    def catch_up(self, wanted: set[tuple[int, int]], timeout: float) -> None:
        """Keep consuming until every offset of ``wanted`` was handed over, or ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not wanted <= self.observed.consumed.keys():
            self.step()

    def close(self) -> None:
        self.consumer.close()


class AdminCalls:
    """kafka-python's admin client: list topics, describe the cluster and the topic, list groups."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)

    def step(self) -> None:
        assert self.topic in self.admin.list_topics()
        self.admin.describe_cluster()
        self.admin.list_groups()
        self.admin.describe_topics([self.topic])
        time.sleep(0.2)

    def close(self) -> None:
        self.admin.close()


class PipeliningClient:
    """A raw socket pipelining ApiVersions, Metadata and ListOffsets ten at a time, each with its
    own correlation id; an answer that is not its request's goes to ``observed.mismatches``."""

    def __init__(self, port: int, topic: str, partitions: int, observed: Observed) -> None:
        self.observed = observed
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        offsets = [{"partition_index": p, "timestamp": -1} for p in range(partitions)]
        self.kinds = [
            (API_VERSIONS, 3, request_frame(API_VERSIONS, 3, 0, client_software_name="soak",
                                            client_software_version="1")),
            (METADATA, 12, request_frame(METADATA, 12, 0, topics=[{"name": topic}])),
            (LIST_OFFSETS, 7, request_frame(LIST_OFFSETS, 7, 0, replica_id=-1,
                                            topics=[{"name": topic, "partitions": offsets}])),
        ]

    def step(self) -> None:
        """Ten pipelined requests of mixed kinds, then their answers: each must be its own."""
        batch = []
        for i in range(10):
            api_key, version, frame = self.kinds[i % len(self.kinds)]
            cid = self.observed.raw_requests = self.observed.raw_requests + 1
            batch.append((api_key, version, cid))
            self.sock.sendall(frame[:8] + struct.pack(">i", cid) + frame[12:])
        for api_key, version, cid in batch:
            answer = decode_response(recv_frame(self.sock), api_key, version)  # decodes as its own kind
            if answer.header.correlation_id != cid:
                self.observed.mismatches.append(f"asked {cid} (api {api_key}), got {answer.header.correlation_id}")
        time.sleep(0.05)

    def close(self) -> None:
        self.sock.close()


def rss_sampler(pid: int, observed: Observed) -> Callable[[], None]:
    """A step noting the VmRSS of process ``pid`` in ``observed.rss``, once a second."""
    def step() -> None:
        observed.rss.append(vm_rss_kb(pid))
        time.sleep(1)
    return step


def run_workers(workers: list[Worker], stop: threading.Event, seconds: float, alive: Callable[[], bool]) -> None:
    """Start ``workers``, let them run ``seconds`` (less if one fails), stop and join them, then
    raise the first failure. ``alive`` is asked twice a second: False fails the run."""
    started = time.monotonic()
    for worker in workers:
        worker.start()
    try:
        while time.monotonic() - started < seconds and all(w.error is None for w in workers):
            time.sleep(0.5)
            assert alive(), "kproxy exited during the soak"
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
    for worker in workers:
        if worker.error is not None:
            raise AssertionError(f"{worker.name} failed") from worker.error


def read_log(bootstrap: str, topic: str, partitions: int, wanted: set[tuple[int, int]],
             timeout: float = 60.0) -> dict[tuple[int, int], bytes]:
    """Every partition of ``topic`` from the start with a fresh consumer (assigned, no group: a
    rebalance cannot hide anything), until ``wanted`` offsets are all seen (bounded)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("soak-reader"),
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    got: dict[tuple[int, int], bytes] = {}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not wanted <= got.keys():
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error() is None:
                    got[(msg.partition(), msg.offset())] = msg.value()
    finally:
        consumer.close()
    return got
