"""Consumer lag from what crosses kproxy: committed offsets and high watermarks, kept bounded (sans-IO).

:class:`ConsumerLag` keeps the last committed offset kproxy saw per (group, topic, partition) and
the last high watermark per (topic, partition), each with when it was seen (the caller's clock:
the session's, ``time.perf_counter``). What counts as either is
:mod:`kproxy.protocol.offsets`'s: an OffsetCommit the answer accepted, an OffsetFetch answer; a
Fetch answer, a ListOffsets answer for the latest offset at read_uncommitted.
:meth:`ConsumerLag.answer` reads them from the scans kproxy made anyway (the exchange's request
scan and the metrics' response scan, both in values mode): per answer, a pass over the
partition entries the scan found, no record touched.

Bounds: at most ``max_keys`` committed offsets and as many watermarks; a new key past that evicts
the one updated longest ago (counted in :attr:`ConsumerLag.evicted`). Each table is an
``OrderedDict`` kept in update order (a change moves its key to the end), so the oldest are first:
values older than ``stale_after`` are dropped from the front, at most once a second (each key
once: O(1) amortised), and a reader (:meth:`ConsumerLag.view`) leaves out any it finds stale, so a
value nobody refreshes disappears rather than freezes. (A plain dict would not do: deleting its
first keys leaves holes that every later look for the first key walks past.)

The tracker is updated on the event loop and read, by :meth:`view`, from the thread that
renders /metrics: the view copies each table with one ``list()`` (atomic under the GIL).
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TypeVar

from kproxy.protocol.offsets import (
    FETCH,
    LIST_OFFSETS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    Commit,
    Watermark,
    fetch_watermarks,
    latest_offsets,
    metadata_topic_ids,
    offset_commits,
    offset_fetches,
    values_of,
)
from kproxy.protocol.scan import RequestScan, Topic
from kproxy.protocol.topic_ids import METADATA_TOPIC_IDS, TopicIdNames

K = TypeVar("K")
TopicKey = str | int | None  # a name; a topic id not named yet (its int); None: a null name
DEFAULT_STALE_AFTER = 300.0  # seconds: a value not seen again for this long is no longer exported
MAX_KEYS = 50_000  # committed offsets kept, and as many watermarks (~10 MB each at most)
# A value seen again unchanged within this long keeps its place and time: most Fetch answers repeat
# the watermarks of idle partitions, and this spares them the move to the end (staleness is minutes).
REFRESH_SECONDS = 1.0
# Answers whose request's scan the tracker needs (read while the request frame is held) ...
LAG_REQUESTS = frozenset({OFFSET_COMMIT, OFFSET_FETCH, LIST_OFFSETS})
# ... and the answers it reads.
LAG_ANSWERS = frozenset({OFFSET_COMMIT, OFFSET_FETCH, LIST_OFFSETS, FETCH, METADATA})


@dataclass(frozen=True, slots=True)
class LagView:
    """What the tracker knew fresh at one moment, topic ids named where known.

    ``committed``: (group, topic, partition) -> offset; ``watermarks``: (topic, partition) -> offset;
    ``lag``: (group, topic, partition) -> watermark less committed offset, never below 0, for the
    partitions that have both (a commit past the last watermark seen means the log grew since: 0).
    """

    committed: dict[tuple[str, str, int], int] = field(default_factory=dict)
    watermarks: dict[tuple[str, int], int] = field(default_factory=dict)
    lag: dict[tuple[str, str, int], int] = field(default_factory=dict)


class ConsumerLag:
    """The committed offsets and high watermarks kproxy saw; see the module docstring."""

    def __init__(self, *, stale_after: float = DEFAULT_STALE_AFTER, max_keys: int = MAX_KEYS) -> None:
        self.stale_after = stale_after
        self.max_keys = max_keys
        # key -> (offset, seen at); in the order of their last update (oldest first).
        self.committed: OrderedDict[tuple[str, TopicKey, int], tuple[int, float]] = OrderedDict()
        self.watermarks: OrderedDict[tuple[TopicKey, int], tuple[int, float]] = OrderedDict()
        self._expired_at = 0.0  # when the tables were last cut of their stale front
        self.names = TopicIdNames()  # topic ids (Fetch v13+, OffsetCommit/OffsetFetch v10) -> names
        self.evicted = {"committed_offset": 0, "high_watermark": 0}
        self._last_metadata: object = None  # the Metadata scan learnt last (the metrics' memo repeats it)

    # -- updates (the event loop) ----------------------------------------------------
    def answer(self, api_key: int, api_version: int, request: RequestScan | None, response: RequestScan | None,
               now: float) -> None:
        """An answer of ``api_key`` reached its client: read what it and its request (their scans in
        values mode; None: not readable) say of committed offsets, watermarks and topic ids."""
        if api_key == FETCH:
            self.watermark(fetch_watermarks(values_of(response)), now)
        elif response is None:
            return
        elif api_key == OFFSET_COMMIT:
            self.commit(offset_commits(values_of(request), response[0]), now)
        elif api_key == OFFSET_FETCH:
            self.commit(offset_fetches(values_of(request), values_of(response), response[0], api_version), now)
        elif api_key == LIST_OFFSETS:
            self.watermark(latest_offsets(values_of(request), values_of(response)), now)
        elif api_key == METADATA and api_version >= METADATA_TOPIC_IDS and response is not self._last_metadata:
            # (Answers below v10 carry no topic ids, KIP-516: nothing to read in them.)
            self._last_metadata = response
            for topic_id, name in metadata_topic_ids(values_of(response)):
                self.names.learn(topic_id, name)

    def commit(self, commits: list[Commit], now: float) -> None:
        """Committed offsets seen at ``now``."""
        table = self.committed
        for group, topic, partition, offset in commits:
            self._put(table, (group, self._topic(topic), partition), offset, now, "committed_offset")
        if now - self._expired_at >= REFRESH_SECONDS:
            self._expire(now)

    def watermark(self, marks: list[Watermark], now: float) -> None:
        """High watermarks seen at ``now``: :meth:`_put`, inlined (every Fetch answer comes here)."""
        table = self.watermarks
        for topic, partition, offset in marks:
            key = (topic if type(topic) is str else self._topic(topic), partition)
            old = table.get(key)
            if old is None:
                if len(table) >= self.max_keys:
                    table.popitem(last=False)
                    self.evicted["high_watermark"] += 1
                table[key] = (offset, now)
            elif old[0] != offset or now - old[1] >= REFRESH_SECONDS:
                table[key] = (offset, now)
                table.move_to_end(key)
        if now - self._expired_at >= REFRESH_SECONDS:
            self._expire(now)

    def _topic(self, topic: Topic) -> TopicKey:
        """A topic as the tables key it: its name, or for an id not named yet the id's int (:meth:`view`
        names it if learnt later). Not the UUID itself: its hash is a Python call, and a key is hashed
        at every look-up of a table."""
        if isinstance(topic, uuid.UUID):
            name = self.names.get(topic)
            return topic.int if name is None else name
        return topic

    def _put(self, table: OrderedDict[K, tuple[int, float]], key: K, offset: int, now: float, kind: str) -> None:
        old = table.get(key)
        if old is not None:
            if old[0] == offset and now - old[1] < REFRESH_SECONDS:
                return
            table[key] = (offset, now)
            table.move_to_end(key)
            return
        if len(table) >= self.max_keys:
            table.popitem(last=False)
            self.evicted[kind] += 1
        table[key] = (offset, now)

    def _expire(self, now: float) -> None:
        """Drop the values not seen within ``stale_after`` (the tables' fronts)."""
        self._expired_at = now
        horizon = now - self.stale_after
        _expire_front(self.committed, horizon)
        _expire_front(self.watermarks, horizon)

    # -- reading (any thread) --------------------------------------------------------
    def view(self, now: float) -> LagView:
        """What is fresh at ``now`` (seen within ``stale_after``), topic ids named where known (a
        partition kept under both its id and its name counts once: the fresher)."""
        horizon = now - self.stale_after
        names = {topic_id.int: name for topic_id, name in list(self.names.items())}
        out = LagView()
        marks: dict[tuple[str, int], tuple[int, float]] = {}
        for (topic, partition), (offset, seen) in list(self.watermarks.items()):
            if seen >= horizon:
                _fresher(marks, (_name(topic, names), partition), offset, seen)
        commits: dict[tuple[str, str, int], tuple[int, float]] = {}
        for (group, topic, partition), (offset, seen) in list(self.committed.items()):
            if seen >= horizon:
                _fresher(commits, (group, _name(topic, names), partition), offset, seen)
        for tp, (offset, _) in marks.items():
            out.watermarks[tp] = offset
        for gtp, (offset, _) in commits.items():
            out.committed[gtp] = offset
            mark = marks.get((gtp[1], gtp[2]))
            if mark is not None:
                out.lag[gtp] = max(0, mark[0] - offset)
        return out


def _name(topic: TopicKey, names: dict[int, str]) -> str:
    """A table's topic key as a label: an id not named is its UUID text."""
    if type(topic) is int:
        return names.get(topic) or str(uuid.UUID(int=topic))
    return str(topic)


def _expire_front(table: OrderedDict[K, tuple[int, float]], horizon: float) -> None:
    while table:
        first = next(iter(table))
        if table[first][1] >= horizon:
            return
        del table[first]


def _fresher(table: dict[K, tuple[int, float]], key: K, offset: int, seen: float) -> None:
    old = table.get(key)
    if old is None or seen > old[1]:
        table[key] = (offset, seen)
