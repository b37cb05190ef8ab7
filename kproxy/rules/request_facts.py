"""What the engine reads of a request: :class:`RequestFacts`, a plain value interface.

Two producers build it: the proxy from a live request frame
(:class:`kproxy.rules.frame_facts.FrameFacts`, which decodes lazily) and the analysis
job from captured records (a what-if report). Nothing here parses frames.

The cheap facts are attributes; the ones that need a body decode are methods,
called by the engine only when a loaded rule matches on them (``topics`` for a
``topic`` or ``partition`` key, ``acks``, ``group_id``, ``transactional_id``, ``records``:
a Produce request's records, decoded within a budget, None when over it or unreadable).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kproxy.protocol.records import Record as Record  # what records() holds; the what-if builds them

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class RequestHeaderFacts(Protocol):
    """What a request header says, as the rules read it (its reader may decode ``client_id`` on
    first use)."""

    @property
    def api_key(self) -> int: ...
    @property
    def api_version(self) -> int: ...
    @property
    def correlation_id(self) -> int: ...
    @property
    def client_id(self) -> str | None: ...


class RequestFacts(RequestHeaderFacts, Protocol):
    """One request as the rules see it.

    * ``stream_ordinal``: the request's 0-based ordinal among the requests of
      the same client id, broker and api key, over every connection since the
      rule set was put in force; with ``client_id``, ``broker_id`` and
      ``api_key`` it keys the engine's random draws (see
      :class:`kproxy.rules.engine.RuleEngine`).
    * ``now``: a monotonic clock reading in seconds (the same clock the engine
      was given when the rule set was loaded); ``wall_time``: Unix seconds, for
      daily windows.
    * ``request_bytes``: the request frame's size, its 4-byte size prefix included (what the
      capture's ``request_bytes`` column holds).
    * ``principal``: the connection's principal as Kafka writes it (``User:alice``), from a
      verified TLS client certificate or a SASL login the broker accepted; None while unknown.
      Read only when a loaded rule names one.
    * ``connection_draws``: the connection's ``toxicity`` draws, kept by the engine (per rule;
      None: the facts have no connection, as a capture's: toxicity is then drawn per request).
    * ``connection_counts``: the connection's request counters of the rules that count ``per:
      connection``, kept by the engine (None: no connection; such rules then count per rule).
    * ``topics()``: topic name -> partitions named in the request (empty for
      topic-only requests such as Metadata). Topic ids (Fetch v13+) appear as
      names when the producer could resolve them, else as the id's text.
    """

    @property
    def client_ip(self) -> IpAddress | None: ...
    @property
    def broker_id(self) -> int | None: ...
    @property
    def principal(self) -> str | None: ...
    @property
    def cluster(self) -> str | None: ...
    @property
    def request_bytes(self) -> int: ...
    @property
    def stream_ordinal(self) -> int: ...
    @property
    def now(self) -> float: ...
    @property
    def wall_time(self) -> float: ...

    @property
    def connection_draws(self) -> dict[tuple[str, float, int], bool] | None: ...
    @property
    def connection_counts(self) -> dict[object, int] | None: ...

    def topics(self) -> Mapping[str, frozenset[int]]: ...
    def acks(self) -> int | None: ...
    def group_id(self) -> str | None: ...
    def transactional_id(self) -> str | None: ...
    def records(self) -> Sequence[Record] | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticFacts:
    """A :class:`RequestFacts` of plain values: tests, and records read back from a capture."""

    api_key: int
    api_version: int = 0
    correlation_id: int = 0
    client_id: str | None = None
    client_ip: IpAddress | None = None
    broker_id: int | None = None
    principal: str | None = None
    cluster: str | None = None
    request_bytes: int = 0
    stream_ordinal: int = 0
    now: float = 0.0
    wall_time: float = 0.0
    connection_draws: dict[tuple[str, float, int], bool] | None = None
    connection_counts: dict[object, int] | None = None
    topic_partitions: Mapping[str, frozenset[int]] = field(default_factory=dict)
    acks_value: int | None = None
    group: str | None = None
    transactional: str | None = None
    produced: Sequence[Record] | None = None

    def topics(self) -> Mapping[str, frozenset[int]]:
        return self.topic_partitions

    def acks(self) -> int | None:
        return self.acks_value

    def group_id(self) -> str | None:
        return self.group

    def transactional_id(self) -> str | None:
        return self.transactional

    def records(self) -> Sequence[Record] | None:
        return self.produced
