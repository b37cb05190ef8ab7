"""Latency percentiles from log-scale histograms, for captures above the exact limit.

Spark's ``percentile_approx`` keeps a sketch per group that buffers every value, boxed, until its
head buffer (50,000 values) fills: a sketch per (time bin, api), which a task rarely fills, held all
its values twice over (broker and kproxy latency) until the task ended, so the Java heap grew with
them (10 million records: 0.6 GiB of the job's 3.4 GiB peak), and inserting into the sketches was
most of the latency pass's CPU. A histogram is counts instead: each latency falls in a bucket of a
log scale (:data:`BUCKETS_PER_OCTAVE` to each doubling); Spark counts the records per (time bin, api,
bucket), one grouping set per latency (:func:`histograms`: fixed-width sums, compiled, no object
per group), with the lowest and highest latency in each bucket, and the driver reads the
percentiles off the counts, per time bin or rolled up per api (:func:`latency_table`).

The contract: each percentile is a value between the lowest and the highest latency of the bucket
holding the exact one (the value ranked ``ceil(p * n)`` of ``n``), read between them by rank, so
within :data:`RELATIVE_ERROR` of it (2.2 %); a bucket of one distinct value gives it exactly, and
the maximum is exact. Relative error is what a latency figure needs (1 ms off at 100 ms, 10 µs
off at 1 ms), where a rank bound can land on a neighbour far away in a sparse tail.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

BUCKETS_PER_OCTAVE = 32
RELATIVE_ERROR = 2 ** (1 / BUCKETS_PER_OCTAVE) - 1  # a bucket's highest value over its lowest, less one
AT_MOST_ZERO = -(2 ** 31)  # the bucket of latencies of zero or less: first in order, as their values


def bucket(column: str) -> Column:
    """The log-scale bucket of ``column`` (an int, ordered as the values; null where it is null)."""
    value = F.col(column)
    return (F.when(value > 0, F.floor(F.log2(value) * BUCKETS_PER_OCTAVE).cast("int"))
            .when(value.isNotNull(), F.lit(AT_MOST_ZERO)))


def histograms(rows: DataFrame, latencies: Sequence[tuple[str, str]]) -> DataFrame:
    """Per (``time``, ``api_name``, ``<name>_bucket``), one grouping set per ``(name, column)`` of
    ``latencies``: ``requests``, ``request_bytes``, ``response_bytes``, and each latency's lowest and
    highest value (``<name>_low``, ``<name>_high``); ``level`` is the set's ``grouping_id()``
    (:func:`level`). ``rows``: one per record, with those columns."""
    named = [f"{name}_bucket" for name, _ in latencies]
    keyed = rows.select("*", *(bucket(column).alias(b) for (_, column), b in zip(latencies, named, strict=True)))
    return keyed.groupingSets([["time", "api_name", b] for b in named], "time", "api_name", *named).agg(
        F.count(F.lit(1)).alias("requests"), F.sum("request_bytes").alias("request_bytes"),
        F.sum("response_bytes").alias("response_bytes"),
        *(F.min(column).alias(f"{name}_low") for name, column in latencies),
        *(F.max(column).alias(f"{name}_high") for name, column in latencies),
        F.grouping_id().alias("level"))


def level(i: int, count: int) -> int:
    """The ``grouping_id()`` of the ``i``-th of ``count`` latencies' sets: every other bucket rolled up."""
    return ((1 << count) - 1) & ~(1 << (count - 1 - i))


