"""kproxy's metrics as an operator sees them: a real Prometheus scrapes a real kproxy.

One Prometheus (the Debian ``prometheus`` binary, see scripts/system-deps) scrapes,
every second, three targets of job ``kproxy``:

* the main kproxy, in front of Tansu, with topic and client-id labels on and a small label cap;
* a kproxy whose upstream is a dead port (upstream connect failures, ``/readyz`` 503), with
  upstream TLS files (the certificates' expiry series);
* an address where nothing listens (``up == 0``).

It loads deploy/prometheus/alerts.yml as its rule file. Real clients (confluent-kafka)
produce and consume through the main kproxy; raw requests built with kproxy's own
codec make some counts exact (Produce v3, which librdkafka does not send) and provoke
a broker error: Metadata v9 with auto-creation off for topics that do not exist,
which Tansu answers with UNKNOWN_TOPIC_OR_PARTITION per topic.

Then every PromQL expression of the committed Grafana dashboard and of the alert
rules is run through Prometheus's HTTP API and must return data, and the counters
must match the traffic sent. A raw client that named its software in ApiVersions v3 stays
connected meanwhile (kproxy_client_info counts open connections). The consumer commits its
offsets, so that kproxy has consumer-lag series for the Consumer lag row and its alert.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import shutil
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kproxy.protocol import MessageType, default_body
from kproxy.protocol.codes import error_code
from kproxy.protocol.records import Record, encode_batch_v2
from kproxy.testing import Broker, ProxyThread, free_port, running_proxy, stop_process
from tests.support.e2e import TANSU_NODE_ID
from tests.support.pki import server_pki
from tests.support.rawkafka import RawKafka

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "kproxy-dashboard.json"
GENERATOR = ROOT / "deploy" / "grafana" / "dashboard.py"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
PROM_CONFIGS = [ROOT / "deploy" / "prometheus" / "prometheus.yml",
                ROOT / "deploy" / "prometheus" / "prometheus-kubernetes.yml"]

LABEL_CAP = 4
RAW_PRODUCES = 6          # Produce v3 requests sent over a raw socket
RECORDS_PER_PRODUCE = 4
CLIENT_MESSAGES = 25      # produced with confluent-kafka
MISSING_TOPICS = 30       # topics named in one Metadata request; none exists
UNKNOWN_TOPIC = "UNKNOWN_TOPIC_OR_PARTITION"
RAW_CLIENT, RAW_SOFTWARE = "kproxy-metrics-test", ("kproxy-tests", "1.0.0")
# The consumer-lag series: the dashboard's Consumer lag and Lag (seconds) rows, KproxyConsumerLagGrowing,
# KproxyConsumerGroupStalled and KproxyConsumerLagSecondsGrowing read them.
CONSUMER_LAG = ("kproxy_consumergroup_lag_sum", "kproxy_consumergroup_committed_offset",
                "kproxy_partition_high_watermark", "kproxy_consumergroup_lag_seconds",
                "kproxy_consumergroup_catchup_seconds")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: run scripts/system-deps (installs the Debian package 'prometheus')")
    return path


def wait_until(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.25) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


# -- HTTP ---------------------------------------------------------------------------------
def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class PromAPI:
    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}" if params else f"{self.base}{path}"
        status, body = http_get(url)
        payload = json.loads(body)
        assert payload["status"] == "success", f"{path} {params}: HTTP {status}: {payload}"
        return payload["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: {data['resultType']}"
        return list(data["result"])

    def value(self, expr: str) -> float | None:
        """The single value of a scalar-like query, None while it has no data."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr}: expected one series, got {result}"
        return float(result[0]["value"][1]) if result else None


