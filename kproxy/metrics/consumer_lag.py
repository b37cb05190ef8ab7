"""Consumer lag from what crosses kproxy: committed offsets and high watermarks, kept bounded (sans-IO).

:class:`ConsumerLag` keeps the last committed offset kproxy saw per (group, topic, partition), the
last high watermark per (topic, partition), and when it last saw each group, each with when it was
seen (the caller's clock: the session's, ``time.perf_counter``). What counts as either is
:mod:`kproxy.protocol.offset_reads`'s: an OffsetCommit the answer accepted, an OffsetFetch answer; a
Fetch answer, a ListOffsets answer for the latest offset at read_uncommitted, a Produce answer (the
log end offset after the append). :meth:`ConsumerLag.answer` and :meth:`ConsumerLag.produce_answer`
read them from the scans kproxy made anyway (the exchange's request scan and the metrics' response
scan, both in values mode): per answer, a pass over the partition entries the scan found, no
record touched.

Lag in time. A Produce answer also dates the offsets it gave: the request's v2 batch headers carry
their max timestamp (milliseconds since the epoch: the producers' CreateTime, or whatever time they
set), read in place with the record counts (:func:`~kproxy.protocol.offset_reads.produce_record_counts`);
and a Fetch answer's batch headers carry the same for the offsets they hold (their base offsets,
last offset deltas and max timestamps: :meth:`ConsumerLag.fetch_answer`), so a partition whose
producers write around kproxy and whose consumers read through it is dated too.
:attr:`ConsumerLag.written` keeps, per partition, at most :data:`WRITTEN_POINTS` such points
``(first offset, last offset, timestamp)``, at most one a second; a full table drops one between two
others (:func:`_thin`: the recent past stays dense). :meth:`ConsumerLag.view` gives a group's lag
in seconds on a partition as the time since its committed offset was written (:func:`written_at`:
the point holding it, else the nearest). Rates: each committed offset and watermark carries the
offset and time a rate window began and the last whole window's records a second
(:func:`_progress`, windows of :data:`RATE_WINDOW` at least), read by the time to catch up.

Staleness. A watermark is a reading of the partition: one not seen again within ``stale_after``
is dropped. A committed offset is the group's state, not a reading: it stays while kproxy keeps
seeing the group, so a consumer that stopped consuming but whose client still heartbeats keeps its
growing lag. A sighting is what the broker confirmed of the group, never a request alone
(:meth:`ConsumerLag.group_answer`): an answer without error to a request of
:data:`~kproxy.protocol.offset_reads.GROUP_REQUESTS` (a member the coordinator accepted: a Heartbeat
every few seconds while it lives), an offset an OffsetCommit answer accepted, a committed offset
an OffsetFetch answer reports. A committed offset goes ``stale_after`` after the later of its
last commit and the group's last sighting, with one exception: an accepted JoinGroup (a
rebalance) ends the keeping of the offsets committed before it. After a rebalance every member
asks the offsets of the partitions it now has (OffsetFetch), which keeps those; a partition now
consumed through another kproxy (sidecars: one per member) then ages out here instead of showing
a lag that only grows. A LeaveGroup is no sighting: the offsets of a group whose members all left
go after the window.

Bounds, whatever clients send. A group id or topic name longer than :data:`MAX_ID_LENGTH` is kept
cut (:func:`bounded_id`: its start, ``~`` and a digest of the whole, so two long ids stay apart;
its label is cut as every label is). Each table holds at most ``max_keys`` keys and at most
``max_bytes`` of estimated memory (:data:`ENTRY_BYTES` per entry besides its strings, which are
counted at their size: an estimate on the high side; a partition's write times are charged for all
the points it may hold); a new key past either bound evicts the ones
updated longest ago (counted in :attr:`ConsumerLag.evicted`). Each table is an ``OrderedDict``
kept in update order (a change moves its key to the end), so the oldest are first: values older
than ``stale_after`` are dropped from the front, at most once a second (each key once: O(1)
amortised). A committed offset its group still keeps is put back at the end instead, stamped with
the time it was put back (so each is looked at once a window), at most :data:`REQUEUE_PER_PASS` a
pass. A reader (:meth:`ConsumerLag.view`) leaves out any it finds stale, so a value nobody
refreshes disappears rather than freezes. (A plain dict would not do: deleting its first keys
leaves holes that every later look for the first key walks past.)

The tracker is updated on the event loop and read, by :meth:`view`, from the thread that
renders /metrics: the view copies each table with one ``list()`` (atomic under the GIL).
"""

