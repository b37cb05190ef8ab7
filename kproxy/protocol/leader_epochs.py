"""Leader epoch floors: a leader epoch a client has seen through kproxy never goes backwards.

A client ignores partition metadata whose leader epoch is older than one it knows (KIP-320). When a
fault raises a partition's epoch above the broker's own (``mutate_metadata``'s ``move_leader``),
the broker's real answers would read as outdated once the fault ends, and the client would keep the
leader the fault invented. :class:`LeaderEpochFloors` remembers, per (topic or topic id,
partition), the highest epoch kproxy advertised above the broker's; :func:`floor_leader_epochs`
keeps every current-leader epoch of an answer at least that high until the broker's own epoch
reaches it, and then forgets it (a current-leader hint is raised only when it names the leader
metadata advertised at the floor: one naming the broker's leader while a ``move_leader`` is in
force keeps the broker's epoch, which clients ignore, so the rule still moves them).
:func:`unfloor_request_epochs` is the other direction: a request carrying an epoch only kproxy
advertised (a Fetch's ``current_leader_epoch``...) reaches the broker with the broker's epoch, or
-1 ("no check") while the broker's is not known, since a broker answers UNKNOWN_LEADER_EPOCH to an
epoch above its own.

Which answers carry a current leader's epoch: Metadata v7+ and DescribeTopicPartitions
(``leader_epoch``), Produce v10+ and Fetch v12+ (the ``current_leader`` tagged field, KIP-951),
ShareFetch and ShareAcknowledge (``current_leader``). Epochs that describe the log rather than its
leader are left as the broker wrote them: ListOffsets' ``leader_epoch`` (the epoch of the returned
offset), OffsetForLeaderEpoch's ``leader_epoch`` (the epoch whose end offset it answers), Fetch's
``diverging_epoch``, OffsetFetch's committed epoch and record batches: a client checks them
against the broker's log (OffsetForLeaderEpoch, KIP-320), where an epoch the log never had reads
as truncation. Requests carrying the client's current leader epoch: Fetch v9+, ListOffsets v4+,
OffsetForLeaderEpoch v2+ (``current_leader_epoch``).

Sans-IO; one table per upstream cluster, read and written by one thread.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from typing import Any

from kproxy.protocol.api_keys import (
    DESCRIBE_TOPIC_PARTITIONS,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
)
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.headers import response_body_offset
from kproxy.protocol.message_schemas import MessageType
from kproxy.protocol.messages import decode_body
from kproxy.protocol.mutation import Mutation, reframe
from kproxy.protocol.scan import scan_body
from kproxy.protocol.splice import splice_body

ANSWERS_CAP = 4  # Metadata answers remembered with the epochs they got (see LeaderEpochFloors)
NEEDLES_CAP = 64  # topics with floors searched for as bytes before a frame is decoded
FLOORS_CAP = 100_000  # keys remembered (name or topic id, partition); past it the oldest raise is forgotten

# api key -> (first version carrying a current leader epoch, top-level field holding the topics)
RESPONSES: dict[int, tuple[int, str]] = {
    METADATA: (7, "topics"),
    DESCRIBE_TOPIC_PARTITIONS: (0, "topics"),
    PRODUCE: (10, "responses"),
    FETCH: (12, "responses"),
    SHARE_FETCH: (0, "responses"),
    SHARE_ACKNOWLEDGE: (0, "responses"),
}
# api key -> first version whose partitions carry ``current_leader_epoch``; the topics are in ``topics``
REQUESTS: dict[int, int] = {
    FETCH: 9,
    LIST_OFFSETS: 4,
    OFFSET_FOR_LEADER_EPOCH: 2,
}

# A partition as answers and requests name it: by topic name or by topic id (KIP-516).
PartitionKey = tuple[str | uuid.UUID, int]


class EpochFloor:
    """One partition's floor: the highest epoch kproxy advertised above the broker's own; the
    broker's own as last seen in an answer kproxy did not raise (None: not seen since the raise);
    and the leader kproxy last advertised at the floor (in partition metadata), the only leader
    a current-leader hint is raised to the floor for."""

    __slots__ = ("broker", "epoch", "keys", "leader")

    def __init__(self, epoch: int, keys: tuple[PartitionKey, ...], leader: int | None) -> None:
        self.epoch = epoch
        self.broker: int | None = None
        self.leader = leader
        self.keys = keys  # its name key, and its topic id key when known


class LeaderEpochFloors(dict[PartitionKey, EpochFloor]):
    """Per (topic name or topic id, partition): the :class:`EpochFloor` of partitions whose leader
    epoch kproxy raised above the broker's; a dict of them (read it as one, write it through the
    methods), so a reader's first test, its truth value, is the C one: empty unless a fault raised
    an epoch. Bounded by ``cap`` keys (a partition known by name and by topic id
    takes two; past the cap the oldest raise is forgotten). ``len()`` counts keys."""

    __slots__ = ("_answers", "_needles", "cap", "changes", "forgotten")

    def __init__(self, cap: int = FLOORS_CAP) -> None:
        super().__init__()
        self._needles: tuple[bytes, ...] | None = None  # see named_in; None: to be worked out again
        # What changes the epochs a Metadata answer gets (a floor raised, added, forgotten, another
        # leader advertised at it): a count, so a remembered answer knows it is still right.
        self.changes = 0
        # Metadata and DescribeTopicPartitions answers floored lately: (api key, version, hash of the
        # frame past its correlation id) -> (changes then, new body or None: unchanged, epochs raised).
        # Clients refresh metadata with the same answer again and again, and decoding and encoding
        # a big one holds the thread in proportion to its partitions.
        self._answers: dict[tuple[int, int, int], tuple[int, bytes | None, int]] = {}
        self.cap = cap
        self.forgotten = 0  # floors dropped for the cap (never those the broker's epoch reached)

    def floor(self, topic: str | uuid.UUID, partition: int) -> EpochFloor | None:
        """The floor of a partition named by its topic's name or id (None: it has none)."""
        return self.get((topic, partition))

    def named_in(self, frame: bytes) -> bool:
        """Whether ``frame`` may name a partition with a floor: False when none of their topics'
        names (UTF-8) nor ids (16 bytes) occurs in it, so a frame of other topics is not decoded
        (a byte search: microseconds, where a 1,000-partition Metadata answer takes milliseconds
        to decode and encode). True when it cannot tell (more than NEEDLES_CAP topics)."""
        needles = self._needles
        if needles is None:
            topics = {key[0] for key in self}
            needles = self._needles = () if len(topics) > NEEDLES_CAP else tuple(
                t.bytes if isinstance(t, uuid.UUID) else t.encode() for t in topics)
        if not needles or not isinstance(frame, (bytes, bytearray)):
            return bool(self)
        return any(needle in frame for needle in needles)

    def raised(self, name: str | None, topic_id: uuid.UUID | None, partition: int, epoch: int,
               broker: int | None = None, leader: int | None = None) -> int:
        """kproxy advertised ``epoch`` (and ``leader``) for this partition, above the broker's own
        epoch (``broker``, when known): remember it as its floor (a lower one is not remembered
        over a higher one). Returns the epoch to advertise: the floor."""
        found = self._find(name, topic_id, partition)
        if found is not None and _recreated(found, topic_id):
            self._forget(found)
            found = None
        if found is None:
            keys = _keys(name, topic_id, partition)
            if not keys:
                return epoch
            while len(self) + len(keys) > self.cap and self:
                self._forget(next(iter(self.values())))
                self.forgotten += 1
            found = EpochFloor(epoch, keys, leader)
            for key in keys:
                self[key] = found
            self._needles = None
        elif epoch > found.epoch:
            found.epoch = epoch
        if broker is not None:
            found.broker = broker
        found.leader = leader
        self.changes += 1
        self._add_id(found, name, topic_id, partition)
        return found.epoch

    def seen(self, name: str | None, topic_id: uuid.UUID | None, partition: int, epoch: int,
             leader: int | None, *, hint: bool = False) -> int:
        """The broker's own ``epoch`` for this partition, and its ``leader``, as an answer carries
        them: the epoch to advertise instead. The floor while the broker's epoch is below it (and
        forgotten once the broker's reaches it), but for a current-leader hint (``hint``: Produce,
        Fetch, share answers) naming another leader than partition metadata last advertised at
        the floor: such a hint keeps the broker's epoch, which a client ignores as outdated and
        then reads metadata again. (Raised, it would override a ``move_leader`` still in force.)"""
        found = self._find(name, topic_id, partition)
        if found is None or epoch < 0:
            return epoch
        if epoch >= found.epoch or _recreated(found, topic_id):
            self._forget(found)
            return epoch
        found.broker = epoch
        self._add_id(found, name, topic_id, partition)
        if hint:
            return found.epoch if leader == found.leader else epoch
        if leader != found.leader:
            found.leader = leader
            self.changes += 1
        return found.epoch

    def broker_epoch(self, topic: str | uuid.UUID | None, partition: int, epoch: int) -> int | None:
        """What a request's ``current_leader_epoch`` of ``epoch`` must become for the broker: its
        own epoch (-1, "no check", while not known) when ``epoch`` is one only kproxy advertised;
        None to keep it (no floor, an epoch the broker had, or one above the floor)."""
        found = self.get((topic, partition)) if topic is not None else None
        if found is None or epoch > found.epoch:
            return None
        broker = found.broker
        if broker is not None and epoch <= broker:
            return None
        return -1 if broker is None else broker

    def _find(self, name: str | None, topic_id: uuid.UUID | None, partition: int) -> EpochFloor | None:
        found = self.get((name, partition)) if name is not None else None
        if found is None and topic_id is not None:
            found = self.get((topic_id, partition))
        return found

    def _add_id(self, floor: EpochFloor, name: str | None, topic_id: uuid.UUID | None, partition: int) -> None:
        """Key ``floor`` by every name this answer gives its partition (a raise seen by name is
        then found by the id a Fetch v13+ names it with)."""
        for key in _keys(name, topic_id, partition):
            if key not in floor.keys:
                floor.keys = (*floor.keys, key)
                self[key] = floor
                self._needles = None
                self.changes += 1

    def _forget(self, floor: EpochFloor) -> None:
        for key in floor.keys:
            if self.get(key) is floor:
                del self[key]
        self._needles = None
        self.changes += 1