def closed_by_peer(address: str, payload: bytes) -> bool:
    """Send ``payload`` and report whether the peer closes the connection (within 10 s)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(payload)
        try:
            return sock.recv(1024) == b""
        except ConnectionResetError:
            return True


# -- the stack ------------------------------------------------------------------------------
@dataclass
class Traffic:
    topic: str
    produced_by_client: int = 0
    client_produce_requests: int = 0
    consumed: int = 0
    missing_topics: list[str] = field(default_factory=list)


@dataclass
class Stack:
    proxy: ProxyThread
    dead: ProxyThread
    metrics: str          # host:port of the main kproxy's /metrics
    dead_metrics: str     # host:port of the dead-upstream kproxy's /metrics
    down_target: str      # host:port where nothing listens
    dead_upstream: str
    prom: PromAPI
    traffic: Traffic


@contextlib.contextmanager
def run_prometheus(tmp: Path, targets: list[str], *, rule_files: list[Path] | None = None,
                   scrape_configs: list[dict[str, Any]] | None = None) -> Iterator[PromAPI]:
    """A real Prometheus scraping ``targets`` as job "kproxy" with deploy/prometheus/alerts.yml, every 1 s;
    ``rule_files`` / ``scrape_configs`` replace those defaults."""
    binary = _tool("prometheus")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(f) for f in rule_files or [ALERTS]],
        "scrape_configs": scrape_configs or [{"job_name": "kproxy", "static_configs": [{"targets": targets}]}],
    }
    config_file = tmp / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={config_file}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited with {proc.returncode}: {(tmp / 'prometheus.log').read_text()}")
            with contextlib.suppress(OSError):
                return http_get(f"{base}/-/ready", timeout=1)[0] == 200
            return False

        wait_until("prometheus to be ready", ready, timeout=30)
        yield PromAPI(base)
    finally:
        stop_process(proc)
        log.close()


def produce_v3(client: RawKafka, topic: str, n: int) -> None:
    for i in range(n):
        now = int(time.time() * 1000)
        batch = encode_batch_v2([Record(j, now, f"raw-{i}-{j}".encode(), b"v") for j in range(RECORDS_PER_PRODUCE)])
        body = default_body(0, 3, MessageType.REQUEST)
        body.update(acks=1, timeout_ms=5000,
                    topic_data=[{"name": topic, "partition_data": [{"index": 0, "records": batch}]}])
        response = client.request(0, 3, body)
        codes = [p["error_code"] for t in response["responses"] for p in t["partition_responses"]]
        assert codes == [0], f"raw produce {i} failed: {response}"


def metadata_for_missing(client: RawKafka, topics: list[str]) -> None:
    body = default_body(3, 9, MessageType.REQUEST)
    body.update(topics=[{"name": t} for t in topics], allow_auto_topic_creation=False)
    response = client.request(3, 9, body)
    # What the broker (Tansu) really answers, checked here so the metric assertions stand on it.
    codes = {t["name"]: t["error_code"] for t in response["topics"]}
    assert codes == dict.fromkeys(topics, error_code(UNKNOWN_TOPIC)), codes


def client_anomalies(client: RawKafka, topic: str) -> None:
    """One stale-generation commit (the stack's rule answers it), of a topic already labelled (the
    label cap is the cardinality test's). (The raw client's Produce v3 is of a
    deprecated version: its connection's deprecated_version.)"""
    body = default_body(8, 8, MessageType.REQUEST)
    body.update(group_id=f"metrics-stale-{uuid.uuid4().hex[:8]}", generation_id_or_member_epoch=3, member_id="gone",
                topics=[{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                        "committed_leader_epoch": -1, "committed_metadata": ""}]}])
    response = client.request(8, 8, body)
    codes = [p["error_code"] for t in response["topics"] for p in t["partitions"]]
    assert codes == [error_code("ILLEGAL_GENERATION")], response


