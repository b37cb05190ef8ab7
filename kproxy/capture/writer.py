"""Capture files on disk: a bounded queue in front of one writer thread.

Format: Parquet (through pyarrow), not JSON lines. Spark reads both natively,
but Parquet keeps the schema's types exactly (int16 error codes, UTC
microsecond timestamps, nested lists of partitions; JSON lines would make Spark
infer them, differently per file), is columnar (a latency query reads two
columns of a multi-GB capture, not all of it), compresses the repetitive
columns (api names, topics, client ids) several-fold with zstd, and carries
key/value metadata where the schema version lives. Its one drawback, that a
file is readable only once its footer is written, suits the no-partial-file
rule anyway: files are written under a hidden temporary name
(``.capture-....parquet.tmp``, which Spark and Hadoop skip because of the
leading dot) and renamed when complete.

Layout: ``DIR/hour=YYYY-MM-DDTHH/capture-<opened UTC>-<seq>.parquet``, the hour
being the requests' (``request_time``), so Spark's partition discovery gives an
``hour`` column and a query over one hour opens only that hour's files.

Contract of :class:`CaptureWriter`:

* :meth:`~CaptureWriter.offer` never blocks and never raises: a full queue
  (``queue_size`` items, or ``queue_bytes`` of frames referenced) drops the
  item and counts it (``dropped``). It is called from the proxy's event loop
  and costs an append (:class:`~kproxy.capture.queue.CaptureQueue`, compiled):
  it does not wake the writer thread per item (a wake per request costs the
  loop a GIL hand-over each time). The thread wakes every ``poll_seconds``,
  or at once when the queue is a quarter full.
  Everything else (turning items into rows, Arrow, the disk) happens on the
  writer thread, a slice of items at a time, giving the GIL back between
  slices so that the event loop waits at most one slice. Each turn of the writer runs
  inside :func:`kproxy.offloop.short_switch_interval`: a loop thread back from a system call
  that finds the writer holding the GIL asks for it after the short interval, not after the
  interpreter's 5 ms. On a core the two threads share, handing the GIL back between slices
  does not wake the loop before the writer takes it again; the forced hand-over does. All of
  this is for a writer beside a loop (``beside_loop``, the default); the capture worker's
  writer, with no loop in its process, runs each turn whole.
* The writer thread runs at the process's scheduling priority, never below it. A thread at a
  lower priority is the one the kernel leaves off a busy core, and it may be left off while it
  holds the GIL (inside a garbage collection, or a ``pa.array`` call): the event loop then waits
  for the lock as long as the writer waits for a core, a priority inversion that the run-queue
  wait of the loop's own thread does not show.
* A file is rotated when it reaches ``rotate_bytes``, has been open
  ``rotate_seconds``, or the hour changes. After each write the oldest complete
  files are deleted while all files together exceed ``max_bytes_total``.
* :meth:`~CaptureWriter.close` writes what is queued, completes and renames
  the open file; a stale temporary file (a process killed with SIGKILL) is
  removed at the next start, never renamed.
* The thread survives every error of the disk (full, gone, out of descriptors,
  a directory replaced by a file...), its clean-up included: a failed write's
  records are dropped and counted, its file abandoned, and no file is opened
  before a backoff (1 s, doubling up to :data:`RETRY_MAX_SECONDS`) during which
  the queue is left to fill (offer drops and counts). Logged at the first
  failure, then one line a minute at most with the count, and at recovery.
* Counters only rise: ``written`` counts records as they reach a file, and
  ``abandoned`` those of them whose file could not be completed.

The decisions (which hour, when to rotate, which files to delete) are pure
functions below, tested without a disk.

Why one module: the writer thread, its file rotation and the Arrow conversion of its slices
share the open file's state; the pure decisions are functions apart, and the pending row group's
lists are :mod:`kproxy.capture.columns` (compiled, with the record builder).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import accumulate
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from kproxy.capture.columns import HOUR_US, PendingColumns
from kproxy.capture.queue import CaptureQueue, stop_draining
from kproxy.capture.record_schema import COLUMN_NAMES, COLUMNS, SCHEMA_VERSION, VERSION_METADATA_KEY, Column
from kproxy.capture.rows import dict_rows
from kproxy.logfmt import q as _q
from kproxy.offloop import short_switch_interval
from kproxy.ratelimit import LogRateLimit

log = logging.getLogger("kproxy.capture")

# Items turned into rows per slice: reading frames is Python holding the GIL (bench/bench_capture.py
# measures it per item), so the writer gives the GIL back after each slice of a fraction of a
# millisecond: the proxy's event loop, if it wants the GIL meanwhile, waits that long at worst
# (not CPython's 5 ms switch interval, nor a whole batch). 16, not 32: halving the slice halved the
# writer's GIL holds on Produce for one more sleep(0) per slice (docs/PERFORMANCE.md).
CONVERT_SLICE = 16
# Each slice's rows go into the pending row group column by column as they are made
# (kproxy.capture.columns), and become Arrow columns a row group at a time, a column per call
# (pa.array: a C loop over Python objects, holding the GIL), the GIL given back
# between columns.
ROWS = Callable[[list[Any]], list[tuple[Any, ...]]]
ADD_ROWS = Callable[[list[Any], PendingColumns], None]
_REQUEST_TIME = COLUMN_NAMES.index("request_time")
# After a failed write, the first retry waits this long, each failure since doubles it up to the max.
RETRY_FIRST_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0
# A failing disk is logged at its first failure, then at most once per this many seconds.
FAILURE_LOG_SECONDS = 60.0
# What writing to a failing disk can raise: an OSError, or pyarrow's own error for it.
_DISK_ERRORS = (OSError, pa.ArrowException)

_ARROW_SCALARS: dict[str, pa.DataType] = {
    "bool": pa.bool_(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
    "float64": pa.float64(), "string": pa.string(), "binary": pa.binary(),
    "timestamp_us": pa.timestamp("us", tz="UTC"),
}


def _arrow_field(col: Column) -> pa.Field:
    if col.type == "list":
        item = pa.struct([_arrow_field(c) for c in col.items])
        return pa.field(col.name, pa.list_(item), nullable=col.nullable)
    return pa.field(col.name, _ARROW_SCALARS[col.type], nullable=col.nullable)


def _dictionary_columns(columns: Sequence[Column], prefix: str = "") -> list[str]:
    """Parquet paths of the string columns, nested ones included (``partitions.list.element.topic``)."""
    out = []
    for col in columns:
        if col.type == "string":
            out.append(prefix + col.name)
        elif col.type == "list":
            out.extend(_dictionary_columns(col.items, f"{prefix}{col.name}.list.element."))
    return out


# Parquet options, chosen by CPU per record against file size (docs/PERFORMANCE.md, "Costs behind
# the code's choices"): zstd at Arrow's default level, with a dictionary only for the string
# columns, which repeat (api names, client ids, listeners, topics), was both the smallest file and
# the least CPU. Times, ids, sizes and latencies hardly repeat: a dictionary of them is CPU spent
# for a bigger file. Statistics stay (Spark skips row groups by request_time with them).
PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "use_dictionary": _dictionary_columns(COLUMNS)}


def arrow_schema(metadata: dict[str, str] | None = None) -> pa.Schema:
    """The Arrow schema of :data:`kproxy.capture.record_schema.COLUMNS`, with the version in its metadata
    (and ``metadata``'s keys: the run's detector settings)."""
    return pa.schema([_arrow_field(c) for c in COLUMNS],
                     metadata={**(metadata or {}), VERSION_METADATA_KEY: str(SCHEMA_VERSION)})


# -- pure decisions ------------------------------------------------------------------------
def pending_columns(schema: pa.Schema) -> PendingColumns:
    """An empty pending row group of ``schema``'s shape."""
    return PendingColumns(len(schema), {i: f.type.value_type.num_fields for i, f in enumerate(schema)
                                        if pa.types.is_list(f.type)}, _REQUEST_TIME)