from __future__ import annotations

import hashlib
import sys
import time
import uuid
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from kproxy.protocol.api_keys import FETCH, JOIN_GROUP, LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH, PRODUCE
from kproxy.protocol.offset_reads import (
    FETCH_SPANS,
    GROUP_REQUESTS,
    Commit,
    Produced,
    Watermark,
    batches_written,
    fetch_watermarks,
    latest_offsets,
    metadata_topic_ids,
    offset_commits,
    offset_fetches,
    produce_appends,
    values_of,
)
from kproxy.protocol.request_fields import request_group_id
from kproxy.protocol.scan import RequestScan, Topic
from kproxy.protocol.scan_types import ScanEntries
from kproxy.protocol.topic_ids import METADATA_TOPIC_IDS, TopicIdNames

K = TypeVar("K")
V = TypeVar("V")
TopicKey = str | int | None  # a name; a topic id not named yet (its int); None: a null name
DEFAULT_STALE_AFTER = 300.0  # seconds: a value not seen again for this long is no longer exported
MAX_KEYS = 50_000  # committed offsets kept, and as many watermarks and groups
# Each table's estimated memory, at most: some 35,000 committed offsets of a group id of 50 characters
# and a short topic name (the key cap binds first for shorter ids; ids of 255, the longest kept, fill it
# at some 20,000).
MAX_TABLE_BYTES = 16 * 1024 * 1024
# An entry's own memory besides its strings (the table's slot and link, the key and value tuples,
# the numbers and rate fields), rounded up from what tracemalloc counts per entry of a large table in
# the compiled build (which boxes each float of a value on its own).
ENTRY_BYTES = 320
# A group id or topic name kept whole up to this long (Kafka refuses topic names past 249); a
# longer one, sent by a client (up to 32 KiB on the wire), is kept cut (bounded_id).
MAX_ID_LENGTH = 255
_DIGEST_CHARS = 16  # hex digits of a cut id's digest: two cut ids with one start stay apart
# A value seen again unchanged within this long keeps its place and time: most Fetch answers repeat
# the watermarks of idle partitions, and this spares them the move to the end (staleness is minutes).
REFRESH_SECONDS = 1.0
# Committed offsets their group keeps that one expiry pass puts back at the end, at most (the rest wait
# for the next pass, a second later): a pass stays well under a millisecond whatever the table holds.
REQUEUE_PER_PASS = 1024
NEVER = float("-inf")  # a group's rebalance time when kproxy saw none
# Write times kept per partition, at most: (first offset, last offset, max timestamp) of as many
# accepted Produce appends, at most one taken a second (REFRESH_SECONDS); past this, one between two
# others is dropped, the one whose neighbours are closest in time for its age (see _thin).
WRITTEN_POINTS = 24
# A point's memory: three 8-byte ints of an array; a partition's entry is charged for WRITTEN_POINTS
# of them from the start (and the array's own header), so its cost never changes.
POINT_BYTES = 24
ARRAY_BYTES = 96
# The consume and produce rates are measured over windows at least this long (a group's commits
# come every few seconds: auto-commit's default is 5 s).
RATE_WINDOW = 5.0
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
    ``lag_seconds``: (group, topic, partition) -> how long before the view's wall-clock time the
    first record the group has not committed was written (0 where ``lag`` is 0), for the partitions
    of ``lag`` kproxy saw write times of (:func:`written_at`); ``consumed``: (group,
    topic, partition) -> records a second the group's committed offset moved by lately, and
    ``produced``: (topic, partition) -> records a second the watermark moved by lately (both over
    :data:`RATE_WINDOW` at least; 0 when they did not move within it).
    """

    committed: dict[tuple[str, str, int], int] = field(default_factory=dict)
    watermarks: dict[tuple[str, int], int] = field(default_factory=dict)
    lag: dict[tuple[str, str, int], int] = field(default_factory=dict)
    lag_seconds: dict[tuple[str, str, int], float] = field(default_factory=dict)
    consumed: dict[tuple[str, str, int], float] = field(default_factory=dict)
    produced: dict[tuple[str, int], float] = field(default_factory=dict)


class ConsumerLag:
    """The committed offsets and high watermarks kproxy saw; see the module docstring."""

    def __init__(self, *, stale_after: float = DEFAULT_STALE_AFTER, max_keys: int = MAX_KEYS,
                 max_bytes: int = MAX_TABLE_BYTES) -> None:
        self.stale_after = stale_after
        self.max_keys = max_keys
        self.max_bytes = max_bytes  # each table's estimated memory, at most (see the module docstring)
        self._unchanged_within = min(REFRESH_SECONDS, stale_after)  # a value seen again within this: left as is
        # key -> (offset, seen at, queued at: seen at, or when its group kept it, and its rate: see
        # _progress); in queued order.
        self.committed: OrderedDict[tuple[str, TopicKey, int], tuple[int, float, float, int, float, float]] = \
            OrderedDict()
        # key -> (offset, seen at, and its rate: see _progress); in the order of their last update (oldest first).
        self.watermarks: OrderedDict[tuple[TopicKey, int], tuple[int, float, int, float, float]] = OrderedDict()
        # key -> (points: first offset, last offset, max timestamp of each append taken, flat and in
        # offset order; when the last was taken); in the order of their last update (oldest first).
        self.written: OrderedDict[tuple[TopicKey, int], tuple[array[int], float]] = OrderedDict()
        # group -> (last seen, its last rebalance seen: NEVER if none); in the order of their last sighting.
        self.groups: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._expired_at = 0.0  # when the tables were last cut of their stale front
        self.names = TopicIdNames()  # topic ids (Fetch and Produce v13+, OffsetCommit/OffsetFetch v10) -> names
        self.evicted = {"committed_offset": 0, "high_watermark": 0, "group": 0, "write_time": 0}
        # Each table's estimated memory (_committed_cost, _watermark_cost, _group_cost, _written_cost summed).
        self.committed_bytes = 0
        self.watermark_bytes = 0
        self.group_bytes = 0
        self.written_bytes = 0
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
            self.commit(offset_commits(values_of(request), response[0]), now, True)
        elif api_key == OFFSET_FETCH:
            self.commit(offset_fetches(values_of(request), values_of(response), response[0], api_version), now,
                        True)
        elif api_key == LIST_OFFSETS:
            self.watermark(latest_offsets(values_of(request), values_of(response)), now)
        elif api_key == METADATA and api_version >= METADATA_TOPIC_IDS and response is not self._last_metadata:
            # (Answers below v10 carry no topic ids, KIP-516: nothing to read in them.)
            self._last_metadata = response
            for topic_id, name in metadata_topic_ids(values_of(response)):
                self.names.learn(topic_id, name)

    def fetch_answer(self, frame: bytes, response: RequestScan | None, now: float) -> None:
        """A Fetch answer (``frame``; ``response``: its scan in values mode) reached its client: when
        the offsets of its records were written, a second source of write times beside Produce answers
        (a partition written around kproxy and read through it): up to
        :data:`~kproxy.protocol.offset_reads.FETCH_SPANS` points a partition, its batches split among
        them. Its records ranges pair with its
        partitions' entries one to one only when every partition carried records (a range per
        partition, in the body's order): other answers are not read for it. A partition whose last
        point was taken within a second is left before its headers are read
        (:func:`~kproxy.protocol.offset_reads.batches_written`)."""
        if response is None:
            return
        ranges = response[1]
        if not ranges:
            return
        entries = response[0]
        values = entries.values if type(entries) is ScanEntries else None
        if values is None or len(values) != len(ranges):
            return
        points = self.written
        for i in range(len(ranges)):  # (paired by index: their lengths are equal, checked above)
            item, span = values[i], ranges[i]
            topic, partition = item[0], item[1]
            # (Two checks, not one against ``str | uuid.UUID``: that union is an object made at each call.)
            if (len(item) != 4 or item[2] or type(partition) is not int
                    or not (type(topic) is str or isinstance(topic, uuid.UUID))):
                continue
            key = (topic if type(topic) is str and len(topic) <= MAX_ID_LENGTH else self._topic(topic), partition)
            kept = points.get(key)
            if kept is not None and now - kept[1] < REFRESH_SECONDS:
                continue
            for first, last, stamp in batches_written(frame, span[0], span[1], FETCH_SPANS):
                if stamp >= 0:
                    self._write(key, first, last, stamp, now)

    def produce_answer(self, produced: list[Produced], response: RequestScan | None, now: float) -> None:
        """A Produce answer reached its client: the log end offsets it gives (its scan in values mode,
        ``produced``: the records its request carried per partition, and their batches' max timestamp),
        and when those offsets were written (:meth:`written_at`). One only moves a watermark
        forward: the answers of producers on other connections reach kproxy in any order, and a
        lower one is older (a watermark not seen within ``stale_after`` is replaced whatever it was:
        a topic deleted and made again starts low)."""
        if response is None:
            return
        entries = response[0]
        values = entries.values if type(entries) is ScanEntries else None
        table = self.watermarks
        if values is not None and len(values) == 1 and len(produced) == 1:
            # A producer's usual answer, one partition: produce_appends and the loop below, inlined.
            topic, partition, n, written = produced[0]
            item = values[0]
            if (len(item) != 4 or item[1] != partition or item[2] or type(item[3]) is not int or item[3] < 0
                    or n <= 0 or item[0] != topic):
                return
            base = item[3]
            offset = base + n
            key = (topic if type(topic) is str and len(topic) <= MAX_ID_LENGTH else self._topic(topic), partition)
            old = table.get(key)
            if old is not None and offset <= old[0] and now - old[1] < self._unchanged_within:
                return  # (the same end, seen within a second, or an older one: nothing to do)
            appends = [(topic, partition, base, n, written)]
        else:
            appends = produce_appends(produced, values)
        horizon = now - self.stale_after
        points = self.written
        for topic, partition, base, n, written in appends:
            offset = base + n
            key = (topic if type(topic) is str and len(topic) <= MAX_ID_LENGTH else self._topic(topic), partition)
            old = table.get(key)
            if old is None:
                self._new_watermark(key, offset, now)
            elif offset > old[0] or old[1] < horizon or (offset == old[0] and now - old[1] >= REFRESH_SECONDS):
                if now - old[3] >= RATE_WINDOW:  # (_progress, inlined: one call less an answer)
                    table[key] = (offset, now, offset, now, max(0.0, (offset - old[2]) / (now - old[3])))
                else:
                    table[key] = (offset, now, old[2], old[3], old[4])
                table.move_to_end(key)
            if written >= 0:
                kept = points.get(key)
                if kept is None or now - kept[1] >= REFRESH_SECONDS:  # (at most one point a second)
                    self._write(key, base, offset - 1, written, now)
        if now - self._expired_at >= REFRESH_SECONDS:
            self._expire(now)

    @staticmethod
    def group_named(api_key: int, api_version: int, frame: bytes, body_offset: int | None) -> str | None:
        """The group a request of :data:`~kproxy.protocol.offset_reads.GROUP_REQUESTS` names (``frame``, its
        body at ``body_offset``), as the tables key it (:func:`bounded_id`); None: not readable. Read
        while the frame is held; :meth:`group_answer` takes it with the answer."""
        named = request_group_id(frame, api_key, api_version, body_offset)
        return None if named is None else bounded_id(named)

    def group_answer(self, api_key: int, group: str, response: RequestScan | None, now: float) -> None:
        """The broker answered, at ``now``, a request of :data:`~kproxy.protocol.offset_reads.GROUP_REQUESTS`
        naming ``group`` (:meth:`group_named`); ``response``: the answer's scan (None: not read). An
        answer without error code is a sighting (an accepted JoinGroup: a rebalance); any other says
        nothing of the group (see the module docstring)."""
        if response is None or response[0] or api_key not in GROUP_REQUESTS:
            return  # (an errors-only scan lists the non-zero codes: none, the answer accepted the request)
        self.sighted(group, now, api_key == JOIN_GROUP)

    def sighted(self, group: str, now: float, rebalance: bool = False) -> None:
        """``group`` (as the tables key it: :func:`bounded_id`) was seen at ``now`` (``rebalance``: a
        member joined it: see the module docstring)."""
        table = self.groups
        old = table.get(group)
        if old is None:
            cost = _group_cost(group)
            if len(table) >= self.max_keys or self.group_bytes + cost > self.max_bytes:
                freed, n = _evict(table, self.max_keys, self.max_bytes - self.group_bytes - cost, _group_cost)
                self.group_bytes -= freed
                self.evicted["group"] += n
            table[group] = (now, now if rebalance else NEVER)
            self.group_bytes += cost
        elif rebalance or now - old[0] >= REFRESH_SECONDS:
            table[group] = (now, now if rebalance else old[1])
            table.move_to_end(group)
        if now - self._expired_at >= REFRESH_SECONDS:
            self._expire(now)

    def commit(self, commits: list[Commit], now: float, sighting: bool = False) -> None:
        """Committed offsets seen at ``now`` (``sighting``: the broker's answer confirmed them, which
        is a sighting of their groups too: see the module docstring)."""
        table = self.committed
        last_group: str | None = None
        for group, topic, partition, offset in commits:
            if len(group) > MAX_ID_LENGTH:
                group = bounded_id(group)
            if sighting and group != last_group:
                last_group = group
                self.sighted(group, now)
            key = (group, self._topic(topic), partition)
            old = table.get(key)
            if old is not None:
                if old[0] == offset and now - old[1] < REFRESH_SECONDS:
                    continue
                anchor, anchored_at, rate = _progress(offset, now, old[3], old[4], old[5])
                table[key] = (offset, now, now, anchor, anchored_at, rate)
                table.move_to_end(key)
                continue
            cost = _committed_cost(key)
            if len(table) >= self.max_keys or self.committed_bytes + cost > self.max_bytes:
                freed, n = _evict(table, self.max_keys, self.max_bytes - self.committed_bytes - cost, _committed_cost)
                self.committed_bytes -= freed
                self.evicted["committed_offset"] += n
            table[key] = (offset, now, now, offset, now, 0.0)
            self.committed_bytes += cost
        if now - self._expired_at >= REFRESH_SECONDS:
            self._expire(now)

    def watermark(self, marks: list[Watermark], now: float) -> None:
        """High watermarks seen at ``now`` (every Fetch answer comes here)."""
        table = self.watermarks
        for topic, partition, offset in marks:
            key = (topic if type(topic) is str and len(topic) <= MAX_ID_LENGTH else self._topic(topic), partition)
            old = table.get(key)
            if old is None:
                self._new_watermark(key, offset, now)
            elif old[0] != offset or now - old[1] >= REFRESH_SECONDS:
                anchor, anchored_at, rate = _progress(offset, now, old[2], old[3], old[4])
                table[key] = (offset, now, anchor, anchored_at, rate)
                table.move_to_end(key)
        if now - self._expired_at >= REFRESH_SECONDS:
            self._expire(now)

    def _new_watermark(self, key: tuple[TopicKey, int], offset: int, now: float) -> None:
        """A partition's first watermark (or its first since it went): room made for it, then kept."""
        table = self.watermarks
        cost = _watermark_cost(key)
        if len(table) >= self.max_keys or self.watermark_bytes + cost > self.max_bytes:
            freed, n = _evict(table, self.max_keys, self.max_bytes - self.watermark_bytes - cost, _watermark_cost)
            self.watermark_bytes -= freed
            self.evicted["high_watermark"] += n
        table[key] = (offset, now, offset, now, 0.0)
        self.watermark_bytes += cost

    def _write(self, key: tuple[TopicKey, int], first: int, last: int, timestamp: int, now: float) -> None:
        """Offsets ``first`` to ``last`` of a partition were written at ``timestamp`` (ms since the
        epoch: their batches' max timestamp), seen at ``now``: kept as a point of the partition's write
        times unless they are not past its last point (an answer that reached kproxy late, or a
        consumer behind re-reading them: its offsets are known already) while not below its first
        (below: the log restarted lower: a topic deleted and made again, its points start over). Known
        offsets still count as a look at the partition (its time is ``now``): the callers read a
        partition's batch headers at most once a second from that time, and a consumer behind the
        partition's last point would otherwise have them read at every Fetch answer, to learn nothing."""
        table = self.written
        kept = table.get(key)
        if kept is None:
            cost = _written_cost(key)
            if len(table) >= self.max_keys or self.written_bytes + cost > self.max_bytes:
                freed, n = _evict(table, self.max_keys, self.max_bytes - self.written_bytes - cost, _written_cost)
                self.written_bytes -= freed
                self.evicted["write_time"] += n
            table[key] = (array("q", (first, last, timestamp)), now)
            self.written_bytes += cost
            return
        points = kept[0]
        if first <= points[-2]:
            if last >= points[0]:
                table[key] = (points, now)
                table.move_to_end(key)
                return
            points = array("q")
        elif len(points) >= 3 * WRITTEN_POINTS:
            _thin(points, timestamp)
        points.extend((first, last, timestamp))
        table[key] = (points, now)
        table.move_to_end(key)

    def _topic(self, topic: Topic) -> TopicKey:
        """A topic as the tables key it: its name, or for an id not named yet the id's int (:meth:`view`
        names it if learnt later). Not the UUID itself: its hash is a Python call, and a key is hashed
        at every look-up of a table."""
        if isinstance(topic, uuid.UUID):
            name = self.names.get(topic)
            return topic.int if name is None else bounded_id(name)
        if topic is not None and len(topic) > MAX_ID_LENGTH:
            return bounded_id(topic)
        return topic

    def _expire(self, now: float) -> None:
        """Drop the values not seen within ``stale_after`` (the tables' fronts); put back at the end
        the committed offsets their group keeps (see the module docstring)."""
        self._expired_at = now
        horizon = now - self.stale_after
        self.watermark_bytes -= _expire_front(self.watermarks, horizon, _watermark_cost)
        self.written_bytes -= _expire_front(self.written, horizon, _written_cost)
        groups = self.groups
        while groups:
            first = next(iter(groups))
            if groups[first][0] >= horizon:
                break
            del groups[first]
            self.group_bytes -= _group_cost(first)
        table = self.committed
        requeued = 0
        while table:
            key = next(iter(table))
            offset, seen, queued, anchor, anchored_at, rate = table[key]
            if queued >= horizon:
                return
            group = groups.get(key[0])
            if group is None or group[0] < horizon or seen < group[1]:
                del table[key]
                self.committed_bytes -= _committed_cost(key)
            elif requeued >= REQUEUE_PER_PASS:
                return
            else:
                table[key] = (offset, seen, now, anchor, anchored_at, rate)
                table.move_to_end(key)
                requeued += 1

    # -- reading (any thread) --------------------------------------------------------
    def view(self, now: float, wall: float | None = None) -> LagView:
        """What is fresh at ``now`` (seen within ``stale_after``; a committed offset, or kept by its
        group: see the module docstring), topic ids named where known (a partition kept under both
        its id and its name counts once: the fresher); lag in seconds at the wall-clock time ``wall``
        (seconds since the epoch; None: ``time.time()``)."""
        if wall is None:
            wall = time.time()
        horizon = now - self.stale_after
        names = {topic_id.int: name for topic_id, name in list(self.names.items())}
        out = LagView()
        marks: dict[tuple[str, int], tuple[int, float, float]] = {}
        for (topic, partition), (offset, seen, anchor, anchored_at, rate) in list(self.watermarks.items()):
            if seen >= horizon:
                _fresher(marks, (_name(topic, names), partition), offset, seen,
                         _rate(offset, now, anchor, anchored_at, rate))
        points: dict[tuple[str, int], tuple[array[int], float, float]] = {}
        for (topic, partition), (kept, seen) in list(self.written.items()):
            if seen >= horizon:
                _fresher(points, (_name(topic, names), partition), kept[:], seen, 0.0)
        groups = dict(list(self.groups.items()))
        commits: dict[tuple[str, str, int], tuple[int, float, float]] = {}
        for (group, topic, partition), (offset, seen, _, anchor, anchored_at, rate) in list(self.committed.items()):
            if seen < horizon:  # not committed within the window: kept while its group is seen (module docstring)
                kept_group = groups.get(group)
                if kept_group is None or kept_group[0] < horizon or seen < kept_group[1]:
                    continue
            _fresher(commits, (group, _name(topic, names), partition), offset, seen,
                     _rate(offset, now, anchor, anchored_at, rate))
        for tp, (offset, _, produced) in marks.items():
            out.watermarks[tp] = offset
            out.produced[tp] = produced
        for gtp, (offset, _, consumed) in commits.items():
            out.committed[gtp] = offset
            out.consumed[gtp] = consumed
            tp = (gtp[1], gtp[2])
            mark = marks.get(tp)
            if mark is not None:
                lag = out.lag[gtp] = max(0, mark[0] - offset)
                if lag == 0:
                    out.lag_seconds[gtp] = 0.0
                else:
                    written = points.get(tp)
                    if written is not None:
                        out.lag_seconds[gtp] = max(0.0, wall - written_at(written[0], offset) / 1000)
        return out


def _name(topic: TopicKey, names: dict[int, str]) -> str:
    """A table's topic key as a label: an id not named is its UUID text."""
    if type(topic) is int:
        name = names.get(topic)
        return str(uuid.UUID(int=topic)) if name is None else bounded_id(name)
    return str(topic)


def bounded_id(text: str) -> str:
    """A group id or topic name as the tables key it: as it is up to :data:`MAX_ID_LENGTH` characters;
    longer, its start, ``~`` and a digest of the whole, that long (two ids that share their start stay
    two keys; their labels, cut shorter still, are told apart as any two labels cut alike are)."""
    if len(text) <= MAX_ID_LENGTH:
        return text
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=_DIGEST_CHARS // 2).hexdigest()
    return text[:MAX_ID_LENGTH - _DIGEST_CHARS - 1] + "~" + digest


def _committed_cost(key: tuple[str, TopicKey, int]) -> int:
    """A committed offset's estimated memory (see :data:`ENTRY_BYTES`)."""
    return ENTRY_BYTES + sys.getsizeof(key[0]) + sys.getsizeof(key[1])


def _watermark_cost(key: tuple[TopicKey, int]) -> int:
    return ENTRY_BYTES + sys.getsizeof(key[0])


def _group_cost(group: str) -> int:
    return ENTRY_BYTES + sys.getsizeof(group)


def _written_cost(key: tuple[TopicKey, int]) -> int:
    """A partition's write times, charged for all the points it may hold."""
    return ENTRY_BYTES + sys.getsizeof(key[0]) + ARRAY_BYTES + WRITTEN_POINTS * POINT_BYTES


def _evict(table: OrderedDict[K, V], max_keys: int, room: int, cost: Callable[[K], int]) -> tuple[int, int]:
    """Drop the oldest keys of ``table`` until one more key fits: fewer than ``max_keys`` keys, and
    ``room`` (the bytes the new key lacks: below 0, that many) made; returns (bytes freed, keys dropped)."""
    freed = dropped = 0
    while table and (len(table) >= max_keys or room + freed < 0):
        key, _ = table.popitem(last=False)
        freed += cost(key)
        dropped += 1
    return freed, dropped


def _expire_front(table: OrderedDict[tuple[TopicKey, int], V], horizon: float,
                  cost: Callable[[tuple[TopicKey, int]], int]) -> int:
    """Drop the values older than ``horizon`` (the table's front: each value's second field is when it
    was seen) of the watermarks or the write times; returns their estimated bytes."""
    freed = 0
    while table:
        first = next(iter(table))
        if table[first][1] >= horizon:  # type: ignore[index]
            return freed
        del table[first]
        freed += cost(first)
    return freed


def _fresher(table: dict[K, tuple[V, float, float]], key: K, value: V, seen: float, rate: float) -> None:
    old = table.get(key)
    if old is None or seen > old[1]:
        table[key] = (value, seen, rate)


def _progress(offset: int, now: float, anchor: int, anchored_at: float, rate: float) -> tuple[int, float, float]:
    """A value's rate fields after it became ``offset`` at ``now``: ``(anchor, anchored_at, rate)``,
    the offset and time a window started at and the records a second of the last whole window. A
    window ends at the first update at least :data:`RATE_WINDOW` after it started (a value going
    back, a group's offsets reset or a topic made again: 0)."""
    if now - anchored_at >= RATE_WINDOW:
        return offset, now, max(0.0, (offset - anchor) / (now - anchored_at))
    return anchor, anchored_at, rate


def _rate(offset: int, now: float, anchor: int, anchored_at: float, rate: float) -> float:
    """A value's rate at ``now``: its last whole window's while the current one is shorter than
    :data:`RATE_WINDOW`; past that (no update since: a stopped group), the current one's so far."""
    if now - anchored_at <= RATE_WINDOW:
        return rate
    return max(0.0, (offset - anchor) / (now - anchored_at))


def written_at(points: Sequence[int], offset: int) -> int:
    """When ``offset`` was written (ms since the epoch), from a partition's write-time points (flat
    ``first, last, timestamp`` triples in offset order): the timestamp of the point holding it, or
    else of the point nearest to it in offsets (the earlier one on a tie)."""
    best, distance = points[2], -1
    for i in range(0, len(points), 3):
        first, last = points[i], points[i + 1]
        if offset < first:
            d = first - offset
        elif offset > last:
            d = offset - last
        else:
            return points[i + 2]
        if distance < 0 or d < distance:
            best, distance = points[i + 2], d
        elif first > offset:
            break  # (further points are further off)
    return best


def _thin(points: array[int], latest: int) -> None:
    """Make room for one point in a full ``points`` (flat triples): drop one between two others, the
    one whose neighbours are closest in time relative to its age at ``latest`` (ms): the points left
    stay spread over the partition's history, denser where it is recent."""
    drop, best = 3, -1.0
    for i in range(3, len(points) - 3, 3):
        span = (points[i + 5] - points[i - 1]) / max(1, latest - points[i + 2])
        if best < 0 or span < best:
            drop, best = i, span
    del points[drop:drop + 3]
