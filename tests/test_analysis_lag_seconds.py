"""The capture analysis's lag in seconds agrees with kproxy's live series over the same run.

Real clients through a real kproxy (capture and consumer lag on) to the real Tansu broker: a
librdkafka producer writes RECORDS_A_SECOND records a second to one partition throughout; a
kafka-python consumer group reads the first records, commits and stops (its client closed: kproxy
keeps its committed offset within the staleness window). /metrics is scraped while the producer
still writes, kproxy stops, and ``kproxy analyze``'s job runs over the capture with bins of a
second:

* the group's last ``consumer_lag`` row dates its committed offset as the scrape's
  ``kproxy_consumergroup_lag_seconds`` does: the row's time less its ``lag_seconds`` and the
  scrape's time less the live value are within TOLERANCE of each other (the live tracker keeps one
  write time a second per partition and reads the nearest one's; the analysis reads the time
  between its points; both are within that of the record's CreateTime, from the delivery report);
* while the group is stopped, the rows' ``lag_seconds`` rise by their times' difference (1 s a
  second), and each is within TOLERANCE of the row's time less that CreateTime;
* the report's text table and its plot carry it.

The roll-up itself (:func:`kproxy.analysis.capture_lag.consumer_lag` with write-time points) is checked on
its own, on tables made by hand, without Spark; so is a capture with no write times (older than
schema version 4): lag in offsets, no lag in seconds, and the summary says why.
"""

from __future__ import annotations

import io
import itertools
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")

from kproxy.testing import Broker, free_port, running_proxy  # noqa: E402
from tests.support.e2e import create_topic, unique  # noqa: E402
from tests.test_lag_e2e import series, wait_for  # noqa: E402
from tests.test_lag_seconds_e2e import Writer  # noqa: E402

READ = 12  # records the group reads and commits before it stops
STOPPED_FOR = 6.0  # seconds the producer keeps writing after the group stopped, before the scrape
TOLERANCE = 1.5  # seconds: the live tracker's write-time points are a second apart, plus rounding


def _stopped_group(bootstrap: str, topic: str, group: str) -> int:
    """kafka-python reads READ records, commits them and stops; the offset it committed."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, client_id="lagsec-stopped",
                             enable_auto_commit=False, auto_offset_reset="earliest", request_timeout_ms=15000,
                             session_timeout_ms=6000, heartbeat_interval_ms=1000, max_poll_interval_ms=30000)
    try:
        read = 0
        deadline = time.monotonic() + 45
        while read < READ and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500, max_records=READ - read).values():
                read += len(records)
        assert read == READ
        consumer.commit()
        committed = consumer.committed(KTopicPartition(topic, 0))
    finally:
        consumer.close()
    assert committed == READ
    return READ


def test_offline_lag_seconds_equal_the_live_series(tansu: Broker, spark: Any, tmp_path: Path) -> None:
    from kproxy.analysis.job import run_analysis
    from kproxy.analysis.report import lag_at_end, summary, write_html

    port = free_port()
    capture = tmp_path / "capture"
    topic, group = unique("lagsec-report"), unique("lagsec-report-group")
    with running_proxy(tansu.bootstrap, metrics_listen=f"127.0.0.1:{port}", capture__dir=str(capture)) as proxy:
        create_topic(proxy.bootstrap, topic, 1)
        writer = Writer(proxy.bootstrap, topic)
        writer.thread.start()
        try:
            while writer.end() < READ + 5 and not writer.errors:
                time.sleep(0.1)
            committed = _stopped_group(proxy.bootstrap, topic, group)
            time.sleep(STOPPED_FOR)
            metrics = wait_for(port, lambda m: series(m, "kproxy_consumergroup_lag_seconds", group=group),
                               "the stopped group's lag in seconds")
            scraped = time.time()
            live = series(metrics, "kproxy_consumergroup_lag_seconds", group=group)[(("topic", topic),)]
        finally:
            writer.stop.set()
            writer.thread.join(30)
            del writer.producer  # (its client let go while kproxy runs: none left retrying a closed port)
    assert not writer.errors
    created = writer.written[committed] / 1000  # the first record the group has not committed: its CreateTime
    assert abs((scraped - live) - created) <= TOLERANCE, (scraped, live, created)

    result = run_analysis([str(capture)], tmp_path / "out", spark, interval=1)
    assert result.problems == []
    rows = [r for r in result.tables["consumer_lag"] if r["group_id"] == group]
    behind = [r for r in rows if r["lag"] > 0]
    assert len(behind) >= STOPPED_FOR - 1
    last = rows[-1]
    dated = last["time"].timestamp() - last["lag_seconds"]
    print(f"lag seconds: live {live:.3f} at the scrape, report {last['lag_seconds']:.3f} at {last['time']}; the "
          f"committed offset dated live {scraped - live - created:+.3f} s, offline {dated - created:+.3f} s "
          "from its CreateTime")
    assert abs(dated - (scraped - live)) <= TOLERANCE, (dated, scraped - live)
    for row in behind:
        assert abs(row["time"].timestamp() - row["lag_seconds"] - created) <= TOLERANCE, (row, created)
    for before, after in itertools.pairwise(behind):  # rising at 1 s a second
        assert after["lag_seconds"] - before["lag_seconds"] == pytest.approx(
            (after["time"] - before["time"]).total_seconds(), abs=1e-3)

    at_end = {(r["group_id"], r["topic"]): r for r in lag_at_end(result.tables["consumer_lag"])}
    assert at_end[(group, topic)]["lag_seconds"] == last["lag_seconds"]
    text = io.StringIO()
    summary(result, text)
    assert f"{last['lag_seconds']:.1f}" in text.getvalue()
    write_html(result, str(tmp_path / "out" / "report.html"))
    assert (tmp_path / "out" / "plots" / "consumer_lag_seconds.png").read_bytes().startswith(b"\x89PNG")


class Reader:
    """A librdkafka group member reading the topic through kproxy as it is written (a thread, bounded:
    until stopped or 120 s)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("lagsec-reader"),
                                  "client.id": "lagsec-reader", "auto.offset.reset": "earliest",
                                  "fetch.wait.max.ms": 100, "session.timeout.ms": 6000,
                                  "heartbeat.interval.ms": 1000})
        self.consumer.subscribe([topic])
        self.read = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while not self.stop.is_set() and time.monotonic() < deadline:
            message = self.consumer.poll(0.2)
            if message is not None and not message.error():
                self.read += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)
        self.consumer.close()


