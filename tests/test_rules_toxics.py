"""The byte-level toxics against the real broker with real clients: what reaches the wire, and when.

``bandwidth``, ``slicer``, ``limit_data`` and ``delay`` with ``at: wire`` (kproxy/toxics.py),
measured where kproxy writes to its sockets (``Wire``: every write of every connection, timed) or
with a raw socket reading kproxy's bytes.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from kafka import KafkaProducer

import kproxy.server.connection as connection_module
from kproxy.protocol.codes import ApiKey
from kproxy.protocol.frame_builder import request_frame
from kproxy.rules import load_text
from kproxy.server.fastio import Writer
from kproxy.testing import Broker, ProxyThread, running_proxy
from tests.support.e2e import _recv_exactly, consume_confluent, consume_kafka_python, create_topic, unique
from tests.support.pki import server_pki
from tests.test_cli_admin import kproxy_cli
from tests.test_e2e_clients import same_records

API_VERSIONS = int(ApiKey.API_VERSIONS)
METADATA = int(ApiKey.METADATA)


@dataclass
class Wire:
    """Every write kproxy makes to a socket, as (monotonic time, bytes, to the broker?)."""

    broker_port: int
    writes: list[tuple[float, int, bool]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def writer(self, plain: Callable[[trio.abc.Stream], Writer]) -> Callable[[trio.abc.Stream], Writer]:
        def make(stream: trio.abc.Stream) -> Writer:
            write = plain(stream)
            upstream = stream.socket.getpeername()[1] == self.broker_port  # type: ignore[attr-defined]

            async def recorded(data: bytes) -> None:
                await write(data)
                with self.lock:
                    self.writes.append((time.monotonic(), len(data), upstream))

            return recorded

        return make

    def to(self, upstream: bool) -> list[tuple[float, int]]:
        with self.lock:
            return [(t, n) for t, n, up in self.writes if up is upstream]


@pytest.fixture
def wire(tansu: Broker, monkeypatch: pytest.MonkeyPatch) -> Wire:
    recorder = Wire(int(tansu.bootstrap.rsplit(":", 1)[1]))
    monkeypatch.setattr(connection_module, "writer", recorder.writer(connection_module.writer))
    return recorder


@pytest.fixture
def with_rules(tansu: Broker, tmp_path: Path) -> Iterator[Callable[[str], ProxyThread]]:
    with_rules_stack: list[Any] = []

    def start(text: str) -> ProxyThread:
        path = tmp_path / f"rules-{len(with_rules_stack)}.yaml"
        path.write_text(text)
        cm = running_proxy(tansu.bootstrap, rules=str(path))
        with_rules_stack.append(cm)
        return cm.__enter__()

    yield start
    for cm in reversed(with_rules_stack):
        cm.__exit__(None, None, None)


def payloads(n: int, size: int) -> list[tuple[bytes, bytes]]:
    """Incompressible values: the bytes on the wire are the bytes sent."""
    return [(f"k{i:06d}".encode(), os.urandom(size)) for i in range(n)]


def paced_rate(writes: list[tuple[float, int]]) -> tuple[float, float]:
    """Bytes per second of a paced run of writes (the last write's bytes are still on the link when
    it is made), and its duration."""
    span = writes[-1][0] - writes[0][0]
    return sum(n for _, n in writes[:-1]) / span, span


def api_versions(sock: socket.socket, correlation_id: int) -> int:
    """One ApiVersions v3 round trip; the answer's size."""
    sock.sendall(request_frame(API_VERSIONS, 3, correlation_id, client_software_name="raw",
                               client_software_version="1"))
    (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
    body = _recv_exactly(sock, size)
    assert struct.unpack_from(">i", body)[0] == correlation_id
    return size + 4


def read_to_eof(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    got = bytearray()
    while chunk := sock.recv(65536):
        got += chunk
    return bytes(got)


def hits(proxy: ProxyThread, rule_id: str) -> dict[tuple[str, str, str], int]:
    return proxy.call(lambda: {k: n for k, n in proxy.server.stats.faults.hits.items() if k[0] == rule_id})


# -- bandwidth ---------------------------------------------------------------------------------------
@pytest.mark.pure_only  # Wire patches connection's writer: compiled callers never look it up
def test_bandwidth_downstream_paces_a_consumer_to_its_rate(tansu: Broker, with_rules: Any, wire: Wire) -> None:
    topic = unique("toxic-bw-down")
    rate = 350_000
    create_topic(tansu.bootstrap, topic, 1)
    sent = payloads(180, 10_000)  # 1.8 MB: about 5 s at the rate
    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 5})
    for key, value in sent:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0
    proxy = with_rules(f"""
rules:
  - id: slow-link
    match: {{api: fetch, topic: "{topic}"}}
    actions:
      - bandwidth: {{bytes_per_second: {rate}}}
""")
    started = time.monotonic()
    same_records(consume_confluent(proxy.bootstrap, topic, 1, len(sent), timeout=60), sent)
    elapsed = time.monotonic() - started
    big = [(t, n) for t, n in wire.to(upstream=False) if t >= started]
    measured, span = paced_rate([w for w in big if w[1] > 1000])
    print(f"bandwidth downstream: {measured:.0f} B/s on the wire over {span:.2f} s (target {rate})")
    assert span >= 4.5, f"1.8 MB at {rate} B/s takes about 5 s, took {span:.2f} s on the wire"
    assert measured == pytest.approx(rate, rel=0.10), f"{measured:.0f} B/s on the wire over {span:.1f} s"
    assert elapsed >= span
    assert proxy.call(lambda: proxy.server.stats.faults.wire_bytes[("slow-link", "bandwidth", "downstream")]) \
        >= 1_800_000