def client_traffic(bootstrap: str, topic: str, traffic: Traffic) -> None:
    """confluent-kafka: produce, counting Produce requests from librdkafka's own statistics."""
    stats: list[dict[str, Any]] = []
    delivered: list[bool] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                         "statistics.interval.ms": 100, "stats_cb": lambda s: stats.append(json.loads(s))})
    try:
        for i in range(CLIENT_MESSAGES):
            producer.produce(topic, key=f"k{i}".encode(), value=f"client-{i}".encode(),
                             on_delivery=lambda err, _msg: delivered.append(err is None))
            if i % 5 == 4:
                producer.flush(10)   # several requests, not one big batch
        assert producer.flush(15) == 0
        assert delivered == [True] * CLIENT_MESSAGES
        traffic.produced_by_client = CLIENT_MESSAGES
        # librdkafka's statistics count the requests it sent; wait for a report after the last send.
        before = len(stats)

        def fresh_stats() -> bool:
            producer.poll(0.1)
            return len(stats) > before + 1

        wait_until("librdkafka statistics", fresh_stats, timeout=10)
        brokers = stats[-1]["brokers"].values()
        traffic.client_produce_requests = sum(b.get("req", {}).get("Produce", 0) for b in brokers)
        assert traffic.client_produce_requests >= CLIENT_MESSAGES // 5
    finally:
        producer.close()

    # Assigned, not subscribed: a group join would only add a rebalance delay to the test.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"metrics-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    expected = CLIENT_MESSAGES + RAW_PRODUCES * RECORDS_PER_PRODUCE
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 40
        while traffic.consumed < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                traffic.consumed += 1
        assert traffic.consumed == expected, f"consumed {traffic.consumed} of {expected}"
        consumer.commit(asynchronous=False)  # the group's committed offset: consumer lag's other side
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def stack(tansu: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("prometheus")
    pki = server_pki(tmp)  # the dead-upstream kproxy's TLS files: the certificate expiry series
    metrics, dead_metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    down_target, dead_upstream = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    # Rules that never match (no client has that id): their series exist at zero, for the Faults row
    # and the fault alert, and the traffic the other tests count is untouched.
    rules = tmp / "rules.yaml"
    rules.write_text("rules:\n"
                     "  - id: idle-error\n    match: {api: produce, client_id: never-matches}\n"
                     "    actions: [{inject_error: {error: NOT_LEADER_OR_FOLLOWER}}]\n"
                     "  - id: idle-quota\n    match: {api: fetch, client_id: never-matches}\n"
                     "    actions: [{throttle: {bytes_per_second: 1000}}, drop_response]\n"
                     "  - id: idle-shadow\n    dry_run: true\n    match: {api: fetch, client_id: never-matches}\n"
                     "    actions: [drop_response]\n"
                     # The raw client's one OffsetCommit: a stale generation, for the Client anomalies row.
                     f"  - id: stale-commit\n    match: {{api: offset_commit, client_id: {RAW_CLIENT}}}\n"
                     "    actions: [{inject_error: {error: ILLEGAL_GENERATION}}]\n")
    with running_proxy(tansu.bootstrap, metrics_listen=metrics, metrics__topic_label=True,
                       metrics__client_id_label=True, metrics__label_cap=LABEL_CAP, rules=str(rules)) as proxy, \
            running_proxy(dead_upstream, metrics_listen=dead_metrics, limits__connect_timeout=2,
                          upstream_check_interval=3600, tls__upstream__enabled=True, tls__upstream__ca=str(pki["ca"]),
                          tls__upstream__cert=str(pki["cert"]), tls__upstream__key=str(pki["key"])) as dead, \
            run_prometheus(tmp, [metrics, dead_metrics, down_target]) as prom:
        # Prometheus applies discovered targets a few seconds after it starts: the traffic waits for
        # a first scrape of both kproxies, so their counters are seen from zero.
        for target in (metrics, dead_metrics):
            wait_until(f"a first scrape of {target}", lambda t=target: prom.value(f'up{{instance="{t}"}}') == 1,
                       timeout=30)
        traffic = Traffic(topic=f"metrics-e2e-{uuid.uuid4().hex[:8]}")
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
        admin.create_topics([NewTopic(traffic.topic, 1, 1)])[traffic.topic].result(15)
        del admin   # no close(): dropping the last reference stops its threads

        # Kept open to the end: it says which software it runs (ApiVersions v3, KIP-511).
        raw = RawKafka(proxy.bootstrap, RAW_CLIENT)
        body = default_body(18, 3, MessageType.REQUEST)
        body.update(client_software_name=RAW_SOFTWARE[0], client_software_version=RAW_SOFTWARE[1])
        assert raw.request(18, 3, body)["error_code"] == 0
        produce_v3(raw, traffic.topic, RAW_PRODUCES)
        traffic.missing_topics = [f"missing-{uuid.uuid4().hex[:8]}-{i}" for i in range(MISSING_TOPICS)]
        metadata_for_missing(raw, traffic.missing_topics)
        client_anomalies(raw, traffic.missing_topics[0])
        client_traffic(proxy.bootstrap, traffic.topic, traffic)
        # A frame far over max_frame_size: rejected, connection closed.
        assert closed_by_peer(proxy.bootstrap, struct.pack(">i", 0x7FFFFFF0) + b"\0" * 64)
        # Clients of the dead-upstream kproxy: each refused once its upstream connect fails. Two,
        # with a scrape between them, so that increase() sees the counter move. The upstream check
        # at start-up failed once before them (its next one is an hour away): 3 failures in all.
        assert closed_by_peer(dead.bootstrap, b"")
        failures = f'kproxy_upstream_connect_failures_total{{instance="{dead_metrics}"}}'
        wait_until("the first client's connect failure scraped", lambda: prom.value(failures) == 2, timeout=15)
        assert closed_by_peer(dead.bootstrap, b"")
        try:
            yield Stack(proxy, dead, metrics, dead_metrics, down_target, dead_upstream, prom, traffic)
        finally:
            raw.close()


@pytest.fixture(scope="module")
def scraped(stack: Stack) -> Stack:
    """The stack once Prometheus holds kproxy's final counter values (and a few samples of each)."""
    assert stack.proxy.server is not None
    server = stack.proxy.server
    snapshot = stack.proxy.call(lambda: {(api, version, node): n for node, b in server.stats.brokers.items()
                                         for (api, version), n in b.requests.items()})

    def caught_up() -> bool:
        for (api, version, node), n in snapshot.items():
            got = stack.prom.value(f'kproxy_requests_total{{instance="{stack.metrics}",api="{api}",'
                                   f'version="{version}",node_id="{node}"}}')
            if got != n:
                return False
        return True

    wait_until("Prometheus to scrape kproxy's final counts", caught_up, timeout=20)
    # Connect failures were counted last, by the other kproxy.
    failures = f'kproxy_upstream_connect_failures_total{{instance="{stack.dead_metrics}"}}'
    wait_until("Prometheus to scrape the second connect failure", lambda: stack.prom.value(failures) == 3,
               timeout=15)
    return stack


# -- the committed files -----------------------------------------------------------------------
def _load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("kproxy_dashboard_generator", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_dashboard_is_the_generated_one() -> None:
    assert DASHBOARD.read_text() == _load_generator().render(), (
        "deploy/grafana/kproxy-dashboard.json is stale: run .venv/bin/python deploy/grafana/dashboard.py")


def test_promtool_accepts_rules_and_configs(tmp_path: Path) -> None:
    promtool = _tool("promtool")
    for args in (["check", "rules", str(ALERTS)], ["test", "rules", str(ALERT_TESTS)]):
        done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stdout + done.stderr
    for config in PROM_CONFIGS:
        done = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True,
                              timeout=30)
        if done.returncode != 0 and "field kubernetes_sd_configs not found" in done.stdout + done.stderr:
            # Debian builds Prometheus without Kubernetes discovery: check everything else in the file.
            shutil.copy(ALERTS, tmp_path / ALERTS.name)
            swapped = tmp_path / config.name
            swapped.write_text(re.sub(r"kubernetes_sd_configs:\n(?:\s{6}.*\n)+",
                                      "static_configs:\n      - targets: ['kproxy:9308']\n", config.read_text()))
            done = subprocess.run([promtool, "check", "config", str(swapped)], capture_output=True, text=True,
                                  timeout=30)
        assert done.returncode == 0, f"{config}: {done.stdout}{done.stderr}"


# -- queries -----------------------------------------------------------------------------------
def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) of every query in the committed dashboard, rows' nested panels included."""
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            out.extend((panel["title"], t["expr"]) for t in panel.get("targets", []) if t.get("expr"))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return out


