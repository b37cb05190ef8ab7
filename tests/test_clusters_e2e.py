"""Two clusters behind one kproxy: two Tansu brokers, librdkafka and kafka-python through both.

Each cluster has its own listeners; both brokers have the same node id, so nothing but the cluster
tells their routes apart. Every address a client learns through one cluster's listeners is one of
that cluster's listeners, never the other's; a rule scoped to one cluster leaves the other's
requests alone; the per-cluster metrics count what each cluster's clients did; log lines name the
cluster.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import trio
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaProducer
from kafka.errors import TopicAuthorizationFailedError
from prometheus_client.parser import text_string_to_metric_families

from kproxy.config import build_config
from kproxy.logfmt import LogfmtFormatter
from kproxy.server.proxy_server import ProxyServer
from kproxy.testing import Broker, ProxyThread, free_port, run_tansu, running_server
from tests.support.e2e import (
    TANSU_NODE_ID,
    consume_confluent,
    consume_kafka_python,
    create_topic,
    produce_confluent,
    unique,
)

RECORDS = 30
RULES = """\
rules:
  - id: payments-blocked
    match: {api: produce, cluster: payments, topic: "blocked-*"}
    actions: [{inject_error: {error: TOPIC_AUTHORIZATION_FAILED}}]
"""


@pytest.fixture(scope="module")
def second_broker() -> Iterator[Broker]:
    """The second cluster's broker (the session's ``tansu`` is the first's)."""
    with run_tansu() as broker:
        yield broker


class _Lines(logging.Handler):
    """kproxy's log lines as ``kproxy run`` writes them (formatted as they are logged, in their task)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(LogfmtFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def two_clusters(tansu: Broker, second_broker: Broker, tmp_path: Path) -> Iterator[tuple[ProxyThread, int, _Lines]]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    metrics_port = free_port()
    raw: dict[str, tuple[Any, str]] = {
        "clusters.orders.upstream": (tansu.bootstrap, "test"),
        "clusters.orders.listen": ("127.0.0.1:0", "test"),
        "clusters.orders.broker_port_base": (0, "test"),
        "clusters.payments.upstream": (second_broker.bootstrap, "test"),
        "clusters.payments.listen": ("127.0.0.1:0", "test"),
        "clusters.payments.broker_port_base": (0, "test"),
        "metrics_listen": (f"127.0.0.1:{metrics_port}", "test"),
        "metrics.topic_label": (True, "test"),
        "limits.shutdown_grace": (5, "test"),
        "rules": (str(rules), "test"),
        "capture.dir": (str(tmp_path / "capture"), "test"),
    }
    lines = _Lines()
    kproxy_log = logging.getLogger("kproxy")
    kproxy_log.addHandler(lines)
    level = kproxy_log.level
    kproxy_log.setLevel(logging.INFO)
    try:
        with ProxyThread(build_config(raw)) as proxy:
            yield proxy, metrics_port, lines
    finally:
        kproxy_log.removeHandler(lines)
        kproxy_log.setLevel(level)


def _servers(proxy: ProxyThread) -> dict[str, ProxyServer]:
    assert proxy.server is not None
    return {server.cluster: server for server in (proxy.server, *proxy.server.siblings)}


def _listeners(proxy: ProxyThread, server: ProxyServer) -> set[int]:
    return set(proxy.call(lambda: list(server.listeners)))


def _advertised(bootstrap: str) -> set[tuple[str, int]]:
    """The brokers a Metadata answer through ``bootstrap`` names."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15)
    return {(broker.host, broker.port) for broker in metadata.brokers.values()}


