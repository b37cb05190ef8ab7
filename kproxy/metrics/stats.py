"""Traffic statistics, kept in plain Python structures on the hot path.

Updating prometheus-client metric children costs a label lookup and a lock per
call; at tens of thousands of requests per second that alone would eat the
overhead budget. So the proxy counts into dicts and bucket lists here (one dict
operation per counter), and :mod:`kproxy.metrics.exposition` turns them into
Prometheus metric families only when Prometheus scrapes.

Cardinality is bounded by construction: api and error names come from Kafka's
finite tables (unknown codes collapse to one name per code, and codes are
int16), listener names are one per broker; client ids and topics are opt-in
labels capped by :class:`LabelCap`, with everything past the cap counted as
``other``.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.headers import request_body_offset
from kproxy.protocol.records import count_records
from kproxy.protocol.scan import SCAN_FAILURES, Entry, scanner
from kproxy.protocol.schema import Direction
from kproxy.protocol.tables import api_snake_name, error_name

# Broker latency: from sub-millisecond produce acks to 30 s long-poll fetches.
BROKER_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                  1.0, 2.5, 5.0, 10.0, 30.0)
# kproxy's own time per request: microseconds normally, milliseconds for big rewrites.
OVERHEAD_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                    0.025, 0.05, 0.1)
OTHER = "other"
_MISSING = object()
KNOWN_REJECT_REASONS = ("request_oversize", "request_session", "response_oversize", "response_session")
PRODUCE, FETCH = 0, 1


class Histogram:
    """Cumulative-on-export histogram: ``counts[i]`` counts values <= ``bounds[i]``
    (and the last slot the rest); cumulated only when exported."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        out = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append((_le(bound), float(running)))
        out.append(("+Inf", float(running + self.counts[-1])))
        return out


def _le(bound: float) -> str:
    return repr(bound)


class LabelCap:
    """Lets the first ``limit`` distinct values through; every later one is ``other``."""

    __slots__ = ("limit", "seen")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        if len(self.seen) < self.limit:
            self.seen.add(value)
            return value
        return OTHER


@dataclass
class StatsOptions:
    client_id_label: bool = False
    topic_label: bool = False
    label_cap: int = 100
    scan_responses: bool = True