def _recreated(floor: EpochFloor, topic_id: uuid.UUID | None) -> bool:
    """Whether ``topic_id`` is another topic than the one ``floor`` was raised for (deleted and
    created again under its name: its epochs start again, and clients forget the old ones)."""
    return topic_id is not None and topic_id.int != 0 and any(
        isinstance(key[0], uuid.UUID) and key[0] != topic_id for key in floor.keys)


def _keys(name: str | None, topic_id: uuid.UUID | None, partition: int) -> tuple[PartitionKey, ...]:
    """The keys a partition is found by: its topic's name and its topic's id, those known."""
    keys: list[PartitionKey] = []
    if name is not None:
        keys.append((name, partition))
    if topic_id is not None and topic_id.int:
        keys.append((topic_id, partition))
    return tuple(keys)


def _topic_names(topic: dict[str, Any]) -> tuple[str | None, uuid.UUID | None]:
    name = topic.get("name", topic.get("topic"))
    topic_id = topic.get("topic_id")
    return (name if isinstance(name, str) else None,
            topic_id if isinstance(topic_id, uuid.UUID) and topic_id.int else None)


def _partition_index(p: dict[str, Any]) -> int | None:
    for key in ("partition_index", "index", "partition"):
        found = p.get(key)
        if found is not None:
            return int(found)
    return None


