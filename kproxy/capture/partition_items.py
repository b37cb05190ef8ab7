"""A capture record's partition items: the request's and the response's entries merged, with the
offsets consumer lag is made of (schema version 3) and when offsets were written (version 4).

:func:`merge_partitions` merges the two sides' entries per (topic, partition);
:func:`with_offsets` then gives the items of the exchanges that carry offsets their
``group_id``, ``committed_offset`` and ``high_watermark``, read from the scans' values as the
metrics read them (:mod:`kproxy.protocol.offset_reads`): an OffsetCommit's accepted offsets, an
OffsetFetch answer's, a Fetch answer's watermarks, a ListOffsets answer's latest offsets, a Produce
answer's log end offsets (its base offsets plus the records the request carried, as the record's
items count them); a Produce answer's items also date their records, as the live tracker's
write-time points do (:attr:`kproxy.metrics.consumer_lag.ConsumerLag.written`): ``base_offset`` and
``last_offset``, the offsets the answer gave the request's records there, and ``max_timestamp``,
the latest max timestamp of their v2 batch headers (none for a legacy message set); so do a Fetch
answer's items, from its records' v2 batch headers (the first base offset, the last batch's last
offset, their latest max timestamp). So a
capture's analysis sees the same committed offsets, watermarks and write times as the live
series. (The live tracker also keeps a Produce answer's end only when it is past the one it holds,
and reads no Produce a rule replaced: offline, the latest record says; the records'
``rule_decisions`` say where a rule acted.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kproxy.protocol.api_keys import FETCH, LIST_OFFSETS, OFFSET_COMMIT, OFFSET_FETCH, PRODUCE
from kproxy.protocol.offset_reads import (
    Produced,
    Values,
    fetch_watermarks,
    latest_offsets,
    offset_commits,
    offset_fetches,
    produce_appends,
)

# The kinds whose scans the capture makes in values mode (Metadata's topic ids it reads in full already).
VALUE_APIS = frozenset({FETCH, LIST_OFFSETS, OFFSET_COMMIT, OFFSET_FETCH, PRODUCE})
# One side's entry: topic (a name, or an id until named), partition, error code, records, bytes.
Entry = tuple[Any, int | None, int | None, int, int]
Name = Callable[[object], str | None]
# group_id, committed_offset, high_watermark; base_offset, last_offset, max_timestamp; producer_id,
# producer_epoch, base_sequence, batch_crc, codec (a Produce request's: kproxy.capture.record_builder)
_NO_OFFSETS = (None, None, None, None, None, None, None, None, None, None, None)


def merge_partitions(first: tuple[Entry, ...], second: tuple[Entry, ...], name: Name
                     ) -> tuple[tuple[tuple[Any, ...], ...], int, int]:
    """The request's and the response's entries merged per (topic name, partition), in order of first
    appearance (codes: the response's; records: summed), as partition items (PARTITION_ITEMS' order,
    no offsets yet), and the records' totals."""
    if len(first) + len(second) == 1:  # one partition, named on one side only
        topic, partition, code, n, size = first[0] if first else second[0]
        return ((topic if type(topic) is str else name(topic), partition, code, n, size, *_NO_OFFSETS),), n, size
    if len(first) == 1 and len(second) == 1:  # one partition, in the request and the response (most
        topic, partition, code, n, size = first[0]  # Produce and Fetch exchanges)
        topic2, partition2, code2, n2, size2 = second[0]
        if type(topic) is not str:
            topic = name(topic)
        if type(topic2) is not str:
            topic2 = name(topic2)
        if topic == topic2 and partition == partition2:
            n += n2
            size += size2
            return ((topic, partition, code if code2 is None else code2, n, size, *_NO_OFFSETS),), n, size
    if len(first) == len(second):  # a Fetch: the answer's partitions, as many, in the request's order
        paired = _paired(first, second, name)
        if paired is not None:
            return paired
    parts: dict[tuple[str | None, int | None], list[Any]] = {}
    for entries in (first, second):
        for topic, partition, code, n, size in entries:
            if type(topic) is not str:
                topic = name(topic)
            key = (topic, partition)
            entry = parts.get(key)
            if entry is None:
                parts[key] = [topic, partition, code, n, size, *_NO_OFFSETS]
            else:
                if code is not None:
                    entry[2] = code
                entry[3] += n
                entry[4] += size
    partitions = tuple(map(tuple, parts.values()))
    count = size_ = 0
    for p in partitions:
        count += p[3]
        size_ += p[4]
    return partitions, count, size_