def test_a_partition_written_around_kproxy_has_lag_seconds_from_fetch_answers(tansu: Broker, spark: Any,
                                                                             tmp_path: Path) -> None:
    """The producer writes to the broker directly; a group reads through kproxy as records come, another
    reads READ records, commits and stops: its lag in seconds, live and in the report, dates its
    committed offset from the Fetch answers' batch headers, within TOLERANCE of its CreateTime."""
    from kproxy.analysis.job import run_analysis

    port = free_port()
    capture = tmp_path / "capture"
    topic, group = unique("lagsec-fetch"), unique("lagsec-fetch-group")
    create_topic(tansu.bootstrap, topic, 1)
    with running_proxy(tansu.bootstrap, metrics_listen=f"127.0.0.1:{port}", capture__dir=str(capture)) as proxy:
        writer = Writer(tansu.bootstrap, topic)  # around kproxy
        writer.thread.start()
        reader = Reader(proxy.bootstrap, topic)
        try:
            while writer.end() < READ + 5 and not writer.errors:
                time.sleep(0.1)
            committed = _stopped_group(proxy.bootstrap, topic, group)
            time.sleep(STOPPED_FOR)
            metrics = wait_for(port, lambda m: series(m, "kproxy_consumergroup_lag_seconds", group=group),
                               "the stopped group's lag in seconds")
            scraped = time.time()
            live = series(metrics, "kproxy_consumergroup_lag_seconds", group=group)[(("topic", topic),)]
        finally:
            reader.close()
            writer.stop.set()
            writer.thread.join(30)
            del writer.producer
    created = writer.written[committed] / 1000
    print(f"lag seconds from Fetch answers: live {live:.3f}, dating the committed offset "
          f"{scraped - live - created:+.3f} s from its CreateTime; the reader read {reader.read}")
    assert not writer.errors and reader.read > committed
    assert abs((scraped - live) - created) <= TOLERANCE, (scraped, live, created)
    result = run_analysis([str(capture)], tmp_path / "out", spark, interval=1)
    last = [r for r in result.tables["consumer_lag"] if r["group_id"] == group][-1]
    assert last["lag_seconds"] is not None and last["lag"] > 0
    dated = last["time"].timestamp() - last["lag_seconds"]
    assert abs(dated - (scraped - live)) <= TOLERANCE, (dated, scraped - live)


# -- the roll-up, without Spark ---------------------------------------------------------------------
T0 = datetime(2026, 11, 28, 14, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)


def _offsets(rows: list[tuple[int, str | None, str, int, int]]) -> Any:
    """The partitions pass's offsets rows: (second from T0, group, topic, partition, offset)."""
    return pa.table({"answered": pa.array([T0 + timedelta(seconds=r[0]) for r in rows], pa.timestamp("us", "UTC")),
                     "group_id": [r[1] for r in rows], "topic": [r[2] for r in rows],
                     "partition": pa.array([r[3] for r in rows], pa.int32()),
                     "offset": pa.array([r[4] for r in rows], pa.int64())})


