"""bench/bench_publish.py, the fixed-rate publish latency benchmark, runs end to end (a smoke run:
a tiny rate for a second, so the benchmark does not rot between the runs that measure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def test_smoke_run_measures_every_path_and_the_loop_stalls(tmp_path: Path) -> None:
    stalls = tmp_path / "stalls"
    stalls.mkdir()
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_publish.py"), "--rounds", "1", "--seconds", "1", "--warmup", "0.2",
         "--rates", "50", "--sizes", "100", "--variants", "metrics", "--stalls", str(stalls)],
        capture_output=True, text=True, timeout=180, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    report = out.stdout
    rows = {line.split("|")[1].strip(): line for line in report.splitlines() if line.startswith("| ")}
    for path in ("direct", "direct A/A", "pipe", "kproxy"):
        assert path in rows, report
    assert "#### Target: kproxy against the pipe" in report
    assert "#### Loop stalls" in report
    (stall_file,) = stalls.glob("stalls-*.json")  # the kproxy process's, written as it stopped
    doc = json.loads(stall_file.read_text())
    # The counted messages went through kproxy's pumps after the reset: their steps were seen.
    pump = doc["steps"]["_client_to_upstream"]
    assert pump["count"] > 0, doc["steps"]
    # Each step's wall time split three ways, from the loop thread's schedstat: its CPU, its wait for
    # a core, and what is left (blocked: the GIL), so that a long step says which it was.
    assert pump["cpu_ms"] > 0 and pump["run_queue_ms"] >= 0 and pump["blocked_ms"] >= 0, pump
    # The thread's CPU clock and the kernel's run-queue account are read separately around each step and
    # do not agree to the microsecond, so their sum may pass the wall time a little on a busy machine:
    # each is held to the wall time alone.
    assert pump["cpu_ms"] <= pump["total_ms"] * 1.05 + 1, pump
    assert pump["run_queue_ms"] <= pump["total_ms"] * 1.05 + 1, pump
    assert isinstance(doc["blocked_histogram"], dict) and doc["blocked_steps"] >= 0
    assert "steps' ms CPU/queue/blocked" in report


def test_capture_splits_the_time_between_proxy_and_broker(tmp_path: Path) -> None:
    stalls = tmp_path / "not-made-yet"  # the benchmark makes it
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_publish.py"), "--rounds", "1", "--seconds", "1", "--warmup", "0.2",
         "--rates", "50", "--sizes", "100", "--variants", "capture", "--skip", "direct A/A,pipe",
         "--broker-nice", "1", "--stalls", str(stalls)],
        capture_output=True, text=True, timeout=180, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    report = out.stdout
    assert "brokers at nice 1" in report
    assert list(stalls.glob("stalls-*.json")), "the stall watch wrote nothing"
    assert "#### Inside the proxy and behind it" in report
    [row] = [line for line in report.splitlines() if line.startswith("| kproxy +capture |")
             and line.count("|") == 9]
    cells = [c.strip() for c in row.split("|")[2:-1]]
    # Only the counted second's Produce requests: 50 messages, one request each at this rate (the
    # warm-up's are left out), and each split into kproxy's time and the broker's.
    assert 40 <= int(cells[0].replace(",", "")) <= 50, row
    own_p50, broker_p50 = float(cells[1]), float(cells[4])
    assert 0 < own_p50 < broker_p50, row


def test_a_client_that_went_around_the_proxy_is_refused() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import bench_publish
        from _paths import Hop
    finally:
        sys.path.remove(str(BENCH))
    stats = {"brokers": {"127.0.0.1:9092/1": {"name": "127.0.0.1:9092/1", "nodeid": 1, "req": {"Produce": 7}},
                         "127.0.0.1:7000/bootstrap": {"name": "127.0.0.1:7000/bootstrap", "nodeid": -1,
                                                      "req": {"Metadata": 2}}}}
    hop = Hop("pipe", 7000)
    with pytest.raises(RuntimeError, match="went to the broker itself"):
        bench_publish.produce_requests_of(json.dumps(stats), hop, 9092)
    assert bench_publish.produce_requests_of(json.dumps(stats), Hop("direct", 9092), None) == 7
    assert bench_publish.produce_requests_of(json.dumps(stats), hop, 9093) == 7


def _bench_publish() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        import bench_publish
    finally:
        sys.path.remove(str(BENCH))
    return bench_publish


def _results(bp: Any, avg_ms: dict[str, float], p99_ms: dict[str, float]) -> Any:
    """Three rounds per path, each of 100 latencies: 98 at the path's avg and two at its p99 (so the
    avg moves a little with the p99, as it does in a real sample)."""
    results = bp.Results()
    load = bp.Load(5000, 1024)
    for path, avg in avg_ms.items():
        for _ in range(3):
            latencies = [avg / 1e3] * 98 + [p99_ms[path] / 1e3] * 2
            results.add(load, path, bp.Sample(latencies, 0, 5.0, None, 500, 0.0, 0.0, 0.0))
    return results


def test_the_verdict_is_void_when_direct_disagrees_with_itself() -> None:
    bp = _bench_publish()
    quiet = _results(bp, {"direct": 1.5, "direct A/A": 1.5, "pipe": 1.8, "cand": 1.9},
                     {"direct": 3.0, "direct A/A": 3.2, "pipe": 3.5, "cand": 4.0})
    statuses = [row[3] for row in bp.target_rows(quiet, "cand")]
    assert statuses == ["met", "met"], statuses
    slower = _results(bp, {"direct": 1.5, "direct A/A": 1.5, "pipe": 1.8, "cand": 3.0},
                      {"direct": 3.0, "direct A/A": 3.2, "pipe": 3.5, "cand": 9.0})
    assert [row[3] for row in bp.target_rows(slower, "cand")] == ["**not met**", "**not met**"]
    # The broker alone saturated: direct's two measurements of the same path apart by tens of ms. A
    # pipe that fell further behind than the candidate must not make the candidate "met".
    saturated = _results(bp, {"direct": 40.0, "direct A/A": 48.0, "pipe": 320.0, "cand": 39.0},
                         {"direct": 150.0, "direct A/A": 130.0, "pipe": 690.0, "cand": 175.0})
    rows = bp.target_rows(saturated, "cand")
    assert all(row[3].startswith("void: direct's A/A pair apart by") for row in rows), rows
    without_aa = _results(bp, {"direct": 1.5, "pipe": 1.8, "cand": 1.9}, {"direct": 3.0, "pipe": 3.5, "cand": 4.0})
    assert [row[3] for row in bp.target_rows(without_aa, "cand")] == ["met (unchecked: no A/A pair)"] * 2


def test_the_verdict_is_void_when_the_pipe_itself_queued_for_the_cores() -> None:
    bp = _bench_publish()
    # Direct quiet and in agreement, but the pipe (a few tens of µs of work a message) 15 ms behind it
    # on average: a candidate 20 ms behind would pass a bar of 1.5x that, by the scheduler's leave.
    queued = _results(bp, {"direct": 1.5, "direct A/A": 1.5, "pipe": 16.5, "cand": 21.5},
                      {"direct": 3.0, "direct A/A": 3.2, "pipe": 60.0, "cand": 66.0})
    rows = bp.target_rows(queued, "cand")
    assert all(row[3].startswith("void: the pipe itself added") for row in rows), rows
    # Only p99 past its bound (one stall in the pipe's rounds) is enough.
    p99_only = _results(bp, {"direct": 1.5, "direct A/A": 1.5, "pipe": 1.8, "cand": 1.9},
                        {"direct": 3.0, "direct A/A": 3.2, "pipe": 9.0, "cand": 4.0})
    assert all(row[3].startswith("void: the pipe itself") for row in bp.target_rows(p99_only, "cand"))


def _pm_qos_cpu_latency() -> int:
    """The kernel's current CPU latency target in µs (the least of the requests held)."""
    with open("/dev/cpu_dma_latency", "rb") as f:
        return int.from_bytes(f.read(4), sys.byteorder, signed=True)


@pytest.mark.skipif(not os.access("/dev/cpu_dma_latency", os.W_OK), reason="PM QoS needs root")
def test_idle_poll_holds_the_cpu_latency_request_for_the_block_only() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        from _idle import cores_polled_when_idle
    finally:
        sys.path.remove(str(BENCH))
    before = _pm_qos_cpu_latency()
    assert before > 0, "another process already holds the request at 0: the test would prove nothing"
    with cores_polled_when_idle() as phrase:
        assert _pm_qos_cpu_latency() == 0
        assert phrase.startswith("idle cores polling")
    assert _pm_qos_cpu_latency() == before
    with pytest.raises(RuntimeError), cores_polled_when_idle():
        raise RuntimeError("a run that failed")
    assert _pm_qos_cpu_latency() == before