def hour_of(request_time_us: int) -> int:
    """The hour (since the epoch) a record belongs to."""
    return request_time_us // HOUR_US


def hour_dir_name(hour: int) -> str:
    return "hour=" + datetime.fromtimestamp(hour * 3600, UTC).strftime("%Y-%m-%dT%H")


@dataclass(frozen=True, slots=True, kw_only=True)
class Rotation:
    """When a capture file is complete."""

    rotate_bytes: int
    rotate_seconds: float

    def due(self, *, size: int, opened_at: float, now: float) -> bool:
        return size >= self.rotate_bytes or now - opened_at >= self.rotate_seconds


def over_cap(complete: Sequence[tuple[Path, int]], open_bytes: int, max_bytes_total: int) -> list[Path]:
    """The oldest complete files to delete so that they and the open file fit ``max_bytes_total``.

    ``complete`` is oldest first. The open file is never deleted; if it alone
    exceeds the cap, every complete file goes (rotation keeps it under the cap).
    """
    total = open_bytes + sum(size for _, size in complete)
    doomed: list[Path] = []
    for path, size in complete:
        if total <= max_bytes_total:
            break
        doomed.append(path)
        total -= size
    return doomed


# -- the writer ------------------------------------------------------------------------------
class _OpenFile:
    """One capture file being written under its temporary name."""

    def __init__(self, final: Path, hour: int, schema: pa.Schema, opened_at: float) -> None:
        self.final = final
        self.temp = final.with_name("." + final.name + ".tmp")
        self.hour = hour
        self.opened_at = opened_at
        self.records = 0
        final.parent.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO = open(self.temp, "wb")  # noqa: SIM115 (closed in finish/abandon)
        try:
            self._writer = pq.ParquetWriter(self._file, schema, **PARQUET_OPTIONS)
        except BaseException:
            self._file.close()  # nothing written yet: closing cannot fail on a flush
            self.temp.unlink(missing_ok=True)
            raise

    @property
    def size(self) -> int:
        return self._file.tell()

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table)
        self.records += table.num_rows

    def finish(self) -> int:
        """Write the footer, rename to the final name; returns the file's size."""
        self._writer.close()
        self._file.close()
        os.replace(self.temp, self.final)
        return self.final.stat().st_size

    def abandon(self) -> None:
        """Give the file up, never raising: called when the disk already failed, and may fail
        again at every step. The descriptor is released whatever happens (a buffered file's
        close() closes it even when its flush fails); the temporary file is removed if the
        disk lets it, else the next start removes it."""
        for step in (self._writer.close, self._file.close, lambda: self.temp.unlink(missing_ok=True)):
            with contextlib.suppress(Exception):  # whatever a failing disk makes them raise: nothing to add
                step()


