"""The analysis job: capture files in, Parquet aggregates and a report out.

``run_analysis(inputs, out, spark)`` reads capture files (local paths, checked
file by file first, or any URI Spark reads), computes the aggregates below
with Spark, writes each as Parquet under ``out/<name>/`` and returns them
collected (they are small: per api, per time bin, per top-N) for the report.

Aggregates (times are UTC). Series over time are binned by the analysis's
interval, one width for every table (:mod:`kproxy.analysis.interval`: chosen
from the capture's span, a second for a short capture, minutes for hours, at
most 200 bins; or given): a row's ``time`` is its bin's start (consumer lag's:
its end) and ``interval_s`` the width in seconds.

* ``latency_by_api`` / ``latency_over_time``: requests and p50/p95/p99/max of
  broker and kproxy latency, per api (and time bin). Percentiles are exact up to
  ``exact_percentiles_max`` records (default :data:`EXACT_PERCENTILES_MAX`):
  Spark's ``percentile`` (linear interpolation between closest ranks, numpy's
  default), which keeps every distinct value of a group in memory (a driver
  runs out of heap, and time grows far faster than with the approximation,
  well before ten million records). Above that, they are read off
  log-scale histograms (:mod:`kproxy.analysis.log_histogram`, 32 buckets a
  doubling): each within 2.2 % of the exact value (the one ranked
  ``ceil(p * n)`` of the group's ``n``), maxima exact, in fixed-width counts
  (a ``percentile_approx`` sketch per minute made the job's heap outgrow plain
  Spark's). Broker latency ignores requests without one (local answers,
  acks=0).
* ``errors``: per api and error code, the requests whose response carried that
  code (top level or in any partition) and their share of the api's requests.
* ``top_clients``: per client id, by bytes: frame bytes from the client
  (``request_bytes``) and to it (``response_bytes``), their sum (``bytes``), the
  record batches' bytes in its Produce requests and Fetch responses
  (``produced_bytes``, ``fetched_bytes``: ``kproxy_client_bytes_total``'s
  ``produce`` and ``fetch``), requests, records, requests with an error and
  connections.
* ``by_cluster``: per cluster (the capture's ``cluster``, null in older files): connections,
  requests, frame and record batch bytes as ``top_clients``, records and requests with an error.
* ``top_topics``: per topic: requests, records and bytes produced and fetched,
  requests with an error.
* ``consumer_lag``: per time bin (the bin answers reached their clients), group
  and topic, the group's lag at the bin's end summed over its partitions, as
  ``kproxy_consumergroup_lag_sum`` computes it: each partition's latest high
  watermark known less the group's latest committed offset there, never below
  0, partitions without both left out (:mod:`kproxy.analysis.capture_lag`); and its
  lag in seconds, as ``kproxy_consumergroup_lag_seconds``: the most over its
  partitions of how long before the bin's end the first offset it has not
  committed was written, from the write times Produce answers gave (null where
  none is known: a capture older than schema version 4).
* ``throughput``: Produce and Fetch records and bytes per topic per time bin.
* ``hot_partitions``: topic-partitions by records and bytes moved.
* ``connection_churn``: per time bin, connections first and last seen.
* ``faults``: per rule, action and dry run (``rule_decisions``: what the
  proxy's rules did, each action counted as ``kproxy_rule_hits_total`` counts
  it), the requests it acted on per api, and what the client did next on that
  connection: ``retried`` (its next request was the same api), ``other``
  (another api), ``connection_ended`` (it sent nothing more there: closed, or
  reconnected elsewhere); with the median time to that next request.
* ``client_anomalies``: per kind and client id, the anomalies of ``kproxy_client_anomalies_total``
  (:mod:`kproxy.analysis.capture_anomalies`; the kinds a capture could not tell are in
  :attr:`Analysis.untold_anomalies`).
* ``whatif_*`` (with ``rules``): what a rule file would have done to these
  records, evaluated by the proxy's own rule engine (:mod:`kproxy.analysis.whatif`).

Bad input never stops the rest: a missing path, a file that is not Parquet (or
is cut short), a file of another schema version, a file with a page that does not
decode are each reported with the file and the reason (:class:`InputProblem`),
and the readable files are analysed. Local files are checked before Spark reads
them, footer and every page (:mod:`kproxy.analysis.inputs`), so every pass reads
the same records. The tables come from four passes over the files, each reading
only the columns it needs, rolled up on the driver (:mod:`kproxy.analysis.report_tables`),
and written as Parquet from the driver (by Spark when ``out`` is a URI).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kproxy.analysis import whatif
from kproxy.analysis.arguments import EXACT_PERCENTILES_MAX
from kproxy.analysis.capture_anomalies import Settings, client_anomalies
from kproxy.analysis.inputs import InputProblem as InputProblem  # re-exported: where callers found them
from kproxy.analysis.inputs import Inputs as Inputs
from kproxy.analysis.inputs import check_file as check_file
from kproxy.analysis.inputs import find_inputs as find_inputs
from kproxy.analysis.inputs import read_footer as read_footer
from kproxy.analysis.interval import auto_interval, label
from kproxy.analysis.interval import check as check_interval
from kproxy.analysis.log_histogram import RELATIVE_ERROR
from kproxy.analysis.report_tables import APPROX_ACCURACY as APPROX_ACCURACY  # re-exported: where callers found it
from kproxy.analysis.report_tables import PERCENTILES as PERCENTILES
from kproxy.analysis.report_tables import TOP_N as TOP_N
from kproxy.analysis.report_tables import collect, faults, passes, tables
from kproxy.analysis.report_tables import percentile as percentile
from kproxy.analysis.spark_schema import spark_schema
from kproxy.analysis.spark_session import (
    local_driver_memory as local_driver_memory,  # re-exported: where callers found it
)
from kproxy.analysis.spark_session import ship_kproxy
from kproxy.analysis.spark_session import spark_session as spark_session  # re-exported: where callers found it
from kproxy.analysis.whatif import WhatIf, WhatIfRules
from kproxy.capture.record_schema import CONNECTION_CLOSED_KEY, READABLE_VERSIONS, version_support

FILE_COLUMN = "_file"  # read_captures: the file a record came from (Spark's input_file_name, a URI)
# The columns aggregates() reads (the what-if adds its own): Spark reads no other.
_ANALYSED = ("api_key", "api_name", "api_version", "request_time", "response_time", "connection_id", "correlation_id",
             "client_id",
             "request_bytes", "response_bytes", "broker_latency_ms", "kproxy_latency_ms", "error_code",
             "record_count", "record_bytes", "partitions", "rule_decisions", "group_id", "cluster",
             "acks", "member_id", "group_instance_id", "session_timeout_ms")


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
    exact_percentiles: bool = True  # False: from histograms (more than exact_percentiles_max records)
    interval: int = 60  # the time bins' width, seconds (kproxy.analysis.interval)
    whatif: WhatIf | None = None  # how a --rules what-if ran (its tables are in ``tables``, whatif_*)
    # client anomaly kinds the capture could not tell, and why (kproxy.analysis.capture_anomalies)
    untold_anomalies: dict[str, str] | None = None


# -- records ---------------------------------------------------------------------------------
def read_captures(spark: SparkSession, inputs: Inputs, *, closes: bool = False) -> DataFrame | None:
    """All readable records as one DataFrame (None if there are none); remote inputs whose
    ``schema_version`` column is not one this kproxy reads are reported in ``inputs.problems`` and
    left out, and the records of the rest counted (``inputs.remote_rows``, their versions in
    ``inputs.versions``). Connection close records (schema version 5: no request) only with
    ``closes``: only the client anomalies read them."""
    schema = spark_schema()
    frames: list[DataFrame] = []
    if inputs.files:
        frames.append(spark.read.schema(schema).parquet(*inputs.files))
    if inputs.uris:
        remote = (spark.read.schema(schema).option("recursiveFileLookup", "true")
                  .option("pathGlobFilter", "capture-*.parquet").parquet(*inputs.uris))
        readable = F.col("schema_version").isin(*READABLE_VERSIONS)
        versions = (remote.groupBy(F.input_file_name().alias("file"), "schema_version")
                    .agg(F.count(F.lit(1)).alias("records")).collect())
        for row in versions:
            if row["schema_version"] in READABLE_VERSIONS:
                inputs.remote_rows += row["records"]
                inputs.versions.add(row["schema_version"])
            else:
                inputs.problems.append(InputProblem(row["file"], f"capture schema version {row['schema_version']}, "
                                                                 f"{version_support()}"))
        frames.append(remote.where(readable))
    if not frames:
        return None
    df = frames[0]
    for more in frames[1:]:
        df = df.unionByName(more)
    if not closes:
        df = df.where(F.col("api_key") != CONNECTION_CLOSED_KEY)
    # Kafka's api names as captured (``GetTelemetrySubscriptions``): the tables spell them as the
    # metrics do once aggregated (:func:`kproxy.analysis.spark_schema.snake_api_name`, a regular expression
    # too costly to run on every record read).
    return df


# -- aggregates ------------------------------------------------------------------------------
def aggregates(df: DataFrame, *, exact: bool = True, interval: int = 60,
               progress: Callable[[str], None] = lambda _: None,
               anomalies: Settings | None = None, versions: Sequence[int] = ()
               ) -> tuple[dict[str, pa.Table], tuple[int, Any, Any], dict[str, str], int]:
    """Every table of the report (Arrow, on the driver), the records' span (records, first and last
    ``request_time`` as Arrow scalars), the client anomaly kinds not told (kind -> why) and the
    connection close records read; ``df``: the records, close records included
    (:func:`read_captures`); ``exact``: exact percentiles, else approximate; ``interval``: the time
    bins' width, seconds; ``anomalies``: the client anomaly detectors' settings, ``versions`` the
    capture's schema versions (:mod:`kproxy.analysis.capture_anomalies`). One Spark job per pass
    (:mod:`kproxy.analysis.report_tables`), one more for ``faults`` when a rule acted, and the client
    anomalies'."""
    requests = df.where(F.col("api_key") != CONNECTION_CLOSED_KEY)
    fine = collect(passes(requests, exact=exact, interval=interval), progress)
    found = tables(fine)
    acted = fine.faulted_connections()
    if acted:
        progress(f"aggregating faults ({len(acted)} connections a rule acted on)")
    found["faults"] = faults(requests, acted, exact)
    progress("client anomalies")
    told = client_anomalies(df, anomalies, versions)
    found["client_anomalies"] = told.table
    return found, fine.span(), told.untold, told.closes


