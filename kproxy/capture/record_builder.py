"""From captured exchanges to capture records, on the writer thread, a batch at a time.

The observer (:mod:`kproxy.capture.observer`) hands the writer one
:data:`Captured` tuple per request/response pair: references to the frames as
they went through (immutable ``bytes``, never copied) and a few numbers. All the
reading happens here, off the proxy's event loop, when the writer takes a batch:
:meth:`RecordBuilder.rows` turns the batch into rows (tuples in the order of
:data:`kproxy.capture.record_schema.COLUMN_NAMES`, nested lists as tuples in their item
order) that the writer transposes into Arrow columns.

What is read, and how far:

* every request: its header (client id) and a topic/partition scan of the body
  (records skipped by length, their byte ranges noted); Produce's acks and
  transactional id read in place; group and transaction requests (small)
  decoded fully for ``group_id`` / ``transactional_id``. Produce and Fetch
  bodies are never decoded.
* every response: a scan for error codes per partition and for Fetch's record
  batches. Responses other than Produce and Fetch keep only their non-zero
  per-partition codes (a Metadata response lists every partition of the
  cluster; that is not traffic).
* records are counted from batch headers (no decompression, but for legacy
  compressed wrappers); keys and values are decoded only with
  ``include_payloads``, cut to ``payload_max_bytes``. All of a frame's records
  reading runs under one :class:`~kproxy.protocol.records.RecordBudget`: a
  frame that needs more (a decompression bomb) is read no further, its records
  past that point are not counted nor kept, and it is counted in
  :attr:`RecordBuilder.over_budget` and logged (rate-limited).
* what was read of a small frame is kept, by its content less the correlation
  id (:data:`CACHE_FRAME`): a repeated request or response is read once; so is
  a big Metadata answer, kept by a hash of its content (:data:`BIG_MEMO_BYTES`).

Fetch v13+ names topics by id: a :class:`~kproxy.protocol.topic_ids.TopicIdNames`
learns id -> name from the Metadata responses of every connection, the only
responses decoded in full. The writer reads the batches in the order the
observers offered them, so a name learned from a Metadata response serves the
Fetch records after it.

This module is pure (no pyarrow, no threads): one :class:`RecordBuilder` is
used by one thread, the writer's (the only one that reads Metadata answers:
after a big one's first pass it gives the GIL back, see :meth:`RecordBuilder._read_response`;
in the proxy's process the writer's whole turn runs with the interpreter's switch
interval cut, :mod:`kproxy.capture.writer`).

Why one module: one job, mostly :class:`RecordBuilder`, whose
readers share its tables and memos (split, each half would import the other); the row helpers
are in :mod:`kproxy.capture.rows`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kproxy.capture.columns import PendingColumns
from kproxy.capture.connection_info import ConnectionInfo
from kproxy.capture.partition_items import VALUE_APIS, merge_partitions, with_offsets
from kproxy.capture.record_schema import CONNECTION_CLOSED_KEY, CONNECTION_CLOSED_NAME, SCHEMA_VERSION
from kproxy.capture.rows import as_dict as as_dict  # re-exported: where readers of rows have found it
from kproxy.protocol.api_keys import FETCH, FIND_COORDINATOR, METADATA, OFFSET_COMMIT, OFFSET_FETCH, PRODUCE
from kproxy.protocol.codes import ApiKey, api_name
from kproxy.protocol.errors import DecodeError, OverBudgetError, ProtocolError
from kproxy.protocol.headers import request_body_offset, response_body_offset
from kproxy.protocol.message_schemas import MessageType, message_schema
from kproxy.protocol.messages import decode_body
from kproxy.protocol.offset_reads import FETCH_SPANS, written_spans
from kproxy.protocol.produce_scan import produce_answer
from kproxy.protocol.records import (
    RecordBudget,
    count_records,
    decode_records,
    iter_batches,
    one_batch_count,
    v2_dated,
    v2_max_timestamp,
    v2_producer_head,
)
from kproxy.protocol.request_fields import produce_head, request_client_id
from kproxy.protocol.scan import SCAN_FAILURES, Entry, RequestScan, scanner
from kproxy.protocol.scan_types import ScanEntries
from kproxy.protocol.topic_ids import TopicIdNames
from kproxy.ratelimit import LogRateLimit

log = logging.getLogger("kproxy.capture")

_RECORD_APIS = frozenset({PRODUCE, FETCH})
# Requests decoded in full for group_id / transactional_id: all small, none carries records
# (DescribeGroups takes a list of groups: not decoded).
_ID_APIS = frozenset(int(key) for key in (
    ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP, ApiKey.HEARTBEAT,
    ApiKey.LEAVE_GROUP, ApiKey.SYNC_GROUP, ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN,
    ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT, ApiKey.OFFSET_DELETE,
    ApiKey.CONSUMER_GROUP_HEARTBEAT))
# The kinds whose offsets are read with their answer's non-zero codes (partition_items.with_offsets).
_CODED_OFFSETS = frozenset({OFFSET_COMMIT, OFFSET_FETCH})
# Group requests whose member id, static member id and session timeout a record carries (version 5).
_MEMBER_APIS = frozenset(int(key) for key in (
    ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP, ApiKey.OFFSET_COMMIT,
    ApiKey.TXN_OFFSET_COMMIT, ApiKey.CONSUMER_GROUP_HEARTBEAT))
# A frame over its records budget is logged at once, then at most once a minute with the count.
OVER_BUDGET_LOG_SECONDS = 60.0
_READ_FAILURES = (ProtocolError, *SCAN_FAILURES)

# One captured exchange, as the observer offers it (a plain tuple: built on the event loop per
# exchange, where a NamedTuple's constructor costs several times more). Field order:
#   0 conn          ConnectionInfo of the connection (frozen)
#   1 clock_offset  wall clock minus the session's clock, seconds (per connection)
#   2 principal     the connection's principal when the exchange completed
#   3 request       the request frame, size prefix included (b"" when not seen), or its EarlyRead
#   4 response      the response frame as released to the client, or its EarlyRead; None: none
#                   (acks=0, unanswered)
#   5 api_key  6 api_version  7 correlation_id  8 request_size
#   9 read_at  10 forwarded_at  11 received_at  12 completed_at   (the session's clock)
#   13 local        kproxy answered itself
#   14 response_body_offset  where the response body starts (0: not computed)
#   15 held  16 rule_decisions  Exchange.held (seconds rules held the response, owner) or None; its decisions
#   17 request_scan  a Produce request's scan as the session shared it (Exchange.request_scan: the
#                   metrics and the rules read the same), or None: the writer reads the frame itself
Captured = tuple[Any, ...]
# A connection's close, as the observer offers it after its last exchange (schema version 5): a
# plain tuple too, told from a Captured one by its length. Field order:
#   0 conn  1 clock_offset  2 principal  3 closed_at (the session's clock)  4 reason (None: not given)
ClosedConnection = tuple[Any, ...]
_CLOSED_FIELDS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class PayloadOptions:
    include: bool = False
    max_bytes: int = 1024
    max_records: int = 100  # per request/response pair


# What a scan of one frame contributes to a record: per topic-partition entries (the topic as the
# frame names it: a name, or a UUID until resolved), the first non-zero top-level error code, and
# the offsets its values mode read (the kinds of VALUE_APIS; None for the others).
_Entry = tuple[Any, int | None, int | None, int, int]  # topic, partition, error code, records, bytes
_Scan = tuple[tuple[_Entry, ...], int | None, list[tuple[object, ...]] | None]
# Frames up to this size have their reading cached by content (correlation id left out): clients
# repeat small requests and get the same small answers (ApiVersions, Metadata refreshes,
# Heartbeats, Fetches of idle partitions) and reading a Metadata response of a few hundred
# partitions is the costliest thing the capture does. Not Produce: its requests carry new records
# and its responses new offsets every time. Bounded: CACHE_ENTRIES per direction.
CACHE_FRAME = 4096
CACHE_ENTRIES = 2048
# Bigger Metadata answers are remembered too, by their body's length and Python's keyed 64-bit hash
# (SipHash; as kproxy/metrics/stats.py ScanMemo): clients refresh Metadata again and
# again and brokers answer the same bytes, and reading an answer of 100,000 partitions (its topic ids
# decoded, its error codes scanned) costs the writer far more than that hash. Nothing big is kept: an entry
# is its key, the scan (non-zero codes only) and the TopicIdNames stamp it was read at; it counts
# BIG_MEMO_ENTRY bytes plus BIG_MEMO_CODE per error entry, and the memo starts afresh past
# BIG_MEMO_BYTES.
BIG_MEMO_BYTES = 256 * 1024
BIG_MEMO_ENTRY = 1024
BIG_MEMO_CODE = 64


# Request (Produce) and response (Fetch) frames from this size on are read on the event loop as
# soon as the observer sees them, and let go: holding them until the writer's next turn makes the
# proxy's heap grow and churn (page faults on every big Produce with capture on). Reading one costs
# the same whatever its size (records are skipped by length), so the loop's share stays small
# per GB of such frames (docs/PERFORMANCE.md).
EARLY_READ_BYTES = 16 * 1024


class EarlyRead:
    """What :class:`RecordBuilder` read of a big frame on the event loop, in its place in a
    :data:`Captured` tuple: per-partition entries, the facts (request: acks, ids, client id;
    response: its scan, None when unreadable), payloads when kept, and the frame's size."""

    __slots__ = ("entries", "facts", "payloads", "size")

    def __init__(self, entries: tuple[_Entry, ...], facts: Any, payloads: list[tuple[Any, ...]] | None,
                 size: int) -> None:
        self.entries = entries
        self.facts = facts
        self.payloads = payloads
        self.size = size


