"""What consumer lag is made of, read from the scans of the exchanges that carry it (sans-IO).

A consumer group's lag on a partition is the partition's high watermark less the offset the
group committed there. Both cross a proxy:

* **committed offsets**: in OffsetCommit requests, committed once the answer accepts them (error
  code 0 for that partition), and in OffsetFetch answers (the coordinator's own record: v0-7 for
  the request's one group, v8+ per group, KIP-709);
* **high watermarks**: in every Fetch answer (``high_watermark`` per partition), and in ListOffsets
  answers to a request for the latest offset (timestamp -1, KIP-79's LATEST_TIMESTAMP) at
  isolation level read_uncommitted. A read_committed ListOffsets answers the last stable offset
  (KIP-98), not the watermark: it is left out, as is timestamp -2 (the earliest offset) and every
  other timestamp. A Fetch answer's ``high_watermark`` is the watermark whatever the fetch's
  isolation level (its ``last_stable_offset`` is not read), which is also what kafka_exporter's
  "newest offset" is;
* **log end offsets**: in Produce answers. A partition a Produce request carried records for and
  whose answer accepted them (error code 0) ends, after the append, at the answer's
  ``base_offset`` (the first offset the broker gave the request's records there) plus the records
  the request carried for it (:func:`produce_record_counts`: the batch headers' counts, in request
  order; the broker numbers every record, compressed or not, KIP-98's batches included). That is the
  log end offset: the high watermark once the followers have it (at once with acks=all, a moment
  later with acks=1), so it may lead the watermark briefly; kafka_exporter's "newest offset" is the
  same kind of reading. Transaction markers the coordinator writes are not in any Produce request:
  a Fetch answer's watermark counts them. A Produce with acks=0 has no answer: nothing.

And whether a group is still there: a member the coordinator accepted, which an answer without
error to one of :data:`GROUP_REQUESTS` says (JoinGroup, SyncGroup, Heartbeat, KIP-848's
ConsumerGroupHeartbeat; their group id read from the request in place,
:func:`kproxy.protocol.request_fields.request_group_id`), or a committed offset the broker
accepted or reports (the OffsetCommit and OffsetFetch answers above). A request alone says nothing:
any client can name any group. LeaveGroup is not one of them: the member is going.

Topics are named, or from version 10 of OffsetCommit and OffsetFetch, 13 of Fetch and Produce
(KIP-516) identified by id; Metadata v10+ answers carry both (:func:`metadata_topic_ids`).

The scans are the ones kproxy makes anyway, in their values mode
(:func:`kproxy.protocol.scan.scanner` with ``values=True``): one walk of each body reads its error
codes and these fields together (:data:`OFFSET_FIELDS`). The readers here only sort what such a
scan holds (its values, :func:`values_of`, and its non-zero error codes): the metrics' and the
capture's alike. A scan that failed (None) gives nothing, never a partial answer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from kproxy.protocol.api_keys import (
    CONSUMER_GROUP_HEARTBEAT,
    FETCH,
    HEARTBEAT,
    JOIN_GROUP,
    LIST_OFFSETS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    PRODUCE,
    SYNC_GROUP,
)
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.message_schemas import MessageType
from kproxy.protocol.records import (
    DEFAULT_RECORD_BUDGET,
    RecordBudget,
    count_records,
    one_batch_count,
    v2_dated,
    v2_max_timestamp,
)
from kproxy.protocol.scan_types import Entry, RequestScan, ScanEntries, Topic

# The fields the values mode reads, by (api key, direction). At most one per struct; each is a plain
# (untagged) field.
OFFSET_FIELDS: dict[tuple[int, MessageType], frozenset[str]] = {
    (PRODUCE, MessageType.RESPONSE): frozenset({"base_offset"}),  # where the request's records went
    (OFFSET_COMMIT, MessageType.REQUEST): frozenset({"group_id", "committed_offset"}),
    (OFFSET_FETCH, MessageType.REQUEST): frozenset({"group_id"}),  # v0-7: the answer's group
    (OFFSET_FETCH, MessageType.RESPONSE): frozenset({"group_id", "committed_offset"}),  # (v8+: per group)
    (LIST_OFFSETS, MessageType.REQUEST): frozenset({"isolation_level", "timestamp"}),  # (v2+: isolation)
    (LIST_OFFSETS, MessageType.RESPONSE): frozenset({"offset", "old_style_offsets"}),  # (v0: an array)
    (FETCH, MessageType.RESPONSE): frozenset({"high_watermark"}),
    (METADATA, MessageType.RESPONSE): frozenset({"topic_id"}),  # v10+: topic id and name (KIP-516)
}
# Requests of a group's members, which name it, whose answer, without error, says their group is
# there: a member the coordinator accepted (JoinGroup's also begins a rebalance). LeaveGroup is left
# out on purpose: a member leaving does not say the group is still consuming. Not TxnOffsetCommit: a
# transactional producer's, whose answer without a partition accepts nothing; the consumer it commits
# for is a member that heartbeats.
GROUP_REQUESTS = frozenset({JOIN_GROUP, HEARTBEAT, SYNC_GROUP, CONSUMER_GROUP_HEARTBEAT})
LATEST_TIMESTAMP = -1  # ListOffsets: the latest offset (the high watermark at read_uncommitted)
READ_UNCOMMITTED = 0  # ListOffsets isolation_level (v2+; before, every answer is read_uncommitted)
OFFSET_FETCH_GROUPS = 8  # the first OffsetFetch version with groups in its request and answer

# (group, topic, partition, committed offset); (topic, partition, offset); (topic, partition, records,
# max timestamp: the latest its batch headers carry, ms since the epoch, -1 if none); (topic, partition,
# base offset, records, max timestamp): what a Produce answer accepted (produce_appends)
Commit = tuple[str, Topic, int, int]
Watermark = tuple[Topic, int, int]
Produced = tuple[Topic, int, int, int]
Appended = tuple[Topic, int, int, int, int]
Values = list[tuple[object, ...]]  # what a values-mode scan read (ScanEntries.values)


def values_of(scan: RequestScan | None) -> Values | None:
    """The values a scan read (None: the scan failed; [] for one made without the values mode)."""
    if scan is None:
        return None
    entries = scan[0]
    return entries.values if isinstance(entries, ScanEntries) else []


def _partition(item: tuple[object, ...]) -> tuple[Topic, int, object, int] | None:
    """A partition entry of the values whose value is a non-negative offset (None otherwise)."""
    if len(item) != 4:
        return None
    topic, partition, code, value = item
    if (not isinstance(topic, str | uuid.UUID) or type(partition) is not int or type(value) is not int
            or value < 0):
        return None
    return topic, partition, code, value


def offset_commits(request: Values | None, answer_errors: Iterable[Entry] | None) -> list[Commit]:
    """The offsets an OffsetCommit request committed: its partitions (``request``: its values) whose
    answer's error code is 0 (``answer_errors``: the answer's non-zero codes, as its errors-only scan
    lists them; None: the answer was not read). Nothing when either was not read or the request names
    no group."""
    if answer_errors is None:
        return []
    group: object = None
    offsets: list[tuple[Topic, int, int]] = []
    for item in request or ():
        if len(item) == 3:
            group = item[1]  # the top level's group_id
        elif (found := _partition(item)) is not None:
            offsets.append((found[0], found[1], found[3]))
    if not isinstance(group, str) or not offsets:
        return []
    refused = {(topic, partition) for topic, partition, code in answer_errors if code}
    return [(group, topic, partition, offset) for topic, partition, offset in offsets
            if (topic, partition) not in refused]


def offset_fetches(request: Values | None, answer: Values | None, answer_errors: Iterable[Entry],
                   api_version: int) -> list[Commit]:
    """The committed offsets an OffsetFetch answer reports (``answer``: its values; ``answer_errors``:
    its non-zero codes): per partition with error code 0 and an offset (-1: none committed), of a group
    whose error code is 0 (v2-7: the top-level one, ``(None, None, code)`` among the errors; v8+: the
    group's). Before v8 the group is the request's (``request``: its values; None: not read: nothing)."""
    if not answer:
        return []
    out: list[Commit] = []
    if api_version < OFFSET_FETCH_GROUPS:
        group = next((item[1] for item in request or () if len(item) == 3), None)
        if not isinstance(group, str) or (None, None) in {(t, p) for t, p, code in answer_errors if code}:
            return []  # (None, None, code): the top-level error, the whole answer's
        for item in answer:
            found = _partition(item)
            if found is not None and not found[2]:
                out.append((group, found[0], found[1], found[3]))
        return out
    pending: list[tuple[Topic, int, int]] = []
    for item in answer:
        if len(item) == 3:  # a group ends: (None, group_id, its error code)
            _, group, code = item
            if isinstance(group, str) and not code:
                out.extend((group, topic, partition, offset) for topic, partition, offset in pending)
            pending = []
        elif (found := _partition(item)) is not None and not found[2]:
            pending.append((found[0], found[1], found[3]))
    return out


def fetch_watermarks(answer: Values | None) -> list[Watermark]:
    """The high watermark of each partition of a Fetch answer (its values) whose error code is 0. (A
    Fetch answer's only values-mode field is its partitions' ``high_watermark``, an int64: every item
    is a partition entry with an int, so one comprehension reads them; a null topic name is left out.)"""
    return [(topic, partition, value) for topic, partition, code, value in answer or ()  # type: ignore[misc]
            if not code and value >= 0 and topic is not None]  # type: ignore[operator]


# Write-time spans a Fetch answer's records give a partition, at most (its batches split evenly among
# them): a consumer catching up fetches many batches at once, and one span for all would date them
# all by the latest (the lag tracker keeps 24 points a partition: a third of them).
FETCH_SPANS = 8


def batches_written(data: bytes, start: int, end: int, segments: int
                    ) -> list[tuple[int, int, int]]:
    """When the records of ``data[start:end]`` (a Fetch answer's) were written, from the headers of the
    whole v2 batches that open it, read in place (nothing decompressed): at most ``segments`` spans
    ``(first offset, last offset, max timestamp)`` in offset order, the batches split evenly among
    them, each span its batches' first base offset, last base offset plus last offset delta, and
    latest max timestamp (ms since the epoch: the producers' CreateTime, or with attribute bit 3,
    LogAppendTime, the broker's append time); none when no whole v2 batch opens it (a legacy message
    set; a fetch cut short inside its first batch)."""
    batches: list[tuple[int, int, int]] = []
    v2_dated(data, start, end, batches)
    return written_spans(batches, segments)


def written_spans(batches: list[tuple[int, int, int]], segments: int) -> list[tuple[int, int, int]]:
    """``batches`` (``(base offset, last offset, max timestamp)`` each, in offset order:
    :func:`~kproxy.protocol.records.v2_dated`) as at most ``segments`` spans, split evenly among them
    (see :func:`batches_written`): ``batches`` itself when they are no more."""
    n = len(batches)
    if n <= segments:
        return batches
    out: list[tuple[int, int, int]] = []
    for i in range(segments):
        part = batches[i * n // segments:(i + 1) * n // segments]
        out.append((part[0][0], part[-1][1], max(b[2] for b in part)))
    return out


def latest_offsets(request: Values | None, answer: Values | None) -> list[Watermark]:
    """The high watermarks a ListOffsets answer gives (both: their values): its partitions with error
    code 0 that the request asked the latest offset of (timestamp -1) at read_uncommitted (v2+'s
    isolation_level; read_committed answers the last stable offset, which is not the watermark)."""
    asked: set[tuple[object, object]] = set()
    for item in request or ():
        if len(item) == 3:
            if item[1] != READ_UNCOMMITTED:
                return []
        elif len(item) == 4 and item[3] == LATEST_TIMESTAMP:
            asked.add((item[0], item[1]))
    if not asked:
        return []
    out: list[Watermark] = []
    for item in answer or ():
        found = _partition(item)
        if found is not None and not found[2] and (found[0], found[1]) in asked:
            out.append((found[0], found[1], found[3]))
    return out


def metadata_topic_ids(answer: Values | None) -> list[tuple[uuid.UUID, str]]:
    """(topic id, name) of each topic a Metadata v10+ answer (its values) names with an id (the zero
    id: none)."""
    out: list[tuple[uuid.UUID, str]] = []
    for item in answer or ():
        if len(item) == 3:
            name, topic_id, _ = item
            if isinstance(topic_id, uuid.UUID) and topic_id.int and isinstance(name, str):
                out.append((topic_id, name))
    return out


def group_ids(request: Values | None) -> list[str]:
    """The groups an OffsetCommit or OffsetFetch request names (its values): one, or for an
    OffsetFetch v8+ each of its groups (KIP-709). A group id is a struct's value, ``(topic, value,
    code)``."""
    return [item[1] for item in request or () if len(item) == 3 and isinstance(item[1], str)]


def produce_record_counts(frame: bytes, scan: RequestScan | None,
                          total: int | None = None) -> list[Produced] | None:
    """``(topic, partition, records, max_timestamp)`` of each partition of a Produce request (``scan``:
    its shared scan, ``frame``: the frame it was made of), from the batch headers of its records ranges:
    the latest ``maxTimestamp`` of its v2 batches read in place (-1: none, a legacy message set), and
    a v2 batch's count read in place (what a producer sends per partition), anything else counted
    by :func:`~kproxy.protocol.records.count_records` within one frame's record budget. None when
    the request cannot all be counted, or when its ranges do not pair with its partitions one to one
    (a partition without records: the scan notes no range for it); a partial answer would put a log
    end offset in the wrong place. ``total``: the records of all its ranges when the caller counted
    them already, the same way (the metrics: -1 when not all could be); a request of one partition
    is then not read again."""
    if scan is None:
        return None
    entries, ranges = scan
    if len(ranges) == 1 and len(entries) == 1:  # one partition: what a producer usually sends
        topic, partition, _ = entries[0]
        if partition is None:
            return None
        span = ranges[0]
        if total is not None:
            return [(topic, partition, total, v2_max_timestamp(frame, span[0], span[1]))] if total >= 0 else None
        n = one_batch_count(frame, span[0], span[1])  # one v2 batch, read in place
        if n is not None:
            return [(topic, partition, n, v2_max_timestamp(frame, span[0], span[1]))]
    if not ranges or len(ranges) != len(entries):
        return None
    out: list[Produced] = []
    budget: RecordBudget | None = None
    for i in range(len(ranges)):  # (paired by index: their lengths are equal, checked above)
        topic, partition, _ = entries[i]
        span = ranges[i]
        start, end = span[0], span[1]
        n = one_batch_count(frame, start, end)
        if n is None:
            if budget is None:
                budget = RecordBudget(DEFAULT_RECORD_BUDGET)
            try:
                n = count_records(memoryview(frame)[start:end], budget=budget)
            except ProtocolError:
                return None
            if budget.exhausted:
                return None
        if partition is None:
            return None
        out.append((topic, partition, n, v2_max_timestamp(frame, start, end)))
    return out


def produce_end_offsets(produced: list[Produced], answer: Values | None) -> list[Watermark]:
    """The log end offset of each partition a Produce answer (its values: ``(topic, partition, code,
    base_offset)``) accepted records of: its base offset plus the records the request carried there
    (``produced``, :func:`produce_record_counts`). A partition the request carried no records for, or
    named twice, gives nothing."""
    return [(topic, partition, base + n) for topic, partition, base, n, _ in produce_appends(produced, answer)]


def produce_appends(produced: list[Produced], answer: Values | None) -> list[Appended]:
    """``(topic, partition, base_offset, records, max_timestamp)`` of each partition a Produce answer
    (its values: ``(topic, partition, code, base_offset)``) accepted records of: the offsets the broker
    gave the request's records there (``base_offset`` to ``base_offset + records - 1``) and the latest
    time their batch headers carry (``produced``, :func:`produce_record_counts`; -1: none). A partition
    the request carried no records for, or named twice, gives nothing."""
    if not answer:
        return []
    counts: dict[tuple[Topic, int], tuple[int, int]]
    if len(produced) == 1:  # a producer's usual request: one partition
        topic, partition, n, written = produced[0]
        if len(answer) == 1:  # ... and its answer (_partition, inlined)
            item = answer[0]
            if (len(item) == 4 and item[1] == partition and not item[2] and type(item[3]) is int and item[3] >= 0
                    and n > 0 and item[0] == topic):
                return [(topic, partition, item[3], n, written)]
            return []
        counts = {(topic, partition): (n, written)}
    else:
        counts = {}
        for topic, partition, n, written in produced:
            key = (topic, partition)
            counts[key] = (-1, -1) if key in counts else (n, written)
    out: list[Appended] = []
    for item in answer:
        found = _partition(item)
        if found is not None and not found[2]:
            n, written = counts.get((found[0], found[1]), (0, -1))
            if n > 0:
                out.append((found[0], found[1], found[3], n, written))
    return out
