"""Topic ids (KIP-516) learnt from Metadata responses, for requests that name topics by id only.

Fetch v13+ (and other newer versions) carry a topic's 16-byte id instead of its name; the name
is known only from a Metadata v10+ response, often on another connection than the request that
uses the id. :class:`TopicIdNames` keeps what the Metadata answers taught; the rules read ids
through it (a ``topic`` key matches by name) and the capture writes names in its records.
"""

from __future__ import annotations

import uuid

from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.headers import response_body_offset
from kproxy.protocol.messages import decode_body
from kproxy.protocol.schema import Direction
from kproxy.protocol.tables import ApiKey

METADATA = int(ApiKey.METADATA)
METADATA_TOPIC_IDS = 10  # the first Metadata version whose response carries topic_id (KIP-516)
TOPIC_ID_NAMES_CAP = 100_000


class TopicIdNames(dict[uuid.UUID, str]):
    """Topic id -> name, learnt from Metadata responses; a mapping, so a reader looks ids up as in
    any dict. Bounded: past ``cap`` ids the oldest learnt is forgotten, and :attr:`forgotten`
    counts them (a reader that remembers what a Metadata answer taught knows it is stale once
    the count moved). One instance is read and taught by one thread."""

    def __init__(self, cap: int = TOPIC_ID_NAMES_CAP) -> None:
        super().__init__()
        self.cap = cap
        self.forgotten = 0
        # The last Metadata answer learnt: (version, its bytes past the correlation id hashed, the
        # forgotten count then, the topics it named). Clients refresh metadata with the same answer
        # again and again; a full decode of a big one holds its thread (0.7 s at 100,000 partitions).
        self._last: tuple[int, int, int, int] | None = None

    def learn(self, topic_id: uuid.UUID, name: str) -> None:
        """Remember ``topic_id``'s name; the zero id ("no id": a topic before v10) is not an id."""
        if topic_id.int == 0 or self.get(topic_id) == name:
            return
        if topic_id not in self and len(self) >= self.cap:
            del self[next(iter(self))]
            self.forgotten += 1
        self[topic_id] = name

    def learn_metadata(self, response: bytes, api_version: int, body_offset: int = 0) -> int | None:
        """Learn the (topic id, name) pairs of a Metadata response frame (size prefix included;
        ``body_offset``: where its body starts, 0 to read it from the header). Returns how many
        topics it names, 0 before v10, None when the response cannot be read (it teaches nothing)."""
        if api_version < METADATA_TOPIC_IDS:
            return 0
        # Hashing the bytes costs ~1 ms per MB, a decode of them ~250 ms per MB.
        seen = hash(memoryview(response)[8:]) if type(response) is bytes else None
        last = self._last
        if last is not None and seen == last[1] and last[0] == api_version and last[2] == self.forgotten:
            return last[3]  # the same answer as the last one learnt, and nothing of it forgotten since
        try:
            offset = body_offset or response_body_offset(response, METADATA, api_version)
            body = decode_body(METADATA, api_version, Direction.RESPONSE, response, offset)
        except ProtocolError:
            return None
        n = 0
        for topic in body.get("topics") or ():
            topic_id, name = topic.get("topic_id"), topic.get("name")
            if isinstance(topic_id, uuid.UUID) and isinstance(name, str):
                self.learn(topic_id, name)
                n += 1
        if seen is not None:
            self._last = (api_version, seen, self.forgotten, n)
        return n

    def name(self, topic: object) -> str | None:
        """A topic as a scan gives it (a name, an id, or None) as its name: an id not learnt reads
        as the id's text."""
        if topic is None:
            return None
        if isinstance(topic, uuid.UUID):
            return self.get(topic, str(topic))
        return str(topic)
