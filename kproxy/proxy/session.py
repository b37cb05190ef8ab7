"""One client connection's protocol state, with no I/O (h11-style: bytes in, commands out).

The server feeds :class:`Session` the chunks it reads from the client and from
the upstream broker, as they come; the session splits them into frames, parses
each request header once into an :class:`Exchange`, and answers with
:mod:`~kproxy.proxy.commands` (forward upstream, send to the client, close, wake
me at t) for the server to execute. docs/ARCHITECTURE.md shows where this sits.

Guarantees kept here (each has bitten a peer):

* Responses leave in request order, including responses kproxy makes itself: a
  local answer waits behind earlier in-flight requests.
* Produce with acks=0 has no response: never tracked, never waited for. A broker
  that answers one anyway (Tansu does) has that answer dropped: the client expects none.
* A response is matched to its request by correlation id, so a client must never
  have two requests the broker may answer under one id: a request reusing the id
  of a request in flight, or of an acks=0 Produce the broker may still answer, is
  refused (the session answers a CloseConnection). Otherwise Tansu's answer to the
  Produce would be read as, say, a Metadata answer, and topic names the client
  wrote would become broker addresses. Ids are free again once answered (clients wrap their
  int32 counter); see :meth:`Session._client_frame` for when an acks=0 id is.
* After a successful SaslHandshake v0, the client and broker exchange raw
  size-prefixed SASL tokens with no Kafka header; they pass opaquely until the
  mechanism's exchange is over (PLAIN and OAUTHBEARER: one round, SCRAM: two;
  others: until the client sends something that reads as a Kafka request, at
  any version: that request then gets every check a request gets).
* ApiVersions at a version kproxy cannot read gets the KIP-511 answer (v0 body,
  UNSUPPORTED_VERSION, the range kproxy reads), never a closed connection.
* A response whose correlation id is not the oldest forwarded request's is a
  desynchronised stream: the session asks the server to close.
* A chunk whose frames all go on unchanged is handed back as the very object read
  (no copy, no join): the common case, by far. Otherwise the frames that go on are
  joined into one write when small, and handed over as they are when few and big
  (``more``: one vectored write, no join; see VECTORED_MIN_BYTES).

Size (over the ~500 lines the project aims for): the session is one state machine (correlation
table, ordering, SASL modes, local answers, held responses for rules) whose parts read and write
the same few fields on every frame; moving them apart would add a call per frame on the hot path.
Pure helpers already live elsewhere (protocol/request_fields.py, protocol/headers.py, proxy/commands.py).
"""

from __future__ import annotations

import enum
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kproxy.protocol.errors import DecodeError, FrameSizeError, ProtocolError
from kproxy.protocol.framing import DEFAULT_MAX_FRAME_SIZE, FrameSplitter, Spanned
from kproxy.protocol.headers import request_body_offset as find_request_body
from kproxy.protocol.headers import response_body_offset as find_response_body
from kproxy.protocol.messages import decode_body
from kproxy.protocol.payloads import encode_response
from kproxy.protocol.request_fields import produce_acks, request_client_id
from kproxy.protocol.scan import RequestScan, scan_request
from kproxy.protocol.schema import Direction, supported_versions
from kproxy.protocol.tables import ApiKey, ErrorCode, api_name
from kproxy.proxy.addresses import BrokerRoute, PortsExhausted
from kproxy.proxy.commands import (
    CloseConnection,
    CloseKind,
    Command,
    ForwardUpstream,
    RejectReason,
    SendToClient,
    WakeAt,
)
from kproxy.proxy.rewrite import ResponseRewriter

