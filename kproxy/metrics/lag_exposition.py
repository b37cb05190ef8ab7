"""Consumer lag as Prometheus series, computed at scrape time from :class:`~kproxy.metrics.consumer_lag.ConsumerLag`.

Series (the names kafka_exporter uses, with kproxy's prefix):

* ``kproxy_consumergroup_lag_sum{group,topic}``: the group's lag summed over the topic's partitions
  kproxy has both a fresh committed offset and a fresh watermark of;
* ``kproxy_consumergroup_lag{group,topic,partition}``: per partition (``metrics.consumer_lag_partitions``);
* ``kproxy_consumergroup_committed_offset{group,topic,partition}``: the last committed offset seen;
* ``kproxy_partition_high_watermark{topic,partition}``: the partition's end last seen (a Fetch
  answer's high watermark, a ListOffsets answer's latest offset, a Produce answer's log end offset);
* ``kproxy_consumergroup_lag_seconds{group,topic}``: how long ago the oldest record the group has not
  committed on the topic was written (the most over its partitions; 0 when caught up), from the
  write times kproxy saw (:func:`~kproxy.metrics.consumer_lag.written_at`: the max timestamp of the Produce
  batches that crossed it, the nearest it saw where it saw none for that offset); per partition as
  ``kproxy_consumergroup_partition_lag_seconds{group,topic,partition}`` with the per-partition lag;
* ``kproxy_consumergroup_catchup_seconds{group,topic}``: how long until the group is caught up at
  its recent rates: its lag over the topic's partitions it committed on, divided by the records a
  second its committed offsets moved by less those the watermarks moved by (both over
  :data:`~kproxy.metrics.consumer_lag.RATE_WINDOW` at least); 0 when caught up, absent while the group does
  not gain on the producers (its rate 0, or not above theirs);
* ``kproxy_consumergroup_lag_evicted_total{table}`` and ``kproxy_consumergroup_lag_series_omitted{family}``:
  what the bounds cost (keys evicted from the tracker; series left out of this scrape).

Nothing is exported that is not fresh at the scrape (:meth:`ConsumerLag.view`): a watermark seen
within ``metrics.consumer_lag_stale_after``, a committed offset committed within it or kept by
its group, seen within it. A group kproxy stops seeing, or a partition nobody fetches or produces
to through kproxy, has its series disappear, never frozen at their last value.

Cardinality, whatever clients send: at most ``label_cap`` groups and ``label_cap`` topics are named,
those with the most lag first (then by name: a stable choice while lags hold); a group or topic
past them counts in ``group="other"`` / ``topic="other"`` of ``lag_sum`` (a sum stays a sum) and
is left out of the per-partition families (an offset of several groups means nothing), and of
``lag_seconds`` and ``catchup_seconds`` (neither a most nor a time adds up across groups). Each
family also holds at most :data:`SERIES_PER_LABEL` x ``label_cap`` series; ``lag_sum`` folds the
rest into ``{group="other",topic="other"}``, the others leave it out. Labels are cut as every
label is (:func:`~kproxy.metrics.labels.cut_label`); a second group or topic cut to the same
label is not named.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kproxy.metrics.consumer_lag import ConsumerLag, LagView
from kproxy.metrics.labels import OTHER, cut_label

N = TypeVar("N", int, float)
SERIES_PER_LABEL = 20  # per family: label_cap x this many series at most (a bounded exposition at the default cap)


@dataclass(frozen=True, slots=True)
class LagSeries:
    """The samples of one scrape, label values as exported."""

    lag_sum: dict[tuple[str, str], int]
    lag: dict[tuple[str, str, str], int]
    committed: dict[tuple[str, str, str], int]
    watermarks: dict[tuple[str, str], int]
    omitted: dict[str, int]
    lag_seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    lag_seconds_partition: dict[tuple[str, str, str], float] = field(default_factory=dict)
    catchup: dict[tuple[str, str], float] = field(default_factory=dict)


def lag_series(view: LagView, label_cap: int, partitions: bool) -> LagSeries:
    """The capped series of ``view`` (see the module docstring); ``partitions``: per-partition lag too."""
    budget = SERIES_PER_LABEL * label_cap
    group_lag: dict[str, int] = {}
    topic_lag: dict[str, int] = {}
    for (group, topic, _), lag in view.lag.items():
        group_lag[group] = group_lag.get(group, 0) + lag
        topic_lag[topic] = topic_lag.get(topic, 0) + lag
    for group, topic, _ in view.committed:
        group_lag.setdefault(group, 0)
        topic_lag.setdefault(topic, 0)
    for topic, _ in view.watermarks:
        topic_lag.setdefault(topic, 0)
    groups = _named(group_lag, label_cap)
    topics = _named(topic_lag, label_cap)
    omitted = {"lag_sum": 0, "lag": 0, "committed_offset": 0, "high_watermark": 0, "lag_seconds": 0,
               "partition_lag_seconds": 0, "catchup_seconds": 0}

    sums: dict[tuple[str, str], int] = {}
    for (group, topic, _), lag in view.lag.items():
        key = (groups.get(group, OTHER), topics.get(topic, OTHER))
        sums[key] = sums.get(key, 0) + lag
    lag_sum = sums
    if len(sums) > budget:  # the first budget - 1 pairs, named ones first; the rest folded into other/other
        ordered = sorted(sums.items(), key=lambda item: (OTHER in item[0], item[0]))
        lag_sum = dict(ordered[:budget - 1])
        rest = ordered[budget - 1:]
        lag_sum[(OTHER, OTHER)] = lag_sum.get((OTHER, OTHER), 0) + sum(n for _, n in rest)
        omitted["lag_sum"] = len(rest) - (1 if any(key == (OTHER, OTHER) for key, _ in rest) else 0)
    lag_series_ = _per_partition(view.lag, groups, topics, budget, omitted, "lag") if partitions else {}
    committed = _per_partition(view.committed, groups, topics, budget, omitted, "committed_offset")
    watermarks: dict[tuple[str, str], int] = {}
    for (topic, partition), offset in sorted(view.watermarks.items(),
                                             key=lambda item: (topics.get(item[0][0]) is None, item[0])):
        name = topics.get(topic)
        if name is None or len(watermarks) >= budget:
            omitted["high_watermark"] += 1
            continue
        watermarks[(name, str(partition))] = offset
    lag_seconds, catchup = _per_topic(view, groups, topics, budget, omitted)
    seconds_partition = (_per_partition(view.lag_seconds, groups, topics, budget, omitted, "partition_lag_seconds")
                         if partitions else {})
    return LagSeries(lag_sum, lag_series_, committed, watermarks, omitted, lag_seconds, seconds_partition, catchup)


def _per_topic(view: LagView, groups: dict[str, str], topics: dict[str, str], budget: int,
               omitted: dict[str, int]) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """``lag_seconds`` and ``catchup_seconds`` per named (group, topic) (see the module docstring):
    a pair not named is left out (neither a most nor a time to catch up adds up across groups)."""
    oldest: dict[tuple[str, str], float] = {}
    backlog: dict[tuple[str, str], list[float]] = {}  # (lag, consumed, produced) over the pair's partitions
    for (group, topic, partition), lag in view.lag.items():
        g, t = groups.get(group), topics.get(topic)
        if g is None or t is None:
            continue
        key = (g, t)
        seconds = view.lag_seconds.get((group, topic, partition))
        if seconds is not None:
            oldest[key] = max(oldest.get(key, 0.0), seconds)
        sums = backlog.setdefault(key, [0.0, 0.0, 0.0])
        sums[0] += lag
        sums[1] += view.consumed.get((group, topic, partition), 0.0)
        sums[2] += view.produced.get((topic, partition), 0.0)
    catchup: dict[tuple[str, str], float] = {}
    for key, (behind, consumed, produced) in backlog.items():
        if behind == 0:
            catchup[key] = 0.0
        elif consumed > produced:
            catchup[key] = behind / (consumed - produced)
    return _capped(oldest, budget, omitted, "lag_seconds"), _capped(catchup, budget, omitted, "catchup_seconds")


def _capped(samples: dict[tuple[str, str], float], budget: int, omitted: dict[str, int],
            family: str) -> dict[tuple[str, str], float]:
    """The first ``budget`` samples by label; the rest counted in ``omitted``."""
    if len(samples) <= budget:
        return samples
    omitted[family] += len(samples) - budget
    return dict(sorted(samples.items())[:budget])


def _named(lags: dict[str, int], cap: int) -> dict[str, str]:
    """The ``cap`` values with the most lag (then by name) -> their labels; a label another value
    took already leaves the value unnamed."""
    out: dict[str, str] = {}
    taken: set[str] = {OTHER}
    for value in sorted(lags, key=lambda v: (-lags[v], v)):
        if len(out) >= cap:
            break
        label = cut_label(value)
        if label not in taken:
            taken.add(label)
            out[value] = label
    return out


def _rank(groups: dict[str, str], topics: dict[str, str]
          ) -> Callable[[tuple[tuple[str, str, int], object]], tuple[bool, bool, str, str, int]]:
    """Sort key of (group, topic, partition) samples: named groups and topics first, then by name."""
    return lambda item: (item[0][0] not in groups, item[0][1] not in topics, *item[0])


def _per_partition(samples: Mapping[tuple[str, str, int], N], groups: dict[str, str], topics: dict[str, str],
                   budget: int, omitted: dict[str, int], family: str) -> dict[tuple[str, str, str], N]:
    out: dict[tuple[str, str, str], N] = {}
    for (group, topic, partition), value in sorted(samples.items(), key=_rank(groups, topics)):
        g, t = groups.get(group), topics.get(topic)
        if g is None or t is None or len(out) >= budget:
            omitted[family] += 1
            continue
        out[(g, t, str(partition))] = value
    return out


class ConsumerLagCollector(Collector):
    """The consumer-lag families, computed from the tracker at each scrape."""

    def __init__(self, lag: ConsumerLag, *, label_cap: int, partitions: bool,
                 clock: Callable[[], float] = time.perf_counter,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.lag = lag
        self.wall_clock = wall_clock  # what the write times are on: the epoch's (lag in seconds)
        self.label_cap = label_cap
        self.partitions = partitions
        self.clock = clock  # the sessions' clock: the one the tracker's times are on

    def collect(self) -> Iterator[Metric]:
        series = lag_series(self.lag.view(self.clock(), self.wall_clock()), self.label_cap, self.partitions)
        stale = f"{self.lag.stale_after:g} s"
        yield _gauge("kproxy_consumergroup_lag_sum", "Consumer group lag by topic: high watermark less committed "
                     "offset, summed over the partitions kproxy saw both of within " + stale + " (capped: the rest "
                     "in group/topic 'other').", ["group", "topic"], series.lag_sum)
        if self.partitions:
            yield _gauge("kproxy_consumergroup_lag", "Consumer group lag per partition: high watermark less "
                         "committed offset (never below 0), both seen within " + stale + ".",
                         ["group", "topic", "partition"], series.lag)
        yield _gauge("kproxy_consumergroup_committed_offset", "The last offset a consumer group committed (an "
                     "OffsetCommit the broker accepted, or an OffsetFetch answer), while kproxy saw the group "
                     "(a commit, or a member the broker accepted) within " + stale + ".",
                     ["group", "topic", "partition"], series.committed)
        yield _gauge("kproxy_partition_high_watermark", "The partition's end last seen: a Fetch or ListOffsets "
                     "(latest, read_uncommitted) answer's high watermark, or the log end offset after a Produce "
                     "the answer accepted, seen within " + stale + ".", ["topic", "partition"], series.watermarks)
        yield _gauge("kproxy_consumergroup_lag_seconds", "Consumer group lag in time: how long ago the oldest "
                     "record the group has not committed on the topic was written (the most over its partitions; "
                     "0 when caught up), from the record batches' max timestamps kproxy saw in Produce requests "
                     "(CreateTime: the producers' clocks), the nearest it saw where it saw none for that offset.",
                     ["group", "topic"], series.lag_seconds)
        if self.partitions:
            yield _gauge("kproxy_consumergroup_partition_lag_seconds", "Consumer group lag in time per partition "
                         "(see kproxy_consumergroup_lag_seconds).", ["group", "topic", "partition"],
                         series.lag_seconds_partition)
        yield _gauge("kproxy_consumergroup_catchup_seconds", "How long until the group is caught up on the topic at "
                     "its recent rates: its lag over the records a second its committed offsets moved by less those "
                     "the watermarks moved by (0 when caught up; absent while it does not gain).",
                     ["group", "topic"], series.catchup)
        family = CounterMetricFamily("kproxy_consumergroup_lag_evicted", "Committed offsets, watermarks and "
                                     "groups kproxy forgot to stay within its bound (the ones updated longest ago).",
                                     labels=["table"])
        for table, n in list(self.lag.evicted.items()):
            family.add_metric([table], n)
        yield family
        yield _gauge("kproxy_consumergroup_lag_series_omitted", "Consumer-lag series left out of this scrape by "
                     "metrics.label_cap (groups and topics past it, series past 20x it).", ["family"],
                     series.omitted)


def _gauge(name: str, doc: str, labels: list[str], samples: Mapping[Any, float]) -> Metric:
    """A gauge family of ``samples``, keyed by a label value or a tuple of them."""
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in samples.items():
        family.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return family
