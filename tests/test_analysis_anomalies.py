"""The analysis report's client anomalies (kproxy/analysis/capture_anomalies.py) against the live counter.

One shared run: real clients through a capturing kproxy whose rules provoke every kind (a fenced
producer, an out-of-order one, a stale-generation commit, a member whose heartbeats are answered
REBALANCE_IN_PROGRESS until its group's joins make a rebalance storm, a producer whose connections a
rule closes again and again, one whose batches a rule refuses until it has sent them again and
again, a member whose LeaveGroup a rule swallows), beside a broker's own UNKNOWN_MEMBER_ID answer,
a client on deprecated versions, an acks=0 producer and an uncompressed one (the run forbids both);
then ``kproxy analyze``'s table of that capture (the run's settings read from the capture) must say
what ``/metrics`` said, client by client, kind by kind.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer

from kproxy.analysis import capture_anomalies as offline
from kproxy.config.sections import MetricsOptions
from kproxy.metrics import client_anomalies as live
from kproxy.metrics import group_anomalies, retries
from kproxy.metrics.labels import cut_label
from kproxy.protocol import MessageType, default_body
from kproxy.testing import Broker, free_port, running_proxy
from tests.support.capture import T0_US, record
from tests.support.e2e import create_topic, unique
from tests.support.rawkafka import RawKafka
from tests.test_anomalies_e2e import (
    CHURN,
    JOINS,
    RETRIES,
    GroupMember,
    anomalies,
    committing_consumer,
    idempotent_producer,
    plain_producer,
    reconnecting_producer,
    wait_for,
)

RULES = """
rules:
  - id: fenced
    match: {api: produce, client_id: fenced-producer, schedule: {first: 1}}
    actions:
      - inject_error: {error: PRODUCER_FENCED}
  - id: out-of-order
    match: {api: produce, client_id: sequence-producer, schedule: {first: 1}}
    actions:
      - inject_error: {error: OUT_OF_ORDER_SEQUENCE_NUMBER}
  - id: stale
    match: {api: offset_commit, client_id: stale-consumer, schedule: {first: 1}}
    actions:
      - inject_error: {error: ILLEGAL_GENERATION}
  - id: storm
    match: {api: heartbeat, client_id: storming}
    actions:
      - inject_error: {error: REBALANCE_IN_PROGRESS}
  - id: churn
    match: {api: metadata, client_id: churner}
    actions:
      - close_connection
  - id: refuse
    match: {api: produce, client_id: retrier, schedule: {first: 8}}
    actions:
      - inject_error: {error: NOT_LEADER_OR_FOLLOWER}
  - id: lost-leave
    match: {api: leave_group, client_id: vanishing}
    actions:
      - blackhole
