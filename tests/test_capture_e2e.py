"""Capture from a real run: librdkafka through kproxy to Tansu, the capture read back with pyarrow."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pq = pytest.importorskip("pyarrow.parquet")

from kproxy.capture.schema import COLUMN_NAMES, SCHEMA_VERSION, check_version  # noqa: E402
from tests.support.captured import PRODUCER_ID, CapturedRun  # noqa: E402
from tests.support.e2e import consume_confluent, create_topic, produce_confluent, unique  # noqa: E402
from tests.support.proxy import running_proxy  # noqa: E402
from tests.support.tansu import free_port, wait_for_port  # noqa: E402


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


def test_sigterm_completes_the_open_file(tansu: Any, tmp_path: Path) -> None:
    """A real ``kproxy run`` process: while it runs, only a hidden temporary file exists; SIGTERM
    completes and renames it, with every record of the traffic in it."""
    port = free_port()
    capture = tmp_path / "capture"
    topic = unique("sigterm")
    create_topic(tansu.bootstrap, topic, partitions=1)
    argv = [sys.executable, "-m", "kproxy", "run", "--upstream", tansu.bootstrap, "--listen", f"127.0.0.1:{port}",
            "--broker-port-base", "0", "--shutdown-grace", "5", "--capture-dir", str(capture)]
    log = tmp_path / "kproxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_port("127.0.0.1", port)
        producer = produce_confluent(f"127.0.0.1:{port}", topic, [(b"k", b"v%d" % i) for i in range(50)])
        deadline = time.monotonic() + 10  # the writer flushes a row group within a second
        while not list(capture.rglob(".capture-*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(capture.rglob(".capture-*.tmp")), "no file being written"
        assert list(capture.rglob("capture-*.parquet")) == []  # nothing complete is visible yet
        proc.send_signal(signal.SIGTERM)  # with the producer still connected
        assert proc.wait(timeout=20) == 0
        del producer
    finally:
        if proc.poll() is None:
            proc.kill()
    assert list(capture.rglob(".*")) == [], log.read_text()
    files = list(capture.rglob("capture-*.parquet"))
    assert len(files) == 1
    rows = pq.ParquetFile(files[0]).read().to_pylist()
    produced = sum(p["record_count"] for r in rows if r["api_name"] == "Produce" for p in r["partitions"])
    assert produced == 50
    assert "Traceback" not in log.read_text()


def test_payloads_are_opt_in_and_capped(tansu: Any, tmp_path: Path) -> None:
    topic = unique("payloads")
    create_topic(tansu.bootstrap, topic, partitions=1)
    with running_proxy(tansu.bootstrap, capture__dir=str(tmp_path), capture__include_payloads=True,
                       capture__payload_max_bytes=4) as proxy:
        produce_confluent(proxy.bootstrap, topic, [(b"key-%d" % i, b"value-%d" % i) for i in range(5)],
                          **{"linger.ms": 50})
        got = consume_confluent(proxy.bootstrap, topic, 1, 5)
    assert len(got) == 5
    rows = [r for path in sorted(tmp_path.rglob("capture-*.parquet")) for r in pq.ParquetFile(path).read().to_pylist()]
    for api in ("Produce", "Fetch"):
        payloads = [p for r in rows if r["api_name"] == api for p in r["payloads"] or ()]
        assert sorted((p["key"], p["value"], p["key_size"], p["value_size"]) for p in payloads) == [
            (b"key-", b"valu", 5, 7)] * 5, api
        assert {p["topic"] for p in payloads} == {topic}
    assert all(r["payloads"] is None or r["api_name"] in ("Produce", "Fetch") or r["payloads"] == []
               for r in rows)