def broker_epochs(frame: bytes, api_key: int, api_version: int, partitions: Collection[tuple[str, int]]
                  ) -> dict[tuple[str, int], int]:
    """The leader epochs of some partitions (topic name, partition) in a Metadata or
    DescribeTopicPartitions answer, as the broker wrote them (read before a fault edits them, for
    :func:`floor_leader_epochs`); partitions absent or without an epoch are left out. Raises
    :class:`~kproxy.protocol.errors.DecodeError` for an answer that does not parse."""
    spec = RESPONSES.get(api_key)
    if spec is None or spec[1] != "topics" or api_version < spec[0] or not partitions:
        return {}
    if isinstance(frame, (bytes, bytearray)) and not any(name.encode() in frame for name in {t for t, _ in partitions}):
        return {}  # none of their topics named: a byte search instead of a decode
    offset = response_body_offset(frame, api_key, api_version, whole=True)
    found: dict[tuple[str, int], int] = {}
    for topic in decode_body(api_key, api_version, MessageType.RESPONSE, frame, offset).get("topics") or ():
        name = topic.get("name")
        for p in topic.get("partitions") or ():
            key = (name, p.get("partition_index"))
            epoch = p.get("leader_epoch")
            if key in partitions and isinstance(epoch, int) and epoch >= 0:
                found[key] = epoch
    return found