class CaptureWriter:
    """Queue + thread writing capture records as Parquet.

    The queue holds items; ``rows`` turns a list of them into rows (tuples in
    :data:`~kproxy.capture.record_schema.COLUMN_NAMES` order) on the writer thread: by
    default items are record dicts (:func:`~kproxy.capture.record_schema.new_record`).
    ``add_rows``, when given, is used instead: it adds the items' rows to the pending row group
    itself, in order (the proxy's: captured exchanges,
    :meth:`kproxy.capture.record_builder.RecordBuilder.add_rows`, no list of rows made in between).

    ``start()`` scans ``directory`` (stale temporary files removed, existing
    capture files counted towards the cap), then starts the thread.
    """

    def __init__(self, directory: Path, *, max_bytes_total: int, rotate_bytes: int, rotate_seconds: float,
                 queue_size: int = 10_000, queue_bytes: int = 256 * 1024 * 1024, row_group_rows: int = 10_000,
                 flush_seconds: float = 1.0, poll_seconds: float = 0.1, rows: ROWS = dict_rows,
                 add_rows: ADD_ROWS | None = None, clock: Callable[[], float] = time.time,
                 metadata: dict[str, str] | None = None, beside_loop: bool = True) -> None:
        if rotate_bytes > max_bytes_total:
            raise ValueError("rotate_bytes must not exceed max_bytes_total")
        self.directory = directory
        self.max_bytes_total = max_bytes_total
        self.rotation = Rotation(rotate_bytes=rotate_bytes, rotate_seconds=rotate_seconds)
        self.row_group_rows = row_group_rows
        self.flush_seconds = flush_seconds
        self.poll_seconds = min(poll_seconds, flush_seconds / 4)
        self.rows = rows
        self.add_rows = add_rows
        self.clock = clock
        self.schema = arrow_schema(metadata)
        # Whether an event loop shares this process's GIL (the capture thread) or not (the capture
        # worker, whose other thread only reads its input): beside a loop a turn runs inside the
        # short switch interval and hands the GIL over between slices and columns; in the worker
        # each hand-over would only be a switch of threads with nothing waiting, so a turn runs whole.
        self._slice = CONVERT_SLICE if beside_loop else queue_size
        self._turn_context: Callable[[], contextlib.AbstractContextManager[Any]] = (
            short_switch_interval if beside_loop else contextlib.nullcontext)
        self._hand_over: Callable[[], None] = hand_over_gil if beside_loop else _keep_gil
        # The queue (kproxy.capture.queue, compiled: the loop's side, per exchange). Each counter
        # below has one writer, the thread (_lost, written...), so no increment races another.
        self.queue_size = queue_size
        self.queue_bytes = queue_bytes
        self._wake = threading.Event()
        self.queue = CaptureQueue(queue_size, queue_bytes, self._wake)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kproxy-capture", daemon=True)
        self._complete: deque[tuple[Path, int]] = deque()
        self._open: _OpenFile | None = None
        self._seq = 0
        self._lost = 0  # dropped by the thread: a write error, or offered after close()
        self.written = 0
        self.abandoned = 0  # written, then lost with a file that could not be completed
        self.files_written = 0
        self.files_deleted = 0
        self.write_errors = 0
        self._retry_at = 0.0  # no file is opened before this (time.monotonic()): a failing disk's backoff
        self._retry_delay = RETRY_FIRST_SECONDS
        self._failures_log = LogRateLimit(FAILURE_LOG_SECONDS)
        self._failing = 0  # failures since the last success

    # -- the event loop's side ---------------------------------------------------------
    def offer(self, item: Any, nbytes: int = 0) -> bool:
        """Queue one item (``nbytes``: the frames it holds on to); False (and counted) when full.
        (:attr:`queue`'s offer: the proxy's observers call that one directly.)"""
        return self.queue.offer(item, nbytes)

    @property
    def offered(self) -> int:
        """Items offered so far (queued or not)."""
        return self.queue.offered

    @property
    def queued(self) -> int:
        """Items offered and not yet taken by the writer thread."""
        return len(self.queue)

    @property
    def dropped(self) -> int:
        """Items offered and never written: the queue was full, a write failed, or offered after close."""
        return self.queue.full + self._lost

    @property
    def open_records(self) -> int:
        """Records written to the file still open (under its temporary name)."""
        f = self._open
        return f.records if f is not None else 0

    def start(self) -> CaptureWriter:
        self.directory.mkdir(parents=True, exist_ok=True)
        found = []
        for path in self.directory.glob("hour=*/*"):
            if path.name.startswith(".capture-") and path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)  # a killed process's unfinished file: never completed
            elif path.name.startswith("capture-") and path.suffix == ".parquet":
                found.append((path.name, path, path.stat().st_size))
        self._complete.extend((path, size) for _, path, size in sorted(found))
        self._enforce_cap()
        self._thread.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, complete the open file; waits up to ``timeout`` seconds."""
        stop_draining(self._thread, self._stop, self._wake, self.queue, timeout)

    # -- the writer thread ---------------------------------------------------------------
    def _run(self) -> None:
        pending = pending_columns(self.schema)  # rows waiting for a full row group, or flush_seconds
        first_at = 0.0
        while True:
            stop = self._stop.is_set()  # read first: what was offered before close() is in the queue now
            if not stop and time.monotonic() < self._retry_at:  # a failing disk: leave the queue be
                self._wake.wait(min(self.poll_seconds, max(0.0, self._retry_at - time.monotonic())))
                self._wake.clear()
                continue
            try:
                with self._turn_context():  # beside a loop: it waits less for the GIL meanwhile
                    first_at = self._turn(pending, first_at, stop)
            except Exception as exc:  # an error no branch foresaw: its rows are lost, the thread goes on
                self._lost += pending.rows
                pending.clear()
                self._failed(exc, 0)
                if self._open is not None:
                    self._open.abandon()
                    self._open = None
            if stop:
                self._lost += len(self.queue)  # offered after close(): never written
                self.queue.items.clear()
                return
            if not self.queue:
                self._wake.wait(self.poll_seconds)
                self._wake.clear()

    def _turn(self, pending: PendingColumns, first_at: float, stop: bool) -> float:
        """Convert what is queued (a queue's worth at most), write what is due; returns when the
        oldest pending row came."""
        budget = self.queue_size  # a turn ends even while items keep coming: time checks below
        while self.queue and budget > 0 and (stop or time.monotonic() >= self._retry_at):  # not when failing
            items = self.queue.take(min(self._slice, budget))
            budget -= len(items)
            if not pending.rows:
                first_at = self.clock()
            self._convert(items, pending)
            if pending.rows >= self.row_group_rows:
                self._write(pending)
                pending.clear(self._hand_over)
            self._hand_over()
        now = self.clock()
        if pending.rows and (stop or now - first_at >= self.flush_seconds):
            self._write(pending)
            pending.clear(self._hand_over)
        if self._open is not None and (stop or self.rotation.due(size=self._open.size,
                                                                 opened_at=self._open.opened_at, now=now)):
            self._finish()
        return first_at

    def _convert(self, items: list[Any], pending: PendingColumns) -> None:
        """The items' rows added to ``pending``."""
        before = pending.rows
        try:
            if self.add_rows is not None:
                self.add_rows(items, pending)
            else:
                pending.add_rows(self.rows(items))
        except Exception as exc:  # a bug in reading must not stop the capture: the rest of the slice is lost, counted
            lost = len(items) - (pending.rows - before)
            self._lost += lost
            log.error("event=capture_convert_failed records=%d error=%s", lost, _q(repr(exc)))

    def _write(self, pending: PendingColumns) -> None:
        table = None
        for hour, start, length in pending.hours():
            errors = self.write_errors
            if self._open is not None and self._open.hour != hour:
                self._finish()
            if self.write_errors != errors or (time.monotonic() < self._retry_at and not self._stop.is_set()):
                self._lost += length  # the disk is failing: no new file before the backoff ends
                continue
            try:
                if self._open is None:
                    self._open = self._new_file(hour)
                if table is None:
                    table = _table(pending, self.schema, self._hand_over)
                self._open.write(table.slice(start, length))  # a slice of a table: no copy
                self.written += length
                self.write_batch_done(self._open)
            except _DISK_ERRORS as exc:
                self._lost += length
                self._failed(exc, length)
                if self._open is not None:
                    self._open.abandon()
                    self._open = None
                continue
            self._succeeded()
            if self._open.size >= self.rotation.rotate_bytes:
                self._finish()
            self._enforce_cap()

    def _failed(self, exc: BaseException, records: int) -> None:
        """A write failed: counted, the backoff before the next file, one log line now and then."""
        self.write_errors += 1
        self._failing += 1
        self._retry_at = time.monotonic() + self._retry_delay
        retry_in = self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_SECONDS)
        held = self._failures_log.due()
        if held is not None:
            log.error("event=capture_write_failed records=%d failures=%d retry_in_s=%.0f error=%s", records, held,
                      retry_in, _q(str(exc) or type(exc).__name__))

    def _succeeded(self) -> None:
        if self._failing:
            log.warning("event=capture_write_recovered failures=%d", self._failing)
            self._failing = 0
        self._retry_delay = RETRY_FIRST_SECONDS

    def _to_table(self, rows: list[tuple[Any, ...]]) -> pa.Table:
        """Rows -> an Arrow table, as the thread makes one (see ROWS above for the cost)."""
        pending = pending_columns(self.schema)
        pending.add_rows(rows)
        return _table(pending, self.schema)

    def write_batch_done(self, file: _OpenFile) -> None:
        """Hook after each row group is written (tests slow the writer down here)."""

    def _new_file(self, hour: int) -> _OpenFile:
        self._seq += 1
        now = self.clock()
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        final = self.directory / hour_dir_name(hour) / f"capture-{stamp}-{self._seq:06d}.parquet"
        return _OpenFile(final, hour, self.schema, now)

    def _finish(self) -> None:
        f, self._open = self._open, None
        if f is None:
            return
        try:
            size = f.finish()
        except _DISK_ERRORS as exc:
            self.abandoned += f.records  # counted as written when they reached the file: counters only rise
            self._failed(exc, f.records)
            f.abandon()
            return
        self.files_written += 1
        self._complete.append((f.final, size))
        self._enforce_cap()

    def _enforce_cap(self) -> None:
        open_bytes = self._open.size if self._open is not None else 0
        for path in over_cap(list(self._complete), open_bytes, self.max_bytes_total):
            self._complete.popleft()
            try:
                path.unlink(missing_ok=True)
                self.files_deleted += 1
                if not any(path.parent.iterdir()):
                    path.parent.rmdir()
            except OSError as exc:
                log.warning("event=capture_delete_failed file=%s error=%s", _q(str(path)), _q(str(exc)))