"""
STORM_WINDOW = 60.0  # seconds: the run's rebalance storm window (its joins: JOINS)


def test_the_analysis_knows_the_live_detectors_kinds_codes_and_label_cut() -> None:
    assert (offline.STALE_GENERATION, offline.PRODUCER_FENCED, offline.PRODUCER_SEQUENCE,
            offline.DEPRECATED_VERSION) == (live.STALE_GENERATION, live.PRODUCER_FENCED, live.PRODUCER_SEQUENCE,
                                            live.DEPRECATED_VERSION)
    assert (offline.COMMIT_APIS, offline.PRODUCE) == (live.COMMIT_APIS, live.PRODUCE)
    assert (offline.STALE_CODES, offline.FENCED_CODES, offline.SEQUENCE_CODES) == (
        live.STALE_CODES, live.FENCED_CODES, live.SEQUENCE_CODES)
    assert offline.DEPRECATED_UP_TO == live.DEPRECATED_UP_TO
    assert offline.REBALANCE_STORM == live.REBALANCE_STORM and offline.JOIN_GROUP == group_anomalies.JOIN_GROUP
    assert {offline.CONNECTION_CHURN, offline.RETRY_STORM, offline.VANISHED_MEMBER, offline.ACKS0_PRODUCER,
            offline.UNCOMPRESSED_PRODUCER, offline.REBALANCE_STORM, offline.DEPRECATED_VERSION,
            offline.STALE_GENERATION, offline.PRODUCER_FENCED, offline.PRODUCER_SEQUENCE} == set(live.KINDS)
    assert offline.UNCOMPRESSED_MIN_BYTES == live.UNCOMPRESSED_MIN_BYTES
    assert offline.MINUTE == live.CHURN_WINDOW == retries.WINDOW
    assert (offline.SESSION_SLACK, offline.SWEEP_EVERY) == (group_anomalies.SESSION_SLACK, group_anomalies.SWEEP_EVERY)
    defaults = MetricsOptions()  # (the analysis's defaults are the live detector's)
    live_defaults = (defaults.client_anomalies_rebalance_joins, defaults.client_anomalies_rebalance_window)
    assert live_defaults == (offline.REBALANCE_JOINS, offline.REBALANCE_WINDOW)
    # (and every setting's name and default: the capture records the live ones by name)
    settings = offline.Settings()
    assert {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)} == {
        **dataclasses.asdict(live.AnomalyOptions()), "forbid_acks0": None, "require_compression": None}
    for value in ("short", "x" * 128, "y" * 129, "z" * 5000):
        assert offline.cut_label(value) == cut_label(value)


def broker_answered_commit(bootstrap: str, topic: str) -> None:
    """A commit for a member its group does not know: Tansu answers UNKNOWN_MEMBER_ID itself."""
    raw = RawKafka(bootstrap, "raw-committer")
    try:
        raw.request(18, 3, default_body(18, 3, MessageType.REQUEST))
        body = default_body(8, 8, MessageType.REQUEST)
        body.update(group_id=unique("analysis-group"), generation_id_or_member_epoch=3, member_id="gone",
                    topics=[{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                            "committed_leader_epoch": -1, "committed_metadata": ""}]}])
        raw.request(8, 8, body)
    finally:
        raw.close()


def test_the_report_and_metrics_agree_on_a_shared_run(spark: Any, tansu: Broker, tmp_path: Path) -> None:
    from kproxy.analysis.job import run_analysis

    rules, capture = tmp_path / "rules.yaml", tmp_path / "capture"
    rules.write_text(RULES)
    port = free_port()
    topic = unique("analysis-anomalies")
    create_topic(tansu.bootstrap, topic, 1)  # straight to the broker: not captured
    with running_proxy(tansu.bootstrap, rules=str(rules), capture__dir=str(capture),
                       metrics_listen=f"127.0.0.1:{port}", metrics__client_anomalies_rebalance_joins=JOINS,
                       metrics__client_anomalies_rebalance_window=STORM_WINDOW,
                       metrics__client_anomalies_churn_per_minute=CHURN,
                       metrics__client_anomalies_retries_per_minute=RETRIES,
                       metrics__client_anomalies_forbid_acks0=True,
                       metrics__client_anomalies_require_compression=True) as proxy:
        idempotent_producer(proxy.bootstrap, topic, "fenced-producer", count=1)
        idempotent_producer(proxy.bootstrap, topic, "sequence-producer", count=1)
        idempotent_producer(proxy.bootstrap, topic, "clean-producer", count=2)
        idempotent_producer(proxy.bootstrap, topic, "retrier", count=1)  # retried until the rule lets it through
        plain_producer(proxy.bootstrap, topic, "fire-and-forget", acks=0, **{"compression.type": "lz4"})
        plain_producer(proxy.bootstrap, topic, "uncompressed", acks="all", **{"compression.type": "none"})
        reconnecting_producer(proxy.bootstrap, topic, "churner")
        reconnecting_producer(proxy.bootstrap, topic, "calm")
        committing_consumer(proxy.bootstrap, topic, "stale-consumer")
        broker_answered_commit(proxy.bootstrap, topic)
        old = KafkaConsumer(bootstrap_servers=proxy.bootstrap, client_id="old-client", api_version=(0, 10, 1),
                            request_timeout_ms=5000)
        try:
            old.topics()
        finally:
            old.close()
        storming = GroupMember(proxy.bootstrap, topic, "storming")
        leaving, staying = GroupMember(proxy.bootstrap, topic, "vanishing"), GroupMember(proxy.bootstrap, topic,
                                                                                        "staying")
        members = [storming, leaving, staying]
        try:
            wait_for(port, "rebalance_storm", "storming", timeout=60)
            assert leaving.assigned.wait(30) and staying.assigned.wait(30), "the members got no partition"
            members.remove(leaving)
            leaving.close()  # its LeaveGroup is swallowed: the broker expires its session
            wait_for(port, "vanished_member", "vanishing", timeout=30)  # (the staying member's heartbeats go on)
        finally:
            for member in members:
                member.close()
        wait_for(port, "connection_churn", "churner")
        wait_for(port, "retry_storm", "retrier")
        scraped = anomalies(port)
    assert scraped is not None
    counted = {key: int(n) for key, n in scraped.items()}
    # What the run was made to show (the stale consumer may meet the broker's own answer after the rule's).
    assert {("producer_fenced", "fenced-producer"), ("producer_sequence", "sequence-producer"),
            ("stale_generation", "stale-consumer"), ("stale_generation", "raw-committer"),
            ("deprecated_version", "old-client"), ("rebalance_storm", "storming"), ("connection_churn", "churner"),
            ("retry_storm", "retrier"), ("vanished_member", "vanishing"), ("acks0_producer", "fire-and-forget"),
            ("uncompressed_producer", "uncompressed")} <= set(counted)
    # Every kind provoked, and nothing of the clients that behaved.
    assert {kind for kind, _ in counted} == set(live.KINDS)
    assert not {client for _, client in counted} & {"clean-producer", "calm", "staying"}
    # The run's settings come from the capture (no flag given); the analysis tells every kind.
    result = run_analysis([str(capture)], tmp_path / "out", spark)
    assert result.problems == [] and result.untold_anomalies == {}
    reported = {(r["kind"], r["client_id"]): r["count"] for r in result.tables["client_anomalies"]}
    assert reported == counted
    # A flag overrides the capture's setting: without the producer policy, its two kinds are not counted.
    lax = run_analysis([str(capture)], tmp_path / "lax", spark, anomalies={"forbid_acks0": False,
                                                                           "require_compression": False})
    assert {r["kind"] for r in lax.tables["client_anomalies"]} == set(live.KINDS) - {
        "acks0_producer", "uncompressed_producer"}


def test_rebalance_storms_replay_each_groups_joins_in_the_live_windows() -> None:
    """3 joins within 60 s: a storm, for the client whose join reached it; a window opens at the first
    join past the last one's 60 s; groups apart; the order the joins were answered, not given."""
    second = 1_000_000
    joins = [("g", 0, "c1", 1, "a"), ("g", 10 * second, "c2", 1, "b"), ("g", 20 * second, "c1", 2, "a"),  # storm: a
             ("g", 30 * second, "c2", 2, "b"),  # (the 4th of that window: counted once)
             ("g", 61 * second, "c2", 3, "b"), ("g", 62 * second, "c1", 3, "a"),  # a new window: 2 joins only
             ("h", 5 * second, "c3", 1, "x" * 200), ("h", 1 * second, "c3", 2, "x" * 200),
             ("h", 3 * second, "c4", 1, "y")]
    assert offline.rebalance_storms(joins, 3, 60.0) == {("rebalance_storm", "a"): 1,
                                                        ("rebalance_storm", cut_label("x" * 200)): 1}


