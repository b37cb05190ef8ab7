"""Analysis benchmark: the Spark job on local[2] beside the same aggregation in plain pyarrow on one core.

    .venv/bin/python bench/bench_analysis.py [--records 1000000 10000000] [--repeats 3] [--dir DIR] [--job]

Generates capture files of N records (Produce, Fetch, Metadata, Heartbeat with
log-normal broker latencies, 50 topics of 12 partitions, 1 % of Produce
partitions failing), then times, side by side, on the same files:

* Spark (``local[2]``): latency percentiles per api (exact up to the job's
  ``EXACT_PERCENTILES_MAX`` records, ``percentile_approx`` above, as
  ``kproxy analyze`` decides), error counts by api and code, and
  Produce/Fetch throughput per topic per minute, with the job's own
  :func:`kproxy.analysis.job.aggregates`;
* pyarrow on one core (``pa.set_cpu_count(1)``): the same three aggregates,
  numpy's exact percentiles.

With ``--job``: ``kproxy analyze``'s whole job (inputs checked, every table computed,
written as Parquet and collected, the HTML report and its plots written) beside plain Spark
doing the four aggregations the report is about (per-api latency percentiles, bytes and
count; errors by api and code; top topics by bytes; bytes per topic per minute, collected).
Each run is a fresh process with its own Spark JVM (``local[2]``, kproxy analyze's session
and default driver memory for both), the two in turn, the order alternating every round,
over the same files (``--dir``: generated once, reused while whole). Timed from after
Spark's start to the end of the work: wall seconds, CPU seconds of the process and its JVM
(steadier than wall time on a shared machine), and the peak resident memory of the process
tree (sampled every 0.2 s from /proc, start-up included). Ratios are taken within a round.
Both runs' figures are checked to agree (requests per api, errors, bytes).

Before timing, both results are checked to agree (approximate percentiles:
within the job's stated rank error of numpy's exact ones). Prints a Markdown table
(wall seconds, records/s, records/s per core) for docs/PERFORMANCE.md. Spark's
JVM start-up is timed apart (once), not in the per-run figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from _util import fmt_rate, machine_line, table

from kproxy.capture.record_schema import COLUMNS, SCHEMA_VERSION
from kproxy.capture.writer import arrow_schema

APIS = [("Produce", 0, 0.45), ("Fetch", 1, 0.45), ("Metadata", 3, 0.05), ("Heartbeat", 12, 0.05)]
TOPICS, PARTITIONS = 50, 12
ROWS_PER_FILE = 1_000_000
T0_US = 1_790_000_040_000_000
PERCENTILES = (0.5, 0.95, 0.99)


def generate(directory: Path, records: int, seed: int = 7) -> list[str]:
    """Capture files of ``records`` made-up records (vectorised: numpy, not one dict per record)."""
    rng = np.random.default_rng(seed)
    schema = arrow_schema()
    files = []
    for start in range(0, records, ROWS_PER_FILE):
        n = min(ROWS_PER_FILE, records - start)
        pick = rng.choice(len(APIS), size=n, p=[w for _, _, w in APIS])
        names = np.array([a for a, _, _ in APIS], dtype=object)[pick]
        keys = np.array([k for _, k, _ in APIS], dtype=np.int16)[pick]
        moves = (pick <= 1)
        # One partition entry per Produce/Fetch request; none for the others.
        offsets = np.concatenate([[0], np.cumsum(moves)]).astype(np.int32)
        m = int(moves.sum())
        topic = rng.integers(0, TOPICS, size=m)
        partition = rng.integers(0, PARTITIONS, size=m).astype(np.int32)
        count = rng.integers(1, 500, size=m).astype(np.int64)
        failed = (rng.random(m) < 0.01) & (names[moves] == "Produce")
        # Every answered Produce and Fetch entry carries its partition's end (schema version 3), as a
        # capture's do: a high watermark that grows (its values do not matter here, their cost does).
        watermark = pa.array(np.where(failed, -1, start + np.cumsum(count)), mask=failed)
        item_fields = list(schema.field("partitions").type.value_type)
        known = {"topic": pa.array(np.char.add("topic-", topic.astype(str)).astype(object)),
                 "partition": pa.array(partition), "error_code": pa.array(np.where(failed, 6, 0).astype(np.int16)),
                 "record_count": pa.array(count), "record_bytes": pa.array(count * 100), "high_watermark": watermark}
        # Item fields this generator does not make up (group offsets, write times) are null, by name, so a
        # field the schema gains is null here rather than a misplaced array.
        entries = pa.StructArray.from_arrays([known.get(f.name, pa.nulls(m, f.type)) for f in item_fields],
                                             fields=item_fields)
        parts = pa.ListArray.from_arrays(pa.array(offsets), entries)
        moved_count = np.zeros(n, dtype=np.int64)
        moved_count[moves] = count
        columns: dict[str, Any] = {
            "schema_version": pa.array(np.full(n, SCHEMA_VERSION, dtype=np.int16)),
            "request_time": pa.array(T0_US + start * 1000 + np.arange(n, dtype=np.int64) * 1000,
                                     type=pa.timestamp("us", tz="UTC")),
            "connection_id": pa.array(np.char.add("c", (rng.integers(0, 200, size=n)).astype(str)).astype(object)),
            "client_host": pa.array(["10.0.0.1"] * n),
            "client_id": pa.array(np.char.add("client-", (rng.integers(0, 30, size=n)).astype(str)).astype(object)),
            "listener": pa.array(["broker-1"] * n),
            "api_key": pa.array(keys), "api_name": pa.array(names.astype(object)),
            "api_version": pa.array(np.full(n, 9, dtype=np.int16)),
            "correlation_id": pa.array(np.arange(n, dtype=np.int32)),
            "request_bytes": pa.array(rng.integers(50, 100_000, size=n)),
            "response_bytes": pa.array(rng.integers(50, 100_000, size=n)),
            "broker_latency_ms": pa.array(rng.lognormal(0.5, 1.0, size=n)),
            "kproxy_latency_ms": pa.array(rng.lognormal(-4.0, 0.5, size=n)),
            "local_response": pa.array(np.zeros(n, dtype=bool)),
            "record_count": pa.array(moved_count), "record_bytes": pa.array(moved_count * 100),
            "partitions": parts,
            "rule_decisions": pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array(
                [], type=schema.field("rule_decisions").type.value_type)),
        }
        arrays = [columns[c.name] if c.name in columns else pa.nulls(n, schema.field(c.name).type) for c in COLUMNS]
        path = directory / f"capture-{start // ROWS_PER_FILE:06d}.parquet"
        pq.write_table(pa.Table.from_arrays(arrays, schema=schema), path, compression="zstd")
        files.append(str(path))
    return files


# -- the same aggregation, plain pyarrow, one core ------------------------------------------------
def pyarrow_aggregate(files: list[str]) -> dict[str, Any]:
    t = pq.read_table(files, columns=["api_name", "request_time", "broker_latency_ms", "kproxy_latency_ms",
                                      "error_code", "partitions"])
    latency = {}
    api = t.column("api_name").to_numpy(zero_copy_only=False)
    broker = t.column("broker_latency_ms").to_numpy(zero_copy_only=False)
    kproxy = t.column("kproxy_latency_ms").to_numpy(zero_copy_only=False)
    order = np.argsort(api, kind="stable")
    names, starts = np.unique(api[order], return_index=True)
    bounds = [*starts[1:], len(order)]
    for name, lo, hi in zip(names, starts, bounds, strict=True):
        idx = order[lo:hi]
        b = broker[idx]
        b = b[~np.isnan(b.astype(float))]
        latency[_snake(name)] = (hi - lo, *np.percentile(b.astype(float), [p * 100 for p in PERCENTILES]), b.max(),
                         *np.percentile(kproxy[idx].astype(float), [p * 100 for p in PERCENTILES]))
    parents = pc.list_parent_indices(t.column("partitions"))
    flat = pc.list_flatten(t.column("partitions"))
    entries = pa.table({
        "api_name": pc.take(t.column("api_name"), parents),
        "minute": pc.floor_temporal(pc.take(t.column("request_time"), parents), unit="minute"),
        "topic": pc.struct_field(flat, "topic"), "code": pc.struct_field(flat, "error_code"),
        "records": pc.struct_field(flat, "record_count"), "bytes": pc.struct_field(flat, "record_bytes")})
    throughput = entries.group_by(["minute", "api_name", "topic"]).aggregate([("records", "sum"), ("bytes", "sum")])
    errors = (entries.filter(pc.not_equal(entries.column("code"), 0))
              .group_by(["api_name", "code"]).aggregate([("records", "count")]))
    return {"latency": latency, "throughput_rows": throughput.num_rows,
            "throughput_records": pc.sum(throughput.column("records_sum")).as_py(),
            "errors": {(_snake(r["api_name"]), r["code"]): r["records_count"] for r in errors.to_pylist()}}


def spark_aggregate(spark: Any, files: list[str], exact: bool) -> dict[str, Any]:
    from kproxy.analysis.job import aggregates, table_rows
    from kproxy.analysis.spark_schema import spark_schema

    df = spark.read.schema(spark_schema()).parquet(*files)
    aggs = aggregates(df, exact=exact)[0]
    latency = {r["api_name"]: (r["requests"], r["broker_p50_ms"], r["broker_p95_ms"], r["broker_p99_ms"],
                               r["broker_max_ms"], r["kproxy_p50_ms"], r["kproxy_p95_ms"], r["kproxy_p99_ms"])
               for r in table_rows(aggs["latency_by_api"])}
    throughput = table_rows(aggs["throughput"])
    errors = {(r["api_name"], r["code"]): r["requests"] for r in table_rows(aggs["errors"])}
    return {"latency": latency, "throughput_rows": len(throughput),
            "throughput_records": sum(r["records"] for r in throughput), "errors": errors}


# -- the whole job beside plain Spark doing the same four aggregations (--job) ----------------------
def plain_spark(spark: Any, files: list[str], exact: bool) -> dict[str, Any]:
    """What a person writes in plain Spark for the report's core: per-api latency percentiles, bytes
    and count; errors by api and code; top topics by bytes; bytes per topic per minute. Collected;
    returns the figures :func:`figures_agree` compares with the job's."""
    from pyspark.sql import functions as F

    from kproxy.analysis.job import percentile

    df = spark.read.parquet(*files)
    latency = df.groupBy("api_name").agg(
        F.count(F.lit(1)).alias("requests"), F.sum(F.col("request_bytes") + F.col("response_bytes")).alias("bytes"),
        *(percentile(c, p, exact) for c in ("broker_latency_ms", "kproxy_latency_ms") for p in PERCENTILES))
    parts = df.select("api_name", "request_time", F.explode("partitions").alias("p"))
    errors = parts.where(F.col("p.error_code") != 0).groupBy("api_name", F.col("p.error_code")).count()
    topics = parts.groupBy(F.col("p.topic")).agg(F.sum("p.record_bytes").alias("bytes")).orderBy(
        F.desc("bytes")).limit(20)
    minute = parts.groupBy(F.date_trunc("minute", "request_time"), F.col("p.topic")).agg(
        F.sum("p.record_bytes").alias("bytes"))
    got = {name: frame.collect() for name, frame in
           (("latency", latency), ("errors", errors), ("topics", topics), ("minute", minute))}
    return {"requests": {_snake(r["api_name"]): r["requests"] for r in got["latency"]},
            "errors": sorted([_snake(r["api_name"]), r["error_code"], r["count"]] for r in got["errors"]),
            "topic_bytes": {r["topic"]: r["bytes"] for r in got["topics"]},
            "minute_bytes": sum(r["bytes"] for r in got["minute"])}


