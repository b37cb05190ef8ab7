"""The analysis job: capture files in, Parquet aggregates and a report out.

``run_analysis(inputs, out, spark)`` reads capture files (local paths, checked
file by file first, or any URI Spark reads), computes the aggregates below
with Spark, writes each as Parquet under ``out/<name>/`` and returns them
collected (they are small: per api, per minute, per top-N) for the report.

Aggregates (times are UTC; a minute is ``date_trunc('minute', request_time)``):

* ``latency_by_api`` / ``latency_by_minute``: requests and p50/p95/p99/max of
  broker and kproxy latency, per api (and minute). Percentiles are exact up to
  ``exact_percentiles_max`` records (default :data:`EXACT_PERCENTILES_MAX`):
  Spark's ``percentile`` (linear interpolation between closest ranks, numpy's
  default), which keeps every distinct value of a group in memory (10 million
  records ran a 4 GiB driver out of heap; 2 million took 261 s on local[2]
  where 3 million approximate took 14 s). Above that, ``percentile_approx``
  with accuracy :data:`APPROX_ACCURACY`: a value of the group whose rank is
  within ``n / APPROX_ACCURACY`` of the exact one (``n``: the group's size), in
  bounded memory. Broker latency ignores requests without one (local answers,
  acks=0).
* ``errors``: per api and error code, the requests whose response carried that
  code (top level or in any partition) and their share of the api's requests.
* ``top_clients`` / ``top_topics``: requests, bytes, records and requests with
  an error, by client id and by topic.
* ``throughput``: Produce and Fetch records and bytes per topic per minute.
* ``hot_partitions``: topic-partitions by records and bytes moved.
* ``connection_churn``: per minute, connections first and last seen.
* ``faults``: per rule, action and dry run (``rule_decisions``: what the
  proxy's rules did, each action counted as ``kproxy_rule_hits_total`` counts
  it), the requests it acted on per api, and what the client did next on that
  connection: ``retried`` (its next request was the same api), ``other``
  (another api), ``connection_ended`` (it sent nothing more there: closed, or
  reconnected elsewhere); with the median time to that next request.
* ``whatif_*`` (with ``rules``): what a rule file would have done to these
  records, evaluated by the proxy's own rule engine (:mod:`kproxy.analysis.whatif`).

Bad input never stops the rest: a missing path, a file that is not Parquet (or
is cut short), a file of another schema version are each reported with the file
and the reason (:class:`InputProblem`), and the readable files are analysed.
Those checks read each local file's footer, before Spark starts. A file whose
footer is sound but whose data is not (a corrupt page) is found as Spark reads
it: Spark skips what it cannot read (``spark.sql.files.ignoreCorruptFiles``),
the records read per file are compared with the file's footer, and a file that
came up short is left out whole and named. The input is read once, into Spark's
cache, so every table sees the same records. (Remote inputs have no footer
checked here: Spark skips what it cannot read of them, unnamed.)
"""

from __future__ import annotations

import glob
import os
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from kproxy.analysis import whatif
from kproxy.analysis.arguments import EXACT_PERCENTILES_MAX
from kproxy.analysis.schema import snake_api_name, spark_schema
from kproxy.analysis.session import local_driver_memory as local_driver_memory  # re-exported: where callers found it
from kproxy.analysis.session import ship_kproxy
from kproxy.analysis.session import spark_session as spark_session  # re-exported: where callers found it
from kproxy.analysis.whatif import WhatIf, WhatIfRules
from kproxy.capture.schema import READABLE_VERSIONS, SchemaVersionError, check_version, version_support

PERCENTILES = (0.5, 0.95, 0.99)
APPROX_ACCURACY = 10_000  # percentile_approx's accuracy: rank error at most 1/10,000 of a group
TOP_N = 20
PARQUET_MAGIC = b"PAR1"
FILE_COLUMN = "_file"  # read_captures: the file a record came from (Spark's input_file_name, a URI)
# The columns aggregates() reads (the what-if adds its own): the rest of a record is not cached.
_ANALYSED = ("api_name", "request_time", "response_time", "connection_id", "correlation_id", "client_id",
             "request_bytes", "response_bytes", "broker_latency_ms", "kproxy_latency_ms", "error_code",
             "record_count", "partitions", "rule_decisions", FILE_COLUMN)


