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
came up short is left out whole and named. The tables come from a few passes over
the files (:mod:`kproxy.analysis.tables`), each reading only the columns it needs; the
local files are listed once, before the first, so every pass reads the same records.
(Remote inputs have no footer checked here: Spark skips what it cannot read of them,
unnamed.)
"""

from __future__ import annotations

import glob
import os
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kproxy.analysis import whatif
from kproxy.analysis.arguments import EXACT_PERCENTILES_MAX
from kproxy.analysis.schema import spark_schema
from kproxy.analysis.session import local_driver_memory as local_driver_memory  # re-exported: where callers found it
from kproxy.analysis.session import ship_kproxy
from kproxy.analysis.session import spark_session as spark_session  # re-exported: where callers found it
from kproxy.analysis.tables import APPROX_ACCURACY as APPROX_ACCURACY  # re-exported: where callers found it
from kproxy.analysis.tables import PERCENTILES as PERCENTILES
from kproxy.analysis.tables import TOP_N as TOP_N
from kproxy.analysis.tables import passes, tables
from kproxy.analysis.tables import percentile as percentile
from kproxy.analysis.whatif import WhatIf, WhatIfRules
from kproxy.capture.schema import READABLE_VERSIONS, SchemaVersionError, check_version, version_support

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
    # Kafka's api names as captured (``GetTelemetrySubscriptions``): the tables spell them as the
    # metrics do once aggregated (:func:`kproxy.analysis.schema.snake_api_name`, a regular expression
    # too costly to run on every record read).
    return df


# -- aggregates ------------------------------------------------------------------------------
def aggregates(df: DataFrame, *, exact: bool = True) -> dict[str, DataFrame]:
    """Every aggregate of the report, as (lazy) DataFrames; ``exact``: exact percentiles, else
    approximate. Each table re-reads the records it rolls up: :func:`run_analysis` keeps the
    fine aggregates (:func:`kproxy.analysis.tables.passes`) instead, so the records are read once per pass."""
    return tables(passes(df, exact=exact), df, exact=exact)


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
    # The columns the tables read; each pass reads them from the files (a pass over Parquet columns
    # costs less than building Spark's cache of every record, which was the job's largest cost).
    df = df.select(*dict.fromkeys(_ANALYSED if rules is None else _ANALYSED + whatif.INPUT_COLUMNS))
    progress("reading captures")
    # Every column the passes read is read here too (counted, though only the rows are used): a
    # corrupt page in any of them cuts this count short, and the file is left out of every pass.
    read_all = [F.count(c) for c in df.columns if c != FILE_COLUMN]
    per_file = {r[FILE_COLUMN]: r for r in df.groupBy(FILE_COLUMN).agg(
        F.count(F.lit(1)).alias("n"), F.min("request_time").alias("first"), F.max("request_time").alias("last"),
        F.min(F.unix_micros("request_time")).alias("first_us"), *read_all).collect()}
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
    found: dict[str, list[dict[str, Any]]] = {}
    out_dir = str(out)
    exact = span["n"] <= exact_percentiles_max
    if not exact:
        progress(f"{span['n']} records: approximate percentiles (percentile_approx, accuracy {APPROX_ACCURACY})")
    fine = passes(df, exact=exact)
    kept = [frame.cache() for frame in fine.frames()]  # small: per api, minute, client, topic...
    for name, frame in tables(fine, df, exact=exact).items():
        progress(f"aggregating {name}")
        frame = frame.cache()
        frame.write.mode("overwrite").parquet(os.path.join(out_dir, name))
        found[name] = [row.asDict() for row in frame.collect()]
        frame.unpersist()
    for frame in kept:
        frame.unpersist()
    info = None
    if rules is not None:
        ship_kproxy(spark)  # the what-if runs kproxy's rule engine on the executors
        replayed, info = whatif.run(spark, df, rules, span["first_us"], out_dir, progress)
        found.update(replayed)
    return Analysis(records=span["n"], files=len(inputs.files) + len(inputs.uris), first=span["first"],
                    last=span["last"], problems=inputs.problems, tables=found, out=out_dir, whatif=info,
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