def run_analysis(paths: Sequence[str], out: Path | str, spark: SparkSession,
                 progress: Callable[[str], None] = lambda _: None, rules: WhatIfRules | None = None,
                 exact_percentiles_max: int = EXACT_PERCENTILES_MAX, inputs: Inputs | None = None,
                 interval: int | None = None, anomalies: dict[str, Any] | None = None) -> Analysis:
    """Analyse ``paths``; write Parquet aggregates under ``out`` and return them collected.

    ``rules``: also evaluate that rule file against the records (:mod:`kproxy.analysis.whatif`).
    ``exact_percentiles_max``: more records than this, and percentiles are approximate.
    ``inputs``: ``find_inputs(paths)`` when the caller checked them already (before Spark started).
    ``interval``: the time bins' width in seconds (one of :data:`kproxy.analysis.interval.WIDTHS` or
    whole days, else ValueError); None: chosen from the records' span (:func:`time_span`).
    ``anomalies``: client anomaly settings by :class:`~kproxy.analysis.capture_anomalies.Settings`' names
    (None values: not given), over the ones the capture records (its newest local file's), over the
    defaults.

    Raises :class:`NoInput` when no input could be read at all (its message lists why).
    """
    if inputs is None:
        progress("checking inputs")
        inputs = find_inputs(paths)
    df = read_captures(spark, inputs, closes=True)
    if df is None:
        raise NoInput(inputs.problems)
    if inputs.records == 0:
        raise NoInput([*inputs.problems, InputProblem(", ".join(paths), "no capture records")])
    # The columns the tables read: each pass reads only its own of them from the files.
    df = df.select(*dict.fromkeys(_ANALYSED if rules is None else _ANALYSED + whatif.INPUT_COLUMNS))
    exact = inputs.records <= exact_percentiles_max
    if not exact:
        progress(f"{inputs.records} records: approximate percentiles (log-scale histograms, within "
                 f"{RELATIVE_ERROR:.1%})")
    interval = auto_interval(time_span(df, inputs)) if interval is None else check_interval(interval)
    progress(f"time series per {label(interval)}")
    recorded = inputs.anomaly_settings
    try:
        settings = Settings.recorded(None if recorded is None else recorded[1],
                                     "capture" if recorded is None else recorded[0])
    except ValueError as exc:
        inputs.problems.append(InputProblem(recorded[0] if recorded else ", ".join(paths),
                                            f"{exc} (the defaults counted instead)"))
        settings = Settings()
    settings = settings.over(anomalies or {})
    found, (records, first, last), untold, closes = aggregates(
        df, exact=exact, interval=interval, progress=progress, anomalies=settings, versions=sorted(inputs.versions))
    if records == 0:
        raise NoInput([*inputs.problems, InputProblem(", ".join(paths), "no capture records Spark could read")])
    if records + closes < inputs.records:  # the checks passed what Spark then could not read (remote: unchecked)
        inputs.problems.append(InputProblem(", ".join(paths), f"Spark read {records} of the {inputs.records} "
                                                              f"records the inputs hold"))
    out_dir = str(out)
    progress(f"writing {len(found)} tables under {out_dir}")
    for name, table in found.items():
        write_table(spark, table, out_dir, name)
    rows = {name: table_rows(table) for name, table in found.items()}
    info = None
    if rules is not None:
        ship_kproxy(spark)  # the what-if runs kproxy's rule engine on the executors
        requests = df.where(F.col("api_key") != CONNECTION_CLOSED_KEY)
        replayed, info = whatif.run(spark, requests, rules, first.value, out_dir, progress)
        rows.update(replayed)
    return Analysis(records=records, files=len(inputs.files) + len(inputs.uris), first=_naive(first.as_py()),
                    last=_naive(last.as_py()), problems=inputs.problems, tables=rows, out=out_dir, whatif=info,
                    exact_percentiles=exact, interval=interval, untold_anomalies=untold)


