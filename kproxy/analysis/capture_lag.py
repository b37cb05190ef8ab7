"""Consumer lag over a capture, time bin by time bin, as kproxy's live series compute it (on the driver).

The capture's partition items carry the offsets lag is made of (schema version 3,
:mod:`kproxy.capture.partition_items`, from the same readings as :class:`kproxy.metrics.consumer_lag.ConsumerLag`):
a ``committed_offset`` with its ``group_id`` (an OffsetCommit the answer accepted, an OffsetFetch
answer) and a ``high_watermark`` without one (a Fetch answer's, a ListOffsets answer's latest, a
Produce answer's log end offset). The partitions pass gives, per time bin the answer reached its
client (the analysis's interval: :mod:`kproxy.analysis.interval`), per group (none: a watermark)
and partition, the last of each answered in that bin (:mod:`kproxy.analysis.report_tables`);
:func:`consumer_lag` replays those bins in order.

A group's lag on a partition at the end of a bin is, as ``kproxy_consumergroup_lag``: the
partition's latest watermark known by then less the group's latest committed offset there, never
below 0; a partition with a committed offset and no watermark yet has none. Summed per group and
topic over those partitions, it is ``kproxy_consumergroup_lag_sum``. A row's ``time`` is that
moment, the bin's end: the lag as it stood then.

Two differences with the live series, both about time: live values go stale (a watermark not seen
again, a group no longer seen, within ``metrics.consumer_lag_stale_after``) and disappear, where
offline the last value known stands until the capture ends (a capture is read after the fact: what
was known is known); and live, a Produce answer's end offset lower than the one held is ignored
(concurrent producers' answers arrive in any order), where offline a bin's watermark is the last
answered in it, whatever its source. A bin in which no offset was answered has no row: the lag
stood as the row before says.

Lag in seconds (schema version 4: Produce answers' items date the offsets they gave, as the live
tracker's write-time points do, :mod:`kproxy.metrics.consumer_lag`): the partitions pass gives, per bin and
partition, the offsets its answers dated (lowest first, highest last) and their earliest and
latest max timestamps (:func:`kproxy.analysis.report_tables._write_points`), one point per bin. A group's
``lag_seconds`` on a topic at a bin's end is, as ``kproxy_consumergroup_lag_seconds``, the most
over its partitions of how long before that moment the first offset it has not committed was
written (0 where its lag is 0): that offset's time read off the points known by then, between a
point's earliest and latest time in proportion to where the offset falls in its range, else the
nearest point's (the earlier on a tie). The live tracker keeps at most one point a second per
partition and reads the point's one time, so the two differ by up to the time between the points
the live one kept (about a second), besides the moment each is taken at (a row's is its bin's
end, a scrape's its own). Where no point is known for a partition with lag (a capture older than
version 4, a partition whose producers do not go through kproxy) the row's ``lag_seconds`` is the
most over the partitions that have one, null when none has.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import pyarrow as pa

_Partition = tuple[str, int]  # (topic, partition)
_Key = tuple[str, str, int]  # (group, topic, partition)
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}  # a timestamp unit's steps a second


_UTC_TIME = pa.timestamp("us", tz="UTC")


def lag_schema(time: pa.DataType = _UTC_TIME) -> pa.Schema:
    """``consumer_lag``'s columns; ``time``: the type of the fine table's times."""
    return pa.schema([("time", time), ("interval_s", pa.int32()), ("group_id", pa.string()), ("topic", pa.string()),
                      ("lag", pa.int64()), ("partitions", pa.int64()), ("lag_seconds", pa.float64())])


class WritePoints:
    """A partition's write-time points, in offset order: ``(first, last, earliest ms, latest ms)``
    each, as the bins gave them (see the module docstring)."""

    __slots__ = ("firsts", "points")

    def __init__(self) -> None:
        self.firsts: list[int] = []
        self.points: list[tuple[int, int, int, int]] = []

    def add(self, first: int, last: int, low: int, high: int) -> None:
        """A bin's point, kept unless its offsets are not past the last point's (an answer that came
        late: those offsets are dated already) while not below the first's (below: the log started
        over lower, a topic deleted and made again: the points start over), as the live tracker does."""
        if self.points and first <= self.points[-1][1]:
            if last >= self.firsts[0]:
                return
            self.firsts.clear()
            self.points.clear()
        self.firsts.append(first)
        self.points.append((first, last, low, high))

    def written_at(self, offset: int) -> float:
        """When ``offset`` was written (ms since the epoch): see the module docstring."""
        i = bisect_right(self.firsts, offset) - 1
        if i < 0:
            return float(self.points[0][2])
        first, last, low, high = self.points[i]
        if offset <= last:
            return float(high) if last == first else low + (high - low) * (offset - first) / (last - first)
        if i + 1 < len(self.points) and self.points[i + 1][0] - offset < offset - last:
            return float(self.points[i + 1][2])
        return float(high)


def consumer_lag(offsets: pa.Table, interval: int = 60, written: pa.Table | None = None) -> pa.Table:
    """Per time bin of ``interval`` seconds, group and topic (sorted so): the lag at the bin's end (its
    ``time``), the partitions it sums and the lag in seconds (see the module docstring), from
    ``offsets``: the partitions pass's rows per (``answered``: the start of the bin, ``group_id``,
    ``topic``, ``partition``) with the last ``offset`` answered there: the group's committed offset,
    or without a group the partition's watermark; and ``written``: its write-time points per
    (``answered``, ``topic``, ``partition``): ``first``, ``last``, ``stamp_low``, ``stamp_high``
    (None: none known, every ``lag_seconds`` null).
    Cost: one step per offset row and per (group, topic) per bin, plus, per watermark, one per group
    committed on its partition; per bin, a search of its partition's points per partition with lag."""
    time_type = offsets.schema.field("answered").type
    columns = [offsets.column(c).to_pylist() for c in ("group_id", "topic", "partition", "offset")]
    # (times as integers: no datetime per row; the output casts them back)
    bins = offsets.column("answered").cast(pa.int64()).to_pylist()
    width = interval * _PER_SECOND[time_type.unit]
    per_bin: dict[int, tuple[list[tuple[str, int, int]], list[tuple[str, str, int, int]]]] = {}
    for start, group, topic, partition, offset in zip(bins, *columns, strict=True):
        if start is None or topic is None or partition is None or offset is None:
            continue
        if group is None:
            per_bin.setdefault(start, ([], []))[0].append((topic, partition, offset))
        else:
            per_bin.setdefault(start, ([], []))[1].append((group, topic, partition, offset))
    dated: dict[int, list[tuple[str, int, int, int, int, int]]] = {}
    if written is not None:
        when = written.column("answered").cast(pa.int64()).to_pylist()
        point_columns = [written.column(c).to_pylist()
                         for c in ("topic", "partition", "first", "last", "stamp_low", "stamp_high")]
        for start, *point in zip(when, *point_columns, strict=True):
            if start is not None and None not in point:
                dated.setdefault(start, []).append(tuple(point))

    marks: dict[_Partition, int] = {}
    committed_at: dict[_Key, int] = {}
    groups_on: dict[_Partition, set[str]] = {}
    lags: dict[_Key, int] = {}
    sums: dict[tuple[str, str], list[int]] = {}  # (group, topic) -> [lag, partitions]
    points: dict[_Partition, WritePoints] = {}
    behind: dict[tuple[str, str], set[int]] = {}  # (group, topic) -> its partitions with lag

    def settle(key: _Key) -> None:
        mark = marks.get(key[1:])
        if mark is None:
            return
        lag = max(0, mark - committed_at[key])
        total = sums.setdefault(key[:2], [0, 0])
        old = lags.get(key)
        if old is None:
            total[1] += 1
            old = 0
        total[0] += lag - old
        lags[key] = lag
        if lag:
            behind.setdefault(key[:2], set()).add(key[2])
        else:
            behind.get(key[:2], set()).discard(key[2])

    def seconds(group: str, topic: str, end_ms: float) -> float | None:
        """The group's lag in seconds on the topic at ``end_ms`` (None: no partition with lag dated)."""
        most: float | None = None
        for partition in behind.get((group, topic), ()):
            known = points.get((topic, partition))
            if known is not None:
                late = max(0.0, end_ms - known.written_at(committed_at[(group, topic, partition)])) / 1000
                most = late if most is None or late > most else most
        return most

    out: dict[str, list[Any]] = {name: [] for name in lag_schema().names}
    per_ms = _PER_SECOND[time_type.unit] / 1000
    for start in sorted(per_bin.keys() | dated.keys()):
        for topic, partition, first, last, low, high in dated.get(start, ()):
            points.setdefault((topic, partition), WritePoints()).add(first, last, low, high)
        if start not in per_bin:
            continue
        watermarks, commits = per_bin[start]
        for group, topic, partition, offset in commits:
            key = (group, topic, partition)
            committed_at[key] = offset
            groups_on.setdefault(key[1:], set()).add(group)
            settle(key)
        for topic, partition, offset in watermarks:
            marks[(topic, partition)] = offset
            for group in groups_on.get((topic, partition), ()):
                settle((group, topic, partition))
        end = start + width
        for (group, topic), (lag, n) in sorted(sums.items()):
            late = 0.0 if lag == 0 else seconds(group, topic, end / per_ms)
            for name, value in zip(out, (end, interval, group, topic, lag, n, late), strict=True):
                out[name].append(value)
    out["time"] = pa.array(out["time"], pa.int64()).cast(time_type)
    return pa.table(out, schema=lag_schema(time_type))