class _Kind:
    """What reading one kind of exchange (api key and version) needs, worked out once: the
    generated scanners, the api's name, whether its frames are cached, whether the response
    has a top-level error code."""

    __slots__ = ("api_key", "api_version", "cached", "id", "name", "payloads", "records", "request_scan",
                 "response_scan", "top_code", "values")

    def __init__(self, api_key: int, api_version: int, include_payloads: bool) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.id = (api_key << 16) | (api_version & 0xFFFF)  # one int: cheaper to hash than a tuple
        self.name = api_name(api_key)
        self.records = api_key in _RECORD_APIS
        self.payloads = include_payloads and self.records
        # Not Produce: see CACHE_FRAME. Not with payloads kept: they are not part of the cache.
        self.cached = api_key != PRODUCE and not self.payloads
        # The exchanges carrying committed offsets and watermarks are scanned in values mode (version 3).
        self.values = api_key in VALUE_APIS
        self.request_scan = scanner(api_key, api_version, MessageType.REQUEST, values=self.values)
        # Responses other than Produce and Fetch keep only non-zero codes: the errors-only scan reads
        # no further than the last error code (an ApiVersions response: its first field).
        self.response_scan = scanner(api_key, api_version, MessageType.RESPONSE, errors_only=not self.records,
                                     values=self.values)
        self.top_code = _top_level_code(api_key, api_version)