@pytest.mark.pure_only  # Wire patches connection's writer: compiled callers never look it up
def test_bandwidth_upstream_paces_a_producer_to_its_rate(tansu: Broker, with_rules: Any, wire: Wire) -> None:
    topic = unique("toxic-bw-up")
    rate = 300_000
    proxy = with_rules(f"""
rules:
  - id: slow-uplink
    match: {{api: produce, topic: "{topic}"}}
    actions:
      - bandwidth: {{bytes_per_second: {rate}, direction: upstream}}
""")
    create_topic(proxy.bootstrap, topic, 1)
    sent = payloads(160, 10_000)
    started = time.monotonic()
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 5, "acks": "all"})
    for key, value in sent:
        producer.produce(topic, key=key, value=value)
        producer.poll(0)
    assert producer.flush(60) == 0
    writes = [(t, n) for t, n in wire.to(upstream=True) if t >= started and n > 1000]
    measured, span = paced_rate(writes)
    print(f"bandwidth upstream: {measured:.0f} B/s on the wire over {span:.2f} s (target {rate})")
    assert span >= 4.5
    assert measured == pytest.approx(rate, rel=0.10), f"{measured:.0f} B/s on the wire over {span:.1f} s"
    same_records(consume_confluent(tansu.bootstrap, topic, 1, len(sent)), sent)


# -- slicer ------------------------------------------------------------------------------------------
SLICER = """
rules:
  - id: crumbs
    match: {}
    actions:
      - slicer: {average_bytes: 4, size_variation: 3, delay_us: 20, direction: both}
"""


@pytest.mark.pure_only  # Wire patches connection's writer: compiled callers never look it up
def test_librdkafka_works_through_1_to_7_byte_slices(with_rules: Any, wire: Wire) -> None:
    proxy = with_rules(SLICER)
    topic = unique("toxic-slices")
    create_topic(proxy.bootstrap, topic, 1)
    started = time.monotonic()
    sent = payloads(40, 100)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 5, "acks": "all"})
    for key, value in sent:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(60) == 0
    same_records(consume_confluent(proxy.bootstrap, topic, 1, len(sent), timeout=60), sent)
    sizes = [n for t, n, _ in wire.writes if t >= started]
    assert len(sizes) > 2000
    assert set(sizes) == set(range(1, 8)), "every write is a slice of 1 to 7 bytes, each size drawn"
    counted = proxy.call(lambda: dict(proxy.server.stats.faults.wire_bytes))
    assert counted[("crumbs", "slicer", "upstream")] > 0 and counted[("crumbs", "slicer", "downstream")] > 0