def fill_variables(expr: str, values: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"unknown dashboard variable ${name} in {expr}"
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, expr)


_THRESHOLD = re.compile(r"\s*(?:==|!=|>=|<=|>|<)\s*(?:bool\s+)?-?\d+(?:\.\d+)?(?:e-?\d+)?(?=\s|\)|$)")


def without_thresholds(expr: str) -> str:
    """The alert expression minus its comparisons against numbers: the series it judges."""
    return _THRESHOLD.sub("", expr)


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_dashboard_covers_the_metrics_it_should() -> None:
    exprs = " ".join(e for _, e in dashboard_exprs())
    for metric in ("kproxy_requests_total", "kproxy_broker_latency_seconds_bucket", "kproxy_overhead_seconds_bucket",
                   "kproxy_response_errors_total", "kproxy_bytes_total", "kproxy_client_connections_active",
                   "kproxy_upstream_connections_active", "kproxy_frames_rejected_total", "kproxy_in_flight_requests",
                   "kproxy_rule_hits_total", "kproxy_injected_errors_total", "kproxy_rule_throttle_seconds_total",
                   "kproxy_rule_connection_faults_total", "kproxy_rules_loaded", "kproxy_rule_held_seconds_bucket",
                   "kproxy_topic_bytes_total", "kproxy_topic_records_total", "kproxy_client_bytes_total",
                   "kproxy_client_records_total", "kproxy_client_info", "kproxy_produce_batches_total",
                   "kproxy_produce_batch_bytes_bucket", "kproxy_tls_certificate_expiry_timestamp_seconds",
                   "kproxy_client_anomalies_total", *CONSUMER_LAG):
        assert metric in exprs, f"no dashboard panel queries {metric}"
    assert "histogram_quantile(0.99, sum by (api, le) (rate(kproxy_overhead_seconds_bucket" in exprs
    assert "histogram_quantile(0.5, sum by (api, le) (rate(kproxy_broker_latency_seconds_bucket" in exprs