@dataclass(frozen=True)
class InputProblem:
    """One input that was left out, and why."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class Inputs:
    files: list[str] = field(default_factory=list)  # local capture files that passed the checks
    rows: dict[str, int] = field(default_factory=dict)  # local file -> records its footer counts
    uris: list[str] = field(default_factory=list)  # directories/files Spark reads itself (remote)
    problems: list[InputProblem] = field(default_factory=list)


@dataclass
class Analysis:
    """Every aggregate, collected as lists of row dicts, plus what was read and left out."""

    records: int
    files: int
    first: Any
    last: Any
    problems: list[InputProblem]
    tables: dict[str, list[dict[str, Any]]]
    out: str = ""  # where the Parquet aggregates were written
    exact_percentiles: bool = True  # False: percentile_approx (more than exact_percentiles_max records)
    whatif: WhatIf | None = None  # how a --rules what-if ran (its tables are in ``tables``, whatif_*)


# -- inputs ----------------------------------------------------------------------------------
def find_inputs(paths: Sequence[str]) -> Inputs:
    """Expand and check the inputs: local directories are searched for capture files, and each
    local file's Parquet footer and schema version are checked before Spark sees it."""
    found = Inputs()
    for raw in paths:
        if "://" in raw and not raw.startswith("file://"):
            found.uris.append(raw)
            continue
        path = Path(raw.removeprefix("file://"))
        if not path.exists():
            found.problems.append(InputProblem(raw, "no such file or directory"))
            continue
        if path.is_dir():
            files = sorted(Path(p) for p in glob.glob(str(path / "**" / "capture-*.parquet"), recursive=True))
            if not files:
                found.problems.append(InputProblem(raw, "no capture files (capture-*.parquet) under it"))
                continue
        else:
            files = [path]
        for file in files:
            footer = read_footer(file)
            if isinstance(footer, InputProblem):
                found.problems.append(footer)
            else:
                found.files.append(str(file))
                found.rows[str(file)] = footer
    return found


def check_file(path: Path) -> InputProblem | None:
    """None if ``path`` is a complete Parquet file of a capture schema version this kproxy reads;
    else why not."""
    footer = read_footer(path)
    return footer if isinstance(footer, InputProblem) else None


