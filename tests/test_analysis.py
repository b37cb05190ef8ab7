"""The Spark job, in local mode: generated captures with known figures, bad inputs, a real capture."""

from __future__ import annotations

import io
import math
import os
import re
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
np = pytest.importorskip("numpy")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from kproxy.capture.writer import CaptureWriter, arrow_schema  # noqa: E402
from tests.support.capture import record  # noqa: E402
from tests.support.captured import CapturedRun  # noqa: E402

MINUTE_US = 60_000_000
M0 = 1_790_000_040_000_000  # 2026-09-21T14:14:00Z, a whole minute
NOT_LEADER, COORDINATOR_NOT_AVAILABLE = 6, 15


def _generated() -> list[dict[str, Any]]:
    """Produce, acks=0 Produce, Fetch and FindCoordinator over two minutes, with set latencies and errors."""
    rows: list[dict[str, Any]] = []
    n = 0

    def add(at_us: int, **values: Any) -> None:
        nonlocal n
        rows.append(record(n, at_us=at_us, **values))
        n += 1

    for i in range(100):  # minute 0: broker latency 1..100 ms, every 10th partition NOT_LEADER
        add(M0 + i * 1000, connection_id="p1", client_id="producer", broker_latency_ms=float(i + 1),
            kproxy_latency_ms=i * 0.01, acks=-1, record_count=5, record_bytes=500,
            partitions=[{"topic": "a", "partition": i % 4, "error_code": NOT_LEADER if i % 10 == 0 else 0,
                         "record_count": 5, "record_bytes": 500}])
    for i in range(50):  # minute 1: a flat 10 ms
        add(M0 + MINUTE_US + i * 1000, connection_id="p2", client_id="producer", broker_latency_ms=10.0,
            kproxy_latency_ms=0.5, acks=-1, record_count=5, record_bytes=500,
            partitions=[{"topic": "a", "partition": 0, "error_code": 0, "record_count": 5, "record_bytes": 500}])
    for i in range(10):  # acks=0 across both minutes: no response, no broker latency
        add(M0 + (i % 2) * MINUTE_US + 500_000 + i, connection_id="p0", client_id="fire-and-forget",
            broker_latency_ms=None, response_bytes=None, kproxy_latency_ms=0.2, acks=0, record_count=1,
            record_bytes=100,
            partitions=[{"topic": "a", "partition": 3, "error_code": None, "record_count": 1, "record_bytes": 100}])
    for i in range(40):
        add(M0 + 2_000_000 + i, connection_id="f1", client_id="consumer", api_key=1, api_name="Fetch",
            broker_latency_ms=200.0 + i, kproxy_latency_ms=0.05, record_count=3, record_bytes=300,
            partitions=[{"topic": "b", "partition": 1, "error_code": 0, "record_count": 3, "record_bytes": 300}])
    fault = [{"rule": "flaky-produce", "action": "inject_error", "detail": "NOT_LEADER_OR_FOLLOWER",
              "dry_run": False},
             {"rule": "watch-produce", "action": "close_connection", "detail": "dry run: nothing done",
              "dry_run": True}]
    r1 = M0 + MINUTE_US + 4_000_000
    for i in range(3):  # minute 1, connection r1: faulted Produce retried 5 ms later; the last one ends r1
        add(r1 + i * 10_000, connection_id="r1", client_id="retrier", rule_decisions=fault,
            local_response=True, broker_latency_ms=None)
        if i < 2:
            add(r1 + i * 10_000 + 5_000, connection_id="r1", client_id="retrier", broker_latency_ms=10.0)
    add(r1 + 100_000, connection_id="r2", client_id="retrier", api_key=3, api_name="Metadata",
        rule_decisions=[{"rule": "slow-metadata", "action": "delay", "detail": "100.0ms at request",
                         "dry_run": False}])
    add(r1 + 100_500, connection_id="r2", client_id="retrier", api_key=1, api_name="Fetch")
    for i in range(20):
        add(M0 + 3_000_000 + i, connection_id="x1", client_id="consumer", api_key=10, api_name="FindCoordinator",
            broker_latency_ms=2.0, kproxy_latency_ms=0.05, group_id="g",
            error_code=COORDINATOR_NOT_AVAILABLE if i < 5 else 0)
    return rows


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    directory = tmp_path_factory.mktemp("generated")
    rows = _generated()
    writer = CaptureWriter(directory, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600).start()
    for r in rows:
        assert writer.offer(r)
    writer.close()
    return directory, rows


