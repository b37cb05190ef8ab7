"""Helpers for end-to-end tests: real clients, through a real kproxy, to a real Tansu broker.

Everything here is bounded: every wait has a deadline, every client call a timeout.
The checks that clients only ever reach the broker through kproxy live here too:

* :func:`assert_kproxy_endpoint` -- an address a client learned is a kproxy listener,
  never the broker's;
* :func:`assert_only_kproxy_reaches_broker` -- from the operating system's side
  (``/proc/net/tcp``): every TCP connection to the broker opened during a test
  is one of kproxy's upstream connections.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition

from kproxy.testing import Broker, ProxyThread

PROXY_HOST = "127.0.0.1"  # what the test proxy listens on and advertises
TANSU_NODE_ID = 111
KeyValue = tuple[bytes | None, bytes | None]


def unique(prefix: str) -> str:
    """A topic or group name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def no_protocol_errors_in_kproxy(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail if, meanwhile, kproxy crashed a connection or closed one for a protocol error
    (a desynchronised stream, a response it could not rewrite, a malformed frame)."""
    caplog.set_level(logging.INFO, logger="kproxy")
    yield
    bad = [r.getMessage() for r in caplog.records if r.name.startswith("kproxy")
           and ("connection_crashed" in r.getMessage() or 'reason="bad ' in r.getMessage())]
    assert not bad, "kproxy closed connections on protocol errors:\n" + "\n".join(bad)


# -- where clients go ------------------------------------------------------------------------
def kproxy_ports(proxy: ProxyThread) -> set[int]:
    assert proxy.server is not None
    return set(proxy.call(lambda: list(proxy.server.listeners)))  # type: ignore[union-attr]


def assert_kproxy_endpoint(proxy: ProxyThread, broker: Broker, host: str, port: int, what: str) -> None:
    """``host:port``, learned by a client as ``what``, is a kproxy listener and not the broker."""
    assert port != broker.port, f"{what}: the broker's own port {port} reached the client"
    assert host == PROXY_HOST, f"{what}: host {host!r} is not kproxy's {PROXY_HOST}"
    assert port in kproxy_ports(proxy), f"{what}: port {port} is not one of kproxy's listeners"


def connections_total(proxy: ProxyThread) -> int:
    assert proxy.server is not None
    return int(proxy.call(lambda: proxy.server.connections_total))  # type: ignore[union-attr]


def _established_to(port: int) -> set[int]:
    """Local ports of this machine's ESTABLISHED TCP connections whose remote port is ``port``."""
    out: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                local, remote, state = cols[1], cols[2], cols[3]
                if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                    out.add(int(local.rsplit(":", 1)[1], 16))
    return out


class BrokerConnections:
    """Connections to the broker opened since :meth:`start` (the session's broker is shared)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.before: set[int] = set()

    def start(self) -> BrokerConnections:
        if not Path("/proc/net/tcp").exists():
            pytest.skip("needs /proc/net/tcp (Linux) to see who connects to the broker")
        self.before = _established_to(self.broker.port)
        return self

    def new(self) -> set[int]:
        return _established_to(self.broker.port) - self.before


def kproxy_upstream_ports(proxy: ProxyThread) -> set[int]:
    """Local ports of kproxy's open connections to the broker."""
    assert proxy.server is not None

    def ports() -> list[int]:
        found = []
        for conn in proxy.server.connections:  # type: ignore[union-attr]
            with contextlib.suppress(AttributeError, OSError):
                found.append(conn.upstream.socket.getsockname()[1])
        return found

    return set(proxy.call(ports))


def assert_only_kproxy_reaches_broker(proxy: ProxyThread, seen: BrokerConnections, timeout: float = 5.0) -> None:
    """Every broker connection opened since ``seen.start()`` belongs to kproxy.

    A client connecting to the broker directly would hold a connection kproxy does
    not own; one kproxy just opened may show in ``/proc`` a moment before its
    connection is registered, so a stranger must persist until ``timeout`` to fail.
    """
    deadline = time.monotonic() + timeout
    while True:
        strangers = seen.new() - kproxy_upstream_ports(proxy)
        if not strangers:
            assert seen.new(), "no connection to the broker at all: did the client do anything?"
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"connections to the broker from local ports {sorted(strangers)} "
                                 "are not kproxy's: a client reached the broker directly")
        time.sleep(0.1)


# -- confluent-kafka (librdkafka) ----------------------------------------------------------------
def create_topic(bootstrap: str, name: str, partitions: int = 3, config: dict[str, str] | None = None,
                 **client: Any) -> None:
    """Create ``name`` (topic ``config``); ``client``: more admin client settings (SASL's, say)."""
    # Timeouts a loaded test machine's broker keeps: a broker that never answers still fails in a minute.
    admin = AdminClient({"bootstrap.servers": bootstrap, **client})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                            config=config or {})], operation_timeout=30, request_timeout=45)
    futures[name].result(timeout=60)