def _points(rows: list[tuple[int, str, int, int, int, int, int]]) -> Any:
    """The write-time points: (second from T0, topic, partition, first, last, earliest, latest ms from T0)."""
    return pa.table({"answered": pa.array([T0 + timedelta(seconds=r[0]) for r in rows], pa.timestamp("us", "UTC")),
                     "topic": [r[1] for r in rows], "partition": pa.array([r[2] for r in rows], pa.int32()),
                     "first": pa.array([r[3] for r in rows], pa.int64()),
                     "last": pa.array([r[4] for r in rows], pa.int64()),
                     "stamp_low": pa.array([T0_MS + r[5] for r in rows], pa.int64()),
                     "stamp_high": pa.array([T0_MS + r[6] for r in rows], pa.int64())})


def test_the_roll_up_dates_the_first_offset_not_committed_from_the_points_known() -> None:
    from kproxy.analysis.capture_lag import consumer_lag

    offsets = _offsets([
        (0, None, "t", 0, 10), (0, None, "t", 1, 10),  # the partitions' ends after the first appends
        (0, "g", "t", 0, 10), (0, "g", "t", 1, 4),  # g caught up on t-0, 6 behind on t-1
        (1, None, "t", 0, 20),  # t-0 grows: g 10 behind there
        (2, None, "u", 0, 5), (2, "g", "u", 0, 2),  # u: no write time known
        (3, None, "t", 1, 30),
    ])
    points = _points([
        (0, "t", 0, 0, 9, 0, 900), (0, "t", 1, 0, 9, 0, 900),  # offsets 0-9 written over 0.9 s
        (1, "t", 0, 10, 19, 1000, 1900),
        (3, "t", 1, 20, 29, 3000, 3900),
    ])
    got = [(int((r["time"] - T0).total_seconds()), r["group_id"], r["topic"], r["lag"], r["lag_seconds"])
           for r in consumer_lag(offsets, 1, points).to_pylist()]
    assert got == [
        (1, "g", "t", 6, pytest.approx(1 - 0.4)),  # t-1's offset 4: 0.4 s into the first point
        (2, "g", "t", 16, pytest.approx(2 - 0.4)),  # t-0's offset 10 (1.0 s) is younger than t-1's 4
        (3, "g", "t", 16, pytest.approx(3 - 0.4)), (3, "g", "u", 3, None),  # u: lag, no write time
        (4, "g", "t", 36, pytest.approx(4 - 0.4)), (4, "g", "u", 3, None)]
    assert [r["lag_seconds"] for r in consumer_lag(offsets, 1).to_pylist()] == [None, None, None, None, None, None]


def test_a_topic_made_again_starts_its_points_over_and_late_answers_are_known_already() -> None:
    from kproxy.analysis.capture_lag import WritePoints

    points = WritePoints()
    points.add(100, 109, 0, 900)
    points.add(110, 119, 1000, 1900)
    points.add(105, 112, 5000, 5000)  # a late answer's offsets: dated already
    assert points.written_at(112) == pytest.approx(1200)
    assert points.written_at(125) == 1900  # past the last point: its latest time
    assert points.written_at(50) == 0  # before the first: its earliest
    points.add(0, 3, 9000, 9300)  # below the first point: the log started over
    assert points.points == [(0, 3, 9000, 9300)] and points.written_at(2) == pytest.approx(9200)


def test_a_capture_without_write_times_has_lag_and_says_it_has_no_lag_seconds(spark: Any, tmp_path: Path) -> None:
    from kproxy.analysis.job import run_analysis
    from kproxy.analysis.report import summary
    from kproxy.capture.writer import CaptureWriter
    from tests.support.capture import record

    start = int(T0.timestamp() * 1_000_000)
    writer = CaptureWriter(tmp_path / "capture", max_bytes_total=10**9, rotate_bytes=10**8,
                           rotate_seconds=3600).start()
    for i, (api_key, api_name, group, committed, mark) in enumerate([
            (1, "Fetch", None, None, 50), (8, "OffsetCommit", "g", 20, None)]):
        assert writer.offer(record(i, at_us=start + i * 1_000_000, api_key=api_key, api_name=api_name,
                                   response_time=start + i * 1_000_000 + 1000, partitions=[
                                       {"topic": "t", "partition": 0, "error_code": 0, "record_count": 0,
                                        "record_bytes": 0, "group_id": group, "committed_offset": committed,
                                        "high_watermark": mark}]))
    writer.close()
    result = run_analysis([str(tmp_path / "capture")], tmp_path / "out", spark, interval=1)
    assert [(r["lag"], r["lag_seconds"]) for r in result.tables["consumer_lag"]] == [(30, None)]
    text = io.StringIO()
    summary(result, text)
    assert "lag in seconds: no write times in the capture" in text.getvalue()