# -- the detectors over made-up records: each kind at its thresholds' edges -------------------------------
SECOND = 1_000_000  # µs


def _counted(spark: Any, tmp_path: Path, records: list[dict[str, Any]], settings: offline.Settings,
             versions: tuple[int, ...] = (5,)) -> tuple[dict[tuple[str, str], int], dict[str, str]]:
    """The report's client anomalies of ``records`` (written as a capture, read as the report reads it)."""
    from kproxy.analysis.inputs import find_inputs
    from kproxy.analysis.job import read_captures
    from kproxy.capture.writer import CaptureWriter

    writer = CaptureWriter(tmp_path / "capture", max_bytes_total=10**9, rotate_bytes=10**8,
                           rotate_seconds=3600).start()
    for rec in records:
        assert writer.offer(rec)
    writer.close()
    df = read_captures(spark, find_inputs([str(tmp_path / "capture")]), closes=True)
    assert df is not None
    found = offline.client_anomalies(df, settings, versions)
    return {(r["kind"], r["client_id"]): r["count"] for r in found.table.to_pylist()}, found.untold


def _on(connection: str, client: str, at_us: int, api_key: int, api_name: str, **values: Any) -> dict[str, Any]:
    return record(0, at_us=at_us, connection_id=connection, client_id=client, api_key=api_key, api_name=api_name,
                  response_time=at_us + 1000, **values)


def _closed(connection: str, at_us: int) -> dict[str, Any]:
    return record(0, at_us=at_us, connection_id=connection, client_id=None, api_key=-1, api_name="ConnectionClosed",
                  api_version=0, correlation_id=-1, request_bytes=0, response_bytes=None, broker_latency_ms=None,
                  close_reason="client closed")


def _batch(pid: int, sequence: int, crc: int, codec: int = 4, size: int = 200) -> dict[str, Any]:
    return {"topic": "t", "partition": 0, "error_code": 0, "record_count": 1, "record_bytes": size,
            "producer_id": pid, "producer_epoch": 0, "base_sequence": sequence, "batch_crc": crc, "codec": codec}