def test_long_polls_have_a_latency_panel_of_their_own() -> None:
    """Fetch and rebalances wait on purpose: mixed with the rest they would lead every latency graph."""
    by_title: dict[str, list[str]] = {}
    for title, expr in dashboard_exprs():
        by_title.setdefault(title, []).append(expr)
    broker = by_title["Broker latency p50 / p99"]
    polls = by_title["Long polls p50 / p99"]
    assert all('api!~"fetch|share_fetch|join_group|sync_group"' in e for e in broker)
    assert all('api=~"fetch|share_fetch|join_group|sync_group"' in e for e in polls)
    variables = [v["name"] for v in json.loads(DASHBOARD.read_text())["templating"]["list"]]
    assert variables == ["datasource", "job", "namespace", "pod", "instance", "cluster", "api", "node_id", "topic",
                         "client_id", "group"]


def test_the_traffic_rows_are_there_and_rank_by_rate() -> None:
    """Issue 24's rows, each panel a top-k by rate (or a breakdown with few values), filtered by the
    row's variables."""
    dashboard = json.loads(DASHBOARD.read_text())
    titles = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert titles[:7] == ["Overview", "Traffic", "Topics", "Clients", "Consumer lag", "Lag (seconds)", "Producers"]
    rows: dict[str, list[str]] = {}
    row = ""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
        else:
            rows.setdefault(row, []).extend(t["expr"] for t in panel.get("targets", []))
    assert all('topic=~"$topic"' in e for e in rows["Topics"])
    assert all('client_id=~"$client_id"' in e for e in rows["Clients"])
    assert all('group=~"$group"' in e or "high_watermark" in e for e in rows["Consumer lag"])
    assert all('group=~"$group", topic=~"$topic"' in e for e in rows["Lag (seconds)"])
    for name in ("Topics", "Clients", "Consumer lag", "Lag (seconds)", "Producers"):
        assert sum(e.startswith("topk(10,") for e in rows[name]) >= 2, name


def test_every_dashboard_query_returns_data(scraped: Stack) -> None:
    values = {"job": "kproxy", "namespace": ".*", "pod": ".*", "instance": ".*", "cluster": ".*", "api": ".*",
              "node_id": ".*",
              "topic": ".*", "client_id": ".*", "group": ".*", "__rate_interval": "30s", "datasource": ""}
    exprs = dashboard_exprs()
    assert len(exprs) >= 30
    for title, expr in exprs:
        promql = fill_variables(expr, values)
        wait_until(f"data for panel {title!r}: {promql}", lambda q=promql: scraped.prom.query(q), timeout=10)


