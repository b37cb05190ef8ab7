"""bench/bench_instructions.py's workloads: the canned broker's answers (a consumer's Fetch among
them, carrying v2 batches consumer lag dates offsets from), and a smoke run through a real kproxy
process (without valgrind: the Python calls per request), so the benchmark does not rot between the
runs that measure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kproxy.protocol.offset_reads import batches_written
from kproxy.protocol.payloads import decode_response
from kproxy.protocol.records import decode_all

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path[:0] = [str(BENCH)]

import bench_instructions  # noqa: E402

FETCH = "Fetch v11 4 partitions x 1 KB"


def test_the_fetch_workload_answers_v2_batches_for_each_partition() -> None:
    responses = bench_instructions.canned_responses(bench_instructions.WORKLOADS)
    answer = responses[bytes.fromhex("0001000b")]  # Fetch v11
    body = decode_response(answer[4:], 1, 11).body
    partitions = body["responses"][0]["partitions"]
    assert [p["partition_index"] for p in partitions] == [0, 1, 2, 3]
    for p in partitions:
        records = p["records"]
        assert [r.value for r in decode_all(records)] == [b"v" * 1024]
        start = answer.index(records)
        [(first, last, stamp)] = batches_written(answer, start, start + len(records), 8)
        assert (first, last) == (0, 0) and stamp > 0


def test_workloads_sharing_an_api_version_with_different_answers_are_refused() -> None:
    with pytest.raises(ValueError, match="same api key and version"):
        bench_instructions.canned_responses([FETCH, "Fetch v11 1 partition 1 KB"])


def test_smoke_run_counts_the_fetch_workload_through_kproxy(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_instructions.py"), "--paths", "metrics", "--workloads",
         f"{FETCH},Produce v7 1x100 B", "--requests", "64", "--warmup", "8", "--no-callgrind", "--calls"],
        capture_output=True, text=True, timeout=180, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {line.split("|")[1].strip() for line in out.stdout.splitlines() if line.startswith("| ")}
    assert {FETCH, "Produce v7 1x100 B"} <= rows, out.stdout
