"""One client connection's protocol state, with no I/O (h11-style: frames in, frames out).

The server feeds :class:`Session` whole frames (size prefix included) from the
client and from the upstream broker; the session says what to forward upstream
and hands back, in order, the frames to send to the client.

Guarantees kept here (each has bitten a peer):

* Responses leave in request order, including responses kproxy makes itself: a
  local answer waits behind earlier in-flight requests.
* Produce with acks=0 has no response: never tracked, never waited for. A broker
  that answers one anyway (Tansu does) has that answer dropped: the client expects none.
* A response is matched to its request by correlation id, so a client must never
  have two requests the broker may answer under one id: a request reusing the id
  of a request in flight, or of an acks=0 Produce the broker may still answer, is
  refused (:class:`SessionError`). Otherwise Tansu's answer to the Produce would
  be read as, say, a Metadata answer, and topic names the client wrote would
  become broker addresses. Ids are free again once answered (clients wrap their
  int32 counter); see :meth:`Session.on_client_frame` for when an acks=0 id is.
* After a successful SaslHandshake v0, the client and broker exchange raw
  size-prefixed SASL tokens with no Kafka header; they pass opaquely until the
  mechanism's exchange is over (PLAIN and OAUTHBEARER: one round, SCRAM: two;
  others: until the client sends something that reads as a Kafka request, at
  any version: that request then gets every check a request gets).
* ApiVersions at a version kproxy cannot read gets the KIP-511 answer (v0 body,
  UNSUPPORTED_VERSION, the range kproxy reads), never a closed connection.
* A response whose correlation id is not the oldest forwarded request's is a
  desynchronised stream: :class:`SessionError`, and the server closes.
"""

from __future__ import annotations

import enum
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kproxy.protocol.errors import DecodeError, ProtocolError
from kproxy.protocol.frames import encode_response
from kproxy.protocol.headers import decode_request_header, response_header_version
from kproxy.protocol.messages import decode_body
from kproxy.protocol.schema import Direction, supported_versions
from kproxy.protocol.tables import api_name
from kproxy.protocol.wire import Malformed, read_uvarint
from kproxy.proxy.addresses import BrokerRoute, PortsExhausted
from kproxy.proxy.rewrite import API_VERSIONS, UNSUPPORTED_VERSION, ResponseRewriter

PRODUCE = 0
SASL_HANDSHAKE = 17
_REQUEST_FIXED = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id
_RESPONSE_FIXED = struct.Struct(">ii")  # size, correlation_id
_INT16 = struct.Struct(">h")
# Rounds of a SaslHandshake v0 exchange whose length the mechanism fixes.
_API_VERSIONS_MAX = (supported_versions(API_VERSIONS) or (0, 0))[1]  # above it: the KIP-511 answer
SASL_ROUNDS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}
# acks=0 Produce correlation ids remembered, in case a broker answers them anyway (Tansu does);
# see Session.on_client_frame for what happens to the ones pushed out.
ACKS0_REMEMBERED = 1024


class SessionError(ProtocolError):
    """The connection cannot go on (desynchronised stream, unrewritable response)."""


class Mode(enum.Enum):
    KAFKA = "kafka"
    SASL_TOKENS = "sasl-tokens"


@dataclass(slots=True)
class Exchange:
    """One request in flight and, once it arrived or was made, its response.

    Times come from the session's clock: ``read_at`` when the chunk holding the
    request was read, ``forwarded_at`` when the session let it go upstream,
    ``received_at`` when the response was read, ``completed_at`` when it was
    released to the client (in order).
    """

    correlation_id: int
    api_key: int
    api_version: int
    request_size: int
    read_at: float
    forwarded_at: float
    local: bool = False
    response: bytes | None = None
    received_at: float = 0.0
    completed_at: float = 0.0
    routes: Sequence[BrokerRoute] = ()
    sasl_mechanism: str | None = None
    seq: int = 0  # the session's request count when it arrived: orders it among acks=0 Produce
    body_offset: int = 0  # where the response body starts, once known (0: not computed yet)

    @property
    def api(self) -> str:
        return api_name(self.api_key)

    @property
    def broker_seconds(self) -> float | None:
        """The broker's share: forwarded -> response read. None for local answers and acks=0."""
        if self.local or self.response is None:
            return None
        return self.received_at - self.forwarded_at

    @property
    def overhead_seconds(self) -> float:
        """kproxy's share: request read -> forwarded, plus response read -> released."""
        request_side = self.forwarded_at - self.read_at
        if self.response is None:
            return request_side
        return request_side + (self.completed_at - self.received_at)


