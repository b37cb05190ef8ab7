"""Traffic statistics, kept in plain Python structures on the hot path.

Updating prometheus-client metric children costs a label lookup and a lock per
call; at tens of thousands of requests per second that alone would eat the
overhead budget. So the proxy counts into dicts and bucket lists here (one dict
operation per counter), and :mod:`kproxy.metrics.exposition` turns them into
Prometheus metric families only when Prometheus scrapes.

Cardinality is bounded by construction, whatever clients send: api names and
versions come from Kafka's tables (an api key kproxy does not know is
``unknown``, a version above the highest it knows for that api is ``other``,
so a client cycling through 65536 x 65536 key/version pairs adds two series,
not billions); error names come from the same tables (unknown codes collapse
to one name per code, and codes are int16), listener names and ``node_id`` values
are one per broker (plus ``bootstrap``); client ids and topics are opt-in labels capped by :class:`LabelCap` in count
(everything past the cap is ``other``) and in length (:data:`~kproxy.metrics.labels.MAX_LABEL_LENGTH`).

Broker identity: every broker-scoped series carries ``node_id``, the Kafka node id of the
broker behind the connection's listener, or ``bootstrap`` (:data:`BOOTSTRAP_NODE`) for
connections through the bootstrap port (whichever configured server accepted them). The
traffic counters of one node live in their own :class:`BrokerSeries`, which a connection
looks up once when it opens: per frame, the label costs nothing on the hot path; exposition adds it.

Per frame, the counters of a message kind (an ``(api_key, api_version)`` pair) are one
:class:`KindStats` of the connection's broker, found by one dict lookup on an int; it holds its
counts, its histograms and its response header layout, so nothing else is looked up or built
per frame. The label-keyed dicts /metrics reads (``requests``, ``responses``, ``byte_counts``)
are built from the kinds when asked, at scrape time.

What the rules did is counted apart, in :mod:`kproxy.metrics.fault_stats`; the histogram and the
label cap live in :mod:`kproxy.metrics.fixed_histogram` and :mod:`kproxy.metrics.labels`. What stays is
one structure, :class:`TrafficStats` with its per-broker and per-kind series, whose counting
methods and the scans they call share those series on every frame.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Final

from kproxy.metrics.client_anomalies import ANOMALY_CODES, AnomalyOptions, ClientAnomalies
from kproxy.metrics.fault_stats import FaultStats
from kproxy.metrics.fixed_histogram import BROKER_BUCKETS, LOOP_LAG_BUCKETS, OVERHEAD_BUCKETS, Histogram
from kproxy.metrics.group_anomalies import GroupWatch
from kproxy.metrics.labels import OTHER, LabelCap
from kproxy.metrics.retries import RetryWatch
from kproxy.metrics.traffic import RECORD_COUNT_BUDGET, LabelledTraffic
from kproxy.protocol.api_keys import FETCH, PRODUCE
from kproxy.protocol.codes import ERROR_CLASSES, ApiKey, api_snake_name, error_class, error_name
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.fetch_scan import fetch_answer_scan
from kproxy.protocol.headers import request_body_offset, response_body_offset, response_header_version
from kproxy.protocol.message_schemas import MessageType, known_api_keys, supported_versions
from kproxy.protocol.offset_reads import OFFSET_FIELDS
from kproxy.protocol.produce_scan import produce_answer_errors
from kproxy.protocol.scan import Entry, RecordsRange, run_scanner, run_values_scanner, scanner
from kproxy.proxy.commands import RejectReason

UNKNOWN_API = "unknown"
_MISSING: Final = object()
# The node_id label of series for connections through the bootstrap listener (and of configured bootstrap
# servers in kproxy_upstream_up): a word, not -1, so that a query or a panel legend reads as what it is.
BOOTSTRAP_NODE = "bootstrap"
KNOWN_REJECT_REASONS = tuple(reason.value for reason in RejectReason)  # every value of the reason label
# accept() failures that mean "out of descriptors or kernel memory": the server backs off and retries.
ACCEPT_CAPACITY_ERRORS = ("EMFILE", "ENFILE", "ENOBUFS", "ENOMEM")
__all__ = ["RECORD_COUNT_BUDGET"]  # (kproxy.metrics.traffic's, where records are counted)


# error code -> index in ERROR_CLASSES, filled as codes are seen (a few dozen at most).
_ERROR_RANK: Final[dict[int, int]] = {}
# Responses that brokers repeat byte for byte between cluster changes (the proxy's rewrite memo,
# kproxy/proxy/address_rewrite.py, relies on the same): their error scan is remembered per body, so a
# client polling Metadata or sending heartbeats costs one hash of the body instead of a scan (no hash
# at all for the answers the proxy rewrites: see TrafficStats.response's ``body``). ApiVersions is one:
# every connection opens with it, and its scan costs more than a memo hit.
# Produce and Fetch answers carry offsets and records: never the same twice, never remembered.
REPEATING_ANSWERS: Final = frozenset(int(k) for k in (ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.HEARTBEAT,
                                               ApiKey.DESCRIBE_CLUSTER, ApiKey.API_VERSIONS))
SCAN_MEMO_BODY_MAX: Final = 64 * 1024  # bodies up to this are remembered as they are; bigger ones by hash
SCAN_MEMO_BYTES: Final = 256 * 1024  # memo size per kind at most (a hash entry counts 1 KiB); then it starts afresh
_ScanResult = tuple[list[Entry], list[RecordsRange]] | None
_NO_RANGES: Final[list[RecordsRange]] = []  # a Produce answer has no records (never added to)


def kind_key(api_key: int, api_version: int) -> int:
    """The int a kind is found by: ``api_key << 16 | api_version``. Unique over the pairs kept as
    their own kind (key and version both in 0..32767, from Kafka's tables); any pair with a negative
    key or version maps to a negative int, which no kept kind has."""
    return api_key << 16 | api_version


class KindStats:
    """The counters of one message kind on one broker, as labelled: an ``(api, version)`` pair kproxy
    knows, or the pair every other version of an api (or every unknown api) folds into
    (``(api, "other")``, ``("unknown", "other")``).

    Objects instead of dicts keyed by label tuples: a request or a response adds to attributes of
    the kind its connection's :class:`BrokerSeries` finds by one int lookup (:func:`kind_key`), and
    the kind carries its histograms and response header layout along, so nothing is looked up again.
    """

    __slots__ = ("api", "broker", "known", "memo", "overhead", "request_bytes", "request_scanner", "requests",
                 "response_bytes", "responses", "scanner", "tagged_header", "values", "version")

    def __init__(self, api: str, version: int | str, known: bool, tagged_header: bool) -> None:
        self.api = api
        self.version = version
        self.known = known  # False for folded pairs: no scanner for them
        self.tagged_header = tagged_header  # response header v1: tagged fields after the correlation id
        self.requests = self.request_bytes = self.responses = self.response_bytes = 0
        # The broker's latency histogram of the api (shared by its versions) and kproxy's own (shared by
        # every broker), bound at the kind's first response.
        self.broker: Histogram | None = None
        self.overhead: Histogram | None = None
        self.scanner: object = _MISSING  # the errors-only response scanner, found at the first scan
        self.request_scanner: object = _MISSING  # the request's (Produce: to count records), likewise
        self.memo: ScanMemo | None = None  # the kind's remembered scans, if brokers repeat its answers
        self.values = False  # its answers are scanned in values mode (consumer lag: kproxy.metrics.consumer_lag)

    def add(self, other: KindStats) -> None:
        """Add ``other``'s counts (same labels) to this one's; histograms are the series' to add."""
        self.requests += other.requests
        self.request_bytes += other.request_bytes
        self.responses += other.responses
        self.response_bytes += other.response_bytes


class ScanMemo:
    """The remembered error scans of one message kind (see :data:`REPEATING_ANSWERS`): body -> result.

    Small bodies are their own key (compared exactly); big ones (a Metadata answer of a big
    cluster, whose scan costs far more than hashing it) are keyed by length and Python's keyed
    64-bit hash (SipHash), so nothing big is kept. Bounded by :data:`SCAN_MEMO_BYTES`.
    """

    __slots__ = ("bytes", "results")

    def __init__(self) -> None:
        self.results: dict[bytes | tuple[int, int], _ScanResult] = {}
        self.bytes = 0

def _histogram(table: dict[str, Histogram], api: str, bounds: tuple[float, ...]) -> Histogram:
    """The histogram of ``api`` in ``table``, made on first use."""
    hist = table.get(api)
    if hist is None:
        hist = table[api] = Histogram(bounds)
    return hist


@dataclass
class StatsOptions:
    client_id_label: bool = False
    topic_label: bool = False
    label_cap: int = 100
    scan_responses: bool = True
    consumer_lag: bool = False  # scan the answers consumer lag reads in values mode (OFFSET_FIELDS)
    anomalies: AnomalyOptions | None = None  # client anomalies detected (kproxy.metrics.client_anomalies); None: off


@dataclass
class BrokerSeries:
    """The traffic counters of one ``node_id`` (:attr:`node_id`), keyed as without the label.

    Got once per connection from :meth:`TrafficStats.broker`; the label is added at scrape time.
    Requests and responses are counted in :attr:`kinds` (see :class:`KindStats`); :attr:`requests`
    and :attr:`responses` are built from them when read.
    """

    node_id: str
    # kind_key(api key, version) -> its counters, for the pairs kproxy knows (a bounded set).
    kinds: dict[int, KindStats] = field(default_factory=dict)
    # api label -> the one KindStats its folded pairs share (versions past the known, unknown apis).
    folded: dict[str, KindStats] = field(default_factory=dict)
    broker_latency: dict[str, Histogram] = field(default_factory=dict)
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    # Responses carrying at least one error code, by api and the worst class among their codes:
    # a ratio to responses that stays within 0..1 however many partitions fail at once.
    responses_with_errors: dict[tuple[str, str], int] = field(default_factory=dict)

    def all_kinds(self) -> list[KindStats]:
        """Every kind met, folded ones included (a copy: safe to walk while traffic adds kinds)."""
        return [*list(self.kinds.values()), *list(self.folded.values())]

    @property
    def requests(self) -> dict[tuple[str, int | str], int]:
        """Requests read, by ``(api, version)`` label (built when read: a scrape, a report)."""
        return {(k.api, k.version): k.requests for k in self.all_kinds() if k.requests}

    @property
    def responses(self) -> dict[tuple[str, int | str], int]:
        """Responses written to clients, by ``(api, version)`` label (built when read)."""
        return {(k.api, k.version): k.responses for k in self.all_kinds() if k.responses}


# kproxy_sasl_authentications_total's result label: logged in; refused by the other side; neither (an
# answer that could not be accepted, or none in time).
SASL_RESULTS = ("success", "failure", "error")


def node_label(node_id: int | str | None) -> str:
    """The ``node_id`` label of a broker's node id; None (the bootstrap listener) is :data:`BOOTSTRAP_NODE`."""
    return BOOTSTRAP_NODE if node_id is None else str(node_id)


@dataclass
class TrafficStats:
    """Everything ``/metrics`` reports, updated by the server as traffic flows."""

    options: StatsOptions = field(default_factory=StatsOptions)
    started: float = field(default_factory=time.time)
    # Requests, responses, broker latency and error codes, by node_id (see BrokerSeries).
    brokers: dict[str, BrokerSeries] = field(default_factory=dict)
    # kproxy's own time: not the broker's, so by api only.
    overhead: dict[str, Histogram] = field(default_factory=dict)
    # How late the event loop ran a due task, one observation per heartbeat (kproxy.server.loopwatch).
    event_loop_lag: Histogram = field(default_factory=lambda: Histogram(LOOP_LAG_BUCKETS))
    # The same lateness less the loop thread's wait for a CPU: how long kproxy's own work held it.
    event_loop_held: Histogram = field(default_factory=lambda: Histogram(LOOP_LAG_BUCKETS))
    # The last periodic check of each upstream (kproxy.server.upstream_health), by (address, node_id).
    upstream_up: dict[tuple[str, str], int] = field(default_factory=dict)
    topic_errors: dict[tuple[str, str, str], int] = field(default_factory=dict)
    client_requests: dict[tuple[str, str], int] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)
    records_uncounted: dict[str, int] = field(default_factory=dict)
    # Client side by (listener, node_id); upstream side by (address, node_id), as kproxy_upstream_up.
    client_connections: dict[tuple[str, str], int] = field(default_factory=dict)
    client_connections_total: dict[tuple[str, str], int] = field(default_factory=dict)
    upstream_connections: dict[tuple[str, str], int] = field(default_factory=dict)
    upstream_connect_failures: dict[tuple[str, str], int] = field(default_factory=dict)
    frames_rejected: dict[str, int] = field(default_factory=dict)
    accept_errors: dict[str, int] = field(default_factory=dict)
    client_connections_refused: dict[tuple[str, str], int] = field(default_factory=dict)
    undecodable_responses: dict[str, int] = field(default_factory=dict)
    # SASL logins ended, by (side, mechanism, result); the re-authentications among them apart.
    sasl_authentications: dict[tuple[str, str, str], int] = field(default_factory=dict)
    sasl_reauthentications: dict[tuple[str, str, str], int] = field(default_factory=dict)
    faults: FaultStats = field(default_factory=FaultStats)

    def __post_init__(self) -> None:
        self._topics = LabelCap(self.options.label_cap)
        self._clients = LabelCap(self.options.label_cap)
        # Client anomalies (None: off), labelled by the client ids' one cap. The error count hands an
        # answer's anomalous code on in anomaly_code (0: none), for the observer, who knows the client.
        self.anomalies: ClientAnomalies | None = (None if self.options.anomalies is None
                                                  else ClientAnomalies(self._clients, self.options.anomalies))
        self.group_watch = (None if self.anomalies is None else
                            GroupWatch(self.anomalies, self.anomalies.options.rebalance_joins,
                                       self.anomalies.options.rebalance_window))
        self.retry_watch = (None if self.anomalies is None else
                            RetryWatch(self.anomalies, self.anomalies.options.retries_per_minute))
        self.anomaly_codes: frozenset[int] = frozenset() if self.anomalies is None else ANOMALY_CODES
        self.anomaly_code = 0
        # Records are counted there, once per range: by topic and client too when those labels are on.
        options = self.options
        self.labelled = LabelledTraffic(self._topics if options.topic_label else None,
                                        self._clients if options.client_id_label else None, options.label_cap)
        # Known api key -> (label, highest version kproxy knows); anything outside is folded (see _labels).
        self._apis: dict[int, tuple[str, int]] = {}
        for key in known_api_keys():
            span = supported_versions(key)
            if span is not None:
                self._apis[key] = (api_snake_name(key), span[1])
        self._scanners: dict[tuple[int, int, MessageType], object] = {}
        self._scan_memos: dict[tuple[int, int], ScanMemo] = {}  # (api key, version) of REPEATING_ANSWERS
        # The reasons kproxy.server.connection reports start at zero: a counter series born at 1
        # hides its first increase from rate()/increase(), so an alert would miss the first rejection.
        for reason in KNOWN_REJECT_REASONS:
            self.frames_rejected.setdefault(reason, 0)
        for api in ("produce", "fetch"):
            self.records_uncounted.setdefault(api, 0)
        for error in ACCEPT_CAPACITY_ERRORS:
            self.accept_errors.setdefault(error, 0)

    def broker(self, node_id: int | str | None) -> BrokerSeries:
        """The counters of one broker (None: the bootstrap listener), made on first use. Once per
        connection, not per frame: node ids are few (one per broker), so are these."""
        label = node_label(node_id)
        series = self.brokers.get(label)
        if series is None:
            series = self.brokers[label] = BrokerSeries(label)
        return series

    def totals(self) -> BrokerSeries:
        """Every broker's counters added up (``node_id`` ``*``): for a report across brokers, such as
        ``kproxy demo``'s; a copy, made when asked."""
        out = BrokerSeries("*")
        for series in list(self.brokers.values()):
            for name in ("kinds", "folded"):
                kinds: dict[Any, KindStats] = getattr(out, name)
                for key, kind in list(getattr(series, name).items()):
                    total_kind = kinds.get(key)
                    if total_kind is None:
                        total_kind = kinds[key] = KindStats(kind.api, kind.version, kind.known, kind.tagged_header)
                    total_kind.add(kind)
            for name in ("errors", "responses_with_errors"):
                into: dict[Any, int] = getattr(out, name)
                for key, n in list(getattr(series, name).items()):
                    into[key] = into.get(key, 0) + n
            for api, hist in list(series.broker_latency.items()):
                total = out.broker_latency.get(api)
                if total is None:
                    total = out.broker_latency[api] = Histogram(hist.bounds)
                total.add(hist)
        return out

    def api(self, api_key: int) -> str:
        """The ``api`` label of a key: its snake-case name, or ``unknown``."""
        known = self._apis.get(api_key)
        return UNKNOWN_API if known is None else known[0]

    def _labels(self, api_key: int, api_version: int) -> tuple[str, int | str, bool]:
        """``(api, version, known)`` labels of a pair: versions from 0 to the highest kproxy
        knows are kept (a client may still speak versions the specs have dropped); the rest
        fold into ``other``, and an unknown key into ``unknown``/``other``. ``known`` is False
        for folded pairs: there is no scanner for them either."""
        known = self._apis.get(api_key)
        if known is None:
            return UNKNOWN_API, OTHER, False
        if 0 <= api_version <= known[1]:
            return known[0], api_version, True
        return known[0], OTHER, False

    # -- what /metrics reads, built per scrape from the kinds ---------------------------
    @property
    def byte_counts(self) -> dict[tuple[str, str], int]:
        """Bytes by ``(api, "request" | "response")``, every broker's together."""
        out: dict[tuple[str, str], int] = {}
        for series in list(self.brokers.values()):
            for k in series.all_kinds():
                if k.requests:
                    key = (k.api, "request")
                    out[key] = out.get(key, 0) + k.request_bytes
                if k.responses:
                    key = (k.api, "response")
                    out[key] = out.get(key, 0) + k.response_bytes
        return out

    def _kind(self, broker: BrokerSeries, api_key: int, api_version: int) -> KindStats:
        """The KindStats of a pair not met yet on ``broker`` (made here), or of a folded pair (see
        :meth:`_labels`): folded pairs are never keyed by their own int, so however many a client
        cycles through, they cost one kind per api label."""
        api, version, known = self._labels(api_key, api_version)
        if known:
            kind = broker.kinds[kind_key(api_key, api_version)] = KindStats(
                api, version, True, response_header_version(api_key, api_version) >= 1)
            kind.values = self.options.consumer_lag and (api_key, MessageType.RESPONSE) in OFFSET_FIELDS
            if api_key in REPEATING_ANSWERS:  # one memo per kind, shared by every broker's
                memo = self._scan_memos.get((api_key, api_version))
                if memo is None:
                    memo = self._scan_memos[(api_key, api_version)] = ScanMemo()
                kind.memo = memo
            return kind
        folded = broker.folded.get(api)
        if folded is None:
            folded = broker.folded[api] = KindStats(api, version, False, False)
        return folded

    # -- per request / response ------------------------------------------------------
    def request(self, broker: BrokerSeries, api_key: int, api_version: int, size: int, client_id: str | None,
                frame: bytes | None = None, body_offset: int | None = None,
                records: list[RecordsRange] | None = None, acks: int | None = None) -> int | None:
        """A request was read from a client connected through ``broker``'s listener. ``frame`` is
        given for Produce (to count records), with ``body_offset`` where its body starts when the
        caller knows it, and ``records``, its records ranges, when the caller has scanned it already
        (the session's shared scan, :attr:`kproxy.proxy.session.Exchange.request_scan`); without
        them, the records are found here. ``client_id`` is given when it is a label (None otherwise):
        its Produce records are then that client's (:mod:`kproxy.metrics.traffic`), its batches
        counted under ``acks`` (the session's read of them; None: read here if need be).

        Returns the records of the ``records`` ranges given (-1: not all could be counted), None when
        none were given or counted (consumer lag takes a one-partition Produce's count from here)."""
        # kind_key, inlined (a call per frame costs more than the lookup); KindStats is never falsy.
        kind = broker.kinds.get(api_key << 16 | api_version) or self._kind(broker, api_key, api_version)
        kind.requests += 1
        kind.request_bytes += size
        if self.options.client_id_label:
            ckey = (self._clients(client_id or ""), kind.api)
            self.client_requests[ckey] = self.client_requests.get(ckey, 0) + 1
        if frame is not None and api_key == PRODUCE and kind.known:
            if records is None:
                self._count_records(kind, api_key, api_version, frame, body_offset, client_id)
            elif records:
                count = self.labelled.produce(frame, records, client_id, acks, api_version, body_offset)
                self._counted(kind.api, count)
                return count
        return None

    def response(self, broker: BrokerSeries, api_key: int, api_version: int, frame: bytes, body_offset: int,
                 broker_seconds: float | None, overhead_seconds: float, body: bytes | None = None,
                 client_id: str | None = None) -> _ScanResult:
        """A response from ``broker`` went to the client. Scans its error codes (records are skipped, not read;
        a Fetch answer's records ranges are counted, as its request's ``client_id``'s when that is a label)
        and returns the scan (None: not scanned, or unreadable); with ``options.consumer_lag``, the
        answers of :data:`~kproxy.protocol.offset_reads.OFFSET_FIELDS` are scanned in values mode.

        ``body``, when given, is ``frame[body_offset:]`` as an object that repeats: the proxy's rewrite
        memo hands out one per distinct answer (:attr:`kproxy.proxy.address_rewrite.Rewritten.body`). The scan
        memo then keys on it as it is: its hash is computed once, and a repeat is found by identity,
        where a slice of ``frame`` would be copied, hashed and compared for every response.

        ``body_offset`` 0 means "not known": it is found here from the kind's response header layout
        (no header decode), and only when the body is scanned; a header that cannot be read makes the
        response undecodable."""
        kind = broker.kinds.get(api_key << 16 | api_version) or self._kind(broker, api_key, api_version)  # see request
        kind.responses += 1
        kind.response_bytes += len(frame)
        # Histogram.observe, inlined: two per response.
        if broker_seconds is not None:
            hist = kind.broker
            if hist is None:
                hist = kind.broker = _histogram(broker.broker_latency, kind.api, BROKER_BUCKETS)
            hist.counts[bisect_left(hist.bounds, broker_seconds)] += 1
            hist.sum += broker_seconds
        hist = kind.overhead
        if hist is None:
            hist = kind.overhead = _histogram(self.overhead, kind.api, OVERHEAD_BUCKETS)
        hist.counts[bisect_left(hist.bounds, overhead_seconds)] += 1
        hist.sum += overhead_seconds
        if not self.options.scan_responses:
            return None
        if not kind.known:
            # Nothing to scan it with; and a scanner cache entry per pair would grow without bound.
            self.undecodable_responses[kind.api] = self.undecodable_responses.get(kind.api, 0) + 1
            return None
        if not body_offset:
            if not kind.tagged_header:
                body_offset = 8  # size, correlation id
            elif len(frame) > 8 and frame[8] == 0:
                body_offset = 9  # and no tagged fields: the usual header v1
            else:
                try:
                    body_offset = response_body_offset(frame, api_key, api_version)
                except ProtocolError:
                    body_offset = len(frame)  # the scan then fails: counted as undecodable
        if api_key == PRODUCE:
            # A producer's usual answer (one topic, one partition) carries new offsets every time, so
            # it is never remembered; read by hand instead (None: another shape, the scanner's). With
            # consumer lag, its base offset too (returned: the partition's log end offset is read from it).
            entries = produce_answer_errors(frame, body_offset, api_version, kind.values)
            if entries is not None:
                if entries:
                    self._add_errors(broker, kind.api, api_key, frame, (entries, _NO_RANGES))
                return (entries, _NO_RANGES) if kind.values else None
        elif api_key == FETCH:
            # A KIP-951 consumer's usual answer read by hand, as the scanner would (None: another
            # shape or version, the scanner's): new records every time, never remembered either.
            found = fetch_answer_scan(frame, body_offset, api_version, kind.values)
            if found is not None:
                if found[0] or found[1]:
                    self._add_errors(broker, kind.api, api_key, frame, found, client_id)
                return found
        found = self._scan_response(kind, api_key, api_version, frame, body_offset, body)
        if found is None:
            # A body we cannot read: counted, never fatal.
            self.undecodable_responses[kind.api] = self.undecodable_responses.get(kind.api, 0) + 1
        elif found[0] or found[1]:  # (the usual answer has neither: nothing more to call)
            self._add_errors(broker, kind.api, api_key, frame, found, client_id)
        return found

    def held(self, by: tuple[str, str] | None, seconds: float) -> None:
        """A response held back ``seconds`` by a rule (``by``: its rule and action; None when the
        policy named none) - time that is the rule's, not kproxy's (kept out of the overhead)."""
        self.faults.held_histogram(by or ("", "")).observe(seconds)

    def no_response(self, api_key: int, overhead_seconds: float) -> None:
        """A request that gets no response (Produce acks=0): only kproxy's time to record."""
        api = self.api(api_key)
        hist = self.overhead.get(api)
        if hist is None:
            hist = self.overhead[api] = Histogram(OVERHEAD_BUCKETS)
        hist.observe(overhead_seconds)

    def _scanner(self, api_key: int, api_version: int, direction: MessageType) -> object:
        """The generated errors-only scanner of a message kind (None: unknown kind), made once."""
        key = (api_key, api_version, direction)
        fn = self._scanners.get(key, _MISSING)
        if fn is _MISSING:
            fn = self._scanners[key] = scanner(api_key, api_version, direction, errors_only=True)
        return fn

    # A scanner from :meth:`_scanner` run over a body: (non-zero error entries, records ranges), None
    # when the kind is unknown or the bytes cannot be read (the protocol's one runner, bound here).
    _run_scan = staticmethod(run_scanner)

    def _scan_response(self, kind: KindStats, api_key: int, api_version: int, frame: bytes, body_offset: int,
                       body: bytes | None = None) -> _ScanResult:
        """The error scan of a (known) kind's response, remembered per body for the kinds brokers repeat
        (the memo is bound to the kind when it is made, see :meth:`_kind`)."""
        fn = kind.scanner
        if fn is _MISSING:
            fn = kind.scanner = (scanner(api_key, api_version, MessageType.RESPONSE, errors_only=True, values=True)
                                 if kind.values else self._scanner(api_key, api_version, MessageType.RESPONSE))
        run = run_values_scanner if kind.values else self._run_scan
        memo = kind.memo
        if memo is None:
            return run(fn, frame, body_offset)
        size = len(frame) - body_offset
        key: bytes | tuple[int, int]
        if size <= SCAN_MEMO_BODY_MAX:
            key = frame[body_offset:] if body is None else body
        else:
            view = memoryview(frame)[body_offset:]
            key = (size, hash(view if isinstance(frame, bytes) else view.tobytes()))
        results = memo.results
        found = results.get(key, _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        found = run(fn, frame, body_offset)
        if found is not None and found[1]:
            found = (found[0], [])  # record ranges are offsets into this frame: never reused
        cost = len(key) if isinstance(key, bytes) else 1024
        if memo.bytes + cost > SCAN_MEMO_BYTES:
            results.clear()
            memo.bytes = 0
        results[key] = found
        memo.bytes += cost
        return found

    def _add_errors(self, broker: BrokerSeries, api: str, api_key: int, frame: bytes,
                    found: tuple[list[Entry], list[RecordsRange]], client_id: str | None = None) -> None:
        """Count a response's non-zero error codes and (Fetch) its records, from its scan."""
        entries, records = found
        errors = broker.errors
        worst = -1
        for topic, _partition, code in entries:
            if not code:
                continue
            rank = _ERROR_RANK.get(code)
            if rank is None:
                rank = _ERROR_RANK[code] = ERROR_CLASSES.index(error_class(code))
            worst = max(worst, rank)
            if code in self.anomaly_codes:
                self.anomaly_code = code
            name = error_name(code)
            ekey = (api, name)
            errors[ekey] = errors.get(ekey, 0) + 1
            if self.options.topic_label and topic is not None:
                tkey = (api, self._topics(str(topic)), name)
                self.topic_errors[tkey] = self.topic_errors.get(tkey, 0) + 1
        if worst >= 0:
            wkey = (api, ERROR_CLASSES[worst])
            broker.responses_with_errors[wkey] = broker.responses_with_errors.get(wkey, 0) + 1
        if api_key == FETCH and records:
            self._counted(api, self.labelled.fetch(frame, records, client_id))

    def _count_records(self, kind: KindStats, api_key: int, api_version: int, frame: bytes, offset: int | None,
                       client_id: str | None) -> None:
        """Count the records of a (known) kind's request: Produce."""
        if offset is None:
            offset = request_body_offset(frame, api_key, api_version)
            if offset is None:
                return  # a malformed request is the broker's to refuse; nothing to count
        fn = kind.request_scanner
        if fn is _MISSING:
            fn = kind.request_scanner = self._scanner(api_key, api_version, MessageType.REQUEST)
        found = self._run_scan(fn, frame, offset)
        if found is not None and found[1]:
            self._counted(kind.api, self.labelled.produce(frame, found[1], client_id, None, api_version, offset))

    def _counted(self, api: str, count: int) -> None:
        """Add one frame's records, counted by :mod:`kproxy.metrics.traffic` within
        :data:`RECORD_COUNT_BUDGET`; a frame that needs more, or whose records kproxy cannot read
        (the client's to judge: forwarded all the same), is not counted at all (-1) but counted as
        such (a partial count would look like a real one)."""
        if count < 0:
            self.records_uncounted[api] = self.records_uncounted.get(api, 0) + 1
        else:
            self.records[api] = self.records.get(api, 0) + count

    # -- connections -------------------------------------------------------------------
    # Per connection, not per frame: the (listener or address, node_id) keys are built here.
    def client_connected(self, listener: str, node_id: str) -> None:
        key = (listener, node_id)
        self.client_connections[key] = self.client_connections.get(key, 0) + 1
        self.client_connections_total[key] = self.client_connections_total.get(key, 0) + 1

    def client_disconnected(self, listener: str, node_id: str) -> None:
        key = (listener, node_id)
        self.client_connections[key] = self.client_connections.get(key, 0) - 1

    def upstream_connected(self, address: str, node_id: str) -> None:
        key = (address, node_id)
        self.upstream_connections[key] = self.upstream_connections.get(key, 0) + 1

    def upstream_disconnected(self, address: str, node_id: str) -> None:
        key = (address, node_id)
        self.upstream_connections[key] = self.upstream_connections.get(key, 0) - 1

    def upstream_connect_failed(self, address: str, node_id: str) -> None:
        key = (address, node_id)
        self.upstream_connect_failures[key] = self.upstream_connect_failures.get(key, 0) + 1

    def accept_failed(self, error: str) -> None:
        self.accept_errors[error] = self.accept_errors.get(error, 0) + 1

    def listener_opened(self, listener: str, node_id: str) -> None:
        """Born at zero: the first refusal must be an increase an alert can see."""
        self.client_connections_refused.setdefault((listener, node_id), 0)

    def client_refused(self, listener: str, node_id: str) -> None:
        key = (listener, node_id)
        self.client_connections_refused[key] = self.client_connections_refused.get(key, 0) + 1

    def frame_rejected(self, reason: str) -> None:
        self.frames_rejected[reason] = self.frames_rejected.get(reason, 0) + 1

    # -- SASL logins (per login, not per frame) ---------------------------------------------------
    def sasl_mechanism_used(self, side: str, mechanism: str) -> None:
        """Born at zero, every result: the first failure must be an increase an alert can see."""
        for result in SASL_RESULTS:
            self.sasl_authentications.setdefault((side, mechanism, result), 0)
            self.sasl_reauthentications.setdefault((side, mechanism, result), 0)

    def sasl_authenticated(self, side: str, mechanism: str, result: str, reauthentication: bool) -> None:
        """A login ended: ``side`` upstream (kproxy's own) or client; ``result`` one of SASL_RESULTS."""
        key = (side, mechanism, result)
        self.sasl_authentications[key] = self.sasl_authentications.get(key, 0) + 1
        if reauthentication:
            self.sasl_reauthentications[key] = self.sasl_reauthentications.get(key, 0) + 1
