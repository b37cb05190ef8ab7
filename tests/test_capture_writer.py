"""The capture writer: rotation, disk cap, drop-and-count under pressure, no partial files."""

from __future__ import annotations

import itertools
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pq = pytest.importorskip("pyarrow.parquet")

from kproxy.capture.record_schema import (  # noqa: E402
    ANOMALY_METADATA_KEY,
    COLUMN_NAMES,
    SCHEMA_VERSION,
    SchemaVersionError,
    check_version,
    new_record,
)
from kproxy.capture.writer import (  # noqa: E402
    CONVERT_SLICE,
    HOUR_US,
    CaptureWriter,
    Rotation,
    hour_dir_name,
    over_cap,
)
from kproxy.offloop import SHORT_SWITCH_INTERVAL  # noqa: E402
from tests.support.capture import T0_US, record  # noqa: E402

# The partition items' fields version 5 added (a Produce request's first batch's producer), null here.
NO_HEAD = {"producer_id": None, "producer_epoch": None, "base_sequence": None, "batch_crc": None, "codec": None}


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob("hour=*/capture-*.parquet"))


def _hidden(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.name.startswith("."))


def _rows(directory: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in _files(directory):
        check_version(pq.read_metadata(path).metadata, str(path))
        rows.extend(pq.ParquetFile(path).read().to_pylist())
    return rows


# -- pure decisions -----------------------------------------------------------------------
def test_over_cap_deletes_oldest_first_and_never_the_open_file() -> None:
    files = [(Path("a"), 40), (Path("b"), 40), (Path("c"), 40)]
    assert over_cap(files, 0, 120) == []
    assert over_cap(files, 10, 120) == [Path("a")]
    assert over_cap(files, 50, 100) == [Path("a"), Path("b")]
    assert over_cap(files, 500, 100) == [Path("a"), Path("b"), Path("c")]


def test_rotation_is_due_on_size_or_age() -> None:
    rot = Rotation(rotate_bytes=100, rotate_seconds=60)
    assert not rot.due(size=99, opened_at=0, now=59.9)
    assert rot.due(size=100, opened_at=0, now=1)
    assert rot.due(size=1, opened_at=0, now=60)


def test_hour_directories_are_utc_hours() -> None:
    assert hour_dir_name(T0_US // HOUR_US) == "hour=2026-09-21T14"


def test_new_record_refuses_unknown_columns() -> None:
    with pytest.raises(KeyError, match="no capture column 'topic_name'"):
        new_record(topic_name="x")
    assert set(new_record()) == set(COLUMN_NAMES)


# -- on disk ------------------------------------------------------------------------------
def test_records_round_trip_with_the_schema_version(tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600).start()
    parts = [{"topic": "t", "partition": 1, "error_code": 0, "record_count": 5, "record_bytes": 300}]
    for i in range(10):
        assert writer.offer(record(i, partitions=parts, record_count=5, record_bytes=300))
    writer.close()
    rows = _rows(tmp_path)
    assert [r["correlation_id"] for r in rows] == list(range(10))
    assert {r["schema_version"] for r in rows} == {SCHEMA_VERSION}
    assert rows[3]["partitions"] == [{**parts[0], "group_id": None, "committed_offset": None, "high_watermark": None,
            "base_offset": None, "last_offset": None, "max_timestamp": None, **NO_HEAD}]
    assert writer.written == 10 and writer.dropped == 0
    assert _hidden(tmp_path) == []


def test_dictionary_encodes_the_string_columns_only(tmp_path: Path) -> None:
    # Strings repeat (api names, client ids, topics): a dictionary shrinks them. Times, ids,
    # sizes and latencies hardly repeat: a dictionary of them costs CPU and makes files bigger.
    writer = CaptureWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600).start()
    parts = [{"topic": "t", "partition": 1, "error_code": 0, "record_count": 5, "record_bytes": 300}]
    for i in range(50):
        writer.offer(record(i, partitions=parts))
    writer.close()
    (path,) = _files(tmp_path)
    meta = pq.read_metadata(path).row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    for name in ("api_name", "client_id", "connection_id", "partitions.list.element.topic"):
        assert "RLE_DICTIONARY" in encodings[name], (name, encodings[name])
    for name in ("request_time", "correlation_id", "kproxy_latency_ms", "partitions.list.element.record_bytes"):
        assert not {"RLE_DICTIONARY", "PLAIN_DICTIONARY"} & set(encodings[name]), (name, encodings[name])


def test_rotates_by_size_and_splits_by_hour(tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=20_000, rotate_seconds=3600,
                           row_group_rows=100).start()
    n = 3000
    for i in range(n):
        hour_shift = HOUR_US if i >= n // 2 else 0  # the second half belongs to the next hour
        writer.offer(record(i, at_us=T0_US + hour_shift + i, client_id=f"client-{i}"))
        if i % 500 == 0:
            time.sleep(0.05)  # let row groups form, so size rotation has something to measure
    writer.close()
    files = _files(tmp_path)
    assert len(files) > 3, files
    assert {p.parent.name for p in files} == {"hour=2026-09-21T14", "hour=2026-09-21T15"}
    rows = _rows(tmp_path)
    assert sorted(r["correlation_id"] for r in rows) == list(range(n))
    for path in files:  # every record sits in its own hour's directory
        hours = {hour_dir_name(int(r["request_time"].timestamp() * 1_000_000) // HOUR_US)
                 for r in pq.ParquetFile(path).read().to_pylist()}
        assert hours == {path.parent.name}


def test_rotates_by_age(tmp_path: Path) -> None:
    now = [1000.0]
    writer = CaptureWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=10,
                           flush_seconds=0.05, clock=lambda: now[0]).start()
    for step in range(3):
        writer.offer(record(step))
        deadline = time.monotonic() + 5
        while writer.written <= step and time.monotonic() < deadline:
            now[0] += 0.01  # time passes: the record is flushed after flush_seconds, the file stays open
            time.sleep(0.01)
        assert writer.files_written == step
        now[0] += 11  # older than rotate_seconds: the writer completes the file on its next turn
        deadline = time.monotonic() + 5
        while writer.files_written <= step and time.monotonic() < deadline:
            time.sleep(0.01)
    writer.close()
    assert len(_files(tmp_path)) == 3
    assert len(_rows(tmp_path)) == 3


def test_disk_cap_holds_and_keeps_the_newest(tmp_path: Path) -> None:
    cap = 60_000
    writer = CaptureWriter(tmp_path, max_bytes_total=cap, rotate_bytes=15_000, rotate_seconds=3600,
                           row_group_rows=200, queue_size=30_000).start()
    for i in range(20_000):
        writer.offer(record(i, client_id=f"client-{i}"))  # distinct ids: little to compress
        if i % 1000 == 0:
            time.sleep(0.02)
    writer.close()
    files = _files(tmp_path)
    total = sum(p.stat().st_size for p in files)
    assert total <= cap, (total, cap)
    assert writer.files_deleted > 0
    rows = _rows(tmp_path)
    # What survives is the most recent traffic: the last record written is there.
    ids = {r["correlation_id"] for r in rows}
    assert writer.dropped == 0
    assert max(ids) == 19_999 and min(ids) > 0


def test_a_slow_writer_drops_and_counts_never_blocks(tmp_path: Path) -> None:
    class SlowWriter(CaptureWriter):
        def write_batch_done(self, file: Any) -> None:
            time.sleep(0.2)  # a disk far slower than the traffic

    writer = SlowWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600,
                        queue_size=50, row_group_rows=10).start()
    slowest = 0.0
    accepted = 0
    for i in range(5000):
        t = time.perf_counter()
        accepted += writer.offer(record(i))
        slowest = max(slowest, time.perf_counter() - t)
    # A blocking offer waits for a 0.2 s batch; on a loaded machine a non-blocking one can still
    # lose the GIL to the writer for tens of ms (0.064 s was seen), so the bound sits between.
    assert slowest < 0.15, f"offer blocked for {slowest:.3f} s"
    writer.close()
    assert writer.offered == 5000
    assert writer.dropped > 4000
    assert writer.written + writer.dropped == writer.offered
    assert len(_rows(tmp_path)) == writer.written == accepted