def time_span(df: DataFrame, inputs: Inputs) -> float:
    """Seconds from the first record's ``request_time`` to the last: from the local files' footers
    when they all tell it (no pass over the records), else from a Spark job reading that column."""
    span = inputs.span()
    if span is not None:
        return max(0.0, (span[1] - span[0]).total_seconds())
    micros = F.unix_micros(F.col("request_time"))
    row = df.agg((F.max(micros) - F.min(micros)).alias("span")).first()
    return 0.0 if row is None or row["span"] is None else row["span"] / 1e6


def write_table(spark: SparkSession, table: pa.Table, out: str, name: str) -> None:
    """``table`` as Parquet under ``out/name/`` (replacing what was there): written by the driver,
    or by Spark when ``out`` is a URI (storage only Spark's Hadoop file systems reach)."""
    if "://" in out and not out.startswith("file://"):
        spark.createDataFrame(table).coalesce(1).write.mode("overwrite").parquet(f"{out.rstrip('/')}/{name}")
        return
    directory = Path(out.removeprefix("file://")) / name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    pq.write_table(table, directory / "part-00000.parquet")


def table_rows(table: pa.Table) -> list[dict[str, Any]]:
    """``table``'s rows as dicts, times as naive UTC datetimes (as the report and plots take them)."""
    naive = table.cast(pa.schema([pa.field(f.name, pa.timestamp(f.type.unit), f.nullable)
                                  if pa.types.is_timestamp(f.type) else f for f in table.schema]))
    rows: list[dict[str, Any]] = naive.to_pylist()
    return rows


def _naive(t: Any) -> Any:
    return None if t is None else t.replace(tzinfo=None)


class NoInput(Exception):
    """Nothing readable among the inputs."""

    def __init__(self, problems: list[InputProblem]) -> None:
        self.problems = problems
        super().__init__("no readable capture input: " + "; ".join(map(str, problems)))