class SessionObserver(Protocol):
    """What the server's metrics see of a session (the session calls; it never awaits)."""

    def request(self, exchange: Exchange, frame: bytes) -> None: ...

    def complete(self, exchange: Exchange) -> None: ...


class Session:
    """Sans-IO state of one client connection.

    ``on_client_frame`` returns the frame to forward upstream, or ``None`` when
    kproxy answered itself; ``on_upstream_frame`` takes a broker frame. After
    either, ``take_ready()`` gives the frames due to the client, in order, and
    the broker routes they advertise (listeners must exist before they are sent).
    ``observer`` (optional) sees every request read and every exchange completed
    (acks=0 Produce completes at once, with no response) when the server calls
    :meth:`report`: after it has written what the frames asked for, so that
    metrics work is never on the path of a request or a response.
    """

    def __init__(self, rewriter: ResponseRewriter, *, max_in_flight: int = 1000,
                 clock: Callable[[], float] = time.perf_counter,
                 observer: SessionObserver | None = None) -> None:
        self.rewriter = rewriter
        self.max_in_flight = max_in_flight
        self.clock = clock
        self.observer = observer
        self._seen: list[tuple[Exchange, bytes]] = []
        self._completed: list[Exchange] = []
        self.in_flight: deque[Exchange] = deque()
        self._awaiting: deque[Exchange] = deque()  # the forwarded subset of in_flight, oldest first
        self.mode = Mode.KAFKA
        self._sasl_rounds_left: int | None = None
        self._ready: list[bytes] = []
        self._ready_routes: list[BrokerRoute] = []
        # acks=0 Produce the broker may still answer, oldest first: (seq, correlation id).
        self._acks0: deque[tuple[int, int]] = deque()
        # Correlation ids taken: those of in_flight and of _acks0 (never both: see on_client_frame).
        self._taken: set[int] = set()
        # acks=0 ids pushed out of _acks0 while still answerable: (lowest, highest, newest one's seq).
        self._forgotten: tuple[int, int, int] | None = None
        self.requests = 0
        self.responses = 0

    # -- client -> upstream ----------------------------------------------------------
    @property
    def can_accept(self) -> bool:
        """False while ``max_in_flight`` requests await responses: stop reading the client."""
        return len(self.in_flight) < self.max_in_flight

    def on_client_frame(self, frame: bytes, read_at: float | None = None) -> bytes | None:
        """Take one request frame; return it to forward upstream, or None if kproxy answered.

        ``read_at`` is when the chunk holding it was read (defaults to now).

        Raises :class:`SessionError` for a request whose correlation id is taken:
        the id of a request in flight (forwarded or answered locally, until its
        answer is released), or of an acks=0 Produce the broker may still answer.
        Brokers answer in order (the Kafka protocol's guarantee), so an acks=0 id
        is taken until the broker answers it or answers a request sent after it;
        at most ``ACKS0_REMEMBERED`` such ids are kept, and older ones pushed out
        stay taken as a span (lowest to highest) until a request sent after the
        newest of them is answered. A client counting ids up (every Kafka client)
        never meets that span again before it is cleared, except for a counter
        wrapping inside it, which costs that client one reconnect.
        """
        if self.mode is Mode.SASL_TOKENS and not self._token_ends_sasl(frame):
            return frame
        try:
            _, api_key, api_version, correlation_id = _REQUEST_FIXED.unpack_from(frame, 0)
        except struct.error:
            raise SessionError(f"request frame of {len(frame)} bytes is too short for a header",
                               offset=0) from None
        if self.rewriter.unreadable(api_key, api_version):
            raise SessionError(f"{api_name(api_key)} v{api_version} request: kproxy cannot read that version's "
                               f"response, so it could not keep broker addresses out of it (ApiVersions offered "
                               f"only versions it reads)", offset=0)
        if correlation_id in self._taken or (
                self._forgotten is not None and self._forgotten[0] <= correlation_id <= self._forgotten[1]):
            raise SessionError(self._id_taken(api_key, api_version, correlation_id), offset=8)
        self.requests += 1
        now = self.clock()
        ex = Exchange(correlation_id, api_key, api_version, len(frame), now if read_at is None else read_at, now)
        if self._acks0:  # only then does its place among acks=0 Produce matter (see _answered_in_order)
            ex.seq = self.requests
        if self.observer is not None:
            self._seen.append((ex, frame))
        if api_key == API_VERSIONS and api_version > _API_VERSIONS_MAX:
            ex.local = True
            ex.response = self._kip511_answer(correlation_id)
            ex.received_at = now
            self.in_flight.append(ex)
            self._taken.add(correlation_id)
            self._flush()
            return None
        if api_key == PRODUCE and _produce_acks(frame, api_version) == 0:
            # acks=0: the broker should not answer; nothing to track. A broker that answers
            # anyway (Tansu) has that answer dropped: the client expects none.
            self._remember_acks0(correlation_id)
            if self.observer is not None:
                ex.completed_at = now
                self._completed.append(ex)
            return frame
        if api_key == SASL_HANDSHAKE and api_version == 0:
            ex.sasl_mechanism = _sasl_mechanism(frame)
        self.in_flight.append(ex)
        self._taken.add(correlation_id)
        self._awaiting.append(ex)
        return frame

    def _id_taken(self, api_key: int, api_version: int, correlation_id: int) -> str:
        if any(ex.correlation_id == correlation_id for ex in self.in_flight):  # (refusals only: not per frame)
            why = "a request in flight"
        else:
            why = "an acks=0 Produce the broker may still answer"
        return (f"{api_name(api_key)} v{api_version} request reuses correlation id {correlation_id} of {why}: "
                f"its answer could not be told apart")

    def _remember_acks0(self, correlation_id: int) -> None:
        acks0 = self._acks0
        if len(acks0) >= ACKS0_REMEMBERED:
            seq, old = acks0.popleft()
            self._taken.discard(old)
            span = self._forgotten
            self._forgotten = (old, old, seq) if span is None else (min(span[0], old), max(span[1], old), seq)
        acks0.append((self.requests, correlation_id))
        self._taken.add(correlation_id)

    def _answered_in_order(self, seq: int) -> None:
        """The broker answered request ``seq``: acks=0 Produce sent before it never will be."""
        acks0 = self._acks0
        while acks0 and acks0[0][0] < seq:
            self._taken.discard(acks0.popleft()[1])
        if self._forgotten is not None and self._forgotten[2] < seq:
            self._forgotten = None

    def _acks0_answered(self, correlation_id: int) -> bool:
        """Drop the memory of acks=0 Produce up to the one with this id; False if none has it.

        Answers come in order, so those sent before it, remembered or pushed out, never
        will be answered. Nearly always the oldest one: not a scan in practice.
        """
        acks0 = self._acks0
        for i, (_, remembered) in enumerate(acks0):
            if remembered == correlation_id:
                for _ in range(i + 1):
                    self._taken.discard(acks0.popleft()[1])
                self._forgotten = None
                return True
        return False

    def _kip511_answer(self, correlation_id: int) -> bytes:
        span = supported_versions(API_VERSIONS)
        assert span is not None
        body = {"error_code": UNSUPPORTED_VERSION,
                "api_keys": [{"api_key": API_VERSIONS, "min_version": span[0], "max_version": span[1]}]}
        payload = encode_response(correlation_id, API_VERSIONS, 0, body)
        return struct.pack(">i", len(payload)) + payload

    def _token_ends_sasl(self, frame: bytes) -> bool:
        """In token mode with an open-ended mechanism: does this frame read as a Kafka request?

        It does when it starts with a request header for an API kproxy knows, at any
        version (the header layout does not depend on it), with a client id length
        that fits: such a frame then goes through every check a request gets in Kafka
        mode, the refusal of versions kproxy cannot read included. GSSAPI tokens
        cannot look like that: they start 0x60 (RFC 2743 section 3.1 framing) or with
        a per-message token id of RFC 1964 / RFC 4121 (0x01 to 0x05), while every api
        key kproxy knows is below 256, so its first byte is 0x00.
        """
        if self._sasl_rounds_left is not None:
            return False
        if len(frame) < 14:
            return False
        _, api_key, api_version, _ = _REQUEST_FIXED.unpack_from(frame, 0)
        (client_id_len,) = _INT16.unpack_from(frame, 12)
        plausible = (api_version >= 0 and -1 <= client_id_len <= len(frame) - 14
                     and supported_versions(api_key) is not None)
        if plausible:
            self.mode = Mode.KAFKA
        return plausible

    # -- upstream -> client ----------------------------------------------------------
    def on_upstream_frame(self, frame: bytes) -> None:
        if self.mode is Mode.SASL_TOKENS:
            self._ready.append(frame)
            if self._sasl_rounds_left is not None:
                self._sasl_rounds_left -= 1
                if self._sasl_rounds_left <= 0:
                    self.mode = Mode.KAFKA
            return
        try:
            _, correlation_id = _RESPONSE_FIXED.unpack_from(frame, 0)
        except struct.error:
            raise SessionError(f"response frame of {len(frame)} bytes has no correlation id", offset=0) from None
        ex = self._awaiting[0] if self._awaiting else None
        if ex is None or ex.correlation_id != correlation_id:
            # Not the oldest request's answer (ids are never shared between it and an acks=0 Produce):
            # the answer to an acks=0 Produce, remembered or pushed out, is dropped; else a desync.
            if self._acks0 and self._acks0_answered(correlation_id):
                return
            span = self._forgotten
            if span is not None and span[0] <= correlation_id <= span[1]:
                return
            if ex is None:
                raise SessionError(f"response with correlation id {correlation_id} matches no request in flight")
            raise SessionError(f"response correlation id {correlation_id} does not match the oldest request "
                               f"in flight ({ex.correlation_id}, {ex.api} v{ex.api_version})")
        self._awaiting.popleft()
        if self._acks0:
            self._answered_in_order(ex.seq)
        self.responses += 1
        ex.received_at = self.clock()
        ex.response = self._rewrite(ex, frame)
        if ex.sasl_mechanism is not None:
            self._after_sasl_handshake(ex, frame)
        self._flush()

    def _rewrite(self, ex: Exchange, frame: bytes) -> bytes:
        if not self.rewriter.needs_rewrite(ex.api_key, ex.api_version):
            return frame
        try:
            body_offset = ex.body_offset = response_body_offset(frame, ex.api_key, ex.api_version)
            done = self.rewriter.rewrite(ex.api_key, ex.api_version, frame, body_offset)
        except (DecodeError, PortsExhausted) as exc:
            # Forwarding it unrewritten could leak a broker address: the connection ends.
            raise SessionError(f"cannot rewrite {ex.api} v{ex.api_version} response: {exc}") from None
        if done is None:
            return frame
        ex.routes = done.routes
        return done.frame

    def _after_sasl_handshake(self, ex: Exchange, frame: bytes) -> None:
        if len(frame) < 10:
            raise SessionError(f"SaslHandshake v0 response of {len(frame)} bytes has no error code", offset=8)
        (error_code,) = _INT16.unpack_from(frame, 8)
        if error_code == 0:
            self.mode = Mode.SASL_TOKENS
            self._sasl_rounds_left = SASL_ROUNDS.get((ex.sasl_mechanism or "").upper())

    def _flush(self) -> None:
        while self.in_flight and self.in_flight[0].response is not None:
            ex = self.in_flight.popleft()
            self._taken.discard(ex.correlation_id)
            assert ex.response is not None
            self._ready.append(ex.response)
            self._ready_routes.extend(ex.routes)
            if self.observer is not None:
                ex.completed_at = self.clock()
                self._completed.append(ex)

    def report(self) -> None:
        """Hand the observer the requests read and exchanges completed since the last call."""
        observer = self.observer
        if observer is None:
            return
        if self._seen:
            seen, self._seen = self._seen, []
            for ex, frame in seen:
                observer.request(ex, frame)
        if self._completed:
            completed, self._completed = self._completed, []
            for ex in completed:
                observer.complete(ex)

    @property
    def has_ready(self) -> bool:
        return bool(self._ready)

    def take_ready(self) -> tuple[list[bytes], list[BrokerRoute]]:
        """Frames due to the client in order, and the routes they advertise."""
        frames, routes = self._ready, self._ready_routes
        self._ready, self._ready_routes = [], []
        return frames, routes


