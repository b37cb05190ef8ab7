"""``kproxy analyze --follow``: per-minute aggregates kept up to date while a capture grows.

Spark Structured Streaming over the capture directory: each new complete
capture file (the writer renames files only when complete, and Spark's file
source skips the hidden temporary names) is read once; per minute and api the
requests, requests with an error, bytes, records and broker latency p50/p99
are recomputed, and the whole table is rewritten as Parquet under
``out/live_by_minute/`` after every micro-batch (complete output mode: the
table is small, one row per minute and api).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from kproxy.analysis.spark_schema import snake_api_name, spark_schema
from kproxy.capture.record_schema import READABLE_VERSIONS

LIVE_TABLE = "live_by_minute"


def live_aggregate(df: DataFrame) -> DataFrame:
    has_error = (F.coalesce(F.col("error_code"), F.lit(0)) != 0) | F.exists(
        F.col("partitions"), lambda p: F.coalesce(p["error_code"], F.lit(0)) != 0)
    return (df.where(F.col("schema_version").isin(*READABLE_VERSIONS))
            .groupBy(F.date_trunc("minute", F.col("request_time")).alias("minute"),
                     snake_api_name().alias("api_name"))
            .agg(F.count(F.lit(1)).alias("requests"), F.sum(has_error.cast("long")).alias("errors"),
                 F.sum(F.col("request_bytes") + F.coalesce(F.col("response_bytes"), F.lit(0))).alias("bytes"),
                 F.sum("record_count").alias("records"),
                 F.percentile_approx("broker_latency_ms", 0.5, 10_000).alias("broker_p50_ms"),
                 F.percentile_approx("broker_latency_ms", 0.99, 10_000).alias("broker_p99_ms")))


def follow(spark: SparkSession, directory: str, out: str, *, trigger_seconds: float = 10.0,
           on_batch: Callable[[int, list[dict[str, Any]]], None] = lambda _batch, _rows: None) -> StreamingQuery:
    """Start the streaming query; it runs until stopped. ``on_batch(batch_id, rows)`` after each
    update, ``rows`` the whole table as written (one dict per minute and api, in that order)."""
    stream = (spark.readStream.schema(spark_schema())
              .option("recursiveFileLookup", "true").option("pathGlobFilter", "capture-*.parquet")
              .parquet(directory))
    target = os.path.join(out, LIVE_TABLE)

    def write(batch: DataFrame, batch_id: int) -> None:
        table = batch.orderBy("minute", "api_name").cache()
        table.write.mode("overwrite").parquet(target)
        rows = [r.asDict() for r in table.collect()]
        table.unpersist()
        on_batch(batch_id, rows)

    writer: Any = (live_aggregate(stream).writeStream.outputMode("complete").foreachBatch(write)
                   .option("checkpointLocation", os.path.join(out, "_checkpoint"))
                   .trigger(processingTime=f"{trigger_seconds} seconds"))
    query: StreamingQuery = writer.start()
    return query
