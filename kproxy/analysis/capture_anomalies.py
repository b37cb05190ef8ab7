"""Client anomalies over a capture: the kinds of ``kproxy_client_anomalies_total``, counted as live.

Counted as the live detectors (:mod:`kproxy.metrics.client_anomalies`, ``group_anomalies`` and
``retries``) count them, from the records' answers' error codes, request versions and the fields
capture version 5 added (:mod:`kproxy.capture.record_schema`), with the run's settings
(:class:`Settings`: the capture's metadata says them, ``kproxy analyze``'s flags override them):

* ``stale_generation``, ``producer_fenced``, ``producer_sequence``: one per answer carrying one of
  their codes (top level or in any partition);
* ``deprecated_version``: one per connection that sent a request of a version Kafka's specs mark
  deprecated;
* ``acks0_producer`` (when the run forbade acks=0) and ``uncompressed_producer`` (when it required
  compression: a Produce partition's batch of :data:`UNCOMPRESSED_MIN_BYTES` or more whose first
  batch's codec is none): one per connection that sent such a Produce;
* ``rebalance_storm``: per group, its JoinGroups answered without error (top-level code 0) replayed
  in the order their answers reached the clients, in windows as the live detector keeps them
  (:class:`kproxy.metrics.group_anomalies.GroupWatch`: a window opens at a join past the last one's
  ``rebalance_window`` seconds); one per window whose joins reach ``rebalance_joins``, for the
  client whose join reached it;
* ``vanished_member``: the group membership exchanges (JoinGroup, Heartbeat, LeaveGroup answered)
  replayed in the order they were answered, as the live watch keeps its members: a dynamic member a
  JoinGroup answered without error names, seen again at each Heartbeat answered, forgotten at a
  Heartbeat answered UNKNOWN_MEMBER_ID or a LeaveGroup answered without error; looked at, at most once
  a second, at each membership answer and connection close: one per member silent for longer than
  1.5 times its session timeout;
* ``retry_storm``: idempotent batches (a Produce partition's first batch: producer id 0 or more)
  sent again with the same producer id, base sequence and CRC within a minute of their first
  sending, replayed in the order the requests were read; per client id, in minute windows (a window
  opens at a batch sent again past the last one's minute), one per window whose batches sent again
  reach ``retries_per_minute``;
* ``connection_churn``: the connections that sent a request and closed (their close records), per
  client id in minute windows as above: one per window whose closes reach ``churn_per_minute``;

each by the connection's client id (its first request's), as the live detectors label them.

Client ids are cut as the live label cuts them (:func:`cut_label`); the report does not fold them
past a cap (the live detectors leave out the ids folded into ``other`` for churn and retry storms;
the report counts them all). What a capture cannot tell is left out and said
(:attr:`Anomalies.untold`): the kinds of the fields version 5 added, in a capture with records of an
older version (``retry_storm``, ``vanished_member``, ``uncompressed_producer``, ``connection_churn``);
``acks0_producer`` and ``uncompressed_producer`` when neither the capture's metadata nor a flag says
whether the run forbade them.

Spark jobs: one over the records per connection (its flags, counts, membership exchanges and
close), one over its result per client id (its closes, their times past the churn threshold), and
only where needed one for the close times a vanished member replay looks at (the first close of
each second: a member expired between two closes of one second is counted at the next look) and
one over the Produce batches (those sent more than once, when a connection sent idempotent
batches): only what may be an anomaly reaches the driver, replayed there. The driver holds the
membership exchanges of the capture (a member's few a minute).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kproxy.analysis.arguments import REBALANCE_JOINS, REBALANCE_WINDOW
from kproxy.capture.record_schema import CONNECTION_CLOSED_KEY
from kproxy.protocol.api_keys import HEARTBEAT, JOIN_GROUP, LEAVE_GROUP, OFFSET_COMMIT, PRODUCE, TXN_OFFSET_COMMIT
from kproxy.protocol.codes import DEPRECATED_VERSIONS, ErrorCode

# The live detectors' kinds, codes and constants (kproxy.metrics.client_anomalies, group_anomalies and
# retries, which analysis may not import: tests/test_analysis_anomalies.py checks the two agree).
STALE_GENERATION, PRODUCER_FENCED, PRODUCER_SEQUENCE = "stale_generation", "producer_fenced", "producer_sequence"
DEPRECATED_VERSION, REBALANCE_STORM = "deprecated_version", "rebalance_storm"
CONNECTION_CHURN, RETRY_STORM, VANISHED_MEMBER = "connection_churn", "retry_storm", "vanished_member"
ACKS0_PRODUCER, UNCOMPRESSED_PRODUCER = "acks0_producer", "uncompressed_producer"
COMMIT_APIS = frozenset({OFFSET_COMMIT, TXN_OFFSET_COMMIT})
STALE_CODES = frozenset({int(ErrorCode.ILLEGAL_GENERATION), int(ErrorCode.UNKNOWN_MEMBER_ID)})
FENCED_CODES = frozenset({int(ErrorCode.PRODUCER_FENCED), int(ErrorCode.INVALID_PRODUCER_EPOCH)})
SEQUENCE_CODES = frozenset({int(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), int(ErrorCode.DUPLICATE_SEQUENCE_NUMBER)})
DEPRECATED_UP_TO = {key: span[1] for key, span in DEPRECATED_VERSIONS.items() if span[0] == 0}
MAX_LABEL_LENGTH = 128  # a client id label's length at most, as kproxy.metrics.labels cuts it
UNCOMPRESSED_MIN_BYTES = 1024
MINUTE = 60.0  # seconds: churn's and retry storms' windows, and how long a batch sent is remembered
SESSION_SLACK = 1.5  # a member is gone after this many session timeouts without an answer
SWEEP_EVERY = 1.0  # seconds between two looks at the members
_UNKNOWN_MEMBER = int(ErrorCode.UNKNOWN_MEMBER_ID)
_V5_KINDS = (CONNECTION_CHURN, RETRY_STORM, VANISHED_MEMBER, UNCOMPRESSED_PRODUCER)


def cut_label(value: str) -> str:
    """``value`` cut as the live label is: to :data:`MAX_LABEL_LENGTH`, the last character ``~``."""
    return value if len(value) <= MAX_LABEL_LENGTH else value[:MAX_LABEL_LENGTH - 1] + "~"


@dataclass(frozen=True)
class Settings:
    """The live detectors' settings a report counts with (``metrics.client_anomalies_*``, by the same
    names). ``forbid_acks0`` / ``require_compression`` None: not known (a capture without the run's
    settings in its metadata, no flag): those kinds are not told."""

    churn_per_minute: int = 60
    forbid_acks0: bool | None = None
    require_compression: bool | None = None
    rebalance_joins: int = REBALANCE_JOINS
    rebalance_window: float = REBALANCE_WINDOW
    retries_per_minute: int = 30

    def over(self, changes: Mapping[str, Any]) -> Settings:
        """These settings with ``changes``' values that are not None (flags over the capture's)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def recorded(cls, raw: str | bytes | None, where: str = "capture") -> Settings:
        """The settings a capture file's metadata records (:data:`~kproxy.capture.record_schema.ANOMALY_METADATA_KEY`;
        None: the defaults, the producer policy unknown). A value of the wrong type raises ValueError
        naming it and ``where``."""
        if raw is None:
            return cls()
        try:
            given = json.loads(raw)
        except ValueError:
            raise ValueError(f"{where}: unreadable client anomaly settings {raw!r}") from None
        if not isinstance(given, dict):
            raise ValueError(f"{where}: client anomaly settings are not an object: {raw!r}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in given:
                continue
            value = given[f.name]
            wanted = (bool,) if f.name in ("forbid_acks0", "require_compression") else (
                (int, float) if f.name == "rebalance_window" else (int,))
            if not isinstance(value, wanted) or (bool not in wanted and isinstance(value, bool)):
                raise ValueError(f"{where}: client anomaly setting {f.name}={value!r} is not a {wanted[0].__name__}")
            values[f.name] = float(value) if f.name == "rebalance_window" else value
        return cls(**values)


ANOMALIES_SCHEMA = pa.schema([("kind", pa.string()), ("client_id", pa.string()), ("count", pa.int64())])


@dataclass
class Anomalies:
    """The report's client anomalies: the table, and the kinds it could not tell (kind -> why)."""

    table: pa.Table
    untold: dict[str, str] = field(default_factory=dict)
    closes: int = 0  # connection close records read (not requests: the records' count leaves them out)


def _codes() -> Any:
    """A record's answer error codes: its top-level one and its partitions' (no nulls: with one,
    ``arrays_overlap`` answers null where nothing is shared)."""
    partition_codes = F.coalesce(F.col("partitions.error_code"), F.array().cast("array<smallint>"))
    return F.array_compact(F.concat(F.array(F.col("error_code")), partition_codes))


def _carries(codes: Any, wanted: frozenset[int]) -> Any:
    return F.arrays_overlap(codes, F.array(*[F.lit(c).cast("smallint") for c in sorted(wanted)]))


def _cut(column: Any) -> Any:
    """:func:`cut_label` in Spark."""
    return F.when(F.length(column) > MAX_LABEL_LENGTH,
                  F.concat(F.substring(column, 1, MAX_LABEL_LENGTH - 1), F.lit("~"))).otherwise(column)


def client_anomalies(df: DataFrame, settings: Settings | None = None, versions: Iterable[int] = ()) -> Anomalies:
    """The anomalies of the capture records ``df`` (connection close records included) with
    ``settings``; ``versions``: the capture's schema versions (an older one than 5 leaves the kinds of
    its fields untold). See the module docstring."""
    settings = settings or Settings()
    untold: dict[str, str] = {}
    old = sorted(v for v in set(versions) if v < 5)
    if old:
        for kind in _V5_KINDS:
            untold[kind] = (f"records of capture schema version {', '.join(map(str, old))} (version 5 records "
                            f"what it needs)")
    for kind, flag, option in ((ACKS0_PRODUCER, settings.forbid_acks0, "forbid_acks0"),
                               (UNCOMPRESSED_PRODUCER, settings.require_compression, "require_compression")):
        if flag is None and kind not in untold:
            untold[kind] = (f"the capture does not say whether the run set metrics.client_anomalies_{option} "
                            f"(--{option.replace('_', '-')} tells)")
    codes = _codes()
    api = F.col("api_key")
    closed = api == CONNECTION_CLOSED_KEY
    answered = F.col("response_time").isNotNull()
    last_deprecated = F.create_map(*[F.lit(v) for pair in sorted(DEPRECATED_UP_TO.items()) for v in pair])
    deprecated = ~closed & (F.col("api_version") <= F.coalesce(F.element_at(last_deprecated, api.cast("int")),
                                                               F.lit(-1)))
    fenced = _carries(codes, FENCED_CODES)
    sequence = ~fenced & (api == PRODUCE) & _carries(codes, SEQUENCE_CODES)
    stale = ~fenced & api.isin(*sorted(COMMIT_APIS)) & _carries(codes, STALE_CODES)
    acks0 = (api == PRODUCE) & (F.col("acks") == 0) if settings.forbid_acks0 else F.lit(False)
    uncompressed = ((api == PRODUCE) & F.exists("partitions", lambda p: (p["codec"] == 0)
                                                & (p["record_bytes"] >= UNCOMPRESSED_MIN_BYTES))
                    if settings.require_compression else F.lit(False))
    error_free = F.size(F.filter(codes, lambda c: c != 0)) == 0
    membership = api.isin(JOIN_GROUP, HEARTBEAT, LEAVE_GROUP) & answered & F.col("group_id").isNotNull()
    client = F.coalesce(F.col("client_id"), F.lit(""))
    counted_kinds = ((PRODUCER_FENCED, fenced), (PRODUCER_SEQUENCE, sequence), (STALE_GENERATION, stale))
    once_kinds = ((DEPRECATED_VERSION, deprecated), (ACKS0_PRODUCER, acks0), (UNCOMPRESSED_PRODUCER, uncompressed))
    idempotent = F.size(F.filter(F.coalesce(F.col("partitions"), F.array()), lambda p: p["producer_id"] >= 0))
    per_connection = df.groupBy("connection_id").agg(
        # (a close record last: the client id is the first request's)
        F.min_by(client, F.struct(closed.alias("closed"), "request_time", "correlation_id")).alias("client_id"),
        F.sum((~closed).cast("int")).alias("requests"),
        F.max(F.when(api == PRODUCE, idempotent)).alias("idempotent"),
        F.max(F.when(closed, F.unix_micros("request_time"))).alias("closed_at"),
        *[F.max(F.coalesce(found, F.lit(False)).cast("int")).alias(kind) for kind, found in once_kinds],
        *[F.sum(F.coalesce(found, F.lit(False)).cast("int")).alias(kind) for kind, found in counted_kinds],
        # (collect_list leaves out the nulls: the records that are no membership exchange)
        F.collect_list(F.when(membership, F.struct(
            F.unix_micros("response_time").alias("at"), F.col("correlation_id").alias("correlation_id"),
            api.alias("api_key"), F.col("group_id").alias("group"), F.col("member_id").alias("member"),
            F.col("session_timeout_ms").alias("session_ms"), F.col("group_instance_id").isNotNull().alias("static"),
            # (a join counts as the live watch counts it: top-level code 0; the others: no code at all)
            F.coalesce(F.col("error_code") == 0, F.lit(False)).alias("joined"), error_free.alias("ok"),
            F.array_contains(codes, F.lit(_UNKNOWN_MEMBER).cast("smallint")).alias("unknown")))).alias("memberships"))
    per_connection = per_connection.cache()
    try:
        kinds = [k for k, _ in once_kinds] + [k for k, _ in counted_kinds]
        # (a connection that sent idempotent batches: its client id, should they be sent again)
        flagged = " + ".join(kinds) + " > 0 OR size(memberships) > 0 OR idempotent > 0"
        counted: dict[tuple[str, str], int] = {}
        clients: dict[str, str] = {}
        events: list[tuple[int, str, int, Any, str]] = []  # (answered at, connection, correlation id, exchange, client)
        idempotent_batches = False
        for row in per_connection.where(flagged).collect():
            clients[row["connection_id"]] = row["client_id"]
            idempotent_batches = idempotent_batches or bool(row["idempotent"])
            for kind in kinds:
                if row[kind] and kind not in untold:
                    key = (kind, cut_label(row["client_id"]))
                    counted[key] = counted.get(key, 0) + row[kind]
            events.extend((m["at"], row["connection_id"], m["correlation_id"], m, row["client_id"])
                          for m in row["memberships"])
        # (the close times matter only where a member may vanish)
        tracked = any(m["api_key"] == JOIN_GROUP and m["session_ms"] and m["member"] for _, _, _, m, _ in events)
        churned, swept, closes = _closes(per_connection, settings.churn_per_minute, tracked)
    finally:
        per_connection.unpersist()
    retried = _retried(df) if idempotent_batches and RETRY_STORM not in untold else []
    joins = [(m["group"], at, connection, correlation, client)
             for at, connection, correlation, m, client in events if m["api_key"] == JOIN_GROUP and m["joined"]]
    for found in (rebalance_storms(joins, settings.rebalance_joins, settings.rebalance_window),
                  {} if CONNECTION_CHURN in untold else churned,
                  {} if VANISHED_MEMBER in untold else vanished_members(events, swept),
                  {} if RETRY_STORM in untold else retry_storms(
                      [(at, key, clients.get(connection, "")) for at, key, connection in retried],
                      settings.retries_per_minute)):
        for key, n in found.items():
            counted[key] = counted.get(key, 0) + n
    ordered = sorted(counted)
    table = pa.table({"kind": [k for k, _ in ordered], "client_id": [c for _, c in ordered],
                      "count": [counted[key] for key in ordered]}, schema=ANOMALIES_SCHEMA)
    return Anomalies(table, untold, closes)


def _closes(per_connection: DataFrame, threshold: int, members: bool
            ) -> tuple[dict[tuple[str, str], int], list[int], int]:
    """Connection churn (see the module docstring), the close times the live watch would have looked
    at its members at (``members``: there are members to look at; the first close a second, µs since
    the epoch) and the close records' count: a Spark job per client id (a row each: its closes' count,
    their times when past the threshold), one more per second of closes when ``members``."""
    closed = per_connection.where(F.col("closed_at").isNotNull())
    client = F.when(F.col("requests") > 0, _cut(F.col("client_id")))  # (null: a connection that sent nothing)
    by_client = (closed.groupBy(client.alias("client"))
                 .agg(F.count(F.lit(1)).alias("n"), F.sort_array(F.collect_list("closed_at")).alias("closes"))
                 .select("client", "n", F.when(F.col("client").isNotNull() & (F.col("n") >= threshold),
                                               F.col("closes")).alias("closes")))
    counted: dict[tuple[str, str], int] = {}
    closes = 0
    for row in by_client.collect():
        closes += row["n"]
        n = _minute_windows(row["closes"] or (), threshold)
        if n:
            counted[(CONNECTION_CHURN, row["client"])] = n
    swept: list[int] = []
    if members and closes:
        seconds = closed.groupBy(F.floor(F.col("closed_at") / 1_000_000)).agg(F.min("closed_at").alias("at"))
        swept = sorted(r["at"] for r in seconds.collect())
    return counted, swept, closes


def _minute_windows(times: Iterable[int], threshold: int) -> int:
    """Windows of a minute reaching ``threshold`` events, as the live MinuteWindow counts them: a
    window opens at an event a minute or more past the last one's start (``times``: µs, in order)."""
    start: float | None = None
    n = storms = 0
    for t in times:
        at = t / 1_000_000
        if start is None or at - start >= MINUTE:
            start, n = at, 0
        n += 1
        if n == threshold:
            storms += 1
    return storms


def _retried(df: DataFrame) -> list[tuple[int, tuple[int, int, int], str]]:
    """Each sending of an idempotent batch (a Produce partition's first batch, producer id 0 or more)
    sent more than once in the capture: (read at, µs; (producer id, base sequence, CRC); connection)."""
    batches = (df.where((F.col("api_key") == PRODUCE) & (F.size("partitions") > 0))
               .select(F.unix_micros("request_time").alias("at"), "connection_id", F.explode("partitions").alias("p"))
               .where(F.col("p.producer_id") >= 0)
               .groupBy(F.col("p.producer_id").alias("producer"), F.col("p.base_sequence").alias("sequence"),
                        F.col("p.batch_crc").alias("crc"))
               .agg(F.collect_list(F.struct("at", "connection_id")).alias("sent"))
               .where(F.size("sent") > 1).collect())
    return sorted((s["at"], (r["producer"], r["sequence"], r["crc"]), s["connection_id"])
                  for r in batches for s in r["sent"])


def retry_storms(sent: list[tuple[int, tuple[int, int, int], str]], threshold: int) -> dict[tuple[str, str], int]:
    """``{(retry_storm, client id): storms}`` from the sendings of batches sent more than once, ``(read
    at: µs, (producer id, base sequence, CRC), client id)`` each (:func:`_retried`'s, with their
    connections' client ids), replayed in order as the live watch keeps them: a sending is one again
    when its batch's first sending is less than a minute before it (else it is the batch's first);
    per client id, minute windows of those (:func:`_minute_windows`)."""
    first: dict[tuple[int, int, int], float] = {}
    again: dict[str, list[int]] = {}
    for at, key, client in sorted(sent):
        then = first.get(key)
        if then is not None and (at - then) / 1_000_000 < MINUTE:
            again.setdefault(cut_label(client), []).append(at)
        else:
            first[key] = at
    counted = {(RETRY_STORM, client): _minute_windows(times, threshold) for client, times in again.items()}
    return {key: n for key, n in counted.items() if n}


def vanished_members(events: list[tuple[int, str, int, Any, str]], swept_at: list[int]) -> dict[tuple[str, str], int]:
    """``{(vanished_member, client id): members}`` from the membership exchanges ``(answered at: µs,
    connection, correlation id, exchange fields, client id)`` and the connection close times the
    live watch also looks at its members at (µs), replayed as the module docstring says. An exchange's
    fields: ``api_key``, ``group``, ``member``, ``session_ms``, ``static``, ``ok`` (no error code),
    ``unknown`` (UNKNOWN_MEMBER_ID among them)."""
    members: dict[tuple[str, str], tuple[str, float, float]] = {}  # -> (client id, session s, last seen s)
    counted: dict[tuple[str, str], int] = {}
    swept = float("-inf")
    timeline = sorted([(at, connection, correlation, m, client) for at, connection, correlation, m, client in events]
                      + [(at, "", -1, None, "") for at in swept_at], key=lambda e: (e[0], e[1], e[2]))
    for at_us, _, _, m, client in timeline:
        now = at_us / 1_000_000
        if m is not None:
            key = (m["group"], m["member"] or "")
            if m["api_key"] == JOIN_GROUP:
                if m["ok"] and m["member"] and (m["session_ms"] or 0) > 0 and not m["static"]:
                    members[key] = (client, m["session_ms"] / 1000.0, now)
            elif m["api_key"] == HEARTBEAT:
                member = members.get(key)
                if member is not None:
                    if m["unknown"]:
                        del members[key]
                    else:
                        members[key] = (member[0], member[1], now)
            elif m["ok"]:  # LeaveGroup, answered: the member left
                members.pop(key, None)
        if now - swept < SWEEP_EVERY:
            continue
        swept = now
        for key in [k for k, (_, session, seen) in members.items() if now - seen > session * SESSION_SLACK]:
            label = (VANISHED_MEMBER, cut_label(members.pop(key)[0]))
            counted[label] = counted.get(label, 0) + 1
    return counted


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
