"""``kproxy analyze --rules``: a rule file evaluated against captured traffic, with real Spark.

The generated capture has known traffic; the expected hits are worked out here
by hand from the rules' meaning (counts, schedules, token-bucket arithmetic),
and the probabilistic ones from the engine's published draw function over facts
built by hand, so the Spark pipeline (partitioning, ordering, ordinals,
aggregation) is what is under test.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pq = pytest.importorskip("pyarrow.parquet")

from kproxy.capture.writer import CaptureWriter  # noqa: E402
from kproxy.rules.actions.delay import Delay  # noqa: E402
from kproxy.rules.engine import draw  # noqa: E402
from kproxy.rules.request_facts import StaticFacts  # noqa: E402
from kproxy.rules.sources import check_paths  # noqa: E402
from tests.support.capture import record  # noqa: E402
from tests.support.captured import PRODUCER_ID, CapturedRun  # noqa: E402

M0 = 1_790_000_040_000_000  # 2026-09-21T14:14:00Z
PRODUCE, FETCH, METADATA = 0, 1, 3
FETCHES = 40


def _part(topic: str, partition: int) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "error_code": 0, "record_count": 1, "record_bytes": 100}


def _traffic() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(at_us: int, conn: str, client: str, host: str, node: int | None, api: tuple[int, str], **values: Any
            ) -> None:
        rows.append(record(len(rows), at_us=at_us, connection_id=conn, client_id=client, client_host=host,
                           node_id=node, listener="bootstrap" if node is None else f"broker-{node}",
                           api_key=api[0], api_name=api[1], **values))

    for i in range(100):  # p1: Produce to orders-eu every 1 ms
        add(M0 + i * 1000, "p1", "orders-svc", "10.1.2.3", 1, (PRODUCE, "Produce"), acks=-1, request_bytes=1000,
            partitions=[_part("orders-eu", i % 4)])
    for i in range(50):  # p2: Produce to logs every 2 ms, from another network
        add(M0 + 500 + i * 2000, "p2", "batch-7", "10.9.0.1", 1, (PRODUCE, "Produce"), acks=1, request_bytes=2000,
            partitions=[_part("logs", 0)])
    for conn, offset in (("f1", 700), ("f2", 5700)):  # two Fetch connections of one client to one broker
        for i in range(FETCHES):
            add(M0 + offset + i * 10_000, conn, "analytics", "127.0.0.1", 2, (FETCH, "Fetch"), api_version=12,
                partitions=[*(_part("orders-eu", p) for p in range(4)), _part("logs", 0)])
    for i in range(10):  # m1, m2: Metadata every 100 ms on the bootstrap listener
        add(M0 + 300 + i * 100_000, "m1", "orders-svc", "10.1.2.3", None, (METADATA, "Metadata"))
    for i in range(6):
        add(M0 + 350 + i * 100_000, "m2", "analytics", "127.0.0.1", None, (METADATA, "Metadata"))
    return rows


# No rule keeps state shared by connections: evaluated per connection.
PER_CONNECTION_RULES = """\
seed: 42
rules:
  - id: orders-not-leader
    match: {api: produce, topic: "orders-*"}
    actions:
      - inject_error: {error: NOT_LEADER_OR_FOLLOWER}
  - id: batch-slow
    match: {client_id: "batch-.*", client_address: "10.9.0.0/16"}
    actions:
      - delay: {ms: 20}
  - id: flaky-fetch
    match: {api: fetch, topic: {regex: "orders-(eu|us)"}, probability: 0.3}
    actions:
      - inject_error: {error: UNKNOWN_TOPIC_OR_PARTITION}
  - id: early-metadata
    match: {api: metadata, schedule: {for_seconds: 0.5}}
    actions:
      - delay: {ms: 100, jitter_ms: 50}
  - id: dry-close
    dry_run: true
    match: {api: metadata, client_id: "analytics"}
    actions:
      - close_connection
  - id: never
    match: {topic: "payments-*"}
    actions:
      - drop_response