class RecordBuilder:
    """Rows of capture records from :data:`Captured` exchanges; see the module docstring."""

    def __init__(self, topics: TopicIdNames | None = None, payloads: PayloadOptions = PayloadOptions()) -> None:
        self.topics = topics if topics is not None else TopicIdNames()
        self.payloads = payloads
        self._kinds: dict[int, _Kind] = {}
        self._requests: dict[tuple[int, bytes], tuple[tuple[_Entry, ...], dict[str, Any]]] = {}
        self._responses: dict[tuple[int, bytes], _Scan] = {}
        # (kind id, body length, hash of the body) -> (scan or None: unreadable, TopicIdNames.forgotten then)
        self._big: dict[tuple[int, int, int], tuple[_Scan | None, int]] = {}
        self._big_bytes = 0
        # Frames whose records needed more than their RecordBudget. Two counts, each with one writer
        # (the event loop's early reads, the writer thread's reads), so no increment races another.
        self._over_budget_early = 0
        self._over_budget_late = 0
        self._over_budget_log = LogRateLimit(OVER_BUDGET_LOG_SECONDS)

    @property
    def over_budget(self) -> int:
        """Frames read no further because their records needed more than their budget (only rises)."""
        return self._over_budget_early + self._over_budget_late

    def _gave_up(self, kind: _Kind, budget: RecordBudget, early: bool) -> None:
        if early:
            self._over_budget_early += 1
        else:
            self._over_budget_late += 1
        held = self._over_budget_log.due()  # a line lost to two threads racing here is no loss
        if held is not None:
            log.warning("event=records_over_budget reader=capture api=%s budget_bytes=%d frames=%d", kind.name,
                        budget.total, held)

    def rows(self, batch: Iterable[Captured]) -> list[tuple[Any, ...]]:
        """One row per exchange, in order; an exchange that cannot be read still makes a row."""
        return [self.row(item) for item in batch]

    def add_rows(self, batch: Iterable[Captured], pending: PendingColumns) -> None:
        """:meth:`rows`, each row put into ``pending``'s columns as it is made (the writer thread's way:
        no list of rows in between)."""
        for item in batch:
            pending.add_row(self.row(item))

    def row(self, item: Captured) -> tuple[Any, ...]:
        # Each field read into a typed local: compiled, the numbers are then native (a float's
        # arithmetic, an int's shift), not generic operations on objects.
        if len(item) != 18:
            if len(item) == _CLOSED_FIELDS:
                return _closed_row(item)
            raise ValueError(f"a captured exchange of {len(item)} fields, not 18")
        conn: ConnectionInfo = item[0]
        wall: float = item[1]
        principal: str | None = item[2]
        request: bytes | EarlyRead = item[3]
        response: bytes | EarlyRead | None = item[4]
        api_key: int = item[5]
        api_version: int = item[6]
        correlation_id: int = item[7]
        request_size: int = item[8]
        read_at: float = item[9]
        forwarded_at: float = item[10]
        received_at: float = item[11]
        completed_at: float = item[12]
        local: bool = item[13]
        response_offset: int = item[14]
        held: tuple[float, object] | None = item[15]
        decisions: tuple[tuple[Any, ...], ...] = item[16]
        request_scan: RequestScan | None = item[17]
        kind = self._kinds.get((api_key << 16) | (api_version & 0xFFFF))
        if kind is None:
            kind = self._kind(api_key, api_version)
        payloads = None
        req: dict[str, Any] = {}
        entries: tuple[_Entry, ...] = ()
        shared = None if request_scan is None else self._from_scan(kind, request, request_scan)
        if shared is not None:
            entries, req = shared
        elif isinstance(request, EarlyRead):
            entries, req, payloads = request.entries, request.facts, request.payloads
        elif request:
            key = (kind.id, request[12:]) if kind.cached and len(request) <= CACHE_FRAME else None
            hit = self._requests.get(key) if key is not None else None
            if hit is None:
                entries, req, payloads = self._request_part(kind, request)
                if key is not None:
                    _remember(self._requests, key, (entries, req))
            else:
                entries, req = hit
        response_entries: tuple[_Entry, ...] = ()
        top_code: int | None = None
        answer = None
        response_size = None
        if response is not None:
            fetched = None
            if isinstance(response, EarlyRead):
                scan, fetched, response_size = response.facts, response.payloads, response.size
            else:
                response_size = len(response)
                if response_size > CACHE_FRAME and api_key == METADATA:
                    scan = self._big_metadata(kind, response, response_offset)
                else:
                    key = (kind.id, response[8:]) if kind.cached and response_size <= CACHE_FRAME else None
                    scan = self._responses.get(key) if key is not None else None
                    if scan is None:
                        scan, fetched = self._response_part(kind, response, response_offset)
                        if key is not None:
                            _remember(self._responses, key, scan)
            if scan is None:  # unreadable: nothing of the pair's topics is sure
                entries, scan = (), ((), None, None)
            if fetched is not None:
                payloads = fetched
            response_entries, top_code, answer = scan
            if top_code is None and kind.top_code:
                top_code = 0
        record_count = record_bytes = 0
        partitions: tuple[tuple[Any, ...], ...] = ()
        if entries or response_entries:
            partitions, record_count, record_bytes = merge_partitions(entries, response_entries, self.topics.name)
        if kind.values and response is not None:
            errors: list[tuple[Any, Any, Any]] = []
            if api_key in _CODED_OFFSETS:
                errors = [(topic, partition, code) for topic, partition, code, _, _ in response_entries if code]
                if top_code:
                    errors.append((None, None, top_code))
            produced = None
            if api_key == PRODUCE and not req.get("records_over_budget"):
                stamps = req.get("written") or {}
                produced = [(topic, partition, n, stamps.get((topic, partition), -1))
                            for topic, partition, _, n, _ in entries if partition is not None]
            partitions = with_offsets(partitions, api_key, api_version, req.get("offsets"), answer,
                                      None if answer is None else errors, self.topics.name, produced)
        if api_key == PRODUCE and partitions:
            one = req.get("head")  # (the usual Produce's: its one partition and batch, see _from_scan)
            if one is not None and len(partitions) == 1:
                partitions = (partitions[0][:11] + one[2],)
            else:
                heads = req.get("heads") if one is None else {(one[0], one[1]): one[2]}
                if heads:
                    partitions = _with_heads(partitions, heads, self.topics.name)
        # Latencies as Exchange.broker_seconds and Exchange.overhead_seconds compute them (held: the rules' time).
        overhead = forwarded_at - read_at
        broker = None
        if response is not None:
            overhead += completed_at - received_at - (held[0] if held is not None else 0.0)
            if not local:
                broker = (received_at - forwarded_at) * 1000.0
        return (
            SCHEMA_VERSION,
            int((read_at + wall) * 1_000_000),
            int((completed_at + wall) * 1_000_000) if response is not None else None,
            conn.connection_id, conn.client_host, conn.client_port,
            req["client_id"] if req else None,
            principal, conn.listener, conn.node_id, conn.upstream,
            api_key, kind.name, api_version, correlation_id, request_size,
            response_size,
            broker, overhead * 1000.0, local, top_code,
            req.get("acks"), req.get("group_id"), req.get("transactional_id"),
            record_count, record_bytes,
            partitions,
            decisions,  # (rule, action, detail, dry_run) each: RULE_DECISION_ITEMS' order
            payloads if self.payloads.include else None,
            conn.cluster,
            req.get("member_id"), req.get("group_instance_id"), req.get("session_timeout_ms"),
            None,
        )

    def _big_metadata(self, kind: _Kind, response: bytes, offset: int) -> _Scan | None:
        """The scan of a Metadata answer above :data:`CACHE_FRAME`, read once per body (see
        :data:`BIG_MEMO_BYTES`). A repeated answer teaches :class:`TopicIdNames` nothing new, unless
        names were forgotten since it was read: then it is read again."""
        body = memoryview(response)[8:]  # less the size and the correlation id; a view: no copy
        key = (kind.id, len(body), hash(body if type(response) is bytes else body.tobytes()))
        topics = self.topics
        hit = self._big.get(key)
        if hit is not None and hit[1] == topics.forgotten:
            return hit[0]
        scan, _ = self._response_part(kind, response, offset)
        cost = BIG_MEMO_ENTRY + BIG_MEMO_CODE * (len(scan[0]) if scan is not None else 0)
        if self._big_bytes + cost > BIG_MEMO_BYTES:
            self._big.clear()
            self._big_bytes = 0
        self._big_bytes += cost  # a stale entry replaced is counted twice: the bound only errs low
        self._big[key] = (scan, topics.forgotten)
        return scan

    def _kind(self, api_key: int, api_version: int) -> _Kind:
        kind = self._kinds.get((api_key << 16) | (api_version & 0xFFFF))
        if kind is None:
            kind = _Kind(api_key, api_version, self.payloads.include)
            self._kinds[kind.id] = kind  # both threads may add one: the same, either stays
        return kind

    # -- reading one frame (the writer thread, or the event loop for big frames: EarlyRead) ------
    def _from_scan(self, kind: _Kind, frame: Any, scan: RequestScan
                   ) -> tuple[tuple[_Entry, ...], dict[str, Any]] | None:
        """What :meth:`_request_part` reads of a Produce request, from the scan the session shared
        (:attr:`kproxy.proxy.exchange.Exchange.request_scan`) instead of a scan of its own: the
        usual Produce, one partition whose records are one v2 batch (its count read in its header).
        None for any other shape, or with payloads kept: the frame is read in full then."""
        found, ranges = scan
        if len(found) != 1 or len(ranges) > 1 or kind.payloads or type(frame) is not bytes:
            return None
        topic, partition, _ = found[0]
        count = size = 0
        if ranges:
            start, end, _ = ranges[0]
            counted = one_batch_count(frame, start, end)
            if counted is None:
                return None
            count, size = counted, end - start
        body = request_body_offset(frame, kind.api_key, kind.api_version)
        if body is None:
            return None
        req: dict[str, Any] = {}
        if ranges:
            req["written"] = {(topic, partition): v2_max_timestamp(frame, ranges[0][0], ranges[0][1])}
            head = v2_producer_head(frame, ranges[0][0], ranges[0][1])
            if head is not None:
                req["head"] = (topic, partition, head)
        req["transactional_id"], req["acks"] = produce_head(frame, kind.api_version, body)
        req["client_id"] = request_client_id(frame, kind.api_key, kind.api_version)
        return ((topic, partition, None, count, size),), req

    def early_request(self, api_key: int, api_version: int, frame: bytes, scan: RequestScan | None = None
                      ) -> EarlyRead:
        """What a record needs of a big request frame, read now so that the frame is not held (from
        ``scan``, the session's scan of it, when it has the usual shape: see :meth:`_from_scan`)."""
        kind = self._kind(api_key, api_version)
        shared = None if scan is None else self._from_scan(kind, frame, scan)
        if shared is not None:
            return EarlyRead(shared[0], shared[1], None, len(frame))
        entries, req, payloads = self._request_part(kind, frame, early=True)
        return EarlyRead(entries, req, payloads, len(frame))

    def early_response(self, api_key: int, api_version: int, frame: bytes, offset: int) -> EarlyRead:
        """As :meth:`early_request`, of a big response frame (not Metadata: that one teaches
        :class:`TopicIdNames`, which only the writer thread touches)."""
        assert api_key != METADATA
        scan, fetched = self._response_part(self._kind(api_key, api_version), frame, offset, early=True)
        return EarlyRead((), scan, fetched, len(frame))

    def _request_part(self, kind: _Kind, request: bytes, *, early: bool = False
                      ) -> tuple[tuple[_Entry, ...], dict[str, Any], list[tuple[Any, ...]] | None]:
        """What the record takes of a request (``early``: read on the event loop)."""
        budget = RecordBudget()
        try:
            entries, req, payloads = self._read_request(kind, request, budget)
        except _READ_FAILURES as exc:
            log.debug("event=capture_request_unreadable api=%s reason=%s", kind.name, type(exc).__name__)
            entries, req, payloads = (), {}, None
        if budget.exhausted:
            self._gave_up(kind, budget, early)
            req["records_over_budget"] = True  # (its records' counts are short: no log end offset from them)
        req["client_id"] = request_client_id(request, kind.api_key, kind.api_version)  # cached with the rest
        return entries, req, payloads

    def _response_part(self, kind: _Kind, response: bytes, offset: int, *, early: bool = False
                       ) -> tuple[_Scan | None, list[tuple[Any, ...]] | None]:
        """The response's scan (None: unreadable) and Fetch's payloads when kept."""
        budget = RecordBudget()
        try:
            return self._read_response(kind, response, offset, budget)
        except _READ_FAILURES as exc:
            log.debug("event=capture_response_unreadable api=%s reason=%s", kind.name, type(exc).__name__)
            return None, None
        finally:
            if budget.exhausted:
                self._gave_up(kind, budget, early)

    def _read_request(self, kind: _Kind, frame: bytes, budget: RecordBudget
                      ) -> tuple[tuple[_Entry, ...], dict[str, Any], list[tuple[Any, ...]] | None]:
        out: dict[str, Any] = {}
        api_key, api_version = kind.api_key, kind.api_version
        body = request_body_offset(frame, api_key, api_version)
        if body is None:
            raise DecodeError("truncated request header", offset=4)
        entries: tuple[_Entry, ...] = ()
        payloads = None
        fn = kind.request_scan
        if fn is not None:
            (entries, _, offsets), found = _scan(fn, frame, body, budget, keep_all=True, values=kind.values)
            if offsets is not None:
                out["offsets"] = offsets
            if api_key == PRODUCE:
                out["written"] = _written(found, frame)
                out["heads"] = _heads(found, frame)
                if kind.payloads:
                    payloads = self._payloads(found, frame, budget)
        if api_key == PRODUCE:
            out["transactional_id"], out["acks"] = produce_head(frame, api_version, body)
        elif api_key in _ID_APIS:
            decoded = decode_body(api_key, api_version, MessageType.REQUEST, frame, body)
            out["group_id"] = decoded.get("group_id")
            out["transactional_id"] = decoded.get("transactional_id")
            if api_key in _MEMBER_APIS:
                _member(decoded, out)
            if api_key == FIND_COORDINATOR:
                key = decoded.get("key") or next(iter(decoded.get("coordinator_keys") or ()), None)
                if key is not None:
                    out["transactional_id" if decoded.get("key_type") == 1 else "group_id"] = key
        return entries, out, payloads

    def _read_response(self, kind: _Kind, response: bytes, offset: int, budget: RecordBudget
                       ) -> tuple[_Scan, list[tuple[Any, ...]] | None]:
        """What the response adds to the record, and Fetch's payloads when they are kept."""
        api_key, api_version = kind.api_key, kind.api_version
        if api_key == METADATA:
            if self.topics.learn_metadata(response, api_version, offset) is None:
                raise DecodeError("unreadable Metadata response", offset=offset)
            if len(response) > CACHE_FRAME:
                time.sleep(0)  # the writer thread (Metadata is never read early): let the event loop in
        fn = kind.response_scan
        if fn is None:
            return ((), None, None), None
        offset = offset or response_body_offset(response, api_key, api_version)
        if api_key == PRODUCE:
            # The usual answer (one topic, one partition) read by hand: what the scanner finds in it
            # (tests/test_scan_shared.py), at a fraction of its cost.
            usual = produce_answer(response, offset, api_version)
            if usual is not None:
                topic, index, code, _ = usual
                return (((topic, index, code, 0, 0),), None, [usual] if kind.values else None), None
        scan, found = _scan(fn, response, offset, budget, keep_all=kind.records, values=kind.values,
                            dated=api_key == FETCH)
        if kind.payloads and api_key == FETCH:
            return scan, self._payloads(found, response, budget)
        return scan, None

    def _payloads(self, found: list[Any], frame: bytes, budget: RecordBudget) -> list[tuple[Any, ...]]:
        """Keys and values of the frame's first records (``max_records``), a batch at a time, within
        ``budget``: a batch over it ends the reading (the payloads read so far are kept)."""
        cap, limit = self.payloads.max_bytes, self.payloads.max_records
        acc, recs = _by_entry(found)
        out: list[tuple[Any, ...]] = []
        view = memoryview(frame)
        for index, start, end in recs:
            topic, partition, _ = acc[index] if index < len(acc) else (None, None, None)
            try:
                records = [rec for batch in iter_batches(view[start:end])
                           for rec in decode_records(batch, check_crc=False, budget=budget)]
            except OverBudgetError:
                return out
            except ProtocolError:
                continue
            for rec in records:
                if len(out) >= limit:
                    return out
                out.append((self.topics.name(topic), partition, rec.offset,
                            None if rec.key is None else bytes(rec.key[:cap]),
                            None if rec.value is None else bytes(rec.value[:cap]),
                            -1 if rec.key is None else len(rec.key),
                            -1 if rec.value is None else len(rec.value)))
        return out