def _paired(first: tuple[Entry, ...], second: tuple[Entry, ...], name: Name
            ) -> tuple[tuple[tuple[Any, ...], ...], int, int] | None:
    """:func:`merge_partitions` of two sides naming the same partitions in the same order, each once,
    made pair by pair; None when they do not (the general way decides)."""
    out: list[tuple[Any, ...]] = []
    seen: set[tuple[str | None, int | None]] = set()
    count = size_ = 0
    for i in range(len(first)):  # (compiled: an index, not a zip, whose strict= is a call with a keyword)
        topic, partition, code, n, size = first[i]
        topic2, partition2, code2, n2, size2 = second[i]
        if topic != topic2 or partition != partition2:
            return None
        if type(topic) is not str:
            topic = name(topic)
        key = (topic, partition)
        if key in seen:
            return None
        seen.add(key)
        n += n2
        size += size2
        # (compiled: a star in a tuple display makes a list first, then the tuple)
        out.append((topic, partition, code if code2 is None else code2, n, size) + _NO_OFFSETS)  # noqa: RUF005
        count += n
        size_ += size
    return tuple(out), count, size_


def with_offsets(partitions: tuple[tuple[Any, ...], ...], api_key: int, api_version: int,
                 request: Values | None, answer: Values | None, answer_errors: list[tuple[Any, Any, Any]] | None,
                 name: Name, produced: list[Produced] | None = None) -> tuple[tuple[Any, ...], ...]:
    """``partitions`` with the offsets the exchange carries (see the module docstring); the request's
    and the answer's values (None: not read) and the answer's non-zero codes (the top-level one as
    ``(None, None, code)``; None: the answer was not read); ``produced``: a Produce request's records
    per partition (None: not all counted). A committed offset or watermark of a partition no item
    names gets an item of its own (an OffsetFetch v8+ answer: one per group). A Produce answer's items
    get their write time too: the range the answer gave and ``produced``'s max timestamp (-1: none
    known, left null)."""
    facts: list[tuple[str | None, object, int, int | None, int | None]]  # group, topic, partition, offsets
    written: list[tuple[Any, Any, Any]] = []  # per fact: first, last offset and time written (None: unknown)
    extra: list[tuple[Any, ...]] = []  # a Fetch answer's further spans: (topic, partition, first, last, time)
    if api_key == PRODUCE:
        appends = produce_appends(produced or [], answer)
        if len(appends) == 1 and len(partitions) == 1:  # the usual Produce: one partition, accepted
            only, appended = partitions[0], appends[0]
            base, records, stamp = appended[2], appended[3], appended[4]
            if only[1] == appended[1] and only[0] == (appended[0] if type(appended[0]) is str else name(appended[0])):
                return ((*only[:7], base + records, base, base + records - 1, stamp if stamp >= 0 else None,
                         *only[11:]),)
        facts = [(None, topic, partition, None, base + n) for topic, partition, base, n, _ in appends]
        written = [(base, base + n - 1, stamp if stamp >= 0 else None) for _, _, base, n, stamp in appends]
    elif api_key == FETCH:
        if answer:
            items = _fetch_items(partitions, answer, name)
            if items is not None:
                return items
        # (the answer's values: its partitions' watermarks, four fields each, and the capture's own
        # write times of their records, five: kproxy.capture.record_builder._fetched_written)
        facts = [(None, topic, partition, None, offset)
                 for topic, partition, offset in fetch_watermarks([v for v in answer or () if len(v) == 4])]
        dated: dict[tuple[object, object], list[tuple[Any, Any, Any]]] = {}
        for v in answer or ():
            if len(v) == 5:
                dated.setdefault((v[0], v[1]), []).append((v[2], v[3], v[4]))
        # A partition's first span goes in its item, any other in an item of its own (no records there).
        for _, topic, partition, _, _ in facts:
            spans = dated.get((topic, partition)) or [(None, None, None)]
            written.append(spans[0])
            extra.extend((topic, partition, *span) for span in spans[1:])
    elif api_key == LIST_OFFSETS:
        facts = [(None, topic, partition, None, offset) for topic, partition, offset in latest_offsets(request, answer)]
    elif api_key == OFFSET_COMMIT:
        facts = [(group, topic, partition, offset, None)
                 for group, topic, partition, offset in offset_commits(request, answer_errors)]
    elif api_key == OFFSET_FETCH and answer_errors is not None:
        facts = [(group, topic, partition, offset, None)
                 for group, topic, partition, offset in offset_fetches(request, answer, answer_errors, api_version)]
    else:
        return partitions
    if not facts:
        return partitions
    out = [list(p) for p in partitions]
    where = {(p[0], p[1]): i for i, p in enumerate(out)}
    for n, (group, topic, partition, committed, watermark) in enumerate(facts):
        key = (topic if type(topic) is str else name(topic), partition)
        i = where.get(key)
        if i is None or (group is not None and out[i][5] not in (None, group)):  # (another group's item)
            out.append([key[0], partition, None, 0, 0, *_NO_OFFSETS])
            i = where[key] = len(out) - 1
        item = out[i]
        if group is not None:
            item[5], item[6] = group, committed
        else:
            item[7] = watermark
        if written:
            item[8], item[9], item[10] = written[n]
    for topic, partition, first, last, stamp in extra:
        out.append([topic if type(topic) is str else name(topic), partition, None, 0, 0, None, None, None,
                    first, last, stamp, None, None, None, None, None])
    return tuple(map(tuple, out))


