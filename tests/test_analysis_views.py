"""The capture analysis's traffic views agree with kproxy's live series over the same run.

Real clients through a real kproxy (capture and per-client labels on) to the real Tansu broker: a
librdkafka producer (lz4) and a kafka-python producer (gzip) under their own client ids; a
kafka-python consumer group that reads part of the topic, commits and stops; a librdkafka group
that reads everything (auto-commit, its last commit on close); more records produced once the first
group stopped. Every client closed, kproxy's /metrics is read, kproxy stops, and ``kproxy
analyze``'s job runs over the capture:

* ``consumer_lag``'s last minute per group and topic is ``kproxy_consumergroup_lag_sum`` at the end
  (and sums as many partitions as ``kproxy_consumergroup_lag`` has series), the stopped group's
  equal to what was produced less what it committed (its consumer's own ``committed()``);
* ``top_clients``' record bytes produced and fetched per client id are
  ``kproxy_client_bytes_total{direction=produce|fetch}``, and its requests ``kproxy_client_requests_total``
  summed over the apis.

The roll-up of consumer lag itself (:func:`kproxy.analysis.capture_lag.consumer_lag`) and its plot are
checked on their own, on tables made by hand, without Spark.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")

from kproxy.testing import Broker, free_port, running_proxy  # noqa: E402
from tests.support.e2e import create_topic, unique  # noqa: E402
from tests.test_lag_e2e import scrape, series, wait_for  # noqa: E402

PARTITIONS = 2
FIRST = 12  # records per partition before the stopped group reads
MORE = 5  # records per partition produced once it stopped
STOPPED_READS = 9  # records the stopped group reads (of 2 x FIRST) before it commits and stops


def _produce(bootstrap: str, topic: str) -> tuple[int, Any]:
    """FIRST records per partition, from two producers of two libraries and codecs; the librdkafka
    one (kept, for more later) and the records sent."""
    from confluent_kafka import Producer
    from kafka import KafkaProducer

    rdkafka = Producer({"bootstrap.servers": bootstrap, "client.id": "views-lz4", "compression.type": "lz4",
                        "linger.ms": 20})
    for i in range(FIRST - 4):
        for p in range(PARTITIONS):
            rdkafka.produce(topic, value=b"lz4-%d-" % i + b"x" * (i * 7), partition=p)
    assert rdkafka.flush(15) == 0
    python = KafkaProducer(bootstrap_servers=bootstrap, client_id="views-gzip", compression_type="gzip",
                           linger_ms=10, acks=1)
    try:
        futures = [python.send(topic, value=b"gzip-%d" % i + b"y" * (i * 11), partition=p)
                   for i in range(4) for p in range(PARTITIONS)]
        for future in futures:
            future.get(timeout=15)
    finally:
        python.close(5)
    return FIRST * PARTITIONS, rdkafka


def _stopped_group(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    """kafka-python reads STOPPED_READS records, commits them and stops (LeaveGroup); what it committed."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, client_id="views-stopped",
                             enable_auto_commit=False, auto_offset_reset="earliest", request_timeout_ms=15000,
                             session_timeout_ms=6000, heartbeat_interval_ms=1000, max_poll_interval_ms=10000)
    try:
        read = 0
        deadline = time.monotonic() + 45
        while read < STOPPED_READS and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500, max_records=STOPPED_READS - read).values():
                read += len(records)
        assert read == STOPPED_READS
        consumer.commit()
        committed = {p: consumer.committed(KTopicPartition(topic, p)) or 0 for p in range(PARTITIONS)}
    finally:
        consumer.close()
    assert sum(committed.values()) == STOPPED_READS
    return committed