"""

# Counters and a token bucket: one engine must see every connection's requests in time order.
GLOBAL_RULES = """\
seed: 7
rules:
  - id: batch-throttle
    continue: true
    match: {client_id: "batch-.*"}
    actions:
      - throttle: {requests_per_second: 100, burst_seconds: 0.1}
  - id: produce-11th-to-15th
    match: {api: produce, schedule: {after_requests: 10, first: 5}}
    actions:
      - inject_error: {error: REQUEST_TIMED_OUT}
  - id: every-third-metadata
    match: {api: metadata, schedule: {every: 3}}
    actions:
      - inject_error: {error: LEADER_NOT_AVAILABLE}
"""


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("whatif-capture")
    writer = CaptureWriter(directory, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600).start()
    for r in _traffic():
        assert writer.offer(r)
    writer.close()
    return directory


def _rules(tmp_path_factory: pytest.TempPathFactory, text: str, name: str) -> Path:
    path = tmp_path_factory.mktemp("rules") / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def per_connection(spark: Any, capture: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from kproxy.analysis.job import run_analysis
    from kproxy.analysis.whatif import WhatIfRules

    rules = WhatIfRules.from_file(str(_rules(tmp_path_factory, PER_CONNECTION_RULES, "a.yaml")))
    return run_analysis([str(capture)], tmp_path_factory.mktemp("out"), spark, rules=rules)


def _hits(analysis: Any) -> list[dict[str, Any]]:
    table = pq.read_table(Path(analysis.out) / "whatif_hits")
    return table.to_pylist()  # type: ignore[no-any-return]


def _by_rule(analysis: Any) -> dict[str, dict[str, Any]]:
    return {r["rule"]: r for r in analysis.tables["whatif_rules"]}


def _fetch_draws(seed: int) -> list[int]:
    """Ordinals of the Fetch requests flaky-fetch takes: the engine's draw for client analytics, broker 2,
    whose ordinals run over both its connections (f1 and f2 take turns: f1 the even ones)."""
    return [i for i in range(2 * FETCHES)
            if draw(seed, "flaky-fetch", StaticFacts(api_key=FETCH, client_id="analytics", broker_id=2,
                                                     stream_ordinal=i), 0) < 0.3]


def _fetch_hits(seed: int) -> set[tuple[str, int]]:
    """(connection, stream ordinal) of the Fetch requests flaky-fetch takes."""
    return {("f1" if i % 2 == 0 else "f2", i) for i in _fetch_draws(seed)}


def _utc(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1e6, UTC).replace(tzinfo=None)


def test_per_connection_rules_match_exactly(per_connection: Any) -> None:
    assert per_connection.whatif.ordering == "per-client"
    assert per_connection.whatif.seed == 42
    rules = _by_rule(per_connection)
    assert list(rules) == ["orders-not-leader", "batch-slow", "flaky-fetch", "early-metadata", "dry-close", "never"]

    r = rules["orders-not-leader"]
    assert (r["requests"], r["errors"], r["connections"], r["clients"]) == (100, 100, 1, 1)
    assert (r["first"], r["last"]) == (_utc(M0), _utc(M0 + 99_000))
    assert r["of_requests"] == 150  # the rule's api, produce: what it could have hit
    assert rules["batch-slow"]["of_requests"] == 150 + 2 * FETCHES + 16  # no api: every request

    r = rules["batch-slow"]
    assert (r["requests"], r["errors"], r["delay_ms"]) == (50, 0, 50 * 20.0)

    taken = _fetch_draws(42)
    assert 0 < len(taken) < 2 * FETCHES  # a probability that neither always nor never fires
    hits = _hits(per_connection)
    flaky = {(h["connection_id"], h["stream_ordinal"]) for h in hits if h["rule"] == "flaky-fetch"}
    # Per-client ordinals: f1 and f2 (same client, same broker) count on from each other, in time order.
    assert flaky == _fetch_hits(42)
    assert {c for c, _ in flaky} == {"f1", "f2"}
    assert rules["flaky-fetch"]["requests"] == len(taken)

    # for_seconds 0.5 from the first captured request: m1 and m2's first five Metadata requests,
    # each delayed by 100 +- 50 ms as the engine's draw resolves it.
    early = sorted((h["connection_id"], h["stream_ordinal"]) for h in hits if h["rule"] == "early-metadata")
    assert early == [(c, i) for c in ("m1", "m2") for i in range(5)]
    jitter = Delay(100.0, 50.0)
    expected = sum(jitter.resolve(draw(42, "early-metadata", StaticFacts(api_key=METADATA, client_id=client,
                                                                         stream_ordinal=i), 0))
                   for client in ("orders-svc", "analytics") for i in range(5))
    assert rules["early-metadata"]["delay_ms"] == pytest.approx(expected, rel=1e-12)
    assert rules["early-metadata"]["delay_ms"] != 10 * 100.0

    # First match wins: m2's first five went to early-metadata, so the dry run takes its sixth only.
    r = rules["dry-close"]
    assert (r["dry_run"], r["requests"], r["actions"]) == (True, 1, "close_connection")
    assert [(h["connection_id"], h["stream_ordinal"]) for h in hits if h["rule"] == "dry-close"] == [("m2", 5)]

    r = rules["never"]
    assert (r["requests"], r["first"], r["last"]) == (0, None, None)


def test_per_connection_breakdowns(per_connection: Any) -> None:
    n = len(_fetch_draws(42))
    by_api = {(r["rule"], r["api_name"]): r["requests"] for r in per_connection.tables["whatif_by_api"]}
    assert by_api == {("orders-not-leader", "produce"): 100, ("batch-slow", "produce"): 50,
                      ("flaky-fetch", "fetch"): n, ("early-metadata", "metadata"): 10,
                      ("dry-close", "metadata"): 1}
    by_client = {(r["rule"], r["client_id"]): r["requests"] for r in per_connection.tables["whatif_by_client"]}
    assert by_client[("early-metadata", "orders-svc")] == 5
    assert by_client[("early-metadata", "analytics")] == 5
    assert by_client[("batch-slow", "batch-7")] == 50
    by_topic = {(r["rule"], r["topic"]): r["requests"] for r in per_connection.tables["whatif_by_topic"]}
    assert by_topic == {("orders-not-leader", "orders-eu"): 100, ("batch-slow", "logs"): 50,
                        ("flaky-fetch", "orders-eu"): n, ("flaky-fetch", "logs"): n}
    errors = {(r["rule"], r["error"], r["error_code"]): r["requests"] for r in per_connection.tables["whatif_errors"]}
    assert errors == {("orders-not-leader", "NOT_LEADER_OR_FOLLOWER", 6): 100,
                      ("flaky-fetch", "UNKNOWN_TOPIC_OR_PARTITION", 3): n}


def test_what_if_is_written_as_parquet_and_reported(per_connection: Any) -> None:
    from kproxy.analysis.report import summary, write_html

    out = Path(per_connection.out)
    for name in ("whatif_hits", "whatif_rules", "whatif_by_api", "whatif_by_client", "whatif_by_topic",
                 "whatif_errors"):
        assert list((out / name).glob("*.parquet")), name
    assert pq.read_table(out / "whatif_rules").num_rows == 6
    text = io.StringIO()
    summary(per_connection, text)
    printed = text.getvalue()
    assert "what-if" in printed and "per-client order" in printed
    assert "dry-close [dry run]" in printed
    assert "injects NOT_LEADER_OR_FOLLOWER (6) x100 on produce" in printed
    report = out / "r.html"
    write_html(per_connection, str(report))
    page = report.read_text()
    assert "What-if:" in page and "NOT_LEADER_OR_FOLLOWER (6)" in page


def test_global_rules_count_across_connections_in_time_order(spark: Any, capture: Path,
                                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    from kproxy.analysis.job import find_inputs, read_captures
    from kproxy.analysis.whatif import WhatIfRules, run

    rules = WhatIfRules.from_file(str(_rules(tmp_path_factory, GLOBAL_RULES, "b.yaml")))
    df = read_captures(spark, find_inputs([str(capture)]))
    assert df is not None
    out = tmp_path_factory.mktemp("out-global")
    tables, info = run(spark, df, rules, M0, str(out))
    assert info.ordering == "global"
    assert info.shared == ("batch-throttle", "produce-11th-to-15th", "every-third-metadata")
    hits = pq.read_table(out / "whatif_hits").to_pylist()

    def taken(rule: str) -> set[tuple[str, int]]:
        return {(h["connection_id"], h["stream_ordinal"]) for h in hits if h["rule"] == rule}

    # Produce in time order: p1 every 1 ms from 0, p2 every 2 ms from 0.5 ms; the 11th to 15th of them.
    assert taken("produce-11th-to-15th") == {("p2", 3), ("p1", 7), ("p1", 8), ("p2", 4), ("p1", 9)}
    # Metadata m1 (0.3 ms + 100 ms steps) and m2 (0.35 ms + ...) interleave; every third of the 16.
    assert taken("every-third-metadata") == {("m1", 0), ("m2", 1), ("m1", 3), ("m2", 4), ("m1", 6), ("m1", 9)}
    # 100 requests/s, 10 saved: p2's requests every 2 ms earn 0.2 tokens each and spend 1, so request k
    # (from 0) waits (0.8k - 9) / 100 s once that is positive: k = 12..49.
    rules_table = {r["rule"]: r for r in tables["whatif_rules"]}
    expected_ms = sum(max(0.0, (0.8 * k - 9) / 100) for k in range(50)) * 1000
    assert rules_table["batch-throttle"]["requests"] == 50
    assert rules_table["batch-throttle"]["throttle_ms"] == pytest.approx(expected_ms, rel=1e-6)
    first_throttled = min(h["stream_ordinal"] for h in hits if h["rule"] == "batch-throttle" and h["throttle_ms"] > 0)
    assert first_throttled == 12


# Issue 36's scenario keys through Spark: the record key reads the payloads column (null here).
SCENARIO_RULES = """\
rules:
  - id: big-produce
    match: {api: produce, request_bytes: {min: 1500}}
    actions:
      - inject_error: {error: MESSAGE_TOO_LARGE}
  - id: first-fetch-of-each-connection
    match: {api: fetch, schedule: {first: 1, per: connection}}
    actions:
      - inject_error: {error: NOT_LEADER_OR_FOLLOWER}
  - id: any-key
    match: {api: produce, record: {key: ".*"}}
    actions:
      - drop_response
  - id: slower-metadata
    match: {api: metadata}
    actions:
      - delay: {ms: {from: 0, to: 1000, over_seconds: 1}}