# A Fetch answer's write-time span where it has none (topic, partition, first, last, max timestamp).
_NO_SPAN: tuple[Any, ...] = (None, None, None, None, None)


def _fetch_items(partitions: tuple[tuple[Any, ...], ...], answer: Values, name: Name
                 ) -> tuple[tuple[Any, ...], ...] | None:
    """:func:`with_offsets` of a Fetch answer whose partitions are ``partitions``' first ones, in their
    order (what :func:`merge_partitions` makes of the usual Fetch), its write-time spans after them
    (``kproxy.capture.record_builder._fetched_written``: a partition's together, in the same order),
    made item by item; None for any other answer (the general way decides)."""
    n = len(partitions)
    last = len(answer)
    if last < n:
        return None
    out: list[tuple[Any, ...]] = []
    extra: list[tuple[Any, ...]] = []
    j = n  # the next span
    for i in range(n):
        value = answer[i]
        item = partitions[i]
        if len(value) != 4:
            return None
        topic, partition, code, watermark = value
        named = topic if type(topic) is str else name(topic)
        if named != item[0] or partition != item[1]:
            return None
        first = j
        while j < last and len(answer[j]) == 5 and answer[j][1] == partition and answer[j][0] == topic:
            j += 1
        # (a fact as fetch_watermarks reads it: no error, a watermark, a named topic)
        if not code and watermark >= 0 and topic is not None:  # type: ignore[operator]
            # (one tuple display: compiled, a star in one makes a list first, and joining tuples
            # is a generic call each)
            span = answer[first] if j > first else _NO_SPAN
            made = (item[0], item[1], item[2], item[3], item[4], item[5], item[6], watermark, span[2], span[3],
                    span[4])
            out.append(made if len(item) == 11 else made + item[11:])
            for k in range(first + 1, j):
                extra.append((named, partition, None, 0, 0, *_NO_OFFSETS[:3], *answer[k][2:], *_NO_OFFSETS[6:]))
        else:
            out.append(item)
    if j != last:
        return None
    out.extend(extra)
    return tuple(out)