def _scan(fn: Callable[..., int], frame: bytes, offset: int, budget: RecordBudget, *, keep_all: bool,
          values: bool = False, dated: bool = False) -> tuple[_Scan, list[Any]]:
    """Run a generated scanner; its entries with their records counted from the batch headers
    (legacy compressed wrappers within ``budget``: the ones past it are not counted).

    ``keep_all`` False keeps only entries with a non-zero code or records. The scanner gets
    one list for its entries and its records ranges alike: it notes a partition's records
    range (``(start, end, topic)``: an int first) while walking the partition struct and the
    partition's entry (``(topic, partition, code)``: never an int first) when the struct ends,
    so each range belongs to the next entry in the list. That
    order, read in one pass, is what the scan also returns (see :func:`_by_entry`). ``values``: the
    scanner is a values-mode one (its kind is in VALUE_APIS): what it read is the scan's third part.
    ``dated`` (a Fetch answer's, in values mode): each range's batch headers are read once for its
    records and when they were written together, and the spans go into the values
    (:func:`_fetched_written`).
    """
    found: list[Any] = ScanEntries.empty() if values else []
    fn(frame, offset, found, found, None)
    entries: list[_Entry] = []
    top: int | None = None
    n = size = 0
    view = None
    batches: list[tuple[int, int, int]] = []  # (dated) the last range's, of the entry noted next
    written: list[tuple[Any, Any, list[tuple[int, int, int]]]] = []  # (dated) per partition entry
    ranges = 0
    for x in found:
        if type(x[0]) is int:  # a records range, of the entry noted next
            start, end, _ = x
            if dated:
                ranges += 1
                batches = []
                counted, stop = v2_dated(frame, start, end, batches)
                if stop < end:  # not whole v2 batches: the count goes on where the headers' stopped
                    if view is None:
                        view = memoryview(frame)
                    counted += count_records(view[stop:end], budget=budget)
                n += counted
            else:
                if view is None:
                    view = memoryview(frame)
                n += count_records(view[start:end], budget=budget)
            size += end - start
            continue
        topic, partition, code = x
        if topic is None and partition is None:  # a top-level code: the record's error_code
            if code and top is None:
                top = code
        elif keep_all or code or n:
            entries.append((topic, partition, code, n, size))
        if dated:
            if partition is not None:
                written.append((topic, partition, batches))
            batches = []
        n = size = 0
    answer: list[tuple[object, ...]] | None = found.values if values else None  # type: ignore[attr-defined]
    if dated and ranges and answer is not None:
        _fetched_written(written, ranges, answer)
    return (tuple(entries), top, answer), found


