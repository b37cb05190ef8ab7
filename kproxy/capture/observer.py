"""What the capture takes from a session, on the event loop: references, not records.

:class:`CaptureObserver` implements :class:`kproxy.proxy.session.SessionObserver`
for one connection, so each record knows its connection (id, client address,
listener, broker). The session calls it from :meth:`Session.report`, after the
frames have been written. Per exchange it keeps a reference to the request
frame until the exchange completes, then offers one
:data:`kproxy.capture.records.Captured` tuple (the two frames, by reference:
``bytes`` are immutable, nothing is copied; a few numbers) to ``sink``, the
writer's non-blocking ``offer``. It reads no frame: scanning, decoding and
building records is the writer thread's work (:mod:`kproxy.capture.records`),
in batches, so the event loop pays about a microsecond per exchange. Except
big Produce requests and Fetch responses (``EARLY_READ_BYTES`` and more): those
are read here, a few µs each, and let go (:class:`~kproxy.capture.records.EarlyRead`),
rather than held for the writer's next turn.

One exception, because it is state of the connection that later records carry
and too rare to matter: SASL. The principal is the TLS client certificate's
subject, or the SASL user once a SaslAuthenticate succeeds on the connection
(PLAIN's authcid, RFC 4616; SCRAM's ``n=`` attribute, RFC 5802); the password
is never read past, nor kept. Reading it here keeps it right when the writer
drops records under pressure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kproxy.capture.records import EARLY_READ_BYTES, Captured, EarlyRead, RecordBuilder
from kproxy.host_port import split_host_port
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.headers import response_body_offset
from kproxy.protocol.messages import decode_body
from kproxy.protocol.schema import Direction
from kproxy.protocol.tables import ApiKey
from kproxy.proxy.session import Exchange, SessionObserver

SASL_HANDSHAKE, SASL_AUTHENTICATE = int(ApiKey.SASL_HANDSHAKE), int(ApiKey.SASL_AUTHENTICATE)
PRODUCE, FETCH = int(ApiKey.PRODUCE), int(ApiKey.FETCH)
Sink = Callable[[Captured, int], bool]  # (exchange, bytes of frames it holds) -> queued


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionInfo:
    """Who a connection is: what every record of it carries."""

    connection_id: str
    client_host: str
    client_port: int | None
    listener: str
    upstream: str
    principal: str | None = None
    # The broker behind a ``broker-N`` listener; None behind the bootstrap listener (read per record:
    # worked out once).
    node_id: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        prefix, _, node = self.listener.partition("-")
        object.__setattr__(self, "node_id", int(node) if prefix == "broker" and node.lstrip("-").isdigit() else None)


def split_peer(peer: str) -> tuple[str, int | None]:
    """``host:port`` (as the server logs it) -> (host, port)."""
    return split_host_port(peer)


class CaptureObserver:
    """The capture's view of one connection; see the module docstring for what it keeps."""

    __slots__ = ("_clock_offset", "_mechanism", "_pending", "_sasl_user", "conn", "principal", "reader", "sink")

    def __init__(self, conn: ConnectionInfo, sink: Sink, clock_offset: float | None = None,
                 reader: RecordBuilder | None = None) -> None:
        self.conn = conn
        self.sink = sink
        self.reader = reader  # reads big Produce requests and Fetch responses at once (EARLY_READ_BYTES)
        # Exchange times come from the session's perf_counter clock; records carry UTC wall time.
        # One offset for every connection of a process (CaptureService's) keeps the order of
        # requests across connections in the capture that of the proxy's clock.
        self._clock_offset = time.time() - time.perf_counter() if clock_offset is None else clock_offset
        self._pending: dict[int, tuple[Exchange, bytes | EarlyRead]] = {}  # id -> (exchange, its request)
        self._mechanism: str | None = None
        self._sasl_user: str | None = None
        self.principal = conn.principal

    # -- SessionObserver --------------------------------------------------------------
    def request(self, exchange: Exchange) -> None:
        # The session lets go of the request frame once this returns; the writer still needs it.
        frame = exchange.request
        if exchange.api_key == PRODUCE and len(frame) >= EARLY_READ_BYTES and self.reader is not None:
            self._pending[id(exchange)] = (exchange, self.reader.early_request(PRODUCE, exchange.api_version, frame))
        else:
            self._pending[id(exchange)] = (exchange, frame)
        if exchange.api_key == SASL_HANDSHAKE or exchange.api_key == SASL_AUTHENTICATE:
            self._sasl_request(exchange)

    def complete(self, exchange: Exchange) -> None:
        if exchange.api_key == SASL_AUTHENTICATE and exchange.response is not None:
            self._sasl_response(exchange, exchange.response)
        ex = exchange
        pending = self._pending.pop(id(ex), None)
        request = b"" if pending is None else pending[1]
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
        self.sink((self.conn, self._clock_offset, self.principal, request, response,
                   ex.api_key, ex.api_version, ex.correlation_id, ex.request_size, ex.read_at, ex.forwarded_at,
                   ex.received_at, ex.completed_at, ex.local, body_offset, ex.held, ex.rule_decisions), held)

    def close(self) -> None:
        """The connection ended: requests still unanswered are offered without a response (a
        response held back, by a delay rule say, never reached the client: none either)."""
        pending, self._pending = self._pending, {}
        for ex, request in pending.values():
            self.sink((self.conn, self._clock_offset, self.principal, request, None, ex.api_key, ex.api_version,
                       ex.correlation_id, ex.request_size, ex.read_at, ex.forwarded_at, 0.0, 0.0, ex.local, 0,
                       None, ex.rule_decisions),
                      _held(request))

    # -- SASL: the principal -----------------------------------------------------------
    def _sasl_request(self, ex: Exchange) -> None:
        body = ex.request_body_offset
        if body is None:
            return
        try:
            decoded = decode_body(ex.api_key, ex.api_version, Direction.REQUEST, ex.request, body)
        except ProtocolError:
            return
        if ex.api_key == SASL_HANDSHAKE:
            mechanism = decoded.get("mechanism")
            self._mechanism = mechanism.upper() if isinstance(mechanism, str) else None
        else:
            auth = decoded.get("auth_bytes")
            if isinstance(auth, bytes | bytearray | memoryview):
                self._sasl_user = sasl_user(self._mechanism, bytes(auth))

    def _sasl_response(self, ex: Exchange, response: bytes) -> None:
        user, self._sasl_user = self._sasl_user, None
        if user is None:
            return
        try:
            offset = ex.response_body_offset or response_body_offset(response, ex.api_key, ex.api_version)
            code = decode_body(ex.api_key, ex.api_version, Direction.RESPONSE, response, offset).get("error_code")
        except ProtocolError:
            return
        if code == 0:
            self.principal = "User:" + user  # this record and every later one of the connection


def sasl_user(mechanism: str | None, auth: bytes) -> str | None:
    """The user name in a client's first SASL message, for PLAIN and SCRAM; None for others."""
    try:
        if mechanism == "PLAIN":  # [authzid] NUL authcid NUL passwd (RFC 4616): the password is not read
            parts = auth.split(b"\x00", 2)
            return parts[1].decode("utf-8") if len(parts) == 3 and parts[1] else None
        if mechanism is not None and mechanism.startswith("SCRAM-"):  # "n,,n=user,r=nonce" (RFC 5802)
            for attr in auth.decode("utf-8").split(",")[2:]:
                if attr.startswith("n="):
                    return attr[2:].replace("=2C", ",").replace("=3D", "=") or None
    except UnicodeDecodeError:
        return None
    return None


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
