"""Client bugs and misconfigurations as the wire shows them: ``kproxy_client_anomalies_total{kind,client_id}``.

Each kind is one detector, fed by what :class:`~kproxy.metrics.traffic_observer.BrokerObserver` already reads
(the consumer group kinds, ``rebalance_storm`` and ``vanished_member``, are
:mod:`kproxy.metrics.group_anomalies`'; ``retry_storm``, idempotent batches sent again, is
:mod:`kproxy.metrics.retries`'):

* from the error codes the metrics' scan of an answer found (nothing more is read; only an answer
  carrying one of :data:`ANOMALY_CODES` reaches this module):

  - ``stale_generation``: an OffsetCommit or TxnOffsetCommit answered ILLEGAL_GENERATION or
    UNKNOWN_MEMBER_ID (a member committing for a generation its group has left);
  - ``producer_fenced``: any answer PRODUCER_FENCED or INVALID_PRODUCER_EPOCH (a zombie producer,
    two producers with one transactional id);
  - ``producer_sequence``: a Produce answered OUT_OF_ORDER_SEQUENCE_NUMBER or
    DUPLICATE_SEQUENCE_NUMBER (an idempotent producer's sequence broke: lost or re-sent batches);

* from connections: ``connection_churn``, a client id that closed at least ``churn_per_minute``
  connections within one minute (counted once per such minute; not for the ids folded into ``other``,
  whose connections are many clients');

* from requests, once per connection that does it: ``deprecated_version``, a request of a version
  Kafka's specs mark deprecated (:data:`~kproxy.protocol.codes.DEPRECATED_VERSIONS`, KIP-896: a
  Kafka 4 broker refuses them); ``acks0_producer`` (with ``forbid_acks0``) and
  ``uncompressed_producer`` (with ``require_compression``: a batch of :data:`UNCOMPRESSED_MIN_BYTES`
  or more sent with no compression), read from the Produce request's acks and its v2 batches'
  attributes, as the session and the scan found them.

Every kind is labelled by the connection's client id (its first request's: an answer comes after
the request's frame, where the exchange reads its own, was let go). Label values are bounded as
every client id label: the traffic's :class:`~kproxy.metrics.labels.LabelCap`, so the series and
the per-client state hold at most ``label_cap + 1`` client ids however many ids clients make up.
The first time a (kind, client id) pair is counted, one ``event=client_anomaly`` line is logged at
warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from kproxy.logfmt import q
from kproxy.metrics.labels import OTHER, LabelCap
from kproxy.protocol.api_keys import OFFSET_COMMIT, PRODUCE, TXN_OFFSET_COMMIT
from kproxy.protocol.codes import DEPRECATED_VERSIONS, ErrorCode, error_name
from kproxy.protocol.records.batch_layout import ATTRIBUTES_AT, CODEC_MASK, MAGIC_AT
from kproxy.protocol.scan import RecordsRange

log = logging.getLogger("kproxy.metrics")

STALE_GENERATION: Final = "stale_generation"
PRODUCER_FENCED: Final = "producer_fenced"
PRODUCER_SEQUENCE: Final = "producer_sequence"
CONNECTION_CHURN: Final = "connection_churn"
DEPRECATED_VERSION: Final = "deprecated_version"
ACKS0_PRODUCER: Final = "acks0_producer"
UNCOMPRESSED_PRODUCER: Final = "uncompressed_producer"
RETRY_STORM: Final = "retry_storm"
REBALANCE_STORM: Final = "rebalance_storm"  # (kproxy.metrics.group_anomalies)
VANISHED_MEMBER: Final = "vanished_member"  # (kproxy.metrics.group_anomalies)
KINDS: Final = (STALE_GENERATION, PRODUCER_FENCED, PRODUCER_SEQUENCE, CONNECTION_CHURN, RETRY_STORM,
                REBALANCE_STORM, VANISHED_MEMBER, DEPRECATED_VERSION, ACKS0_PRODUCER, UNCOMPRESSED_PRODUCER)

COMMIT_APIS: Final = frozenset({OFFSET_COMMIT, TXN_OFFSET_COMMIT})
STALE_CODES: Final = frozenset({int(ErrorCode.ILLEGAL_GENERATION), int(ErrorCode.UNKNOWN_MEMBER_ID)})
FENCED_CODES: Final = frozenset({int(ErrorCode.PRODUCER_FENCED), int(ErrorCode.INVALID_PRODUCER_EPOCH)})
SEQUENCE_CODES: Final = frozenset({int(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
                                   int(ErrorCode.DUPLICATE_SEQUENCE_NUMBER)})
# The codes the stats' error count hands on (kproxy.metrics.stats.TrafficStats.anomaly_code).
ANOMALY_CODES: Final = STALE_CODES | FENCED_CODES | SEQUENCE_CODES
# Api key -> the last deprecated version (every deprecated span starts at 0).
DEPRECATED_UP_TO: Final[dict[int, int]] = {key: span[1] for key, span in DEPRECATED_VERSIONS.items()
                                           if span[0] == 0}
CHURN_WINDOW: Final = 60.0  # seconds: connection churn is counted per minute
# A batch this big or bigger sent uncompressed is an uncompressed producer's: a smaller one may be a
# compressing producer's too (librdkafka sends a batch as it is when compressing would not shrink it).
UNCOMPRESSED_MIN_BYTES: Final = 1024


@dataclass(frozen=True)
class AnomalyOptions:
    """The detectors' thresholds and the producer policy they check (``metrics.client_anomalies_*``)."""

    churn_per_minute: int = 60  # connections of one client id closed within a minute that count as churn
    forbid_acks0: bool = False  # a Produce with acks=0 is an anomaly
    require_compression: bool = False  # a Produce batch with no compression is an anomaly
    # A group whose JoinGroups answered reach this many within rebalance_window seconds is in a
    # rebalance storm (kproxy.metrics.group_anomalies).
    rebalance_joins: int = 50
    rebalance_window: float = 300.0
    # Batches of one client id sent again (same producer id, sequence and CRC) within a minute that
    # count as a retry storm (kproxy.metrics.retries).
    retries_per_minute: int = 30


