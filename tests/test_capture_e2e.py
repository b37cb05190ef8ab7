"""Capture from a real run: librdkafka through kproxy to Tansu, the capture read back with pyarrow."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

pq = pytest.importorskip("pyarrow.parquet")

from kproxy.capture.schema import COLUMN_NAMES, SCHEMA_VERSION, check_version  # noqa: E402
from tests.support.captured import PRODUCER_ID, CapturedRun  # noqa: E402


def _rows(run: CapturedRun) -> list[dict[str, Any]]:
    files = sorted(run.directory.glob("hour=*/capture-*.parquet"))
    assert files, "no capture file"
    assert not [p for p in run.directory.rglob(".*")], "a temporary file was left behind"
    rows: list[dict[str, Any]] = []
    for path in files:
        check_version(pq.read_metadata(path).metadata, str(path))
        rows.extend(pq.ParquetFile(path).read().to_pylist())
    return rows


def test_the_capture_holds_every_request_kproxy_counted(captured_run: CapturedRun) -> None:
    run = captured_run
    assert run.received == run.records
    rows = _rows(run)
    assert run.dropped == 0
    assert len(rows) == run.written
    assert set(rows[0]) == set(COLUMN_NAMES)
    assert {r["schema_version"] for r in rows} == {SCHEMA_VERSION}
    # Requests per api: the capture and kproxy's metrics count the same traffic independently.
    by_api = Counter(r["api_name"] for r in rows)
    from kproxy.protocol.tables import api_key, api_snake_name

    expected = {name: n for name, n in run.requests.items()}
    assert {api_snake_name(api_key(name) or 0): n for name, n in by_api.items()} == expected


def test_records_and_bytes_per_topic_match_what_was_sent(captured_run: CapturedRun) -> None:
    run = captured_run
    rows = _rows(run)
    produce = [r for r in rows if r["api_name"] == "Produce"]
    fetch = [r for r in rows if r["api_name"] == "Fetch"]
    assert produce and fetch

    def per_topic(rs: list[dict[str, Any]], what: str) -> Counter[str]:
        out: Counter[str] = Counter()
        for r in rs:
            for p in r["partitions"]:
                out[p["topic"]] += p[what]
        return out

    assert per_topic(produce, "record_count") == Counter({run.topic: run.records})
    assert per_topic(fetch, "record_count")[run.topic] == run.records
    assert sum(r["record_count"] for r in produce) == run.records_counted["produce"]
    # The broker stores the batches as produced: the bytes fetched are the bytes produced.
    produced_bytes = per_topic(produce, "record_bytes")[run.topic]
    assert produced_bytes > run.records * 10
    assert per_topic(fetch, "record_bytes")[run.topic] == produced_bytes
    partitions = {p["partition"] for r in produce for p in r["partitions"]}
    assert partitions == set(range(run.partitions))
    for r in produce:
        assert r["client_id"] == PRODUCER_ID
        assert r["acks"] == -1  # librdkafka's default: all in-sync replicas
        assert r["error_code"] is None
        assert all(p["error_code"] == 0 for p in r["partitions"])
        assert r["broker_latency_ms"] is not None and r["broker_latency_ms"] > 0
        assert r["kproxy_latency_ms"] >= 0
        assert r["response_time"] >= r["request_time"]
        assert r["node_id"] is not None  # produced on a broker listener, not the bootstrap one
        assert r["payloads"] is None  # keys and values are not captured by default
    assert all(r["client_host"] == "127.0.0.1" and r["client_port"] for r in rows)
    assert len({r["connection_id"] for r in rows}) >= 2