def _snake(name: str) -> str:
    import re

    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def kproxy_job(spark: Any, files: list[str], out: Path, exact_max: int) -> dict[str, Any]:
    """``kproxy analyze``'s whole job but Spark's start: inputs checked, every table computed, written
    as Parquet and collected, the report (HTML, plots) and summary written. Returns the figures
    :func:`figures_agree` compares with plain Spark's."""
    import io

    from kproxy.analysis.job import run_analysis
    from kproxy.analysis.report import summary, write_html

    analysis = run_analysis(files, out, spark, exact_percentiles_max=exact_max)
    write_html(analysis, str(out / "report.html"))
    summary(analysis, io.StringIO())
    t = analysis.tables
    return {"requests": {r["api_name"]: r["requests"] for r in t["latency_by_api"]},
            "errors": sorted([r["api_name"], r["code"], r["requests"]] for r in t["errors"]),
            "topic_bytes": {r["topic"]: r["produced_bytes"] + r["fetched_bytes"] for r in t["top_topics"]},
            "minute_bytes": sum(r["bytes"] for r in t["throughput"])}


def figures_agree(job: dict[str, Any], plain: dict[str, Any]) -> None:
    """The job and plain Spark counted the same (generated captures: one partition entry per Produce or
    Fetch request, so requests with an error code are entries with it; every topic is in both top lists
    or the bytes of those in both agree)."""
    assert job["requests"] == plain["requests"], (job["requests"], plain["requests"])
    assert job["errors"] == plain["errors"], (job["errors"], plain["errors"])
    assert job["minute_bytes"] == plain["minute_bytes"], (job["minute_bytes"], plain["minute_bytes"])
    both = job["topic_bytes"].keys() & plain["topic_bytes"].keys()
    assert both and all(job["topic_bytes"][k] == plain["topic_bytes"][k] for k in both)