def _written(found: list[Any], frame: bytes) -> dict[tuple[Any, Any], int]:
    """A Produce request's scan (see :func:`_scan`) read for when its records were written: per
    (topic, partition) the latest max timestamp of the v2 batch headers of its records (ms since the
    epoch; -1: none, a legacy message set), read in place."""
    out: dict[tuple[Any, Any], int] = {}
    latest = -1
    for x in found:
        if type(x[0]) is int:  # a records range, of the entry noted next
            stamp = v2_max_timestamp(frame, x[0], x[1])
            if stamp > latest:
                latest = stamp
        else:
            if x[1] is not None:
                out[(x[0], x[1])] = latest
            latest = -1
    return out


def _closed_row(item: ClosedConnection) -> tuple[Any, ...]:
    """The record of a connection's close (:data:`ClosedConnection`): its time and reason, no exchange."""
    conn: ConnectionInfo = item[0]
    return (
        SCHEMA_VERSION, int((item[3] + item[1]) * 1_000_000), None,
        conn.connection_id, conn.client_host, conn.client_port, None,
        item[2], conn.listener, conn.node_id, conn.upstream,
        CONNECTION_CLOSED_KEY, CONNECTION_CLOSED_NAME, 0, -1, 0, None,
        None, 0.0, False, None,
        None, None, None, 0, 0, (), (), None,
        conn.cluster, None, None, None, item[4],
    )


