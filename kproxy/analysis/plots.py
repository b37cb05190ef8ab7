"""The report's plots, as PNG (matplotlib, Agg backend: no display needed).

Each plot is drawn so that it cannot be misread: every time plot spans the same range, the
capture's from the start of its first time bin to the end of its last (a capture of 30 seconds
gets 30 seconds of axis, labelled HH:MM:SS UTC, not years nor minutes), its points one per bin
of the analysis's interval (:mod:`kproxy.analysis.interval`), which the titles and axes name
("per 1 s"); each panel shows one quantity, few enough series that each has its own colour (the
busiest; the rest are said to be left out), legends sit below the axes (never over a line), the
first and last bins are shaded when the capture began or ended within them (their counts cover
part of a bin: a dip there is not a drop in traffic), and error rates leave out the routine codes
of normal protocol flow.

:func:`plots` returns ``{name: PNG bytes}`` for the plots a given analysis has data for. It
classifies error codes with the function it is given (``kproxy.protocol.codes.error_class``,
which the report passes: this module reads nothing of kproxy outside the analysis).
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kproxy.analysis.interval import bin_start, label

MAX_SERIES = 6  # series per panel: each gets its own colour of the default cycle (10)
_TITLES = {
    "latency": "Latency per API over time (ms, per {per}; p99 solid, p50 dashed)",
    "error_rate": "Error rate per API over time (per {per}; routine codes of normal protocol flow left out)",
    "throughput": "Records per {per} per topic, produced and fetched",
    "bytes_by_api": "Bytes per API (requests in, responses out)",
    "consumer_lag": "Consumer lag per group over time (per {per}: records behind at its end, summed over the "
                    "group's topics)",
    "consumer_lag_seconds": "Consumer lag in seconds per group over time (per {per}: how long before its end the "
                            "oldest record not committed was written, the most over the group's topics)",
}


def plot_titles(interval: int) -> dict[str, str]:
    """Each plot's title, its time bins ``interval`` seconds wide."""
    return {name: title.format(per=label(interval)) for name, title in _TITLES.items()}


@dataclass(frozen=True)
class _Window:
    """The range every time plot spans, the bins' width, and the capture's span (None: unknown)."""

    start: datetime
    end: datetime
    interval: int
    span: tuple[datetime, datetime] | None


def plots(tables: dict[str, list[dict[str, Any]]], error_class: Callable[[int], str],
          span: tuple[datetime, datetime] | None = None, interval: int = 60) -> dict[str, bytes]:
    """Every plot the tables have data for, as PNG bytes, in the report's order; ``error_class``
    names a code's class: ``routine``, ``retriable`` or ``error``; ``span``: the capture's first
    and last request times (naive UTC, as the tables' times), the range of every time plot and
    where partial bins are shaded (None: the tables' times); ``interval``: the tables' bin width,
    seconds."""
    return {name: _png(fig) for name, fig in figures(tables, error_class, span, interval).items()}


def figures(tables: dict[str, list[dict[str, Any]]], error_class: Callable[[int], str],
            span: tuple[datetime, datetime] | None = None, interval: int = 60) -> dict[str, Any]:
    """:func:`plots`' matplotlib figures, before they are rendered (the caller closes them)."""
    out: dict[str, Any] = {}
    window = _window(tables, span, interval)
    bins = tables.get("latency_over_time", [])
    if bins and window is not None:
        out["latency"] = _latency(bins, window)
        out["error_rate"] = _error_rate(bins, tables.get("errors_over_time", []), error_class, window)
    if tables.get("throughput") and window is not None:
        out["throughput"] = _throughput(tables["throughput"], window)
    if tables.get("latency_by_api"):
        out["bytes_by_api"] = _bytes_by_api(tables["latency_by_api"])
    if tables.get("consumer_lag") and window is not None:
        out["consumer_lag"] = _consumer_lag(tables["consumer_lag"], window)
        # (drawn when a write time is known: a group behind with a lag in seconds)
        if any(r["lag"] and r.get("lag_seconds") is not None for r in tables["consumer_lag"]):
            out["consumer_lag_seconds"] = _consumer_lag_seconds(tables["consumer_lag"], window)
    return out


_SERIES = (("latency_over_time", 0), ("errors_over_time", 0), ("throughput", 0), ("consumer_lag", 1))


def _window(tables: dict[str, list[dict[str, Any]]], span: tuple[datetime, datetime] | None,
            interval: int) -> _Window | None:
    """From the start of the capture's first bin to the end of its last: from ``span`` when given,
    else from the tables' times (a bin's start; consumer lag's its end). None without either."""
    step = timedelta(seconds=interval)
    if span is not None:
        return _Window(bin_start(span[0], interval), bin_start(span[1], interval) + step, interval, span)
    starts = [r["time"] - step * ends for name, ends in _SERIES for r in tables.get(name, [])]
    if not starts:
        return None
    return _Window(min(starts), max(starts) + step, interval, None)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


