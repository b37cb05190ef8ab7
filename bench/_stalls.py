"""What holds kproxy's event loop, for the benchmarks: long task steps and garbage collections.

``KPROXY_BENCH_STALLS=DIR`` makes bench/run_kproxy.py install :class:`StallWatch`: a trio
instrument timing every task step (``before_task_step`` to ``after_task_step``) and a
``gc.callbacks`` hook timing every collection. SIGUSR1 forgets what was seen (the benchmark sends it once start-up is
over). When the process ends, DIR/stalls-PID.json holds
per task name the count and total of its steps and the steps over ``LONG``, and per generation
the collections and those over ``LONG``, each in wall and in CPU seconds of the loop's thread (a
long step with little CPU was the process waiting for a core, not kproxy's work): evidence of what
held requests (a step or collection that long delays every connection behind it) that does not
hang on the timings.

A long step's wall time is split three ways from the loop thread's ``/proc/thread-self/schedstat``
(read around every step, so the steps cost a few µs more with the watch on): CPU, waiting on a
run queue for a core (the machine's load), and the rest, blocked, which inside a step can only be
the GIL (kproxy's sockets never block: a step that finds no data parks the task). Per step kind
the totals of the three are kept too, so a run says how much of the loop's time went to waiting
for another thread of the process and how much to waiting for the machine.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import trio

LONG = 0.002  # a step or collection at least this long is listed one by one
BLOCKED = 0.0001  # a step blocked (waiting for the GIL) at least this long is counted


def _bucket(seconds: float) -> str:
    """A blocked time's bucket: ``<0.25 ms``, ``<0.5 ms``, ``<1 ms``, ``<2 ms``, ``<5 ms``, ``>=5 ms``."""
    for bound in (0.25, 0.5, 1, 2, 5):
        if seconds * 1e3 < bound:
            return f"<{bound:g} ms"
    return ">=5 ms"


def task_name(name: str) -> str:
    """A task's function name: ``_client_to_upstream`` of ``kproxy.server.connection.Connection._client_to_upstream``
    (interpreted) or of ``<bound method Connection._client_to_upstream of <...>>`` (compiled)."""
    if name.startswith("<bound method "):
        name = name[len("<bound method "):].split(" ", 1)[0]
    return name.rsplit(".", 1)[-1]


class StallWatch(trio.abc.Instrument):
    """Task steps and collections on this process, longest kept."""

    def __init__(self) -> None:
        self.clock = time.perf_counter
        self.cpu = time.thread_time
        self._schedstat = -1  # the loop thread's /proc/thread-self/schedstat, opened on its first step
        self.reset()
        gc.callbacks.append(self._gc)
        signal.signal(signal.SIGUSR1, lambda _signum, _frame: self.reset())

    def reset(self) -> None:
        """Forget what was seen so far (the benchmark's SIGUSR1: start-up is not steady state)."""
        self.started: dict[int, tuple[float, float, float]] = {}
        # task name -> [count, seconds, longest, CPU seconds, run-queue seconds]
        self.steps: dict[str, list[float]] = {}
        # at least LONG in wall time: (wall ms, CPU ms, task, run-queue ms, blocked ms)
        self.long_steps: list[tuple[float, float, str, float, float]] = []
        self.long_cpu_steps: list[tuple[float, float, str, float, float]] = []  # at least LONG in CPU time too
        self.blocked_steps = 0  # steps blocked (the GIL) at least BLOCKED in all
        self.blocked_hist: dict[str, int] = {}  # steps by blocked time, in ms buckets
        self.gc_started = (0.0, 0.0)
        self.collections: dict[int, list[float]] = {}
        self.long_collections: list[tuple[float, float, int]] = []

    def _queued(self) -> float:
        """Seconds the loop thread has waited on a run queue so far (schedstat's second field)."""
        if self._schedstat < 0:
            self._schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        return int(os.pread(self._schedstat, 100, 0).split()[1]) / 1e9

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.started[id(task)] = (self._queued(), self.cpu(), self.clock())

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        now = self.clock()
        t0 = self.started.pop(id(task), None)
        if t0 is None:
            return
        took = now - t0[2]
        cpu = self.cpu() - t0[1]
        queued = self._queued() - t0[0]
        blocked = max(0.0, took - cpu - queued)
        name = task_name(task.name)
        entry = self.steps.setdefault(name, [0, 0.0, 0.0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += took
        entry[2] = max(entry[2], took)
        entry[3] += cpu
        entry[4] += queued
        if blocked >= BLOCKED:
            self.blocked_steps += 1
            bucket = _bucket(blocked)
            self.blocked_hist[bucket] = self.blocked_hist.get(bucket, 0) + 1
        if took >= LONG:
            long = (round(took * 1e3, 2), round(cpu * 1e3, 2), name, round(queued * 1e3, 2), round(blocked * 1e3, 2))
            self.long_steps.append(long)
            if cpu >= LONG:
                self.long_cpu_steps.append(long)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.gc_started = (self.clock(), self.cpu())
            return
        took = self.clock() - self.gc_started[0]
        cpu = self.cpu() - self.gc_started[1]
        gen = info["generation"]
        entry = self.collections.setdefault(gen, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += took
        entry[2] = max(entry[2], took)
        if took >= LONG:
            self.long_collections.append((round(took * 1e3, 2), round(cpu * 1e3, 2), gen))

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps({
            "steps": {k: {"count": v[0], "total_ms": round(v[1] * 1e3, 1), "longest_ms": round(v[2] * 1e3, 2),
                          "cpu_ms": round(v[3] * 1e3, 1), "run_queue_ms": round(v[4] * 1e3, 1),
                          "blocked_ms": round(max(0.0, v[1] - v[3] - v[4]) * 1e3, 1)}
                      for k, v in sorted(self.steps.items(), key=lambda kv: -kv[1][1])},
            "blocked_steps": self.blocked_steps,
            "blocked_histogram": self.blocked_hist,
            "long_steps": sorted(self.long_steps, reverse=True)[:200],
            "long_steps_count": len(self.long_steps),
            "long_cpu_steps": sorted(self.long_cpu_steps, key=lambda s: -s[1])[:200],
            "long_cpu_steps_count": len(self.long_cpu_steps),
            "collections": {str(k): {"count": v[0], "total_ms": round(v[1] * 1e3, 1),
                                     "longest_ms": round(v[2] * 1e3, 2)} for k, v in self.collections.items()},
            "long_collections": sorted(self.long_collections, reverse=True)[:200],
        }, indent=1))
