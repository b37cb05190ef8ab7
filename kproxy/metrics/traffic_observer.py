"""The bridge from a proxy session's events to :class:`~kproxy.metrics.stats.TrafficStats`."""

from __future__ import annotations

import time
from typing import Final

from kproxy.metrics.client_anomalies import (
    ACKS0_PRODUCER,
    DEPRECATED_UP_TO,
    DEPRECATED_VERSION,
    UNCOMPRESSED_PRODUCER,
    ClientAnomalies,
    uncompressed,
)
from kproxy.metrics.client_software import ClientSoftware
from kproxy.metrics.consumer_lag import LAG_ANSWERS, LAG_REQUESTS, ConsumerLag
from kproxy.metrics.group_anomalies import MEMBERSHIP_APIS, GroupWatch, MembershipRequest
from kproxy.metrics.stats import BrokerSeries, TrafficStats
from kproxy.protocol.api_keys import FETCH, METADATA, PRODUCE
from kproxy.protocol.offset_reads import GROUP_REQUESTS, produce_record_counts
from kproxy.protocol.scan import RecordsRange
from kproxy.protocol.topic_ids import METADATA_TOPIC_IDS
from kproxy.proxy.exchange import ObserverMemo
from kproxy.proxy.session import Exchange

_NO_RANGES: Final[list[RecordsRange]] = []  # never added to
# A connection's anomalies counted once per connection (BrokerObserver.flagged): bits.
_FLAG_DEPRECATED: Final = 1
_FLAG_ACKS0: Final = 2
_FLAG_UNCOMPRESSED: Final = 4
_MAX_MEMBERSHIPS: Final = 64


class MetricsObserver:
    """Made once per server for one stats object; :meth:`for_broker` gives each connection
    its :class:`kproxy.proxy.session.SessionObserver`."""

    __slots__ = ("lag", "stats")

    def __init__(self, stats: TrafficStats, lag: ConsumerLag | None = None) -> None:
        self.stats = stats
        self.lag = lag  # consumer lag's tracker (None: not tracked); the stats then scan in values mode
        if lag is not None:
            # One map of topic ids: the lag learns them from its scan of Metadata answers (the one the
            # error codes get), the traffic labels read them (else they learn on their own).
            stats.labelled.topic_names = lag.names

    def for_broker(self, node_id: int | None) -> BrokerObserver:
        """The observer of one connection through the listener of broker ``node_id`` (None: bootstrap).

        The broker's counters are looked up here, once per connection: per frame, the
        ``node_id`` label costs nothing (see :mod:`kproxy.metrics.stats`).
        """
        return BrokerObserver(self.stats, self.stats.broker(node_id), self.lag)


