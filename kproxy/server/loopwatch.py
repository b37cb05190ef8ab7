"""Event-loop lag: how late the trio thread runs a task that is due, and what held it.

kproxy serves every connection from one trio thread, so anything that holds that thread (a
backtracking regular expression, a big YAML parse, a decompression bomb, a rule set built in
place) delays every client, ``/healthz`` and signal handling at once. This module measures it
and names the culprit:

* :meth:`LoopWatch.run`, a **heartbeat** task on the loop, sleeps :data:`INTERVAL` and measures how
  late it wakes. That lateness is what every other task waiting on the loop saw at the same time;
  each one is observed into ``kproxy_event_loop_lag_seconds`` (a histogram of
  :class:`~kproxy.metrics.stats.TrafficStats`), and the worst since start is kept for tests
  (:attr:`LoopWatch.max_lag`).
* Lag has two causes a user fixes differently: kproxy's own work holding the loop, and the loop
  thread waiting for a CPU (other processes, a pod's CPU limit). On Linux the heartbeat reads
  the loop thread's run-queue wait (``run_delay`` of ``/proc/<pid>/task/<tid>/schedstat``) at
  each beat; the lag less what the thread waited for a CPU over the same beat is the time the
  loop was **held**, observed into ``kproxy_event_loop_held_seconds`` (worst kept as
  :attr:`LoopWatch.max_held`). Where the kernel does not say, held is the lag.
* A **sentinel thread** (not the loop's: it must run while the loop is stuck) checks the heartbeat
  every :data:`SENTINEL_PERIOD`. When the loop has not beaten for :data:`BLOCKED_AFTER`, it samples
  the loop thread's Python stack (``sys._current_frames``), which is what is running there right
  then. The heartbeat, once it runs again, logs one line for the stall::

      event=event_loop_blocked lag_ms=523 cpu_wait_ms=4 where="kproxy/rules/engine.py:124 in _match < ..."

  (at most one line per :data:`LOG_INTERVAL` seconds, with ``stalls=N`` counting the ones held
  back). A loop that stays stuck cannot log: the sentinel says so itself, once per stall, after
  :data:`STUCK_AFTER` seconds (``event=event_loop_stuck``), so a frozen proxy still tells why.
* A loop thread that is neither running nor waiting for a CPU is blocked: in a system call, or
  waiting for the GIL that another thread of the process holds (a collection of garbage in the
  capture writer, a C call of a library). So the line also says what the process's other threads
  did during the stall (``others="kproxy-capture cpu=2ms cpu_wait=97ms, ..."``): on Linux the
  sentinel reads every thread's CPU time and run-queue wait at each of its checks while the loop
  is on time (:class:`ThreadTimes`; a thread holding the GIL would keep it from reading once the
  stall has begun), and the heartbeat reads them again as it logs. A thread that ran, or waited
  for a core, through a stall in which the loop thread did neither is the likely holder of the lock.

Cost: a wake-up of each part every 50 ms (and small reads of /proc: one for the loop thread, one
per thread for the sentinel), nothing per request.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import FrameType

import trio

from kproxy.logfmt import q
from kproxy.metrics.fixed_histogram import Histogram
from kproxy.ratelimit import LogRateLimit

log = logging.getLogger("kproxy.server")

INTERVAL = 0.05  # the heartbeat's sleep: its lateness is the lag
SENTINEL_PERIOD = 0.05
BLOCKED_AFTER = 0.1  # a stall longer than this is logged (the bound: nothing may hold the loop longer)
STUCK_AFTER = 5.0  # the sentinel's own line for a loop that has not come back
LOG_INTERVAL = 10.0
# The sentinel keeps its reading of the threads as the stall's start while the heartbeat is less
# overdue than this (a beat a little late is not yet a stall).
OTHERS_AFTER = 0.01
_OTHERS_NAMED = 3  # the threads named in ``others``: the busiest
_OTHERS_MIN = 0.005  # a thread that ran and waited less than this during the stall is left out
# Why a stall can go unnamed: the sentinel needs the GIL to sample, and C code that holds it
# (compile(), a C extension's long call) keeps the sentinel out until it returns.
_NOT_SAMPLED = "unknown (not sampled: shorter than the sentinel's period, or the GIL held in C code)"
SENTINEL_NAME = "kproxy-loopwatch"
_FRAMES_NAMED = 4  # innermost frames in ``where``: enough to name the call, short enough for one line


class LoopWatch:
    """The heartbeat (:meth:`run`, a trio task) and its sentinel thread, for one trio loop.

    ``histogram`` receives one observation per heartbeat, in seconds of lateness; ``held`` the same
    lateness less the loop thread's wait for a CPU over that beat. ``cpu_wait`` reads a thread's
    run-queue wait in seconds (a running total); by default :meth:`run` opens the loop thread's
    own (:class:`RunQueueWait`).
    """

    def __init__(self, histogram: Histogram, held: Histogram, *, clock: Callable[[], float] = time.monotonic,
                 cpu_wait: Callable[[], float] | None = None) -> None:
        self.histogram = histogram
        self.held = held
        self.clock = clock
        self.cpu_wait = cpu_wait
        self.max_lag = 0.0
        self.max_held = 0.0
        self._beat = clock()  # when the loop last ran the heartbeat (read by the sentinel thread)
        self._where: str | None = None  # the loop thread's stack, sampled during the current stall
        # Every thread's (CPU time, run-queue wait) at the sentinel's last check with the loop on
        # time, and when it read them (a reading from before an earlier stall is not this one's).
        self._others: tuple[float, dict[int, tuple[float, float]]] | None = None
        self._stuck_logged = False
        self._throttle = LogRateLimit(LOG_INTERVAL)

    def reset_max(self) -> None:
        """Forget the worst lag and hold seen so far (tests measure one scenario at a time)."""
        self.max_lag = 0.0
        self.max_held = 0.0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Beat until cancelled; the sentinel thread and the run-queue reader live as long as this task
        (started: both are open)."""
        loop_thread = threading.get_ident()
        stop = threading.Event()
        sentinel = threading.Thread(target=self._sentinel, args=(loop_thread, stop), name=SENTINEL_NAME,
                                    daemon=True)
        own = RunQueueWait(threading.get_native_id()) if self.cpu_wait is None else None
        cpu_wait = self.cpu_wait or own
        assert cpu_wait is not None
        self._beat = self.clock()
        try:
            sentinel.start()
            task_status.started()
            waited = cpu_wait()
            while True:
                due = self.clock() + INTERVAL
                await trio.sleep(INTERVAL)
                now = self.clock()
                last, self._beat = self._beat, now
                others = self._others
                waited_before, waited = waited, cpu_wait()
                self._observe(max(0.0, now - due), waited - waited_before,
                              others[1] if others is not None and others[0] >= last - SENTINEL_PERIOD else None)
        finally:
            stop.set()
            if own is not None:
                own.close()

    def _observe(self, lag: float, cpu_wait: float, others: dict[int, tuple[float, float]] | None = None) -> None:
        """One heartbeat: ``lag`` seconds late, after ``cpu_wait`` seconds runnable without a CPU since the
        last; ``others``: every thread's times as the sentinel last read them before this beat fell
        late (None: not read, or read too long before)."""
        held = max(0.0, lag - cpu_wait)
        self.histogram.observe(lag)
        self.held.observe(held)
        self.max_lag = max(self.max_lag, lag)
        self.max_held = max(self.max_held, held)
        where, self._where = self._where, None
        self._stuck_logged = False
        if lag <= BLOCKED_AFTER:
            return
        stalls = self._throttle.due()
        if stalls is not None:
            log.warning("event=event_loop_blocked lag_ms=%d cpu_wait_ms=%d stalls=%d where=%s others=%s",
                        round(lag * 1000), round(cpu_wait * 1000), stalls, q(where or _NOT_SAMPLED),
                        q(_others_during(others, threading.get_native_id())))

    def _sentinel(self, loop_thread: int, stop: threading.Event) -> None:
        """The watching thread: reads the threads' times while the loop is on time, samples the loop
        thread's stack while the heartbeat is late."""
        threads = ThreadTimes()
        try:
            while not stop.wait(SENTINEL_PERIOD):
                late = self.clock() - self._beat - INTERVAL
                if late < OTHERS_AFTER:
                    self._others = (self.clock(), threads.read())
                if late < BLOCKED_AFTER:
                    continue
                if self._where is None:
                    self._where = _describe(sys._current_frames().get(loop_thread))
                if late >= STUCK_AFTER and not self._stuck_logged:
                    self._stuck_logged = True
                    log.error("event=event_loop_stuck blocked_s=%.1f where=%s", late, q(self._where or "unknown"))
        finally:
            threads.close()