def anomaly_kind(api_key: int, code: int) -> str | None:
    """The kind an answer's error ``code`` is, for an answer of ``api_key`` (None: none)."""
    if code in FENCED_CODES:
        return PRODUCER_FENCED
    if code in SEQUENCE_CODES and api_key == PRODUCE:
        return PRODUCER_SEQUENCE
    if code in STALE_CODES and api_key in COMMIT_APIS:
        return STALE_GENERATION
    return None


def uncompressed(frame: bytes, ranges: list[RecordsRange]) -> bool:
    """Whether a Produce request's records ranges hold a v2 batch with no compression (codec 0) of
    :data:`UNCOMPRESSED_MIN_BYTES` or more (the range's first batch is read: a producer's batch)."""
    for start, end, _ in ranges:
        # (the codec's bits are in the attributes' low byte, the second: big-endian)
        if end - start >= UNCOMPRESSED_MIN_BYTES and frame[start + MAGIC_AT] == 2 \
                and not frame[start + ATTRIBUTES_AT + 1] & CODEC_MASK:
            return True
    return False


class MinuteWindow:
    """One client id's events (connection closes, batches sent again) in its current minute."""

    __slots__ = ("count", "start")

    def __init__(self, start: float) -> None:
        self.start = start
        self.count = 0


class ClientAnomalies:
    """The anomaly counters: ``(kind, client id label) -> count``, and the churn state behind one kind.

    Sans-IO: callers pass the time (any monotonic clock, seconds). Every table is keyed by the capped
    client id label, so bounded as the module docstring says.
    """

    __slots__ = ("churn", "clients", "counts", "options")

    def __init__(self, clients: LabelCap, options: AnomalyOptions | None = None) -> None:
        self.clients = clients
        self.options = options or AnomalyOptions()
        self.counts: dict[tuple[str, str], int] = {}
        self.churn: dict[str, MinuteWindow] = {}

    def seen(self, kind: str, client_id: str | None, detail: str = "") -> None:
        """Count one ``kind`` anomaly of ``client_id``; its first one is logged."""
        key = (kind, self.clients(client_id or ""))
        count = self.counts.get(key)
        if count is None:
            log.warning("event=client_anomaly kind=%s client_id=%s detail=%s", kind, q(key[1]), q(detail))
            count = 0
        self.counts[key] = count + 1

    def answer_error(self, api_key: int, code: int, client_id: str | None) -> None:
        """An answer of ``api_key`` to ``client_id`` carried ``code`` (one of :data:`ANOMALY_CODES`)."""
        kind = anomaly_kind(api_key, code)
        if kind is not None:
            self.seen(kind, client_id, error_name(code))

    def connection_closed(self, client_id: str | None, now: float) -> None:
        """A connection of ``client_id`` (None: it sent no request) closed at ``now``."""
        if client_id is None:
            return  # a probe, a health check: no client to blame
        label = self.clients(client_id)
        if label == OTHER:
            return  # past the cap: many clients' connections together say nothing of one of them
        window = self.churn.get(label)
        if window is None or now - window.start >= CHURN_WINDOW:
            window = self.churn[label] = MinuteWindow(now)
        window.count += 1
        if window.count == self.options.churn_per_minute:
            self.seen(CONNECTION_CHURN, client_id, f"{window.count} connections closed within a minute")

    def series(self) -> dict[tuple[str, str], int]:
        """The counts, a copy (a scrape reads it while traffic counts)."""
        return dict(self.counts)
