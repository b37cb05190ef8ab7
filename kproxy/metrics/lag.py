"""Consumer lag from what crosses kproxy: committed offsets and high watermarks, kept bounded (sans-IO).

:class:`ConsumerLag` keeps the last committed offset kproxy saw per (group, topic, partition), the
last high watermark per (topic, partition), and when it last saw each group, each with when it was
seen (the caller's clock: the session's, ``time.perf_counter``). What counts as either is
:mod:`kproxy.protocol.offsets`'s: an OffsetCommit the answer accepted, an OffsetFetch answer; a
Fetch answer, a ListOffsets answer for the latest offset at read_uncommitted, a Produce answer (the
log end offset after the append). :meth:`ConsumerLag.answer` and :meth:`ConsumerLag.produce_answer`
read them from the scans kproxy made anyway (the exchange's request scan and the metrics' response
scan, both in values mode): per answer, a pass over the partition entries the scan found, no
record touched.

Staleness. A watermark is a reading of the partition: one not seen again within ``stale_after``
is dropped. A committed offset is the group's state, not a reading: it stays while kproxy keeps
seeing the group (:meth:`ConsumerLag.group_request`: any request of
:data:`~kproxy.protocol.offsets.GROUP_REQUESTS`, its group id read in place; a Heartbeat every few
seconds while the member lives), so a consumer that stopped consuming but whose client still
heartbeats keeps its growing lag. It goes ``stale_after`` after the later of its last commit and
the group's last sighting, with one exception: a JoinGroup (a rebalance) ends the keeping of the
offsets committed before it. After a rebalance every member asks the offsets of the
partitions it now has (OffsetFetch), which keeps those; a partition now consumed through another
kproxy (sidecars: one per member) then ages out here instead of showing a lag that only grows.
A LeaveGroup is no sighting: the offsets of a group whose members all left go after the window.

Bounds: at most ``max_keys`` committed offsets, as many watermarks and as many groups; a new key
past that evicts the one updated longest ago (counted in :attr:`ConsumerLag.evicted`). Each table
is an ``OrderedDict`` kept in update order (a change moves its key to the end), so the oldest are
first: values older than ``stale_after`` are dropped from the front, at most once a second (each
key once: O(1) amortised). A committed offset its group still keeps is put back at the end instead,
stamped with the time it was put back (so each is looked at once a window), at most
:data:`REQUEUE_PER_PASS` a pass. A reader (:meth:`ConsumerLag.view`) leaves out any it finds
stale, so a value nobody refreshes disappears rather than freezes. (A plain dict would not do:
deleting its first keys leaves holes that every later look for the first key walks past.)

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
    JOIN_GROUP,
    LIST_OFFSETS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    OFFSET_FETCH_GROUPS,
    PRODUCE,
    Commit,
    Produced,
    ScanEntries,
    Watermark,
    fetch_watermarks,
    group_ids,
    latest_offsets,
    metadata_topic_ids,
    offset_commits,
    offset_fetches,
    produce_end_offsets,
    values_of,
)
from kproxy.protocol.request_fields import request_group_id
from kproxy.protocol.scan import RequestScan, Topic
from kproxy.protocol.topic_ids import METADATA_TOPIC_IDS, TopicIdNames

K = TypeVar("K")
TopicKey = str | int | None  # a name; a topic id not named yet (its int); None: a null name
DEFAULT_STALE_AFTER = 300.0  # seconds: a value not seen again for this long is no longer exported
MAX_KEYS = 50_000  # committed offsets kept, and as many watermarks (~10 MB each at most)
# A value seen again unchanged within this long keeps its place and time: most Fetch answers repeat
# the watermarks of idle partitions, and this spares them the move to the end (staleness is minutes).
REFRESH_SECONDS = 1.0
# Committed offsets their group keeps that one expiry pass puts back at the end, at most (the rest wait
# for the next pass, a second later): a pass stays well under a millisecond whatever the table holds.
REQUEUE_PER_PASS = 1024
NEVER = float("-inf")  # a group's rebalance time when kproxy saw none
# Requests whose scan the tracker needs (read while the request frame is held) ...
LAG_REQUESTS = frozenset({OFFSET_COMMIT, OFFSET_FETCH, LIST_OFFSETS})
# ... and the answers it reads (Produce's with the request's record counts, ObserverMemo.produced).
LAG_ANSWERS = frozenset({OFFSET_COMMIT, OFFSET_FETCH, LIST_OFFSETS, FETCH, METADATA, PRODUCE})


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
        self._unchanged_within = min(REFRESH_SECONDS, stale_after)  # a value seen again within this: left as is
        # key -> (offset, seen at, queued at: seen at, or when its group kept it); in queued order.
        self.committed: OrderedDict[tuple[str, TopicKey, int], tuple[int, float, float]] = OrderedDict()
        # key -> (offset, seen at); in the order of their last update (oldest first).
        self.watermarks: OrderedDict[tuple[TopicKey, int], tuple[int, float]] = OrderedDict()
        # group -> (last seen, its last rebalance seen: NEVER if none); in the order of their last sighting.
        self.groups: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._expired_at = 0.0  # when the tables were last cut of their stale front
        self.names = TopicIdNames()  # topic ids (Fetch and Produce v13+, OffsetCommit/OffsetFetch v10) -> names
        self.evicted = {"committed_offset": 0, "high_watermark": 0, "group": 0}
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

    def produce_answer(self, produced: list[Produced], response: RequestScan | None, now: float) -> None:
        """A Produce answer reached its client: the log end offsets it gives (its scan in values mode,
        ``produced``: the records its request carried per partition). One only moves a watermark
        forward: the answers of producers on other connections reach kproxy in any order, and a
        lower one is older (a watermark not seen within ``stale_after`` is replaced whatever it was:
        a topic deleted and made again starts low)."""
        if response is None:
            return
        entries = response[0]
        values = entries.values if type(entries) is ScanEntries else None
        table = self.watermarks
        if values is not None and len(values) == 1 and len(produced) == 1:
            # A producer's usual answer, one partition: produce_end_offsets and the loop below, inlined.
            topic, partition, n = produced[0]
            item = values[0]
            if (len(item) != 4 or item[1] != partition or item[2] or type(item[3]) is not int or item[3] < 0
                    or n <= 0 or item[0] != topic):
                return
            offset = item[3] + n
            key = (topic if type(topic) is str else self._topic(topic), partition)
            old = table.get(key)
            if old is not None and offset <= old[0] and now - old[1] < self._unchanged_within:
                return  # (the same end, seen within a second, or an older one: nothing to do)
            marks = [(topic, partition, offset)]
        else:
            marks = produce_end_offsets(produced, values)
        horizon = now - self.stale_after
        for topic, partition, offset in marks:
            key = (topic if type(topic) is str else self._topic(topic), partition)
            old = table.get(key)
            if old is None:
                if len(table) >= self.max_keys:
                    table.popitem(last=False)
                    self.evicted["high_watermark"] += 1
                table[key] = (offset, now)
            elif offset > old[0] or old[1] < horizon or (offset == old[0] and now - old[1] >= REFRESH_SECONDS):
                table[key] = (offset, now)
                table.move_to_end(key)
        if now - self._expired_at >= REFRESH_SECONDS:
            self._expire(now)

    def group_request(self, api_key: int, api_version: int, frame: bytes, body_offset: int | None,
                      scan: RequestScan | None, now: float) -> None:
        """A request of :data:`~kproxy.protocol.offsets.GROUP_REQUESTS` was read at ``now`` (``frame``,
        its body at ``body_offset``; ``scan``: the request's scan, for an OffsetFetch v8+, which names
        several groups): the groups it names are there; a JoinGroup's is rebalancing (see the module
        docstring)."""
        if api_key == OFFSET_FETCH and api_version >= OFFSET_FETCH_GROUPS:
            for group in group_ids(values_of(scan)):
                self.sighted(group, now)
            return
        named = request_group_id(frame, api_key, api_version, body_offset)
        if named is not None:
            self.sighted(named, now, api_key == JOIN_GROUP)

    def sighted(self, group: str, now: float, rebalance: bool = False) -> None:
        """``group`` was seen at ``now`` (``rebalance``: a member joining it: see the module docstring)."""
        table = self.groups
        old = table.get(group)
        if old is None:
            if len(table) >= self.max_keys:
                table.popitem(last=False)
                self.evicted["group"] += 1
            table[group] = (now, now if rebalance else NEVER)
        elif rebalance or now - old[0] >= REFRESH_SECONDS:
            table[group] = (now, now if rebalance else old[1])
            table.move_to_end(group)
        if now - self._expired_at >= REFRESH_SECONDS:
            self._expire(now)

    def commit(self, commits: list[Commit], now: float) -> None:
        """Committed offsets seen at ``now``."""
        table = self.committed
        for group, topic, partition, offset in commits:
            key = (group, self._topic(topic), partition)
            old = table.get(key)
            if old is not None:
                if old[0] == offset and now - old[1] < REFRESH_SECONDS:
                    continue
                table[key] = (offset, now, now)
                table.move_to_end(key)
                continue
            if len(table) >= self.max_keys:
                table.popitem(last=False)
                self.evicted["committed_offset"] += 1
            table[key] = (offset, now, now)
        if now - self._expired_at >= REFRESH_SECONDS:
            self._expire(now)

    def watermark(self, marks: list[Watermark], now: float) -> None:
        """High watermarks seen at ``now`` (every Fetch answer comes here)."""
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

    def _expire(self, now: float) -> None:
        """Drop the values not seen within ``stale_after`` (the tables' fronts); put back at the end
        the committed offsets their group keeps (see the module docstring)."""
        self._expired_at = now
        horizon = now - self.stale_after
        _expire_front(self.watermarks, horizon)
        groups = self.groups
        while groups:
            first = next(iter(groups))
            if groups[first][0] >= horizon:
                break
            del groups[first]
        table = self.committed
        requeued = 0
        while table:
            key = next(iter(table))
            offset, seen, queued = table[key]
            if queued >= horizon:
                return
            group = groups.get(key[0])
            if group is None or group[0] < horizon or seen < group[1]:
                del table[key]
            elif requeued >= REQUEUE_PER_PASS:
                return
            else:
                table[key] = (offset, seen, now)
                table.move_to_end(key)
                requeued += 1

    # -- reading (any thread) --------------------------------------------------------
    def view(self, now: float) -> LagView:
        """What is fresh at ``now`` (seen within ``stale_after``; a committed offset, or kept by its
        group: see the module docstring), topic ids named where known (a partition kept under both
        its id and its name counts once: the fresher)."""
        horizon = now - self.stale_after
        names = {topic_id.int: name for topic_id, name in list(self.names.items())}
        out = LagView()
        marks: dict[tuple[str, int], tuple[int, float]] = {}
        for (topic, partition), (offset, seen) in list(self.watermarks.items()):
            if seen >= horizon:
                _fresher(marks, (_name(topic, names), partition), offset, seen)
        groups = dict(list(self.groups.items()))
        commits: dict[tuple[str, str, int], tuple[int, float]] = {}
        for (group, topic, partition), (offset, seen, _) in list(self.committed.items()):
            if seen < horizon:  # not committed within the window: kept while its group is seen (module docstring)
                kept = groups.get(group)
                if kept is None or kept[0] < horizon or seen < kept[1]:
                    continue
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