def test_no_partial_file_is_visible_while_writing_or_after_close(tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600,
                           flush_seconds=0.05).start()
    writer.offer(record(0))
    deadline = time.monotonic() + 5
    while writer.written == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.written == 1
    assert _files(tmp_path) == []  # open: only its hidden temporary name exists
    assert len(_hidden(tmp_path)) == 1
    writer.close()
    assert _hidden(tmp_path) == []
    assert len(_rows(tmp_path)) == 1


def test_a_stale_temporary_file_is_removed_at_start(tmp_path: Path) -> None:
    stale = tmp_path / "hour=2026-09-21T13" / ".capture-x-000001.parquet.tmp"
    stale.parent.mkdir()
    stale.write_bytes(b"PAR1 half a file")
    writer = CaptureWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600).start()
    writer.close()
    assert not stale.exists()


def test_wrong_schema_version_names_the_file() -> None:
    with pytest.raises(SchemaVersionError, match=r"f\.parquet: capture schema version 99"):
        check_version({b"kproxy.capture.schema_version": b"99"}, "f.parquet")
    with pytest.raises(SchemaVersionError, match=r"f\.parquet: not a kproxy capture file"):
        check_version({}, "f.parquet")


def test_capture_counts_are_exported_only_when_capture_is_on() -> None:
    from prometheus_client import generate_latest

    from kproxy.metrics.exposition import LiveGauges, make_registry
    from kproxy.metrics.stats import TrafficStats

    on = generate_latest(make_registry(TrafficStats(), lambda: LiveGauges(capture={"written": 3, "dropped": 1})))
    assert b'kproxy_capture_records_total{outcome="written"} 3.0' in on
    assert b'kproxy_capture_records_total{outcome="dropped"} 1.0' in on
    off = generate_latest(make_registry(TrafficStats(), LiveGauges))
    assert b"kproxy_capture_records" not in off


