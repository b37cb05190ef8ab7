"""Shared helpers of the benchmark scripts: side-by-side timing, medians, Markdown tables.

The machine these run on is small (2 cores) and shared, so absolute timings move
from run to run. Every comparison here is made *side by side*: the candidates
are timed in turn inside each repeat (order rotated), and the median of the
repeats is reported, so a noisy neighbour hurts both sides alike.
"""

from __future__ import annotations

import datetime
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any


def machine_line() -> str:
    """One line saying where and when the figures were taken."""
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (f"{now}; kproxy {source_version()}; Python {platform.python_version()} ({sys.implementation.name}); {cpu}; "
            f"{os.cpu_count()} cores; load average {load}")


def source_version() -> str:
    """The git commit measured, ``+changes`` when the work tree differs from it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "kproxy"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown commit"
    return f"{commit or 'unknown commit'}{'+changes' if dirty else ''}"


def calibrate(fn: Callable[[], Any], min_time: float) -> int:
    """Calls of ``fn`` per timed loop so that one loop lasts at least ``min_time`` seconds."""
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time:
            return n
        n = max(n * 2, int(n * min_time / max(elapsed, 1e-9) * 1.2))


def side_by_side(cases: Sequence[tuple[str, Callable[[], Any]]], *, repeats: int,
                 min_time: float = 0.1) -> dict[str, float]:
    """Median seconds per call of each case, timed in turn within each of ``repeats`` rounds.

    The garbage collector stays on (it runs in production too) but is emptied
    before every timed loop so one case does not pay for another's garbage.
    """
    loops = {label: calibrate(fn, min_time) for label, fn in cases}
    samples: dict[str, list[float]] = {label: [] for label, _ in cases}
    for r in range(repeats):
        order = list(cases[r % len(cases):]) + list(cases[: r % len(cases)])
        for label, fn in order:
            n = loops[label]
            gc.collect()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples[label].append((time.perf_counter() - t0) / n)
    return {label: statistics.median(values) for label, values in samples.items()}


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100), nearest rank on sorted values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; numbers already formatted by the caller."""
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    out.extend("| " + " | ".join(str(c) for c in row) + " |" for row in rows)
    return "\n".join(out)


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1000
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def fmt_rate(per_s: float) -> str:
    return f"{per_s:,.0f}"


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"
