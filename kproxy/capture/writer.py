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
  drops the record and counts it (``dropped``). It is called from the proxy's
  event loop; everything that touches the disk happens on the writer thread.
* A file is rotated when it reaches ``rotate_bytes``, has been open
  ``rotate_seconds``, or the hour changes. After each write the oldest complete
  files are deleted while all files together exceed ``max_bytes_total``.
* :meth:`~CaptureWriter.close` writes what is queued, completes and renames
  the open file; a stale temporary file (a process killed with SIGKILL) is
  removed at the next start, never renamed.

The decisions (which hour, when to rotate, which files to delete) are pure
functions below, tested without a disk.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from kproxy.capture.schema import COLUMNS, SCHEMA_VERSION, VERSION_METADATA_KEY, Column

log = logging.getLogger("kproxy.capture")

HOUR_US = 3_600_000_000
# Records converted to Arrow per call: the conversion holds the GIL throughout (it reads Python
# objects), so it goes in slices of ~2 ms (≈ 6 µs a record) that let the proxy's event loop run
# between them; a 10,000-record row group converted at once would stall it for ~60 ms.
CONVERT_SLICE = 256
_STOP = object()

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


def arrow_schema() -> pa.Schema:
    """The Arrow schema of :data:`kproxy.capture.schema.COLUMNS`, with the version in its metadata."""
    return pa.schema([_arrow_field(c) for c in COLUMNS],
                     metadata={VERSION_METADATA_KEY: str(SCHEMA_VERSION)})


# -- pure decisions ------------------------------------------------------------------------
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
        self._writer = pq.ParquetWriter(self._file, schema, compression="zstd")

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
        try:
            self._file.close()
        finally:
            self.temp.unlink(missing_ok=True)


class CaptureWriter:
    """Queue + thread writing capture records (dicts of :mod:`kproxy.capture.schema`) as Parquet.

    ``start()`` scans ``directory`` (stale temporary files removed, existing
    capture files counted towards the cap), then starts the thread.
    """

    def __init__(self, directory: Path, *, max_bytes_total: int, rotate_bytes: int, rotate_seconds: float,
                 queue_size: int = 10_000, row_group_rows: int = 10_000, flush_seconds: float = 1.0,
                 clock: Callable[[], float] = time.time) -> None:
        if rotate_bytes > max_bytes_total:
            raise ValueError("rotate_bytes must not exceed max_bytes_total")
        self.directory = directory
        self.max_bytes_total = max_bytes_total
        self.rotation = Rotation(rotate_bytes=rotate_bytes, rotate_seconds=rotate_seconds)
        self.row_group_rows = row_group_rows
        self.flush_seconds = flush_seconds
        self.clock = clock
        self.schema = arrow_schema()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="kproxy-capture", daemon=True)
        self._complete: deque[tuple[Path, int]] = deque()
        self._open: _OpenFile | None = None
        self._seq = 0
        self.offered = 0
        self.dropped = 0  # queue full, or lost to a write error
        self.written = 0
        self.files_written = 0
        self.files_deleted = 0
        self.write_errors = 0

    # -- the event loop's side ---------------------------------------------------------
    def offer(self, record: dict[str, Any]) -> bool:
        """Queue one record for writing; False (and counted) when the queue is full."""
        self.offered += 1
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1
            return False
        return True

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
        if not self._thread.is_alive():
            return
        deadline = time.monotonic() + timeout
        while True:  # the queue may be full: wait for room, within the deadline
            try:
                self._queue.put(_STOP, timeout=0.1)
                break
            except queue.Full:
                if time.monotonic() > deadline:
                    log.warning("event=capture_close_timeout queued=%d", self._queue.qsize())
                    return
        self._thread.join(max(0.0, deadline - time.monotonic()))

    # -- the writer thread ---------------------------------------------------------------
    def _run(self) -> None:
        pending: list[dict[str, Any]] = []
        first_at = 0.0
        stop = False
        while not stop:
            try:
                item = self._queue.get(timeout=self.flush_seconds / 4)
            except queue.Empty:
                item = None
            if item is _STOP:
                stop = True
            elif item is not None:
                if not pending:
                    first_at = self.clock()
                pending.append(item)
                while len(pending) < self.row_group_rows:  # take what is there without waiting
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is _STOP:
                        stop = True
                        break
                    pending.append(more)
            now = self.clock()
            if pending and (stop or len(pending) >= self.row_group_rows or now - first_at >= self.flush_seconds):
                self._write(pending)
                pending = []
            if self._open is not None and (stop or self.rotation.due(size=self._open.size,
                                                                     opened_at=self._open.opened_at, now=now)):
                self._finish()

    def _write(self, records: list[dict[str, Any]]) -> None:
        for hour, group in _by_hour(records):
            try:
                if self._open is not None and self._open.hour != hour:
                    self._finish()
                if self._open is None:
                    self._open = self._new_file(hour)
                self._open.write(self._to_table(group))
                self.written += len(group)
                self.write_batch_done(self._open)
            except (OSError, pa.ArrowException) as exc:
                self.write_errors += 1
                self.dropped += len(group)
                log.error("event=capture_write_failed records=%d error=%s", len(group), _q(str(exc)))
                if self._open is not None:
                    self._open.abandon()
                    self._open = None
                continue
            if self._open.size >= self.rotation.rotate_bytes:
                self._finish()
            self._enforce_cap()

    def _to_table(self, records: list[dict[str, Any]]) -> pa.Table:
        batches = [pa.RecordBatch.from_pylist(records[i:i + CONVERT_SLICE], schema=self.schema)
                   for i in range(0, len(records), CONVERT_SLICE)]
        return pa.Table.from_batches(batches, schema=self.schema)

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
        except (OSError, pa.ArrowException) as exc:
            self.write_errors += 1
            self.dropped += f.records
            self.written -= f.records
            log.error("event=capture_write_failed records=%d error=%s", f.records, _q(str(exc)))
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


def _by_hour(records: list[dict[str, Any]]) -> Iterable[tuple[int, list[dict[str, Any]]]]:
    """Runs of consecutive records of the same hour (records arrive nearly in time order)."""
    group: list[dict[str, Any]] = []
    current = -1
    for rec in records:
        hour = hour_of(rec["request_time"])
        if hour != current and group:
            yield current, group
            group = []
        current = hour
        group.append(rec)
    if group:
        yield current, group


def _q(text: str) -> str:
    # logfmt quoting, as kproxy.server.logfmt.q does (capture does not import the server)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'
