"""The report's tables, from as few passes over the records as Spark allows.

Reading the records is what costs (10 million of them on two cores: several seconds per pass,
where the tables themselves are small), so the fourteen tables come from four passes, each a
*fine* aggregate small enough to keep (:class:`Passes`), and every table is a roll-up of one of
them:

* ``latency``: per api and per (minute, api) in one grouping-sets aggregation: requests, bytes,
  the latency percentiles (one sketch per column for all of :data:`PERCENTILES`) and maxima;
  ``latency_by_api`` and ``latency_by_minute`` are its two halves.
* ``errors``: requests per (minute, api, error code), for ``errors_by_minute``, and rolled up over
  the minutes for ``errors`` (its rate divides by ``latency_by_api``'s requests).
* ``connections``: per (client id, connection): requests, bytes, records, requests with an error,
  first and last seen; ``top_clients`` rolls it up per client id (a connection counted once per
  client id it used), ``connection_churn`` per connection.
* ``partitions``: the partition entries of every request, per (minute, api, topic) and per
  (topic, partition, api) in one grouping-sets aggregation: records, record bytes, entries with an
  error, and requests naming the topic (an entry counts the request when it is the first entry of
  its request naming that topic); ``throughput``, ``top_topics`` and ``hot_partitions`` roll it up.

``faults`` reads only the connections a rule acted on (none in a capture without rules).
Each table's meaning is in :mod:`kproxy.analysis.job`'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from kproxy.analysis.schema import snake_api_name

PERCENTILES = (0.5, 0.95, 0.99)
APPROX_ACCURACY = 10_000  # percentile_approx's accuracy: rank error at most 1/10,000 of a group
TOP_N = 20
_LATENCIES = (("broker", "broker_latency_ms"), ("kproxy", "kproxy_latency_ms"))
_MOVING = ("produce", "fetch")  # the apis that move records (as the tables spell them)


def percentile(column: str, p: float, exact: bool) -> Any:
    """The ``p`` percentile of ``column``: exact, or ``percentile_approx`` (see :mod:`kproxy.analysis.job`)."""
    return F.percentile(column, p) if exact else F.percentile_approx(column, p, APPROX_ACCURACY)


def _percentiles(column: str, exact: bool) -> Any:
    """Every one of :data:`PERCENTILES` of ``column``, as an array, from one aggregation buffer
    (``percentile_approx`` with several percentages keeps one sketch, not one per percentage)."""
    ps = list(PERCENTILES)
    return F.percentile(column, ps) if exact else F.percentile_approx(column, ps, APPROX_ACCURACY)


@dataclass(frozen=True)
class Passes:
    """The four fine aggregates the tables roll up (small: per api, minute, client, topic...)."""

    latency: DataFrame
    errors: DataFrame
    connections: DataFrame
    partitions: DataFrame

    def frames(self) -> tuple[DataFrame, ...]:
        return (self.latency, self.errors, self.connections, self.partitions)


def passes(df: DataFrame, *, exact: bool) -> Passes:
    """The fine aggregates of the records ``df`` (lazy); ``exact``: exact percentiles, else approximate."""
    minute = F.date_trunc("minute", F.col("request_time"))
    has_error = (F.coalesce(F.col("error_code"), F.lit(0)) != 0) | F.exists(
        F.col("partitions"), lambda p: F.coalesce(p["error_code"], F.lit(0)) != 0)
    response_bytes = F.coalesce(F.col("response_bytes"), F.lit(0))

    rows = df.select("api_name", minute.alias("minute"), "request_bytes", response_bytes.alias("response_bytes"),
                     "broker_latency_ms", "kproxy_latency_ms")
    cols: list[Any] = [F.count(F.lit(1)).alias("requests"), F.sum("request_bytes").alias("request_bytes"),
                       F.sum("response_bytes").alias("response_bytes")]
    for name, column in _LATENCIES:
        cols += [_percentiles(column, exact).alias(f"{name}_p"), F.max(column).alias(f"{name}_max_ms")]
    latency = rows.groupingSets([["api_name"], ["minute", "api_name"]], "minute", "api_name").agg(
        *cols, F.grouping_id().alias("level")).withColumn("api_name", snake_api_name())

    partition_codes = F.transform(F.col("partitions"), lambda p: p["error_code"])
    codes = F.array_distinct(F.filter(F.concat(F.array(F.col("error_code")), partition_codes),
                                      lambda c: c.isNotNull() & (c != 0)))
    errors = (df.select("api_name", minute.alias("minute"), F.explode(codes).alias("code"))
              .groupBy("minute", "api_name", "code").agg(F.count(F.lit(1)).alias("requests"))
              .withColumn("api_name", snake_api_name()))

    connections = (df.groupBy(F.coalesce(F.col("client_id"), F.lit("")).alias("client_id"), "connection_id")
                   .agg(F.count(F.lit(1)).alias("requests"),
                        F.sum(F.col("request_bytes") + response_bytes).alias("bytes"),
                        F.sum("record_count").alias("records"), F.sum(has_error.cast("long")).alias("errors"),
                        F.min("request_time").alias("first"),
                        F.max(F.coalesce("response_time", "request_time")).alias("last")))

    topic_names = F.transform(F.col("partitions"), lambda p: p["topic"])
    entries = (df.select("api_name", minute.alias("minute"), topic_names.alias("names"),
                         F.posexplode("partitions").alias("pos", "p"))
               .where(F.col("p.topic").isNotNull())
               .select("api_name", "minute", F.col("p.topic").alias("topic"), F.col("p.partition").alias("partition"),
                       F.col("p.record_count").alias("records"), F.col("p.record_bytes").alias("record_bytes"),
                       (F.coalesce(F.col("p.error_code"), F.lit(0)) != 0).cast("long").alias("errors"),
                       # The request's first entry naming this topic counts the request for it.
                       (F.array_position("names", F.col("p.topic")) == F.col("pos") + 1).cast("long")
                       .alias("naming")))
    partitions = entries.groupingSets([["minute", "api_name", "topic"], ["topic", "partition", "api_name"]],
                                      "minute", "api_name", "topic", "partition").agg(
        F.sum("records").alias("records"), F.sum("record_bytes").alias("record_bytes"),
        F.sum("errors").alias("errors"), F.sum("naming").alias("naming"), F.grouping_id().alias("level")
    ).withColumn("api_name", snake_api_name())
    return Passes(latency, errors, connections, partitions)


def tables(p: Passes, df: DataFrame, *, exact: bool) -> dict[str, DataFrame]:
    """Every table of the report (lazy), rolled up from ``p``; ``df`` (the records) for ``faults``."""
    out: dict[str, DataFrame] = {}
    by_api = p.latency.where(F.col("level") == 2)  # grouping_id: bit 1 for each column rolled up
    by_minute = p.latency.where(F.col("level") == 0)
    out["latency_by_api"] = (by_api.select("api_name", *_latency_columns(), "request_bytes", "response_bytes")
                             .orderBy(F.desc("requests")))
    out["latency_by_minute"] = (by_minute.select("minute", "api_name", *_latency_columns())
                                .orderBy("minute", "api_name"))

    per_api = by_api.select("api_name", F.col("requests").alias("api_requests"))
    errors = p.errors.groupBy("api_name", "code").agg(F.sum("requests").alias("requests"))
    out["errors"] = (errors.join(per_api, "api_name")
                     .withColumn("rate", F.col("requests") / F.col("api_requests"))
                     .orderBy(F.desc("requests"), "api_name", "code"))
    out["errors_by_minute"] = p.errors.select("minute", "api_name", "code", "requests").orderBy(
        "minute", "api_name", "code")

    out["top_clients"] = (p.connections.groupBy("client_id")
                          .agg(F.sum("requests").alias("requests"), F.sum("bytes").alias("bytes"),
                               F.sum("records").alias("records"), F.sum("errors").alias("errors"),
                               F.count(F.lit(1)).alias("connections"))
                          .orderBy(F.desc("requests"), "client_id").limit(TOP_N))

    per_topic = p.partitions.where(F.col("level") == 1)  # (minute, api, topic); partition rolled up
    per_partition = p.partitions.where(F.col("level") == 8)  # (topic, partition, api); minute rolled up
    produced, fetched = F.col("api_name") == "produce", F.col("api_name") == "fetch"
    out["top_topics"] = (per_topic.groupBy("topic").agg(
        F.sum("naming").alias("requests"),
        F.sum(F.when(produced, F.col("records")).otherwise(0)).alias("produced_records"),
        F.sum(F.when(produced, F.col("record_bytes")).otherwise(0)).alias("produced_bytes"),
        F.sum(F.when(fetched, F.col("records")).otherwise(0)).alias("fetched_records"),
        F.sum(F.when(fetched, F.col("record_bytes")).otherwise(0)).alias("fetched_bytes"),
        F.sum("errors").alias("errors"))
        .orderBy(F.desc("requests"), "topic").limit(TOP_N))
    out["throughput"] = (per_topic.where(F.col("api_name").isin(*_MOVING))
                         .select("minute", "api_name", "topic", "records", F.col("record_bytes").alias("bytes"))
                         .orderBy("minute", "api_name", "topic"))
    out["hot_partitions"] = (per_partition.where(F.col("api_name").isin(*_MOVING) & F.col("partition").isNotNull())
                             .groupBy("topic", "partition")
                             .agg(F.sum(F.when(produced, F.col("records"))).alias("produced"),
                                  F.sum(F.when(fetched, F.col("records"))).alias("fetched"),
                                  F.sum("records").alias("records"), F.sum("record_bytes").alias("bytes"))
                             .na.fill(0, ["produced", "fetched"])
                             .orderBy(F.desc("bytes"), "topic", "partition").limit(TOP_N))

    spans = p.connections.groupBy("connection_id").agg(F.min("first").alias("first"), F.max("last").alias("last"))
    opened = spans.groupBy(F.date_trunc("minute", "first").alias("minute")).agg(F.count(F.lit(1)).alias("opened"))
    closed = spans.groupBy(F.date_trunc("minute", "last").alias("minute")).agg(F.count(F.lit(1)).alias("closed"))
    out["connection_churn"] = (opened.join(closed, "minute", "full_outer").na.fill(0, ["opened", "closed"])
                               .orderBy("minute"))
    out["faults"] = faults(df, exact)
    return out


def _latency_columns() -> list[Any]:
    cols: list[Any] = ["requests"]
    for name, _ in _LATENCIES:
        for i, q in enumerate(PERCENTILES):
            cols.append(F.col(f"{name}_p")[i].alias(f"{name}_p{round(q * 100)}_ms"))
        cols.append(f"{name}_max_ms")
    return cols


def faults(df: DataFrame, exact: bool) -> DataFrame:
    """Per rule, action, dry run, api and what the client did next (see :mod:`kproxy.analysis.job`)."""
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
            .withColumn("api_name", snake_api_name())
            .orderBy("rule", "action", "dry_run", "api_name", "then"))