def _time_axis(ax: Any, window: _Window) -> None:
    """The window's range (a fiftieth of it to spare each side, for the end points' markers), UTC
    ticks (HH:MM:SS below a minute's bins, HH:MM above), the bins' width in the axis's label.
    Ticks are never finer than a bin: a window of one or two bins gets a tick per bin, where
    asking for three ticks would put them between the bins, labelled alike (a two-second capture:
    11:50:53, 11:50:53, 11:50:54...)."""
    import matplotlib.dates

    mdates: Any = matplotlib.dates  # untyped
    span = window.end - window.start
    pad = span / 50
    ax.set_xlim(window.start - pad, window.end + pad)
    minticks = 3 if span >= timedelta(seconds=3 * window.interval) else 1
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=minticks, maxticks=8))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S" if window.interval < 60 else "%H:%M"))
    first, last = window.start, window.end - timedelta(microseconds=1)
    ax.set_xlabel(f"UTC, {first:%Y-%m-%d}" + ("" if first.date() == last.date() else f" .. {last:%Y-%m-%d}")
                  + f" (a point per {label(window.interval)})")
    ax.grid(True, alpha=0.3)


def _partial_bins(ax: Any, window: _Window) -> None:
    """Shade the first and last bins when the capture began or ended within them (the last always:
    a capture ends within its last bin, unknown to it where)."""
    if window.span is None:
        return
    first, last = window.span
    step = timedelta(seconds=window.interval)
    shown = False
    for start, partial in ((window.start, first != window.start), (bin_start(last, window.interval), True)):
        if partial:
            ax.axvspan(start, start + step, color="0.85", zorder=0,
                       label=None if shown else f"partial {label(window.interval)} (capture began or ended in it)")
            shown = True


def _dots(points: int) -> dict[str, Any]:
    """A marker per point while the points stay apart (a few dozen across a plot), none beyond."""
    return {"marker": "o", "ms": 3} if points <= 60 else {}


def _broken_at_gaps(xs: list[datetime], ys: list[Any], interval: int) -> tuple[list[datetime], list[Any]]:
    """The points with a NaN after each one whose next point is more than a bin later: matplotlib
    breaks the line there. A latency or an error rate is measured only in bins with requests; a
    line drawn through the bins between would show values nobody measured."""
    step = timedelta(seconds=interval)
    out_x: list[datetime] = []
    out_y: list[Any] = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if i and x - xs[i - 1] > step:
            out_x.append(xs[i - 1] + step)
            out_y.append(math.nan)
        out_x.append(x)
        out_y.append(y)
    return out_x, out_y


def _zero_filled(points: list[tuple[datetime, float]], window: _Window) -> list[tuple[datetime, float]]:
    """A count per bin with the bins between two points, and those around them within ``window``,
    at zero where no row was: a topic without records in a bin had none, and a line drawn straight
    from one busy bin to the next would show records that never came. One zero each side of a gap is
    enough for the line to drop and rise."""
    step = timedelta(seconds=window.interval)
    out: list[tuple[datetime, float]] = []
    for i, (t, n) in enumerate(points):
        before = points[i - 1][0] if i else window.start - step
        if t - before > step:
            if i:
                out.append((before + step, 0))
            if t - before > 2 * step or not i:
                out.append((t - step, 0))
        out.append((t, n))
    if points and points[-1][0] + step < window.end:
        out.append((points[-1][0] + step, 0))
    return out


