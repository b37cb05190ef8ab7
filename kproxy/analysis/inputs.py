"""The job's inputs, found and checked before Spark reads them.

A missing path, a file that is not Parquet (or is cut short), a file of another schema version and
a file with a page that does not decode are each reported with the file and the reason
(:class:`InputProblem`) and left out; the readable files are analysed.

Local files are checked in two steps, both before Spark sees them: the footer (magic bytes, Parquet
metadata, the capture schema version: :func:`read_footer`), then every page of every column, decoded
by pyarrow (:func:`read_pages`; a thread per core: 10 million records take about 3 s of CPU, where
Spark's own read of the same columns cost the job a pass of 10 s or more). A file whose footer is
sound but whose data is not (a corrupt page) is named and left out whole, so every pass of the job
reads the same records. Remote inputs (any URI but ``file://``) are not checked here: Spark reads
them (their schema versions: :func:`kproxy.analysis.job.read_captures`) and skips what it cannot
read of them, unnamed (``spark.sql.files.ignoreCorruptFiles``).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kproxy.capture.record_schema import (
    ANOMALY_METADATA_KEY,
    VERSION_METADATA_KEY,
    SchemaVersionError,
    check_version,
)

PARQUET_MAGIC = b"PAR1"
PAGE_BATCH_ROWS = 65_536  # read_pages: records decoded at a time (memory per thread: one batch, one row group)


@dataclass(frozen=True)
class InputProblem:
    """One input that was left out, and why."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class Inputs:
    files: list[str] = field(default_factory=list)  # local capture files that passed the checks
    rows: dict[str, int] = field(default_factory=dict)  # local file -> records its footer counts
    uris: list[str] = field(default_factory=list)  # directories/files Spark reads itself (remote)
    problems: list[InputProblem] = field(default_factory=list)
    remote_rows: int = 0  # records of readable schema versions under ``uris`` (read_captures counts them)
    # local file -> its first and last request_time (UTC) as its footer's statistics tell them, None where
    # they do not (a writer that kept none)
    spans: dict[str, tuple[datetime, datetime] | None] = field(default_factory=dict)
    versions: set[int] = field(default_factory=set)  # the capture schema versions of the records read
    # The run's client anomaly settings as the newest local file that records them says (its metadata's
    # JSON, kproxy.capture.record_schema.ANOMALY_METADATA_KEY), and that file; None: none records them.
    anomaly_settings: tuple[str, bytes] | None = None

    @property
    def records(self) -> int:
        return sum(self.rows.values()) + self.remote_rows

    def span(self) -> tuple[datetime, datetime] | None:
        """The first and last ``request_time`` of the records, from the local files' footers; None
        when some input's footer does not tell them (a remote input: Spark reads those)."""
        spans = [self.spans.get(file) for file in self.files]
        if self.uris or not spans or any(span is None for span in spans):
            return None
        known = [span for span in spans if span is not None]
        return min(first for first, _ in known), max(last for _, last in known)


def find_inputs(paths: Sequence[str], *, threads: int | None = None) -> Inputs:
    """Expand and check the inputs: local directories are searched for capture files, and each
    local file's footer, schema version and pages are checked (``threads`` at a time, default one
    per core) before Spark sees it."""
    found = Inputs()
    local: list[Path] = []
    for raw in paths:
        if "://" in raw and not raw.startswith("file://"):
            found.uris.append(raw)
            continue
        path = Path(raw.removeprefix("file://"))
        if not path.exists():
            found.problems.append(InputProblem(raw, "no such file or directory"))
            continue
        if path.is_dir():
            files = sorted(Path(p) for p in glob.glob(str(path / "**" / "capture-*.parquet"), recursive=True))
            if not files:
                found.problems.append(InputProblem(raw, "no capture files (capture-*.parquet) under it"))
                continue
        else:
            files = [path]
        local += files
    metadata = [(file, _read_metadata(file)) for file in local]
    footers = [(file, m if isinstance(m, InputProblem) else int(m.num_rows)) for file, m in metadata]
    sound = [(file, rows) for file, rows in footers if isinstance(rows, int)]
    with ThreadPoolExecutor(max_workers=max(1, threads or os.cpu_count() or 1)) as pool:
        pages = dict(zip([file for file, _ in sound], pool.map(lambda fr: read_pages(*fr), sound), strict=True))
    _release_arrow_memory()
    for file, footer in footers:
        problem = footer if isinstance(footer, InputProblem) else pages[file]
        if problem is not None:
            found.problems.append(problem)
        else:
            assert isinstance(footer, int)
            found.files.append(str(file))
            found.rows[str(file)] = footer
    for file, meta in metadata:
        if str(file) in found.rows and not isinstance(meta, InputProblem):
            found.spans[str(file)] = footer_span(meta)
            kv = meta.metadata or {}
            found.versions.add(int(kv[VERSION_METADATA_KEY.encode()]))
            settings = kv.get(ANOMALY_METADATA_KEY.encode())
            if settings is not None:  # (files in time order: hour directories, then names)
                found.anomaly_settings = (str(file), settings)
    return found