@pytest.fixture(scope="module")
def analysed(spark: Any, generated: tuple[Path, list[dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory
             ) -> Any:
    from kproxy.analysis.job import run_analysis

    return run_analysis([str(generated[0])], tmp_path_factory.mktemp("out"), spark, interval=60)


def _pct(values: list[float], p: float) -> float:
    return float(np.percentile(values, p * 100))  # numpy's default: linear interpolation, as Spark's percentile


def test_latency_percentiles_are_exact(analysed: Any, generated: tuple[Path, list[dict[str, Any]]]) -> None:
    rows = generated[1]
    by_api = {r["api_name"]: r for r in analysed.tables["latency_by_api"]}
    # The capture holds Kafka's names; every output of analyze spells them as the metrics do.
    assert set(by_api) == {"produce", "fetch", "find_coordinator", "metadata"}
    for api, name in (("produce", "Produce"), ("fetch", "Fetch"), ("find_coordinator", "FindCoordinator")):
        mine = [r for r in rows if r["api_name"] == name]
        broker = [r["broker_latency_ms"] for r in mine if r["broker_latency_ms"] is not None]
        kproxy = [r["kproxy_latency_ms"] for r in mine]
        got = by_api[api]
        assert got["requests"] == len(mine)
        for p in (0.5, 0.95, 0.99):
            assert got[f"broker_p{round(p * 100)}_ms"] == pytest.approx(_pct(broker, p), rel=1e-12)
            assert got[f"kproxy_p{round(p * 100)}_ms"] == pytest.approx(_pct(kproxy, p), rel=1e-12)
        assert got["broker_max_ms"] == max(broker)
        assert got["kproxy_max_ms"] == max(kproxy)
    # The hand-checkable case: Produce in minute 0 is 1..100 ms exactly.
    minute0 = next(r for r in analysed.tables["latency_over_time"]
                   if r["api_name"] == "produce" and r["time"].minute == 14)
    assert minute0["requests"] == 105  # 100 + the 5 acks=0 requests of that minute
    assert (minute0["broker_p50_ms"], minute0["broker_p95_ms"], minute0["broker_p99_ms"],
            minute0["broker_max_ms"]) == pytest.approx((50.5, 95.05, 99.01, 100.0))
    minute1 = next(r for r in analysed.tables["latency_over_time"]
                   if r["api_name"] == "produce" and r["time"].minute == 15)
    assert minute1["broker_p99_ms"] == 10.0 and minute1["requests"] == 60


def test_above_the_exact_limit_percentiles_are_within_the_stated_relative_error(
        spark: Any, generated: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    """Above the exact limit, per api and per time bin, the percentiles come off log-scale histograms:
    each within the stated relative error of the exact value ranked ceil(p * n), the requests, the
    bytes and the maxima exact. The bins are the capture's auto interval (two minutes: a second each)."""
    from kproxy.analysis.job import run_analysis
    from kproxy.analysis.log_histogram import RELATIVE_ERROR
    from kproxy.analysis.report import summary

    rows = generated[1]
    approx = run_analysis([str(generated[0])], tmp_path, spark, exact_percentiles_max=len(rows) - 1)
    assert not approx.exact_percentiles
    assert approx.interval == 1
    checked = 0
    for table, per_bin in (("latency_by_api", False), ("latency_over_time", True)):
        assert approx.tables[table]
        for got in approx.tables[table]:
            at = (got["time"] - datetime(1970, 1, 1)) // timedelta(microseconds=1) if per_bin else 0
            mine = [r for r in rows if re.sub(r"(?<!^)(?=[A-Z])", "_", r["api_name"]).lower() == got["api_name"]
                    and (not per_bin or at <= r["request_time"] < at + got["interval_s"] * 1_000_000)]
            assert got["requests"] == len(mine), got
            if not per_bin:
                assert got["request_bytes"] == sum(r["request_bytes"] for r in mine)
            for name in ("broker", "kproxy"):
                values = sorted(r[f"{name}_latency_ms"] for r in mine if r[f"{name}_latency_ms"] is not None)
                if not values:
                    assert got[f"{name}_p50_ms"] is None and got[f"{name}_max_ms"] is None
                    continue
                assert got[f"{name}_max_ms"] == values[-1]
                for p in (0.5, 0.95, 0.99):
                    exact = values[max(1, math.ceil(p * len(values))) - 1]
                    assert abs(got[f"{name}_p{round(p * 100)}_ms"] - exact) <= RELATIVE_ERROR * abs(exact) + 1e-9, \
                        (table, got.get("time"), got["api_name"], name, p, exact)
                    checked += 1
    assert checked >= 50
    out = io.StringIO()
    summary(approx, out)
    assert "percentiles approximate: from log-scale histograms" in out.getvalue()


def test_the_exact_percentile_limit_is_inclusive(spark: Any, generated: tuple[Path, list[dict[str, Any]]],
                                                 tmp_path: Path) -> None:
    """``exact_percentiles_max`` is the most records still given exact percentiles: at exactly that
    many, one fewer and one more, the method used and the figures it gives (an off-by-one at the
    limit turned exactly ``n`` records approximate and passed every other test)."""
    from kproxy.analysis.job import run_analysis
    from kproxy.analysis.report import summary

    n = len(generated[1])
    for limit, exact in ((n - 1, False), (n, True), (n + 1, True)):
        got = run_analysis([str(generated[0])], tmp_path / str(limit), spark, exact_percentiles_max=limit, interval=60)
        assert got.records == n
        assert got.exact_percentiles is exact, f"{n} records, exact_percentiles_max={limit}"
        # Produce in minute 0 has broker latencies 1..100 ms: the exact median interpolates to 50.5,
        # the approximate one is a value of the group (never 50.5).
        minute0 = next(r for r in got.tables["latency_over_time"]
                       if r["api_name"] == "produce" and r["time"].minute == 14)
        if exact:
            assert (minute0["broker_p50_ms"], minute0["broker_p99_ms"]) == pytest.approx((50.5, 99.01))
        else:
            assert minute0["broker_p50_ms"] in {float(v) for v in range(1, 101)}
        out = io.StringIO()
        summary(got, out)
        assert ("percentiles approximate" in out.getvalue()) is not exact, out.getvalue()


def test_error_rates_by_api_and_code(analysed: Any) -> None:
    errors = {(r["api_name"], r["code"]): r for r in analysed.tables["errors"]}
    assert set(errors) == {("produce", NOT_LEADER), ("find_coordinator", COORDINATOR_NOT_AVAILABLE)}
    assert errors[("produce", NOT_LEADER)]["requests"] == 10
    assert errors[("produce", NOT_LEADER)]["rate"] == pytest.approx(10 / 165)
    assert errors[("find_coordinator", COORDINATOR_NOT_AVAILABLE)]["rate"] == 0.25


def test_top_clients_topics_and_hot_partitions(analysed: Any, generated: tuple[Path, list[dict[str, Any]]]) -> None:
    rows = generated[1]
    clients = {r["client_id"]: r for r in analysed.tables["top_clients"]}
    assert clients["producer"]["requests"] == 150 and clients["producer"]["errors"] == 10
    assert clients["producer"]["bytes"] == sum(r["request_bytes"] + (r["response_bytes"] or 0)
                                               for r in rows if r["client_id"] == "producer")
    # Frames each way, and the record batches produced and fetched (kproxy_client_bytes_total's directions).
    assert {c: (r["request_bytes"], r["response_bytes"], r["produced_bytes"], r["fetched_bytes"])
            for c, r in clients.items() if c in ("producer", "consumer", "fire-and-forget")} == {
        "producer": (150 * 100, 150 * 50, 150 * 500, 0), "consumer": (60 * 100, 60 * 50, 0, 40 * 300),
        "fire-and-forget": (10 * 100, 0, 10 * 100, 0)}
    assert [r["bytes"] for r in analysed.tables["top_clients"]] == sorted(
        (r["bytes"] for r in analysed.tables["top_clients"]), reverse=True)
    assert clients["consumer"]["requests"] == 60 and clients["consumer"]["errors"] == 5
    assert clients["fire-and-forget"]["records"] == 10
    topics = {r["topic"]: r for r in analysed.tables["top_topics"]}
    # Produced and fetched apart: a record produced then fetched is not two records.
    assert topics["a"] == {"topic": "a", "requests": 160, "produced_records": 760, "produced_bytes": 76_000,
                           "fetched_records": 0, "fetched_bytes": 0, "errors": 10}
    assert topics["b"] == {"topic": "b", "requests": 40, "produced_records": 0, "produced_bytes": 0,
                           "fetched_records": 120, "fetched_bytes": 12_000, "errors": 0}
    hot = analysed.tables["hot_partitions"]
    expected: Counter[tuple[str, int]] = Counter()
    for r in rows:
        for p in r["partitions"]:
            expected[(p["topic"], p["partition"])] += p["record_bytes"]
    assert [(h["topic"], h["partition"], h["bytes"]) for h in hot] == sorted(
        ((t, p, b) for (t, p), b in expected.items()), key=lambda x: (-x[2], x[0], x[1]))
    assert next(h for h in hot if (h["topic"], h["partition"]) == ("b", 1))["fetched"] == 120


def test_throughput_per_topic_per_minute(analysed: Any) -> None:
    got = {(r["time"].minute, r["api_name"], r["topic"]): (r["records"], r["bytes"])
           for r in analysed.tables["throughput"]}
    assert got == {(14, "produce", "a"): (500 + 5, 50_000 + 500), (15, "produce", "a"): (250 + 5, 25_000 + 500),
                   (14, "fetch", "b"): (120, 12_000)}


def test_connection_churn(analysed: Any) -> None:
    churn = {r["time"].minute: (r["opened"], r["closed"]) for r in analysed.tables["connection_churn"]}
    # p1, f1, x1 live within minute 14; p0 opens in 14 and ends in 15; p2, r1, r2 live in 15.
    assert churn == {14: (4, 3), 15: (3, 4)}


def test_faults_by_rule_and_what_the_client_did_next(analysed: Any) -> None:
    got = {(r["rule"], r["action"], r["dry_run"], r["api_name"], r["then"]): (r["requests"], r["median_delay_ms"])
           for r in analysed.tables["faults"]}
    assert got == {("flaky-produce", "inject_error", False, "produce", "retried"): (2, 5.0),
                   ("flaky-produce", "inject_error", False, "produce", "connection_ended"): (1, None),
                   ("watch-produce", "close_connection", True, "produce", "retried"): (2, 5.0),
                   ("watch-produce", "close_connection", True, "produce", "connection_ended"): (1, None),
                   ("slow-metadata", "delay", False, "metadata", "other"): (1, 0.5)}


def test_aggregates_are_written_as_parquet(analysed: Any) -> None:
    out = Path(analysed.out)
    table = pq.read_table(out / "errors")
    assert sorted(table.column("code").to_pylist()) == [NOT_LEADER, COORDINATOR_NOT_AVAILABLE]
    assert {p.name for p in out.iterdir()} >= {"latency_by_api", "latency_over_time", "errors", "top_clients",
                                                    "top_topics", "throughput", "hot_partitions", "connection_churn",
                                                    "faults"}


def test_bad_inputs_are_named_and_the_rest_is_analysed(spark: Any, generated: tuple[Path, list[dict[str, Any]]],
                                                       tmp_path: Path) -> None:
    from kproxy.analysis.job import run_analysis

    good = sorted(generated[0].glob("hour=*/capture-*.parquet"))[0]
    cut = tmp_path / "capture-cut.parquet"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # a copy cut short
    other = tmp_path / "capture-v99.parquet"
    schema = arrow_schema().with_metadata({"kproxy.capture.schema_version": "99"})
    pq.write_table(pa.Table.from_pylist([record(0)], schema=schema), other)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    result = run_analysis([str(tmp_path / "missing"), str(cut), str(other), str(empty_dir), str(generated[0])],
                          tmp_path / "out", spark)
    reasons = {p.path: p.reason for p in result.problems}
    assert reasons[str(tmp_path / "missing")] == "no such file or directory"
    assert "not a complete Parquet file" in reasons[str(cut)]
    assert reasons[str(other)] == "capture schema version 99, this kproxy reads versions 1 to 5"
    assert "no capture files" in reasons[str(empty_dir)]
    assert result.records == len(generated[1])


def test_cli_analyze_writes_the_report_and_summary(spark: Any, generated: tuple[Path, list[dict[str, Any]]],
                                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kproxy.cli import main

    assert main(["analyze", str(generated[0]), "--out", str(tmp_path / "out"),
                 "--conf", "spark.sql.shuffle.partitions=2"]) == 0
    out = capsys.readouterr().out
    assert f"{len(generated[1])} records" in out and "\nproduce " in out and "Produce" not in out
    report = (tmp_path / "out" / "report.html").read_text()
    assert report.count("<img alt=") == 4 and "find_coordinator" in report and "FindCoordinator" not in report
    assert sorted(p.name for p in (tmp_path / "out" / "plots").iterdir()) == [
        "bytes_by_api.png", "error_rate.png", "latency.png", "throughput.png"]
    assert main(["analyze", str(tmp_path / "nothing-here")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nothing-here'}: no such file or directory" in err
    assert main(["analyze", str(generated[0]), "--conf", "no-equals-sign"]) == 2
    assert "--conf 'no-equals-sign': expected KEY=VALUE" in capsys.readouterr().err


def test_a_real_capture_matches_what_was_sent(spark: Any, captured_run: CapturedRun, tmp_path: Path) -> None:
    from kproxy.analysis.job import run_analysis

    run = captured_run
    result = run_analysis([str(run.directory)], tmp_path, spark)
    assert result.problems == []
    requests = {r["api_name"]: r["requests"] for r in result.tables["latency_by_api"]}
    assert requests == run.requests  # the metrics' names
    moved: Counter[tuple[str, str]] = Counter()
    for r in result.tables["throughput"]:
        moved[(r["api_name"], r["topic"])] += r["records"]
    assert moved == {("produce", run.topic): run.records, ("fetch", run.topic): run.records}
    topic = next(t for t in result.tables["top_topics"] if t["topic"] == run.topic)
    assert (topic["produced_records"], topic["fetched_records"], topic["errors"]) == (run.records, run.records, 0)
    assert topic["produced_bytes"] == topic["fetched_bytes"]  # the broker keeps the batches as produced
    assert {h["partition"] for h in result.tables["hot_partitions"] if h["topic"] == run.topic} == set(
        range(run.partitions))
    assert result.tables["errors"] == []


def test_summary_prints_per_api_lines(analysed: Any) -> None:
    from kproxy.analysis.report import summary

    buf = io.StringIO()
    summary(analysed, buf)
    text = buf.getvalue()
    line = next(x for x in text.splitlines() if x.startswith("find_coordinator"))
    assert line.split()[1:3] == ["20", "2.00/2.00/2.00"]


def test_follow_keeps_per_minute_aggregates_up_to_date(spark: Any, tmp_path: Path) -> None:
    from kproxy.analysis.follow import LIVE_TABLE, follow

    capture, out = tmp_path / "capture", tmp_path / "out"
    capture.mkdir()

    def write(rows: list[dict[str, Any]]) -> None:
        writer = CaptureWriter(capture, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600).start()
        for r in rows:
            writer.offer(r)
        writer.close()

    def live() -> dict[tuple[int, str], tuple[int, int]]:
        table = pq.read_table(out / LIVE_TABLE).to_pylist()
        return {(r["minute"].minute, r["api_name"]): (r["requests"], r["errors"]) for r in table}

    write([record(i, at_us=M0 + i) for i in range(30)])
    query = follow(spark, str(capture), str(out), trigger_seconds=0.5)
    try:
        query.processAllAvailable()
        assert live() == {(14, "produce"): (30, 0)}
        write([record(100 + i, at_us=M0 + MINUTE_US + i, api_key=1, api_name="Fetch", error_code=1)
               for i in range(7)])
        query.processAllAvailable()
        assert live() == {(14, "produce"): (30, 0), (15, "fetch"): (7, 7)}
    finally:
        query.stop()


def test_local_driver_memory_is_a_quarter_of_the_machine_within_bounds() -> None:
    from kproxy.analysis.job import local_driver_memory

    assert local_driver_memory(16 << 30) == "4g"
    assert local_driver_memory(2 << 30) == "1g"
    assert local_driver_memory(256 << 30) == "8g"


def test_a_version_1_capture_is_read_beside_version_2(spark: Any, generated: tuple[Path, list[dict[str, Any]]],
                                                      tmp_path: Path) -> None:
    """Version 1 files (rule decisions without ``dry_run``, always empty) are read with today's
    schema beside version 2 ones: their records count, the faults table is the version 2 files'."""
    from kproxy.analysis.job import run_analysis

    v2 = arrow_schema()
    decision = v2.field("rule_decisions").type.value_type
    v1_decision = pa.struct([decision.field(i) for i in range(decision.num_fields)
                             if decision.field(i).name != "dry_run"])
    v1 = pa.schema([pa.field(f.name, pa.list_(v1_decision), nullable=f.nullable) if f.name == "rule_decisions"
                    else f for f in v2], metadata={b"kproxy.capture.schema_version": b"1"})
    old = tmp_path / "old" / "capture-v1.parquet"
    old.parent.mkdir()
    rows = [dict(record(i, at_us=M0 + i * 1000, connection_id="v1"), schema_version=1) for i in range(7)]
    pq.write_table(pa.Table.from_pylist(rows, schema=v1), old)
    result = run_analysis([str(old), str(generated[0])], tmp_path / "out", spark)
    assert result.problems == []
    assert result.records == len(generated[1]) + 7
    assert sum(r["requests"] for r in result.tables["faults"]) == 7  # 3 + 3 produce, 1 metadata: version 2's


def _corrupt_copy(good: Path, target: Path, column: str) -> Path:
    """``good`` copied to ``target`` with bytes flipped inside a data page of ``column``: the footer
    is intact (every check of it passes), the page is not."""
    data = bytearray(good.read_bytes())
    meta = pq.read_metadata(good).row_group(0)
    chunk = next(meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema == column)
    for i in range(chunk.data_page_offset + 25, chunk.data_page_offset + 60):
        data[i] ^= 0xFF
    target.write_bytes(bytes(data))
    return target


def test_a_file_with_a_corrupt_page_behind_a_valid_footer_is_named_and_left_out(
        spark: Any, generated: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    from kproxy.analysis.job import check_file, run_analysis

    good = sorted(generated[0].glob("hour=*/capture-*.parquet"))[0]
    bad = _corrupt_copy(good, tmp_path / "capture-corrupt.parquet", "broker_latency_ms")
    assert check_file(bad) is None  # the footer is sound
    with pytest.raises(OSError):
        pq.read_table(bad)  # the data is not
    result = run_analysis([str(bad), str(generated[0])], tmp_path / "out", spark)
    [problem] = result.problems
    assert problem.path == str(bad) and problem.reason.startswith("corrupt data: 0 of the "), problem
    assert result.records == len(generated[1])
    assert sum(r["requests"] for r in result.tables["latency_by_api"]) == len(generated[1])


@pytest.mark.parametrize("column", ["partitions.list.element.topic", "client_host"])
def test_a_corrupt_page_in_any_column_is_named_before_spark_starts(
        generated: tuple[Path, list[dict[str, Any]]], tmp_path: Path, column: str) -> None:
    """Every page of every column is decoded while the inputs are checked (no Spark here): a file with
    a corrupt page in a nested column, or in one the tables do not read, is named in one line and left
    out, so every pass reads the same files."""
    from kproxy.analysis.job import find_inputs

    good = sorted(generated[0].glob("hour=*/capture-*.parquet"))[0]
    bad = _corrupt_copy(good, tmp_path / "capture-corrupt.parquet", column)
    inputs = find_inputs([str(bad), str(good)])
    assert inputs.files == [str(good)]
    [problem] = inputs.problems
    assert problem.path == str(bad) and problem.reason.startswith("corrupt data: 0 of the "), problem
    assert str(problem).isprintable() and problem.reason.endswith("the file is left out"), problem


def test_the_tables_come_from_one_spark_job_per_pass(spark: Any, generated: tuple[Path, list[dict[str, Any]]],
                                                     tmp_path: Path) -> None:
    """Six passes over the records (the four of kproxy.analysis.report_tables, client anomalies' per
    connection and its connection closes per client id; none for batches sent again, as no producer here
    is idempotent), rolled up and written on the driver: no Spark job per table (the job ran 60 of them, a
    write and a collect per table), and none for ``faults`` when no rule acted."""
    from kproxy.analysis.job import run_analysis

    records = [r for r in generated[1] if not r["rule_decisions"]]
    directory = tmp_path / "no-rules"
    writer = CaptureWriter(directory, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600).start()
    for r in records:
        assert writer.offer(r)
    writer.close()
    context = spark.sparkContext
    context.setJobGroup("kproxy-jobs-per-pass", "counted")
    try:
        result = run_analysis([str(directory)], tmp_path / "out", spark)
    finally:
        context.setJobGroup(None, None)  # type: ignore[arg-type]
    assert result.records == len(records) and result.tables["faults"] == []
    jobs = context.statusTracker().getJobIdsForGroup("kproxy-jobs-per-pass")
    assert 6 <= len(jobs) <= 12, jobs  # a job per pass, and one more where Spark runs a shuffle as a job of its own
    assert pq.read_table(tmp_path / "out" / "faults").column_names == [
        "rule", "action", "dry_run", "api_name", "then", "requests", "median_delay_ms"]


def test_local_sessions_split_the_files_for_every_core(spark: Any) -> None:
    """At least four reads per core: ten files of one size made four splits on two cores (one core idle
    in every pass's last wave)."""
    from kproxy.analysis.spark_session import local_cores

    assert [local_cores(m) for m in ("local", "local[3]", "local[2, 4]", "spark://h:7077")] == [1, 3, 2, 1]
    assert local_cores("local[*]") == (os.cpu_count() or 1)
    assert spark.conf.get("spark.sql.files.minPartitionNum") == "8"  # the suite's session: local[2]


def test_plots_of_a_one_minute_capture_are_pngs() -> None:
    """Every plot renders from tables of one minute (the case whose time axis ran over years)."""
    from datetime import datetime

    from kproxy.analysis.plots import plots
    from kproxy.protocol.codes import error_class

    minute = datetime(2026, 9, 21, 14, 14)
    latency = {"time": minute, "requests": 10, "broker_p50_ms": 1.0, "broker_p99_ms": 2.0,
               "kproxy_p50_ms": 0.1, "kproxy_p99_ms": 0.2}
    tables = {"latency_over_time": [dict(latency, api_name="produce"), dict(latency, api_name="join_group")],
              "errors_over_time": [{"time": minute, "api_name": "join_group", "code": 79, "requests": 5}],
              "throughput": [{"time": minute, "api_name": api, "topic": "t", "records": 5, "bytes": 50}
                             for api in ("produce", "fetch")],
              "latency_by_api": [{"api_name": "produce", "request_bytes": 100, "response_bytes": 50}]}
    got = plots(tables, error_class)
    assert list(got) == ["latency", "error_rate", "throughput", "bytes_by_api"]
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in got.values())


def test_partial_minutes_are_shaded_and_legends_sit_below_the_lines() -> None:
    """A capture that began at 14:14:40 and ended at 14:16:05: its first and last minutes hold part
    of a minute's traffic each, and are shaded so their dips do not read as drops; legends are
    under the axes, where no line runs."""
    from datetime import datetime, timedelta

    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    from kproxy.analysis.plots import figures
    from kproxy.protocol.codes import error_class

    first, last = datetime(2026, 9, 21, 14, 14, 40), datetime(2026, 9, 21, 14, 16, 5)
    minutes = [first.replace(second=0) + timedelta(minutes=i) for i in range(3)]
    tables = {"throughput": [{"time": m, "api_name": api, "topic": t, "records": n, "bytes": n * 10}
                             for m, n in zip(minutes, (20, 60, 5), strict=True)
                             for api in ("produce", "fetch") for t in ("a", "b")]}
    fig = figures(tables, error_class, (first, last))["throughput"]
    try:
        fig.canvas.draw()
        for ax in fig.axes:
            shaded = sorted((round(p.get_x(), 6), round(p.get_x() + p.get_width(), 6)) for p in ax.patches)
            assert shaded == [(round(mdates.date2num(a), 6), round(mdates.date2num(b), 6)) for a, b in
                              ((minutes[0], minutes[1]), (minutes[2], minutes[2] + timedelta(minutes=1)))]
            legend = ax.get_legend()
            assert legend is not None
            assert legend.get_window_extent().y1 < ax.get_window_extent().y0, "the legend is below the axes"
    finally:
        plt.close(fig)
    whole = figures(tables, error_class, (minutes[0], minutes[2] + timedelta(seconds=59)))["throughput"]
    try:
        assert len(whole.axes[0].patches) == 1, "a capture that began on the minute: only its last is partial"
    finally:
        plt.close(whole)
