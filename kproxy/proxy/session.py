"""One client connection's protocol state, with no I/O (h11-style: bytes in, commands out).

The server feeds :class:`Session` the chunks it reads from the client and from
the upstream broker, as they come; the session splits them into frames, parses
each request header once into an :class:`Exchange`, and answers with
:mod:`~kproxy.proxy.commands` (forward upstream, send to the client, close, wake
me at t) for the server to execute. docs/ARCHITECTURE.md shows where this sits.

A request takes one path (:meth:`Session._client_frame`): read, its correlation id
checked, the policy asked, then forwarded, answered locally, swallowed or the
connection closed; each step once, whatever the verdict. The session's parts live
beside it in kproxy/proxy/: the exchange and its concerns (exchange.py), the policy
seam (verdict.py), the in-order release (release.py), the correlation ids and acks=0
memory (correlation.py). SASL's are in kproxy/sasl/: the token mode and relay (relay.py), and two
units the session owns and calls, each with its own state: the login gate, which holds the client
while kproxy logs in to the broker itself (login_gate.py), and the client's login to kproxy in
terminate mode (client_login.py).

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
  int32 counter); kproxy/proxy/correlation.py says when an acks=0 id is.
* After a successful SaslHandshake v0, the client and broker exchange raw
  size-prefixed SASL tokens with no Kafka header; they pass opaquely until the
  mechanism's exchange is over (kproxy/sasl/relay.py).
* A black hole (a verdict's ``blackhole``) lets nothing more through while it lasts: each
  request read meanwhile is tracked in order and released at once as no answer, never
  forwarded (unless the verdict forwards), so nothing waits for an answer that will never come,
  nothing piles up, and answers to requests forwarded before or after it leave in order, never
  held behind one it swallowed. It ends with its rule (``Verdict.blackhole_lasts``, asked before
  each request and at a slow close's time): requests read from then on flow again.
* With an upstream login (kproxy logs in to the broker itself: kproxy/sasl/upstream_login.py,
  the session's side of it in kproxy/sasl/login_gate.py), no client request goes up while one
  is in progress (the first, begun by the client's first chunk; each re-authentication,
  KIP-368): the client is read no further than one chunk, held until the login succeeded.
  A refused first login answers the client's first request with the
  broker's error where it can (ApiVersions can), then closes. The client's own SASL requests are
  answered ILLEGAL_SASL_STATE, as a broker answers them on a connection needing no login.
* Terminate mode (``auth``: kproxy authenticates the client itself, kproxy/sasl/client_login.py):
  its SASL requests are answered by kproxy, in order with the other answers, and there is no
  upstream connection before the client logged in.
* The connection's principal (:attr:`Session.principal`) is the TLS client certificate's
  the server gives, or the user of a PLAIN or SCRAM login the broker accepted (in either
  SASL form: kproxy/sasl/relay.py's :class:`SaslRelay`) or kproxy accepted (terminate mode);
  the policy is told when it changes.
* ApiVersions at a version kproxy cannot read gets the KIP-511 answer (v0 body,
  UNSUPPORTED_VERSION, the range kproxy reads), never a closed connection, whatever
  the policy decided about it.
* A response whose correlation id is not the oldest forwarded request's is a
  desynchronised stream: the session asks the server to close.
* A chunk whose frames all go on unchanged is handed back as the very object read
  (no copy, no join): the common case, by far (kproxy/proxy/release.py for the rest).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Final

from librt.strings import read_i16_be, read_i32_be

from kproxy.protocol.api_keys import API_VERSIONS, PRODUCE, SASL_AUTHENTICATE, SASL_HANDSHAKE
from kproxy.protocol.codes import ErrorCode, api_name
from kproxy.protocol.error_response import api_versions_answer
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.framing import DEFAULT_MAX_FRAME_SIZE, FrameSplitter, Spanned, frame_head
from kproxy.protocol.message_schemas import supported_versions
from kproxy.protocol.request_fields import request_client_id
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.commands import (
    CONNECT_UPSTREAM,
    CloseConnection,
    CloseKind,
    Command,
    ForwardUpstream,
    RejectReason,
    VerifyCredentials,
    WakeAt,
)
from kproxy.proxy.correlation import ACKS0_REMEMBERED, CorrelationIds
from kproxy.proxy.exchange import Exchange, RuleDecision, Ruling, SessionObserver, produce_acks_zero
from kproxy.proxy.release import VECTORED_MAX_FRAMES, VECTORED_MIN_BYTES, InOrderRelease, forward_frames
from kproxy.proxy.verdict import BLACKHOLED, BLACKHOLED_FORWARDED, InForce, RequestPolicy, Verdict, keep_ruling
from kproxy.sasl.authenticator import FAILED_AUTHENTICATION_DELAY, AuthAnswer, ClientAuth
from kproxy.sasl.client_login import ClientLogin
from kproxy.sasl.login_gate import REFUSAL_LINGER_S, LoginEnd, LoginGate
from kproxy.sasl.relay import SASL_ROUNDS, SaslRelay, SaslTokens
from kproxy.sasl.upstream_login import UpstreamLogin
from kproxy.toxics import WireOrder

__all__ = ["ACKS0_REMEMBERED", "SASL_ROUNDS", "VECTORED_MAX_FRAMES", "VECTORED_MIN_BYTES", "Exchange", "Mode",
           "RequestPolicy", "RuleDecision", "Ruling", "Session", "SessionError", "SessionObserver", "Verdict"]

_SASL_APIS: Final = frozenset((SASL_HANDSHAKE, SASL_AUTHENTICATE))
UNSUPPORTED_VERSION: Final = int(ErrorCode.UNSUPPORTED_VERSION)
# What ApiVersions kproxy reads (above it: the KIP-511 answer).
_KIP511_RANGE: Final = ((API_VERSIONS, *(supported_versions(API_VERSIONS) or (0, 0))),)
_API_VERSIONS_MAX: Final = _KIP511_RANGE[0][2]


class SessionError(ProtocolError):
    """The connection cannot go on (desynchronised stream, unrewritable response).

    Raised and caught inside the session, which turns it into a :class:`CloseConnection`.
    """


class Mode(enum.Enum):
    KAFKA = "kafka"
    SASL_TOKENS = "sasl-tokens"


class Session:
    """Sans-IO state of one client connection.

    ``receive_client(chunk)`` and ``receive_upstream(chunk)`` take the bytes the
    server read, as they came (any split), and return the commands to execute, in
    order (:mod:`kproxy.proxy.commands`); ``on_timer(now)`` answers a
    :class:`~kproxy.proxy.commands.WakeAt`. Between them the server may ask
    :attr:`can_accept` (whether to read the client), :attr:`in_flight_count`,
    :attr:`partial_request_at`, the counters ``requests`` / ``responses``,
    :attr:`client_id` and :attr:`principal` (for its log lines), and takes :attr:`wire_orders`
    (the byte-level toxics verdicts asked for, to install before it executes the chunk's
    commands), and once the connection ended, :meth:`close_delay_s` (a slow close); it reads
    nothing else of the session, and sets :attr:`principal` when the client's TLS certificate names one.

    ``observer`` (optional) sees every request read and every exchange completed
    (acks=0 Produce completes at once, with no response) when the server calls
    :meth:`report`: after it has written what the commands asked for, so that
    metrics work is never on the path of a request or a response. ``policy``
    (optional) decides about each request first (see :class:`RequestPolicy`).
    """

    def __init__(self, rewriter: ResponseRewriter, *, max_in_flight: int = 1000,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, clock: Callable[[], float] = time.perf_counter,
                 observer: SessionObserver | None = None, policy: RequestPolicy | None = None,
                 login: UpstreamLogin | None = None, auth: ClientAuth | None = None) -> None:
        self.rewriter = rewriter
        self.max_in_flight = max_in_flight
        self.clock = clock
        self._observer = observer
        self.policy = policy
        self._client_frames = FrameSplitter(max_frame_size)
        # Terminate mode's client login (kproxy/sasl/client_login.py); ``_auth_gate`` is it only while
        # every request must be shown to it, else None (one attribute per request).
        self._client_login: ClientLogin[Exchange] | None = (ClientLogin(auth, self._client_frames, max_frame_size)
                                                            if auth is not None else None)
        self._auth_gate = self._client_login if self._client_login is not None and self._client_login.gating else None
        self._upstream_frames = FrameSplitter(max_frame_size)
        # A bounded turn's leftovers (receive_client's and receive_upstream's ``turn``), taken before the next read.
        self._client_more: list[bytes] = []
        self._client_more_at: float | None = None
        self._upstream_more: list[bytes | Spanned] = []
        self._ids = CorrelationIds()
        self._release = InOrderRelease(clock, self._ids.taken, observer is not None)
        self.in_flight = self._release.in_flight  # read by tests and the server's gauges (in_flight_count)
        # The forwarded subset of in_flight, oldest first (a list: see InOrderRelease.in_flight).
        self._awaiting: list[Exchange] = []
        self._seen: list[Exchange] = []  # requests read since the last report (kept only with an observer)
        self._sasl: SaslTokens | None = None  # the token exchange in progress (None: Kafka mode)
        self._relay: SaslRelay | None = None  # made at the connection's first SASL request
        self._principal: str | None = None
        self.requests = 0
        self.responses = 0
        # The first request's header client id (None: no request yet, or a null or unreadable one). Read
        # once per connection: clients keep one id per connection, and it names the client in log lines.
        self.client_id: str | None = None
        self._closing: CloseConnection | None = None  # a policy's close, to return after the chunk's commands
        self._blackholed: Verdict | None = None  # in a black hole: the verdict of every request
        self._blackhole_lasts: InForce | None = None  # what the black hole lasts as long as (None: the connection)
        # Byte-level toxics verdicts asked for (kproxy.toxics), for the server to take after each chunk.
        self.wire_orders: list[WireOrder] = []
        self._close_at: float | None = None  # a black hole's close time (close_after_s)
        self._close_delay: tuple[float, InForce | None] | None = None  # a slow close: its delay, its lifetime
        self._edited = False  # a policy replaced a request of the chunk being read: the chunk is not what goes up
        self.login = login  # kproxy's own login to the broker (None: the client's SASL, if any, is relayed)
        # The login gate (kproxy/sasl/login_gate.py): it holds client chunks while a login runs; in
        # terminate mode only from the client's own login on.
        self._gate = (LoginGate(login, self._ids.refuses, self._client_frames, hold_first=auth is None)
                      if login is not None else None)
        self._upstream_out: list[bytes] = []  # frames for the broker from receive_upstream / on_timer (a login's)

    # -- what the server may ask between chunks ----------------------------------------
    @property
    def can_accept(self) -> bool:
        """False while ``max_in_flight`` requests await responses, or a chunk read during an upstream
        login waits for it to end: stop reading the client."""
        gate = self._gate
        return len(self.in_flight) < self.max_in_flight and (gate is None or not gate.held)

    @property
    def in_flight_count(self) -> int:
        """Requests read and not yet answered to the client (local answers waiting their turn included)."""
        return len(self.in_flight)

    @property
    def partial_request_at(self) -> int | None:
        """Where in the client's byte stream the request frame still missing bytes begins; None when
        no partial frame is buffered (the server's frame deadline: limits.frame_timeout). In terminate
        mode, 0 until the client logged in: the whole login has one frame's deadline (the server's: from the start)."""
        if self._auth_gate is not None and self._auth_gate.logging_in:
            return 0
        frames = self._client_frames
        return frames.consumed if frames.buffered else None

    @property
    def observer(self) -> SessionObserver | None:
        """Who sees the exchanges (None: no one); may be set between chunks."""
        return self._observer

    @observer.setter
    def observer(self, observer: SessionObserver | None) -> None:
        self._observer = observer
        self._release.observed = observer is not None

    @property
    def principal(self) -> str | None:
        """The connection's principal as Kafka names it (``User:...``), None while unknown: a
        verified TLS client certificate's (set by the server), or the user of the last PLAIN or
        SCRAM login the broker accepted (which a Kafka broker takes over the certificate's)."""
        return self._principal

    @principal.setter
    def principal(self, principal: str | None) -> None:
        self._principal = principal
        if self.policy is not None:
            self.policy.principal = principal

    @property
    def logging_in(self) -> bool:
        """Terminate mode, before the client's first login succeeded."""
        return self._auth_gate is not None and self._auth_gate.logging_in

    @property
    def mode(self) -> Mode:
        """Whether the client speaks Kafka or passes raw SASL tokens (kproxy/sasl/relay.py)."""
        return Mode.KAFKA if self._sasl is None else Mode.SASL_TOKENS

    # -- client -> upstream ----------------------------------------------------------
    def receive_client(self, chunk: bytes | bytearray, read_at: float | None = None, turn: int = 0) -> list[Command]:
        """Take a chunk read from the client (``read_at``: when; defaults to now).

        Returns, in order: a :class:`SendToClient` when local answers became due, then a
        :class:`ForwardUpstream` with the requests to forward (the chunk itself when it
        held exactly those frames) - or a lone :class:`CloseConnection` when a request is
        refused: nothing of that chunk is forwarded then. During an upstream login the chunk is held
        and taken when the login succeeded; the first chunk begins the first login (its requests).

        ``turn`` (0: no bound) takes at most that many of the chunk's requests now; the others wait
        in the session (:attr:`more_client`) until :meth:`receive_client_more` takes them, which the
        server calls after a pass through its scheduler and before it reads again: one turn of its
        loop does not go to thousands of one client's tiny requests.
        """
        gate = self._gate
        if gate is not None and gate.held is not None:
            return self._login_hold(gate, chunk, read_at)
        try:
            frames, data, exact = self._client_frames.split(chunk)
        except ProtocolError as exc:
            return [CloseConnection.for_error(exc, RejectReason.REQUEST_OVERSIZE, RejectReason.REQUEST_SESSION,
                                              "bad request from client")]
        if not frames:
            return []
        if turn and len(frames) > turn:
            self._client_more = frames[turn:]
            self._client_more_at = read_at
            frames, exact = frames[:turn], False
        return self._take_client(frames, data, exact, read_at)

    @property
    def more_client(self) -> bool:
        """Whether requests of the last chunk wait for :meth:`receive_client_more`."""
        return bool(self._client_more)

    def receive_client_more(self, turn: int) -> list[Command]:
        """The next ``turn`` requests of the chunk :meth:`receive_client` bounded, as it would have
        taken them."""
        frames = self._client_more
        self._client_more = frames[turn:]
        return self._take_client(frames[:turn], b"", False, self._client_more_at)

    def _take_client(self, frames: list[bytes], data: bytes, exact: bool, read_at: float | None) -> list[Command]:
        try:
            forward = [f for raw in frames if (f := self._client_frame(raw, read_at)) is not None]
        except ProtocolError as exc:
            self._client_more = []
            return [CloseConnection.for_error(exc, RejectReason.REQUEST_OVERSIZE, RejectReason.REQUEST_SESSION,
                                              "bad request from client")]
        release = self._release
        commands: list[Command] = [release.take(frames, data, False)] if release.ready else []
        if forward:
            # Requests go on unchanged (same objects): all of them and nothing else means the chunk itself.
            if exact and len(forward) == len(frames) and not self._edited:
                commands.append(ForwardUpstream(data))
            else:
                commands.append(ForwardUpstream(forward[0]) if len(forward) == 1 else forward_frames(forward))
        self._edited = False
        if release.wake is not None:
            self._ask_wake(commands)
        if self._closing is not None or (self._client_login is not None and self._client_login.pending):
            self._last(commands)
        return commands

    def _client_frame(self, frame: bytes, read_at: float | None) -> bytes | None:
        """Take one request frame; return what to forward upstream (the frame, or the policy's
        replacement), or None when nothing goes up for it.

        The one path of a request: read (a frame in SASL token mode passes as it is); its
        correlation id checked (:class:`SessionError` when it is taken: kproxy/proxy/correlation.py);
        the policy asked; then a close, or: an acks=0 Produce goes on untracked (or is swallowed);
        any other request is tracked in order, then answered locally (the policy's answer, or
        the KIP-511 answer) or forwarded and awaited.
        """
        if self._sasl is not None:
            if not self._sasl.ends_with(frame):
                if self._relay is not None:
                    self._relay.login.client_token(frame[4:])
                return frame
            self._sasl = None  # a Kafka request again: it gets every check below
        gate = self._auth_gate
        if gate is not None and gate.auth.raw:
            now = self.clock()
            self._auth_answer(gate, gate.token(frame, now, bool(self._release.in_flight)), None, now)
            return None
        if len(frame) < 12:  # size, api_key, api_version, correlation_id
            raise SessionError(f"request frame of {len(frame)} bytes is too short for a header", offset=0)
        api_key: int = read_i16_be(frame, 4)
        api_version: int = read_i16_be(frame, 6)
        correlation_id: int = read_i32_be(frame, 8)
        if self.rewriter.unreadable(api_key, api_version):
            raise SessionError(f"{api_name(api_key)} v{api_version} request: kproxy cannot read that version's "
                               f"response, so it could not keep broker addresses out of it (ApiVersions offered "
                               f"only versions it reads)", offset=0)
        ids = self._ids
        if correlation_id in ids.taken or (ids.forgotten is not None and ids.refuses(correlation_id)):
            raise SessionError(ids.why_taken(api_name(api_key), api_version, correlation_id,
                                              any(e.correlation_id == correlation_id for e in self.in_flight)),
                               offset=8)
        self.requests += 1
        if self.requests == 1:
            self.client_id = request_client_id(frame, api_key, api_version)
        now = self.clock()
        ex = Exchange(correlation_id, api_key, api_version, len(frame), now if read_at is None else read_at, now,
                      frame)
        if ids.acks0:  # only then does its place among acks=0 Produce matter (CorrelationIds.answered_in_order)
            ex.seq = self.requests
        if self._observer is not None:
            self._seen.append(ex)
        if gate is not None and self._auth_gated(gate, ex, now):
            return None
        verdict: Verdict | None = None
        out = frame
        if self.policy is not None:
            if self._closing is not None:
                return None  # a rule closed the connection earlier in this chunk: nothing more goes on
            if self._blackholed is not None and not self._blackhole_holds():
                self._heal()
            verdict = self.policy.decide(ex)  # asked even in a black hole: its rules count what they meet
            if self._blackholed is not None and (verdict is None or verdict.close is None):
                verdict = self._blackholed  # nothing but a close changes what a black hole does
            if verdict is not None:
                if verdict.close is not None:
                    self._closing = verdict.close
                    return None
                if verdict.wire:
                    self.wire_orders.extend(verdict.wire)
                if verdict.blackhole and self._blackholed is None:
                    self._blackhole(verdict, now)
                if verdict.close_delay_s and self.close_delay_s() < verdict.close_delay_s:
                    self._close_delay = (verdict.close_delay_s, verdict.close_delay_lasts)
                if verdict.request is not None:
                    out = verdict.request
                    self._edited = True
        release = self._release
        if api_key == PRODUCE and produce_acks_zero(ex, frame):
            # No answer, injected or not (the client expects none): only forwarding is a choice. A broker
            # that answers anyway (Tansu) has that answer dropped.
            if release.observed:
                ex.completed_at = now
                release.completed.append(ex)
            if verdict is not None and not verdict.forward:
                return None
            ids.remember_acks0(self.requests, correlation_id)
            return out
        if verdict is not None:
            keep_ruling(ex, verdict)
        release.in_flight.append(ex)
        ids.taken.add(correlation_id)
        if verdict is not None and not verdict.forward:
            self._answer_locally(ex, verdict.answer, now)
            return None
        if api_key == API_VERSIONS and (api_version > _API_VERSIONS_MAX or self._detached()):
            # KIP-511's answer above the versions kproxy reads; else (no upstream connection yet) the cluster's.
            self._answer_locally(ex, api_versions_answer(correlation_id, UNSUPPORTED_VERSION, _KIP511_RANGE)
                                 if api_version > _API_VERSIONS_MAX else self._cluster_api_versions(ex), now)
            return None
        if api_key in _SASL_APIS:
            client_login = self._client_login
            if client_login is not None:  # terminate mode, logged in for good: kproxy answers (ILLEGAL_SASL_STATE)
                self._auth_answer(client_login, client_login.auth.request(ex, now), ex, now)
                return None
            if self._gate is not None:  # kproxy logged in itself: nothing to relay (module docstring)
                self._answer_locally(ex, self._gate.refuse_client_sasl(frame), now)
                return None
            if self._relay is None:
                self._relay = SaslRelay()
            self._relay.request(ex)
        self._awaiting.append(ex)
        return out

    # -- the login gate (kproxy's own login to the broker: kproxy/sasl/login_gate.py) -------------
    def _login_hold(self, gate: LoginGate, chunk: bytes | bytearray, read_at: float | None) -> list[Command]:
        """A client chunk read while a login runs: held; the connection's first one begins the
        first login (its first request, and a wake-up at its deadline)."""
        out = gate.hold(chunk, read_at)
        if not out:
            return []
        assert gate.deadline is not None
        return [ForwardUpstream(out), WakeAt(gate.deadline)]

    def _login_ended(self, end: LoginEnd) -> None:
        """Success: the held client chunks are read now (their requests go up, after those read
        behind a terminate-mode login). Refusal: the answer to the client's first request, if
        any, and the close."""
        if end.close is not None:
            if end.error is not None:
                self._closing = CloseConnection.for_error(end.error, RejectReason.REQUEST_OVERSIZE,
                                                         RejectReason.REQUEST_SESSION, "bad request from client")
                self._edited = False
                return
            if end.answer is not None:
                self._release.ready.append(end.answer)
            self._closing = CloseConnection(end.close, CloseKind.END, linger=REFUSAL_LINGER_S)
            return
        try:
            if self._client_login is not None:
                self._upstream_out += self._client_login.pipelined()
            for chunk, read_at in end.held:
                frames, _, _ = self._client_frames.split(chunk)
                self._upstream_out.extend(f for raw in frames if (f := self._client_frame(raw, read_at)) is not None)
        except ProtocolError as exc:
            self._closing = CloseConnection.for_error(exc, RejectReason.REQUEST_OVERSIZE, RejectReason.REQUEST_SESSION,
                                                     "bad request from client")
        self._edited = False

    def _login_commands(self, gate: LoginGate, commands: list[Command], again: bool = False) -> None:
        """The frames the login (and the requests it held) send next; a wake-up at its deadline or next
        re-authentication when that changed, or ``again`` (on_timer: the server forgot the last)."""
        if self._upstream_out:
            out, self._upstream_out = self._upstream_out, []
            commands.append(ForwardUpstream(out[0]) if len(out) == 1 else forward_frames(out))
        when = gate.wake(again)
        if when is not None:
            self._release.want_wake(when)

    # -- terminate mode (the client's login to kproxy: kproxy/sasl/client_login.py) ----------------
    def _detached(self) -> bool:
        """Terminate mode, before the upstream connection was asked for."""
        return self._client_login is not None and self._client_login.detached

    def _auth_gated(self, gate: ClientLogin[Exchange], ex: Exchange, now: float) -> bool:
        """While every request is shown to the client login: True when ``ex`` was taken care of here
        (a SASL request answered by kproxy, or a request refused before the login), False when it
        goes on as any request does."""
        answer = gate.gate(ex, now)
        if answer is None:
            return False
        if answer.frame is None and ex.api_key not in _SASL_APIS:
            self._auth_answer(gate, answer, None, now)  # closed without an answer, as a broker does: nothing to track
            return True
        self._release.in_flight.append(ex)
        self._ids.taken.add(ex.correlation_id)
        self._auth_answer(gate, answer, ex, now)
        return True

    def _auth_answer(self, client_login: ClientLogin[Exchange], answer: AuthAnswer, ex: Exchange | None,
                     now: float) -> None:
        """Do what kproxy's SASL server said: the answer (to ``ex``, tracked; or a raw token when
        ``ex`` is None) in its turn, the close, the new principal; or, first, the verification."""
        if not client_login.answered(answer, ex):
            return  # a verification runs first: its answer comes through verified()
        if ex is not None:
            self._answer_locally(ex, answer.frame, now)  # None: swallowed (the connection closes)
        elif answer.frame is not None:
            self._release.ready.append(answer.frame)
        if answer.close is not None and self._closing is None:
            # After an answer (a refusal the client must read) the close waits, as a broker's does.
            linger = FAILED_AUTHENTICATION_DELAY if answer.frame is not None else 0.0
            self._closing = (CloseConnection(answer.close, CloseKind.REJECT, RejectReason.REQUEST_SESSION,
                                             linger=linger) if answer.reject
                             else CloseConnection(answer.close, CloseKind.END, linger=linger))
        principal = client_login.auth.principal
        if principal is not None and principal != self.principal:
            self.principal = principal
        if self._auth_gate is not None and not client_login.gating:
            self._auth_gate = None

    def verified(self, ok: bool | None) -> list[Command]:
        """The result of a :class:`~kproxy.proxy.commands.VerifyCredentials` this session asked for
        (None: the server did not run it): the commands that follow from it (the login's answer, in
        its turn; a close after a refusal)."""
        client_login = self._client_login
        assert client_login is not None
        now = self.clock()
        answer, ex = client_login.verified(ok, now)
        self._auth_answer(client_login, answer, ex, now)
        release = self._release
        commands: list[Command] = [release.take([], b"", False)] if release.ready else []
        if release.wake is not None:
            self._ask_wake(commands)
        self._last(commands)
        return commands

    def upstream_connected(self) -> list[Command]:
        """The connection :class:`~kproxy.proxy.commands.ConnectUpstream` asked for is open: what
        goes up first. With kproxy's own login (``sasl.upstream``), that login's first requests
        (the client's wait for its end); otherwise the requests read behind the client's login."""
        gate = self._gate
        if gate is not None:
            out = gate.begin()
            assert gate.deadline is not None
            return [ForwardUpstream(out), WakeAt(gate.deadline)]
        assert self._client_login is not None
        return [ForwardUpstream(after) for after in self._client_login.pipelined()]

    def _last(self, commands: list[Command]) -> None:
        """What ends a command list: the close asked for, else the upstream connection a login just
        earned (the client then held while kproxy logs in itself), and the verification to run."""
        if self._closing is not None:
            commands.append(self._closing)
            return
        client_login = self._client_login
        if client_login is None:
            return
        if client_login.attach_due:
            self._attach(client_login, commands)
        verification = client_login.take_verification()
        if verification is not None:
            assert verification.verify is not None
            commands.append(VerifyCredentials(verification.verify, verification.verify_key))

    def _attach(self, client_login: ClientLogin[Exchange], commands: list[Command]) -> None:
        """The client's first login succeeded: ask for the upstream connection after the answers in
        ``commands``. What they would have sent upstream (requests pipelined behind the login's last
        message) waits for :meth:`upstream_connected`; with kproxy's own login, so do the client's
        next chunks (held by the login gate), until that login's end."""
        pipelined = b""
        for i, command in enumerate(commands):
            if type(command) is ForwardUpstream:
                pipelined = command.payload()
                del commands[i]
                break
        client_login.attached(pipelined)
        if self._gate is not None:
            self._gate.hold_from_now()
        commands.append(CONNECT_UPSTREAM)

    def _cluster_api_versions(self, ex: Exchange) -> bytes | None:
        """The answer to the client's ApiVersions before the upstream connection is open: the
        cluster's own answer at that version (kproxy/sasl/client_login.py), capped and given
        kproxy's SASL versions as a broker's answer is (kproxy/proxy/address_rewrite.py), then edited by
        the request's rules as a broker's would be. None when no answer of the cluster is known:
        the connection closes (nothing is answered)."""
        assert self._client_login is not None
        frame = self._client_login.cluster_api_versions(ex)
        if frame is None:
            self._closing = CloseConnection("no ApiVersions answer of the cluster known yet (kproxy answers a "
                                            "client's before its login)", CloseKind.END)
            return None
        response = self.rewriter.rewrite_exchange(ex, frame)
        ruling = ex.ruling
        if ruling is not None and ruling.on_response is not None:
            response = ruling.on_response(response)
            if ex.memo is not None:
                ex.memo.response_body = None
        return response

    def _sasl_login(self, principal: str | None) -> None:
        """A login ended; ``principal`` is who it established (None: it established no one)."""
        if principal is not None and principal != self._principal:
            self.principal = principal

    def _blackhole(self, verdict: Verdict, now: float) -> None:
        """A verdict's blackhole: no answer for this request or any later one, and unless it
        forwards, none of them reaches the broker (each is read, tracked in order and released
        as no answer at once: nothing waits for an answer that will never come, and nothing
        piles up); with ``close_after_s``, the connection ends that long after (a slow close,
        from :meth:`on_timer`)."""
        self._blackholed = BLACKHOLED_FORWARDED if verdict.forward else BLACKHOLED
        self._blackhole_lasts = verdict.blackhole_lasts
        if verdict.close_after_s is not None:
            self._close_at = now + verdict.close_after_s
            self._release.want_wake(self._close_at)

    def close_delay_s(self) -> float:
        """How long after the connection ended its sockets are to close (a rule's slow close still in
        force; 0: at once). The server asks once the connection ended, whatever ended it."""
        delay = self._close_delay
        if delay is None:
            return 0.0
        lasts = delay[1]
        return delay[0] if lasts is None or lasts.in_force() else 0.0

    def _blackhole_holds(self) -> bool:
        """Whether the black hole the connection is in still lasts (its rule is in force)."""
        lasts = self._blackhole_lasts
        return lasts is None or lasts.in_force()

    def _heal(self) -> None:
        """The black hole's rule ended: requests flow again, and its slow close will not come. The
        requests it swallowed stay unanswered (their client times them out, as over a healed partition)."""
        self._blackholed = self._blackhole_lasts = None
        self._close_at = None

    def _answer_locally(self, ex: Exchange, answer: bytes | None, now: float) -> None:
        """Answer a tracked request in the broker's place (``answer`` None: it is swallowed, no answer
        leaves for it). The answer waits its turn and any hold or delay like a broker's answer."""
        ex.local = True
        ex.received_at = now
        if answer is None:
            ruling = ex.ruling
            if ruling is None:
                ruling = ex.ruling = Ruling()
            ruling.drop = True
            answer = b""
        ex.response = answer
        ruling = ex.ruling
        if ruling is not None and ruling.response_delay:
            ruling.release_at = max(ruling.release_at, now + ruling.response_delay)
        self._release.flush()

    def _ask_wake(self, commands: list[Command]) -> None:
        release = self._release
        assert release.wake is not None
        commands.append(WakeAt(release.wake))
        release.wake = None

    # -- upstream -> client ----------------------------------------------------------
    def receive_upstream(self, chunk: bytes | bytearray, turn: int = 0) -> list[Command]:
        """Take a chunk read from the broker.

        Returns a :class:`SendToClient` with the responses now due, in request order
        (the chunk itself when it held exactly those frames, unchanged), or nothing when
        none is due yet - or a lone :class:`CloseConnection` for a response that cannot
        be matched or rewritten: nothing of that chunk reaches the client then.
        ``turn``: as :meth:`receive_client`'s (:attr:`more_upstream`, :meth:`receive_upstream_more`).
        """
        try:
            # With no observer nothing needs a response whole unless it is rewritten (see _upstream_frame).
            frames, data, exact = self._upstream_frames.split(chunk, self._observer is not None)
            if turn and len(frames) > turn:
                self._upstream_more = frames[turn:]
                frames, exact = frames[:turn], False
            for raw in frames:
                self._upstream_frame(raw)
        except ProtocolError as exc:
            self._upstream_more = []
            return [CloseConnection.for_error(exc, RejectReason.RESPONSE_OVERSIZE, RejectReason.RESPONSE_SESSION,
                                              "bad response from upstream")]
        return self._upstream_commands(frames, data, exact)

    @property
    def more_upstream(self) -> bool:
        """Whether responses of the last chunk wait for :meth:`receive_upstream_more`."""
        return bool(self._upstream_more)

    def receive_upstream_more(self, turn: int) -> list[Command]:
        """The next ``turn`` responses of the chunk :meth:`receive_upstream` bounded."""
        frames = self._upstream_more
        self._upstream_more = frames[turn:]
        frames = frames[:turn]
        try:
            for raw in frames:
                self._upstream_frame(raw)
        except ProtocolError as exc:
            self._upstream_more = []
            return [CloseConnection.for_error(exc, RejectReason.RESPONSE_OVERSIZE, RejectReason.RESPONSE_SESSION,
                                              "bad response from upstream")]
        return self._upstream_commands(frames, b"", False)

    def _upstream_commands(self, frames: list[bytes | Spanned], data: bytes, exact: bool) -> list[Command]:
        release = self._release
        commands: list[Command] = [release.take(frames, data, exact)] if release.ready else []
        gate = self._gate
        if gate is not None:
            self._login_commands(gate, commands)
        if release.wake is not None:
            self._ask_wake(commands)
        if gate is not None:  # the client chunks a login held were read here
            self._last(commands)
        return commands

    def on_timer(self, now: float) -> list[Command]:
        """The time asked by a :class:`~kproxy.proxy.commands.WakeAt` has come (or is near).

        Held responses (a policy's delay or throttle) whose time has come are released from here,
        in request order; a slow close and an upstream login that took too long end here, and an
        upstream re-authentication begins here (its :class:`ForwardUpstream`: client requests go
        up from ``receive_client``, or ``receive_upstream`` after a login held them).
        """
        if self._close_at is not None and now >= self._close_at:
            if self._blackhole_holds():
                return [CloseConnection("rule: blackhole close_after_ms", CloseKind.DELIBERATE)]
            self._heal()
        release = self._release
        release.flush()
        gate = self._gate
        if gate is not None:
            out, end = gate.on_timer(now)
            if out:
                self._upstream_out.append(out)
            if end is not None:  # it ran out of time
                self._login_ended(end)
                assert self._closing is not None
                return [release.take([], b"", False), self._closing] if release.ready else [self._closing]
        commands: list[Command] = [release.take([], b"", False)] if release.ready else []
        if gate is not None:
            self._login_commands(gate, commands, True)
        if self._close_at is not None:
            release.want_wake(self._close_at)
        if release.wake is not None:
            self._ask_wake(commands)
        return commands

    def _upstream_frame(self, frame: bytes | Spanned) -> None:
        """Take one response frame: a SASL token passes as it is; an answer is matched to the oldest
        request awaiting one (or dropped as an acks=0 Produce's), rewritten, edited by the policy's
        ruling, and released in order."""
        parts: Spanned | None = None
        if isinstance(frame, list):
            parts = frame
            frame = frame_head(parts)
        if self._sasl is not None:
            token = frame if parts is None else b"".join(parts)
            self._release.ready.append(token)
            if self._relay is not None:
                self._sasl_login(self._relay.login.broker_token(token[4:], True))
            if self._sasl.broker_token():
                self._sasl = None
            return
        if len(frame) < 8:  # size, correlation_id
            raise SessionError(f"response frame of {len(frame)} bytes has no correlation id", offset=0)
        correlation_id: int = read_i32_be(frame, 4)
        ids = self._ids
        ex = self._awaiting[0] if self._awaiting else None
        if ex is None or ex.correlation_id != correlation_id:
            # Not the oldest request's answer (ids are never shared between it and an acks=0 Produce):
            # the answer to an acks=0 Produce, remembered or pushed out, is dropped; else a desync.
            if (ids.acks0 or ids.forgotten is not None) and ids.answers_acks0(correlation_id):
                return
            gate = self._gate
            if gate is not None and gate.awaits(correlation_id):  # (its ids are never the client's)
                out, end = gate.answer(correlation_id, frame if parts is None else b"".join(parts))
                if out:
                    self._upstream_out.append(out)
                if end is not None:
                    self._login_ended(end)
                return
            if ex is None:
                raise SessionError(f"response with correlation id {correlation_id} matches no request in flight")
            raise SessionError(f"response correlation id {correlation_id} does not match the oldest request "
                               f"in flight ({ex.correlation_id}, {ex.api} v{ex.api_version})")
        del self._awaiting[0]
        if ids.acks0:
            ids.answered_in_order(ex.seq)
        self.responses += 1
        ex.received_at = self.clock()
        ruling = ex.ruling
        if parts is not None:
            if (ruling is None or ruling.on_response is None) and not self.rewriter.needs_rewrite(
                    ex.api_key, ex.api_version):
                ex.response = b""
                ex.response_parts = parts
            else:
                frame = b"".join(parts)
                parts = None
        if parts is None:
            response = self.rewriter.rewrite_exchange(ex, frame)
            if ruling is not None and ruling.on_response is not None:
                # After the default address rewrite: a rule's rewrite_addresses maps what clients would see.
                response = ruling.on_response(response)
                if ex.memo is not None:
                    ex.memo.response_body = None
            ex.response = response
        if ruling is not None and ruling.response_delay:
            ruling.release_at = max(ruling.release_at, ex.received_at + ruling.response_delay)
        relay = self._relay
        if relay is not None and correlation_id in relay.awaiting:
            try:
                tokens, principal = relay.answer(ex, frame if parts is None else b"".join(parts))
            except ProtocolError as exc:
                raise SessionError(exc.reason, offset=exc.offset) from None
            if tokens is not None:
                self._sasl = tokens
            self._sasl_login(principal)
        self._release.flush()

    def report(self) -> None:
        """Hand the observer the requests read and exchanges completed since the last call."""
        observer = self._observer
        if observer is None:
            return
        if self._seen:
            seen, self._seen = self._seen, []
            for ex in seen:
                observer.request(ex)
                ex.request = b""  # seen: not held for the broker's round trip
        release = self._release
        if release.completed:
            completed, release.completed = release.completed, []
            for ex in completed:
                observer.complete(ex)