def hand_over_gil() -> None:
    """Let a thread waiting for the GIL (the event loop) have it now: the writer's pause between
    slices of work, beside a loop."""
    time.sleep(0)


def _keep_gil() -> None:
    """The writer's pause where no loop shares the GIL: none."""


def _table(pending: PendingColumns, schema: pa.Schema, hand_over: Callable[[], None] = hand_over_gil) -> pa.Table:
    """The pending row group as an Arrow table, a column per call, ``hand_over`` between columns."""
    arrays = []
    for i, (values, f) in enumerate(zip(pending.values, schema, strict=True)):
        arrays.append(_column(values, f.type, pending.items.get(i), hand_over))
        hand_over()  # as between slices of items (CONVERT_SLICE)
    return pa.Table.from_arrays(arrays, schema=schema)


def _column(values: list[Any], type_: pa.DataType, items: list[list[Any]] | None,
            hand_over: Callable[[], None] = hand_over_gil) -> pa.Array:
    """One column; a list column's ``values`` are each row's items (None: a null list), its
    ``items`` their fields' values (:class:`~kproxy.capture.columns.PendingColumns`).

    A column of one value throughout (a connection's address, a null or empty list) is made
    without reading each value into Arrow: counting them is several times cheaper.
    """
    n = len(values)
    if n and values[-1] == values[0] and values.count(values[0]) == n:  # the last first: cheaper when not
        first = values[0]
        if first is None:
            return pa.nulls(n, type_)
        if items is None:
            return pa.repeat(pa.scalar(first, type=type_), n)
        if not first:  # every list empty
            return pa.ListArray.from_arrays(pa.repeat(pa.scalar(0, pa.int32()), n + 1),
                                            pa.array([], type=type_.value_type), type=type_)
    if items is None:
        return pa.array(values, type=type_)
    struct = type_.value_type
    nulls = None in values
    lengths = [0 if v is None else len(v) for v in values] if nulls else list(map(len, values))
    offsets = pa.array([0, *accumulate(lengths)], type=pa.int32())
    fields = [struct.field(i) for i in range(struct.num_fields)]
    arrays = []
    for c, f in zip(items, fields, strict=True):
        arrays.append(pa.array(c, type=f.type))
        hand_over()  # as between columns: one list column is several
    children = pa.StructArray.from_arrays(arrays, fields=fields)
    mask = pa.array([v is None for v in values], type=pa.bool_()) if nulls else None
    return pa.ListArray.from_arrays(offsets, children, type=type_, mask=mask)
