"""The proxy's side of a capture worker process: a bounded queue, a thread that ships it, counters.

With ``capture.process`` on (the default), the capture's reading and writing run in
:mod:`kproxy.capture.worker`, a process of its own at a lower priority, and the proxy keeps only
what the event loop must do per exchange (the observers' offers) and this thread, which turns
what they queued into pickled batches on the worker's standard input: about a microsecond of
GIL per exchange where reading and writing one is ten times that (docs/PERFORMANCE.md).

Contract of :class:`CaptureShipper` (what :class:`kproxy.capture.service.CaptureService` uses of a
:class:`kproxy.capture.writer.CaptureWriter`, with the same meaning):

* ``queue.offer`` never blocks and never raises: a full queue (``queue_size`` items, or
  ``queue_bytes`` of frames referenced) drops the item and counts it. The thread wakes at a
  quarter full or every ``poll_seconds``, and ships in batches of :data:`SHIP_BATCH`. A worker
  slower than the traffic fills its pipe, the thread waits on it (the GIL released), and the
  queue fills and drops: what the proxy holds stays bounded.
* The counters (``written``, ``dropped``, ``abandoned``, ``over_budget``, files...) only rise:
  the worker's as its last report gave them, plus those of the workers before it, plus what was
  lost here (offered to a worker that had died, or taken while none ran).
* A worker that exits (killed, out of memory, a bug) is logged and started again after a
  backoff (1 s, doubling up to :data:`RESTART_MAX_SECONDS`); items taken meanwhile are dropped
  and counted. Its file under the temporary name is left for the next worker's start to remove,
  as a killed proxy's is.
* :meth:`close` ships what is queued, ends the worker's input, and waits for it to write what it
  has and complete its file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from kproxy.capture.handoff import CACHED_CONNECTIONS, CLOSE_FIELDS, COUNTERS, GAUGES, connection_key
from kproxy.capture.queue import CaptureQueue, stop_draining
from kproxy.logfmt import q as _q
from kproxy.ratelimit import LogRateLimit

log = logging.getLogger("kproxy.capture")

# Items per pickled batch: the thread holds the GIL while it pickles one, and gives it back
# while it writes it.
SHIP_BATCH = 64
# The worker's priority below the proxy's (a nice increment): on cores the proxy shares, the
# kernel serves the proxy first; the worker catches up when they are idle.
WORKER_NICE = 10
# The pipe to the worker holds this much (Linux: F_SETPIPE_SZ, up to /proc/sys/fs/pipe-max-size):
# a burst waits there rather than in the proxy's queue.
PIPE_BYTES = 1024 * 1024
# Frames this big go to the worker as themselves after the batch's pickle, not inside it: pickling
# copies a frame under the GIL, the pipe's write copies it with the GIL released.
INLINE_BYTES = 4096
RESTART_FIRST_SECONDS = 1.0
RESTART_MAX_SECONDS = 30.0
EXIT_LOG_SECONDS = 60.0
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class _Worker:
    """One worker process and the thread reading its reports."""

    def __init__(self, command: list[str], nice: int) -> None:
        # Started with SIGINT and SIGTERM blocked (a mask is inherited through exec): until the worker
        # ignores them itself, a Ctrl-C sent to the whole process group must not kill it.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        assert self.process.stdin is not None and self.process.stdout is not None
        if nice:  # at once: the worker reads nothing before its first batch, which it cannot have yet
            with contextlib.suppress(OSError):  # (a process gone already is noticed when fed)
                os.setpriority(os.PRIO_PROCESS, self.process.pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
        self.stdin: IO[bytes] = self.process.stdin
        with contextlib.suppress(OSError):  # a smaller pipe only means the thread waits on it sooner
            fcntl.fcntl(self.stdin.fileno(), _F_SETPIPE_SZ, PIPE_BYTES)
        self.report: dict[str, int] = dict.fromkeys(COUNTERS + GAUGES, 0)
        self.shipped = 0  # items handed to it
        self.started_at = time.monotonic()
        self._reader = threading.Thread(target=self._read_reports, args=(self.process.stdout,),
                                        name="kproxy-capture-reports", daemon=True)
        self._reader.start()

    def _read_reports(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            try:
                doc = json.loads(line)
                self.report = {k: int(doc.get(k, 0)) for k in COUNTERS + GAUGES}
            except (ValueError, TypeError, AttributeError):
                log.warning("event=capture_worker_report_unreadable line=%s", _q(line[:200].decode(errors="replace")))

    def send(self, data: bytes) -> None:
        """Write all of ``data`` (raises OSError, BrokenPipeError among them, when the worker is gone)."""
        fd = self.stdin.fileno()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    def finish(self, timeout: float) -> int | None:
        """End the worker's input and wait for it (and its last report); its exit code, None if it
        did not end in time (then it is killed)."""
        with contextlib.suppress(OSError):
            self.stdin.close()
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = None
        self._reader.join(timeout)
        return code


class CaptureShipper:
    """Queue + thread feeding a capture worker process (see the module docstring)."""

    def __init__(self, directory: Path, *, max_bytes_total: int, rotate_bytes: int, rotate_seconds: float,
                 queue_size: int = 10_000, queue_bytes: int = 256 * 1024 * 1024, include_payloads: bool = False,
                 payload_max_bytes: int = 1024, metadata: dict[str, str] | None = None, nice: int = WORKER_NICE,
                 poll_seconds: float = 0.05, python: str = sys.executable,
                 log_settings: tuple[str, str] = ("info", "logfmt")) -> None:
        if rotate_bytes > max_bytes_total:
            raise ValueError("rotate_bytes must not exceed max_bytes_total")
        self.directory = directory
        self.poll_seconds = poll_seconds
        settings = {"dir": str(directory), "max_bytes_total": max_bytes_total, "rotate_bytes": rotate_bytes,
                    "rotate_seconds": rotate_seconds, "queue_size": queue_size, "include_payloads": include_payloads,
                    "payload_max_bytes": payload_max_bytes, "metadata": metadata, "log_level": log_settings[0],
                    "log_format": log_settings[1]}
        self._nice = nice
        self._command = [python, "-m", "kproxy.capture.worker", json.dumps(settings)]
        self._wake = threading.Event()
        self.queue = CaptureQueue(queue_size, queue_bytes, self._wake)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kproxy-capture-shipper", daemon=True)
        # (the counters of the workers that ended, the worker now): one tuple, replaced whole, so
        # that a reader on another thread never sees a worker counted twice or not at all.
        self._state: tuple[dict[str, int], _Worker | None] = (dict.fromkeys(COUNTERS, 0), None)
        self._lost = 0  # taken here and never handed to a worker
        self._restart_at = 0.0
        self._restart_delay = RESTART_FIRST_SECONDS
        self._exits_log = LogRateLimit(EXIT_LOG_SECONDS)
        self.restarts = 0
        # connection id -> its key, one tuple a connection so that a batch's pickle holds it once;
        # a connection's entry goes with its close (or all of them past CACHED_CONNECTIONS).
        self._connections: dict[str, tuple[Any, ...]] = {}

    # -- counters (read by the metrics, from the event loop) -----------------------------
    def _count(self, name: str) -> int:
        ended, worker = self._state
        return ended[name] + (worker.report[name] if worker is not None else 0)

    @property
    def written(self) -> int:
        return self._count("written")

    @property
    def dropped(self) -> int:
        return self.queue.full + self._lost + self._count("dropped")

    @property
    def abandoned(self) -> int:
        return self._count("abandoned")

    @property
    def over_budget(self) -> int:
        return self._count("over_budget")

    @property
    def offered(self) -> int:
        return self.queue.offered

    # -- life cycle -----------------------------------------------------------------------
    def start(self) -> CaptureShipper:
        """Makes the directory (raising OSError as the in-process writer does), starts the worker
        and the thread."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable", str(self.directory))
        self._state = (self._state[0], _Worker(self._command, self._nice))
        self._thread.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Ship what is queued, end the worker's input, wait up to ``timeout`` for it to finish."""
        stop_draining(self._thread, self._stop, self._wake, self.queue, timeout)

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            stop = self._stop.is_set()  # read first: what was offered before close() is queued now
            while self.queue:
                self._ship(self.queue.take(SHIP_BATCH))
            if stop:
                break
            self._wake.wait(self.poll_seconds)
            self._wake.clear()
            self._watch()
        worker = self._state[1]
        if worker is not None:
            code = worker.finish(30.0)
            self._retire(worker, died=code != 0)
            if code:
                log.error("event=capture_worker_exited code=%s at=close", code)

    def _ship(self, items: list[Any]) -> None:
        worker = self._state[1]
        if worker is None or worker.process.poll() is not None:
            self._lost += len(items)
            return
        keys = self._connections
        batch = []
        frames: list[bytes] = []  # the big frames, written after the pickle, in their items' order
        for item in items:
            conn = item[0]
            key = keys.get(conn.connection_id)
            if key is None:
                if len(keys) >= CACHED_CONNECTIONS:  # closes dropped with a full queue: none stays for good
                    keys.clear()
                key = keys[conn.connection_id] = connection_key(conn)
            if len(item) <= CLOSE_FIELDS:  # the connection's last item
                del keys[conn.connection_id]
            else:
                request, response = item[3], item[4]
                big_request = type(request) is bytes and len(request) >= INLINE_BYTES
                big_response = type(response) is bytes and len(response) >= INLINE_BYTES
                if big_request or big_response:
                    if big_request:
                        frames.append(request)
                    if big_response:
                        frames.append(response)
                    batch.append((key, item[1], item[2], len(request) if big_request else request,
                                  len(response) if big_response else response, *item[5:]))
                    continue
            batch.append((key, *item[1:]))
        data = pickle.dumps(batch, pickle.HIGHEST_PROTOCOL)
        try:
            worker.send(len(data).to_bytes(4, "big") + data)
            for frame in frames:
                worker.send(frame)
            worker.shipped += len(items)
        except OSError:
            self._lost += len(items)
            self._watch()

    def _watch(self) -> None:
        """A worker that exited is logged, its counters kept, and another started after the backoff."""
        worker = self._state[1]
        if worker is not None:
            code = worker.process.poll()
            if code is None:
                return
            worker.finish(1.0)
            self._retire(worker, died=True)
            self._connections.clear()
            if time.monotonic() - worker.started_at > RESTART_MAX_SECONDS:
                self._restart_delay = RESTART_FIRST_SECONDS  # it had run a while: not a crash loop
            self._restart_at = time.monotonic() + self._restart_delay
            held = self._exits_log.due()
            if held is not None:
                log.error("event=capture_worker_exited code=%s%s exits=%d restart_in_s=%.0f", code, _signal_of(code),
                          held, self._restart_delay)
            self._restart_delay = min(self._restart_delay * 2, RESTART_MAX_SECONDS)
            return
        if time.monotonic() >= self._restart_at:
            try:
                self._state = (self._state[0], _Worker(self._command, self._nice))
                self.restarts += 1
                log.warning("event=capture_worker_started restarts=%d", self.restarts)
            except OSError as exc:
                self._restart_at = time.monotonic() + self._restart_delay
                log.error("event=capture_worker_start_failed error=%s", _q(str(exc)))

    def _retire(self, worker: _Worker, died: bool = False) -> None:
        """``worker`` ended: its counters join those of the workers before it; what it was handed and
        neither wrote nor dropped (as its last report said) counts as dropped, and, when it died, the
        records of the file it left open (the next worker removes it) as abandoned."""
        report = worker.report
        ended = {name: self._state[0][name] + report[name] for name in COUNTERS}
        ended["dropped"] += max(0, worker.shipped - report["written"] - report["dropped"])
        if died:
            ended["abandoned"] += report["open_records"]
        self._state = (ended, None)


def _signal_of(code: int) -> str:
    """`` signal=NAME`` for an exit by a signal (a negative code), else nothing."""
    if code >= 0:
        return ""
    try:
        return f" signal={signal.Signals(-code).name}"
    except ValueError:
        return ""