"""


def test_scenario_keys_run_through_spark(spark: Any, capture: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from kproxy.analysis.job import find_inputs, read_captures
    from kproxy.analysis.whatif import WhatIfRules, run

    rules = WhatIfRules.from_file(str(_rules(tmp_path_factory, SCENARIO_RULES, "s.yaml")))
    df = read_captures(spark, find_inputs([str(capture)]))
    assert df is not None
    out = tmp_path_factory.mktemp("out-scenarios")
    _, info = run(spark, df, rules, M0, str(out))
    assert info.ordering == "per-client", "per-connection counters are no shared state"
    hits = pq.read_table(out / "whatif_hits").to_pylist()
    by_rule: dict[str, list[dict[str, Any]]] = {}
    for h in hits:
        by_rule.setdefault(h["rule"], []).append(h)
    assert {h["connection_id"] for h in by_rule["big-produce"]} == {"p2"} and len(by_rule["big-produce"]) == 50
    assert sorted((h["connection_id"], h["stream_ordinal"]) for h in by_rule["first-fetch-of-each-connection"]) == [
        ("f1", 0), ("f2", 1)]
    assert "any-key" not in by_rule, "a capture without payloads has no record keys"
    # m1's Metadata at 300 us + i * 100 ms, m2's at 350 us + i * 100 ms: the ramp's value then.
    expected = sum(min(1000.0, (offset + i * 100_000) / 1000) for offset, n in ((300, 10), (350, 6)) for i in range(n))
    assert sum(h["delay_ms"] for h in by_rule["slower-metadata"]) == pytest.approx(expected, rel=1e-9)



def test_same_seed_same_what_if_another_seed_differs(spark: Any, capture: Path, per_connection: Any,
                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    from kproxy.analysis.job import find_inputs, read_captures
    from kproxy.analysis.whatif import WhatIfRules, run

    path = str(_rules(tmp_path_factory, PER_CONNECTION_RULES, "a.yaml"))
    df = read_captures(spark, find_inputs([str(capture)]))
    assert df is not None

    def hits(seed: int | None) -> list[tuple[Any, ...]]:
        out = tmp_path_factory.mktemp("out-seed")
        run(spark, df, WhatIfRules.from_file(path, seed), M0, str(out))
        return sorted((h["rule"], h["connection_id"], h["stream_ordinal"], h["delay_ms"])
                      for h in pq.read_table(out / "whatif_hits").to_pylist())

    first = sorted((h["rule"], h["connection_id"], h["stream_ordinal"], h["delay_ms"]) for h in _hits(per_connection))
    assert hits(None) == first  # the file's seed (42), evaluated again
    assert hits(42) == first  # --seed 42: the same
    other = hits(43)
    assert other != first
    flaky = {(c, i) for r, c, i, _ in other if r == "flaky-fetch"}
    assert flaky == _fetch_hits(43)


def test_a_rule_file_with_errors_is_refused_with_its_problems(capture: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from kproxy.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - id: x\n    match: {apii: produce}\n    actions:\n"
                   "      - inject_error: {error: NOT_LEADER_FOR_PARTITON}\n"
                   "  - id: y\n    match: {client_id: \"(unclosed\"}\n    actions: [drop_response]\n")
    problems = [str(p) for p in check_paths([str(bad)])]
    assert len(problems) == 3
    assert main(["analyze", str(capture), "--rules", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[:3] == problems
    assert all(p.startswith(f"{bad}:") for p in problems)
    assert not (tmp_path / "out").exists()  # refused before any Spark work
    assert main(["analyze", str(capture), "--seed", "3"]) == 2
    assert "--seed needs --rules" in capsys.readouterr().err


def test_cli_what_if_prints_per_rule_lines(spark: Any, capture: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from kproxy.cli import main

    rules = tmp_path / "a.yaml"
    rules.write_text(PER_CONNECTION_RULES)
    assert main(["analyze", str(capture), "--rules", str(rules), "--seed", "42", "--out", str(tmp_path / "out"),
                 "--conf", "spark.sql.shuffle.partitions=2"]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("orders-not-leader"))
    assert line.split()[1:5] == ["100", "150", "1", "100"]  # requests, of its api's requests, connections, errors
    assert "What-if:" in (tmp_path / "out" / "report.html").read_text()


def test_what_if_over_a_real_capture(spark: Any, captured_run: CapturedRun, tmp_path: Path) -> None:
    from kproxy.analysis.job import run_analysis
    from kproxy.analysis.whatif import WhatIfRules

    run = captured_run
    assert run.dropped == 0  # every request is in the capture, so the counts below are the traffic's
    rules = tmp_path / "real.yaml"
    rules.write_text(f"seed: 1\nrules:\n"
                     f"  - id: producer-errors\n    match: {{api: produce, topic: \"{run.topic[:-2]}*\", "
                     f"client_id: \"{PRODUCER_ID[:8]}.*\"}}\n"
                     f"    actions:\n      - inject_error: {{error: NOT_LEADER_OR_FOLLOWER}}\n"
                     f"  - id: half-the-fetches\n    match: {{api: fetch, probability: 0.5}}\n"
                     f"    actions:\n      - delay: {{ms: 10}}\n")
    result = run_analysis([str(run.directory)], tmp_path / "out", spark, rules=WhatIfRules.from_file(str(rules)))
    by_rule = {r["rule"]: r for r in result.tables["whatif_rules"]}
    assert by_rule["producer-errors"]["requests"] == run.requests["produce"]
    assert by_rule["producer-errors"]["errors"] == run.requests["produce"]
    fetched = by_rule["half-the-fetches"]["requests"]
    assert 0 < fetched < run.requests["fetch"]
    assert by_rule["half-the-fetches"]["delay_ms"] == fetched * 10.0


LIVE_RULES = """\
seed: 5
rules:
  - id: metadata-every-3rd
    continue: true
    match: {{api: metadata, schedule: {{every: 3}}}}
    actions:
      - delay: {{ms: 1}}
  - id: coin-produce
    match: {{api: produce, topic: "{topic}", probability: 0.4}}
    actions:
      - delay: {{ms: 1}}
  - id: fetch-after-3-every-2nd
    match: {{api: fetch, schedule: {{after_requests: 3, every: 2}}}}
    actions:
      - delay: {{ms: 1}}
  - id: coin-metadata
    dry_run: true
    match: {{api: metadata, probability: 0.5}}
    actions:
      - inject_error: {{error: LEADER_NOT_AVAILABLE}}