def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_two_clusters_through_one_kproxy(two_clusters: tuple[ProxyThread, int, _Lines]) -> None:
    proxy, metrics_port, lines = two_clusters
    servers = _servers(proxy)
    assert set(servers) == {"orders", "payments"}
    boot = {name: f"127.0.0.1:{server.bootstrap_port}" for name, server in servers.items()}

    # Each cluster's clients learn that cluster's kproxy listeners only: the brokers share a node id.
    for name, server in servers.items():
        advertised = _advertised(boot[name])
        assert {host for host, _ in advertised} == {"127.0.0.1"}
        ports = {port for _, port in advertised}
        assert ports <= _listeners(proxy, server)
        for other_name, other in servers.items():
            if other is not server:
                assert not ports & _listeners(proxy, other), f"{other_name}'s listener advertised to {name}"
        assert set(proxy.call(lambda s=server: list(s.addresses.routes))) == {TANSU_NODE_ID}

    # librdkafka produces to each cluster, kafka-python and librdkafka read each back; a topic of one
    # cluster is not created in the other.
    topics = {name: unique(f"clusters-{name}") for name in servers}
    for name, topic in topics.items():
        create_topic(boot[name], topic, partitions=2)
        messages = [(f"k{i}".encode(), f"{name}-{i}".encode()) for i in range(RECORDS)]
        produce_confluent(boot[name], topic, messages).flush(10)
        assert sorted(consume_kafka_python(boot[name], topic, 2, RECORDS)) == sorted(messages)
        assert sorted(consume_confluent(boot[name], topic, 2, RECORDS)) == sorted(messages)
    # kafka-python produces to each cluster too, librdkafka reads it back.
    by_kafka_python = {name: unique(f"clusters-kp-{name}") for name in servers}
    for name, topic in by_kafka_python.items():
        create_topic(boot[name], topic, partitions=1)
        messages = [(f"k{i}".encode(), f"kp-{name}-{i}".encode()) for i in range(RECORDS)]
        producer = KafkaProducer(bootstrap_servers=boot[name], request_timeout_ms=10000)
        try:
            for key, value in messages:
                producer.send(topic, key=key, value=value)
            producer.flush(timeout=20)
        finally:
            producer.close(timeout=5)
        assert sorted(consume_confluent(boot[name], topic, 1, RECORDS)) == sorted(messages)
    for name, topic in (*topics.items(), *by_kafka_python.items()):
        other = next(n for n in servers if n != name)
        listed = AdminClient({"bootstrap.servers": boot[other]}).list_topics(timeout=15).topics
        assert topic not in listed

    # The rule is for payments: the same topic name produces through orders and is refused through payments.
    blocked = unique("blocked")
    for name in servers:
        create_topic(boot[name], blocked, partitions=1)
    produce_confluent(boot["orders"], blocked, [(None, b"fine")]).flush(10)
    producer = KafkaProducer(bootstrap_servers=boot["payments"], retries=0, request_timeout_ms=10000)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send(blocked, b"refused").get(timeout=20)
    finally:
        producer.close(timeout=5)
    refused = Producer({"bootstrap.servers": boot["payments"], "message.timeout.ms": 10000})
    errors: list[Any] = []
    refused.produce(blocked, value=b"refused", on_delivery=lambda err, _msg: errors.append(err))
    refused.flush(15)
    assert [err.code() if err is not None else None for err in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]

    # Per-cluster metrics: each cluster's records by topic are what its clients produced and fetched.
    metrics = _metrics(metrics_port)
    for name, topic in topics.items():
        produced = metrics[("kproxy_topic_records_total", (("cluster", name), ("direction", "produce"),
                                                           ("topic", topic)))]
        assert produced == RECORDS
        fetched = metrics[("kproxy_topic_records_total", (("cluster", name), ("direction", "fetch"),
                                                          ("topic", topic)))]
        assert fetched >= 2 * RECORDS  # two readers (a client may fetch a batch twice)
        other = next(n for n in servers if n != name)
        assert ("kproxy_topic_records_total", (("cluster", other), ("direction", "produce"),
                                               ("topic", topic))) not in metrics
    for name, topic in by_kafka_python.items():
        assert metrics[("kproxy_topic_records_total", (("cluster", name), ("direction", "produce"),
                                                       ("topic", topic)))] == RECORDS
    assert metrics[("kproxy_topic_records_total", (("cluster", "orders"), ("direction", "produce"),
                                                   ("topic", blocked)))] == 1
    # The process's series carry no cluster: the rules are shared.
    assert metrics[("kproxy_rule_hits_total", (("action", "inject_error"), ("dry_run", "false"),
                                               ("rule", "payments-blocked")))] >= 2

    # Log lines name the cluster they are about.
    opened = [line for line in lines.lines if "event=connection_opened" in line]
    assert any(" cluster=orders " in line for line in opened)
    assert any(" cluster=payments " in line for line in opened)
    assert all(" cluster=" in line for line in opened)
    # The process's own lines name none: the metrics endpoint serves every cluster.
    (metrics_line,) = [line for line in lines.lines if "event=metrics_listening" in line]
    assert " cluster=" not in metrics_line

    # The capture: every record names its cluster; each cluster's topic is in its own cluster's records.
    proxy.stop()  # (completes the capture's files)
    assert proxy.server is not None and proxy.server.config.capture.dir is not None
    rows = [row for path in sorted(proxy.server.config.capture.dir.glob("hour=*/capture-*.parquet"))
            for row in pq.read_table(path).to_pylist()]
    assert {row["cluster"] for row in rows} == {"orders", "payments"}
    for name, topic in topics.items():
        named = {row["cluster"] for row in rows if any(p["topic"] == topic for p in row["partitions"])}
        assert named == {name}


async def test_ready_when_every_clusters_upstream_is(tansu: Broker) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    raw: dict[str, tuple[Any, str]] = {"limits.shutdown_grace": (1, "test")}
    for name, upstream in (("up", tansu.bootstrap), ("down", dead)):
        raw |= {f"clusters.{name}.upstream": (upstream, "test"), f"clusters.{name}.listen": ("127.0.0.1:0", "test"),
                f"clusters.{name}.broker_port_base": (0, "test")}
    async with running_server(build_config(raw)) as server:
        assert [s.cluster for s in (server, *server.siblings)] == ["up", "down"]
        with trio.fail_after(20):
            for each in (server, *server.siblings):
                await each.health.checked.wait()
        reason = await server.readiness()
        assert reason is not None and reason.startswith(f"cluster down: upstream unavailable: {dead}: ")
        assert "cluster up" not in reason
        assert await server.siblings[0].readiness() == reason.removeprefix("cluster down: ")


async def test_ready_when_any_clusters_upstream_is_if_so_configured(tansu: Broker) -> None:
    raw: dict[str, tuple[Any, str]] = {"limits.shutdown_grace": (1, "test"), "ready_clusters": ("any", "test")}
    for name, upstream in (("up", tansu.bootstrap), ("down", f"127.0.0.1:{free_port()}")):
        raw |= {f"clusters.{name}.upstream": (upstream, "test"), f"clusters.{name}.listen": ("127.0.0.1:0", "test"),
                f"clusters.{name}.broker_port_base": (0, "test")}
    async with running_server(build_config(raw)) as server:
        with trio.fail_after(20):
            for each in (server, *server.siblings):
                await each.health.checked.wait()
        assert await server.readiness() is None
        assert await server.siblings[0].readiness() is not None  # (the one down is down)
