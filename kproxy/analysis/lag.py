"""Consumer lag over a capture, minute by minute, as kproxy's live series compute it (on the driver).

The capture's partition items carry the offsets lag is made of (schema version 3,
:mod:`kproxy.capture.offsets`, from the same readings as :class:`kproxy.metrics.lag.ConsumerLag`):
a ``committed_offset`` with its ``group_id`` (an OffsetCommit the answer accepted, an OffsetFetch
answer) and a ``high_watermark`` without one (a Fetch answer's, a ListOffsets answer's latest, a
Produce answer's log end offset). The partitions pass gives, per minute the answer reached its
client, per group (none: a watermark) and partition, the last of each answered in that minute
(:mod:`kproxy.analysis.tables`); :func:`consumer_lag` replays those minutes in order.

A group's lag on a partition at the end of a minute is, as ``kproxy_consumergroup_lag``: the
partition's latest watermark known by then less the group's latest committed offset there, never
below 0; a partition with a committed offset and no watermark yet has none. Summed per group and
topic over those partitions, it is ``kproxy_consumergroup_lag_sum``.

Two differences with the live series, both about time: live values go stale (a watermark not seen
again, a group no longer seen, within ``metrics.consumer_lag_stale_after``) and disappear, where
offline the last value known stands until the capture ends (a capture is read after the fact: what
was known is known); and live, a Produce answer's end offset lower than the one held is ignored
(concurrent producers' answers arrive in any order), where offline a minute's watermark is the last
answered in it, whatever its source. A minute in which no offset was answered has no row: the lag
stood as the row before says.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

_Partition = tuple[str, int]  # (topic, partition)
_Key = tuple[str, str, int]  # (group, topic, partition)


_UTC_MINUTE = pa.timestamp("us", tz="UTC")


def lag_schema(minute: pa.DataType = _UTC_MINUTE) -> pa.Schema:
    """``consumer_lag``'s columns; ``minute``: the type of the fine table's minutes."""
    return pa.schema([("minute", minute), ("group_id", pa.string()), ("topic", pa.string()),
                      ("lag", pa.int64()), ("partitions", pa.int64())])


def consumer_lag(offsets: pa.Table) -> pa.Table:
    """Per minute, group and topic (sorted so): the lag at the minute's end and the partitions it sums
    (see the module docstring), from ``offsets``: the partitions pass's rows per (``answered`` minute,
    ``group_id``, ``topic``, ``partition``) with the last ``offset`` answered there: the group's committed
    offset, or without a group the partition's watermark.
    Cost: one step per offset row and per (group, topic) per minute, plus, per watermark, one per group
    committed on its partition."""
    minute_type = offsets.schema.field("answered").type
    columns = [offsets.column(c).to_pylist() for c in ("group_id", "topic", "partition", "offset")]
    # (minutes as integers: no datetime per row; the output casts them back)
    minutes = offsets.column("answered").cast(pa.int64()).to_pylist()
    per_minute: dict[int, tuple[list[tuple[str, int, int]], list[tuple[str, str, int, int]]]] = {}
    for minute, group, topic, partition, offset in zip(minutes, *columns, strict=True):
        if minute is None or topic is None or partition is None or offset is None:
            continue
        if group is None:
            per_minute.setdefault(minute, ([], []))[0].append((topic, partition, offset))
        else:
            per_minute.setdefault(minute, ([], []))[1].append((group, topic, partition, offset))

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
    for minute in sorted(per_minute):
        watermarks, commits = per_minute[minute]
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
            for name, value in zip(out, (minute, group, topic, lag, n), strict=True):
                out[name].append(value)
    out["minute"] = pa.array(out["minute"], pa.int64()).cast(minute_type)
    return pa.table(out, schema=lag_schema(minute_type))