def check_file(path: Path) -> InputProblem | None:
    """None if ``path`` is a complete Parquet file of a capture schema version this kproxy reads
    (its footer says so: its pages are :func:`read_pages`'s); else why not."""
    footer = read_footer(path)
    return footer if isinstance(footer, InputProblem) else None


def read_footer(path: Path) -> InputProblem | int:
    """The records of ``path`` as its footer counts them, if it is a complete Parquet file of a
    capture schema version this kproxy reads; else why not."""
    metadata = _read_metadata(path)
    return metadata if isinstance(metadata, InputProblem) else int(metadata.num_rows)


def footer_span(metadata: Any) -> tuple[datetime, datetime] | None:
    """The first and last ``request_time`` of a capture file (aware UTC), from its row groups'
    statistics in ``metadata`` (a pyarrow ``FileMetaData``); None without rows or statistics."""
    try:
        column = metadata.schema.names.index("request_time")
    except ValueError:
        return None
    lows, highs = [], []
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        if group.num_rows == 0:
            continue
        stats = group.column(column).statistics
        if stats is None or not stats.has_min_max or not isinstance(stats.min, datetime):
            return None
        lows.append(stats.min)
        highs.append(stats.max)
    if not lows:
        return None
    return _utc(min(lows)), _utc(max(highs))


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _read_metadata(path: Path) -> Any:
    """``path``'s Parquet footer (pyarrow ``FileMetaData``) if it is a complete Parquet file of a
    capture schema version this kproxy reads; else why not (an :class:`InputProblem`)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4))
            tail = f.read(4)
    except OSError as exc:
        return InputProblem(str(path), f"cannot read: {exc.strerror or exc}")
    if size < 12 or head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
        return InputProblem(str(path), "not a complete Parquet file (no PAR1 magic at both ends: cut short, "
                                       "or another format)")
    import pyarrow.parquet as pq  # the analysis extra carries pyarrow: the checks before Spark reads

    try:
        footer = pq.read_metadata(path)
    except (OSError, ValueError) as exc:  # pyarrow: ArrowInvalid is a ValueError, ArrowIOError an OSError
        return InputProblem(str(path), f"unreadable Parquet footer: {exc}")
    try:
        check_version(footer.metadata, str(path))
    except SchemaVersionError as exc:
        return InputProblem(str(path), str(exc).removeprefix(f"{path}: "))
    return footer


def read_pages(path: Path, expected: int) -> InputProblem | None:
    """None if every page of every column of ``path`` decodes and yields the ``expected`` records
    its footer counts; else what could be read. One batch of records in memory at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    read = 0
    try:
        with pq.ParquetFile(path) as parquet:
            for batch in parquet.iter_batches(batch_size=PAGE_BATCH_ROWS, use_threads=False):
                read += batch.num_rows
    except (OSError, ValueError, pa.ArrowException) as exc:
        return InputProblem(str(path), f"corrupt data: {read} of the {expected} records its footer counts could be "
                                       f"read ({_one_line(exc)}); the file is left out")
    if read != expected:
        return InputProblem(str(path), f"corrupt data: {read} of the {expected} records its footer counts could be "
                                       f"read; the file is left out")
    return None


def _one_line(exc: BaseException, limit: int = 120) -> str:
    """The first line of ``exc``'s message, printable characters only (pyarrow quotes the bytes it
    could not decode), at most ``limit`` long."""
    lines = str(exc).strip().splitlines()
    line = "".join(c if c.isprintable() else "?" for c in (lines[0] if lines else type(exc).__name__))
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _release_arrow_memory() -> None:
    """Give the pages' buffers back to the system (Arrow's allocator keeps freed memory for reuse:
    it would count in the job's resident memory while Spark runs)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