def test_every_alert_rule_evaluates_and_its_series_exist(scraped: Stack) -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= {"KproxyDown", "KproxyHighKafkaErrorRatio", "KproxyBrokerLatencyHigh",
                                            "KproxyOverheadHigh", "KproxyUpstreamConnectFailures",
                                            "KproxyFramesRejected", "KproxyFaultInjectionActive",
                                            "KproxyConsumerLagGrowing", "KproxyConsumerGroupStalled",
                                            "KproxyConsumerLagSecondsGrowing",
                                            "KproxyUncompressedProduce", "KproxyCertificateExpiresSoon",
                                            "KproxyClientErrors", "KproxyClientMisconfigured"}
    for rule in rules:
        bare = without_thresholds(rule["expr"])
        assert bare != rule["expr"], f"{rule['alert']}: no threshold found in {rule['expr']!r}"
        wait_until(f"data for alert {rule['alert']}: {bare}", lambda q=bare: scraped.prom.query(q), timeout=10)

    def evaluated() -> list[dict[str, Any]] | None:
        loaded = [r for g in scraped.prom.get("/api/v1/rules", type="alert")["groups"] for r in g["rules"]]
        done = all(r.get("lastEvaluation", "").startswith("2") and r["evaluationTime"] > 0 for r in loaded)
        return loaded if loaded and done else None

    loaded = wait_until("Prometheus to evaluate the alert rules", evaluated, timeout=15)
    assert {r["name"] for r in loaded} == {r["alert"] for r in rules}
    for r in loaded:
        assert r["health"] == "ok", f"{r['name']}: {r.get('lastError')}"


def test_alerts_fire_for_what_happened(scraped: Stack) -> None:
    """The real events of the traffic phase trip the matching rules (pending while their 'for' runs)."""
    def states() -> dict[tuple[str, str], str]:
        alerts = scraped.prom.get("/api/v1/alerts")["alerts"]
        return {(a["labels"]["alertname"], a["labels"].get("instance", "")): a["state"] for a in alerts}

    wanted = {("KproxyDown", scraped.down_target), ("KproxyFramesRejected", scraped.metrics),
              ("KproxyUpstreamConnectFailures", scraped.dead_metrics)}
    seen: dict[tuple[str, str], str] = {}

    def all_active() -> bool:
        seen.clear()
        seen.update(states())
        return wanted <= seen.keys()

    wait_until(f"alerts {sorted(wanted)} to be active (active: {seen})", all_active, timeout=15)
    found = seen
    assert found[("KproxyFramesRejected", scraped.metrics)] == "firing"   # no 'for': fires at once
    assert found[("KproxyDown", scraped.down_target)] in ("pending", "firing")
    assert ("KproxyDown", scraped.metrics) not in found
    # The full rule, threshold included, singles out exactly the target that is down.
    down = scraped.prom.query(next(r["expr"] for r in alert_rules() if r["alert"] == "KproxyDown"))
    assert [s["metric"]["instance"] for s in down] == [scraped.down_target]


# -- counters against the traffic sent -------------------------------------------------------------
def test_request_counters_match_the_traffic(scraped: Stack) -> None:
    prom, inst, t = scraped.prom, scraped.metrics, scraped.traffic
    # The raw Produce v3 went through the bootstrap port, the client's Produce to the broker's own.
    assert prom.value(f'kproxy_requests_total{{instance="{inst}",api="produce",version="3"}}') == RAW_PRODUCES
    assert prom.value(f'kproxy_requests_total{{instance="{inst}",api="produce",version="3",'
                      f'node_id="bootstrap"}}') == RAW_PRODUCES
    assert prom.value(f'kproxy_responses_total{{instance="{inst}",api="produce",version="3"}}') == RAW_PRODUCES
    assert (prom.value(f'sum(kproxy_requests_total{{instance="{inst}",api="produce",node_id="{TANSU_NODE_ID}"}})')
            == t.client_produce_requests)
    assert (prom.value(f'sum(kproxy_requests_total{{instance="{inst}",api="produce"}})')
            == RAW_PRODUCES + t.client_produce_requests)
    assert (prom.value(f'kproxy_records_total{{instance="{inst}",api="produce"}}')
            == RAW_PRODUCES * RECORDS_PER_PRODUCE + t.produced_by_client)
    fetched = prom.value(f'kproxy_records_total{{instance="{inst}",api="fetch"}}')
    # Exact: the topic holds only what was produced above, the one consumer reads it once from
    # the beginning, and each Fetch starts after the last batch it got: every record crosses
    # kproxy in exactly one Fetch response.
    assert fetched == t.consumed
    # Every client is gone: nothing in flight (a consumer closing drops its pending long-poll Fetch,
    # so requests may outnumber responses, never the reverse).
    assert prom.value(f'kproxy_in_flight_requests{{instance="{inst}"}}') == 0
    assert (prom.value(f'sum(kproxy_requests_total{{instance="{inst}"}})')  # type: ignore[operator]
            >= prom.value(f'sum(kproxy_responses_total{{instance="{inst}"}})'))
    # Every histogram observed one value per response.
    for node in ("bootstrap", str(TANSU_NODE_ID)):
        assert (prom.value(f'kproxy_broker_latency_seconds_count{{instance="{inst}",api="produce",node_id="{node}"}}')
                == prom.value(f'sum(kproxy_responses_total{{instance="{inst}",api="produce",node_id="{node}"}})'))
    assert prom.value(f'sum(kproxy_bytes_total{{instance="{inst}",direction="request"}})') > 0  # type: ignore[operator]