def latency_table(hist: pa.Table, keys: list[str], latencies: Sequence[tuple[str, str]],
                  ps: Sequence[float]) -> pa.Table:
    """Per ``keys`` (a subset of ``time``, ``api_name``) of :func:`histograms`' rows: ``requests``,
    ``request_bytes``, ``response_bytes``, and per latency ``<name>_p`` (the ``ps`` percentiles, a
    list) and ``<name>_max_ms``, null where no record had a value; sorted by ``keys``."""
    out: pa.Table | None = None
    for i, (name, _) in enumerate(latencies):
        one = hist.filter(pc.equal(hist.column("level"), level(i, len(latencies))))
        one = one.group_by([*keys, f"{name}_bucket"], use_threads=False).aggregate(
            [("requests", "sum"), ("request_bytes", "sum"), ("response_bytes", "sum"),
             (f"{name}_low", "min"), (f"{name}_high", "max")])
        if out is None:  # every record is in each latency's set once: the first one's sums are the totals
            totals = one.group_by(keys, use_threads=False).aggregate(
                [("requests_sum", "sum"), ("request_bytes_sum", "sum"), ("response_bytes_sum", "sum")])
            out = pa.table({**{k: totals.column(k) for k in keys},
                            **{c: pc.cast(totals.column(f"{c}_sum_sum"), pa.int64())
                               for c in ("requests", "request_bytes", "response_bytes")}})
        got = _percentiles(one, keys, f"{name}_bucket", "requests_sum", f"{name}_low_min", f"{name}_high_max", ps)
        # (Arrow's join takes no list column: the rows are matched by their keys, as numbers.)
        where = {key: i for i, key in enumerate(_key_tuples(got, keys))}
        at = pa.array([where.get(key) for key in _key_tuples(out, keys)], pa.int64())
        out = out.append_column(f"{name}_p", got.column("p").take(at)).append_column(
            f"{name}_max_ms", got.column("max").take(at))
    assert out is not None
    return out.sort_by([(k, "ascending") for k in keys])


def _key_tuples(t: pa.Table, keys: list[str]) -> list[tuple[object, ...]]:
    """``t``'s keys per row, times as integers (a tz-aware datetime per row costs a time-zone lookup)."""
    columns = [(pc.cast(t.column(k), pa.int64()) if pa.types.is_timestamp(t.schema.field(k).type)
                else t.column(k)).to_pylist() for k in keys]
    return list(zip(*columns, strict=True))


def _percentiles(t: pa.Table, keys: list[str], bucket_col: str, count_col: str, low_col: str, high_col: str,
                 ps: Sequence[float]) -> pa.Table:
    """Per ``keys`` of ``t`` (a row per key and bucket, a null bucket for records without a value):
    the keys, the ``ps`` percentiles (a list) and the maximum, for the keys with a value."""
    t = t.filter(pc.is_valid(t.column(bucket_col))).sort_by([(k, "ascending") for k in [*keys, bucket_col]])
    counts = t.column(count_col).to_numpy().astype(np.int64)
    low = t.column(low_col).to_numpy().astype(np.float64)
    high = t.column(high_col).to_numpy().astype(np.float64)
    # Where a group begins: a key differs from the row before (keys as numbers: no Python object per row).
    begins = np.zeros(t.num_rows, dtype=bool)
    begins[:1] = True
    for k in keys:
        column = t.column(k)
        codes = (column.dictionary_encode().combine_chunks().indices if pa.types.is_string(column.type)
                 else pc.cast(column, pa.int64())).to_numpy()
        begins[1:] |= codes[1:] != codes[:-1]
    starts = [int(i) for i in np.flatnonzero(begins)]
    percentiles: list[list[float]] = []
    for a, b in itertools.pairwise([*starts, t.num_rows]):
        c = counts[a:b]
        cum = np.cumsum(c)
        n = int(cum[-1])
        values = []
        for p in ps:
            rank = max(1, math.ceil(p * n))  # 1-based: the exact one is the value ranked so
            at = int(np.searchsorted(cum, rank, side="left"))
            size = int(c[at])
            within = rank - (int(cum[at]) - size)  # its place in its bucket, 1..size
            lo, hi = float(low[a + at]), float(high[a + at])
            values.append(lo if size == 1 else lo + (hi - lo) * (within - 1) / (size - 1))
        percentiles.append(values)
    ends = [b - 1 for b in [*starts[1:], t.num_rows]]
    first = t.take(pa.array(starts, pa.int64()))
    return pa.table({**{k: first.column(k) for k in keys}, "p": pa.array(percentiles, pa.list_(pa.float64())),
                     "max": pa.array(high[ends] if ends else [], pa.float64())})