@dataclass
class TrafficStats:
    """Everything ``/metrics`` reports, updated by the server as traffic flows."""

    options: StatsOptions = field(default_factory=StatsOptions)
    started: float = field(default_factory=time.time)
    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    responses: dict[tuple[str, int], int] = field(default_factory=dict)
    broker_latency: dict[str, Histogram] = field(default_factory=dict)
    overhead: dict[str, Histogram] = field(default_factory=dict)
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    topic_errors: dict[tuple[str, str, str], int] = field(default_factory=dict)
    client_requests: dict[tuple[str, str], int] = field(default_factory=dict)
    byte_counts: dict[tuple[str, str], int] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)
    client_connections: dict[str, int] = field(default_factory=dict)
    client_connections_total: dict[str, int] = field(default_factory=dict)
    upstream_connections: dict[str, int] = field(default_factory=dict)
    upstream_connect_failures: dict[str, int] = field(default_factory=dict)
    frames_rejected: dict[str, int] = field(default_factory=dict)
    undecodable_responses: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._topics = LabelCap(self.options.label_cap)
        self._clients = LabelCap(self.options.label_cap)
        self._api_names: dict[int, str] = {}
        self._scanners: dict[tuple[int, int, Direction], object] = {}
        # The reasons kproxy.server.connection reports start at zero: a counter series born at 1
        # hides its first increase from rate()/increase(), so an alert would miss the first rejection.
        for reason in KNOWN_REJECT_REASONS:
            self.frames_rejected.setdefault(reason, 0)

    def api(self, api_key: int) -> str:
        name = self._api_names.get(api_key)
        if name is None:
            name = self._api_names[api_key] = api_snake_name(api_key)
        return name

    # -- per request / response ------------------------------------------------------
    def request(self, api_key: int, api_version: int, size: int, client_id: str | None,
                frame: bytes | None = None) -> None:
        """A request was read from a client. ``frame`` is given for Produce (to count records)."""
        api = self.api(api_key)
        key = (api, api_version)
        self.requests[key] = self.requests.get(key, 0) + 1
        bkey = (api, "request")
        self.byte_counts[bkey] = self.byte_counts.get(bkey, 0) + size
        if self.options.client_id_label:
            ckey = (self._clients(client_id or ""), api)
            self.client_requests[ckey] = self.client_requests.get(ckey, 0) + 1
        if frame is not None and api_key == PRODUCE:
            self._count_records(api_key, api_version, Direction.REQUEST, frame, api)

    def response(self, api_key: int, api_version: int, frame: bytes, body_offset: int,
                 broker_seconds: float | None, overhead_seconds: float) -> None:
        """A response went to the client. Scans its error codes (records are skipped, not read)."""
        api = self.api(api_key)
        key = (api, api_version)
        self.responses[key] = self.responses.get(key, 0) + 1
        bkey = (api, "response")
        self.byte_counts[bkey] = self.byte_counts.get(bkey, 0) + len(frame)
        if broker_seconds is not None:
            hist = self.broker_latency.get(api)
            if hist is None:
                hist = self.broker_latency[api] = Histogram(BROKER_BUCKETS)
            hist.observe(broker_seconds)
        hist = self.overhead.get(api)
        if hist is None:
            hist = self.overhead[api] = Histogram(OVERHEAD_BUCKETS)
        hist.observe(overhead_seconds)
        if self.options.scan_responses:
            self._scan_errors(api_key, api_version, frame, body_offset, api)

    def no_response(self, api_key: int, overhead_seconds: float) -> None:
        """A request that gets no response (Produce acks=0): only kproxy's time to record."""
        api = self.api(api_key)
        hist = self.overhead.get(api)
        if hist is None:
            hist = self.overhead[api] = Histogram(OVERHEAD_BUCKETS)
        hist.observe(overhead_seconds)

    def _scan(self, api_key: int, api_version: int, direction: Direction, frame: bytes, offset: int
              ) -> tuple[list[Entry], list[tuple[int, int]]] | None:
        """Run the errors-only scanner of a message kind: (non-zero error entries, records ranges).

        The generated scanner is called directly (found once per kind), not through
        :func:`scan_body`: this runs for every request and response. None when the
        kind is unknown or the bytes cannot be read.
        """
        key = (api_key, api_version, direction)
        fn = self._scanners.get(key, _MISSING)
        if fn is _MISSING:
            fn = self._scanners[key] = scanner(api_key, api_version, direction, errors_only=True)
        if fn is None:
            return None
        acc: list[Entry] = []
        recs: list[tuple[int, int]] = []
        try:
            fn(frame, offset, acc, recs, None)  # type: ignore[operator]
        except SCAN_FAILURES:
            return None
        return acc, recs

    def _scan_errors(self, api_key: int, api_version: int, frame: bytes, body_offset: int, api: str) -> None:
        found = self._scan(api_key, api_version, Direction.RESPONSE, frame, body_offset)
        if found is None:
            # Unknown api/version, or a body we cannot read: counted, never fatal.
            self.undecodable_responses[api] = self.undecodable_responses.get(api, 0) + 1
            return
        entries, records = found
        for topic, _partition, code in entries:
            if not code:
                continue
            name = error_name(code)
            ekey = (api, name)
            self.errors[ekey] = self.errors.get(ekey, 0) + 1
            if self.options.topic_label and topic is not None:
                tkey = (api, self._topics(str(topic)), name)
                self.topic_errors[tkey] = self.topic_errors.get(tkey, 0) + 1
        if api_key == FETCH and records:
            self._add_records(api, frame, records)

    def _count_records(self, api_key: int, api_version: int, direction: Direction, frame: bytes, api: str) -> None:
        offset = request_body_offset(frame, api_key, api_version)
        found = None if offset is None else self._scan(api_key, api_version, direction, frame, offset)
        if found is not None and found[1]:
            self._add_records(api, frame, found[1])
        # else: a malformed request is the broker's to refuse; nothing to count

    def _add_records(self, api: str, frame: bytes, ranges: list[tuple[int, int]]) -> None:
        view = memoryview(frame)
        try:
            count = sum(count_records(view[start:end]) for start, end in ranges)
        except ProtocolError:
            return  # records kproxy cannot read are the client's to judge: forwarded, not counted
        self.records[api] = self.records.get(api, 0) + count

    # -- connections -------------------------------------------------------------------
    def client_connected(self, listener: str) -> None:
        self.client_connections[listener] = self.client_connections.get(listener, 0) + 1
        self.client_connections_total[listener] = self.client_connections_total.get(listener, 0) + 1

    def client_disconnected(self, listener: str) -> None:
        self.client_connections[listener] = self.client_connections.get(listener, 0) - 1

    def upstream_connected(self, broker: str) -> None:
        self.upstream_connections[broker] = self.upstream_connections.get(broker, 0) + 1

    def upstream_disconnected(self, broker: str) -> None:
        self.upstream_connections[broker] = self.upstream_connections.get(broker, 0) - 1

    def upstream_connect_failed(self, broker: str) -> None:
        self.upstream_connect_failures[broker] = self.upstream_connect_failures.get(broker, 0) + 1

    def frame_rejected(self, reason: str) -> None:
        self.frames_rejected[reason] = self.frames_rejected.get(reason, 0) + 1
