"""Client anomalies over a capture: the kinds of ``kproxy_client_anomalies_total`` a capture can tell.

One Spark job over the records' answers' error codes and request versions, counted as the live
detectors (:mod:`kproxy.metrics.client_anomalies`) count them:

* ``stale_generation``, ``producer_fenced``, ``producer_sequence``: one per answer carrying one of
  their codes (top level or in any partition);
* ``deprecated_version``: one per connection that sent a request of a version Kafka's specs mark
  deprecated;
* ``rebalance_storm``: per group, its JoinGroups answered without error (top-level code 0) replayed
  in the order their answers reached the clients, in windows as the live detector keeps them
  (:class:`kproxy.metrics.group_anomalies.GroupWatch`: a window opens at a join past the last one's
  ``rebalance_window`` seconds); one per window whose joins reach ``rebalance_joins``, for the
  client whose join reached it. The two thresholds are the run's config's
  (``metrics.client_anomalies_rebalance_joins`` and ``_window``; ``kproxy analyze`` takes them as
  flags, the config's defaults by default);

each by the connection's client id (its first request's), as the live detectors label them.

Client ids are cut as the live label cuts them (:func:`cut_label`); the
report does not fold them past a cap. What a capture cannot tell the same way is left out:
``connection_churn`` (a capture knows a connection's requests, not when it closed), ``retry_storm``
(batches' producer ids and sequences are not captured), ``vanished_member`` (member ids are not
captured), ``uncompressed_producer`` (batches' codecs are not captured) and ``acks0_producer`` (it
counts only where the running config forbids acks=0, which a capture does not record).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kproxy.analysis.arguments import REBALANCE_JOINS, REBALANCE_WINDOW
from kproxy.protocol.api_keys import JOIN_GROUP, OFFSET_COMMIT, PRODUCE, TXN_OFFSET_COMMIT
from kproxy.protocol.codes import DEPRECATED_VERSIONS, ErrorCode

# The live detectors' kinds and codes (kproxy.metrics.client_anomalies, which analysis may not import:
# tests/test_analysis_anomalies.py checks the two agree).
STALE_GENERATION, PRODUCER_FENCED, PRODUCER_SEQUENCE = "stale_generation", "producer_fenced", "producer_sequence"
DEPRECATED_VERSION, REBALANCE_STORM = "deprecated_version", "rebalance_storm"
COMMIT_APIS = frozenset({OFFSET_COMMIT, TXN_OFFSET_COMMIT})
STALE_CODES = frozenset({int(ErrorCode.ILLEGAL_GENERATION), int(ErrorCode.UNKNOWN_MEMBER_ID)})
FENCED_CODES = frozenset({int(ErrorCode.PRODUCER_FENCED), int(ErrorCode.INVALID_PRODUCER_EPOCH)})
SEQUENCE_CODES = frozenset({int(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), int(ErrorCode.DUPLICATE_SEQUENCE_NUMBER)})
DEPRECATED_UP_TO = {key: span[1] for key, span in DEPRECATED_VERSIONS.items() if span[0] == 0}
MAX_LABEL_LENGTH = 128  # a client id label's length at most, as kproxy.metrics.labels cuts it


def cut_label(value: str) -> str:
    """``value`` cut as the live label is: to :data:`MAX_LABEL_LENGTH`, the last character ``~``."""
    return value if len(value) <= MAX_LABEL_LENGTH else value[:MAX_LABEL_LENGTH - 1] + "~"


ANOMALIES_SCHEMA = pa.schema([("kind", pa.string()), ("client_id", pa.string()), ("count", pa.int64())])


def _codes() -> Any:
    """A record's answer error codes: its top-level one and its partitions' (no nulls: with one,
    ``arrays_overlap`` answers null where nothing is shared)."""
    partition_codes = F.coalesce(F.col("partitions.error_code"), F.array().cast("array<smallint>"))
    return F.array_compact(F.concat(F.array(F.col("error_code")), partition_codes))


def _carries(codes: Any, wanted: frozenset[int]) -> Any:
    return F.arrays_overlap(codes, F.array(*[F.lit(c).cast("smallint") for c in sorted(wanted)]))


def client_anomalies(df: DataFrame, rebalance_joins: int = REBALANCE_JOINS,
                     rebalance_window: float = REBALANCE_WINDOW) -> pa.Table:
    """``(kind, client_id, count)``, sorted by kind and client id, from the capture records ``df``: one
    Spark pass, grouped by connection (each connection's anomalies are its first client id's, as live;
    its JoinGroups answered without error listed, replayed on the driver for rebalance storms:
    ``rebalance_joins`` within ``rebalance_window`` seconds, see the module docstring)."""
    codes = _codes()
    api = F.col("api_key")
    last_deprecated = F.create_map(*[F.lit(v) for pair in sorted(DEPRECATED_UP_TO.items()) for v in pair])
    deprecated = F.col("api_version") <= F.coalesce(F.element_at(last_deprecated, api.cast("int")), F.lit(-1))
    fenced = _carries(codes, FENCED_CODES)
    sequence = ~fenced & (api == PRODUCE) & _carries(codes, SEQUENCE_CODES)
    stale = ~fenced & api.isin(*sorted(COMMIT_APIS)) & _carries(codes, STALE_CODES)
    joined = ((api == JOIN_GROUP) & (F.col("error_code") == 0) & F.col("response_time").isNotNull()
              & F.col("group_id").isNotNull())
    client = F.coalesce(F.col("client_id"), F.lit(""))
    kinds = ((PRODUCER_FENCED, fenced), (PRODUCER_SEQUENCE, sequence), (STALE_GENERATION, stale))
    per_connection = df.groupBy("connection_id").agg(
        F.min_by(client, F.struct("request_time", "correlation_id")).alias("client_id"),
        F.max(deprecated.cast("int")).alias(DEPRECATED_VERSION),
        *[F.sum(F.coalesce(found, F.lit(False)).cast("int")).alias(kind) for kind, found in kinds],
        # (collect_list leaves out the nulls: the records that are no such join)
        F.collect_list(F.when(joined, F.struct(F.col("group_id").alias("group"),
                                               F.unix_micros("response_time").alias("at"),
                                               F.col("correlation_id").alias("correlation_id")))).alias("joins"))
    counted: dict[tuple[str, str], int] = {}
    joins: list[tuple[str, int, str, int, str]] = []  # (group, answered at, connection, correlation id, client)
    flagged = " + ".join([DEPRECATED_VERSION, *(k for k, _ in kinds)]) + " > 0 OR size(joins) > 0"
    for row in per_connection.where(flagged).collect():
        for kind in (DEPRECATED_VERSION, *(k for k, _ in kinds)):
            if row[kind]:
                key = (kind, cut_label(row["client_id"]))
                counted[key] = counted.get(key, 0) + row[kind]
        joins.extend((j["group"], j["at"], row["connection_id"], j["correlation_id"], row["client_id"])
                     for j in row["joins"])
    for key, n in rebalance_storms(joins, rebalance_joins, rebalance_window).items():
        counted[key] = counted.get(key, 0) + n
    ordered = sorted(counted)
    return pa.table({"kind": [k for k, _ in ordered], "client_id": [c for _, c in ordered],
                     "count": [counted[key] for key in ordered]}, schema=ANOMALIES_SCHEMA)


def rebalance_storms(joins: list[tuple[str, int, str, int, str]], threshold: int, window: float
                     ) -> dict[tuple[str, str], int]:
    """``{(rebalance_storm, client id): storms}`` from the JoinGroups answered without error, ``(group,
    answered at: µs since the epoch, connection, correlation id, client id)`` each, replayed per group in
    the order they were answered, in the live detector's windows (see the module docstring)."""
    counted: dict[tuple[str, str], int] = {}
    group: str | None = None
    start = 0.0
    n = 0
    for name, answered, _, _, client in sorted(joins):
        at = answered / 1_000_000
        if name != group or at - start >= window:
            group, start, n = name, at, 0
        n += 1
        if n == threshold:
            key = (REBALANCE_STORM, cut_label(client))
            counted[key] = counted.get(key, 0) + 1
    return counted
