"""Threads busy during the tests of a module other than the one they appeared in: what a module left behind.

A thread an earlier test left running (a proxy loop still serving, a build abandoned, a client still
polling) costs the tests after it more than its CPU: a call that lets the interpreter lock go (RE2's
matches, socket calls) then waits up to the switch interval to get it back, each time, so a test of
many such calls runs a hundred times slower beside it. :class:`StrayThreads` notes each thread's CPU
seconds (Linux's ``/proc/self/task``) when a test begins and names, when it ends, the threads that
first appeared in another module's tests and used more than :data:`BUSY_SECONDS` during this one.
tests/conftest.py prints them at the end of the run. A reused worker thread (trio's thread cache)
or a session fixture's thread doing the test's own work is named too: the list is for reading,
not a verdict.
"""

from __future__ import annotations

import os
import threading

BUSY_SECONDS = 1.0
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu() -> dict[int, tuple[str, float]]:
    """This process's threads: native id -> (name, CPU seconds so far); empty where /proc is not. The
    name is Python's for a Python thread (the kernel's is the process's), else the kernel's."""
    named = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    found: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue  # ended meanwhile
        found[int(tid)] = (named.get(int(tid), name), (int(fields[11]) + int(fields[12])) / _TICKS)
    return found


class StrayThreads:
    """Between :meth:`begin` and :meth:`end` of one test, the busy threads another module left."""

    def __init__(self) -> None:
        self._before: dict[int, tuple[str, float]] = {}
        self._home: dict[int, str] = {}  # native thread id -> the module whose test it first appeared in

    def begin(self, module: str) -> None:
        self._before = thread_cpu()
        for tid in self._before:
            self._home.setdefault(tid, module)

    def end(self, module: str) -> list[str]:
        """``name (from MODULE): N.N s`` for each thread from another module busy since :meth:`begin`."""
        me = threading.get_native_id()
        busy = []
        for tid, (name, cpu) in thread_cpu().items():
            home = self._home.setdefault(tid, module)
            before = self._before.get(tid)
            if tid != me and home != module and before is not None and cpu - before[1] > BUSY_SECONDS:
                busy.append(f"{name} (from {home}): {cpu - before[1]:.1f} s")
        return busy