def _legend_below(ax: Any, title: str | None = None, left: int = 0, what: str = "") -> None:
    """The axes' legend under it, off the lines; ``left`` series left out are said in its title."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    if left:
        title = f"{title + ': ' if title else ''}{left} more {what} not shown"
    ax.legend(handles, labels, fontsize="small", title=title, title_fontsize="small", loc="upper center",
              bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)


def _busiest(totals: dict[str, float], n: int = MAX_SERIES) -> tuple[list[str], int]:
    """The ``n`` keys with the largest totals, and how many were left out."""
    ranked = sorted(totals, key=lambda k: (-totals[k], k))
    return ranked[:n], max(0, len(ranked) - n)


def _latency(rows: Sequence[dict[str, Any]], window: _Window) -> Any:
    plt = _pyplot()
    requests: dict[str, float] = defaultdict(float)
    for r in rows:
        requests[r["api_name"]] += r["requests"]
    apis, left = _busiest(requests)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), sharex=True)
    for ax, who in zip(axes, ("broker", "kproxy"), strict=True):
        for i, api in enumerate(apis):
            colour = f"C{i}"
            mine = sorted((r for r in rows if r["api_name"] == api and r[f"{who}_p99_ms"] is not None),
                          key=lambda r: r["time"])
            if not mine:
                continue
            xs = [r["time"] for r in mine]
            dots = _dots(len(xs))
            ax.plot(*_broken_at_gaps(xs, [r[f"{who}_p99_ms"] for r in mine], window.interval), color=colour,
                    label=api, **dots)
            ax.plot(*_broken_at_gaps(xs, [r[f"{who}_p50_ms"] for r in mine], window.interval), linestyle="--",
                    color=colour, alpha=0.7)
        ax.set_title("broker (forwarded -> answered)" if who == "broker" else "kproxy's own time")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        _log_ms_ticks(ax)
        _time_axis(ax, window)
        _partial_bins(ax, window)
    _legend_below(axes[0], "api: p99 (dashed: p50)", left, "apis")  # the same apis and colours in both
    return fig


def _error_rate(bins: Sequence[dict[str, Any]], errors: Sequence[dict[str, Any]],
                error_class: Callable[[int], str], window: _Window) -> Any:
    plt = _pyplot()
    requests = {(r["time"], r["api_name"]): r["requests"] for r in bins}
    failed: dict[tuple[Any, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in errors:
        failed[(r["time"], r["api_name"])][error_class(r["code"])] += r["requests"]
    totals: dict[str, float] = defaultdict(float)
    for (_, api), by_class in failed.items():
        totals[api] += by_class.get("retriable", 0) + by_class.get("error", 0)
    apis, left = _busiest({api: n for api, n in totals.items() if n})
    fig, ax = plt.subplots(figsize=(13, 4))
    for i, api in enumerate(apis):
        points = sorted((t, n) for (t, name), n in requests.items() if name == api)
        xs = [m for m, _ in points]
        for cls, style in (("error", "-"), ("retriable", ":")):
            ys = [100.0 * failed.get((m, api), {}).get(cls, 0) / n for m, n in points]
            if any(ys):
                ax.plot(*_broken_at_gaps(xs, ys, window.interval), linestyle=style, color=f"C{i}",
                        label=f"{api} ({cls})", **_dots(len(xs)))
    if not apis:
        ax.text(0.5, 0.5, "no errors but routine ones", transform=ax.transAxes, ha="center", va="center")
    ax.set_ylabel("% of the api's requests")
    ax.set_ylim(bottom=0)
    _time_axis(ax, window)
    _partial_bins(ax, window)
    _legend_below(ax, None, left, "apis with errors")
    return fig


def _throughput(rows: Sequence[dict[str, Any]], window: _Window) -> Any:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), sharex=True)
    for ax, api in zip(axes, ("produce", "fetch"), strict=True):
        mine = [r for r in rows if r["api_name"] == api]
        totals: dict[str, float] = defaultdict(float)
        for r in mine:
            totals[r["topic"]] += r["records"] or 0
        topics, left = _busiest(totals)
        for i, topic in enumerate(topics):
            points = _zero_filled(sorted((r["time"], r["records"] or 0) for r in mine if r["topic"] == topic), window)
            ax.plot([m for m, _ in points], [n for _, n in points], color=f"C{i}", label=topic, **_dots(len(points)))
        ax.set_title("produced" if api == "produce" else "fetched")
        ax.set_ylabel(f"records per {label(window.interval)}")
        ax.set_ylim(bottom=0)
        _time_axis(ax, window)
        _partial_bins(ax, window)
        if not topics:
            ax.text(0.5, 0.5, f"no {api} records", transform=ax.transAxes, ha="center", va="center")
        _legend_below(ax, "topic", left, "topics")
    return fig


def _consumer_lag(rows: Sequence[dict[str, Any]], window: _Window) -> Any:
    """A line per group, its lag summed over its topics, each value at its row's time (the end of its
    bin) and drawn as steps (it holds until the next bin with a row: :mod:`kproxy.analysis.capture_lag`); the
    groups that fell furthest behind, the rest counted. A state, not a count: no bin is partial."""
    plt = _pyplot()
    per_group: dict[str, dict[Any, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        per_group[r["group_id"]][r["time"]] += r["lag"]
    groups, left = _busiest({g: max(lags.values()) for g, lags in per_group.items()})
    fig, ax = plt.subplots(figsize=(13, 4.2))
    for i, group in enumerate(groups):
        points = sorted(per_group[group].items())
        ax.plot([m for m, _ in points], [n for _, n in points], drawstyle="steps-post", color=f"C{i}", label=group,
                clip_on=False, **_dots(len(points)))  # (unclipped: a group at 0 shows its whole dots on the axis)
    ax.set_ylabel(f"records behind (end of each {label(window.interval)} bin)")
    # At least one record high: a group that never fell behind would get matplotlib's +-0.055 around 0,
    # which has no whole number but 0 in it, and the integer locator would fall back to fractions.
    ax.set_ylim(0, max(ax.get_ylim()[1], 1))
    ax.yaxis.set_major_locator(_integer_locator())
    ax.yaxis.set_major_formatter(_count_formatter())
    _time_axis(ax, window)
    _legend_below(ax, "group (furthest behind first)", left, "groups")
    return fig


def _consumer_lag_seconds(rows: Sequence[dict[str, Any]], window: _Window) -> Any:
    """A line per group, its lag in seconds (the most over its topics), each value at its row's time
    (the end of its bin); rows without one (no write time known) left out; the groups furthest
    behind, the rest counted."""
    plt = _pyplot()
    per_group: dict[str, dict[Any, float]] = defaultdict(dict)
    for r in rows:
        late = r.get("lag_seconds")
        if late is not None:
            at = per_group[r["group_id"]]
            at[r["time"]] = max(at.get(r["time"], 0.0), late)
    groups, left = _busiest({g: max(lags.values()) for g, lags in per_group.items()})
    fig, ax = plt.subplots(figsize=(13, 4.2))
    for i, group in enumerate(groups):
        points = sorted(per_group[group].items())
        ax.plot([m for m, _ in points], [s for _, s in points], color=f"C{i}", label=group, clip_on=False,
                **_dots(len(points)))
    ax.set_ylabel(f"seconds behind (end of each {label(window.interval)} bin)")
    ax.set_ylim(0, max(ax.get_ylim()[1], 1.0))
    _time_axis(ax, window)
    _legend_below(ax, "group (furthest behind first)", left, "groups")
    return fig


def _integer_locator() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _bytes_by_api(rows: Sequence[dict[str, Any]]) -> Any:
    plt = _pyplot()
    ranked = sorted(rows, key=lambda r: -(r["request_bytes"] + r["response_bytes"]))[:12]
    ranked.reverse()  # largest at the top of a horizontal bar chart
    fig, ax = plt.subplots(figsize=(13, 0.45 * len(ranked) + 1.2))
    ys = range(len(ranked))
    requests = [r["request_bytes"] for r in ranked]
    ax.barh(ys, requests, color="C0", label="requests (client -> broker)")
    ax.barh(ys, [r["response_bytes"] for r in ranked], left=requests, color="C1",
            label="responses (broker -> client)")
    ax.set_yticks(list(ys), [r["api_name"] for r in ranked])
    ax.set_xlabel("bytes (frames, size prefix included)")
    ax.xaxis.set_major_formatter(_bytes_formatter())
    _legend_below(ax)
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def _bytes_formatter() -> Any:
    """Ticks in decimal units of bytes: ``12 B``, ``1.5 MB``."""
    return _scaled_formatter(" ", "B")


def _log_ms_ticks(ax: Any) -> None:
    """Plain numbers on a log axis of milliseconds (``0.3``, ``1``, ``20``), and between the powers
    of ten the 2s and 5s labelled too while the axis spans two decades or less (the 3s too within
    one): matplotlib's own labels stop at the powers of ten once it spans more than one, so a
    latency axis from 0.3 to 5 ms showed one label, ``10^0``."""
    from matplotlib.ticker import FuncFormatter

    def minor(value: float, _pos: int) -> str:
        low, high = ax.get_ylim()
        if value <= 0 or low <= 0:
            return ""
        decades = math.log10(high / low)
        digit = round(value / 10 ** math.floor(math.log10(value) + 1e-9))
        shown = (2, 3, 5) if decades <= 1 else (2, 5) if decades <= 2 else ()
        return f"{value:g}" if digit in shown else ""

    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(minor))


def _count_formatter() -> Any:
    """Ticks of counts in decimal units: ``12``, ``1.5M``."""
    return _scaled_formatter("", "")


def _scaled_formatter(space: str, unit: str) -> Any:
    """Ticks in the largest of k, M, G a value reaches, ``space`` before the prefix and ``unit`` after it."""
    from matplotlib.ticker import FuncFormatter

    def fmt(value: float, _pos: int) -> str:
        for prefix, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if abs(value) >= size:
                return f"{value / size:g}{space}{prefix}{unit}"
        return f"{value:g}{space}{unit}".rstrip()

    return FuncFormatter(fmt)