@pytest.mark.pure_only  # Wire patches connection's writer: compiled callers never look it up
def test_kafka_python_works_through_1_to_7_byte_slices(with_rules: Any, wire: Wire) -> None:
    proxy = with_rules(SLICER)
    topic = unique("toxic-slices-kp")
    create_topic(proxy.bootstrap, topic, 1)
    started = time.monotonic()
    sent = payloads(40, 100)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all", request_timeout_ms=30000)
    for key, value in sent:
        producer.send(topic, key=key, value=value)
    producer.flush(60)
    producer.close()
    same_records(consume_kafka_python(proxy.bootstrap, topic, 1, len(sent), timeout=60), sent)
    sizes = [n for t, n, _ in wire.writes if t >= started]
    assert len(sizes) > 2000 and set(sizes) == set(range(1, 8))


def test_librdkafka_over_tls_works_through_slices(tansu: Broker, tmp_path: Path) -> None:
    """Over TLS each slice is a TLS record of its own: the client reassembles records, then frames."""
    pki = server_pki(tmp_path)
    path = tmp_path / "rules.yaml"
    path.write_text(SLICER)
    tls = {"security.protocol": "SSL", "ssl.ca.location": str(pki["ca"]),
           "ssl.endpoint.identification.algorithm": "none"}
    with running_proxy(tansu.bootstrap, rules=str(path), tls__client__cert=str(pki["cert"]),
                       tls__client__key=str(pki["key"])) as proxy:
        topic = unique("toxic-slices-tls")
        create_topic(tansu.bootstrap, topic, 1)
        sent = payloads(20, 100)
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", **tls})
        for key, value in sent:
            producer.produce(topic, key=key, value=value)
        assert producer.flush(60) == 0
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("tls"), **tls})
        got: list[tuple[bytes, bytes]] = []
        try:
            consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            deadline = time.monotonic() + 60
            while len(got) < len(sent) and time.monotonic() < deadline:
                got += [(m.key(), m.value()) for m in consumer.consume(num_messages=100, timeout=0.5)
                        if m.error() is None]
        finally:
            consumer.close()
        same_records(got, sent)
        assert proxy.call(lambda: proxy.server.stats.faults.wire_bytes[("crumbs", "slicer", "downstream")]) > 0


# -- limit_data --------------------------------------------------------------------------------------
def test_limit_data_closes_the_connection_after_exactly_its_bytes_downstream(with_rules: Any) -> None:
    proxy = with_rules("""
rules:
  - id: short-pipe
    match: {api: metadata}
    actions:
      - limit_data: {bytes: 1000}
""")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        before = api_versions(sock, 1) + api_versions(sock, 2)  # no metadata yet: nothing counted
        assert before > 0
        # The Metadata request installs the limit: from its answer on, 1000 bytes, then a FIN. The
        # requests go in one write: written one by one, the later ones could meet the closed connection.
        sock.sendall(b"".join(request_frame(METADATA, 9, cid, topics=None, allow_auto_topic_creation=False)
                              for cid in range(3, 40)))
        got = read_to_eof(sock)
    assert len(got) == 1000
    assert proxy.call(lambda: proxy.server.stats.faults.connection_faults[("short-pipe", "limit_data")]) == 1