def test_traffic_series_match_the_traffic(scraped: Stack) -> None:
    """The per-topic, per-client and producer series through Prometheus (tests/test_traffic_e2e.py
    checks their bytes exactly against the broker's batches)."""
    prom, inst, t = scraped.prom, scraped.metrics, scraped.traffic
    raw_records = RAW_PRODUCES * RECORDS_PER_PRODUCE
    assert (prom.value(f'kproxy_topic_records_total{{instance="{inst}",topic="{t.topic}",direction="produce"}}')
            == raw_records + t.produced_by_client)
    assert (prom.value(f'kproxy_topic_records_total{{instance="{inst}",topic="{t.topic}",direction="fetch"}}')
            == t.consumed)
    assert (prom.value(f'kproxy_client_records_total{{instance="{inst}",client_id="{RAW_CLIENT}",'
                       f'direction="produce"}}') == raw_records)
    # Produce v3 of one uncompressed batch each, acks=1.
    assert (prom.value(f'kproxy_produce_batches_total{{instance="{inst}",client_id="{RAW_CLIENT}",'
                       f'compression="none",acks="1"}}') == RAW_PRODUCES)
    batch = len(encode_batch_v2([Record(j, 0, f"raw-0-{j}".encode(), b"v") for j in range(RECORDS_PER_PRODUCE)]))
    assert (prom.value(f'kproxy_client_bytes_total{{instance="{inst}",client_id="{RAW_CLIENT}",'
                       f'direction="produce"}}') == RAW_PRODUCES * batch)
    # The raw client is still connected: one connection, under the software it named.
    assert prom.value(f'kproxy_client_info{{instance="{inst}",client_id="{RAW_CLIENT}",'
                      f'software_name="{RAW_SOFTWARE[0]}",software_version="{RAW_SOFTWARE[1]}"}}') == 1


def test_broker_error_is_counted_by_name(scraped: Stack) -> None:
    prom, inst = scraped.prom, scraped.metrics
    errors = prom.value(f'kproxy_response_errors_total{{instance="{inst}",api="metadata",error="{UNKNOWN_TOPIC}"}}')
    assert errors == MISSING_TOPICS
    # Clean traffic counted no error: every produce partition came back NONE.
    assert prom.query(f'kproxy_response_errors_total{{instance="{inst}",api="produce"}}') == []


def test_topic_label_cardinality_is_capped(scraped: Stack) -> None:
    prom, inst = scraped.prom, scraped.metrics
    series = prom.query(f'kproxy_topic_response_errors_total{{instance="{inst}",api="metadata"}}')
    topics = {s["metric"]["topic"] for s in series}
    assert len(topics) <= LABEL_CAP + 1, topics
    assert "other" in topics
    assert topics - {"other"} <= set(scraped.traffic.missing_topics)
    assert sum(float(s["value"][1]) for s in series) == MISSING_TOPICS


def test_client_anomalies_are_counted_and_alerted(scraped: Stack) -> None:
    prom, inst = scraped.prom, scraped.metrics
    series = {(s["metric"]["kind"], s["metric"]["client_id"]): float(s["value"][1])
              for s in prom.query(f'kproxy_client_anomalies_total{{instance="{inst}"}}')}
    assert series == {("stale_generation", RAW_CLIENT): 1, ("deprecated_version", RAW_CLIENT): 1}

    def firing() -> set[tuple[str, str]]:
        return {(a["labels"]["alertname"], a["labels"]["kind"]) for a in prom.get("/api/v1/alerts")["alerts"]
                if a["labels"].get("client_id") == RAW_CLIENT and a["state"] == "firing"}

    wanted = {("KproxyClientErrors", "stale_generation"), ("KproxyClientMisconfigured", "deprecated_version")}
    wait_until(f"alerts {wanted} to fire", lambda: wanted <= firing(), timeout=15)


