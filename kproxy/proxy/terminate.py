"""Terminate mode's part of a session: what :class:`~kproxy.proxy.session.Session` does with the
answers of kproxy's own SASL server (:class:`~kproxy.proxy.client_auth.ClientAuth`).

:class:`TerminateMode` is a part of :class:`Session` (the base of its base class), kept apart because it is
one job: the SASL requests and raw tokens kproxy answers itself are tracked and released in
order with every other answer; a PLAIN password's slow hash becomes a
:class:`~kproxy.proxy.commands.VerifyCredentials` command whose result comes back through
:meth:`TerminateMode.verified`; a refusal's answer is followed by the close
:data:`~kproxy.proxy.client_auth.FAILED_AUTHENTICATION_DELAY` later (the command's ``linger``);
the login becomes the connection's principal; until it, client frames are bounded by
:data:`~kproxy.proxy.client_auth.MAX_RECEIVE_SIZE` and the whole login is held to the deadline
of one frame (``partial_request_at`` is 0).

Nothing reaches the cluster for a client before its login succeeded: the session starts with no
upstream connection, answers the client's ApiVersions from the cluster's own answers to kproxy
(:data:`~kproxy.proxy.client_auth.ApiVersionsSource`, capped and given kproxy's SASL versions as a
broker's answer is), and asks for the connection (:class:`~kproxy.proxy.commands.ConnectUpstream`)
after the answer that tells the client it logged in. So a client that fails its login, or never
tries, costs the cluster no connection and no login: an unauthenticated flood is not amplified.
Requests the client sent behind its login's last message wait for the connection
(:meth:`TerminateMode.upstream_connected`), and with kproxy's own login (``sasl.upstream``) for
that login's end, as every request of a connection kproxy logs in on does.

Nothing here runs in relay mode (no ``auth``): the session checks one attribute per frame.
"""

from __future__ import annotations

from collections.abc import Callable

from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.framing import FrameSplitter
from kproxy.protocol.tables import ApiKey
from kproxy.proxy.client_auth import FAILED_AUTHENTICATION_DELAY, MAX_RECEIVE_SIZE, AuthAnswer, ClientAuth
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
from kproxy.proxy.correlation import CorrelationIds
from kproxy.proxy.exchange import Exchange
from kproxy.proxy.release import InOrderRelease
from kproxy.proxy.rewrite import ResponseRewriter
from kproxy.proxy.upstream_login import UpstreamLogin

_SASL_APIS = frozenset((int(ApiKey.SASL_HANDSHAKE), int(ApiKey.SASL_AUTHENTICATE)))


class TerminateError(ProtocolError):
    """A raw token the session cannot take: the connection closes (a request the session refuses)."""


