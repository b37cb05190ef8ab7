"""Traffic by topic and by client, producer batches and client software: what a Kafka traffic
dashboard shows first, read from the records ranges kproxy's scans already found.

Every Produce request and every Fetch response is scanned once (the request by the exchange's
shared scan, :attr:`kproxy.proxy.exchange.Exchange.request_scan`; the response by the metrics'
errors-only scan); each scan gives its records fields as ``(start, end, topic)`` ranges
(:data:`kproxy.protocol.scan.RecordsRange`). This module counts those ranges, once: the records
of ``kproxy_records_total`` and, when the labels are on, bytes and records per topic and per
client, and the batches of producers. Nothing is decompressed for v2 batches (their headers carry
the count; :func:`kproxy.protocol.records.v2_totals`); legacy (magic 0/1) compressed wrappers are
counted within the frame's :data:`RECORD_COUNT_BUDGET`, as before.

What is counted, per direction (``produce``: records in Produce requests; ``fetch``: records in
Fetch responses):

* bytes: the bytes of the whole entries (v2 batches, legacy messages) of a records field, as they
  cross the wire; a partial batch a broker leaves at the end of a Fetch response (it cuts at the
  byte limit; the consumer fetches it again) is not counted, as its records are not;
* records: the batches' record counts. A frame whose records cannot all be counted (unreadable, or
  legacy records past the budget) adds its bytes but none of its records, anywhere, and counts once
  in ``kproxy_records_uncounted_total``: a partial count would look like a real one.

Labels (opt-in, :class:`~kproxy.metrics.stats.StatsOptions`): ``topic`` with ``topic_label``,
``client_id`` with ``client_id_label``, each capped by the :class:`~kproxy.metrics.labels.LabelCap`
the other series with that label share (``label_cap`` distinct values, the rest ``other``). A topic
named by id (Fetch and Produce v13+, KIP-516) is labelled by the name a Metadata v10+ answer gave
(:class:`~kproxy.protocol.topic_ids.TopicIdNames`, learnt by :meth:`LabelledTraffic.learn_metadata`),
or by the id's text until one did.

Per frame, with the labels on: a range's topic finds its :class:`Tally` by one dict lookup on the
topic object as the scan gave it (the label is worked out once per topic, not per frame); a
client's tallies likewise by its client id. No per-record work.
"""

from __future__ import annotations

import uuid
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from kproxy.metrics.fixed_histogram import Histogram
from kproxy.metrics.labels import OTHER, LabelCap, cut_label
from kproxy.protocol.compression import codec_name
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.records import (
    DEFAULT_RECORD_BUDGET,
    RecordBudget,
    count_records,
    iter_batches,
    one_batch_header,
    v2_batches,
    v2_totals,
)
from kproxy.protocol.request_fields import produce_acks
from kproxy.protocol.scan import RecordsRange, Topic
from kproxy.protocol.topic_ids import TopicIdNames

# Decompressed bytes one frame may cost to count its legacy (magic 0/1) compressed records, on the event
# loop: the one per-frame default of every records reader (kproxy.protocol.records.budget), so a wrapper
# any broker would take is counted (a bounded walk); a decompression bomb is not.
RECORD_COUNT_BUDGET = DEFAULT_RECORD_BUDGET
PRODUCE, FETCH = 0, 1  # the directions, as indexes
DIRECTIONS = ("produce", "fetch")  # their label values
# kproxy_produce_batch_bytes: from a one-record batch to the 16 MiB a broker may be set to take.
BATCH_BYTES_BUCKETS = (256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0)
CODEC_LABELS = tuple(codec_name(codec) for codec in range(8))  # a batch's codec is 3 bits: 8 values at most
# acks a producer can mean (-1: all, 0: none, 1: the leader); any other int16 is folded, so a client
# cannot make a series per value.
ACKS_LABELS = {-1: "-1", 0: "0", 1: "1"}
# How many topic or client objects are remembered beside the capped labels (a name past the cap, or
# cut to a label another name has, is looked up through its LabelCap each time once this is full).
CACHE_SLACK = 1024
_RangesAt = list[tuple["Tally", int]]
_NO_TOPIC = object()  # before the first range: no topic object is it


