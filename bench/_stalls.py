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
"""

from __future__ import annotations

import gc
import json
import signal
import time
from pathlib import Path
from typing import Any

import trio

LONG = 0.002  # a step or collection at least this long is listed one by one


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
        self.reset()
        gc.callbacks.append(self._gc)
        signal.signal(signal.SIGUSR1, lambda _signum, _frame: self.reset())

    def reset(self) -> None:
        """Forget what was seen so far (the benchmark's SIGUSR1: start-up is not steady state)."""
        self.started: dict[int, tuple[float, float]] = {}
        self.steps: dict[str, list[float]] = {}  # task name -> [count, seconds, longest]
        self.long_steps: list[tuple[float, float, str]] = []  # at least LONG in wall time
        self.long_cpu_steps: list[tuple[float, float, str]] = []  # at least LONG in CPU time too
        self.gc_started = (0.0, 0.0)
        self.collections: dict[int, list[float]] = {}
        self.long_collections: list[tuple[float, float, int]] = []

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.started[id(task)] = (self.clock(), self.cpu())

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        t0 = self.started.pop(id(task), None)
        if t0 is None:
            return
        took = self.clock() - t0[0]
        cpu = self.cpu() - t0[1]
        name = task_name(task.name)
        entry = self.steps.setdefault(name, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += took
        entry[2] = max(entry[2], took)
        if took >= LONG:
            self.long_steps.append((round(took * 1e3, 2), round(cpu * 1e3, 2), name))
            if cpu >= LONG:
                self.long_cpu_steps.append((round(took * 1e3, 2), round(cpu * 1e3, 2), name))

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
            "steps": {k: {"count": v[0], "total_ms": round(v[1] * 1e3, 1), "longest_ms": round(v[2] * 1e3, 2)}
                      for k, v in sorted(self.steps.items(), key=lambda kv: -kv[1][1])},
            "long_steps": sorted(self.long_steps, reverse=True)[:200],
            "long_steps_count": len(self.long_steps),
            "long_cpu_steps": sorted(self.long_cpu_steps, key=lambda s: -s[1])[:200],
            "long_cpu_steps_count": len(self.long_cpu_steps),
            "collections": {str(k): {"count": v[0], "total_ms": round(v[1] * 1e3, 1),
                                     "longest_ms": round(v[2] * 1e3, 2)} for k, v in self.collections.items()},
            "long_collections": sorted(self.long_collections, reverse=True)[:200],
        }, indent=1))