def response_body_offset(frame: bytes, api_key: int, api_version: int) -> int:
    """Where a response frame's body starts: after size, correlation id and any header tags.

    Raises :class:`DecodeError` when the header tags are cut short or malformed.
    """
    if response_header_version(api_key, api_version) == 0:
        return 8
    if len(frame) > 8 and frame[8] == 0:  # the usual empty tag section
        return 9
    try:
        count, pos = read_uvarint(frame, 8)
        for _ in range(count):
            _, pos = read_uvarint(frame, pos)
            size, pos = read_uvarint(frame, pos)
            pos += size
    except (Malformed, IndexError) as exc:
        raise DecodeError(f"malformed response header tags: {exc or 'cut short'}", offset=8) from None
    if pos > len(frame):
        raise DecodeError("response header tags run past the end of the frame", offset=8)
    return pos


def _produce_acks(frame: bytes, api_version: int) -> int | None:
    """The acks of a Produce request frame; None if it cannot be read (then it is tracked).

    Read in place, on every Produce: size, api key, version, correlation id, the
    int16-length client id, header tags from v9 (flexible), then the body's
    transactional id from v3 (compact from v9) and acks.
    """
    try:
        (n,) = _INT16.unpack_from(frame, 12)
        pos = 14 + max(n, 0)
        if api_version >= 9:
            if frame[pos] == 0:  # no header tags: the usual case
                pos += 1
            else:
                count, pos = read_uvarint(frame, pos)
                for _ in range(count):
                    _, pos = read_uvarint(frame, pos)
                    size, pos = read_uvarint(frame, pos)
                    pos += size
            n, pos = (frame[pos], pos + 1) if frame[pos] < 0x80 else read_uvarint(frame, pos)
            pos += max(n - 1, 0)
        elif api_version >= 3:
            (n,) = _INT16.unpack_from(frame, pos)
            pos += 2 + max(n, 0)
        (acks,) = _INT16.unpack_from(frame, pos)
        return int(acks)
    except (Malformed, struct.error, IndexError):
        return None


def _sasl_mechanism(frame: bytes) -> str | None:
    try:
        header = decode_request_header(memoryview(frame)[4:])
        body = decode_body(SASL_HANDSHAKE, 0, Direction.REQUEST, frame, 4 + header.size)
        mechanism = body.get("mechanism")
        return mechanism if isinstance(mechanism, str) else None
    except ProtocolError:
        return None
