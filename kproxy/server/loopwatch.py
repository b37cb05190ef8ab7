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

Cost: a wake-up of each part every 50 ms (and one small read of /proc), nothing per request.
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
# Why a stall can go unnamed: the sentinel needs the GIL to sample, and C code that holds it
# (compile(), a C extension's long call) keeps the sentinel out until it returns.
_NOT_SAMPLED = "unknown (not sampled: shorter than the sentinel's period, or the GIL held in C code)"
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
        sentinel = threading.Thread(target=self._sentinel, args=(loop_thread, stop), name="kproxy-loopwatch",
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
                self._beat = now
                waited_before, waited = waited, cpu_wait()
                self._observe(max(0.0, now - due), waited - waited_before)
        finally:
            stop.set()
            if own is not None:
                own.close()

    def _observe(self, lag: float, cpu_wait: float) -> None:
        """One heartbeat: ``lag`` seconds late, after ``cpu_wait`` seconds runnable without a CPU since the last."""
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
            log.warning("event=event_loop_blocked lag_ms=%d cpu_wait_ms=%d stalls=%d where=%s", round(lag * 1000),
                        round(cpu_wait * 1000), stalls, q(where or _NOT_SAMPLED))

    def _sentinel(self, loop_thread: int, stop: threading.Event) -> None:
        """The watching thread: samples the loop thread's stack while the heartbeat is late."""
        while not stop.wait(SENTINEL_PERIOD):
            late = self.clock() - self._beat - INTERVAL
            if late < BLOCKED_AFTER:
                continue
            if self._where is None:
                self._where = _describe(sys._current_frames().get(loop_thread))
            if late >= STUCK_AFTER and not self._stuck_logged:
                self._stuck_logged = True
                log.error("event=event_loop_stuck blocked_s=%.1f where=%s", late, q(self._where or "unknown"))


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


__all__ = ["BLOCKED_AFTER", "LoopWatch", "RunQueueWait"]