def test_failures_are_counted(scraped: Stack) -> None:
    prom = scraped.prom
    assert prom.value(f'kproxy_frames_rejected_total{{instance="{scraped.metrics}",reason="request_oversize"}}') == 1
    assert prom.value(f'kproxy_upstream_connect_failures_total{{instance="{scraped.dead_metrics}",'
                      f'upstream="{scraped.dead_upstream}",node_id="bootstrap"}}') == 3  # start-up check, 2 clients
    assert prom.value(f'up{{instance="{scraped.down_target}"}}') == 0
    assert prom.value(f'up{{instance="{scraped.metrics}"}}') == 1
    assert prom.value(f'kproxy_build_info{{instance="{scraped.metrics}"}}') == 1


BROKER_SCOPED = ("kproxy_requests_total", "kproxy_responses_total", "kproxy_broker_latency_seconds_count",
                 "kproxy_response_errors_total", "kproxy_responses_with_errors_total",
                 "kproxy_client_connections_active", "kproxy_client_connections_accepted_total",
                 "kproxy_client_connections_refused_total", "kproxy_upstream_connections_active",
                 "kproxy_upstream_connect_failures_total", "kproxy_upstream_up")


def test_every_broker_scoped_series_names_its_broker_by_node_id(scraped: Stack) -> None:
    """One broker identity: the client side and the upstream side of a connection, its requests,
    latency and errors all say which broker by the same node_id (bootstrap for the bootstrap port)."""
    prom, inst = scraped.prom, scraped.metrics
    nodes: dict[str, set[str]] = {}
    for metric in BROKER_SCOPED:
        series = prom.query(f'{metric}{{instance="{inst}"}}')
        assert series, f"no {metric}"
        assert all("node_id" in s["metric"] for s in series), f"{metric} without node_id: {series}"
        nodes[metric] = {s["metric"]["node_id"] for s in series}
    both = {"bootstrap", str(TANSU_NODE_ID)}
    for metric in ("kproxy_requests_total", "kproxy_broker_latency_seconds_count",
                   "kproxy_client_connections_accepted_total", "kproxy_upstream_connections_active"):
        assert nodes[metric] == both, f"{metric}: {nodes[metric]}"
    # The connection metrics of both sides agree: broker-111's listener leads to node 111's address.
    client = {(s["metric"]["listener"], s["metric"]["node_id"])
              for s in prom.query(f'kproxy_client_connections_accepted_total{{instance="{inst}"}}')}
    assert client == {("bootstrap", "bootstrap"), (f"broker-{TANSU_NODE_ID}", str(TANSU_NODE_ID))}
    upstream = {s["metric"]["node_id"]: s["metric"]["upstream"]
                for s in prom.query(f'kproxy_upstream_connections_active{{instance="{inst}"}}')}
    server = scraped.proxy.server
    assert server is not None
    assert upstream == {"bootstrap": str(server.config.upstream[0]),
                        str(TANSU_NODE_ID): str(server.addresses.routes[TANSU_NODE_ID].upstream)}


# -- health endpoints -------------------------------------------------------------------------
def test_health_endpoints(stack: Stack) -> None:
    assert http_get(f"http://{stack.metrics}/healthz") == (200, "ok\n")
    assert http_get(f"http://{stack.metrics}/readyz") == (200, "ready\n")
    assert http_get(f"http://{stack.dead_metrics}/healthz") == (200, "ok\n")
    status, body = http_get(f"http://{stack.dead_metrics}/readyz")
    assert status == 503
    assert body.startswith("not ready: upstream unavailable")
    assert stack.dead_upstream in body
    status, body = http_get(f"http://{stack.metrics}/metrics")
    assert status == 200 and "kproxy_requests_total" in body
    assert http_get(f"http://{stack.metrics}/nope")[0] == 404