def floor_leader_epochs(frame: bytes, api_key: int, api_version: int, floors: LeaderEpochFloors, *,
                        raised: Mapping[tuple[str, int], int] | None = None) -> Mutation:
    """Keep the current-leader epochs of an answer (see the module's list) at least at their floor.

    ``raised`` maps the partitions (topic name, partition) whose epoch in this answer a fault may
    have set to the broker's own epoch (:func:`broker_epochs` of the answer before the fault): an
    epoch above it becomes (or raises) the partition's floor. Every other epoch is the broker's
    own: it is advertised as the floor while below it, and forgets the floor once it reaches it.
    ``changed`` counts the epochs raised; an answer of another api key or version, or with nothing
    to change, comes back as the same object. Raises
    :class:`~kproxy.protocol.errors.DecodeError` for an answer that does not parse.
    """
    spec = RESPONSES.get(api_key)
    if spec is None or api_version < spec[0] or not (raised or floors.named_in(frame)):
        return Mutation(frame, 0)
    field = spec[1]
    count = [0]

    def topics(value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for topic in value or ():
            name, topic_id = _topic_names(topic)
            for p in topic.get("partitions", topic.get("partition_responses")) or ():
                index = _partition_index(p)
                if index is None:
                    continue
                holder = p.get("current_leader", p) if field == "responses" else p
                if not isinstance(holder, dict):
                    continue
                old = holder.get("leader_epoch")
                if not isinstance(old, int) or old < 0:
                    continue
                broker = raised.get((name, index)) if raised and name is not None else None
                leader = holder.get("leader_id")
                if broker is not None and old > broker:
                    new = floors.raised(name, topic_id, index, old, broker, leader)
                else:
                    new = floors.seen(name, topic_id, index, old, leader, hint=holder is not p)
                if new != old:
                    holder["leader_epoch"] = new
                    count[0] += 1
        return value

    offset = response_body_offset(frame, api_key, api_version, whole=True)
    if api_key in _SCANNED and not _floored_error(frame, api_key, api_version, offset, floors):
        return Mutation(frame, 0)
    # The same Metadata answer again, with no floor changed since: what it got last time.
    seen_key = (api_key, api_version, hash(memoryview(frame)[8:])) \
        if not raised and field == "topics" and type(frame) is bytes else None
    if seen_key is not None:
        found = floors._answers.get(seen_key)
        if found is not None and found[0] == floors.changes:
            return Mutation(frame, 0) if found[1] is None else Mutation(reframe(frame, offset, found[1]), found[2])
    new_body, _ = splice_body(api_key, api_version, MessageType.RESPONSE, frame, {field: topics}, offset)
    if seen_key is not None:
        answers = floors._answers
        if len(answers) >= ANSWERS_CAP:
            del answers[next(iter(answers))]
        answers[seen_key] = (floors.changes, new_body if count[0] else None, count[0])
    if new_body is None or not count[0]:
        return Mutation(frame, 0)
    return Mutation(reframe(frame, offset, new_body), count[0])


# Answers whose errors-only scan (kproxy.protocol.scan) is read before a decode: those carrying records.
# Share answers are decoded: their partitions hold two error codes, which the scan does not tell apart.
_SCANNED = frozenset({PRODUCE, FETCH})


def _floored_error(frame: bytes, api_key: int, api_version: int, offset: int, floors: LeaderEpochFloors) -> bool:
    """Whether a Produce or Fetch answer has an error on a partition with a floor: a broker
    names a current leader only beside an error (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH), and
    the errors-only scan skips records, where a decode would copy them."""
    try:
        errors = scan_body(api_key, api_version, MessageType.RESPONSE, frame, offset, errors_only=True).entries
    except ProtocolError:
        return True  # the decode says what is wrong
    return any(topic is not None and partition is not None and floors.floor(topic, partition) is not None
               for topic, partition, _ in errors)


def unfloor_request_epochs(frame: bytes, api_key: int, api_version: int, body_offset: int,
                           floors: LeaderEpochFloors) -> Mutation:
    """A request with every ``current_leader_epoch`` that only kproxy advertised replaced by the
    broker's own (:meth:`LeaderEpochFloors.broker_epoch`); ``changed`` counts them. A request of
    another api key or version, or with nothing to change, comes back as the same object. Raises
    :class:`~kproxy.protocol.errors.DecodeError` for a request that does not parse."""
    first = REQUESTS.get(api_key)
    if first is None or api_version < first or not floors.named_in(frame):
        return Mutation(frame, 0)
    count = [0]

    def topics(value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for topic in value or ():
            name, topic_id = _topic_names(topic)
            key = name if name is not None else topic_id
            for p in topic.get("partitions") or ():
                index = _partition_index(p)
                epoch = p.get("current_leader_epoch")
                if index is None or not isinstance(epoch, int) or epoch < 0:
                    continue
                broker = floors.broker_epoch(key, index, epoch)
                if broker is not None:
                    p["current_leader_epoch"] = broker
                    count[0] += 1
        return value

    new_body, _ = splice_body(api_key, api_version, MessageType.REQUEST, frame, {"topics": topics}, body_offset)
    if new_body is None or not count[0]:
        return Mutation(frame, 0)
    return Mutation(reframe(frame, body_offset, new_body), count[0])


__all__ = ["ANSWERS_CAP", "FLOORS_CAP", "NEEDLES_CAP", "REQUESTS", "RESPONSES", "EpochFloor", "LeaderEpochFloors",
           "PartitionKey", "broker_epochs", "floor_leader_epochs", "unfloor_request_epochs"]