def _tree(root: int) -> tuple[int, float]:
    """Resident bytes and CPU seconds (user + system) of ``root`` and every process under it (/proc)."""
    children: dict[int, list[int]] = {}
    stat: dict[int, tuple[int, float]] = {}
    page, tick = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        stat[int(entry)] = (int(fields[21]) * page, (int(fields[11]) + int(fields[12])) / tick)
    rss, cpu, todo = 0, 0.0, [root]
    while todo:
        pid = todo.pop()
        r, c = stat.get(pid, (0, 0.0))
        rss, cpu = rss + r, cpu + c
        todo += children.get(pid, [])
    return rss, cpu


def one_run(kind: str, directory: Path, out: Path) -> None:
    """In a process of its own (--one): the job or plain Spark over ``directory``'s files; prints one
    JSON line: wall and CPU seconds (this process and its JVM) from after Spark's start, the figures."""
    import json

    from kproxy.analysis.arguments import EXACT_PERCENTILES_MAX
    from kproxy.analysis.job import spark_session

    files = sorted(str(p) for p in directory.glob("capture-*.parquet"))
    started = time.perf_counter()
    spark = spark_session("local[2]")
    try:
        startup = time.perf_counter() - started
        cpu = _tree(os.getpid())[1]
        t = time.perf_counter()
        if kind == "job":
            out.mkdir(parents=True, exist_ok=True)
            got = kproxy_job(spark, files, out, EXACT_PERCENTILES_MAX)
        else:
            got = plain_spark(spark, files, len(files) * ROWS_PER_FILE <= EXACT_PERCENTILES_MAX)
        seconds, cpu = time.perf_counter() - t, _tree(os.getpid())[1] - cpu
        print(json.dumps({"seconds": seconds, "cpu": cpu, "startup": startup, "figures": got}), flush=True)
    finally:
        spark.stop()


