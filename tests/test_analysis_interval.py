"""The report's time series fit the capture: their bin width comes from its span, every time plot
spans the same range, and the width is named.

A 27-second capture used to be drawn as one or two per-minute dots per plot, each plot over its own
range, the consumer lag's dot a minute after its table's time; a capture of hours stays per minute."""

from __future__ import annotations

import io
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kproxy.analysis.interval import WIDTHS, auto_interval, bin_start, check, label

pa = pytest.importorskip("pyarrow")

SECOND_US = 1_000_000


def test_the_interval_fits_the_span() -> None:
    assert auto_interval(27) == 1  # the capture: 28 points
    assert auto_interval(0) == 1  # one record
    assert auto_interval(199.9) == 1 and auto_interval(200) == 2  # at most 200 bins, whatever the ends
    assert auto_interval(3 * 3600) == 60  # hours: per minute
    assert auto_interval(86_400) == 600
    assert auto_interval(30 * 86_400) == 21_600
    assert auto_interval(1000 * 86_400) == 6 * 86_400  # beyond a day: whole days (5 would touch 201 bins)
    for span in (0, 1, 59, 61, 3599, 3601, 86_399, 86_401, 10**7):
        width = auto_interval(span)
        assert (span // width) + 1 <= 200, span  # bins the span can touch
        narrower = [w for w in WIDTHS if w < width]
        assert not narrower or (span // narrower[-1]) + 1 > 200, span  # and the narrowest such
    assert [label(s) for s in (1, 30, 60, 120, 900, 3600, 10_800, 86_400, 172_800)] == [
        "1 s", "30 s", "1 min", "2 min", "15 min", "1 h", "3 h", "1 d", "2 d"]
    assert bin_start(datetime(2026, 11, 29, 3, 58, 41, 900_000), 15) == datetime(2026, 11, 29, 3, 58, 30)
    assert bin_start(datetime(2026, 11, 29, 3, 58, 41, tzinfo=UTC), 600) == datetime(2026, 11, 29, 3, 50, tzinfo=UTC)
    assert check(300) == 300 and check(172_800) == 172_800
    with pytest.raises(ValueError, match="interval 7 s: expected one of 1, 2, 5"):
        check(7)


def _capture(directory: Path, start: datetime, seconds: float, per_second: float) -> Path:
    """Produce, Fetch and two groups' commits on topic t, ``per_second`` requests a second over ``seconds``;
    broker latency rising and falling, every 13th Produce NOT_LEADER_OR_FOLLOWER."""
    from kproxy.capture.writer import CaptureWriter
    from tests.support.capture import record

    writer = CaptureWriter(directory, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600).start()
    t0 = int(start.replace(tzinfo=UTC).timestamp()) * SECOND_US
    end = 0
    for i in range(int(seconds * per_second)):
        at = t0 + int(i / per_second * SECOND_US)
        kind = i % 4
        if kind < 2:
            failed = kind == 0 and i % 52 == 0
            end += 10 * (kind == 0 and not failed)
            item = {"topic": "t", "partition": 0, "error_code": 6 if failed else 0, "record_count": 10,
                    "record_bytes": 1000, "group_id": None, "committed_offset": None,
                    "high_watermark": None if failed else end}
            latency = 6 + 5 * math.sin(i / per_second / seconds * 2 * math.pi) + i % 7
            made = record(i, at_us=at, api_key=kind, api_name=("Produce", "Fetch")[kind], response_time=at + 2000,
                          broker_latency_ms=latency, partitions=[item], record_count=10, record_bytes=1000)
        else:
            group = ("fast", "slow")[kind - 2]
            item = {"topic": "t", "partition": 0, "error_code": 0, "record_count": 0, "record_bytes": 0,
                    "group_id": group, "committed_offset": end if group == "fast" else end // 2,
                    "high_watermark": None}
            made = record(i, at_us=at, api_key=8, api_name="OffsetCommit", response_time=at + 1000, partitions=[item])
        assert writer.offer(made)
    writer.close()
    return directory


def test_a_short_capture_is_drawn_per_second_over_its_own_span(spark: Any, tmp_path: Path) -> None:
    """27 seconds from 03:58:41: per-second bins in every time-keyed table; every time plot spans
    03:58:41 to 03:59:08, HH:MM:SS ticks, "per 1 s" in its title and axis; the consumer lag drawn
    where its table puts it (a row's time: the end of its second)."""
    import matplotlib.pyplot as plt

    from kproxy.analysis.job import run_analysis
    from kproxy.analysis.plots import figures, plot_titles, plots
    from kproxy.analysis.report import lag_at_end, summary, write_html
    from kproxy.protocol.codes import error_class

    start = datetime(2026, 11, 29, 3, 58, 41)
    got = run_analysis([str(_capture(tmp_path / "capture", start, 27, 20))], tmp_path / "out", spark)
    assert got.interval == 1
    for name in ("latency_over_time", "errors_over_time", "throughput", "connection_churn", "consumer_lag"):
        assert {r["interval_s"] for r in got.tables[name]} <= {1}, name
    seconds = sorted({r["time"] for r in got.tables["latency_over_time"]})
    assert seconds == [start + timedelta(seconds=s) for s in range(27)]
    assert sorted({r["time"] for r in got.tables["throughput"]}) == seconds
    last_lag = lag_at_end(got.tables["consumer_lag"])
    assert [(r["group_id"], r["time"]) for r in last_lag] == [("slow", start + timedelta(seconds=27)),
                                                               ("fast", start + timedelta(seconds=27))]

    span = (got.first, got.last)
    drawn = figures(got.tables, error_class, span, got.interval)
    try:
        assert set(drawn) == {"latency", "error_rate", "throughput", "bytes_by_api", "consumer_lag"}
        timed = [ax for name, fig in drawn.items() if name != "bytes_by_api" for ax in fig.axes]
        ranges = {tuple(round(x, 9) for x in ax.get_xlim()) for ax in timed}
        assert len(ranges) == 1, ranges  # one range for every time plot
        import matplotlib.dates as mdates

        low, high = (mdates.num2date(x).replace(tzinfo=None) for x in ranges.pop())
        assert low <= start < start + timedelta(seconds=27) <= high and high - low < timedelta(seconds=30)
        for ax in timed:
            assert ax.get_xlabel() == "UTC, 2026-11-29 (a point per 1 s)"
            ax.figure.canvas.draw()
            ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
            assert len(ticks) >= 3 and all(len(t) == 8 and t.count(":") == 2 for t in ticks), ticks  # HH:MM:SS
        lag = drawn["consumer_lag"].axes[0]
        for line in lag.get_lines():
            row = next(r for r in last_lag if r["group_id"] == line.get_label())
            assert line.get_xdata()[-1] == row["time"]  # (the datetimes drawn, as given)
            assert line.get_ydata()[-1] == row["lag"]
    finally:
        for fig in drawn.values():
            plt.close(fig)
    titles = plot_titles(got.interval)
    assert all("per 1 s" in titles[name] for name in ("latency", "error_rate", "throughput", "consumer_lag"))
    assert all(png.startswith(b"\x89PNG") for png in plots(got.tables, error_class, span, got.interval).values())
    out = io.StringIO()
    summary(got, out)
    assert "UTC; time series per 1 s" in out.getvalue()
    write_html(got, str(tmp_path / "out" / "report.html"))
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Time series per 1 s" in html and "Connection churn per 1 s" in html and "Records per 1 s" in html


def test_a_capture_of_hours_is_per_minute_and_the_histograms_follow(spark: Any, tmp_path: Path) -> None:
    """Three hours: a point per minute, minutes whole; above the exact limit the latency histograms are
    binned the same way; the span comes from the files' footers, or from Spark when they do not say."""
    from kproxy.analysis.inputs import Inputs, find_inputs
    from kproxy.analysis.job import read_captures, run_analysis, time_span

    start = datetime(2026, 11, 29, 1, 7, 13)
    capture = _capture(tmp_path / "capture", start, 3 * 3600, 0.05)
    exact = run_analysis([str(capture)], tmp_path / "exact", spark)
    approx = run_analysis([str(capture)], tmp_path / "approx", spark, exact_percentiles_max=10)
    assert exact.interval == approx.interval == 60 and not approx.exact_percentiles
    bins = [(r["time"], r["api_name"], r["requests"]) for r in exact.tables["latency_over_time"]]
    assert bins == [(r["time"], r["api_name"], r["requests"]) for r in approx.tables["latency_over_time"]]
    assert all(t.second == 0 and t.microsecond == 0 for t, _, _ in bins)
    assert len({t for t, _, _ in bins}) == 180  # 01:07 .. 04:06, every minute with a request

    inputs = find_inputs([str(capture)])
    by_footer = time_span(None, inputs)  # type: ignore[arg-type]  # (no Spark job: the footers tell)
    assert by_footer == pytest.approx(3 * 3600 - 20)
    unknown = Inputs(files=inputs.files, rows=inputs.rows)  # footers' spans not read: Spark reads the column
    df = read_captures(spark, unknown)
    assert df is not None and time_span(df, unknown) == pytest.approx(by_footer)


def test_an_interval_that_does_not_divide_a_day_is_refused_before_spark_starts(tmp_path: Path) -> None:
    from kproxy.analysis.main import analyze

    err = io.StringIO()
    assert analyze([str(tmp_path)], master="local[1]", out=str(tmp_path / "out"), stdout=io.StringIO(), stderr=err,
                   interval=7) == 2
    assert err.getvalue().startswith("kproxy analyze: --interval: interval 7 s: expected one of 1, 2, 5, 10")