def test_run_with_capture_but_without_pyarrow_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from kproxy.cli import main

    for name in ("kproxy.capture.service", "kproxy.capture.writer"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed: importing it raises ImportError
    assert main(["run", "--upstream", "127.0.0.1:1", "--capture-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "capture.dir: traffic capture needs pyarrow" in err and "pip install 'kproxy-kafka[capture]'" in err


def test_the_queue_is_bounded_by_the_bytes_its_items_hold_too(tmp_path: Path) -> None:
    # Items hold frames by reference (a 5 MB Fetch response each): a count bound alone would let the
    # queue hold gigabytes while the writer is behind.
    writer = CaptureWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600,
                           queue_size=100, queue_bytes=1000)  # not started: nothing is taken
    assert writer.offer(record(0), 400) and writer.offer(record(1), 400)
    assert not writer.offer(record(2), 400)  # 1200 bytes would be held
    assert writer.offer(record(3), 200)  # exactly the bound
    assert (writer.offered, writer.dropped) == (4, 1)


def test_items_that_cannot_be_read_are_lost_and_counted_and_the_rest_written(tmp_path: Path) -> None:
    from kproxy.capture.rows import dict_rows

    def rows(items: list[Any]) -> list[tuple[Any, ...]]:
        if any(item["client_id"] == "poison" for item in items):
            raise ValueError("a reader bug")
        return dict_rows(items)

    writer = CaptureWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600,
                           rows=rows).start()

    def taken() -> None:  # each item taken alone, so that the poisoned one is alone in its slice
        deadline = time.monotonic() + 5
        while writer.queued and time.monotonic() < deadline:
            time.sleep(0.01)

    writer.offer(record(0))
    taken()
    writer.offer(record(1, client_id="poison"))
    taken()
    writer.offer(record(2))
    writer.close()
    assert [r["correlation_id"] for r in _rows(tmp_path)] == [0, 2]
    assert (writer.written, writer.dropped, writer.offered) == (2, 1, 3)


def test_the_runs_detector_settings_are_in_every_files_metadata(tmp_path: Path) -> None:
    settings = '{"churn_per_minute": 7, "forbid_acks0": true}'
    writer = CaptureWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600,
                           metadata={ANOMALY_METADATA_KEY: settings}).start()
    for i in range(3):
        assert writer.offer(record(i, at_us=T0_US + i * 3_600_000_000))  # three hours: three files
    writer.close()
    files = _files(tmp_path)
    assert len(files) == 3
    for path in files:
        metadata = pq.read_metadata(path).metadata
        assert metadata[ANOMALY_METADATA_KEY.encode()] == settings.encode()
        assert metadata[b"kproxy.capture.schema_version"] == str(SCHEMA_VERSION).encode()