class RunQueueWait:
    """How long one thread has been runnable but not running, in seconds (call it to read).

    The second field of Linux's ``/proc/<pid>/task/<tid>/schedstat`` (``run_delay``, nanoseconds
    since the thread started), kept open until :meth:`close`. Where it cannot be opened or read
    (another OS, a kernel without schedstats), it reads 0, so held equals lag.
    """

    def __init__(self, native_id: int) -> None:
        try:
            self._fd: int | None = os.open(f"/proc/self/task/{native_id}/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> float:
        if self._fd is None:
            return 0.0
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class ThreadTimes:
    """Each thread of this process with its CPU time and run-queue wait so far (call :meth:`read`).

    The first two fields of Linux's ``/proc/self/task/<tid>/schedstat``, in seconds, by native
    thread id. Each thread's file is kept open until the thread ends or :meth:`close`, so a reading
    is a listing of the threads and a ``pread`` each. Where Linux does not say, a reading is empty.
    One reader at a time (the sentinel).
    """

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}

    def read(self) -> dict[int, tuple[float, float]]:
        try:
            tids = {int(t) for t in os.listdir("/proc/self/task")}
        except (OSError, ValueError):
            return {}
        for tid in set(self._fds) - tids:
            os.close(self._fds.pop(tid))
        times: dict[int, tuple[float, float]] = {}
        for tid in tids:
            try:
                if tid not in self._fds:
                    self._fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
                fields = os.pread(self._fds[tid], 128, 0).split()
                times[tid] = (int(fields[0]) / 1e9, int(fields[1]) / 1e9)
            except (OSError, IndexError, ValueError):  # the thread ended meanwhile
                fd = self._fds.pop(tid, None)
                if fd is not None:
                    os.close(fd)
        return times

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _others_during(before: dict[int, tuple[float, float]] | None, loop_tid: int) -> str:
    """What the threads other than the loop's and the sentinel's did since ``before``: the busiest
    few, ``name cpu=Nms cpu_wait=Nms``, comma-separated."""
    if not before:
        return "unknown (the threads were not read)"
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    reader = ThreadTimes()
    now = reader.read()
    reader.close()
    spent = []
    for tid, (cpu, wait) in now.items():
        if tid == loop_tid or names.get(tid) == SENTINEL_NAME or tid not in before:
            continue
        d_cpu, d_wait = cpu - before[tid][0], wait - before[tid][1]
        if d_cpu + d_wait >= _OTHERS_MIN:
            spent.append((d_cpu + d_wait, names.get(tid) or _comm(tid), d_cpu, d_wait))
    spent.sort(reverse=True)
    return ", ".join(f"{name} cpu={d_cpu * 1000:.0f}ms cpu_wait={d_wait * 1000:.0f}ms"
                     for _, name, d_cpu, d_wait in spent[:_OTHERS_NAMED]) or "none busy"


def _comm(tid: int) -> str:
    """The kernel's name of a thread Python did not start (a C library's), or its id."""
    try:
        with open(f"/proc/self/task/{tid}/comm", "rb") as f:
            return f.read().decode(errors="replace").strip() or str(tid)
    except OSError:
        return str(tid)


def _describe(frame: FrameType | None) -> str | None:
    """The innermost frames of a stack as ``path:line in function``, innermost first."""
    if frame is None:
        return None
    stack = traceback.extract_stack(frame)[-_FRAMES_NAMED:]
    return " < ".join(f"{_short(s.filename)}:{s.lineno} in {s.name}" for s in reversed(stack))


def _short(path: str) -> str:
    """A source path from the package (or library) root: ``kproxy/rules/engine.py``, ``re/__init__.py``."""
    cut = path.rfind("/kproxy/")
    if cut >= 0:
        return path[cut + 1:]
    cut = path.rfind("/site-packages/")
    if cut >= 0:
        return path[cut + len("/site-packages/"):]
    cut = path.rfind("/lib/python")
    if cut >= 0:
        return path[cut + len("/lib/python"):].partition("/")[2] or path
    return path


__all__ = ["BLOCKED_AFTER", "LoopWatch", "RunQueueWait", "ThreadTimes"]