# Plain ints, bound once: compared on every frame (an int == IntEnum comparison costs about twice a
# plain one, kproxy/protocol/tables.py).
PRODUCE = int(ApiKey.PRODUCE)
SASL_HANDSHAKE = int(ApiKey.SASL_HANDSHAKE)
API_VERSIONS = int(ApiKey.API_VERSIONS)
NONE = int(ErrorCode.NONE)
UNSUPPORTED_VERSION = int(ErrorCode.UNSUPPORTED_VERSION)
_REQUEST_FIXED = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id
_RESPONSE_FIXED = struct.Struct(">ii")  # size, correlation_id
_INT16 = struct.Struct(">h")
# Rounds of a SaslHandshake v0 exchange whose length the mechanism fixes.
_API_VERSIONS_MAX = (supported_versions(API_VERSIONS) or (0, 0))[1]  # above it: the KIP-511 answer
SASL_ROUNDS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}
# acks=0 Produce correlation ids remembered, in case a broker answers them anyway (Tansu does);
# see Session._client_frame for what happens to the ones pushed out.
ACKS0_REMEMBERED = 1024
# Several frames of one chunk that do not go on as the chunk itself are joined into one write, unless
# they are at most this many and at least this big in all: then a vectored write (os.writev) takes them
# as they are, and the copy a join makes (a Produce of 100 KB batches: every byte) is saved.
VECTORED_MAX_FRAMES = 64
VECTORED_MIN_BYTES = 64 * 1024


_UNREAD: Any = object()  # Exchange.client_id not decoded yet


class SessionError(ProtocolError):
    """The connection cannot go on (desynchronised stream, unrewritable response).

    Raised and caught inside the session, which turns it into a :class:`CloseConnection`.
    """


class Mode(enum.Enum):
    KAFKA = "kafka"
    SASL_TOKENS = "sasl-tokens"


# One action of a rule that acted on an exchange: (rule id, action name, detail, dry run).
RuleDecision = tuple[str, str, str, bool]


