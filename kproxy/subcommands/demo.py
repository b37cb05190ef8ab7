"""``kproxy demo``: the main job on a machine with no Kafka.

Starts the embedded Tansu broker (or uses ``--upstream``), puts kproxy in front
of it, drives real librdkafka producers and consumers through kproxy, and
prints what kproxy saw: the addresses the clients were given, and per-API
traffic, latency and error counts from kproxy's own metrics. Then, unless told not to,
fault-injection rules at work and what the clients saw of them
(:mod:`kproxy.subcommands.demo_rules`).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from kproxy.metrics.histogram import Histogram
from kproxy.metrics.stats import TrafficStats
from kproxy.protocol.tables import error_class, error_code
from kproxy.testing import Broker, ProxyThread, proxy_config, run_tansu

MESSAGES = 1000
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


@dataclass
class DemoResult:
    produced: int
    consumed: int
    advertised: dict[int, tuple[str, int]]
    upstream: str
    missing_topic_error: str | None


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


def drive_traffic(bootstrap: str, messages: int = MESSAGES) -> tuple[int, int, dict[int, tuple[str, int]], str | None]:
    """Create a topic, produce with every codec, consume it back with a group. Real librdkafka."""
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"kproxy-demo-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(15)
    metadata = admin.list_topics(timeout=15)
    advertised = {b.id: (str(b.host), int(b.port)) for b in metadata.brokers.values()}
    produced = 0
    per_codec = messages // len(CODECS)
    for codec in CODECS:
        producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "acks": "all",
                             "linger.ms": 5})
        for i in range(per_codec):
            producer.produce(topic, key=f"{codec}-{i}".encode(), value=f"message {i} ({codec})".encode())
            producer.poll(0)
        if producer.flush(30) != 0:
            raise RuntimeError(f"producer ({codec}) could not deliver within 30 s")
        produced += per_codec
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-group",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    consumed = 0
    deadline = time.monotonic() + 60
    try:
        while consumed < produced and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            consumed += 1
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    # A request the broker refuses: metadata of a topic that does not exist (no auto-create).
    missing_error = None
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-probe",
                      "allow.auto.create.topics": False})
    try:
        md = probe.list_topics(topic=f"{topic}-missing", timeout=10)
        err = md.topics[f"{topic}-missing"].error
        missing_error = str(err.name()) if err is not None else None
    except KafkaException as exc:
        missing_error = str(exc)
    finally:
        probe.close()
    return produced, consumed, advertised, missing_error


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
        with ProxyThread(proxy_config(bootstrap, **proxy_options)) as proxy:
            assert proxy.server is not None
            _wait_warm(proxy)
            produced, consumed, advertised, missing = drive_traffic(proxy.bootstrap, messages)
            result = DemoResult(produced, consumed, advertised, bootstrap, missing)
            report(proxy.server.stats, result, proxy.port, out)
        ok = consumed == produced
        if rules:
            from kproxy.subcommands.demo_rules import run_rules_demo

            ok = run_rules_demo(bootstrap, out, messages, wait_warm=_wait_warm, **proxy_options).ok and ok
    return 0 if ok else 1
