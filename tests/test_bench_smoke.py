"""Every benchmark of bench/ runs end to end at its smallest size (a smoke run: seconds, figures
meaningless), so that a script nobody ran since a change fails here rather than on the day it is
needed to measure. tests/test_bench_publish.py does the same, with more checks, for bench_publish.py;
tests/test_bench_analysis_smoke.py for bench_analysis.py, whose Spark session is a module's worth
of time on its own (a module of its own runs beside this one on another worker).

The smallest size still takes every code path a default run takes, once: each script's flags that
shorten what only steadies a figure (rounds, repeats, loop and phase lengths, settle times) are set
to their least, not the paths themselves.

A new bench/bench_*.py must get a row in SMOKE (test_every_benchmark_has_a_smoke_run says so)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
TABLE = "| --- |"  # a Markdown table's rule: the report the script prints

# Script: (its smallest arguments, what its report must hold: the table, and the size it was asked for
# where a shortcut flag such as --quick could override it).
SMOKE: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "bench_bulk.py": (["--rounds", "1", "--seconds", "0.3", "--reps", "2"], (TABLE,)),
    "bench_capture.py": (["--exchanges", "100", "--rounds", "1", "--stalls", "100"], (TABLE,)),
    "bench_capture_worker.py": (["--exchanges", "200", "--rounds", "1"], (TABLE,)),
    "bench_codec.py": (["--quick", "--repeats", "1", "--loop-seconds", "0"],
                       (TABLE, "Median of 1 side-by-side rounds")),
    # Enough requests that the pipe's CPU time per request is above the clock's tick (it divides by it).
    "bench_conns.py": (["--counts", "1,10", "--rounds", "1", "--requests", "2000", "--idle", "10", "--no-pipelined",
                        "--churn", "10"], (TABLE,)),
    "bench_hotpath.py": (["--rounds", "1", "--pairs", "100", "--warmup", "10"], (TABLE,)),  # (--quick: 2 x 1,000)
    "bench_instructions.py": (["--no-callgrind", "--calls", "--requests", "20", "--warmup", "5", "--paths", "pipe"],
                              (TABLE,)),
    "bench_partition_split.py": (["--repeats", "2"], (TABLE,)),
    "bench_patterns.py": ([], (TABLE,)),
    "bench_proxy.py": (["--quick", "--rounds", "1", "--seconds", "0.2", "--settle", "0", "--idle-connections", "10",
                        "--variants", "bare"], (TABLE, "#### Throughput (median of 1 rounds")),
    "bench_session_instructions.py": (["--no-callgrind", "--pairs", "20", "--workloads", "Metadata v1",
                                       "--variants", "metrics"], (TABLE,)),
    "bench_roundtrip.py": (["--procs", "1", "--requests", "100", "--rounds", "1"], ("p50",)),
    "bench_throttle.py": (["--quick", "--seconds", "0.3"], (TABLE, "0.3 s per measurement")),
}
ELSEWHERE = {"bench_publish.py": "tests/test_bench_publish.py",
             "bench_analysis.py": "tests/test_bench_analysis_smoke.py"}


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCH.glob("bench_*.py")}
    assert scripts == set(SMOKE) | set(ELSEWHERE), "give each bench/bench_*.py a row in SMOKE"
    for test in ELSEWHERE.values():
        assert (ROOT / test).is_file(), test


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_smoke_run(script: str) -> None:
    smoke_run(script, *SMOKE[script])


def smoke_run(script: str, args: list[str], expected: tuple[str, ...]) -> None:
    """``bench/SCRIPT ARGS`` ends with status 0 and each of ``expected`` in what it printed."""
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=900,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert done.returncode == 0, f"{script} {' '.join(args)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    missing = [text for text in expected if text not in done.stdout]
    assert not missing, f"{missing} not in:\n{done.stdout[-3000:]}"
