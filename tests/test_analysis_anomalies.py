"""The analysis report's client anomalies (kproxy/analysis/capture_anomalies.py) against the live counter.

One shared run: real clients through a capturing kproxy whose rules provoke the anomalies a capture
can tell (a fenced producer, an out-of-order one, a stale-generation commit, a member whose
heartbeats are answered REBALANCE_IN_PROGRESS until its group's joins make a rebalance storm),
beside a broker's own UNKNOWN_MEMBER_ID answer and a client on deprecated versions; then ``kproxy
analyze``'s table of that capture (given the run's rebalance storm thresholds) must say what
``/metrics`` said for those kinds, client by client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kafka import KafkaConsumer

from kproxy.analysis import capture_anomalies as offline
from kproxy.config.sections import MetricsOptions
from kproxy.metrics import client_anomalies as live
from kproxy.metrics import group_anomalies
from kproxy.metrics.labels import cut_label
from kproxy.protocol import MessageType, default_body
from kproxy.testing import Broker, free_port, running_proxy
from tests.support.e2e import create_topic, unique
from tests.support.rawkafka import RawKafka
from tests.test_anomalies_e2e import JOINS, GroupMember, anomalies, committing_consumer, idempotent_producer, wait_for

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
"""
OFFLINE_KINDS = {live.STALE_GENERATION, live.PRODUCER_FENCED, live.PRODUCER_SEQUENCE, live.DEPRECATED_VERSION,
                 live.REBALANCE_STORM}
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
    defaults = MetricsOptions()  # (the analysis's defaults are the live detector's)
    live_defaults = (defaults.client_anomalies_rebalance_joins, defaults.client_anomalies_rebalance_window)
    assert live_defaults == (offline.REBALANCE_JOINS, offline.REBALANCE_WINDOW)
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
                       metrics__client_anomalies_rebalance_window=STORM_WINDOW) as proxy:
        idempotent_producer(proxy.bootstrap, topic, "fenced-producer", count=1)
        idempotent_producer(proxy.bootstrap, topic, "sequence-producer", count=1)
        idempotent_producer(proxy.bootstrap, topic, "clean-producer", count=2)
        committing_consumer(proxy.bootstrap, topic, "stale-consumer")
        broker_answered_commit(proxy.bootstrap, topic)
        old = KafkaConsumer(bootstrap_servers=proxy.bootstrap, client_id="old-client", api_version=(0, 10, 1),
                            request_timeout_ms=5000)
        try:
            old.topics()
        finally:
            old.close()
        storming = GroupMember(proxy.bootstrap, topic, "storming")
        try:
            wait_for(port, "rebalance_storm", "storming", timeout=60)
        finally:
            storming.close()
        scraped = anomalies(port)
    assert scraped is not None
    counted = {key: n for key, n in scraped.items() if key[0] in OFFLINE_KINDS}
    # What the run was made to show (the stale consumer may meet the broker's own answer after the rule's).
    assert {("producer_fenced", "fenced-producer"), ("producer_sequence", "sequence-producer"),
            ("stale_generation", "stale-consumer"), ("stale_generation", "raw-committer"),
            ("deprecated_version", "old-client"), ("rebalance_storm", "storming")} <= set(counted)
    result = run_analysis([str(capture)], tmp_path / "out", spark, rebalance=(JOINS, STORM_WINDOW))
    assert result.problems == []
    reported = {(r["kind"], r["client_id"]): r["count"] for r in result.tables["client_anomalies"]}
    assert reported == counted


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
