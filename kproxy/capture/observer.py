"""What the capture takes from a session, on the event loop: references, not records.

:class:`CaptureObserver` implements :class:`kproxy.proxy.session.SessionObserver`
for one connection, so each record knows its connection (id, client address,
listener, broker). The session calls it from :meth:`Session.report`, after the
frames have been written. Per exchange it keeps a reference to the request
frame until the exchange completes, then offers one
:data:`kproxy.capture.record_builder.Captured` tuple (the two frames, by reference:
``bytes`` are immutable, nothing is copied; a few numbers) to ``sink``, the
writer's non-blocking ``offer``. It reads no frame: scanning, decoding and
building records is the writer thread's work (:mod:`kproxy.capture.record_builder`),
in batches, so the event loop pays about a microsecond per exchange. Except
big Produce requests and Fetch responses (``EARLY_READ_BYTES`` and more): those
are read here, a few µs each, and let go (:class:`~kproxy.capture.record_builder.EarlyRead`),
rather than held for the writer's next turn.

Each record carries the connection's principal when the exchange completed, as the
session knows it (``identity``: :attr:`kproxy.proxy.session.Session.principal`, the TLS
client certificate's subject or the user of a PLAIN or SCRAM login the broker accepted,
read by :class:`kproxy.sasl.relay.SaslLogin`): the principal the rules saw, so a what-if
matches ``principal`` keys as the proxy did. Without an ``identity``, the connection's own
(:attr:`ConnectionInfo.principal`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kproxy.capture.connection_info import (
    ConnectionInfo as ConnectionInfo,  # re-exported: where the server and tests import it
)
from kproxy.capture.record_builder import EARLY_READ_BYTES, Captured, EarlyRead, RecordBuilder
from kproxy.capture.record_builder import ClosedConnection as ClosedConnection  # (re-exported)
from kproxy.host_port import split_host_port
from kproxy.protocol.api_keys import FETCH, PRODUCE
from kproxy.protocol.scan import RequestScan
from kproxy.proxy.session import Exchange, Session, SessionObserver

Sink = Callable[[Captured, int], bool]  # (exchange, bytes of frames it holds) -> queued


# Who a connection's client is: its session, whose principal each record carries (a Session, not
# a protocol of one: compiled, its principal is then read natively, once per exchange).
Identity = Session


def split_peer(peer: str) -> tuple[str, int | None]:
    """``host:port`` (as the server logs it) -> (host, port)."""
    return split_host_port(peer)


class CaptureObserver:
    """The capture's view of one connection; see the module docstring for what it keeps."""

    __slots__ = ("_clock_offset", "_pending", "conn", "identity", "reader", "sink")

    def __init__(self, conn: ConnectionInfo, sink: Sink, clock_offset: float | None = None,
                 reader: RecordBuilder | None = None, identity: Identity | None = None) -> None:
        self.conn = conn
        self.sink = sink
        self.reader = reader  # reads big Produce requests and Fetch responses at once (EARLY_READ_BYTES)
        # Exchange times come from the session's perf_counter clock; records carry UTC wall time.
        # One offset for every connection of a process (CaptureService's) keeps the order of
        # requests across connections in the capture that of the proxy's clock.
        self._clock_offset = time.time() - time.perf_counter() if clock_offset is None else clock_offset
        # id -> (exchange, its request, its scan: a Produce's, as the session shared it)
        self._pending: dict[int, tuple[Exchange, bytes | EarlyRead, RequestScan | None]] = {}
        self.identity = identity  # may be given after, once the session exists

    # -- SessionObserver --------------------------------------------------------------
    def request(self, exchange: Exchange) -> None:
        # The session lets go of the request frame once this returns; the writer still needs it.
        frame = exchange.request
        if exchange.api_key != PRODUCE:
            self._pending[id(exchange)] = (exchange, frame, None)
            return
        # The session's scan of the request (the metrics and the rules read the same one): the writer
        # takes its topic, partition and records range from it rather than scanning the frame again.
        scan = exchange.request_scan
        if len(frame) >= EARLY_READ_BYTES and self.reader is not None:
            self._pending[id(exchange)] = (exchange, self.reader.early_request(PRODUCE, exchange.api_version, frame,
                                                                              scan), None)
        else:
            self._pending[id(exchange)] = (exchange, frame, scan)

    @property
    def principal(self) -> str | None:
        """The connection's principal now: what a record completed now carries."""
        identity = self.identity
        return self.conn.principal if identity is None else identity.principal

    def complete(self, exchange: Exchange) -> None:
        ex = exchange
        pending = self._pending.pop(id(ex), None)
        request: bytes | EarlyRead = b""
        scan: RequestScan | None = None
        if pending is not None:
            _, request, scan = pending
        frame = ex.response
        memo = ex.memo
        body_offset = 0 if memo is None else memo.response_body_offset  # Exchange.response_body_offset, inlined
        response: bytes | EarlyRead | None = frame
        if (ex.api_key == FETCH and frame is not None and len(frame) >= EARLY_READ_BYTES
                and self.reader is not None):
            response = self.reader.early_response(FETCH, ex.api_version, frame, body_offset)
        # _held(request) + _held(response), inlined: two calls per exchange.
        held = len(request) if type(request) is bytes else 0
        if type(response) is bytes:
            held += len(response)
        identity = self.identity  # self.principal, inlined: once per exchange
        principal = self.conn.principal if identity is None else identity.principal
        self.sink((self.conn, self._clock_offset, principal, request, response,
                   ex.api_key, ex.api_version, ex.correlation_id, ex.request_size, ex.read_at, ex.forwarded_at,
                   ex.received_at, ex.completed_at, ex.local, body_offset, ex.held, ex.rule_decisions, scan), held)

    def close(self, reason: str | None = None) -> None:
        """The connection ended: requests still unanswered are offered without a response (a
        response held back, by a delay rule say, never reached the client: none either), then the
        close itself (:data:`ClosedConnection`), ``reason`` its cause."""
        pending, self._pending = self._pending, {}
        for ex, request, scan in pending.values():
            self.sink((self.conn, self._clock_offset, self.principal, request, None, ex.api_key, ex.api_version,
                       ex.correlation_id, ex.request_size, ex.read_at, ex.forwarded_at, 0.0, 0.0, ex.local, 0,
                       None, ex.rule_decisions, scan),
                      _held(request))
        self.sink((self.conn, self._clock_offset, self.principal, time.perf_counter(), reason), 0)


def _held(frame: bytes | EarlyRead | None) -> int:
    """Bytes of frames an offered exchange keeps alive (what the writer's queue_bytes bounds)."""
    return len(frame) if type(frame) is bytes else 0


class Tee:
    """Two session observers as one: metrics first, then capture."""

    __slots__ = ("first", "second")

    def __init__(self, first: SessionObserver, second: SessionObserver) -> None:
        self.first = first
        self.second = second

    def request(self, exchange: Exchange) -> None:
        self.first.request(exchange)
        self.second.request(exchange)

    def complete(self, exchange: Exchange) -> None:
        self.first.complete(exchange)
        self.second.complete(exchange)