def test_rows_whose_items_do_not_fit_the_schema_are_lost_and_counted_and_the_rest_written(tmp_path: Path) -> None:
    # A row whose partitions fit but whose payload items have a field too few: its slice is lost
    # whole (its partitions not added either, which would shift every later row's), the rows of
    # the slices before and after it are written as they were.
    from kproxy.capture.rows import dict_rows

    parts = [{"topic": "t", "partition": 1, "error_code": 0, "record_count": 1, "record_bytes": 70}]

    def rows(items: list[Any]) -> list[tuple[Any, ...]]:
        out = dict_rows(items)
        bad = (("other", 9, 0, 1, 70, *[None] * 11),), (), (("t", 1, 0, b"k", b"v", 1),)  # partitions, rules,
        # payloads
        at = COLUMN_NAMES.index("partitions")
        return [row[:at] + bad + row[at + 3:] if row[6] == "bad" else row for row in out]

    writer = CaptureWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600,
                           rows=rows).start()

    def taken() -> None:  # each item taken alone, so that the bad one is alone in its slice
        deadline = time.monotonic() + 5
        while writer.queued and time.monotonic() < deadline:
            time.sleep(0.01)

    for i, client_id in enumerate(("gen", "bad", "gen")):
        writer.offer(record(i, client_id=client_id, partitions=parts))
        taken()
    writer.close()
    written = _rows(tmp_path)
    assert [r["correlation_id"] for r in written] == [0, 2]
    read = [{**parts[0], "group_id": None, "committed_offset": None, "high_watermark": None,
            "base_offset": None, "last_offset": None, "max_timestamp": None, **NO_HEAD}]
    assert [r["partitions"] for r in written] == [read, read]
    assert (writer.written, writer.dropped, writer.offered) == (2, 1, 3)