@dataclass(slots=True)
class Exchange:
    """One request in flight and, once it arrived or was made, its response.

    The request header is parsed once, here: api key, version and correlation id
    when the frame is read; the client id and the body offset only when someone
    asks (:attr:`client_id`, :attr:`request_body_offset`: nothing on the common
    path). ``request`` is the request frame (size prefix included) until the
    observer has seen it (with no observer: until the exchange ends); then the
    session lets it go, so a Produce's bytes are not held for the broker's round trip.
    Its body is scanned at most once, for whoever asks first (:attr:`request_scan`).

    Times come from the session's clock: ``read_at`` when the chunk holding the
    request was read, ``forwarded_at`` when the session let it go upstream,
    ``received_at`` when the response was read, ``completed_at`` when it was
    released to the client (in order). ``held``, when a policy's hold (a delay or throttle of
    this response or of one ahead of it) kept the response back: ``(seconds of that wait, who
    it is charged to)``.
    """

    correlation_id: int
    api_key: int
    api_version: int
    request_size: int
    read_at: float
    forwarded_at: float
    request: bytes = b""
    local: bool = False
    response: bytes | None = None
    # With no observer, a response that came in several reads and goes on untouched: the pieces that
    # brought it, written as they are (``response`` is then b""; nothing else reads the bytes).
    response_parts: Spanned | None = None
    received_at: float = 0.0
    completed_at: float = 0.0
    routes: Sequence[BrokerRoute] = ()
    sasl_mechanism: str | None = None
    seq: int = 0  # the session's request count when it arrived: orders it among acks=0 Produce
    response_body_offset: int = 0  # where the response body starts, once known (0: not computed yet)
    # The rewritten response's body as the rewriter returned it (None: not rewritten, or edited after):
    # for a repeated answer the rewrite memo's own object, which the metrics' scan memo keys on.
    response_body: bytes | None = None
    # Set by a policy's Verdict only (0 / None / False on the common path):
    release_at: float = 0.0  # the response leaves no earlier than this (session clock)
    response_delay: float = 0.0  # ... nor earlier than this many seconds after it arrived
    on_response: Callable[[bytes], bytes] | None = None  # edits the (address-rewritten) response
    drop: bool = False  # the response is swallowed when it comes: the client never gets an answer
    # One field for both (set at release, only when held): each field more costs every request.
    held: tuple[float, tuple[str, str] | None] | None = None
    # What the policy's rules did to this exchange, in order (empty on the common path): one entry per
    # action that acted, or matched in a dry run, as ``(rule, action, detail, dry_run)``. The policy
    # appends response-side actions when the response is edited, so observers read it at ``complete``.
    rule_decisions: tuple[RuleDecision, ...] = ()
    _request_body_offset: int = -1  # -1: not read yet
    _client_id: str | None = _UNREAD
    _request_scan: RequestScan | None = _UNREAD

    @property
    def api(self) -> str:
        return api_name(self.api_key)

    @property
    def client_id(self) -> str | None:
        """The request header's client id (None: null, absent or unreadable), decoded on first use."""
        found = self._client_id
        if found is _UNREAD:
            found = self._client_id = request_client_id(self.request, self.api_key, self.api_version)
        return found

    @client_id.setter
    def client_id(self, value: str | None) -> None:
        """Given by a reader that knows it already (a policy remembering its connection's client id)."""
        self._client_id = value

    @property
    def request_body_offset(self) -> int | None:
        """Where the request body starts in :attr:`request`; None when the header cannot be read."""
        found = self._request_body_offset
        if found == -1:
            offset = find_request_body(self.request, self.api_key, self.api_version)
            found = self._request_body_offset = -2 if offset is None else offset
        return None if found == -2 else found

    @request_body_offset.setter
    def request_body_offset(self, value: int | None) -> None:
        """Given by a reader that knows it already (a policy remembering its connection's header)."""
        self._request_body_offset = -2 if value is None else value

    @property
    def request_scan(self) -> RequestScan | None:
        """The request body's scan (:func:`kproxy.protocol.scan.scan_request`: topics, partitions,
        records ranges), done on first use and shared by every reader of this request: a rules
        policy's topics, the metrics' record count, the capture's early read. None when the header
        or body cannot be read. Read it while :attr:`request` holds the frame (until the observer
        has seen it)."""
        found = self._request_scan
        if found is _UNREAD:
            offset = self.request_body_offset
            found = self._request_scan = None if offset is None else scan_request(
                self.api_key, self.api_version, self.request, offset)
        return found

    def request_body(self) -> dict[str, Any]:
        """The request body, decoded in full (for a policy deciding before it is forwarded: a
        partial read through :mod:`kproxy.protocol.scan` is cheaper where it is enough).

        Raises :class:`~kproxy.protocol.errors.ProtocolError` when it cannot be read.
        """
        offset = self.request_body_offset
        if offset is None:
            raise DecodeError(f"{self.api} v{self.api_version} request header cannot be read", offset=4)
        return decode_body(self.api_key, self.api_version, Direction.REQUEST, self.request, offset)

    @property
    def broker_seconds(self) -> float | None:
        """The broker's share: forwarded -> response read. None for local answers and acks=0."""
        if self.local or self.response is None:
            return None
        return self.received_at - self.forwarded_at

    @property
    def overhead_seconds(self) -> float:
        """kproxy's share: request read -> forwarded, plus response read -> released, less the
        time a policy held the response (``held``: the rules' time is not kproxy's)."""
        request_side = self.forwarded_at - self.read_at
        if self.response is None:
            return request_side
        held = self.held[0] if self.held is not None else 0.0
        return request_side + (self.completed_at - self.received_at - held)