def test_a_request_at_exactly_the_last_deprecated_version_counts_and_the_next_does_not(spark: Any,
                                                                                       tmp_path: Path) -> None:
    last = offline.DEPRECATED_UP_TO[3]  # Metadata's last deprecated version
    records = [_on("c1", "at-last", T0_US, 3, "Metadata", api_version=last),
               _on("c2", "above", T0_US, 3, "Metadata", api_version=last + 1),
               _on("c3", "produce-at-last", T0_US, 0, "Produce", api_version=offline.DEPRECATED_UP_TO[0],
                   acks=-1)]
    counted, _ = _counted(spark, tmp_path, records, offline.Settings(forbid_acks0=False, require_compression=False))
    assert counted == {("deprecated_version", "at-last"): 1, ("deprecated_version", "produce-at-last"): 1}


def test_churn_retries_vanished_members_and_the_producer_policy_at_their_thresholds(spark: Any,
                                                                                    tmp_path: Path) -> None:
    t = T0_US
    records = []
    # Churn (3 a minute): three closes within 59 s, one window; three over exactly a minute, two windows.
    for i, at in enumerate((0, 30, 59)):
        records += [_on(f"churny-{i}", "churny", t + at * SECOND, 3, "Metadata"),
                    _closed(f"churny-{i}", t + at * SECOND + 1)]
    for i, at in enumerate((0, 30, 60)):
        records += [_on(f"slow-{i}", "slow", t + at * SECOND, 3, "Metadata"), _closed(f"slow-{i}", t + at * SECOND + 1)]
    records.append(_closed("probe", t))  # a connection that sent nothing: nobody's churn
    # Retry storms (2 again a minute): one batch sent three times within 2 s; another sent again a
    # minute later exactly (a first sending again, not a retry); a non-idempotent one sent twice.
    records += [_on("r1", "retrying", t + s * SECOND, 0, "Produce", acks=-1, partitions=[_batch(5, 0, 9)])
                for s in (0, 1, 2)]
    records += [_on("r2", "patient", t + s * SECOND, 0, "Produce", acks=-1, partitions=[_batch(6, 0, 9)])
                for s in (0, 60, 120)]
    records += [_on("r3", "plain", t + s * SECOND, 0, "Produce", acks=-1, partitions=[_batch(-1, -1, 9)])
                for s in (0, 1, 2)]
    # Vanished members (session 1 s: gone after 1.5 s unanswered, looked at once a second at most), after
    # the last close (a look at the members too): the beating member's last heartbeat is the last look.
    g = t + 200 * SECOND
    records += [_on("m1", "vanishing", g, 11, "JoinGroup", group_id="g", member_id="m-1", session_timeout_ms=1000,
                    error_code=0),
                _on("m2", "static", g, 11, "JoinGroup", group_id="g", member_id="m-2", group_instance_id="i-2",
                    session_timeout_ms=1000, error_code=0),
                _on("m3", "leaving", g, 11, "JoinGroup", group_id="g", member_id="m-3", session_timeout_ms=1000,
                    error_code=0),
                _on("m3", "leaving", g + SECOND // 2, 13, "LeaveGroup", group_id="g", member_id="m-3", error_code=0),
                _on("m4", "beating", g, 11, "JoinGroup", group_id="g", member_id="m-4", session_timeout_ms=1000,
                    error_code=0)]
    records += [_on("m4", "beating", g + ms * 1000, 12, "Heartbeat", group_id="g", member_id="m-4", error_code=0)
                for ms in range(500, 4000, 500)]
    # The producer policy: acks=0 once per connection; a batch of 1024 bytes uncompressed, not one of 1023.
    records += [_on("p1", "fire", t + s * SECOND, 0, "Produce", acks=0, partitions=[_batch(-1, -1, 1)])
                for s in (0, 1)]
    records += [_on("p2", "raw", t, 0, "Produce", acks=-1, partitions=[_batch(-1, -1, 2, codec=0, size=1024)]),
                _on("p3", "small", t, 0, "Produce", acks=-1, partitions=[_batch(-1, -1, 3, codec=0, size=1023)])]
    settings = offline.Settings(churn_per_minute=3, retries_per_minute=2, forbid_acks0=True, require_compression=True)
    counted, untold = _counted(spark, tmp_path / "v5", records, settings)
    assert untold == {}
    assert counted == {("connection_churn", "churny"): 1, ("retry_storm", "retrying"): 1,
                       ("vanished_member", "vanishing"): 1, ("acks0_producer", "fire"): 1,
                       ("uncompressed_producer", "raw"): 1}
    # Without the policy: its kinds not counted. With no word of it, not told, and said so.
    assert ("acks0_producer", "fire") not in _counted(spark, tmp_path / "lax", records, dataclasses.replace(
        settings, forbid_acks0=False))[0]
    counted, untold = _counted(spark, tmp_path / "unknown", records, offline.Settings(churn_per_minute=3,
                                                                                      retries_per_minute=2))
    assert set(untold) == {"acks0_producer", "uncompressed_producer"}
    assert {kind for kind, _ in counted} == {"connection_churn", "retry_storm", "vanished_member"}
    # Records of an older version than 5 among them: the kinds of its fields are not told.
    counted, untold = _counted(spark, tmp_path / "old", records, settings, versions=(4, 5))
    assert set(untold) == {"connection_churn", "retry_storm", "vanished_member", "uncompressed_producer"}
    assert "schema version 4" in untold["retry_storm"]
    assert counted == {("acks0_producer", "fire"): 1}


def test_retry_storms_and_vanished_members_replay_as_the_live_watches_keep_them() -> None:
    # A batch's first sending renews past a minute: its sendings at 0, 59, 61 and 62 s are first, again,
    # first, again; two of them a minute make a storm for the client whose batch made it.
    key = (1, 0, 7)
    sent = [(s * SECOND, key, "a") for s in (0, 59, 61, 62)] + [(s * SECOND, (2, 0, 7), "b") for s in (0, 1)]
    assert offline.retry_storms(sent, 2) == {("retry_storm", "a"): 1}
    assert offline.retry_storms(sent, 1) == {("retry_storm", "a"): 1, ("retry_storm", "b"): 1}

    def member(api_key: int, name: str, ok: bool = True, unknown: bool = False, session_ms: int = 2000,
               static: bool = False) -> dict[str, Any]:
        return {"api_key": api_key, "group": "g", "member": name, "session_ms": session_ms, "static": static,
                "ok": ok, "unknown": unknown}

    events = [(0, "c1", 1, member(11, "x"), "x-client"), (0, "c2", 1, member(11, "y"), "y-client"),
              (SECOND, "c2", 2, member(12, "y", ok=False, unknown=True), "y-client")]  # y: the broker forgot it
    # x silent from 0: gone once a look finds it silent for more than 3 s (a close at 3 s exactly: not yet).
    assert offline.vanished_members(events, [3 * SECOND]) == {}
    assert offline.vanished_members(events, [3 * SECOND + 1]) == {("vanished_member", "x-client"): 1}
    # Looks a second apart at most: one at 3.5 s comes too soon after the one at 3 s.
    assert offline.vanished_members(events, [3 * SECOND, 3 * SECOND + SECOND // 2]) == {}


def test_the_runs_settings_read_from_a_captures_metadata_and_flags_over_them() -> None:
    recorded = offline.Settings.recorded(json.dumps(dataclasses.asdict(live.AnomalyOptions(
        churn_per_minute=7, forbid_acks0=True, rebalance_window=30.0))), "f.parquet")
    assert recorded == offline.Settings(churn_per_minute=7, forbid_acks0=True, require_compression=False,
                                        rebalance_window=30.0)
    assert recorded.over({"churn_per_minute": None, "forbid_acks0": False}) == dataclasses.replace(
        recorded, forbid_acks0=False)
    assert offline.Settings.recorded(None) == offline.Settings()  # (the producer policy then unknown)
    for raw, said in (('{"churn_per_minute": "7"}', "churn_per_minute='7' is not a int"),
                      ('{"forbid_acks0": 1}', "forbid_acks0=1 is not a bool"),
                      ('{"retries_per_minute": true}', "retries_per_minute=True is not a int"),
                      ("[1]", "not an object"), ("{", "unreadable")):
        with pytest.raises(ValueError, match=re.escape(said)) as raised:
            offline.Settings.recorded(raw, "f.parquet")
        assert str(raised.value).startswith("f.parquet: ")


def test_a_threshold_flag_out_of_range_is_refused_before_spark_starts(tmp_path: Path) -> None:
    import io

    from kproxy.analysis.main import EXIT_USAGE, analyze

    for flags, said in (({"rebalance_joins": 1}, "--rebalance-joins 1: expected at least 2"),
                        ({"rebalance_window": 0.0}, "--rebalance-window 0: expected more than 0"),
                        ({"churn_per_minute": 0}, "--churn-per-minute 0: expected at least 1"),
                        ({"retries_per_minute": -3}, "--retries-per-minute -3: expected at least 1")):
        err = io.StringIO()
        assert analyze([str(tmp_path)], master="local[1]", out=str(tmp_path / "out"), stdout=io.StringIO(),
                       stderr=err, anomalies=flags) == EXIT_USAGE
        assert err.getvalue() == f"kproxy analyze: {said}\n"