class TerminateMode:
    """The terminate-mode steps of a session (see the module's docstring). The session sets these
    attributes; the methods below are the only ones that change the ``_auth*`` ones."""

    _auth: ClientAuth | None
    _auth_gate: ClientAuth | None  # ``_auth`` while every request must be shown to it, else None
    _offload: VerifyCredentials | None  # a verification to hand the server after this chunk
    _verifying: Exchange | None  # the SaslAuthenticate it answers (None: a raw token)
    _detached: bool  # no upstream connection asked for yet (terminate mode, before the first login)
    _attach_due: bool  # the first login just succeeded: ask for the connection at the end of this list
    _after_login: bytes  # requests read behind the login's last message, for the broker once it is ready
    _closing: CloseConnection | None
    _client_frames: FrameSplitter
    _max_frame_size: int
    _release: InOrderRelease
    _ids: CorrelationIds
    _hold: list[tuple[bytes | bytearray, float | None]] | None
    login: UpstreamLogin | None
    rewriter: ResponseRewriter
    clock: Callable[[], float]
    principal: str | None

    def _terminate(self, auth: ClientAuth | None, max_frame_size: int) -> None:
        """Set the terminate-mode state up (``auth`` None: relay mode, none of it)."""
        self._auth = auth
        self._auth_gate = auth if auth is not None and auth.gating else None
        self._max_frame_size = max_frame_size
        if self._auth_gate is not None:
            self._client_frames.max_frame_size = min(max_frame_size, MAX_RECEIVE_SIZE)  # until logged in
        self._offload = None
        self._verifying = None
        self._detached = auth is not None
        self._attach_due = False
        self._after_login = b""

    @property
    def logging_in(self) -> bool:
        """Terminate mode, before the client's first login succeeded."""
        return self._auth_gate is not None and self._auth_gate.principal is None

    def _answer_locally(self, ex: Exchange, answer: bytes | None, now: float) -> None:
        raise NotImplementedError  # the session's

    def _ask_wake(self, commands: list[Command]) -> None:
        raise NotImplementedError  # the session's

    def _due(self) -> list[Command]:
        """The answers due now, and the wake-up a held one asks for."""
        release = self._release
        commands: list[Command] = [release.take([], b"", False)] if release.ready else []
        if release.wake is not None:
            self._ask_wake(commands)
        return commands

    def _last(self, commands: list[Command]) -> None:
        """What ends a command list: the close asked for, else the upstream connection a login just
        earned, and the verification to run."""
        if self._closing is not None:
            commands.append(self._closing)
            return
        if self._attach_due:
            self._attach(commands)
        if self._offload is not None:
            commands.append(self._offload)
            self._offload = None

    def _attach(self, commands: list[Command]) -> None:
        """The client's first login succeeded: ask for the upstream connection after the answers in
        ``commands``. What they would have sent upstream (requests pipelined behind the login's last
        message) waits for :meth:`upstream_connected`; with kproxy's own login, so do the client's
        next chunks (held, as during any upstream login), until that login's end."""
        self._attach_due = False
        self._detached = False
        for i, command in enumerate(commands):
            if type(command) is ForwardUpstream:
                self._after_login = command.payload()
                del commands[i]
                break
        if self.login is not None:
            self._hold = []
        commands.append(CONNECT_UPSTREAM)

    def upstream_connected(self) -> list[Command]:
        """The connection :class:`~kproxy.proxy.commands.ConnectUpstream` asked for is open: what
        goes up first. With kproxy's own login (``sasl.upstream``), that login's first requests
        (the client's wait for its end); otherwise the requests read behind the client's login."""
        login = self.login
        if login is not None:
            out = login.begin(self._ids.refuses)
            assert login.deadline is not None
            return [ForwardUpstream(out), WakeAt(login.deadline)]
        return [ForwardUpstream(after) for after in self._pipelined()]

    def _pipelined(self) -> list[bytes]:
        """The requests read behind the client's login, taken (sent once the broker may have them)."""
        after, self._after_login = self._after_login, b""
        return [after] if after else []

    def _cluster_api_versions(self, ex: Exchange) -> bytes | None:
        """The answer to the client's ApiVersions before the upstream connection is open: the
        cluster's own answer at that version (kproxy/server/discovery.py), capped and given
        kproxy's SASL versions as a broker's answer is (kproxy/proxy/rewrite.py), then edited by
        the request's rules as a broker's would be. None when no answer of the cluster is known:
        the connection closes (nothing is answered)."""
        auth = self._auth
        assert auth is not None
        frame = auth.api_versions(ex.correlation_id, ex.api_version) if auth.api_versions is not None else None
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

    def verified(self, ok: bool | None) -> list[Command]:
        """The result of a :class:`VerifyCredentials` this session asked for (None: the server did not
        run it): the commands that follow from it (the login's answer, in its turn; a close after a
        refusal)."""
        auth = self._auth
        assert auth is not None
        now = self.clock()
        ex, self._verifying = self._verifying, None
        self._auth_answer(auth.verified(ok, now), ex, now)
        commands = self._due()
        self._last(commands)
        return commands

    def _auth_gated(self, auth: ClientAuth, ex: Exchange, now: float) -> bool:
        """While every request is shown to ``auth``: True when ``ex`` was taken care of here (a SASL
        request answered by kproxy, or a request refused before the login), False when it goes on
        as any request does."""
        if ex.api_key in _SASL_APIS:
            answer = auth.request(ex, now)
        else:
            refused = auth.admits(ex, now)
            if refused is None:
                return False
            answer = refused
            if answer.frame is None:  # closed without an answer, as a broker does: nothing to track
                self._auth_answer(answer, None, now)
                return True
        self._release.in_flight.append(ex)
        self._ids.taken.add(ex.correlation_id)
        self._auth_answer(answer, ex, now)
        return True

    def _auth_token(self, auth: ClientAuth, frame: bytes) -> None:
        """A raw SASL token after SaslHandshake v0, answered by kproxy."""
        if self._release.in_flight:
            # A raw answer has no correlation id to wait its turn with: a client sends its token once
            # the SaslHandshake is answered (every client does; a broker reads one message at a time).
            raise TerminateError("SASL token sent before the answers to earlier requests", offset=0)
        now = self.clock()
        self._auth_answer(auth.token(frame[4:], now), None, now)

    def _auth_answer(self, answer: AuthAnswer, ex: Exchange | None, now: float) -> None:
        """Do what kproxy's SASL server said: the answer (to ``ex``, tracked; or a raw token when
        ``ex`` is None) in its turn, the verification to ask for, the close, the new principal."""
        auth = self._auth
        assert auth is not None
        if answer.verify is not None:
            self._offload = VerifyCredentials(answer.verify, answer.verify_key)
            self._verifying = ex
            return
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
        if auth.principal is not None and auth.principal != self.principal:
            self.principal = auth.principal
        if auth.principal is not None and self._detached:
            self._attach_due = True  # the upstream connection is asked for once the answer is on its way
        if self._auth_gate is not None and not auth.gating:
            self._auth_gate = None
        if self._client_frames.max_frame_size != self._max_frame_size and auth.principal is not None:
            self._client_frames.max_frame_size = self._max_frame_size