def _generated(directory: Path, n: int) -> list[str]:
    """The capture of ``n`` records under ``directory``: reused when its files are there whole (the
    generator is seeded: the same records), else generated."""
    files = sorted(str(p) for p in directory.glob("capture-*.parquet"))
    try:
        if len(files) == -(-n // ROWS_PER_FILE) and sum(pq.read_metadata(f).num_rows for f in files) == n:
            return files
    except (OSError, ValueError):
        pass
    for f in files:
        os.unlink(f)
    return generate(directory, n)


def job_side_by_side(base: Path, records: list[int], repeats: int) -> tuple[list[list[str]], list[list[str]]]:
    """Each run in a fresh process (its own Spark JVM, kproxy analyze's default settings, local[2]),
    the job and plain Spark in turn, the order alternating every round, over the same files. Returns
    the per-round rows and the summary rows (medians; ratios within a round)."""
    import json
    import subprocess

    rounds, summary = [], []
    for n in records:
        directory = base / f"n{n}"
        directory.mkdir(parents=True, exist_ok=True)
        _generated(directory, n)
        got: dict[str, list[dict[str, Any]]] = {"job": [], "plain": []}
        ratios: list[tuple[float, float, float]] = []
        for r in range(repeats):
            order = ("job", "plain") if r % 2 == 0 else ("plain", "job")
            this: dict[str, dict[str, Any]] = {}
            for kind in order:
                load = os.getloadavg()[0]
                child = subprocess.Popen([sys.executable, __file__, "--one", kind, "--dir", str(directory)],
                                         stdout=subprocess.PIPE, text=True)
                peak = 0
                while child.poll() is None:
                    peak = max(peak, _tree(child.pid)[0])
                    time.sleep(0.2)
                lines = child.stdout.read().strip().splitlines() if child.stdout else []
                if child.returncode != 0 or not lines:
                    raise SystemExit(f"{kind} run failed (exit {child.returncode})")
                this[kind] = dict(json.loads(lines[-1]), peak=peak, load=load)
                got[kind].append(this[kind])
                rounds.append([f"{n:,}", str(r + 1), kind, f"{this[kind]['seconds']:.1f}", f"{this[kind]['cpu']:.1f}",
                               f"{peak / 2**30:.2f}", f"{this[kind]['startup']:.1f}", f"{load:.1f}"])
                print(" | ".join(rounds[-1]), file=sys.stderr, flush=True)
            figures_agree(this["job"]["figures"], this["plain"]["figures"])
            ratios.append(tuple(this["job"][k] / this["plain"][k] for k in ("seconds", "cpu", "peak")))  # type: ignore[arg-type]
        med = {kind: {k: statistics.median(x[k] for x in runs) for k in ("seconds", "cpu", "peak")}
               for kind, runs in got.items()}
        summary.append([f"{n:,}", str(repeats), f"{med['job']['seconds']:.1f}", f"{med['plain']['seconds']:.1f}",
                        f"{statistics.median(x[0] for x in ratios):.2f}x ({min(x[0] for x in ratios):.2f}-"
                        f"{max(x[0] for x in ratios):.2f})",
                        f"{med['job']['cpu']:.1f}", f"{med['plain']['cpu']:.1f}",
                        f"{statistics.median(x[1] for x in ratios):.2f}x",
                        f"{med['job']['peak'] / 2**30:.2f}", f"{med['plain']['peak'] / 2**30:.2f}",
                        f"{statistics.median(x[2] for x in ratios):.2f}x"])
    return rounds, summary


def agree(a: dict[str, Any], b: dict[str, Any], files: list[str] | None) -> None:
    """``a`` (Spark) agrees with ``b`` (pyarrow); ``files`` given: ``a``'s percentiles are approximate,
    each checked to be within the job's stated relative error of the exact value ranked ceil(p * n)
    (numpy over ``files``)."""
    assert a["throughput_rows"] == b["throughput_rows"], (a["throughput_rows"], b["throughput_rows"])
    assert a["throughput_records"] == b["throughput_records"]
    assert a["errors"] == b["errors"], (a["errors"], b["errors"])
    assert a["latency"].keys() == b["latency"].keys()
    if files is None:
        for api, values in a["latency"].items():
            assert np.allclose(values, b["latency"][api], rtol=1e-9), (api, values, b["latency"][api])
        return
    from kproxy.analysis.log_histogram import RELATIVE_ERROR

    t = pq.read_table(files, columns=["api_name", "broker_latency_ms", "kproxy_latency_ms"])
    api = t.column("api_name").to_numpy(zero_copy_only=False)
    names, index = np.unique(api, return_inverse=True)
    api = np.array([_snake(n) for n in names])[index]  # as the job names them
    for name, values in a["latency"].items():
        exact = b["latency"][name]
        assert values[0] == exact[0] and values[4] == exact[4], (name, values, exact)  # requests, max
        for column, got in (("broker_latency_ms", values[1:4]), ("kproxy_latency_ms", values[5:8])):
            col = t.column(column).to_numpy(zero_copy_only=False)[api == name].astype(float)
            col = np.sort(col[~np.isnan(col)])
            for p, value in zip(PERCENTILES, got, strict=True):
                want = col[max(1, int(np.ceil(p * len(col)))) - 1]
                assert abs(value - want) <= RELATIVE_ERROR * abs(want) + 1e-9, (name, column, p, value, want)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="where to generate the captures (default: a temporary directory)")
    parser.add_argument("--driver-memory",
                        help="Spark driver memory (local mode: the executors' too; default: kproxy analyze's, "
                             "a quarter of the machine's memory within 1-8 GiB)")
    parser.add_argument("--job", action="store_true",
                        help="kproxy analyze's whole job beside plain Spark's same four aggregations instead, "
                             "each run in a fresh process, order alternating: time, CPU and peak memory")
    parser.add_argument("--one", choices=("job", "plain"), help=argparse.SUPPRESS)  # a --job child
    args = parser.parse_args()
    if args.one:
        one_run(args.one, args.dir, args.dir / "out")
        return
    if args.job:
        base = args.dir or Path(tempfile.mkdtemp(prefix="kproxy-bench-analysis-"))
        started = machine_line()
        try:
            rounds, rows = job_side_by_side(base, args.records, args.repeats)
        finally:
            if args.dir is None:
                shutil.rmtree(base, ignore_errors=True)
        print(f"start: {started}\nend:   {machine_line()}\n")
        print(table(["records", "round", "run", "wall s", "CPU s", "peak RSS GiB", "Spark start s (not counted)",
                     "load at start"], rounds))
        print()
        print(table(["records", "rounds", "job s", "plain s", "job / plain time (range)", "job CPU s",
                     "plain CPU s", "job / plain CPU", "job peak RSS GiB", "plain peak RSS GiB",
                     "job / plain RSS"], rows))
        return
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    from kproxy.analysis.job import EXACT_PERCENTILES_MAX, spark_session

    t = time.perf_counter()
    spark = spark_session("local[2]", [("spark.driver.memory", args.driver_memory)] if args.driver_memory else [])
    spark.sparkContext.setLogLevel("ERROR")
    startup = time.perf_counter() - t
    base = args.dir or Path(tempfile.mkdtemp(prefix="kproxy-bench-analysis-"))
    rows = []
    try:
        for n in args.records:
            directory = base / f"n{n}"
            directory.mkdir(parents=True, exist_ok=True)
            t = time.perf_counter()
            files = generate(directory, n)
            gen = time.perf_counter() - t
            exact = n <= EXACT_PERCENTILES_MAX
            agree(spark_aggregate(spark, files, exact), pyarrow_aggregate(files), None if exact else files)
            spark_times, arrow_times = [], []
            for r in range(args.repeats):  # side by side, order alternating
                for label in (("spark", "arrow") if r % 2 == 0 else ("arrow", "spark")):
                    t = time.perf_counter()
                    spark_aggregate(spark, files, exact) if label == "spark" else pyarrow_aggregate(files)
                    (spark_times if label == "spark" else arrow_times).append(time.perf_counter() - t)
            s, a = statistics.median(spark_times), statistics.median(arrow_times)
            size = sum(os.path.getsize(f) for f in files)
            rows.append([f"{n:,}", "exact" if exact else "approx", f"{size / 1e6:.0f} MB", f"{s:.2f}",
                         fmt_rate(n / s), fmt_rate(n / s / 2),
                         f"{a:.2f}", fmt_rate(n / a), f"{a / s:.2f}x", f"{gen:.1f}"])
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)  # each size as it is done
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print(machine_line())
    print(f"Spark JVM and session start-up (once, not in the figures): {startup:.1f} s\n")
    print(table(["records", "percentiles", "parquet", "Spark local[2] s", "records/s", "records/s per core",
                 "pyarrow 1 core s", "records/s (1 core)", "Spark speed-up", "generate s"], rows))


if __name__ == "__main__":
    main()
