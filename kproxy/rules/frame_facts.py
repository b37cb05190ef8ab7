"""Request facts read from a live request frame, lazily and partially.

:class:`FrameFacts` implements :class:`~kproxy.rules.request_facts.RequestFacts` over
the frame the session already holds and the header it already parsed: a
:class:`ParsedRequest` (the proxy session's ``Exchange`` is one, so a rule
check decodes no header again) or a decoded
:class:`~kproxy.protocol.headers.RequestHeader`. The cheap facts are given by
the caller; the others are decoded on first use only, with
:mod:`kproxy.protocol`'s generated functions:

* ``topics()``: the request scan (:func:`kproxy.protocol.scan.scan_request`,
  the exchange's when built from one: shared with the metrics and capture),
  which reads topic names and partition indexes and skips the rest by length
  (records are never touched);
* ``acks()``, ``transactional_id()``, ``group_id()``: one top-level field,
  after skipping the fields before it (``acks`` is Produce's second field);
* ``records()``: a Produce request's records, decoded (decompressed, no CRC check) within
  :data:`RECORD_MATCH_BUDGET` for the frame (:class:`~kproxy.protocol.records.RecordBudget`: 256
  KiB of decompressed bytes, 64 bytes a record, so 4096 records at most), None past it: what a
  ``record`` key costs, read only when a rule has one and its cheaper keys passed.

Read as leniently as a broker reads: bytes after the body are ignored, and a
body that cannot be read yields "no value" (the rule then does not match),
never an exception, since the proxy forwards what it cannot read.

Requests that name topics by id (Fetch v13+, KIP-516) are read through a
:class:`~kproxy.protocol.topic_ids.TopicIdNames` map, learnt from Metadata responses, so a ``topic`` key
matches them by name; an id not (yet) learnt reads as the id's text.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol

from kproxy.protocol.api_keys import FIND_COORDINATOR, PRODUCE
from kproxy.protocol.errors import OverBudgetError
from kproxy.protocol.headers import RequestHeader
from kproxy.protocol.message_schemas import MessageType, message_schema
from kproxy.protocol.messages import codec
from kproxy.protocol.records import DEFAULT_RECORD_BUDGET, Record, RecordBudget, decode_records, iter_batches
from kproxy.protocol.scan import SCAN_FAILURES, RequestScan, scan_request
from kproxy.rules.request_facts import IpAddress, RequestHeaderFacts

_EMPTY: Mapping[str, frozenset[int]] = MappingProxyType({})
# Scan of a request's topics (topic, partition, None per partition read) -> its topics() mapping;
# bounded: starts afresh when full (a request naming a new set of partitions costs one build).
TOPICS_SEEN_CAP = 4096
_TOPICS_SEEN: dict[tuple[tuple[Any, int | None, int | None], ...], Mapping[str, frozenset[int]]] = {}
_UNSET: Any = object()
# What reading one request's records for a ``record`` key may cost: a quarter of the budget of the
# record actions, as decoding every record (not editing a few) is the costlier walk per byte.
RECORD_MATCH_BUDGET = DEFAULT_RECORD_BUDGET // 4
_RECORD_FAILURES = (*SCAN_FAILURES, OverBudgetError)  # records unreadable, or over the budget


def reads_fact(api_key: int, api_version: int, fact: str) -> bool:
    """Whether :class:`FrameFacts` can read ``fact`` (``group_id`` or ``transactional_id``) of a request
    of this kind: the top-level field it reads is in the request's schema (FindCoordinator names a
    group in ``key``, v0-v3). False: a rule matching on ``fact`` never matches such a request."""
    name = "key" if fact == "group_id" and api_key == FIND_COORDINATOR else fact
    schema = message_schema(api_key, api_version, MessageType.REQUEST)
    return schema is not None and any(f.name == name and f.tag is None for f in schema.fields)


class ParsedRequest(RequestHeaderFacts, Protocol):
    """A request header its reader has parsed already (``kproxy.proxy.session.Exchange`` is one:
    kproxy.rules may not import the proxy, so this names what it reads of it).

    ``client_id`` may be decoded on first use; ``request_body_offset`` is where the body starts
    in the frame (size prefix included), or None when the header cannot be read;
    ``request_scan`` is :func:`kproxy.protocol.scan.scan_request` of that frame (None: unreadable),
    which its reader may have done already for another reader of the request.
    """

    @property
    def request_body_offset(self) -> int | None: ...

    @property
    def request_scan(self) -> RequestScan | None: ...


class FrameFacts:
    """The facts of one request frame (4-byte size prefix included, as the session holds it).

    ``header`` is what the caller parsed of it: a :class:`ParsedRequest` (read as it is, its
    client id only when a rule asks) or a :class:`~kproxy.protocol.headers.RequestHeader`.
    Building one copies three ints and decodes nothing.
    """

    __slots__ = (
        "_acks",
        "_frame",
        "_group",
        "_header",
        "_names",
        "_records",
        "_topics",
        "_txn",
        "api_key",
        "api_version",
        "broker_id",
        "client_ip",
        "cluster",
        "connection_counts",
        "connection_draws",
        "correlation_id",
        "now",
        "principal",
        "stream_ordinal",
        "wall_time",
    )

    def __init__(self, frame: bytes, header: ParsedRequest | RequestHeader, *, client_ip: IpAddress | None = None,
                 broker_id: int | None = None, stream_ordinal: int = 0, now: float = 0.0, wall_time: float = 0.0,
                 topic_names: Mapping[uuid.UUID, str] | None = None, principal: str | None = None,
                 connection_draws: dict[tuple[str, float, int], bool] | None = None,
                 connection_counts: dict[object, int] | None = None, cluster: str | None = None) -> None:
        self._frame = frame
        self._header = header
        # Plain attributes, not properties over the header: the engine reads them for every rule tried.
        self.api_key = header.api_key
        self.api_version = header.api_version
        self.correlation_id = header.correlation_id
        self._names = topic_names
        self.client_ip = client_ip
        self.broker_id = broker_id
        self.principal = principal  # the connection's (kproxy.proxy.session.Session.principal)
        self.cluster = cluster  # the connection's (the config's clusters:), None where there is no connection
        self.stream_ordinal = stream_ordinal
        self.now = now
        self.wall_time = wall_time
        self.connection_draws = connection_draws  # the connection's toxicity draws (the policy's)
        self.connection_counts = connection_counts  # its per-connection schedule counters (the policy's)
        self._topics: Mapping[str, frozenset[int]] | None = None
        self._acks: Any = _UNSET
        self._txn: Any = _UNSET
        self._group: Any = _UNSET
        self._records: Any = _UNSET

    @property
    def topic_names(self) -> Mapping[uuid.UUID, str] | None:
        """The topic id -> name map ids are read through (None: ids read as their text)."""
        return self._names

    @property
    def client_id(self) -> str | None:
        return self._header.client_id

    @property
    def request_bytes(self) -> int:
        """The frame's size, size prefix included: known without reading it."""
        return len(self._frame)

    @property
    def _body_offset(self) -> int | None:
        """Where the body starts in the frame; None when the header cannot be read (no body facts)."""
        header = self._header
        if isinstance(header, RequestHeader):
            return 4 + header.size
        return header.request_body_offset

    def topics(self) -> Mapping[str, frozenset[int]]:
        if self._topics is None:
            self._topics = self._scan_topics()
        return self._topics

    def _scan_topics(self) -> Mapping[str, frozenset[int]]:
        header = self._header
        if isinstance(header, RequestHeader):
            offset = 4 + header.size
            found = scan_request(self.api_key, self.api_version, self._frame, offset)
        else:
            # The exchange's scan: whoever reads the request first scans it, the others (metrics,
            # capture) take the same result.
            found = header.request_scan
        if found is None:
            return _EMPTY
        acc = found[0]
        # Producers send the same topics and partitions request after request: the mapping built
        # from one scan is remembered (read-only, shared) and found again by the scan's value, a
        # tuple lookup instead of building sets per request. Scans naming topics by id are not
        # remembered: what an id reads as depends on the ids learnt by then.
        key = tuple(acc)
        seen = _TOPICS_SEEN.get(key)
        if seen is not None:
            return seen
        out: dict[str, set[int]] = {}
        by_id = False
        for topic, partition, _ in acc:
            if topic is None:
                continue
            if isinstance(topic, uuid.UUID):
                by_id = True
                topic = (self._names or {}).get(topic, str(topic))
            parts = out.setdefault(topic, set())
            if partition is not None:
                parts.add(partition)
        mapping = MappingProxyType({t: frozenset(p) for t, p in out.items()})
        if not by_id:
            if len(_TOPICS_SEEN) >= TOPICS_SEEN_CAP:
                _TOPICS_SEEN.clear()
            _TOPICS_SEEN[key] = mapping
        return mapping

    def acks(self) -> int | None:
        if self._acks is _UNSET:
            self._acks = self._field("acks") if self.api_key == PRODUCE else None
        return self._acks  # type: ignore[no-any-return]

    def transactional_id(self) -> str | None:
        if self._txn is _UNSET:
            self._txn = self._field("transactional_id")
        return self._txn  # type: ignore[no-any-return]

    def group_id(self) -> str | None:
        if self._group is _UNSET:
            if self.api_key == FIND_COORDINATOR:
                # FindCoordinator v0-v3: `key` names a group when key_type is 0 (absent in v0).
                # v4+ batches keys (KIP-699) in `coordinator_keys`: not a single group.
                key_type = self._field("key_type")
                self._group = self._field("key") if key_type in (None, 0) else None
            else:
                self._group = self._field("group_id")
        return self._group  # type: ignore[no-any-return]

    def records(self) -> list[Record] | None:
        if self._records is _UNSET:
            self._records = self._read_records()
        return self._records  # type: ignore[no-any-return]

    def _read_records(self) -> list[Record] | None:
        """Every record of a Produce request, within :data:`RECORD_MATCH_BUDGET`; None when over it or
        unreadable (a rule's ``record`` key then does not match); empty for other requests."""
        if self.api_key != PRODUCE:
            return []
        header = self._header
        if isinstance(header, RequestHeader):
            found = scan_request(self.api_key, self.api_version, self._frame, 4 + header.size)
        else:
            found = header.request_scan
        if found is None:
            return None
        budget = RecordBudget(RECORD_MATCH_BUDGET)
        out: list[Record] = []
        frame = self._frame
        try:
            for start, end, _ in found[1]:
                for batch in iter_batches(frame, start=start, end=end, allow_truncated_tail=False):
                    out.extend(decode_records(batch, check_crc=False, budget=budget))
        except _RECORD_FAILURES:
            return None
        return out

    def _field(self, name: str) -> Any:
        """One top-level (untagged) field's value, or None when absent or unreadable."""
        c = codec(self.api_key, self.api_version, MessageType.REQUEST)
        if c is None or not any(f.name == name and f.tag is None for f in c.schema.fields):
            return None
        pos = self._body_offset
        if pos is None:
            return None
        buf = bytes(self._frame)
        try:
            for f in c.schema.fields:
                if f.tag is not None:
                    continue
                decode, _, skip = c.field_functions(f.name)
                if f.name == name:
                    return decode(buf, pos)[0]
                pos = skip(buf, pos)
        except SCAN_FAILURES:
            return None
        return None
