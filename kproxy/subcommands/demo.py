"""``kproxy demo``: the main job on a machine with no Kafka.

Starts the embedded Tansu broker (or uses ``--upstream``), puts kproxy in front
of it, drives real librdkafka producers and consumers through kproxy, and
prints what kproxy saw: the addresses the clients were given, and per-API
traffic, latency and error counts from kproxy's own metrics, and the traffic by topic, client,
producer and consumer group that its /metrics exports (:mod:`kproxy.subcommands.demo_traffic`).
Then, unless told not to,
fault-injection rules at work and what the clients saw of them
(:mod:`kproxy.subcommands.demo_rules`).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from kproxy.metrics.fixed_histogram import Histogram
from kproxy.metrics.stats import TrafficStats
from kproxy.protocol.codes import error_class, error_code
from kproxy.subcommands.demo_traffic import TRAFFIC_OPTIONS, LagTruth, parse, scrape
from kproxy.subcommands.demo_traffic import report as report_traffic
from kproxy.testing import Broker, ProxyThread, proxy_config, run_tansu
from kproxy.testing.tansu import free_port

MESSAGES = 1000
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


@dataclass
class DemoResult:
    produced: int
    consumed: int
    advertised: dict[int, tuple[str, int]]
    upstream: str
    missing_topic_error: str | None
    lag_truth: LagTruth | None = None
    traffic: str | None = None  # kproxy's /metrics text, scraped while the stopped group was connected


def _quantile(hist: Histogram, q: float) -> float | None:
    total = sum(hist.counts)
    if total == 0:
        return None
    target = q * total
    running = 0
    for bound, count in zip(hist.bounds, hist.counts, strict=False):
        running += count
        if running >= target:
            return bound
    return float("inf")


@contextlib.contextmanager
def _upstream(upstream: str | None) -> Iterator[str]:
    if upstream:
        yield upstream
        return
    broker: Broker
    with run_tansu() as broker:
        yield broker.bootstrap


@dataclass
class Traffic:
    """What :func:`drive_traffic` did, and what ``snapshot`` returned while the stopped group was there."""

    produced: int
    consumed: int
    advertised: dict[int, tuple[str, int]]
    missing_topic_error: str | None
    lag_truth: LagTruth
    snapshot: str


def drive_traffic(bootstrap: str, messages: int = MESSAGES, snapshot: Callable[[], str] = lambda: "") -> Traffic:
    """Create a topic, produce with every codec (a client id per codec), consume it back with a
    group, and read half of it with a second group that commits and stops. ``snapshot`` is called
    while that second group's consumer is still connected (the demo scrapes /metrics there).
    Real librdkafka."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"kproxy-demo-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "kproxy-demo-admin"})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(15)
    metadata = admin.list_topics(timeout=15)
    advertised = {b.id: (str(b.host), int(b.port)) for b in metadata.brokers.values()}
    produced = 0
    per_partition = [0, 0, 0]  # records acknowledged per partition: what a group's lag is measured against
    created: dict[tuple[int, int], int] = {}  # (partition, offset) -> CreateTime (ms), from the delivery reports

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            per_partition[msg.partition()] += 1
            created[(msg.partition(), msg.offset())] = msg.timestamp()[1]

    per_codec = messages // len(CODECS)
    for codec in CODECS:
        producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "acks": "all",
                             "linger.ms": 5, "client.id": f"kproxy-demo-producer-{codec}"})
        for i in range(per_codec):
            producer.produce(topic, key=f"{codec}-{i}".encode(), value=f"message {i} ({codec})".encode(),
                             on_delivery=delivered)
            producer.poll(0)
        if producer.flush(30) != 0:
            raise RuntimeError(f"producer ({codec}) could not deliver within 30 s")
        produced += per_codec
    consumed = _consume(Consumer, bootstrap, topic, f"{topic}-group", "kproxy-demo-consumer", produced)
    # A request the broker refuses: metadata of a topic that does not exist (no auto-create).
    missing_error = None
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-probe",
                      "allow.auto.create.topics": False, "client.id": "kproxy-demo-probe"})
    try:
        md = probe.list_topics(topic=f"{topic}-missing", timeout=10)
        err = md.topics[f"{topic}-missing"].error
        missing_error = str(err.name()) if err is not None else None
    except KafkaException as exc:
        missing_error = str(exc)
    finally:
        probe.close()
    # A group that reads half the topic, commits, and stops: its lag is the other half.
    group = f"{topic}-stopped"
    stopped = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "kproxy-demo-stopped",
                        "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        stopped.subscribe([topic])
        _read(stopped, produced // 2)
        stopped.commit(asynchronous=False)
        commits = stopped.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
        # A partition the group never committed has no lag kproxy can know (it depends on the
        # client's auto.offset.reset): the truth covers the partitions with a commit.
        with_commit = [tp for tp in commits if tp.offset >= 0]
        oldest = [created[(tp.partition, tp.offset)] for tp in with_commit if (tp.partition, tp.offset) in created]
        scraped_at = time.time()
        text = snapshot()
        truth = LagTruth(group=group, topic=topic, partitions=len(with_commit),
                         produced=sum(per_partition[tp.partition] for tp in with_commit),
                         committed=sum(tp.offset for tp in with_commit),
                         behind_seconds=scraped_at - min(oldest) / 1000 if oldest else None)
    finally:
        stopped.close()
    return Traffic(produced, consumed, advertised, missing_error, truth, text)


def _consume(consumer_type: Any, bootstrap: str, topic: str, group: str, client_id: str, produced: int) -> int:
    consumer = consumer_type({"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
                              "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    try:
        consumed = _read(consumer, produced)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return consumed


def _read(consumer: Any, count: int, timeout: float = 60) -> int:
    """Poll until ``count`` records came (or ``timeout`` seconds passed); the records read."""
    read = 0
    deadline = time.monotonic() + timeout
    while read < count and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None or msg.error():
            continue
        read += 1
    return read


def report(stats: TrafficStats, result: DemoResult, proxy_port: int, out: TextIO) -> None:
    w = out.write
    w("\nkproxy demo\n===========\n")
    w(f"upstream broker (real):     {result.upstream}\n")
    w(f"kproxy bootstrap:           127.0.0.1:{proxy_port}\n")
    w("brokers the clients were told about (all kproxy listeners):\n")
    for node, (host, port) in sorted(result.advertised.items()):
        w(f"  node {node}: {host}:{port}\n")
    w(f"messages produced: {result.produced}, consumed back: {result.consumed} "
      f"({'all' if result.consumed == result.produced else 'MISSING SOME'})\n")
    w(f"metadata for a missing topic returned (librdkafka's name for it): {result.missing_topic_error}\n\n")
    w(f"{'api':<28}{'requests':>9}{'broker p50':>12}{'broker p99':>12}{'kproxy p99':>12}{'bytes in':>11}"
      f"{'bytes out':>11}\n")
    totals = stats.totals()  # every broker's together
    by_api: dict[str, int] = {}
    for (api, _v), n in totals.requests.items():
        by_api[api] = by_api.get(api, 0) + n
    for api, n in sorted(by_api.items(), key=lambda kv: -kv[1]):
        broker = totals.broker_latency.get(api)
        own = stats.overhead.get(api)
        w(f"{api:<28}{n:>9}{_ms(broker, 0.5):>12}{_ms(broker, 0.99):>12}{_ms(own, 0.99):>12}"
          f"{stats.byte_counts.get((api, 'request'), 0):>11}{stats.byte_counts.get((api, 'response'), 0):>11}\n")
    w("\nerror codes kproxy found inside responses (routine: normal protocol flow, not a failure):\n")
    if not totals.errors:
        w("  none\n")
    for (api, error), n in sorted(totals.errors.items()):
        code = error_code(error)
        w(f"  {api}: {error} x{n} ({'error' if code is None else error_class(code)})\n")
    records = ", ".join(f"{api} {n}" for api, n in sorted(stats.records.items()))
    w(f"records seen: {records or 'none'}\n")
    w("(latencies are histogram bucket bounds, in ms)\n")
    if result.traffic is not None:
        report_traffic(parse(result.traffic), result.lag_truth, out)


def _ms(hist: Histogram | None, q: float) -> str:
    if hist is None:
        return "-"
    value = _quantile(hist, q)
    return "-" if value is None else f"<={value * 1000:g}"


def _wait_warm(proxy: ProxyThread) -> None:
    """As in a real deployment, clients arrive after kproxy has discovered the brokers and
    compiled the codecs they will need; otherwise the first requests pay for compiling."""
    assert proxy.server is not None
    server = proxy.server
    deadline = time.monotonic() + 15
    while not proxy.call(server.warmed.is_set) and time.monotonic() < deadline:
        time.sleep(0.05)


def run_demo(upstream: str | None, out: TextIO, messages: int = MESSAGES, *, rules: bool = True,
             **proxy_options: Any) -> int:
    """The demo; exit status 0 when every message came back (and, with ``rules``, when the rules
    scenario's idempotent producer got every record exactly once)."""
    with _upstream(upstream) as bootstrap:
        with ProxyThread(proxy_config(bootstrap, **{**TRAFFIC_OPTIONS, "metrics_listen": f"127.0.0.1:{free_port()}",
                                                          **proxy_options})) as proxy:
            server = proxy.server
            assert server is not None
            _wait_warm(proxy)

            metrics = server.metrics_server
            assert metrics is not None  # TRAFFIC_OPTIONS listen for /metrics
            traffic = drive_traffic(proxy.bootstrap, messages, lambda: scrape(metrics.port))
            result = DemoResult(traffic.produced, traffic.consumed, traffic.advertised, bootstrap,
                                traffic.missing_topic_error, traffic.lag_truth, traffic.snapshot)
            report(server.stats, result, proxy.port, out)
        ok = traffic.consumed == traffic.produced
        if rules:
            from kproxy.subcommands.demo_rules import run_rules_demo

            ok = run_rules_demo(bootstrap, out, messages, wait_warm=_wait_warm, **proxy_options).ok and ok
    return 0 if ok else 1