class Tally:
    """Bytes and records of one labelled series (a topic or a client, one direction)."""

    __slots__ = ("bytes", "records")

    def __init__(self) -> None:
        self.bytes = 0
        self.records = 0


class ClientSeries:
    """One client id's label, its two tallies (produce, fetch) and its Produce batches: acks label ->
    a count per codec (an index of :data:`CODEC_LABELS`), so a batch costs no key of its own
    (``by_label``; ``batches`` finds the same lists by the acks as read, for the acks producers mean)."""

    __slots__ = ("batches", "by_label", "label", "tallies")

    def __init__(self, label: str, tallies: tuple[Tally, Tally]) -> None:
        self.label = label
        self.tallies = tallies
        self.by_label: dict[str, list[int]] = {}
        self.batches: dict[int | None, list[int]] = {}


def count_ranges(frame: bytes, ranges: list[RecordsRange]) -> int:
    """Records in a frame's records ranges, from batch headers, within :data:`RECORD_COUNT_BUDGET`;
    -1 when they cannot all be counted (unreadable, or over the budget). The unlabelled path: v2
    batches read in place (:func:`~kproxy.protocol.records.v2_totals`), anything else of a range
    left to :func:`~kproxy.protocol.records.count_records`."""
    records = 0
    budget: RecordBudget | None = None
    for start, end, _ in ranges:
        n, _size, stop = v2_totals(frame, start, end)
        if stop != end:
            if budget is None:
                budget = RecordBudget(RECORD_COUNT_BUDGET)
            try:
                n += count_records(memoryview(frame)[stop:end], budget=budget)
            except ProtocolError:
                return -1
            if budget.exhausted:
                return -1
        records += n
    return records


def _rest(frame: bytes, stop: int, end: int, budget: RecordBudget) -> tuple[int, int]:
    """``(records or -1, bytes)`` of what the v2 walk left of a range: legacy entries, a
    malformed one, or a truncated tail (not counted: neither its bytes nor its records)."""
    view = memoryview(frame)[stop:end]
    size = 0
    try:
        for batch in iter_batches(view):
            size += batch.length
    except ProtocolError:
        size = end - stop  # unreadable: its bytes crossed all the same
    try:
        count = count_records(view, budget=budget)
    except ProtocolError:
        return -1, size
    return (-1 if budget.exhausted else count), size