def read_footer(path: Path) -> InputProblem | int:
    """The records of ``path`` as its footer counts them, if it is a complete Parquet file of a
    capture schema version this kproxy reads; else why not."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4))
            tail = f.read(4)
    except OSError as exc:
        return InputProblem(str(path), f"cannot read: {exc.strerror or exc}")
    if size < 12 or head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
        return InputProblem(str(path), "not a complete Parquet file (no PAR1 magic at both ends: cut short, "
                                       "or another format)")
    import pyarrow.parquet as pq  # the analysis extra carries pyarrow: the footer check before Spark reads

    try:
        footer = pq.read_metadata(path)
    except (OSError, ValueError) as exc:  # pyarrow: ArrowInvalid is a ValueError, ArrowIOError an OSError
        return InputProblem(str(path), f"unreadable Parquet footer: {exc}")
    try:
        check_version(footer.metadata, str(path))
    except SchemaVersionError as exc:
        return InputProblem(str(path), str(exc).removeprefix(f"{path}: "))
    return int(footer.num_rows)


def read_captures(spark: SparkSession, inputs: Inputs) -> DataFrame | None:
    """All readable records as one DataFrame (None if there are none), each with the file it
    came from (:data:`FILE_COLUMN`); remote inputs whose ``schema_version`` column is not one
    this kproxy reads are reported in ``inputs.problems`` and left out."""
    schema = spark_schema()
    frames: list[DataFrame] = []
    if inputs.files:
        frames.append(spark.read.schema(schema).parquet(*inputs.files).withColumn(FILE_COLUMN, F.input_file_name()))
    if inputs.uris:
        remote = (spark.read.schema(schema).option("recursiveFileLookup", "true")
                  .option("pathGlobFilter", "capture-*.parquet").parquet(*inputs.uris)
                  .withColumn(FILE_COLUMN, F.input_file_name()))
        readable = F.col("schema_version").isin(*READABLE_VERSIONS)
        wrong = (remote.where(~readable)
                 .select(F.input_file_name().alias("file"), "schema_version").distinct().collect())
        for row in wrong:
            inputs.problems.append(InputProblem(row["file"], f"capture schema version {row['schema_version']}, "
                                                             f"{version_support()}"))
        frames.append(remote.where(readable))
    if not frames:
        return None
    df = frames[0]
    for more in frames[1:]:
        df = df.unionByName(more)
    return df.withColumn("api_name", snake_api_name())  # the metrics' spelling, in every table


# -- aggregates ------------------------------------------------------------------------------
def percentile(column: str, p: float, exact: bool) -> Any:
    """The ``p`` percentile of ``column``: exact, or ``percentile_approx`` (see the module docstring)."""
    return F.percentile(column, p) if exact else F.percentile_approx(column, p, APPROX_ACCURACY)


def _latency(exact: bool) -> list[Any]:
    cols: list[Any] = [F.count(F.lit(1)).alias("requests")]
    for name, column in (("broker", "broker_latency_ms"), ("kproxy", "kproxy_latency_ms")):
        for p in PERCENTILES:
            cols.append(percentile(column, p, exact).alias(f"{name}_p{round(p * 100)}_ms"))
        cols.append(F.max(column).alias(f"{name}_max_ms"))
    return cols


def _error_codes(df: DataFrame) -> DataFrame:
    """One row per (request, distinct non-zero error code of its response)."""
    partition_codes = F.transform(F.col("partitions"), lambda p: p["error_code"])
    codes = F.array_distinct(F.filter(F.concat(F.array(F.col("error_code")), partition_codes),
                                      lambda c: c.isNotNull() & (c != 0)))
    return df.select("api_name", "request_time", F.explode(codes).alias("code"))


def aggregates(df: DataFrame, *, exact: bool = True) -> dict[str, DataFrame]:
    """Every aggregate of the report, as (lazy) DataFrames; ``exact``: exact percentiles, else approximate."""
    minute = F.date_trunc("minute", F.col("request_time")).alias("minute")
    has_error = (F.coalesce(F.col("error_code"), F.lit(0)) != 0) | F.exists(
        F.col("partitions"), lambda p: F.coalesce(p["error_code"], F.lit(0)) != 0)
    df = df.withColumn("has_error", has_error).withColumn(
        "bytes", F.col("request_bytes") + F.coalesce(F.col("response_bytes"), F.lit(0)))
    out: dict[str, DataFrame] = {}
    out["latency_by_api"] = (df.groupBy("api_name")
                             .agg(*_latency(exact), F.sum("request_bytes").alias("request_bytes"),
                                  F.sum(F.coalesce(F.col("response_bytes"), F.lit(0))).alias("response_bytes"))
                             .orderBy(F.desc("requests")))
    out["latency_by_minute"] = df.groupBy(minute, "api_name").agg(*_latency(exact)).orderBy("minute", "api_name")

    per_api = df.groupBy("api_name").agg(F.count(F.lit(1)).alias("api_requests"))
    codes = _error_codes(df)
    errors = codes.groupBy("api_name", "code").agg(F.count(F.lit(1)).alias("requests"))
    out["errors"] = (errors.join(per_api, "api_name")
                     .withColumn("rate", F.col("requests") / F.col("api_requests"))
                     .orderBy(F.desc("requests"), "api_name", "code"))
    out["errors_by_minute"] = (codes.groupBy(F.date_trunc("minute", "request_time").alias("minute"), "api_name",
                                             "code")
                               .agg(F.count(F.lit(1)).alias("requests")).orderBy("minute", "api_name", "code"))

    out["top_clients"] = (df.groupBy(F.coalesce(F.col("client_id"), F.lit("")).alias("client_id"))
                          .agg(F.count(F.lit(1)).alias("requests"), F.sum("bytes").alias("bytes"),
                               F.sum("record_count").alias("records"),
                               F.sum(F.col("has_error").cast("long")).alias("errors"),
                               F.countDistinct("connection_id").alias("connections"))
                          .orderBy(F.desc("requests"), "client_id").limit(TOP_N))

    parts = df.select("api_name", "request_time", "connection_id", "correlation_id",
                      F.explode("partitions").alias("p"))
    parts = parts.select("api_name", "request_time", "connection_id", "correlation_id", F.col("p.topic").alias("topic"),
                         F.col("p.partition").alias("partition"), F.col("p.error_code").alias("error_code"),
                         F.col("p.record_count").alias("records"), F.col("p.record_bytes").alias("record_bytes"))
    parts = parts.where(F.col("topic").isNotNull())
    # Requests naming each topic: one row per (request, distinct topic), counted (no distinct
    # aggregation over every partition entry); records and bytes produced and fetched apart (a record
    # produced then fetched is not two records).
    topics = df.select(F.explode(F.array_distinct(F.transform(F.col("partitions"), lambda p: p["topic"])))
                       .alias("topic")).where(F.col("topic").isNotNull())
    per_topic = topics.groupBy("topic").agg(F.count(F.lit(1)).alias("requests"))
    produced, fetched = F.col("api_name") == "produce", F.col("api_name") == "fetch"
    moved_per_topic = parts.groupBy("topic").agg(
        F.sum(F.when(produced, F.col("records")).otherwise(0)).alias("produced_records"),
        F.sum(F.when(produced, F.col("record_bytes")).otherwise(0)).alias("produced_bytes"),
        F.sum(F.when(fetched, F.col("records")).otherwise(0)).alias("fetched_records"),
        F.sum(F.when(fetched, F.col("record_bytes")).otherwise(0)).alias("fetched_bytes"),
        F.sum((F.coalesce(F.col("error_code"), F.lit(0)) != 0).cast("long")).alias("errors"))
    out["top_topics"] = (per_topic.join(moved_per_topic, "topic")
                         .orderBy(F.desc("requests"), "topic").limit(TOP_N))
    moved = parts.where(F.col("api_name").isin("produce", "fetch"))
    out["throughput"] = (moved.groupBy(F.date_trunc("minute", "request_time").alias("minute"), "api_name", "topic")
                         .agg(F.sum("records").alias("records"), F.sum("record_bytes").alias("bytes"))
                         .orderBy("minute", "api_name", "topic"))
    out["hot_partitions"] = (moved.where(F.col("partition").isNotNull())
                             .groupBy("topic", "partition")
                             .agg(F.sum(F.when(F.col("api_name") == "produce", F.col("records"))).alias("produced"),
                                  F.sum(F.when(F.col("api_name") == "fetch", F.col("records"))).alias("fetched"),
                                  F.sum("records").alias("records"), F.sum("record_bytes").alias("bytes"))
                             .na.fill(0, ["produced", "fetched"])
                             .orderBy(F.desc("bytes"), "topic", "partition").limit(TOP_N))
    spans = df.groupBy("connection_id").agg(F.min("request_time").alias("first"),
                                            F.max(F.coalesce("response_time", "request_time")).alias("last"))
    opened = spans.groupBy(F.date_trunc("minute", "first").alias("minute")).agg(F.count(F.lit(1)).alias("opened"))
    closed = spans.groupBy(F.date_trunc("minute", "last").alias("minute")).agg(F.count(F.lit(1)).alias("closed"))
    out["connection_churn"] = (opened.join(closed, "minute", "full_outer").na.fill(0, ["opened", "closed"])
                               .orderBy("minute"))
    out["faults"] = _faults(df, exact)
    return out


def _faults(df: DataFrame, exact: bool) -> DataFrame:
    by_connection = Window.partitionBy("connection_id").orderBy("request_time", "correlation_id")
    # Only connections a rule acted on are ordered (none, in a capture without rules: nothing is sorted).
    faulted = df.where(F.size("rule_decisions") > 0).select("connection_id").distinct()
    nxt = (df.join(faulted, "connection_id", "left_semi")
           .select("connection_id", "correlation_id", "request_time", "api_name", "rule_decisions")
           .withColumn("next_api", F.lead("api_name").over(by_connection))
           .withColumn("next_time", F.lead("request_time").over(by_connection))
           .where(F.size("rule_decisions") > 0))
    outcome = (F.when(F.col("next_api").isNull(), "connection_ended")
               .when(F.col("next_api") == F.col("api_name"), "retried").otherwise("other"))
    delay_ms = (F.unix_micros(F.col("next_time")) - F.unix_micros(F.col("request_time"))) / 1000.0
    return (nxt.select(F.explode("rule_decisions").alias("d"), "api_name", outcome.alias("then"),
                       delay_ms.alias("delay_ms"))
            .groupBy(F.col("d.rule").alias("rule"), F.col("d.action").alias("action"),
                     F.coalesce(F.col("d.dry_run"), F.lit(False)).alias("dry_run"), "api_name", "then")
            .agg(F.count(F.lit(1)).alias("requests"), percentile("delay_ms", 0.5, exact).alias("median_delay_ms"))
            .orderBy("rule", "action", "dry_run", "api_name", "then"))


def run_analysis(paths: Sequence[str], out: Path | str, spark: SparkSession,
                 progress: Callable[[str], None] = lambda _: None, rules: WhatIfRules | None = None,
                 exact_percentiles_max: int = EXACT_PERCENTILES_MAX, inputs: Inputs | None = None) -> Analysis:
    """Analyse ``paths``; write Parquet aggregates under ``out`` and return them collected.

    ``rules``: also evaluate that rule file against the records (:mod:`kproxy.analysis.whatif`).
    ``exact_percentiles_max``: more records than this, and percentiles are approximate.
    ``inputs``: ``find_inputs(paths)`` when the caller checked them already (before Spark started).

    Raises :class:`NoInput` when no input could be read at all (its message lists why).
    """
    if inputs is None:
        progress("checking inputs")
        inputs = find_inputs(paths)
    df = read_captures(spark, inputs)
    if df is None:
        raise NoInput(inputs.problems)
    # Read once, into the cache, the columns the tables read (every table then sees the same records).
    df = df.select(*dict.fromkeys(_ANALYSED if rules is None else _ANALYSED + whatif.INPUT_COLUMNS)).cache()
    progress("reading captures")
    per_file = {r[FILE_COLUMN]: r for r in df.groupBy(FILE_COLUMN).agg(
        F.count(F.lit(1)).alias("n"), F.min("request_time").alias("first"), F.max("request_time").alias("last"),
        F.min(F.unix_micros("request_time")).alias("first_us")).collect()}
    short = _short_files(inputs, per_file)
    if short:
        df = df.where(~F.col(FILE_COLUMN).isin(*short))
        for uri in short:
            del per_file[uri]
    if not per_file or sum(r["n"] for r in per_file.values()) == 0:
        raise NoInput([*inputs.problems, InputProblem(", ".join(paths), "no capture records")])
    span = {"n": sum(r["n"] for r in per_file.values()),
            "first": min(r["first"] for r in per_file.values() if r["first"] is not None),
            "last": max(r["last"] for r in per_file.values() if r["last"] is not None),
            "first_us": min(r["first_us"] for r in per_file.values() if r["first_us"] is not None)}
    tables: dict[str, list[dict[str, Any]]] = {}
    out_dir = str(out)
    exact = span["n"] <= exact_percentiles_max
    if not exact:
        progress(f"{span['n']} records: approximate percentiles (percentile_approx, accuracy {APPROX_ACCURACY})")
    for name, frame in aggregates(df, exact=exact).items():
        progress(f"aggregating {name}")
        frame = frame.cache()
        frame.write.mode("overwrite").parquet(os.path.join(out_dir, name))
        tables[name] = [row.asDict() for row in frame.collect()]
        frame.unpersist()
    info = None
    if rules is not None:
        ship_kproxy(spark)  # the what-if runs kproxy's rule engine on the executors
        found, info = whatif.run(spark, df, rules, span["first_us"], out_dir, progress)
        tables.update(found)
    df.unpersist()
    return Analysis(records=span["n"], files=len(inputs.files) + len(inputs.uris), first=span["first"],
                    last=span["last"], problems=inputs.problems, tables=tables, out=out_dir, whatif=info,
                    exact_percentiles=exact)


def _short_files(inputs: Inputs, per_file: dict[str, Any]) -> list[str]:
    """URIs (as ``per_file`` keys them) of the local files Spark read fewer records of than their
    footers count (a corrupt page: Spark skipped the rest), each reported in ``inputs.problems``."""
    by_path = {urllib.parse.unquote(urllib.parse.urlparse(uri).path): uri for uri in per_file}
    short = []
    for file in inputs.files:
        path = str(Path(file).resolve())
        uri = by_path.get(path)
        read = per_file[uri]["n"] if uri is not None else 0
        expected = inputs.rows.get(file, 0)
        if read < expected:
            inputs.problems.append(InputProblem(file, f"corrupt data: {read} of the {expected} records its footer "
                                                      f"counts could be read; the file is left out"))
            if uri is not None:
                short.append(uri)
    return short


class NoInput(Exception):
    """Nothing readable among the inputs."""

    def __init__(self, problems: list[InputProblem]) -> None:
        self.problems = problems
        super().__init__("no readable capture input: " + "; ".join(map(str, problems)))
