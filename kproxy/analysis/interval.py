"""The interval of the report's time series: one width of time bin for a whole analysis.

A capture of 30 seconds and one of a day are both read as series over time, and no one width of
bin serves both: per minute, the first is one or two points, per second the second is 86,400 (and
the tables behind them as many rows per api, per topic, per latency bucket). The width is chosen
from the capture's span, as a dashboard chooses its auto interval: the narrowest of
:data:`WIDTHS` that gives at most :data:`MAX_POINTS` bins over the span, a second at the least.
Every width of :data:`WIDTHS` divides a day, so bins begin on whole seconds, minutes or hours of
UTC (a bin is ``[t, t + width)``, ``t`` a multiple of the width since the Unix epoch).

Pure Python (no Spark, no matplotlib): the job, its tables, the report and the plots all read it.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

# The widths a bin may have, in seconds: whole seconds, minutes, hours, each dividing a day.
WIDTHS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_POINTS = 200  # bins over a capture's span, at most (a plot's points; the time-keyed tables' rows per key)
DAY = 86_400


def auto_interval(span_seconds: float, max_points: int = MAX_POINTS) -> int:
    """The narrowest width of :data:`WIDTHS` (seconds) giving at most ``max_points`` bins over a span
    of ``span_seconds``; beyond :data:`WIDTHS`, whole days. A span of 0 (one record) gets a second."""
    if span_seconds < 0 or max_points < 1:
        raise ValueError(f"span {span_seconds} s, {max_points} points: expected a span >= 0 and points >= 1")
    for width in WIDTHS:
        if _bins(span_seconds, width) <= max_points:
            return width
    days = max(1, math.ceil(span_seconds / DAY / max_points))
    while _bins(span_seconds, days * DAY) > max_points:
        days += 1
    return days * DAY


def _bins(span_seconds: float, width: int) -> int:
    """The most bins of ``width`` a span can touch (its ends anywhere within their bins)."""
    return math.floor(span_seconds / width) + 1


def label(seconds: int) -> str:
    """``1 s``, ``30 s``, ``1 min``, ``15 min``, ``1 h``, ``1 d``: how the report names a width."""
    for unit, size in (("d", DAY), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def bin_start(t: datetime, seconds: int) -> datetime:
    """The start of the bin of width ``seconds`` holding ``t`` (naive UTC or aware, kept as given)."""
    epoch = datetime(1970, 1, 1, tzinfo=t.tzinfo)
    step = timedelta(seconds=seconds)
    return epoch + ((t - epoch) // step) * step


def check(seconds: int) -> int:
    """``seconds`` if it is a width of :data:`WIDTHS` or whole days; else ValueError saying which are."""
    if seconds in WIDTHS or (seconds > 0 and seconds % DAY == 0):
        return seconds
    raise ValueError(f"interval {seconds} s: expected one of {', '.join(map(str, WIDTHS))} s or whole days "
                     f"(a width that divides a day, so bins begin on whole seconds, minutes or hours)")