def produce_confluent(bootstrap: str, topic: str, messages: Iterable[KeyValue], **config: Any) -> Producer:
    """Produce and wait for every delivery report; any delivery error fails the test.

    Returns the producer, still connected: with acks=0 a delivery report only means
    "written to the socket", so a test keeps the producer until the records are seen.
    """
    producer = Producer({"bootstrap.servers": bootstrap, **config})
    errors: list[Any] = []
    for key, value in messages:
        while True:
            try:
                producer.produce(topic, key=key, value=value,
                                 on_delivery=lambda err, _msg: errors.append(err) if err else None)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(30)
    assert left == 0, f"{left} messages still undelivered after 30 s"
    assert not errors, f"delivery errors: {errors[:5]}"
    return producer


def consume_confluent(bootstrap: str, topic: str, partitions: int, count: int,
                      timeout: float = 30.0, **config: Any) -> list[KeyValue]:
    """Read ``count`` messages from the start of every partition (assigned, no group); ``config``:
    more consumer settings (SASL's, say)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"),
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", **config})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got: list[KeyValue] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                assert msg.error() is None, f"consumer error: {msg.error()}"
                got.append((msg.key(), msg.value()))
        # Anything more (duplicates) would show within a short extra poll.
        for msg in consumer.consume(num_messages=500, timeout=0.3):
            if msg.error() is None:
                got.append((msg.key(), msg.value()))
        return got
    finally:
        consumer.close()



def round_trip(bootstrap: str, prefix: str, count: int) -> None:
    """A new topic of two partitions, ``count`` records produced through ``bootstrap`` and read back:
    every one, once (librdkafka both ways)."""
    topic = unique(prefix)
    create_topic(bootstrap, topic, partitions=2)
    sent = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(count)]
    produce_confluent(bootstrap, topic, sent).flush(10)
    assert sorted(consume_confluent(bootstrap, topic, 2, len(sent))) == sorted(sent)


# -- kafka-python ---------------------------------------------------------------------------------
def consume_kafka_python(bootstrap: str, topic: str, partitions: int, count: int,
                         timeout: float = 30.0, **config: Any) -> list[KeyValue]:
    """Read ``count`` messages from the start of every partition with kafka-python (no group);
    ``config``: more consumer settings."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", request_timeout_ms=15000, **config)
    try:
        tps = [KTopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got: list[KeyValue] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((r.key, r.value) for r in records)
        for records in consumer.poll(timeout_ms=300).values():
            got.extend((r.key, r.value) for r in records)
        return got
    finally:
        consumer.close()


# -- raw Fetch: what the broker stores, batch by batch ------------------------------------------------
def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        buf += chunk
    return bytes(buf)


@dataclass(frozen=True)
class StoredBatch:
    """Header fields of one v2 record batch as the broker returns it."""

    partition: int
    codec: int  # attributes & 7
    transactional: bool
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int


def fetch_batches(bootstrap: str, topic: str, partitions: int) -> list[StoredBatch]:
    """The v2 record batches stored in ``topic``, header fields only.

    A hand-written Fetch v4 (no kproxy code involved on the client side), sent to
    ``bootstrap``: the test proxy's bootstrap listener forwards to the single broker.
    """
    host, port = bootstrap.rsplit(":", 1)
    parts = b"".join(struct.pack(">iqi", p, 0, 4 << 20) for p in range(partitions))
    body = struct.pack(">iiiib", -1, 100, 1, 16 << 20, 0) + struct.pack(">i", 1) + _string(topic) \
        + struct.pack(">i", partitions) + parts
    request = struct.pack(">hhi", 1, 4, 7) + _string("e2e-raw-fetch") + body
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        data = _recv_exactly(sock, size)
    correlation_id, _throttle, n_topics = struct.unpack_from(">iii", data, 0)
    assert correlation_id == 7
    batches: list[StoredBatch] = []
    pos = 12
    for _ in range(n_topics):
        (name_len,) = struct.unpack_from(">h", data, pos)
        pos += 2 + name_len
        (n_parts,) = struct.unpack_from(">i", data, pos)
        pos += 4
        for _ in range(n_parts):
            partition, error_code = struct.unpack_from(">ih", data, pos)
            assert error_code == 0, f"fetch of partition {partition}: error {error_code}"
            pos += 4 + 2 + 8 + 8
            (n_aborted,) = struct.unpack_from(">i", data, pos)
            pos += 4 + max(n_aborted, 0) * 16
            (records_len,) = struct.unpack_from(">i", data, pos)
            pos += 4
            records, pos = data[pos:pos + max(records_len, 0)], pos + max(records_len, 0)
            at = 0
            # v2 batch header: base_offset q, length i, leader_epoch i, magic b, crc I, attributes h,
            # last_offset_delta i, first/max timestamp q q, producer_id q, epoch h, base_sequence i, count i
            while at + 61 <= len(records):
                (batch_len,) = struct.unpack_from(">i", records, at + 8)
                if at + 12 + batch_len > len(records):
                    break  # a partial batch at the end of a fetch
                magic = records[at + 16]
                assert magic == 2, f"expected record batch v2, got magic {magic}"
                (attributes,) = struct.unpack_from(">h", records, at + 21)
                producer_id, epoch, base_sequence, count = struct.unpack_from(">qhii", records, at + 43)
                batches.append(StoredBatch(partition, attributes & 0x07, bool(attributes & 0x10), producer_id,
                                           epoch, base_sequence, count))
                at += 12 + batch_len
    return batches


def fetch_batch_codecs(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """Compression codec ids of the record batches stored in ``topic``."""
    return [b.codec for b in fetch_batches(bootstrap, topic, partitions)]