class LabelledTraffic:
    """The per-topic, per-client, producer and client-software series of one :class:`TrafficStats`.

    ``topics`` / ``clients``: the label caps of the ``topic`` / ``client_id`` labels, None when that
    label is off (its series are then neither counted nor exported). ``cap``: how many
    ``(client_id, software_name, software_version)`` triples ``kproxy_client_info`` keeps apart.
    """

    def __init__(self, topics: LabelCap | None, clients: LabelCap | None, cap: int) -> None:
        self._topics = topics
        self._clients = clients
        self.on = topics is not None or clients is not None
        self.cap = cap
        self.topic_names = TopicIdNames()
        # (topic label, direction) -> its tally, for the exposition; the topic objects scans give ->
        # the same tallies, per direction, for the hot path.
        self.topic_series: dict[tuple[str, str], Tally] = {}
        self._topic_cache: tuple[dict[Topic, Tally], dict[Topic, Tally]] = ({}, {})
        self.client_series: dict[str, ClientSeries] = {}  # client label -> its series
        self._client_cache: dict[str | None, ClientSeries] = {}  # client id as read -> its series
        self.batch_bytes: list[Histogram | None] = [None] * len(CODEC_LABELS)  # by codec
        # (client label, software name, software version) -> open connections that said so (KIP-511).
        self.client_info: dict[tuple[str, str, str], int] = {}
        self._info_seen: set[tuple[str, str, str]] = set()

    # -- records ranges, per frame ----------------------------------------------------
    def produce(self, frame: bytes, ranges: list[RecordsRange], client_id: str | None, acks: int | None,
                api_version: int, body_offset: int | None) -> int:
        """A Produce request's records ranges: counted, and tallied by topic and client when
        labelled; returns the records counted, -1 when they could not all be (see the module
        docstring). ``acks``: the request's, as the session read them; None: read here from
        ``body_offset`` when batches are counted (None too: unknown, labelled ``other``)."""
        if not self.on:
            return count_ranges(frame, ranges)
        client = self._client(client_id) if self._clients is not None else None
        if len(ranges) == 1:
            # One partition, one v2 batch: what a producer sends most of the time, counted without the walk.
            start, end, topic = ranges[0]
            head = one_batch_header(frame, start, end)
            if head is not None:
                size, codec, records = head
                if self._topics is not None:
                    tally = self._topic_cache[PRODUCE].get(topic) or self._topic(topic, PRODUCE)
                    tally.bytes += size
                    tally.records += records
                if client is not None:
                    tally = client.tallies[PRODUCE]
                    tally.bytes += size
                    tally.records += records
                    if acks is None and body_offset is not None:
                        acks = produce_acks(frame, api_version, body_offset)
                    # _batches of this one batch, inlined.
                    counts = client.batches.get(acks) or self._batch_counts(client, acks)
                    counts[codec] += 1
                    hist = self.batch_bytes[codec] or self._batch_histogram(codec)
                    hist.counts[bisect_left(hist.bounds, size)] += 1
                    hist.sum += size
                return records
        if client is None:
            records, size = self._walk(frame, ranges, PRODUCE, None)
        else:
            batches: list[tuple[int, int, int]] = []
            records, size = self._walk(frame, ranges, PRODUCE, batches)
            tally = client.tallies[PRODUCE]
            tally.bytes += size
            if records > 0:
                tally.records += records
            if batches:
                if acks is None and body_offset is not None:
                    acks = produce_acks(frame, api_version, body_offset)
                self._batches(client, batches, acks)
        return records

    def fetch(self, frame: bytes, ranges: list[RecordsRange], client_id: str | None) -> int:
        """A Fetch response's records ranges, as :meth:`produce` (``client_id``: its request's)."""
        if not self.on:
            return count_ranges(frame, ranges)
        records, size = self._walk(frame, ranges, FETCH, None)
        if self._clients is not None:
            client = self._client(client_id)
            tally = client.tallies[FETCH]
            tally.bytes += size
            if records > 0:
                tally.records += records
        return records

    def _walk(self, frame: bytes, ranges: list[RecordsRange], direction: int,
              batches: list[tuple[int, int, int]] | None) -> tuple[int, int]:
        """``(records or -1, bytes)`` of a frame's ranges, each range added to its topic's tally
        (records only when the whole frame could be counted); ``batches`` (Produce, clients
        labelled) gets each whole v2 batch's ``(bytes, codec, records)``.

        A scan gives the ranges of one topic struct one topic object: a run of them finds its
        tally once (by identity), so a Fetch answer of one topic and 100 partitions costs one lookup."""
        topics = self._topic_cache[direction] if self._topics is not None else None
        records = size = 0
        counted = True
        budget: RecordBudget | None = None
        last: object = _NO_TOPIC
        tally: Tally | None = None
        run = 0  # records of the current topic's run, added to its tally once the frame is counted
        runs: _RangesAt = []  # the earlier runs' (tally, records)
        for start, end, topic in ranges:
            if batches is None:
                n, b, stop = v2_totals(frame, start, end)
            else:
                first = len(batches)
                stop = v2_batches(frame, start, end, batches)
                n = b = 0
                for i in range(first, len(batches)):
                    batch = batches[i]
                    b += batch[0]
                    n += batch[2]
            if stop != end:
                if budget is None:
                    budget = RecordBudget(RECORD_COUNT_BUDGET)
                more, rest = _rest(frame, stop, end, budget)
                b += rest
                if more < 0:
                    counted = False
                else:
                    n += more
            size += b
            records += n
            if topics is not None:
                if topic is not last:
                    if tally is not None:
                        runs.append((tally, run))
                    tally = topics.get(topic) or self._topic(topic, direction)
                    last, run = topic, 0
                tally.bytes += b  # type: ignore[union-attr]
                run += n
        if not counted:
            return -1, size
        if tally is not None:
            tally.records += run
            for earlier, n in runs:
                earlier.records += n
        return records, size

    def _topic(self, topic: Topic, direction: int) -> Tally:
        """The tally of a topic object not remembered yet: its label worked out (an id through the
        names learnt; an id not learnt yet is labelled by its text and looked up again next time)."""
        caps = self._topics
        assert caps is not None
        remember = True
        if isinstance(topic, uuid.UUID):
            name = self.topic_names.get(topic)
            remember = name is not None
            label = caps(str(topic) if name is None else name)
        else:
            label = OTHER if topic is None else caps(topic)
        key = (label, DIRECTIONS[direction])
        tally = self.topic_series.get(key)
        if tally is None:
            tally = self.topic_series[key] = Tally()
        cache = self._topic_cache[direction]
        if remember and len(cache) < caps.limit + CACHE_SLACK:
            cache[topic] = tally
        return tally

    def _client(self, client_id: str | None) -> ClientSeries:
        """The series of a client id (None: a null client id, labelled ``""``), made on first use."""
        found = self._client_cache.get(client_id)
        if found is not None:
            return found
        caps = self._clients
        assert caps is not None
        label = caps(client_id or "")
        series = self.client_series.get(label)
        if series is None:
            series = self.client_series[label] = ClientSeries(label, (Tally(), Tally()))
        if len(self._client_cache) < caps.limit + CACHE_SLACK:
            self._client_cache[client_id] = series
        return series

    def _batches(self, client: ClientSeries, batches: list[tuple[int, int, int]], acks: int | None) -> None:
        """Count a Produce request's v2 batches by client, codec and acks, and their sizes by codec."""
        counts = client.batches.get(acks) or self._batch_counts(client, acks)
        histograms = self.batch_bytes
        for size, codec, _ in batches:
            counts[codec] += 1
            hist = histograms[codec] or self._batch_histogram(codec)
            hist.counts[bisect_left(hist.bounds, size)] += 1  # Histogram.observe, inlined
            hist.sum += size

    def _batch_counts(self, client: ClientSeries, acks: int | None) -> list[int]:
        """The batch counts (one per codec) of ``client`` under ``acks`` not met yet on it: an acks no
        producer means shares the one list of ``other`` (a client sending every int16 makes one)."""
        label = OTHER if acks is None else ACKS_LABELS.get(acks, OTHER)
        counts = client.by_label.get(label)
        if counts is None:
            counts = client.by_label[label] = [0] * len(CODEC_LABELS)
        if acks in ACKS_LABELS:
            client.batches[acks] = counts  # later batches find it by the int (folded values are looked up again)
        return counts

    def _batch_histogram(self, codec: int) -> Histogram:
        hist = self.batch_bytes[codec] = Histogram(BATCH_BYTES_BUCKETS)
        return hist

    # -- what else the connections say ------------------------------------------------
    def learn_metadata(self, response: bytes, api_version: int, body_offset: int = 0) -> None:
        """Learn topic ids from a Metadata v10+ answer (for Fetch and Produce v13+, which name
        topics by id). An answer the same as the last one learnt costs one hash."""
        if self._topics is not None:
            self.topic_names.learn_metadata(response, api_version, body_offset)

    def software_opened(self, client_id: str | None, name: str | None, version: str | None
                        ) -> tuple[str, str, str] | None:
        """A connection said which client software it runs (ApiVersions v3+, KIP-511): counted in
        ``kproxy_client_info`` until :meth:`software_closed` with the key returned (None: the
        client-id label is off, nothing counted). Past ``cap`` distinct triples, a new one counts as
        ``(client_id, other, other)``."""
        if self._clients is None:
            return None
        client = self._client(client_id).label
        key = (client, cut_label(name or ""), cut_label(version or ""))
        seen = self._info_seen
        if key not in seen:
            if len(seen) < self.cap:
                seen.add(key)
            else:
                key = (client, OTHER, OTHER)
        self.client_info[key] = self.client_info.get(key, 0) + 1
        return key

    def software_closed(self, key: tuple[str, str, str]) -> None:
        """A connection counted by :meth:`software_opened` closed: its series goes at zero."""
        left = self.client_info.get(key, 0) - 1
        if left > 0:
            self.client_info[key] = left
        else:
            self.client_info.pop(key, None)

    # -- /metrics ---------------------------------------------------------------------
    def produce_batches(self) -> dict[tuple[str, str, str], int]:
        """Produce batches by (client label, compression, acks), built when read (a scrape)."""
        out: dict[tuple[str, str, str], int] = {}
        for client in list(self.client_series.values()):
            for acks, counts in list(client.by_label.items()):
                for codec, n in enumerate(list(counts)):
                    if n:
                        out[(client.label, CODEC_LABELS[codec], acks)] = n
        return out

    def families(self) -> Iterator[Metric]:
        """The Prometheus families of the labels that are on (read with list() copies: the event
        loop may add series while a worker thread renders)."""
        if self._topics is not None:
            topics = list(self.topic_series.items())
            yield _counter("kproxy_topic_bytes", "Bytes of record batches by topic: direction produce, in "
                           "Produce requests; fetch, in Fetch responses (opt-in, capped, the rest is 'other').",
                           ["topic", "direction"], ((key, t.bytes) for key, t in topics))
            yield _counter("kproxy_topic_records", "Records by topic, from batch headers: direction produce, in "
                           "Produce requests; fetch, in Fetch responses (opt-in, capped, the rest is 'other').",
                           ["topic", "direction"], ((key, t.records) for key, t in topics))
        if self._clients is None:
            return
        clients = [(s.label, DIRECTIONS[d], t) for s in list(self.client_series.values())
                   for d, t in enumerate(s.tallies) if t.bytes or t.records]
        yield _counter("kproxy_client_bytes", "Bytes of record batches by client id: direction produce, sent in "
                       "Produce requests; fetch, received in Fetch responses (opt-in, capped).",
                       ["client_id", "direction"], (((c, d), t.bytes) for c, d, t in clients))
        yield _counter("kproxy_client_records", "Records by client id: direction produce, sent in Produce "
                       "requests; fetch, received in Fetch responses (opt-in, capped).",
                       ["client_id", "direction"], (((c, d), t.records) for c, d, t in clients))
        yield _counter("kproxy_produce_batches", "Record batches (v2) in Produce requests, by client id, "
                       "compression codec and the request's acks (opt-in with client ids, capped).",
                       ["client_id", "compression", "acks"], self.produce_batches().items())
        family = HistogramMetricFamily("kproxy_produce_batch_bytes", "Size of the record batches (v2) in "
                                       "Produce requests, by compression codec.", labels=["compression"])
        for codec, hist in enumerate(list(self.batch_bytes)):
            if hist is not None:
                family.add_metric([CODEC_LABELS[codec]], hist.cumulative(), hist.sum)
        yield family
        info = GaugeMetricFamily("kproxy_client_info", "Open client connections by the client software they "
                                 "named in ApiVersions v3+ (KIP-511), with their client id (opt-in, capped).",
                                 labels=["client_id", "software_name", "software_version"])
        for key, n in list(self.client_info.items()):
            info.add_metric(list(key), n)
        yield info


def _counter(name: str, doc: str, labels: list[str], samples: Any) -> Metric:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, n in samples:
        family.add_metric(list(key), n)
    return family