def _read_everything(bootstrap: str, topic: str, group: str, records: int) -> None:
    """A librdkafka group member reads ``records``, then closes (auto-commit commits on close)."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "views-live",
                         "auto.offset.reset": "earliest", "enable.auto.commit": True,
                         "auto.commit.interval.ms": 500, "session.timeout.ms": 6000})
    try:
        consumer.subscribe([topic])
        read = 0
        deadline = time.monotonic() + 60
        while read < records and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                read += 1
        assert read == records
    finally:
        consumer.close()


def test_offline_lag_and_client_bytes_equal_the_live_series(tansu: Broker, spark: Any, tmp_path: Path) -> None:
    from kproxy.analysis.job import run_analysis
    from kproxy.analysis.report import lag_at_end, write_html

    port = free_port()
    capture = tmp_path / "capture"
    topic, stopped, live = unique("views"), unique("views-stopped"), unique("views-live")
    with running_proxy(tansu.bootstrap, metrics_listen=f"127.0.0.1:{port}", capture__dir=str(capture),
                       metrics__client_id_label=True, metrics__consumer_lag_partitions=True) as proxy:
        bootstrap = proxy.bootstrap
        create_topic(bootstrap, topic, PARTITIONS, **{"client.id": "views-admin"})
        produced, rdkafka = _produce(bootstrap, topic)
        committed = _stopped_group(bootstrap, topic, stopped)
        for i in range(MORE):
            for p in range(PARTITIONS):
                rdkafka.produce(topic, value=b"more-%d" % i, partition=p)
        assert rdkafka.flush(15) == 0
        produced += MORE * PARTITIONS
        del rdkafka
        _read_everything(bootstrap, topic, live, produced)
        # Every client closed: what /metrics says now is what it will say (the lag stays within its window).
        behind = produced - sum(committed.values())
        metrics = wait_for(port, lambda m: series(m, "kproxy_consumergroup_lag_sum", group=stopped)
                           == {(("topic", topic),): behind}, f"the stopped group's lag of {behind}")
        time.sleep(1.0)
        metrics = scrape(port)
    live_lag = {(dict(k)["group"], dict(k)["topic"]): v for k, v in metrics["kproxy_consumergroup_lag_sum"].items()}
    live_partitions: dict[tuple[str, str], int] = {}
    for key in metrics["kproxy_consumergroup_lag"]:
        labels = dict(key)
        live_partitions[(labels["group"], labels["topic"])] = live_partitions.get(
            (labels["group"], labels["topic"]), 0) + 1
    live_bytes = {(dict(k)["client_id"], dict(k)["direction"]): v
                  for k, v in metrics["kproxy_client_bytes"].items() if v}
    assert {g for g, _ in live_lag} == {stopped, live}
    assert {c for c, _ in live_bytes} == {"views-lz4", "views-gzip", "views-stopped", "views-live"}

    result = run_analysis([str(capture)], tmp_path / "out", spark)
    assert result.problems == []
    at_end = lag_at_end(result.tables["consumer_lag"])
    assert {(r["group_id"], r["topic"]): r["lag"] for r in at_end} == live_lag
    assert {(r["group_id"], r["topic"]): r["partitions"] for r in at_end} == live_partitions
    assert live_lag[(stopped, topic)] == behind
    # The stopped group's lag over the run: none before it committed; behind by what was left, then by more.
    lags = [r["lag"] for r in result.tables["consumer_lag"] if r["group_id"] == stopped]
    assert lags and lags == sorted(lags) and lags[-1] == behind

    clients = {r["client_id"]: r for r in result.tables["top_clients"]}
    offline_bytes = {(c, direction): r[f"{column}_bytes"] for c, r in clients.items()
                     for direction, column in (("produce", "produced"), ("fetch", "fetched")) if r[f"{column}_bytes"]}
    assert offline_bytes == live_bytes
    totals = [r["bytes"] for r in result.tables["top_clients"]]
    assert totals == sorted(totals, reverse=True)
    assert all(r["bytes"] == r["request_bytes"] + r["response_bytes"] for r in result.tables["top_clients"])
    requests: dict[str, float] = {}
    for key, n in metrics["kproxy_client_requests"].items():
        requests[dict(key)["client_id"]] = requests.get(dict(key)["client_id"], 0) + n
    assert {c: r["requests"] for c, r in clients.items() if c in requests} == requests

    report = tmp_path / "out" / "report.html"
    write_html(result, str(report))
    assert (tmp_path / "out" / "plots" / "consumer_lag.png").read_bytes().startswith(b"\x89PNG")
    assert f"<td>{stopped}</td><td>{topic}</td><td>{behind}</td>" in report.read_text()


def test_the_lag_of_a_minute_is_what_was_answered_by_its_end(spark: Any, tmp_path: Path) -> None:
    """Minutes by when answers reached their clients (a Fetch asked at 0:59.9 and answered at 1:00.2 is
    minute 1's), the last watermark answered in a minute its value whatever the files' order, Produce
    answers' end offsets counted, a minute with no offset answered left without a row."""
    from kproxy.analysis.job import run_analysis
    from kproxy.capture.writer import CaptureWriter
    from tests.support.capture import record

    m0 = 1_790_000_040_000_000  # 2026-09-21T14:14:00Z
    second = 1_000_000
    made: list[dict[str, Any]] = []

    def add(asked: float, answered: float | None, api_key: int, api_name: str,
            *items: tuple[str | None, str, int, int | None, int | None]) -> None:
        made.append(record(len(made), at_us=m0 + int(asked * second), api_key=api_key, api_name=api_name,
                           response_time=None if answered is None else m0 + int(answered * second),
                           partitions=[{"topic": t, "partition": p, "error_code": 0, "record_count": 0,
                                        "record_bytes": 0, "group_id": g, "committed_offset": c,
                                        "high_watermark": w} for g, t, p, c, w in items]))

    fetch, commit, produce = (1, "Fetch"), (8, "OffsetCommit"), (0, "Produce")
    add(10, 10.1, *fetch, (None, "t", 0, None, 100), (None, "t", 1, None, 50))
    add(20, 20.01, *commit, ("g", "t", 0, 40, None))
    add(21, 21.01, *commit, ("g2", "t", 0, 90, None))
    add(59.9, 60.2, *fetch, (None, "t", 0, None, 130))  # minute 1's
    add(69, 70, *fetch, (None, "t", 0, None, 140))  # the last answered in minute 1 ...
    add(64, 65, *fetch, (None, "t", 0, None, 135))  # ... though written before this one
    add(61, 61.01, *commit, ("g", "t", 1, 20, None))
    add(185, 185.02, *produce, (None, "t", 0, None, 200))  # minute 3: a Produce answer's log end offset
    add(186, None, *produce, (None, "t", 0, None, None))  # acks=0: no answer, no offset
    writer = CaptureWriter(tmp_path / "capture", max_bytes_total=10**9, rotate_bytes=10**8,
                           rotate_seconds=3600).start()
    for r in made:
        assert writer.offer(r)
    writer.close()
    result = run_analysis([str(tmp_path / "capture")], tmp_path / "out", spark, interval=60)
    # (a row's time is its minute's end: the minute answered is the one before)
    got = [(r["time"].minute - 15, r["group_id"], r["topic"], r["lag"], r["partitions"])
           for r in result.tables["consumer_lag"]]
    assert got == [(0, "g", "t", 60, 1), (0, "g2", "t", 10, 1),
                   (1, "g", "t", 100 + 30, 2), (1, "g2", "t", 50, 1),
                   (3, "g", "t", 160 + 30, 2), (3, "g2", "t", 110, 1)]


# -- the roll-up and the plot, without Spark ------------------------------------------------------------
T0 = datetime(2026, 11, 28, 14, 0)


def _offsets(rows: list[tuple[int, str | None, str, int, int | None]]) -> Any:
    """The partitions pass's offsets rows: (minute from T0, group, topic, partition, offset: the group's
    committed offset, or without a group the partition's watermark)."""
    return pa.table({"answered": pa.array([T0 + timedelta(minutes=r[0]) for r in rows], pa.timestamp("us", "UTC")),
                     "group_id": [r[1] for r in rows], "topic": [r[2] for r in rows],
                     "partition": pa.array([r[3] for r in rows], pa.int32()),
                     "offset": pa.array([r[4] for r in rows], pa.int64())})


def test_the_lag_roll_up_replays_the_minutes_as_the_live_tracker_would() -> None:
    from kproxy.analysis.capture_lag import consumer_lag

    got = consumer_lag(_offsets([
        (0, None, "t", 0, 10),  # a watermark, nobody committed yet: no lag
        (1, "g", "t", 0, 4),  # g commits 4 on t-0: 10 - 4
        (1, "g", "t", 1, 7),  # and on t-1, whose end is not known yet: left out
        (1, "h", "t", 0, 12),  # h committed past the end last seen: 0, never below
        (2, "g", "t", 1, None),  # (a group's entry with no offset answered: nothing)
        (3, None, "t", 1, 9),  # t-1's end: g's lag there counts now
        (3, None, "u", 0, 50),  # a partition no group committed on
        (4, None, "t", 0, 20),  # t-0 grows: both groups that committed there
        (4, "h", "t", 0, 15),
        (5, None, "t", 0, None),  # a minute with nothing answered (a Produce with acks=0's entry)
    ])).to_pylist()
    # (a row's time is its minute's end: the minute answered is the one before)
    rows = [(int((r["time"].replace(tzinfo=None) - T0).total_seconds() // 60) - 1, r["group_id"], r["topic"],
             r["lag"], r["partitions"]) for r in got]
    assert rows == [(1, "g", "t", 6, 1), (1, "h", "t", 0, 1),
                    (3, "g", "t", 6 + 2, 2), (3, "h", "t", 0, 1),
                    (4, "g", "t", 16 + 2, 2), (4, "h", "t", 5, 1)]
    assert consumer_lag(_offsets([])).num_rows == 0


def test_the_lag_plot_draws_the_groups_furthest_behind_and_says_how_many_it_left_out(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    from kproxy.analysis.plots import MAX_SERIES, figures, plots
    from kproxy.protocol.codes import error_class

    groups = MAX_SERIES + 3
    rows = [{"time": T0 + timedelta(minutes=m), "group_id": f"group-{g}", "topic": topic,
             "lag": (g + 1) * 1000 * (m + 1), "partitions": 1}
            for m in range(30) for g in range(groups) for topic in ("orders", "payments")]
    fig = figures({"consumer_lag": rows}, error_class, (T0 + timedelta(seconds=20), T0 + timedelta(minutes=29)))[
        "consumer_lag"]
    try:
        ax = fig.axes[0]
        drawn = [line.get_label() for line in ax.get_lines()]
        assert drawn == [f"group-{g}" for g in range(groups - 1, groups - 1 - MAX_SERIES, -1)]
        top = ax.get_lines()[0]
        assert list(top.get_ydata())[-1] == 2 * groups * 1000 * 30  # summed over the group's two topics
        legend = ax.get_legend()
        assert legend is not None and "3 more groups not shown" in legend.get_title().get_text()
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert labels and all(len(t) == 5 and t[2] == ":" for t in labels), labels  # HH:MM
        assert ax.get_xlabel() == "UTC, 2026-11-28 (a point per 1 min)"
    finally:
        plt.close(fig)
    png = plots({"consumer_lag": rows}, error_class)["consumer_lag"]
    assert png.startswith(b"\x89PNG")
    (tmp_path / "consumer_lag.png").write_bytes(png)


@pytest.mark.parametrize(("bins", "interval"), [(1, 1), (2, 1), (3, 1), (30, 1), (1, 60), (2, 60), (5, 60)])
def test_a_short_capture_gets_one_tick_label_per_time_not_several_between_bins(bins: int, interval: int) -> None:
    """A capture of a second or two (or of two minutes, in minute bins): matplotlib asked for three
    ticks puts them between the bins, and the labels, at the bins' resolution, repeat."""
    import matplotlib.pyplot as plt

    from kproxy.analysis.plots import figures
    from kproxy.protocol.codes import error_class

    step = timedelta(seconds=interval)
    rows = [{"time": T0 + k * step, "group_id": "g", "topic": "orders", "lag": k, "partitions": 1}
            for k in range(bins)]
    fig = figures({"consumer_lag": rows}, error_class, (T0, T0 + bins * step - timedelta(milliseconds=1)),
                  interval)["consumer_lag"]
    try:
        ax = fig.axes[0]
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert len(labels) >= 2 and len(set(labels)) == len(labels), labels
    finally:
        plt.close(fig)


def test_the_lag_plot_of_groups_that_never_fell_behind_has_whole_record_ticks() -> None:
    """Every lag 0 (a consumer keeping up): the axis still counts whole records, 0 at the bottom,
    not fractions of one (matplotlib's own range around 0 is +-0.055)."""
    import matplotlib.pyplot as plt

    from kproxy.analysis.plots import figures
    from kproxy.protocol.codes import error_class

    rows = [{"time": T0 + timedelta(minutes=m), "group_id": "keeping-up", "topic": "orders", "lag": 0,
             "partitions": 4} for m in range(3)]
    fig = figures({"consumer_lag": rows}, error_class, None)["consumer_lag"]
    try:
        ax = fig.axes[0]
        fig.canvas.draw()
        ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
        assert ticks and ticks[0] == 0 and all(float(t).is_integer() for t in ticks), ticks
        assert ax.get_ylim()[1] >= 1
    finally:
        plt.close(fig)


def test_a_latency_line_breaks_where_no_request_was_measured() -> None:
    """An api answered in seconds 0, 1 and 10 of a capture, none between: the p99 and p50 lines stop
    after second 1 and start again at 10 (a NaN between them), in both panels, instead of drawing
    latencies nobody measured; the error rate's line alike."""
    import math

    import matplotlib.pyplot as plt

    from kproxy.analysis.plots import figures
    from kproxy.protocol.codes import error_class

    step = timedelta(seconds=1)
    bins = [{"time": T0 + k * step, "api_name": "metadata", "requests": 2, "broker_p99_ms": 1.0 + k,
             "broker_p50_ms": 0.5 + k, "kproxy_p99_ms": 0.1 + k, "kproxy_p50_ms": 0.05 + k} for k in (0, 1, 10)]
    errors = [{"time": T0 + k * step, "api_name": "metadata", "code": 3, "requests": 1} for k in (0, 1, 10)]
    found = figures({"latency_over_time": bins, "errors_over_time": errors}, error_class,
                    (T0, T0 + 11 * step - timedelta(milliseconds=1)), 1)
    try:
        lines = [line for ax in found["latency"].axes for line in ax.get_lines()]
        lines += found["error_rate"].axes[0].get_lines()
        assert len(lines) == 5
        for line in lines:
            xs, ys = list(line.get_xdata()), list(line.get_ydata())
            assert [math.isnan(y) for y in ys] == [False, False, True, False], ys
            assert xs[2] == T0 + 2 * step
    finally:
        for fig in found.values():
            plt.close(fig)


def test_a_topic_without_records_in_a_bin_is_drawn_at_zero_there() -> None:
    """A topic produced to in seconds 2 and 10 of a twelve-second capture: its line drops to zero in
    the seconds around and between, not straight from one busy second to the next."""
    import matplotlib.pyplot as plt

    from kproxy.analysis.plots import figures
    from kproxy.protocol.codes import error_class

    step = timedelta(seconds=1)
    rows = [{"time": T0 + k * step, "api_name": "produce", "topic": "orders", "records": 500} for k in (2, 3, 10)]
    fig = figures({"throughput": rows}, error_class, (T0, T0 + 12 * step - timedelta(milliseconds=1)),
                  1)["throughput"]
    try:
        [line] = fig.axes[0].get_lines()
        drawn = [((x - T0).total_seconds(), y) for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)]
        assert drawn == [(1, 0), (2, 500), (3, 500), (4, 0), (9, 0), (10, 500), (11, 0)]
    finally:
        plt.close(fig)


def test_a_latency_axis_of_a_decade_or_so_is_labelled_in_plain_milliseconds() -> None:
    """Broker latencies from 0.3 to 5 ms: matplotlib's own log axis labelled it ``10^0`` alone; the
    axis reads 0.5, 1, 2 and 5 (ms), no power of ten written as one."""
    import matplotlib.pyplot as plt

    from kproxy.analysis.plots import figures
    from kproxy.protocol.codes import error_class

    step = timedelta(seconds=1)
    bins = [{"time": T0 + k * step, "api_name": "produce", "requests": 5, "broker_p99_ms": p99, "broker_p50_ms": 0.3,
             "kproxy_p99_ms": 0.05, "kproxy_p50_ms": 0.01} for k, p99 in enumerate((0.4, 5.0, 2.0))]
    found = figures({"latency_over_time": bins}, error_class, (T0, T0 + 3 * step - timedelta(milliseconds=1)), 1)
    try:
        ax = found["latency"].axes[0]
        found["latency"].canvas.draw()
        low, high = ax.get_ylim()
        labels = {t.get_text() for t in ax.get_yticklabels(minor=False) + ax.get_yticklabels(minor=True)
                  if t.get_text() and low <= t.get_position()[1] <= high}
        assert {"0.5", "1", "2", "5"} <= labels, labels
        assert not any("e" in text or "^" in text for text in labels), labels
    finally:
        for fig in found.values():
            plt.close(fig)