def _heads(found: list[Any], frame: bytes) -> dict[tuple[Any, Any], tuple[int, int, int, int, int]]:
    """A Produce request's scan (see :func:`_scan`) read for its batches' producers: per (topic,
    partition) its records range's first v2 batch header's producer id, epoch, base sequence, CRC and
    codec (:func:`~kproxy.protocol.records.v2_producer_head`; none for a legacy message set)."""
    out: dict[tuple[Any, Any], tuple[int, int, int, int, int]] = {}
    head = None
    for x in found:
        if type(x[0]) is int:  # a records range, of the entry noted next
            head = v2_producer_head(frame, x[0], x[1])
        else:
            if head is not None and x[1] is not None:
                out[(x[0], x[1])] = head
            head = None
    return out


def _with_heads(partitions: tuple[tuple[Any, ...], ...], heads: dict[tuple[Any, Any], tuple[int, ...]],
                name: Callable[[object], str | None]) -> tuple[tuple[Any, ...], ...]:
    """A Produce record's partition items with their first batch's producer fields (:func:`_heads`,
    keyed by the topic as the request names it: a name, or an id until named)."""
    named = {(topic if type(topic) is str else name(topic), partition): head
             for (topic, partition), head in heads.items()}
    return tuple(item[:11] + named[(item[0], item[1])] if (item[0], item[1]) in named else item
                 for item in partitions)