# -- defect: the writer thread died for good on a disk error ------------------------------------
def test_a_disk_failing_mid_run_is_survived_retried_and_counters_only_rise(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The partition directory replaced by a regular file while a file is open in it: completing
    that file, and opening any new one, fail with ENOTDIR. Root ignores permission bits, so a
    chmod would not fail a single write here; a path that is not a directory fails for anyone.
    The writer abandoned the open file with a clean-up that raised too (the temporary file is
    not where it was), which ended its thread: nothing more was written once the directory
    came back, and ``written`` went down by the abandoned file's records."""
    caplog.set_level(logging.INFO, logger="kproxy.capture")
    writer = CaptureWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=1.0,
                           flush_seconds=0.05).start()
    hour = tmp_path / hour_dir_name(T0_US // HOUR_US)
    seen: list[int] = []
    sent = [0]

    def offer_for(seconds: float) -> None:  # a record every 5 ms, the counter read after each
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            writer.offer(record(sent[0]))
            sent[0] += 1
            seen.append(writer.written)
            time.sleep(0.005)

    def wait(predicate: Any, what: str) -> None:
        deadline = time.monotonic() + 15
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            offer_for(0.05)

    try:
        wait(lambda: len(_files(tmp_path)) >= 1, "a first complete file")
        wait(lambda: bool(_hidden(tmp_path)) and writer.written > len(_rows(tmp_path)), "records in an open file")
        hour.rename(tmp_path / "moved")
        hour.write_bytes(b"a regular file where the partition directory was")
        wait(lambda: writer.write_errors >= 2, "the disk errors")
        assert writer._thread.is_alive(), "the writer thread ended on a disk error"
        offer_for(0.5)
        hour.unlink()
        (tmp_path / "moved").rename(hour)
        before = {p.name for p in _files(tmp_path)}
        wait(lambda: {p.name for p in _files(tmp_path)} - before, "a new file after the disk came back")
    finally:
        writer.close()
    assert all(a <= b for a, b in itertools.pairwise(seen)), "the written counter went down"
    assert writer.abandoned > 0 and writer.written >= writer.abandoned
    # Every record offered is accounted for, once: in a complete file, abandoned, or dropped.
    assert len(_rows(tmp_path)) == writer.written - writer.abandoned
    assert writer.written + writer.dropped == writer.offered == sent[0]
    lines = [r.getMessage() for r in caplog.records]
    failed = [line for line in lines if "event=capture_write_failed" in line]
    assert len(failed) == 1 and "retry_in_s=1" in failed[0], failed  # then one a minute at most
    assert len([line for line in lines if "event=capture_write_recovered" in line]) == 1


class _IntervalWatched(CaptureWriter):
    """A writer that notes the interpreter's switch interval in ``seen`` as each row group is written."""

    def __init__(self, seen: list[float], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen = seen

    def write_batch_done(self, file: Any) -> None:
        self.seen.append(sys.getswitchinterval())


def test_the_switch_interval_is_short_while_the_writer_works_and_restored_after(tmp_path: Path) -> None:
    """While the writer converts and writes, a loop wanting the GIL gets it within the short
    interval (kproxy.offloop), not the interpreter's 5 ms; idle, the interpreter's is back."""
    seen: list[float] = []

    before = sys.getswitchinterval()
    writer = _IntervalWatched(seen, tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600,
                              row_group_rows=10).start()
    try:
        for i in range(50):
            writer.offer(record(i))
        deadline = time.monotonic() + 10
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        while writer.queued and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # (the turn that wrote the last row group has ended)
        idle = sys.getswitchinterval()
    finally:
        writer.close()
    assert len(seen) >= 3 and max(seen) <= SHORT_SWITCH_INTERVAL, seen
    assert idle == before > SHORT_SWITCH_INTERVAL
    assert sys.getswitchinterval() == before


class _CountedSleeps:
    """Stands in for the time module in kproxy.capture.writer: counts ``sleep(0)``, the writer's
    hand-over of the GIL."""

    def __init__(self) -> None:
        self.hand_overs = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        self.hand_overs += seconds == 0
        time.sleep(seconds)


@pytest.mark.parametrize("beside_loop", [True, False])
def test_only_a_writer_beside_a_loop_hands_the_gil_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        beside_loop: bool) -> None:
    """Beside the proxy's event loop (the capture thread) a turn runs in the short switch interval
    and hands the GIL over between slices and columns; in the capture worker, where no loop shares
    the GIL, each would be a switch of threads for nothing: the interpreter's interval, no hand-over."""
    import kproxy.capture.writer as writer_module

    counted = _CountedSleeps()
    monkeypatch.setattr(writer_module, "time", counted)
    seen: list[float] = []

    before = sys.getswitchinterval()
    writer = _IntervalWatched(seen, tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600,
                              row_group_rows=40, beside_loop=beside_loop)
    for i in range(100):  # queued before the thread starts: turns of whole slices
        writer.offer(record(i))
    writer.start()
    writer.close()
    assert len(_rows(tmp_path)) == 100 and seen, seen
    if beside_loop:
        assert max(seen) <= SHORT_SWITCH_INTERVAL < before and counted.hand_overs >= 100 // CONVERT_SLICE, (
            seen, counted.hand_overs)
    else:
        assert set(seen) == {before} and counted.hand_overs == 0, (seen, counted.hand_overs)


def test_the_writer_thread_runs_at_the_process_s_priority(tmp_path: Path) -> None:
    """Not below it: a writer left off a busy core while it holds the GIL (a garbage collection,
    an Arrow conversion) would hold the event loop as long (the module's contract)."""
    writer = CaptureWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600).start()
    try:
        for n in range(200):  # a busy writer: rows converted, a file written
            writer.offer(record(n))
        deadline = time.monotonic() + 10
        while writer.queued and time.monotonic() < deadline:
            time.sleep(0.01)
        tid = writer._thread.native_id
        assert tid is not None and writer._thread.is_alive()
        assert os.getpriority(os.PRIO_PROCESS, tid) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        writer.close()