class SessionObserver(Protocol):
    """What the server's metrics see of a session (the session calls; it never awaits).

    ``request`` sees each request read, its frame still in ``exchange.request``;
    ``complete`` each exchange done (its response released, or none due).
    """

    def request(self, exchange: Exchange) -> None: ...

    def complete(self, exchange: Exchange) -> None: ...


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a :class:`RequestPolicy` decided about one request, in the session's own terms
    (the server's adapter translates fault-injection rules into it; proxy/ never sees a rule).

    * ``close``: end the connection instead; the request is not forwarded.
    * ``answer``: a response frame kproxy sends in the request's place (not forwarded);
      it waits its turn like any response. ``forward=False`` without an answer swallows
      the request (only meaningful for acks=0 Produce, which has no answer anyway).
    * ``request``: the frame to forward instead of the one read (same correlation id).
    * ``hold_s``: the response leaves no earlier than this long after the request was
      read (a delay before forwarding, or a throttle: the client sees the same wait);
      ``response_delay_s``: no earlier than this long after the broker's answer came.
      ``held_by``: who that wait is charged to, a pair of names the session hands to the
      observer as it is (``Exchange.held``; the server's policy names a rule and action).
    * ``on_response``: edits the broker's answer, after the default address rewrite.
    * ``drop_response``: the broker's answer is swallowed: the client times out.
    * ``blackhole``: this request and every later one on the connection get no answer;
      with ``close_after_s`` the connection then ends that long after (a slow close).

    Every guarantee of the session holds whatever the verdict: responses that do leave
    keep request order and correlation ids, and an acks=0 Produce never gets an answer.
    """

    close: CloseConnection | None = None
    answer: bytes | None = None
    forward: bool = True
    request: bytes | None = None
    hold_s: float = 0.0
    response_delay_s: float = 0.0
    on_response: Callable[[bytes], bytes] | None = None
    drop_response: bool = False
    blackhole: bool = False
    close_after_s: float | None = None
    held_by: tuple[str, str] | None = None


_BLACKHOLED = Verdict(drop_response=True)  # every request after a blackhole


class RequestPolicy(Protocol):
    """Where a rule decides about a request (kproxy.rules fills it through the server; proxy/ never
    imports it).

    Called once per Kafka request, right after its header is parsed and its id
    checked, before anything else happens to it (the acks=0 branch included), with
    ``exchange.request`` holding the whole frame. Returns None to let the request go
    on as usual (the common case: it must cost next to nothing), or a :class:`Verdict`.
    """

    def decide(self, exchange: Exchange) -> Verdict | None: ...


class Session:
    """Sans-IO state of one client connection.

    ``receive_client(chunk)`` and ``receive_upstream(chunk)`` take the bytes the
    server read, as they came (any split), and return the commands to execute, in
    order (:mod:`kproxy.proxy.commands`); ``on_timer(now)`` answers a
    :class:`~kproxy.proxy.commands.WakeAt`. Between them the server may ask
    :attr:`can_accept` (whether to read the client), :attr:`in_flight_count`,
    :attr:`partial_request_at`, the counters ``requests`` / ``responses`` and
    :attr:`client_id` (for its log lines); it reads nothing else of the session.

    ``observer`` (optional) sees every request read and every exchange completed
    (acks=0 Produce completes at once, with no response) when the server calls
    :meth:`report`: after it has written what the commands asked for, so that
    metrics work is never on the path of a request or a response. ``policy``
    (optional) decides about each request first (see :class:`RequestPolicy`).
    """

    def __init__(self, rewriter: ResponseRewriter, *, max_in_flight: int = 1000,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, clock: Callable[[], float] = time.perf_counter,
                 observer: SessionObserver | None = None, policy: RequestPolicy | None = None) -> None:
        self.rewriter = rewriter
        self.max_in_flight = max_in_flight
        self.clock = clock
        self.observer = observer
        self.policy = policy
        self._client_frames = FrameSplitter(max_frame_size)
        self._upstream_frames = FrameSplitter(max_frame_size)
        self._seen: list[Exchange] = []
        self._completed: list[Exchange] = []
        self.in_flight: deque[Exchange] = deque()
        self._awaiting: deque[Exchange] = deque()  # the forwarded subset of in_flight, oldest first
        self.mode = Mode.KAFKA
        self._sasl_rounds_left: int | None = None
        self._ready: list[bytes | Spanned] = []
        self._ready_spanned = False  # some of _ready is Spanned
        self._ready_routes: list[BrokerRoute] = []
        # acks=0 Produce the broker may still answer, oldest first: (seq, correlation id).
        self._acks0: deque[tuple[int, int]] = deque()
        # Correlation ids taken: those of in_flight and of _acks0 (never both: see _client_frame).
        self._taken: set[int] = set()
        # acks=0 ids pushed out of _acks0 while still answerable: (lowest, highest, newest one's seq).
        self._forgotten: tuple[int, int, int] | None = None
        self.requests = 0
        self.responses = 0
        # The first request's header client id (None: no request yet, or a null or unreadable one). Read
        # once per connection: clients keep one id per connection, and it names the client in log lines.
        self.client_id: str | None = None
        self._wake: float | None = None  # a WakeAt to ask for (a held response), None: none
        # correlation id -> the verdict's held_by, for requests a policy holds (Exchange.held at release)
        self._hold_owners: dict[int, tuple[str, str]] = {}
        self._closing: CloseConnection | None = None  # a policy's close, to return after the chunk's commands
        self._blackholed = False
        self._close_at: float | None = None  # a slow close's time
        self._edited = False  # a policy replaced a request of the chunk being read: the chunk is not what goes up

    # -- what the server may ask between chunks ----------------------------------------
    @property
    def can_accept(self) -> bool:
        """False while ``max_in_flight`` requests await responses: stop reading the client."""
        return len(self.in_flight) < self.max_in_flight

    @property
    def in_flight_count(self) -> int:
        """Requests read and not yet answered to the client (local answers waiting their turn included)."""
        return len(self.in_flight)

    @property
    def partial_request_at(self) -> int | None:
        """Where in the client's byte stream the request frame still missing bytes begins; None
        when no partial frame is buffered (the server's frame deadline: limits.frame_timeout)."""
        frames = self._client_frames
        return frames.consumed if frames.buffered else None

    # -- client -> upstream ----------------------------------------------------------
    def receive_client(self, chunk: bytes | bytearray, read_at: float | None = None) -> list[Command]:
        """Take a chunk read from the client (``read_at``: when; defaults to now).

        Returns, in order: a :class:`SendToClient` when local answers became due, then a
        :class:`ForwardUpstream` with the requests to forward (the chunk itself when it
        held exactly those frames) - or a lone :class:`CloseConnection` when a request is
        refused: nothing of that chunk is forwarded then.
        """
        try:
            frames, data, exact = self._client_frames.split(chunk)
            if not frames:
                return []
            forward = [f for raw in frames if (f := self._client_frame(raw, read_at)) is not None]
        except ProtocolError as exc:
            return [_reject(exc, RejectReason.REQUEST_OVERSIZE, RejectReason.REQUEST_SESSION,
                            "bad request from client")]
        commands: list[Command] = [self._take_ready(frames, data, False)] if self._ready else []
        if forward:
            # Requests go on unchanged (same objects): all of them and nothing else means the chunk itself.
            if exact and len(forward) == len(frames) and not self._edited:
                commands.append(ForwardUpstream(data))
            else:
                commands.append(ForwardUpstream(forward[0]) if len(forward) == 1 else _forward_frames(forward))
        self._edited = False
        if self._wake is not None:
            self._ask_wake(commands)
        if self._closing is not None:
            commands.append(self._closing)
        return commands

    def _ask_wake(self, commands: list[Command]) -> None:
        assert self._wake is not None
        commands.append(WakeAt(self._wake))
        self._wake = None

    def _client_frame(self, frame: bytes, read_at: float | None) -> bytes | None:
        """Take one request frame; return it to forward upstream, or None if kproxy answered.

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
        if self.requests == 1:
            self.client_id = request_client_id(frame, api_key, api_version)
        now = self.clock()
        ex = Exchange(correlation_id, api_key, api_version, len(frame), now if read_at is None else read_at, now,
                      frame)
        if self._acks0:  # only then does its place among acks=0 Produce matter (see _answered_in_order)
            ex.seq = self.requests
        if self.observer is not None:
            self._seen.append(ex)
        if self.policy is not None:
            if self._closing is not None:
                return None  # a rule closed the connection earlier in this chunk: nothing more goes on
            verdict = self.policy.decide(ex)
            if verdict is None and self._blackholed:
                verdict = _BLACKHOLED
            if verdict is not None:
                return self._execute(ex, verdict, frame, now)
        if api_key == API_VERSIONS and api_version > _API_VERSIONS_MAX:
            ex.local = True
            ex.response = self._kip511_answer(correlation_id)
            ex.received_at = now
            self.in_flight.append(ex)
            self._taken.add(correlation_id)
            self._flush()
            return None
        if api_key == PRODUCE and _acks_zero(ex, frame):
            # acks=0: the broker should not answer; nothing to track. A broker that answers
            # anyway (Tansu) has that answer dropped: the client expects none.
            self._remember_acks0(correlation_id)
            if self.observer is not None:
                ex.completed_at = now
                self._completed.append(ex)
            return frame
        if api_key == SASL_HANDSHAKE and api_version == 0:
            ex.sasl_mechanism = _sasl_mechanism(ex)
        self.in_flight.append(ex)
        self._taken.add(correlation_id)
        self._awaiting.append(ex)
        return frame

    def _execute(self, ex: Exchange, verdict: Verdict, frame: bytes, now: float) -> bytes | None:
        """Carry out a policy's verdict on a request just read; what to forward, or None."""
        if verdict.close is not None:
            self._closing = verdict.close
            return None
        if verdict.blackhole and not self._blackholed:
            self._blackholed = True
            if verdict.close_after_s is not None:
                self._close_at = now + verdict.close_after_s
                self._want_wake(self._close_at)
        out = frame
        if verdict.request is not None:
            out = verdict.request
            self._edited = True
        if ex.api_key == PRODUCE and _acks_zero(ex, frame):
            # No answer, injected or not (the client expects none): only forwarding is a choice.
            if self.observer is not None:
                ex.completed_at = now
                self._completed.append(ex)
            if not verdict.forward:
                return None
            self._remember_acks0(ex.correlation_id)
            return out
        if verdict.hold_s:
            ex.release_at = ex.read_at + verdict.hold_s
        if verdict.held_by is not None:
            self._hold_owners[ex.correlation_id] = verdict.held_by
        ex.response_delay = verdict.response_delay_s
        ex.on_response = verdict.on_response
        ex.drop = verdict.drop_response or verdict.blackhole
        self.in_flight.append(ex)
        self._taken.add(ex.correlation_id)
        if not verdict.forward:
            ex.local = True
            ex.received_at = now
            ex.response = verdict.answer if verdict.answer is not None else b""
            ex.drop = ex.drop or verdict.answer is None
            self._flush()
            return None
        if ex.api_key == SASL_HANDSHAKE and ex.api_version == 0:
            ex.sasl_mechanism = _sasl_mechanism(ex)
        self._awaiting.append(ex)
        return out

    def _want_wake(self, when: float) -> None:
        if self._wake is None or when < self._wake:
            self._wake = when

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
    # -- upstream -> client ----------------------------------------------------------
    def receive_upstream(self, chunk: bytes | bytearray) -> list[Command]:
        """Take a chunk read from the broker.

        Returns a :class:`SendToClient` with the responses now due, in request order
        (the chunk itself when it held exactly those frames, unchanged), or nothing when
        none is due yet - or a lone :class:`CloseConnection` for a response that cannot
        be matched or rewritten: nothing of that chunk reaches the client then.
        """
        try:
            # With no observer nothing needs a response whole unless it is rewritten (see _upstream_frame).
            frames, data, exact = self._upstream_frames.split(chunk, self.observer is not None)
            for raw in frames:
                self._upstream_frame(raw)
        except ProtocolError as exc:
            return [_reject(exc, RejectReason.RESPONSE_OVERSIZE, RejectReason.RESPONSE_SESSION,
                            "bad response from upstream")]
        commands: list[Command] = [self._take_ready(frames, data, exact)] if self._ready else []
        if self._wake is not None:
            self._ask_wake(commands)
        return commands

    def on_timer(self, now: float) -> list[Command]:
        """The time asked by a :class:`~kproxy.proxy.commands.WakeAt` has come (or is near).

        Returns only :class:`SendToClient`, :class:`CloseConnection` or :class:`WakeAt`:
        requests go upstream from ``receive_client`` alone, so that they reach the broker
        in the order the session expects their answers (the server's client pump is the
        only writer upstream). Held responses (a policy's delay or throttle) whose time
        has come are released from here, in request order, and a slow close ends here.
        """
        if self._close_at is not None and now >= self._close_at:
            return [CloseConnection("rule: slow_close", CloseKind.DELIBERATE)]
        self._flush()
        commands: list[Command] = [self._take_ready([], b"", False)] if self._ready else []
        if self._close_at is not None:
            self._want_wake(self._close_at)
        if self._wake is not None:
            self._ask_wake(commands)
        return commands

    def _upstream_frame(self, frame: bytes | Spanned) -> None:
        parts: Spanned | None = None
        if isinstance(frame, list):
            parts = frame
            frame = _head(parts)
            if self.mode is Mode.SASL_TOKENS:
                frame, parts = b"".join(parts), None
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
        if parts is not None:
            if ex.on_response is None and not self.rewriter.needs_rewrite(ex.api_key, ex.api_version):
                ex.response = b""
                ex.response_parts = parts
            else:
                frame = b"".join(parts)
                parts = None
        if parts is None:
            response = self._rewrite(ex, frame)
            if ex.on_response is not None:
                # After the default address rewrite: a rule's rewrite_addresses maps what clients would see.
                response = ex.on_response(response)
                ex.response_body = None
            ex.response = response
        if ex.response_delay:
            ex.release_at = max(ex.release_at, ex.received_at + ex.response_delay)
        if ex.sasl_mechanism is not None:
            self._after_sasl_handshake(ex, frame)
        self._flush()

    def _rewrite(self, ex: Exchange, frame: bytes) -> bytes:
        if not self.rewriter.needs_rewrite(ex.api_key, ex.api_version):
            return frame
        try:
            body_offset = ex.response_body_offset = find_response_body(frame, ex.api_key, ex.api_version)
            done = self.rewriter.rewrite(ex.api_key, ex.api_version, frame, body_offset)
        except (DecodeError, PortsExhausted) as exc:
            # Forwarding it unrewritten could leak a broker address: the connection ends.
            raise SessionError(f"cannot rewrite {ex.api} v{ex.api_version} response: {exc}") from None
        if done is None:
            return frame
        ex.routes = done.routes
        ex.response_body = done.body
        return done.frame

    def _after_sasl_handshake(self, ex: Exchange, frame: bytes) -> None:
        if len(frame) < 10:
            raise SessionError(f"SaslHandshake v0 response of {len(frame)} bytes has no error code", offset=8)
        (error_code,) = _INT16.unpack_from(frame, 8)
        if error_code == NONE:
            self.mode = Mode.SASL_TOKENS
            self._sasl_rounds_left = SASL_ROUNDS.get((ex.sasl_mechanism or "").upper())

    def _flush(self) -> None:
        """Release the answered exchanges at the head of ``in_flight``, in request order.

        A held exchange (``release_at`` in the future) stops the release there and asks for a
        wake-up: the ones behind it wait, as they would behind a slow broker. A dropped one
        releases nothing once its answer came, and the ones behind it go on: the broker
        answers in order, so its answer is read before any later one.

        For the observer, each exchange's ``held`` is the part of its wait (from its answer
        to its release) that a hold caused: up to the latest ``release_at`` met so far in this
        release, its own or of one ahead of it that it queued behind.
        """
        held_until = 0.0  # the latest release_at among the exchanges released by this call
        held_by: tuple[str, str] | None = None
        while self.in_flight and self.in_flight[0].response is not None:
            head = self.in_flight[0]
            release_at = head.release_at
            if release_at:
                if release_at > self.clock():
                    self._want_wake(release_at)
                    break
                owner = self._hold_owners.pop(head.correlation_id, None)
                if release_at > held_until:
                    held_until, held_by = release_at, owner
            ex = self.in_flight.popleft()
            self._taken.discard(ex.correlation_id)
            assert ex.response is not None
            if not ex.drop:
                if ex.response_parts is None:
                    self._ready.append(ex.response)
                else:
                    self._ready.append(ex.response_parts)
                    self._ready_spanned = True
                self._ready_routes.extend(ex.routes)
            if self.observer is not None:
                ex.completed_at = self.clock()
                if held_until > ex.received_at:
                    ex.held = (held_until - ex.received_at, held_by)
                self._completed.append(ex)

    def _take_ready(self, read: Sequence[bytes | Spanned], chunk: bytes, exact: bool) -> SendToClient:
        """The responses due, as one command. ``read``/``chunk``/``exact`` describe the chunk just
        split: when the due frames are exactly its frames, unchanged, the chunk goes as it is."""
        out = self._ready
        self._ready = []
        routes: tuple[BrokerRoute, ...] = ()
        if self._ready_routes:
            routes = tuple(self._ready_routes)
            self._ready_routes.clear()
        if exact and len(out) == len(read) and all(a is b for a, b in zip(out, read, strict=True)):
            return SendToClient(chunk, routes)
        if self._ready_spanned:
            self._ready_spanned = False
            return _send_pieces(out, routes)
        frames: list[bytes] = out  # type: ignore[assignment]  # no Spanned in it
        if len(frames) == 1:
            return SendToClient(frames[0], routes)
        if _vectored(frames):
            return SendToClient(frames[0], routes, tuple(frames[1:]))
        return SendToClient(b"".join(frames), routes)

    def report(self) -> None:
        """Hand the observer the requests read and exchanges completed since the last call."""
        observer = self.observer
        if observer is None:
            return
        if self._seen:
            seen, self._seen = self._seen, []
            for ex in seen:
                observer.request(ex)
                ex.request = b""  # seen: not held for the broker's round trip
        if self._completed:
            completed, self._completed = self._completed, []
            for ex in completed:
                observer.complete(ex)


def _reject(exc: ProtocolError, oversize: RejectReason, otherwise: RejectReason, side: str) -> CloseConnection:
    """The close for a protocol error met on one side (the log line keeps its text as it was)."""
    return CloseConnection.rejected(oversize if isinstance(exc, FrameSizeError) else otherwise, f"{side}: {exc}")


def _vectored(frames: list[bytes]) -> bool:
    """Whether these frames (more than one) go out in one vectored write rather than joined: when
    they are few and big, so that joining them would copy a lot for few buffers saved."""
    return len(frames) <= VECTORED_MAX_FRAMES and sum(map(len, frames)) >= VECTORED_MIN_BYTES


def _send_pieces(out: list[bytes | Spanned], routes: tuple[BrokerRoute, ...]) -> SendToClient:
    """Responses some of which are :data:`Spanned`, as one vectored write of every piece. The
    first piece is copied when it is a view (``data`` is ``bytes``): at most one read's worth."""
    pieces: list[bytes | bytearray | memoryview] = []
    for frame in out:
        if isinstance(frame, list):
            pieces.extend(frame)
        else:
            pieces.append(frame)
    first = pieces[0]
    return SendToClient(first if type(first) is bytes else bytes(first), routes, tuple(pieces[1:]))


def _head(parts: Spanned, n: int = 16) -> bytes:
    """The first ``n`` bytes of a :data:`Spanned` frame (all of it when shorter): its header."""
    head = b""
    for part in parts:
        head += bytes(part[: n - len(head)])
        if len(head) >= n:
            break
    return head


def _forward_frames(frames: list[bytes]) -> ForwardUpstream:
    if _vectored(frames):
        return ForwardUpstream(frames[0], tuple(frames[1:]))
    return ForwardUpstream(b"".join(frames))


def _acks_zero(ex: Exchange, frame: bytes) -> bool:
    """A Produce with acks=0 (an unreadable one is tracked: the broker's to refuse). Reads the body
    offset into the exchange itself: this runs on every Produce, the property's checks would not pay."""
    offset: int | None = ex._request_body_offset
    if offset == -1:  # not read yet (a rules policy may have read it: then it is not read twice)
        offset = find_request_body(frame, PRODUCE, ex.api_version)
        ex._request_body_offset = -2 if offset is None else offset
    elif offset == -2:
        offset = None
    if offset is None:
        return False
    return produce_acks(frame, ex.api_version, offset) == 0


def _sasl_mechanism(ex: Exchange) -> str | None:
    try:
        body = ex.request_body()
    except ProtocolError:
        return None
    mechanism = body.get("mechanism")
    return mechanism if isinstance(mechanism, str) else None
