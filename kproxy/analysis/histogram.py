"""Latency percentiles per minute from log-scale histograms, for captures above the exact limit.

A percentile sketch per (minute, api) is what made the analysis's memory outgrow plain Spark's:
Spark's ``percentile_approx`` buffers every value of a group, boxed, until its head buffer
(50,000 values) fills, and a minute of one api on one task rarely fills it, so each task held all
its values twice over (broker and kproxy latency) until it ended, and the Java heap grew with
them (10 million records: 0.6 GiB of the job's 3.4 GiB peak). A histogram is counts instead: each
latency falls in a bucket of a log scale (:data:`BUCKETS_PER_OCTAVE` to each doubling), Spark
counts records per (minute, api, bucket) with fixed-width sums that it keeps off the object heap,
along with the lowest and highest latency in each bucket, and the driver reads the percentiles
off the counts (:func:`percentiles`).

The contract: each percentile is a value between the lowest and the highest latency of the bucket
holding the exact one (interpolated by rank between them), so within :data:`RELATIVE_ERROR` of it
(2.2 %); a bucket with one distinct value gives it exactly, and the maximum is exact. Per-api
percentiles keep ``percentile_approx``'s rank bound (one sketch per api: its head buffer fills and
is compressed as it goes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F

BUCKETS_PER_OCTAVE = 32
RELATIVE_ERROR = 2 ** (1 / BUCKETS_PER_OCTAVE) - 1  # a bucket's highest value over its lowest, less one
AT_MOST_ZERO = -(2 ** 31)  # the bucket of latencies of zero or less: first in order, as their values


def bucket(column: str) -> Column:
    """The log-scale bucket of ``column`` (an int, ordered as the values; null where it is null)."""
    value = F.col(column)
    return (F.when(value > 0, F.floor(F.log2(value) * BUCKETS_PER_OCTAVE).cast("int"))
            .when(value.isNotNull(), F.lit(AT_MOST_ZERO)))


Summary = tuple[int, list[float | None], float | None]  # records, percentiles, maximum


def percentiles(hist: pa.Table, keys: Sequence[str], ps: Sequence[float]) -> dict[tuple[Any, ...], Summary]:
    """Per ``keys`` of ``hist`` (columns ``keys``, ``bucket``, ``count``, ``low``, ``high``: the
    records in each bucket and their lowest and highest value; a null bucket counts records
    without a value): (records, the ``ps`` percentiles, the maximum); percentiles and maximum are
    None where no record had a value. The ``p`` percentile is the value ranked ``ceil(p * n)`` of
    ``n``, read in its bucket by rank between the bucket's lowest and highest value."""
    grouped = hist.group_by(list(keys), use_threads=False).aggregate(
        [("count", "sum"), ("bucket", "list"), ("count", "list"), ("low", "list"), ("high", "list")])
    columns = [grouped.column(k).to_pylist() for k in keys]
    totals = grouped.column("count_sum").to_pylist()
    buckets, counts = grouped.column("bucket_list").to_pylist(), grouped.column("count_list").to_pylist()
    lows, highs = grouped.column("low_list").to_pylist(), grouped.column("high_list").to_pylist()
    out: dict[tuple[Any, ...], Summary] = {}
    for i, total in enumerate(totals):
        key = tuple(c[i] for c in columns)
        valued = [j for j, b in enumerate(buckets[i]) if b is not None]
        if not valued:
            out[key] = (total, [None] * len(ps), None)
            continue
        valued.sort(key=lambda j: buckets[i][j])
        c = np.array([counts[i][j] for j in valued], dtype=np.int64)
        low = np.array([lows[i][j] for j in valued], dtype=np.float64)
        high = np.array([highs[i][j] for j in valued], dtype=np.float64)
        cum = np.cumsum(c)
        n = int(cum[-1])
        got: list[float | None] = []
        for p in ps:
            rank = max(1, math.ceil(p * n))  # 1-based
            at = int(np.searchsorted(cum, rank, side="left"))
            within, size = rank - (int(cum[at]) - int(c[at])), int(c[at])  # 1..size
            got.append(float(low[at]) if size == 1 else
                       float(low[at] + (high[at] - low[at]) * (within - 1) / (size - 1)))
        out[key] = (total, got, float(high[-1]))
    return out