"""


def test_what_if_of_a_live_run_matches_what_the_proxy_did(spark: Any, tansu: Any, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The proxy runs a seeded rule file (probabilities, counted schedules: one counting over
    several connections) with capture on; the what-if of that capture with that file names the
    requests the proxy acted on, one by one."""
    import logging
    import time

    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    from kproxy.analysis.job import run_analysis
    from kproxy.analysis.whatif import WhatIfRules
    from kproxy.logfmt import parse_logfmt
    from kproxy.testing import running_proxy
    from tests.support.e2e import create_topic, unique

    topic = unique("whatif-live")
    create_topic(tansu.bootstrap, topic, partitions=2)  # straight to the broker: not captured
    rules = tmp_path / "live.yaml"
    rules.write_text(LIVE_RULES.format(topic=topic))
    capture = tmp_path / "capture"
    with caplog.at_level(logging.INFO, "kproxy.faults"), \
            running_proxy(tansu.bootstrap, rules=str(rules), capture__dir=str(capture)) as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": "live-producer", "linger.ms": 0})
        for i in range(30):  # one Produce request each: a flush per message
            producer.produce(topic, key=b"k%d" % i, value=b"v" * 20, partition=i % 2)
            assert producer.flush(10) == 0
            # A Metadata request per message: with one per 3rd message, metadata-every-3rd could
            # act only 4 times (librdkafka's own Metadata requests vary), under the floor below.
            producer.list_topics(topic, timeout=10)
        del producer
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("live"),
                             "fetch.wait.max.ms": 20, "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(2)])
        got, deadline, polled_until = 0, time.monotonic() + 30, 0.0
        while (got < 30 or time.monotonic() < polled_until) and time.monotonic() < deadline:
            msg = consumer.poll(0.05)
            got += msg is not None and msg.error() is None
            if got < 30:
                polled_until = time.monotonic() + 0.5  # then half a second of empty Fetches
        assert got == 30
        consumer.close()
        server: Any = proxy.server
    assert server.capture.writer.dropped == 0  # every request is in the capture
    metadata = [r for path in capture.glob("hour=*/capture-*.parquet")
                for r in pq.ParquetFile(path).read(columns=["api_name", "connection_id"]).to_pylist()
                if r["api_name"] == "Metadata"]
    assert len({r["connection_id"] for r in metadata}) >= 2  # metadata-every-3rd counted across connections
    lines = [parse_logfmt(r.getMessage()) for r in caplog.records if r.name == "kproxy.faults"]
    live_hits: dict[str, int] = {}
    for (rule, _action, _dry_run), n in server.stats.faults.hits.items():
        live_hits[rule] = live_hits.get(rule, 0) + n

    result = run_analysis([str(capture)], tmp_path / "out", spark, rules=WhatIfRules.from_file(str(rules)))
    by_rule = {r["rule"]: r["requests"] for r in result.tables["whatif_rules"]}
    assert by_rule == live_hits
    assert all(n >= 5 for n in by_rule.values()), by_rule  # each rule acted, often
    # Request by request: the fault log's (rule, api, correlation id) are the what-if's hits.
    live = sorted((f["rule"], f["api"], int(f["correlation_id"])) for f in lines)
    what_if = sorted((h["rule"], h["api_name"], h["correlation_id"]) for h in _hits(result))
    assert live == what_if  # one spelling: the fault log's api is the what-if's
