"""What the proxy's rules did, in the capture: real traffic through kproxy with fault rules, the
capture's ``rule_decisions`` and ``analyze``'s faults table against the live counters."""

from __future__ import annotations

import io
import re
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pq = pytest.importorskip("pyarrow.parquet")

from confluent_kafka import Producer  # noqa: E402

from kproxy.testing import free_port, running_proxy  # noqa: E402
from tests.support.e2e import consume_confluent, create_topic, unique  # noqa: E402

DELAY_MS = 60
RECORDS = 12
RULES = """\
rules:
  - id: produce-not-leader
    match: {{api: produce, topic: "{topic}", schedule: {{every: 3}}}}
    actions:
      - inject_error: {{error: NOT_LEADER_OR_FOLLOWER}}
  - id: slow-metadata
    match: {{api: metadata}}
    actions:
      - delay: {{ms: {delay}}}
  - id: watch-fetch
    dry_run: true
    match: {{api: fetch, topic: "{topic}"}}
    actions:
      - close_connection
"""
_HITS = re.compile(r'^kproxy_rule_hits_total\{action="([^"]*)",dry_run="([^"]*)",rule="([^"]*)"\} (\S+)$', re.M)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        return str(answer.read().decode())


@pytest.fixture(scope="module")
def faulted(tansu: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[tuple[str, str, bool], int]]:
    """A capture of librdkafka traffic under three rules (an error every third Produce, a delay of
    every Metadata, a dry-run close of every Fetch), and ``kproxy_rule_hits_total`` scraped from
    /metrics once every client had closed."""
    tmp = tmp_path_factory.mktemp("faulted")
    topic = unique("faulted")
    create_topic(tansu.bootstrap, topic, partitions=2)  # straight to the broker: not captured
    rules = tmp / "rules.yaml"
    rules.write_text(RULES.format(topic=topic, delay=DELAY_MS))
    capture = tmp / "capture"
    metrics_port = free_port()
    with running_proxy(tansu.bootstrap, rules=str(rules), capture__dir=str(capture),
                       metrics_listen=f"127.0.0.1:{metrics_port}") as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": "faulted-producer",
                             "linger.ms": 0, "retry.backoff.ms": 10})
        for i in range(RECORDS):  # one Produce request each (and its retries): a flush per message
            producer.produce(topic, key=b"k%d" % i, value=b"v" * 30, partition=i % 2)
            assert producer.flush(10) == 0
        del producer
        assert len(consume_confluent(proxy.bootstrap, topic, 2, RECORDS)) == RECORDS
        page = _scrape(metrics_port)
        server: Any = proxy.server
    live = {(rule, action, dry == "true"): int(float(n)) for action, dry, rule, n in _HITS.findall(page)}
    # Nothing was counted after the scrape: every client had closed.
    after = {(rule, action, dry == "true"): n for (rule, action, dry), n in server.stats.faults.hits.items()}
    assert after == live
    assert server.capture.writer.dropped == 0
    return capture, live


def _rows(capture: Path) -> list[dict[str, Any]]:
    return [r for path in sorted(capture.glob("hour=*/capture-*.parquet")) for r in pq.read_table(path).to_pylist()]


def test_every_rule_decision_is_in_the_capture_as_the_live_counters_count_it(
        faulted: tuple[Path, dict[tuple[str, str, bool], int]]) -> None:
    capture, live = faulted
    assert live[("produce-not-leader", "inject_error", False)] >= 3, live
    assert live[("slow-metadata", "delay", False)] >= 2, live
    assert live[("watch-fetch", "close_connection", True)] >= 1, live
    rows = _rows(capture)
    captured = Counter((d["rule"], d["action"], d["dry_run"]) for r in rows for d in r["rule_decisions"])
    assert captured == {key: n for key, n in live.items() if n}
    for r in rows:
        for d in r["rule_decisions"]:
            if d["rule"] == "produce-not-leader":  # answered by kproxy, with the rule's error
                assert (r["api_name"], r["local_response"]) == ("Produce", True)
                assert "NOT_LEADER_OR_FOLLOWER" in d["detail"], d
                assert {p["error_code"] for p in r["partitions"]} == {6}
            elif d["rule"] == "slow-metadata":
                assert r["api_name"] == "Metadata" and d["detail"] == f"{DELAY_MS:.1f}ms at request"
            else:
                assert r["api_name"] == "Fetch" and not r["local_response"]


def test_time_held_by_a_delay_rule_is_not_kproxy_latency(faulted: tuple[Path, dict[tuple[str, str, bool], int]]
                                                         ) -> None:
    """kproxy_latency_ms is kproxy's own time, as kproxy_overhead_seconds: the response a delay
    rule held for 60 ms took 60 ms and more from request to response, none of it kproxy's."""
    capture, _ = faulted
    # Every Metadata request was delayed; not those whose client closed before the answer left.
    delayed = [r for r in _rows(capture) if r["api_name"] == "Metadata" and r["response_time"] is not None]
    assert delayed
    for r in delayed:
        assert (r["response_time"] - r["request_time"]).total_seconds() * 1000 >= DELAY_MS
        assert r["kproxy_latency_ms"] < DELAY_MS / 3, r["kproxy_latency_ms"]


def test_the_faults_table_and_report_show_what_the_rules_did(
        spark: Any, faulted: tuple[Path, dict[tuple[str, str, bool], int]], tmp_path: Path) -> None:
    from kproxy.analysis.job import run_analysis
    from kproxy.analysis.report import summary, write_html

    capture, live = faulted
    result = run_analysis([str(capture)], tmp_path, spark)
    table: Counter[tuple[str, str, bool]] = Counter()
    for r in result.tables["faults"]:
        table[(r["rule"], r["action"], r["dry_run"])] += r["requests"]
    assert table == {key: n for key, n in live.items() if n}
    apis = {(r["rule"], r["api_name"]) for r in result.tables["faults"]}
    assert apis == {("produce-not-leader", "produce"), ("slow-metadata", "metadata"), ("watch-fetch", "fetch")}
    # librdkafka retries a Produce answered NOT_LEADER_OR_FOLLOWER on the same connection.
    assert any(r["rule"] == "produce-not-leader" and r["then"] in ("retried", "other")
               for r in result.tables["faults"])
    out = io.StringIO()
    summary(result, out)
    text = out.getvalue()
    assert re.search(r"^produce-not-leader \(inject_error\) on \d+ produce: then ", text, re.M), text
    assert re.search(r"^watch-fetch \(close_connection, dry run\) on \d+ fetch: then ", text, re.M), text
    write_html(result, str(tmp_path / "report.html"))
    html = (tmp_path / "report.html").read_text()
    assert "produce-not-leader" in html and "watch-fetch" in html