def _member(decoded: dict[str, Any], out: dict[str, Any]) -> None:
    """A decoded group request's member id, static member id and session timeout into ``out``
    (a LeaveGroup v3+ names its members in a list: its first one's)."""
    members = decoded.get("members")
    first = members[0] if isinstance(members, list) and members and isinstance(members[0], dict) else decoded
    member = first.get("member_id")
    instance = first.get("group_instance_id")
    out["member_id"] = member if isinstance(member, str) else None
    out["group_instance_id"] = instance if isinstance(instance, str) else None
    session = decoded.get("session_timeout_ms")
    out["session_timeout_ms"] = session if isinstance(session, int) else None


def _fetched_written(written: list[tuple[Any, Any, list[tuple[int, int, int]]]], ranges: int,
                     out: list[tuple[object, ...]]) -> None:
    """A Fetch answer's write times (its scan's ``written``: per partition entry, the batches of its
    records range, from :func:`_scan`) into ``out``, its values, as the live tracker reads them
    (:meth:`kproxy.metrics.consumer_lag.ConsumerLag.fetch_answer`: only when every partition of the
    answer carried records, ``ranges`` of them, in at most
    :data:`~kproxy.protocol.offset_reads.FETCH_SPANS` spans a partition): ``(topic, partition, first
    offset, last offset, max timestamp)`` per span (:func:`~kproxy.protocol.offset_reads.written_spans`).
    Five fields: the answer's values' partition items have four
    (:func:`kproxy.capture.partition_items.with_offsets` tells them apart)."""
    if ranges != len(written):
        return
    for topic, partition, batches in written:
        for first, last, stamp in (batches if len(batches) <= FETCH_SPANS else written_spans(batches, FETCH_SPANS)):
            if stamp >= 0:
                out.append((topic, partition, first, last, stamp))


def _by_entry(found: list[Any]) -> tuple[list[Entry], list[tuple[int, int, int]]]:
    """A scan's list split into its entries and its ranges, each range with its entry's index
    (the number of entries before it: a range after the last entry has none)."""
    acc: list[Entry] = []
    recs: list[tuple[int, int, int]] = []
    for x in found:
        if type(x[0]) is int:  # a records range (see _scan)
            recs.append((len(acc), x[0], x[1]))
        else:
            acc.append(x)
    return acc, recs


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    if len(cache) >= CACHE_ENTRIES:
        del cache[next(iter(cache))]  # the oldest
    cache[key] = value


@functools.cache
def _top_level_code(api_key: int, api_version: int) -> bool:
    """Does this response have a top-level error code (so that "no error" reads 0, not null)?"""
    schema = message_schema(api_key, api_version, MessageType.RESPONSE)
    return schema is not None and any(f.is_error_code and f.tag is None for f in schema.fields)

