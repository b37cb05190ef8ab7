"""The report's tables: four passes over the records in Spark, the roll-ups on the driver.

Reading the records is what costs (10 million of them on two cores: seconds per pass, where
the tables themselves are small), so the tables come from four Spark passes, each a *fine*
aggregate small enough to collect (:class:`Passes`: per api and time bin, per connection, per
topic...), and every table is a roll-up of one of them, done on the driver with pyarrow
(:func:`tables`): one Spark job per pass, none per table.

Times are binned by the analysis's interval (:mod:`kproxy.analysis.interval`: a width in seconds
chosen from the capture's span), a bin ``time`` its start; ``interval`` below.

* ``latency``: per api (and, with exact percentiles, per (time, api)) in one grouping-sets
  aggregation: requests, bytes, the latency percentiles (one sketch per column for all of
  :data:`PERCENTILES`) and maxima; ``latency_by_api`` is the first, ``latency_over_time`` the second,
  or, with approximate percentiles, read off the latency histograms of the connections pass
  (:mod:`kproxy.analysis.log_histogram`: no sketch per time bin).
* ``errors``: requests per (time, api, error code), only the records with an error code read
  past the filter; ``errors_over_time`` as it is, rolled up over the bins for ``errors`` (its
  rate divides by ``latency_by_api``'s requests).
* ``connections``: per (client id, connection): requests, frame bytes each way, record bytes produced
  and fetched, records, requests with an error, first and last seen, and the rule decisions made on
  it; ``top_clients`` rolls it up per client id (a connection counted once per client id it used),
  ``connection_churn`` per connection, and the capture's span (records, first and last request) is
  its sum. With approximate percentiles, two more grouping sets count the records per (time, api,
  latency bucket), one per latency, with each bucket's lowest and highest latency.
* ``partitions``: the partition entries of every request, per (time, api, topic) and per (time
  answered, api, group, topic, partition) in one grouping-sets aggregation: records, record bytes,
  entries with an error, requests naming the topic (an entry counts the request when it is the
  first entry of its request naming that topic), and the last committed offset or high watermark
  answered in the bin with when it was, and the offsets the bin's answers dated with their write
  times (schema version 4); ``throughput`` and ``top_topics`` roll up the first,
  ``hot_partitions`` and ``consumer_lag`` (:mod:`kproxy.analysis.capture_lag`) the second.

``faults`` reads only the connections a rule acted on, and only when ``connections`` counted a
rule decision (none in a capture without rules: no pass at all). Every per-record expression is
one Spark compiles (field extraction from the ``partitions`` list, ``array_max``...), never a
lambda over an array, which Spark evaluates row by row, uncompiled (it cost a pass 2-3x).
Each table's meaning is in :mod:`kproxy.analysis.job`'s docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.util import inheritable_thread_target

from kproxy.analysis import log_histogram as histogram
from kproxy.analysis.capture_lag import consumer_lag
from kproxy.analysis.spark_schema import snake_api_name
from kproxy.protocol.api_keys import FETCH, PRODUCE

PERCENTILES = (0.5, 0.95, 0.99)
APPROX_ACCURACY = 10_000  # percentile_approx's accuracy: rank error at most 1/10,000 of a group
TOP_N = 20
_LATENCIES = (("broker", "broker_latency_ms"), ("kproxy", "kproxy_latency_ms"))
_MOVING = ("produce", "fetch")  # the apis that move records (as the tables spell them)
# grouping_id() of the grouping-sets passes: bit 1 for each column rolled up, the first column highest.
_PER_API, _PER_TIME = 2, 0  # latency: (time, api_name)
# partitions: (time, api_name, topic, partition, answered, group_id)
_PER_TOPIC, _PER_ANSWER = 0b000111, 0b100000


def percentile(column: str, p: float, exact: bool) -> Any:
    """The ``p`` percentile of ``column``: exact, or ``percentile_approx`` at :data:`APPROX_ACCURACY` (the
    faults' median delay: few rows, no sketch per time bin; the latency tables use histograms)."""
    return F.percentile(column, p) if exact else F.percentile_approx(column, p, APPROX_ACCURACY)


@dataclass(frozen=True)
class Passes:
    """The four fine aggregates the tables roll up (lazy; small once computed)."""

    latency: DataFrame
    errors: DataFrame
    connections: DataFrame
    partitions: DataFrame
    exact: bool  # exact percentiles (latency per api and time bin), else latency histograms
    interval: int  # the time bins' width, seconds


@dataclass(frozen=True)
class Fine:
    """:class:`Passes` computed and collected (Arrow tables on the driver)."""

    latency: pa.Table
    errors: pa.Table
    connections: pa.Table
    partitions: pa.Table
    exact: bool
    interval: int

    def span(self) -> tuple[int, Any, Any]:
        """Records, first and last ``request_time`` (Arrow scalars; None without records)."""
        c = self.connections
        n = pc.sum(c.column("requests")).as_py() or 0
        return n, pc.min(c.column("first")), pc.max(c.column("last_request"))

    def faulted_connections(self) -> list[str]:
        """The connections some rule decision was made on (none in a capture without rules)."""
        c = self.connections
        return sorted(set(c.filter(pc.greater(c.column("decisions"), 0)).column("connection_id").to_pylist()))


def _error_codes() -> tuple[Any, Any]:
    """(has an error, its distinct error codes) of a record: the top-level code and its partitions'."""
    partition_codes = F.coalesce(F.col("partitions.error_code"), F.array().cast("array<smallint>"))
    has_error = ((F.coalesce(F.col("error_code"), F.lit(0)) != 0)
                 | (F.coalesce(F.array_max(partition_codes), F.lit(0)) > 0)
                 | (F.coalesce(F.array_min(partition_codes), F.lit(0)) < 0))
    codes = F.array_compact(F.array_remove(F.array_distinct(F.concat(F.array("error_code"), partition_codes)), 0))
    return has_error, codes


def time_bin(column: str, interval: int) -> Column:
    """The start of the bin of ``interval`` seconds holding the timestamp ``column`` (bins from the
    Unix epoch: :mod:`kproxy.analysis.interval`), as a timestamp."""
    micros = F.unix_micros(F.col(column))
    return F.timestamp_micros(micros - F.pmod(micros, F.lit(interval * 1_000_000)))


def passes(df: DataFrame, *, exact: bool, interval: int = 60) -> Passes:
    """The fine aggregates of the records ``df`` (lazy); ``exact``: exact percentiles, else approximate;
    ``interval``: the time bins' width in seconds."""
    binned = time_bin("request_time", interval)
    has_error, codes = _error_codes()
    response_bytes = F.coalesce(F.col("response_bytes"), F.lit(0))

    rows = df.select("api_name", binned.alias("time"), "request_bytes", response_bytes.alias("response_bytes"),
                     "broker_latency_ms", "kproxy_latency_ms")
    if exact:
        cols: list[Any] = [F.count(F.lit(1)).alias("requests"), F.sum("request_bytes").alias("request_bytes"),
                           F.sum("response_bytes").alias("response_bytes")]
        for name, column in _LATENCIES:
            # Every one of PERCENTILES as an array, from one aggregation buffer per column.
            cols += [F.percentile(column, list(PERCENTILES)).alias(f"{name}_p"),
                     F.max(column).alias(f"{name}_max_ms")]
        latency = rows.groupingSets([["api_name"], ["time", "api_name"]], "time", "api_name").agg(
            *cols, F.grouping_id().alias("level"))
    else:
        latency = histogram.histograms(rows, _LATENCIES)
    latency = latency.withColumn("api_name", snake_api_name())

    # Few records carry an error: the codes are gathered only for those.
    errors = (df.where(has_error).select("api_name", binned.alias("time"), F.explode(codes).alias("code"))
              .groupBy("time", "api_name", "code").agg(F.count(F.lit(1)).alias("requests"))
              .withColumn("api_name", snake_api_name()))

    connections = (df.groupBy(F.coalesce(F.col("client_id"), F.lit("")).alias("client_id"), "connection_id")
                   .agg(F.count(F.lit(1)).alias("requests"),
                        F.sum("request_bytes").alias("request_bytes"), F.sum(response_bytes).alias("response_bytes"),
                        # The record batches' bytes, as kproxy_client_bytes_total{direction} counts them.
                        # (By api key: an int16 compared, where the name is a string per record.)
                        *(F.sum(F.when(F.col("api_key") == key, F.col("record_bytes")).otherwise(0)).alias(name)
                          for key, name in ((PRODUCE, "produced_bytes"), (FETCH, "fetched_bytes"))),
                        F.sum("record_count").alias("records"), F.sum(has_error.cast("long")).alias("errors"),
                        F.min("request_time").alias("first"),
                        F.max(F.coalesce("response_time", "request_time")).alias("last"),
                        F.max("request_time").alias("last_request"),
                        F.sum(F.coalesce(F.size("rule_decisions"), F.lit(0))).alias("decisions"),
                        # A connection is of one cluster (null: a file written before the column).
                        F.first("cluster", ignorenulls=True).alias("cluster")))

    # When the answer reached the client: the moment the live tracker learns an offset (ConsumerLag.answer).
    answered = F.coalesce(F.col("response_time"), F.col("request_time"))
    entries = (df.select("api_name", binned.alias("time"), answered.alias("at"),
                         F.col("partitions.topic").alias("names"), F.posexplode("partitions").alias("pos", "p"))
               .where(F.col("p.topic").isNotNull())
               .select("api_name", "time", "at", time_bin("at", interval).alias("answered"),
                       F.col("p.topic").alias("topic"), F.col("p.partition").alias("partition"),
                       F.col("p.record_count").alias("records"), F.col("p.record_bytes").alias("record_bytes"),
                       (F.coalesce(F.col("p.error_code"), F.lit(0)) != 0).cast("long").alias("errors"),
                       # The request's first entry naming this topic counts the request for it.
                       (F.array_position("names", F.col("p.topic")) == F.col("pos") + 1).cast("long")
                       .alias("naming"), F.col("p.group_id").alias("group_id"),
                       # An item without a group carries a watermark, one with a group its committed offset.
                       F.when(F.col("p.group_id").isNull(), F.col("p.high_watermark"))
                       .otherwise(F.col("p.committed_offset")).alias("offset"),
                       # When a range of offsets was written (version 4+: null in older files).
                       F.col("p.base_offset").alias("first"), F.col("p.last_offset").alias("last"),
                       F.col("p.max_timestamp").alias("stamp")))
    # Two sets, so that every entry goes through the aggregation twice, not three times (a set per
    # table cost the job 0.6 GiB of heap at 10 million records): per (time, api, topic) for the
    # topics' tables, and per (time answered, api, group, partition) both for the partitions' sums
    # (hot_partitions rolls it up on the driver) and for the offsets: the last one answered there and
    # when (max_by leaves out the rows whose time is null: those without an offset), the latest of the
    # apis' taken on the driver (a Produce and a Fetch answer both tell a watermark).
    offset_at = F.when(F.col("offset").isNotNull(), F.col("at"))
    partitions = entries.groupingSets([["time", "api_name", "topic"],
                                       ["answered", "api_name", "group_id", "topic", "partition"]],
                                      "time", "api_name", "topic", "partition", "answered", "group_id").agg(
        F.sum("records").alias("records"), F.sum("record_bytes").alias("record_bytes"),
        F.sum("errors").alias("errors"), F.sum("naming").alias("naming"),
        F.max_by("offset", offset_at).alias("offset"), F.max(offset_at).alias("offset_at"),
        # The bin's write-time point: the offsets the answers dated and their earliest and latest times.
        F.min("first").alias("first"), F.max("last").alias("last"), F.min("stamp").alias("stamp_low"),
        F.max("stamp").alias("stamp_high"), F.grouping_id().alias("level")
    ).withColumn("api_name", snake_api_name())
    return Passes(latency, errors, connections, partitions, exact, interval)


_SERVES = {"latency": ("latency_by_api", "latency_over_time"), "errors": ("errors", "errors_over_time"),
           "connections": ("top_clients", "by_cluster", "connection_churn"),
           "partitions": ("top_topics", "throughput", "hot_partitions", "consumer_lag")}  # the tables each pass is for


def collect(p: Passes, progress: Callable[[str], None] = lambda _: None, *, concurrent: bool = True) -> Fine:
    """Compute each pass (a Spark job each) and bring it to the driver. ``concurrent``: the passes
    are submitted together (Spark runs their tasks in turn, first come first served), so the
    cores idle at the end of one pass's stages, and while the driver plans and collects, run the
    next pass's tasks; as many tasks run at once as one at a time (one per core). The threads
    that submit them carry the caller's job group and description (PySpark's inheritable target)."""
    for serves in _SERVES.values():
        progress(f"aggregating {', '.join(serves)}")
    if not concurrent:
        return Fine(**{name: getattr(p, name).toArrow() for name in _SERVES}, exact=p.exact, interval=p.interval)
    with ThreadPoolExecutor(max_workers=len(_SERVES), thread_name_prefix="kproxy-pass") as pool:
        futures = {name: pool.submit(_inheriting(getattr(p, name))) for name in _SERVES}
        return Fine(**{name: future.result() for name, future in futures.items()}, exact=p.exact,
                    interval=p.interval)


def _inheriting(frame: DataFrame) -> Callable[[], pa.Table]:
    """``frame.toArrow``, run in another thread with this thread's job group, description and tags."""
    target: Callable[[], pa.Table] = inheritable_thread_target(frame.sparkSession)(frame.toArrow)
    return target


# -- roll-ups on the driver ----------------------------------------------------------------------
def tables(fine: Fine) -> dict[str, pa.Table]:
    """Every table of the report but ``faults``, rolled up from ``fine`` (Arrow, on the driver)."""
    out: dict[str, pa.Table] = {}
    lat = fine.latency
    if fine.exact:
        by_api = _where(lat, pc.equal(lat.column("level"), _PER_API))
        by_time = _where(lat, pc.equal(lat.column("level"), _PER_TIME))
    else:
        by_api, by_time = (histogram.latency_table(lat, keys, _LATENCIES, PERCENTILES)
                           for keys in (["api_name"], ["time", "api_name"]))
    interval = fine.interval
    out["latency_by_api"] = _sort(_select(by_api, "api_name", *_latency_columns(by_api), "request_bytes",
                                          "response_bytes"), [("requests", "descending"), ("api_name", "ascending")])
    out["latency_over_time"] = _sort(_select(by_time, "time", _interval(by_time, interval), "api_name",
                                             *_latency_columns(by_time)),
                                     [("time", "ascending"), ("api_name", "ascending")])

    errors = _rollup(fine.errors, ["api_name", "code"], requests=("requests", "sum"))
    per_api = dict(zip(by_api.column("api_name").to_pylist(), by_api.column("requests").to_pylist(), strict=True))
    api_requests = pa.array([per_api.get(a) for a in errors.column("api_name").to_pylist()], pa.int64())
    rate = pc.divide(pc.cast(errors.column("requests"), pa.float64()), pc.cast(api_requests, pa.float64()))
    errors = errors.append_column("api_requests", api_requests).append_column("rate", rate)
    out["errors"] = _sort(errors, [("requests", "descending"), ("api_name", "ascending"), ("code", "ascending")])
    out["errors_over_time"] = _sort(_select(fine.errors, "time", _interval(fine.errors, interval), "api_name", "code",
                                            "requests"),
                                    [("time", "ascending"), ("api_name", "ascending"), ("code", "ascending")])

    conns = fine.connections
    clients = _rollup(conns, ["client_id"], request_bytes=("request_bytes", "sum"),
                      response_bytes=("response_bytes", "sum"), produced_bytes=("produced_bytes", "sum"),
                      fetched_bytes=("fetched_bytes", "sum"), requests=("requests", "sum"),
                      records=("records", "sum"), errors=("errors", "sum"), connections=("connection_id", "count"))
    clients = _select(clients, "client_id",
                      ("bytes", pc.add(clients.column("request_bytes"), clients.column("response_bytes"))),
                      *clients.column_names[1:])
    out["top_clients"] = _top(clients, [("bytes", "descending"), ("client_id", "ascending")])
    by_cluster = _rollup(conns, ["cluster"], connections=("connection_id", "count_distinct"),
                         requests=("requests", "sum"), request_bytes=("request_bytes", "sum"),
                         response_bytes=("response_bytes", "sum"), produced_bytes=("produced_bytes", "sum"),
                         fetched_bytes=("fetched_bytes", "sum"), records=("records", "sum"), errors=("errors", "sum"))
    out["by_cluster"] = _sort(by_cluster, [("cluster", "ascending")])

    parts = fine.partitions
    per_topic = _where(parts, pc.equal(parts.column("level"), _PER_TOPIC))
    per_answer = _where(parts, pc.equal(parts.column("level"), _PER_ANSWER))
    per_partition = _rollup(per_answer, ["topic", "partition", "api_name"], records=("records", "sum"),
                            record_bytes=("record_bytes", "sum"))
    produced = pc.equal(per_topic.column("api_name"), "produce")
    fetched = pc.equal(per_topic.column("api_name"), "fetch")
    flows = _select(per_topic, "topic", "naming", "errors",
                    *((f"{flow}_{name}", pc.if_else(mask, per_topic.column(column), 0))
                      for flow, mask in (("produced", produced), ("fetched", fetched))
                      for name, column in (("records", "records"), ("bytes", "record_bytes"))))
    topics = _rollup(flows, ["topic"], requests=("naming", "sum"),
                     **{c: (c, "sum") for c in ("produced_records", "produced_bytes", "fetched_records",
                                                 "fetched_bytes")}, errors=("errors", "sum"))
    out["top_topics"] = _top(topics, [("requests", "descending"), ("topic", "ascending")])
    moving = _where(per_topic, pc.is_in(per_topic.column("api_name"), pa.array(_MOVING)))
    out["throughput"] = _sort(_select(moving, "time", _interval(moving, interval), "api_name", "topic", "records",
                                      ("bytes", moving.column("record_bytes"))),
                              [("time", "ascending"), ("api_name", "ascending"), ("topic", "ascending")])

    out["consumer_lag"] = consumer_lag(_last_offsets(per_answer), interval, _write_points(per_answer))

    hot = _where(per_partition, pc.and_(pc.is_in(per_partition.column("api_name"), pa.array(_MOVING)),
                                        pc.is_valid(per_partition.column("partition"))))
    hot = _select(hot, "topic", "partition",
                  ("produced", pc.if_else(pc.equal(hot.column("api_name"), "produce"), hot.column("records"), 0)),
                  ("fetched", pc.if_else(pc.equal(hot.column("api_name"), "fetch"), hot.column("records"), 0)),
                  "records", ("bytes", hot.column("record_bytes")))
    hot = _rollup(hot, ["topic", "partition"], **{c: (c, "sum") for c in ("produced", "fetched", "records", "bytes")})
    hot = _select(hot, "topic", "partition", *((c, pc.fill_null(hot.column(c), 0)) for c in ("produced", "fetched")),
                  "records", "bytes")
    out["hot_partitions"] = _top(hot, [("bytes", "descending"), ("topic", "ascending"), ("partition", "ascending")])

    spans = _rollup(conns, ["connection_id"], first=("first", "min"), last=("last", "max"))
    opened = _rollup(_select(spans, ("time", _bin(spans.column("first"), interval))), ["time"],
                     opened=("time", "count"))
    closed = _rollup(_select(spans, ("time", _bin(spans.column("last"), interval))), ["time"],
                     closed=("time", "count"))
    churn = opened.join(closed, "time", join_type="full outer")
    out["connection_churn"] = _sort(_select(churn, "time", _interval(churn, interval),
                                            ("opened", pc.fill_null(churn.column("opened"), 0)),
                                            ("closed", pc.fill_null(churn.column("closed"), 0))),
                                    [("time", "ascending")])
    return out


def _rollup(t: pa.Table, keys: list[str], **aggregates: tuple[str, str]) -> pa.Table:
    """``t`` grouped by ``keys``: the keys, then each ``name=(column, function)`` (pyarrow's
    ``sum``, ``min``, ``max``, ``count``) in the order given."""
    every = pc.CountOptions(mode="all")  # count: rows, as Spark's count(1)
    got = t.group_by(keys, use_threads=False).aggregate(
        [(column, function, every) if function == "count" else (column, function)
         for column, function in dict.fromkeys(aggregates.values())])
    return _select(got, *keys, *((name, got.column(f"{column}_{function}"))
                                 for name, (column, function) in aggregates.items()))


def _top(t: pa.Table, keys: Sequence[tuple[str, str]]) -> pa.Table:
    return _sort(t, keys).slice(0, TOP_N)


def _where(t: pa.Table, mask: Any) -> pa.Table:
    return t.filter(pc.fill_null(mask, False))


def _select(t: pa.Table, *columns: str | tuple[str, Any]) -> pa.Table:
    """``t``'s columns by name, or (name, array) pairs, in that order."""
    names, arrays = [], []
    for c in columns:
        name, array = (c, t.column(c)) if isinstance(c, str) else c
        names.append(name)
        arrays.append(array)
    return pa.table(arrays, names=names)


def _sort(t: pa.Table, keys: Sequence[tuple[str, str]]) -> pa.Table:
    """``t`` sorted by ``keys``, nulls first ascending and last descending (as Spark orders them)."""
    if t.num_rows == 0:
        return t
    order = None
    for name, direction in reversed(keys):  # stable sorts, last key first
        column = t.column(name) if order is None else pc.take(t.column(name), order)
        at = "at_start" if direction == "ascending" else "at_end"
        step = pc.array_sort_indices(column, order=direction, null_placement=at)
        order = step if order is None else pc.take(order, step)
    return t.take(order)


def _latency_columns(t: pa.Table) -> list[tuple[str, Any]]:
    cols: list[tuple[str, Any]] = [("requests", t.column("requests"))]
    for name, _ in _LATENCIES:
        for i, q in enumerate(PERCENTILES):
            cols.append((f"{name}_p{round(q * 100)}_ms", pc.list_element(t.column(f"{name}_p"), i)))
        cols.append((f"{name}_max_ms", t.column(f"{name}_max_ms")))
    return cols


def _last_offsets(per_answer: pa.Table) -> pa.Table:
    """Per (time bin answered, group, topic, partition): the offset answered last, whichever api's answer
    told it (the rows' ``offset_at``: when each api's last one was answered)."""
    told = _where(per_answer, pc.is_valid(per_answer.column("offset_at")))
    told = told.sort_by([("offset_at", "ascending")])
    last = told.group_by(["answered", "group_id", "topic", "partition"], use_threads=False).aggregate(
        [("offset", "last")])
    return _select(last, "answered", "group_id", "topic", "partition", ("offset", last.column("offset_last")))


def _write_points(per_answer: pa.Table) -> pa.Table:
    """Per (time bin answered, topic, partition): the offsets whose write time the bin's answers gave
    (the lowest first, the highest last) and the earliest and latest of those times, whichever api's
    answers they were."""
    dated = _where(per_answer, pc.is_valid(per_answer.column("stamp_high")))
    points = dated.group_by(["answered", "topic", "partition"], use_threads=False).aggregate(
        [("first", "min"), ("last", "max"), ("stamp_low", "min"), ("stamp_high", "max")])
    return _select(points, "answered", "topic", "partition", ("first", points.column("first_min")),
                   ("last", points.column("last_max")), ("stamp_low", points.column("stamp_low_min")),
                   ("stamp_high", points.column("stamp_high_max")))


def _bin(times: Any, interval: int) -> Any:
    """The starts of the bins of ``interval`` seconds holding ``times`` (Arrow timestamps), as :func:`time_bin`."""
    return pc.floor_temporal(times, multiple=interval, unit="second")


def _interval(t: pa.Table, interval: int) -> tuple[str, Any]:
    """The ``interval_s`` column of ``t``: every row's bin width, seconds."""
    return "interval_s", pa.array([interval] * t.num_rows, pa.int32())


# -- faults ----------------------------------------------------------------------------------------
FAULTS_SCHEMA = pa.schema([("rule", pa.string()), ("action", pa.string()), ("dry_run", pa.bool_()),
                           ("api_name", pa.string()), ("then", pa.string()), ("requests", pa.int64()),
                           ("median_delay_ms", pa.float64())])


def faults(df: DataFrame, connections: Sequence[str], exact: bool) -> pa.Table:
    """Per rule, action, dry run, api and what the client did next (see :mod:`kproxy.analysis.job`),
    from the records of ``connections`` (those a rule acted on: no Spark job when there are none)."""
    if not connections:
        return FAULTS_SCHEMA.empty_table()
    spark = df.sparkSession
    acted = F.broadcast(spark.createDataFrame([(c,) for c in connections], "connection_id string"))
    by_connection = Window.partitionBy("connection_id").orderBy("request_time", "correlation_id")
    nxt = (df.join(acted, "connection_id", "left_semi")
           .select("connection_id", "correlation_id", "request_time", "api_name", "rule_decisions")
           .withColumn("next_api", F.lead("api_name").over(by_connection))
           .withColumn("next_time", F.lead("request_time").over(by_connection))
           .where(F.size("rule_decisions") > 0))
    outcome = (F.when(F.col("next_api").isNull(), "connection_ended")
               .when(F.col("next_api") == F.col("api_name"), "retried").otherwise("other"))
    delay_ms = (F.unix_micros(F.col("next_time")) - F.unix_micros(F.col("request_time"))) / 1000.0
    got = (nxt.select(F.explode("rule_decisions").alias("d"), "api_name", outcome.alias("then"),
                      delay_ms.alias("delay_ms"))
           .groupBy(F.col("d.rule").alias("rule"), F.col("d.action").alias("action"),
                    F.coalesce(F.col("d.dry_run"), F.lit(False)).alias("dry_run"), "api_name", "then")
           .agg(F.count(F.lit(1)).alias("requests"), percentile("delay_ms", 0.5, exact).alias("median_delay_ms"))
           .withColumn("api_name", snake_api_name())
           .orderBy("rule", "action", "dry_run", "api_name", "then")).toArrow()
    return got.cast(FAULTS_SCHEMA)
