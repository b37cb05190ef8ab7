"""The session's side of kproxy's own login to the broker (``sasl.upstream``): holding the client.

:class:`UpstreamLoginMode` is a part of :class:`~kproxy.proxy.session.Session` (between it and
:class:`~kproxy.proxy.terminate.TerminateMode` in its bases), kept apart because it is one job:
while a login runs (:class:`~kproxy.proxy.upstream_login.UpstreamLogin`, the SASL exchange
itself), the client's chunks are held and no request of the client goes up; the login's own
frames go up instead, and the broker's answers to them never reach the client. The first login
is begun by the client's first chunk; each re-authentication (KIP-368) by the session's timer.
When a login succeeds, the held chunks are read as if they had just come; when it is refused or
times out, the client is read no more, a first login's refusal answers the client's first request
where that request's answer can carry the error (ApiVersions can), and the connection closes
:data:`REFUSAL_LINGER_S` after it, as a broker closes.

Nothing here runs without ``login`` (the session checks one attribute per chunk).
"""

from __future__ import annotations

from typing import Final

from kproxy.protocol.errors import ProtocolError
from kproxy.proxy.client_auth import FAILED_AUTHENTICATION_DELAY
from kproxy.proxy.commands import CloseConnection, CloseKind, Command, ForwardUpstream, RejectReason, WakeAt
from kproxy.proxy.release import forward_frames
from kproxy.proxy.terminate import TerminateMode
from kproxy.proxy.upstream_login import SUCCESS, LoginResult, UpstreamLogin, refusal_answer

# A refused upstream login closes this long after its answer, as a broker does (Kafka's
# connection.failed.authentication.delay.ms, 100 ms by default).
REFUSAL_LINGER_S: Final = FAILED_AUTHENTICATION_DELAY


class UpstreamLoginMode(TerminateMode):
    """The upstream-login steps of a session (see the module's docstring). The session sets these
    attributes up; after that, the methods below are the only ones that change ``_upstream_out`` and
    ``_login_wake_asked``, and the only ones that change ``_hold`` but terminate mode's first attach
    (:meth:`TerminateMode._attach`: the client held until kproxy's own login ends)."""

    login: UpstreamLogin | None
    # Client chunks held during a login, with when each was read (None: none held, the client is read).
    _hold: list[tuple[bytes | bytearray, float | None]] | None
    _upstream_out: list[bytes]  # frames for the broker from receive_upstream / on_timer (the login's)
    _login_wake_asked: float | None  # the last wake-up asked for the login (its deadline or next re-authentication)
    _edited: bool

    def _client_frame(self, frame: bytes, read_at: float | None) -> bytes | None:
        raise NotImplementedError  # the session's

    def _login_hold(self, chunk: bytes | bytearray, read_at: float | None) -> list[Command]:
        """A client chunk read while ``_hold`` is set: held; the connection's first one begins the
        first login (its first request, and a wake-up at its deadline)."""
        assert self._hold is not None
        self._hold.append((chunk, read_at))
        login = self.login
        if login is None or login.logins:
            return []
        out = login.begin(self._ids.refuses)
        assert login.deadline is not None
        return [ForwardUpstream(out), WakeAt(login.deadline)]

    def _login_answer(self, correlation_id: int, frame: bytes) -> None:
        """The broker answered one of the login's requests: its next request goes up, or it ended."""
        assert self.login is not None
        out, result = self.login.answer(correlation_id, frame, self._ids.refuses)
        if out:
            self._upstream_out.append(out)
        if result is not None:
            self._login_ended(result)

    def _login_timer(self, login: UpstreamLogin, now: float) -> bool:
        """The session's timer, for the login: True when the login ran out of time (ended: the
        connection closes, ``_closing``); a re-authentication that is due begins (the client is held)."""
        if login.deadline is not None and now >= login.deadline:
            self._login_ended(login.timed_out())
            return True
        if self._hold is None and login.due(now):
            self._hold = []  # a re-authentication: the client's requests wait until it ends
            self._upstream_out.append(login.begin(self._ids.refuses))
        return False

    def _login_ended(self, result: LoginResult) -> None:
        """Success: the held client chunks are taken (their requests go up). Refusal: the client is
        read no more (a hold that stays), a first login's answers the client's first request where
        its response can say so (:func:`refusal_answer`), and the connection closes."""
        login = self.login
        assert login is not None
        held, self._hold = self._hold or [], None
        try:
            if result.result != SUCCESS:
                self._hold = held or [(b"", None)]
                first = self._client_frames.split(held[0][0])[0] if held and login.logins == 1 else []
                answer = refusal_answer(first[0], result.error_code, result.message) if first else None
                if answer is not None:
                    self._release.ready.append(answer)
                self._closing = CloseConnection(result.reason, CloseKind.END, linger=REFUSAL_LINGER_S)
                return
            self._upstream_out += self._pipelined()  # requests read behind a terminate-mode login (terminate.py)
            for chunk, read_at in held:
                frames, _, _ = self._client_frames.split(chunk)
                self._upstream_out.extend(f for raw in frames if (f := self._client_frame(raw, read_at)) is not None)
        except ProtocolError as exc:
            self._closing = CloseConnection.for_error(exc, RejectReason.REQUEST_OVERSIZE, RejectReason.REQUEST_SESSION,
                                                     "bad request from client")
        self._edited = False

    def _login_commands(self, commands: list[Command], again: bool = False) -> None:
        """The frames the login (and the requests it held) send next; a wake-up at its deadline or next
        re-authentication when that changed, or ``again`` (on_timer: the server forgot the last)."""
        if self._upstream_out:
            out, self._upstream_out = self._upstream_out, []
            commands.append(ForwardUpstream(out[0]) if len(out) == 1 else forward_frames(out))
        login = self.login
        assert login is not None
        when = login.deadline if login.deadline is not None else login.reauth_at
        if when is not None and (again or when != self._login_wake_asked):
            self._release.want_wake(when)
        self._login_wake_asked = when
