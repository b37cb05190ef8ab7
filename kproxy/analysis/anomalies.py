"""Client anomalies over a capture: the kinds of ``kproxy_client_anomalies_total`` a capture can tell.

One Spark job over the records' answers' error codes and request versions, counted as the live
detectors (:mod:`kproxy.metrics.anomalies`) count them:

* ``stale_generation``, ``producer_fenced``, ``producer_sequence``: one per answer carrying one of
  their codes (top level or in any partition);
* ``deprecated_version``: one per connection that sent a request of a version Kafka's specs mark
  deprecated;

each by the connection's client id (its first request's), as the live detectors label them.

Client ids are cut as the live label cuts them (:func:`cut_label`); the
report does not fold them past a cap. What a capture cannot tell the same way is left out:
``connection_churn`` (a capture knows a connection's requests, not when it closed), ``retry_storm``
(batches' producer ids and sequences are not captured),
``rebalance_storm`` and ``vanished_member`` (member ids are not captured), and the producer policy's
kinds (they depend on the running config).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kproxy.protocol.api_keys import OFFSET_COMMIT, PRODUCE, TXN_OFFSET_COMMIT
from kproxy.protocol.tables import DEPRECATED_VERSIONS, ErrorCode

# The live detectors' kinds and codes (kproxy.metrics.anomalies, which analysis may not import:
# tests/test_analysis_anomalies.py checks the two agree).
STALE_GENERATION, PRODUCER_FENCED, PRODUCER_SEQUENCE = "stale_generation", "producer_fenced", "producer_sequence"
DEPRECATED_VERSION = "deprecated_version"
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


def client_anomalies(df: DataFrame) -> pa.Table:
    """``(kind, client_id, count)``, sorted by kind and client id, from the capture records ``df``: one
    Spark pass, grouped by connection (each connection's anomalies are its first client id's, as live)."""
    codes = _codes()
    api = F.col("api_key")
    last_deprecated = F.create_map(*[F.lit(v) for pair in sorted(DEPRECATED_UP_TO.items()) for v in pair])
    deprecated = F.col("api_version") <= F.coalesce(F.element_at(last_deprecated, api.cast("int")), F.lit(-1))
    fenced = _carries(codes, FENCED_CODES)
    sequence = ~fenced & (api == PRODUCE) & _carries(codes, SEQUENCE_CODES)
    stale = ~fenced & api.isin(*sorted(COMMIT_APIS)) & _carries(codes, STALE_CODES)
    client = F.coalesce(F.col("client_id"), F.lit(""))
    kinds = ((PRODUCER_FENCED, fenced), (PRODUCER_SEQUENCE, sequence), (STALE_GENERATION, stale))
    per_connection = df.groupBy("connection_id").agg(
        F.min_by(client, F.struct("request_time", "correlation_id")).alias("client_id"),
        F.max(deprecated.cast("int")).alias(DEPRECATED_VERSION),
        *[F.sum(F.coalesce(found, F.lit(False)).cast("int")).alias(kind) for kind, found in kinds])
    counted: dict[tuple[str, str], int] = {}
    for row in per_connection.where(" + ".join([DEPRECATED_VERSION, *(k for k, _ in kinds)]) + " > 0").collect():
        for kind in (DEPRECATED_VERSION, *(k for k, _ in kinds)):
            if row[kind]:
                key = (kind, cut_label(row["client_id"]))
                counted[key] = counted.get(key, 0) + row[kind]
    ordered = sorted(counted)
    return pa.table({"kind": [k for k, _ in ordered], "client_id": [c for _, c in ordered],
                     "count": [counted[key] for key in ordered]}, schema=ANOMALIES_SCHEMA)
