"""``kproxy analyze --rules FILE``: what a rule file would have done to the captured traffic.

Every captured request is turned into :class:`~kproxy.rules.request_facts.StaticFacts`
and evaluated by :class:`~kproxy.rules.engine.RuleEngine`, the engine the proxy
runs, so a what-if and a live run share one matching code. Spark does the heavy
lifting: the records are partitioned and sorted (below), each partition is
evaluated by one engine in a Python task (``mapPartitions``; ``mapInArrow``
would need pandas, which PySpark requires even for Arrow maps), every hit
becomes a row of ``whatif_hits`` (written as Parquet), and the per-rule
aggregates are Spark group-bys over those rows.

Facts from a record (:func:`facts_of`): api key and version, correlation id,
client id, principal (the connection's when the exchange completed, as the session
knew it: the one the proxy's rules saw, except on the SaslAuthenticate exchange
that established it, which the rules met before the login), client address
(``client_host``), broker id (``node_id``; null for
the bootstrap listener, as the proxy passes it), acks, group id,
transactional id, and topics with their partitions (the ``partitions`` column:
the request's entries, plus response entries that carried an error or
records, which for Produce and Fetch are the request's own).

Ordering, and why it reproduces the live decisions. The engine's draws are a
pure function of ``(seed, rule, client id, broker id, api key, stream ordinal,
draw index)`` (see :mod:`kproxy.rules.engine`), where the stream ordinal
counts the requests of one api key on one connection in the order they were
read. Records are therefore evaluated sorted by ``request_time`` within each
connection (ties, a microsecond apart at most, by correlation id: clients
number requests in sending order), and the ordinal is counted in that order
over *every* record of the connection and api key, matched or not. The
``request_time`` values of every connection of one kproxy process come from one
monotonic clock plus one offset (:class:`kproxy.capture.service.CaptureService`),
so that order is the read order.
Time conditions (``after_seconds``, ``for_seconds``) count from the rule set's
load, taken here as the first request of the capture; ``window`` reads
``request_time`` as wall time.

Two evaluation orders:

* ``per-client`` (the default): records partitioned by client id and sorted
  per client in time order (a client's stream ordinals run over its
  connections). Exact whenever no rule keeps state shared by clients: a
  decision then depends only on the request and its ordinal.
* ``global``: when an enabled rule counts (``after_requests``, ``first``,
  ``every``) or throttles, its counter or token bucket is one for the whole
  proxy, so the live decision depends on the order of requests across
  connections. Then one engine sees every record, sorted by ``request_time``
  (ties by connection id, then correlation id): one Spark task, the price of
  an exact answer. Requests of two connections read in one instant (equal
  ``request_time``) are the one place a what-if may order two requests
  differently from the live proxy; so are captures of several kproxy
  processes (each its own clock offset).

What a what-if cannot know: the capture shows traffic as it was, so a fault
the rules would have injected does not change the requests that follow (no
retries appear); a ``throttle`` charges each request's ``request_bytes`` at
its captured time; and records the capture dropped (its ``dropped`` metric)
shift the ordinals of later requests of their client. Two differences from
a live run of the same file over the same traffic, by design (the what-if
matches exactly otherwise: tests/test_whatif.py checks it against a live run):
``after_seconds`` / ``for_seconds`` count here from the capture's first
request, live from the rule file's load (the capture does not know when that
was); and Fetch v13+ requests name topics by id, which both sides name from
the Metadata v10+ answers they read: live, only while a rule with a ``topic``
key is loaded (an id whose Metadata answer came before reads as the id's
text), in the capture from every answer it recorded, so a ``topic`` condition
on such a Fetch can match here where it did not live.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from kproxy.analysis.spark_schema import snake_api_name
from kproxy.protocol.codes import error_name
from kproxy.rules.engine import RuleEngine
from kproxy.rules.load import load_file, load_text
from kproxy.rules.model import RuleSet
from kproxy.rules.request_facts import IpAddress, Record, StaticFacts

HITS = "whatif_hits"
TABLES = ("whatif_rules", "whatif_by_api", "whatif_by_client", "whatif_by_topic", "whatif_errors")
PER_CLIENT, GLOBAL = "per-client", "global"
_EPOCH = datetime(1970, 1, 1)

HIT_SCHEMA = StructType([
    StructField("connection_id", StringType(), False),
    StructField("request_us", LongType(), False),
    StructField("correlation_id", IntegerType(), False),
    StructField("api_name", StringType(), False),
    StructField("client_id", StringType(), True),
    StructField("topics", ArrayType(StringType()), False),
    StructField("stream_ordinal", LongType(), False),
    StructField("rule", StringType(), False),
    StructField("dry_run", BooleanType(), False),
    StructField("actions", ArrayType(StringType()), False),
    StructField("error_code", ShortType(), True),  # the first inject_error's code
    StructField("error", StringType(), True),
    StructField("delay_ms", DoubleType(), False),  # every delay action, resolved (jitter drawn) and summed
    # The longest wait a throttle action would impose; dry-run rules are charged too (what they would do).
    StructField("throttle_ms", DoubleType(), False),
    StructField("draw", DoubleType(), True),  # the probability draw; null: the rule has no probability
])

INPUT_COLUMNS = ("connection_id", "correlation_id", "api_key", "api_name", "api_version", "client_id",
                 "principal", "client_host", "node_id", "acks", "group_id", "transactional_id", "request_bytes")


@dataclass(frozen=True)
class WhatIfRules:
    """A loaded rule file, as shipped to Spark's Python workers: its text (re-loaded there, so
    nothing but strings crosses the wire) and the ``--seed`` that replaces the file's ``seed``.
    Rules with a ``seed`` of their own keep it, as in the proxy."""

    source: str
    text: str
    seed: int | None = None

    @classmethod
    def from_file(cls, path: str, seed: int | None = None) -> WhatIfRules:
        """Load ``path``; raises :class:`kproxy.rules.RulesError` (every problem, file:line) when invalid."""
        load_file(path)  # the loader's own errors, before any Spark work
        with open(path, encoding="utf-8") as f:
            return cls(path, f.read(), seed)

    def load(self) -> RuleSet:
        rules = load_text(self.text, self.source)
        return rules if self.seed is None else dataclasses.replace(rules, seed=self.seed)


def shared_state(rules: RuleSet) -> tuple[str, ...]:
    """Ids of enabled rules whose state is shared by connections (schedule counters, unless they count
    per connection; an action's own, :attr:`~kproxy.rules.actions.base.RuleAction.shares_state`:
    throttle buckets; a rule waiting on another, ``schedule.after``, and the rule it waits on)."""
    waited = {r.match.schedule.after.rule for r in rules.rules
              if r.enabled and r.match.schedule is not None and r.match.schedule.after is not None}
    return tuple(r.id for r in rules.rules if r.enabled and (
        (r.match.schedule is not None and r.match.schedule.counts and not r.match.schedule.per_connection)
        or (r.match.schedule is not None and r.match.schedule.after is not None) or r.id in waited
        or any(a.shares_state for a in r.actions)))


@lru_cache(maxsize=4096)
def _ip(host: str | None) -> IpAddress | None:
    if host is None:
        return None
    try:
        return ipaddress.ip_address(host)
    except ValueError:  # a host name, or an address with a zone: no CIDR can match it
        return None


def facts_of(row: Any, *, start_us: int, stream_ordinal: int,
             connection_counts: dict[object, int] | None = None, records: bool = False) -> StaticFacts:
    """The engine's view of one record (``row``: the columns of ``INPUT_COLUMNS``, ``request_us``
    and ``topics``, a list of (topic, partition)); ``start_us``: the rule set's load time;
    ``connection_counts``: the per-connection counters of its connection (``per: connection``);
    ``records``: read the record keys of its ``payloads`` column (for a rule's ``record`` key)."""
    topics: dict[str, set[int]] = {}
    for entry in row["topics"] or ():
        parts = topics.setdefault(entry["topic"], set())
        if entry["partition"] is not None:
            parts.add(entry["partition"])
    request_us = row["request_us"]
    return StaticFacts(
        api_key=row["api_key"], api_version=row["api_version"], correlation_id=row["correlation_id"],
        client_id=row["client_id"], client_ip=_ip(row["client_host"]), broker_id=row["node_id"],
        principal=row["principal"], request_bytes=row["request_bytes"], stream_ordinal=stream_ordinal,
        now=(request_us - start_us) / 1e6,
        wall_time=request_us / 1e6,
        topic_partitions={t: frozenset(p) for t, p in topics.items()}, acks_value=row["acks"],
        group=row["group_id"], transactional=row["transactional_id"], connection_counts=connection_counts,
        produced=captured_records(row["payloads"]) if records else None)


def captured_records(payloads: Any) -> list[Record] | None:
    """The records of a capture's ``payloads`` column as a ``record`` key reads them: keys only (a
    capture keeps no headers), a key the capture cut to its cap read as unknown (no key matches
    it); None when the capture kept no payloads (``capture.include_payloads`` off)."""
    if payloads is None:
        return None
    out: list[Record] = []
    for p in payloads:
        key = p["key"]
        whole = key is not None and p["key_size"] == len(key)
        out.append(Record(p["offset"] or 0, -1, bytes(key) if whole else None, None, []))
    return out


def reads_records(rules: RuleSet) -> bool:
    """Whether an enabled rule has a ``record`` key (the what-if then reads the ``payloads`` column)."""
    return any(r.enabled and r.match.record is not None for r in rules.rules)


def evaluator(rules: WhatIfRules, start_us: int) -> Callable[[Iterable[Any]], Iterator[tuple[Any, ...]]]:
    """The function run on each partition: records in evaluation order in, one tuple per hit
    (:data:`HIT_SCHEMA`) out. One engine per partition, as one proxy process has one."""

    def run(rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        rule_set = rules.load()
        engine = RuleEngine(rule_set, loaded_at=0.0)
        with_records = reads_records(rule_set)
        ordinals: dict[tuple[str | None, int | None, int], int] = {}
        # Per connection id, the counters of rules counting per connection (one connection's records
        # are in one partition whichever the order: a client's).
        per_connection: dict[str, dict[object, int]] = {}
        for row in rows:
            key = (row["client_id"], row["node_id"], row["api_key"])
            ordinal = ordinals.get(key, 0)
            ordinals[key] = ordinal + 1  # every request counts, matched or not, as in the session
            if not engine.mentions(row["api_key"]):
                continue
            counted = per_connection.get(row["connection_id"])
            if counted is None:
                counted = per_connection[row["connection_id"]] = {}
            facts = facts_of(row, start_us=start_us, stream_ordinal=ordinal, connection_counts=counted,
                             records=with_records)
            decision = engine.evaluate(facts)
            if not decision.hits:
                continue
            topics = sorted(facts.topic_partitions)
            for hit in decision.hits:
                code = next((a.injected_error for a in hit.actions if a.injected_error is not None), None)
                throttle_s = max((a.whatif_hold_s(engine.buckets, hit.rule_id, facts, row["request_bytes"])
                                  for a in hit.actions), default=0.0)
                yield (row["connection_id"], row["request_us"], row["correlation_id"], row["api_name"],
                       row["client_id"], topics, ordinal, hit.rule_id, hit.dry_run,
                       [a.kind for a in hit.actions], code,
                       None if code is None else error_name(code), float(sum(hit.delays_ms)), throttle_s * 1000.0,
                       hit.draw)

    return run


@dataclass(frozen=True)
class WhatIf:
    """What the report says about the run itself."""

    source: str
    seed: int
    ordering: str  # PER_CLIENT or GLOBAL
    shared: tuple[str, ...]  # the rules that made it GLOBAL
    start: datetime  # the rule set's assumed load time: the capture's first request (UTC)


def evaluate(spark: SparkSession, df: DataFrame, rules: WhatIfRules, start_us: int) -> tuple[DataFrame, WhatIf]:
    """The hits of ``rules`` over the capture records ``df`` (lazy), and how they were ordered."""
    rule_set = rules.load()
    shared = shared_state(rule_set)
    topics = F.filter(F.transform(F.col("partitions"), lambda p: F.struct(p["topic"].alias("topic"),
                                                                          p["partition"].alias("partition"))),
                      lambda p: p["topic"].isNotNull())
    columns = (*INPUT_COLUMNS, "payloads") if reads_records(rule_set) else INPUT_COLUMNS
    prepared = df.select(*columns, F.unix_micros("request_time").alias("request_us"), topics.alias("topics"))
    if shared:
        prepared = prepared.repartition(1).sortWithinPartitions("request_us", "connection_id", "correlation_id")
    else:
        # A client's stream ordinals run over its connections (kproxy.rules.engine): all of one
        # client id's records in one partition, in time order.
        prepared = prepared.repartition("client_id").sortWithinPartitions(
            "client_id", "request_us", "connection_id", "correlation_id")
    hits = (spark.createDataFrame(prepared.rdd.mapPartitions(evaluator(rules, start_us)), HIT_SCHEMA)
            .withColumn("api_name", snake_api_name()))  # on the hits only, not on every record read
    start = _EPOCH + timedelta(microseconds=start_us)  # naive UTC, as Spark returns timestamps here
    info = WhatIf(rules.source, rule_set.seed, GLOBAL if shared else PER_CLIENT, shared, start)
    return hits, info


def _rules_frame(spark: SparkSession, rule_set: RuleSet, api_requests: dict[int, int]) -> DataFrame:
    """One row per rule, in file order; ``api_requests``: captured requests per api key, so that
    each rule says how many requests of its apis it could have hit (``of_requests``)."""
    every = sum(api_requests.values())
    rows = [Row(position=i, rule=r.id, enabled=r.enabled, dry_run=r.dry_run,
                actions=", ".join(a.kind for a in r.actions), description=r.description,
                of_requests=every if r.match.apis is None else sum(api_requests.get(k, 0) for k in r.match.apis))
            for i, r in enumerate(rule_set.rules)]
    schema = ("position int, rule string, enabled boolean, dry_run boolean, actions string, "
              "description string, of_requests long")
    return spark.createDataFrame(rows, schema)


def _did() -> list[Any]:
    return [F.count(F.lit(1)).alias("requests"), F.sum(F.col("error_code").isNotNull().cast("long")).alias("errors"),
            F.sum("delay_ms").alias("delay_ms"), F.sum("throttle_ms").alias("throttle_ms")]


def aggregates(spark: SparkSession, hits: DataFrame, rule_set: RuleSet, api_requests: dict[int, int] | None = None
               ) -> dict[str, DataFrame]:
    """Per rule (every rule of the file, matched or not, in file order): requests matched (and of
    how many requests of its apis, from ``api_requests``: captured requests per api key),
    connections and clients, first and last time it would have fired, injected errors, delays and
    throttle summed; the same by api, by client id and by topic; injected errors by name."""
    when = F.col("request_us")
    per_rule = hits.groupBy("rule").agg(
        *_did(), F.countDistinct("connection_id").alias("connections"),
        F.countDistinct(F.coalesce("client_id", F.lit(""))).alias("clients"),
        F.timestamp_micros(F.min(when)).alias("first"), F.timestamp_micros(F.max(when)).alias("last"))
    out: dict[str, DataFrame] = {}
    out["whatif_rules"] = (_rules_frame(spark, rule_set, api_requests or {}).join(per_rule, "rule", "left")
                           .na.fill(0, ["requests", "errors", "connections", "clients"])
                           .na.fill(0.0, ["delay_ms", "throttle_ms"])
                           .select("rule", "enabled", "dry_run", "actions", "requests", "of_requests",
                                   "connections", "clients",
                                   "errors", "delay_ms", "throttle_ms", "first", "last", "position")
                           .orderBy("position").drop("position"))
    out["whatif_by_api"] = hits.groupBy("rule", "api_name").agg(*_did()).orderBy("rule", F.desc("requests"),
                                                                                  "api_name")
    out["whatif_by_client"] = (hits.groupBy("rule", F.coalesce("client_id", F.lit("")).alias("client_id"))
                               .agg(*_did()).orderBy("rule", F.desc("requests"), "client_id"))
    out["whatif_by_topic"] = (hits.select("*", F.explode("topics").alias("topic")).groupBy("rule", "topic")
                              .agg(*_did()).orderBy("rule", F.desc("requests"), "topic"))
    out["whatif_errors"] = (hits.where(F.col("error_code").isNotNull())
                            .groupBy("rule", "api_name", "error_code", "error")
                            .agg(F.count(F.lit(1)).alias("requests"))
                            .orderBy("rule", F.desc("requests"), "api_name", "error_code"))
    return out


def run(spark: SparkSession, df: DataFrame, rules: WhatIfRules, start_us: int, out: str,
        progress: Callable[[str], None] = lambda _: None) -> tuple[dict[str, list[dict[str, Any]]], WhatIf]:
    """Evaluate ``rules`` over ``df``; write the hits and the aggregates as Parquet under ``out``
    (``whatif_hits/``, ``whatif_rules/``, ...) and return the aggregates collected.

    The hits are written first and the aggregates read them back, so the engine runs once per
    record whatever the number of aggregates.
    """
    progress(f"what-if: evaluating {rules.source}")
    hits, info = evaluate(spark, df, rules, start_us)
    path = os.path.join(out, HITS)
    hits.write.mode("overwrite").parquet(path)
    written = spark.read.schema(HIT_SCHEMA).parquet(path)
    tables: dict[str, list[dict[str, Any]]] = {}
    api_requests = {r["api_key"]: r["n"] for r in df.groupBy("api_key").agg(F.count(F.lit(1)).alias("n")).collect()}
    for name, frame in aggregates(spark, written, rules.load(), api_requests).items():
        progress(f"what-if: aggregating {name}")
        frame = frame.cache()
        frame.write.mode("overwrite").parquet(os.path.join(out, name))
        tables[name] = [row.asDict() for row in frame.collect()]
        frame.unpersist()
    return tables, info
