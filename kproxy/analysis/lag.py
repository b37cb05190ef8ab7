"""Consumer lag over a capture, time bin by time bin, as kproxy's live series compute it (on the driver).

The capture's partition items carry the offsets lag is made of (schema version 3,
:mod:`kproxy.capture.offsets`, from the same readings as :class:`kproxy.metrics.lag.ConsumerLag`):
a ``committed_offset`` with its ``group_id`` (an OffsetCommit the answer accepted, an OffsetFetch
answer) and a ``high_watermark`` without one (a Fetch answer's, a ListOffsets answer's latest, a
Produce answer's log end offset). The partitions pass gives, per time bin the answer reached its
client (the analysis's interval: :mod:`kproxy.analysis.interval`), per group (none: a watermark)
and partition, the last of each answered in that bin (:mod:`kproxy.analysis.tables`);
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
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

_Partition = tuple[str, int]  # (topic, partition)
_Key = tuple[str, str, int]  # (group, topic, partition)
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}  # a timestamp unit's steps a second


_UTC_TIME = pa.timestamp("us", tz="UTC")


def lag_schema(time: pa.DataType = _UTC_TIME) -> pa.Schema:
    """``consumer_lag``'s columns; ``time``: the type of the fine table's times."""
    return pa.schema([("time", time), ("interval_s", pa.int32()), ("group_id", pa.string()), ("topic", pa.string()),
                      ("lag", pa.int64()), ("partitions", pa.int64())])


def consumer_lag(offsets: pa.Table, interval: int = 60) -> pa.Table:
    """Per time bin of ``interval`` seconds, group and topic (sorted so): the lag at the bin's end (its
    ``time``) and the partitions it sums (see the module docstring), from ``offsets``: the partitions
    pass's rows per (``answered``: the start of the bin, ``group_id``, ``topic``, ``partition``) with the
    last ``offset`` answered there: the group's committed offset, or without a group the partition's
    watermark.
    Cost: one step per offset row and per (group, topic) per bin, plus, per watermark, one per group
    committed on its partition."""
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

    marks: dict[_Partition, int] = {}
    committed_at: dict[_Key, int] = {}
    groups_on: dict[_Partition, set[str]] = {}
    lags: dict[_Key, int] = {}
    sums: dict[tuple[str, str], list[int]] = {}  # (group, topic) -> [lag, partitions]

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

    out: dict[str, list[Any]] = {name: [] for name in lag_schema().names}
    for start in sorted(per_bin):
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
        for (group, topic), (lag, n) in sorted(sums.items()):
            for name, value in zip(out, (start + width, interval, group, topic, lag, n), strict=True):
                out[name].append(value)
    out["time"] = pa.array(out["time"], pa.int64()).cast(time_type)
    return pa.table(out, schema=lag_schema(time_type))