class BrokerObserver:
    """Implements :class:`kproxy.proxy.session.SessionObserver` for one connection.

    Reads the header facts the session parsed (the client id only when it is a label)
    and counts them into the stats, under the connection's broker; with a
    :class:`~kproxy.metrics.consumer_lag.ConsumerLag`, hands it the answers it reads with their scans.
    """

    __slots__ = ("anomalies", "broker", "client", "client_ids", "flagged", "group_requests", "group_watch", "lag",
                 "lag_answers", "lag_requests", "last_membership", "membership", "memberships", "produce_policy",
                 "retry_watch", "software", "stats", "topic_ids")

    def __init__(self, stats: TrafficStats, broker: BrokerSeries, lag: ConsumerLag | None = None) -> None:
        self.stats = stats
        self.broker = broker
        self.client_ids = stats.options.client_id_label
        self.lag = lag
        # Api keys the lag reads (none without it): one set lookup per exchange.
        self.lag_requests = LAG_REQUESTS if lag is not None else frozenset()
        self.lag_answers = LAG_ANSWERS if lag is not None else frozenset()
        self.group_requests = GROUP_REQUESTS if lag is not None else frozenset()  # (a member of the group)
        # Topic ids are learnt for the topic label; consumer lag learns them from its scan of the same
        # Metadata answers, into the map the label reads then (MetricsObserver shares it).
        self.topic_ids = stats.options.topic_label and lag is None
        # The client software this connection named (ApiVersions v3+), counted while it is open.
        self.software = ClientSoftware(stats.labelled) if self.client_ids else None
        # Client anomalies (kproxy.metrics.client_anomalies; None: off): the connection's first client id (its
        # churn is that client's), the anomalies already counted for it, and whether Produce requests are
        # checked against the producer policy at all.
        self.anomalies = stats.anomalies
        self.group_watch = stats.group_watch
        self.retry_watch = stats.retry_watch
        self.membership = MEMBERSHIP_APIS if self.group_watch is not None else frozenset()
        # Membership requests read, awaiting their answers, by correlation id (at most _MAX_MEMBERSHIPS:
        # a blackholed connection's are never answered).
        self.memberships: dict[int, MembershipRequest] = {}
        self.last_membership: tuple[int, bytes, MembershipRequest] | None = None
        self.client: str | None = None
        self.flagged = 0
        policy = None if self.anomalies is None else self.anomalies.options
        self.produce_policy = policy is not None and (policy.forbid_acks0 or policy.require_compression)

    def request(self, exchange: Exchange) -> None:
        software = self.software
        if software is not None and exchange.api_key == software.api_key:
            software.request(exchange)
        anomalies = self.anomalies
        if anomalies is not None:
            if self.client is None:
                self.client = exchange.client_id or ""
            if exchange.api_version <= DEPRECATED_UP_TO.get(exchange.api_key, -1) \
                    and not self.flagged & _FLAG_DEPRECATED:
                self.flagged |= _FLAG_DEPRECATED
                anomalies.seen(DEPRECATED_VERSION, self.client,
                               f"api_key={exchange.api_key} api_version={exchange.api_version}")
        if exchange.api_key == PRODUCE:
            # The records ranges of the exchange's scan, shared with the rules (none when it cannot read
            # the body: the stats' own errors-only scan fails on the same bytes, tests/test_scan_shared.py).
            scan = exchange.request_scan
            counted = self.stats.request(self.broker, exchange.api_key, exchange.api_version, exchange.request_size,
                                         exchange.client_id if self.client_ids else None, exchange.request,
                                         exchange.request_body_offset, _NO_RANGES if scan is None else scan[1],
                                         exchange.acks)
            if self.produce_policy and anomalies is not None:
                self._produce_policy(anomalies, exchange, _NO_RANGES if scan is None else scan[1])
            if self.retry_watch is not None and scan is not None and scan[1]:
                self.retry_watch.produce(exchange.request, scan[1], self.client, exchange.read_at)
            if self.lag is not None and scan is not None and scan[1] and exchange.acks != 0:
                # Its records per partition, counted while the frame is held: its answer gives the log end
                # offsets with them. Not when a rule forwarded another frame in its place (its records may
                # differ from the ones read: corrupt_records, duplicate_records).
                ruling = exchange.ruling
                if ruling is None or not ruling.request_replaced:
                    memo = exchange.memo  # (the scan made it)
                    if memo is not None:
                        memo.produced = produce_record_counts(exchange.request, scan, counted)
        else:
            self.stats.request(self.broker, exchange.api_key, exchange.api_version, exchange.request_size,
                               exchange.client_id if self.client_ids else None)
            if exchange.api_key in self.membership and len(self.memberships) < _MAX_MEMBERSHIPS:
                read = self._membership(exchange)
                if read is not None:
                    self.memberships[exchange.correlation_id] = read
            if exchange.api_key in self.lag_requests:
                # Scanned now, while the session holds the frame: the answer is read with it. (The
                # exchange's one scan: a rule on topics that read it first left it there.)
                scan = exchange.request_scan
            elif exchange.api_key in self.group_requests and self.lag is not None:
                # Its group, read while the frame is held; the answer says whether the coordinator
                # accepted the member (a request alone says nothing: any client can name any group).
                group = self.lag.group_named(exchange.api_key, exchange.api_version, exchange.request,
                                             exchange.request_body_offset)
                if group is not None:
                    memo = exchange.memo
                    if memo is None:
                        memo = exchange.memo = ObserverMemo()
                    memo.group_id = group

    def _membership(self, exchange: Exchange) -> MembershipRequest | None:
        """A membership request as the group watch reads it; a member's heartbeats repeat one body, so
        the connection's last one is kept and a repeat costs a comparison, not a decode."""
        offset = exchange.request_body_offset
        if offset is None:
            return None
        kind = exchange.api_key << 16 | exchange.api_version
        body = exchange.request[offset:]
        last = self.last_membership
        if last is not None and last[0] == kind and last[1] == body:
            return last[2]
        read = GroupWatch.read(exchange.api_key, exchange.api_version, exchange.request, offset)
        if read is not None:
            self.last_membership = (kind, body, read)
        return read

    def _produce_policy(self, anomalies: ClientAnomalies, exchange: Exchange, ranges: list[RecordsRange]) -> None:
        """Check a Produce request against the producer policy (once per connection and kind)."""
        policy = anomalies.options
        if policy.forbid_acks0 and exchange.acks == 0 and not self.flagged & _FLAG_ACKS0:
            self.flagged |= _FLAG_ACKS0
            anomalies.seen(ACKS0_PRODUCER, self.client, "acks=0")
        if policy.require_compression and not self.flagged & _FLAG_UNCOMPRESSED \
                and uncompressed(exchange.request, ranges):
            self.flagged |= _FLAG_UNCOMPRESSED
            anomalies.seen(UNCOMPRESSED_PRODUCER, self.client, "a batch with compression none")

    def complete(self, exchange: Exchange) -> None:
        response = exchange.response
        if response is None:
            self.stats.no_response(exchange.api_key, exchange.overhead_seconds)
            return
        # Exchange.broker_seconds and overhead_seconds, inlined (two property calls per exchange):
        # here the response is there.
        received = exchange.received_at
        overhead = exchange.forwarded_at - exchange.read_at + exchange.completed_at - received
        ruling = exchange.ruling  # Exchange.held, inlined
        if ruling is not None and ruling.held is not None:  # a rule's delay or throttle: its time, not kproxy's
            held = ruling.held
            overhead -= held[0]
            self.stats.held(held[1], held[0])
        # The body offset is the session's when it rewrote this response (headers are kept); 0 lets
        # the stats find it from the kind's header layout, without a header decode. The rewritten body,
        # when there is one, is the rewrite memo's object: the scan memo's key, hashed once.
        memo = exchange.memo
        api_key = exchange.api_key
        found = self.stats.response(self.broker, api_key, exchange.api_version, response,
                                    0 if memo is None else memo.response_body_offset,
                                    None if exchange.local else received - exchange.forwarded_at,
                                    overhead, None if memo is None else memo.response_body,
                                    exchange.client_id if api_key == FETCH and self.client_ids else None)
        code = self.stats.anomaly_code
        if code:  # an answer carrying an error code that may be a client's anomaly
            self.stats.anomaly_code = 0
            if self.anomalies is not None:
                # The connection's client id: the request's frame, where the exchange reads its own, is
                # let go once the request was seen.
                self.anomalies.answer_error(api_key, code, self.client)
        if api_key in self.membership and self.group_watch is not None:
            # A JoinGroup, Heartbeat or LeaveGroup answered (a member's few requests a minute).
            read = self.memberships.pop(exchange.correlation_id, None)
            if read is not None:
                now = time.monotonic()
                self.group_watch.exchange(read, None if found is None else [e[2] for e in found[0] if e[2]],
                                          self.client, now)
                self.group_watch.sweep(now)
        if api_key in self.lag_answers and not exchange.local and self.lag is not None:
            # (An answer kproxy made itself, a rule's, says nothing of the broker's offsets.)
            if api_key == PRODUCE:
                if memo is not None and memo.produced:
                    self.lag.produce_answer(memo.produced, found, exchange.completed_at)
            else:
                self.lag.answer(api_key, exchange.api_version,
                                exchange.request_scan if api_key in self.lag_requests else None, found,
                                exchange.completed_at)
                if api_key == FETCH and found is not None and found[1]:  # (its records: when they were written)
                    self.lag.fetch_answer(response, found, exchange.completed_at)
        elif api_key in self.group_requests and memo is not None and memo.group_id is not None and self.lag is not None:
            if not exchange.local:  # (an answer a rule made says nothing of the coordinator)
                self.lag.group_answer(api_key, memo.group_id, found, exchange.completed_at)
        elif api_key == METADATA and self.topic_ids and exchange.api_version >= METADATA_TOPIC_IDS:
            # Fetch and Produce v13+ name topics by id: their traffic is labelled by these names.
            self.stats.labelled.learn_metadata(response, exchange.api_version,
                                               0 if memo is None else memo.response_body_offset)

    def close(self) -> None:
        """The connection ended: what it counted while open (its client software) is taken back."""
        if self.software is not None:
            self.software.close()
        if self.anomalies is not None:
            now = time.monotonic()
            self.anomalies.connection_closed(self.client, now)
            if self.group_watch is not None:
                self.group_watch.sweep(now)