@pytest.mark.pure_only  # Wire patches connection's writer: compiled callers never look it up
def test_limit_data_upstream_lets_exactly_its_bytes_reach_the_broker(with_rules: Any, wire: Wire) -> None:
    proxy = with_rules("""
rules:
  - id: short-uplink
    match: {api: api_versions}
    actions:
      - limit_data: {bytes: 100, direction: upstream}
""")
    requests = b"".join(request_frame(API_VERSIONS, 3, cid, client_software_name="raw",
                                      client_software_version="1") for cid in range(1, 6))
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(requests)  # one chunk: its first 100 bytes go up, then the connection ends
        assert read_to_eof(sock) == b"", "cut before the broker's first answer came back"
    up = wire.to(upstream=True)
    assert sum(n for _, n in up) == 100, up
    assert len(requests) > 100


def test_a_consumer_cut_by_limit_data_recovers_on_new_connections(tansu: Broker, with_rules: Any) -> None:
    topic = unique("toxic-limit")
    create_topic(tansu.bootstrap, topic, 1)
    sent = payloads(300, 2000)
    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 5, "batch.size": 20_000})
    for key, value in sent:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0
    proxy = with_rules(f"""
rules:
  - id: cut-fetches
    match: {{api: fetch, topic: "{topic}"}}
    actions:
      - limit_data: {{bytes: 150000}}
""")
    # Answers of about 40 kB: a few fit in a connection's 150 kB, the next one is cut short.
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("cut"), "enable.auto.commit": False,
                         "max.partition.fetch.bytes": 40_000, "fetch.max.bytes": 40_000,
                         "message.max.bytes": 40_000, "reconnect.backoff.ms": 50})
    got: list[tuple[bytes, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 60
        while len(got) < len(sent) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                if msg.error() is None:
                    got.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    assert len(got) == len(sent) and set(got) == set(sent), f"{len(got)} of {len(sent)} records read"
    cuts = proxy.call(lambda: proxy.server.stats.faults.connection_faults[("cut-fetches", "limit_data")])
    assert cuts >= 3, "600 kB through 150 kB connections: several cuts, each recovered from"


# -- delay at: wire ----------------------------------------------------------------------------------
def test_delay_at_wire_delays_every_chunk_each_way_without_serialising_them(with_rules: Any) -> None:
    proxy = with_rules("""
rules:
  - id: far-away
    match: {}
    actions:
      - delay: {ms: 150, at: wire, direction: both}
""")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        trips = []
        for cid in range(1, 4):
            started = time.monotonic()
            api_versions(sock, cid)
            trips.append(time.monotonic() - started)
        assert min(trips) >= 0.29, f"150 ms up and 150 ms down: {trips}"
        # Five requests in five chunks 30 ms apart: each is delayed 150 ms each way, not behind the others.
        started = time.monotonic()
        for cid in range(10, 15):
            sock.sendall(request_frame(API_VERSIONS, 3, cid, client_software_name="raw",
                                       client_software_version="1"))
            time.sleep(0.03)
        arrivals = []
        for cid in range(10, 15):
            (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
            assert struct.unpack_from(">i", _recv_exactly(sock, size))[0] == cid
            arrivals.append(time.monotonic() - started)
    print(f"delay at wire: round trips {[round(t * 1000) for t in trips]} ms; pipelined arrivals "
          f"{[round(t * 1000) for t in arrivals]} ms")
    assert arrivals[0] >= 0.29
    assert arrivals[-1] < 0.30 + 4 * 0.03 + 0.25, f"chunks were held one behind the other: {arrivals}"


def test_a_client_gone_while_a_toxic_writes_to_it_ends_its_connection_only(
        with_rules: Any, caplog: pytest.LogCaptureFixture) -> None:
    proxy = with_rules("""
rules:
  - id: trickle
    match: {api: api_versions}
    actions:
      - bandwidth: {bytes_per_second: 50}
""")
    with caplog.at_level(logging.INFO, "kproxy.connection"):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        sock.sendall(request_frame(API_VERSIONS, 3, 1, client_software_name="raw", client_software_version="1"))
        sock.recv(1)  # the first byte of a slow answer
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset: kproxy's next paced write fails
        deadline = time.monotonic() + 10
        while not any("event=connection_closed" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the connection was not closed"
            time.sleep(0.05)
    closed = next(r.getMessage() for r in caplog.records if "event=connection_closed" in r.getMessage())
    assert "stream error" in closed
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as other:
        other.sendall(request_frame(METADATA, 9, 1, topics=None, allow_auto_topic_creation=False))
        (size,) = struct.unpack(">i", _recv_exactly(other, 4))
        assert size > 0


# -- lifetime ----------------------------------------------------------------------------------------
WIRE_DELAY = """
rules:
  - id: lag
    match: {api: metadata}
    DRY
    actions:
      - delay: {ms: 300, at: wire}
"""


def test_a_toxic_starts_at_the_first_matching_request_and_ends_with_its_rule(with_rules: Any) -> None:
    proxy = with_rules(WIRE_DELAY.replace("DRY", ""))
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        started = time.monotonic()
        api_versions(sock, 1)
        assert time.monotonic() - started < 0.25, "no metadata request yet: nothing installed"
        sock.sendall(request_frame(METADATA, 9, 2, topics=None, allow_auto_topic_creation=False))
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        _recv_exactly(sock, size)
        started = time.monotonic()
        api_versions(sock, 3)
        assert time.monotonic() - started >= 0.29, "installed: every later chunk on the connection is delayed"
        # The rule goes (a reload): the toxic ends at the connection's next chunk.
        proxy.call(lambda: proxy.server.rules.replace(load_text("rules: []"), origin="test"))
        api_versions(sock, 4)
        started = time.monotonic()
        api_versions(sock, 5)
        assert time.monotonic() - started < 0.25, "the rule is gone: so is its toxic"


def test_a_toxic_ends_with_its_rule_s_time_window(with_rules: Any) -> None:
    proxy = with_rules("""
rules:
  - id: lag-for-a-while
    match: {schedule: {for_seconds: 1.5}}
    actions:
      - delay: {ms: 300, at: wire}
""")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        started = time.monotonic()
        api_versions(sock, 1)
        assert time.monotonic() - started >= 0.29
        time.sleep(max(0.0, 1.6 - (time.monotonic() - started)))
        api_versions(sock, 2)  # the window is over: this chunk finds the toxic no longer in force
        started = time.monotonic()
        api_versions(sock, 3)
        assert time.monotonic() - started < 0.25


def test_a_dry_run_toxic_counts_its_hits_and_installs_nothing(with_rules: Any,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    proxy = with_rules(WIRE_DELAY.replace("DRY", "dry_run: true"))
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(request_frame(METADATA, 9, 1, topics=None, allow_auto_topic_creation=False))
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        _recv_exactly(sock, size)
        started = time.monotonic()
        api_versions(sock, 2)
        assert time.monotonic() - started < 0.25
    assert hits(proxy, "lag") == {("lag", "delay", "true"): 1}


def test_kproxy_rules_check_accepts_the_toxics_and_names_a_bad_key(tmp_path: Path) -> None:
    good = tmp_path / "toxics.yaml"
    good.write_text("""rules:
  - id: all-of-them
    match: {api: fetch}
    actions:
      - bandwidth: {bytes_per_second: 262144, direction: both}
      - slicer: {average_bytes: 4, size_variation: 3, delay_us: 100}
      - limit_data: {bytes: 1048576, direction: upstream}
      - delay: {ms: 20, jitter_ms: 5, at: wire, direction: downstream}
""")
    checked = kproxy_cli("rules", "check", str(good))
    assert checked.returncode == 0, checked.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("bytes_per_second", "bytes_per_sec"))
    checked = kproxy_cli("rules", "check", str(bad))
    assert checked.returncode != 0
    assert f"{bad}:5: rules[0].actions[0].bandwidth.bytes_per_sec: unknown key (did you mean 'bytes_per_second'?)" \
        in checked.stderr + checked.stdout


logging.getLogger("kafka").setLevel(logging.WARNING)
