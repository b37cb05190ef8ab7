"""Terminate mode's client login: what a session does with the answers of kproxy's own SASL server
(:class:`~kproxy.sasl.authenticator.ClientAuth`), as a unit the session owns and calls.

:class:`ClientLogin` is one connection's, made only in terminate mode (``auth``). It keeps the
state of the client's login that is not the SASL exchange's own: the verification a PLAIN
password's slow hash needs (:meth:`ClientLogin.take_verification`, run off the event loop by the
server, its result back through :meth:`ClientLogin.verified`), whether the connection has an upstream
side yet, and the requests read behind the login's last message. Until the client logged in its
frames are bounded by :data:`~kproxy.sasl.authenticator.MAX_RECEIVE_SIZE` (the session's splitter
is given that bound, and its own back after the login) and the whole login is held to the
deadline of one frame (the session's ``partial_request_at`` is 0). A refusal's answer is followed
by the close :data:`~kproxy.sasl.authenticator.FAILED_AUTHENTICATION_DELAY` later, as a broker's.

Nothing reaches the cluster for a client before its login succeeded: the session starts with no
upstream connection (:attr:`ClientLogin.detached`), answers the client's ApiVersions from the
cluster's own answers to kproxy (:data:`~kproxy.sasl.authenticator.ApiVersionsSource`), and asks for
the connection after the answer that tells the client it logged in (:attr:`ClientLogin.attach_due`).
So a client that fails its login, or never tries, costs the cluster no connection and no login: an
unauthenticated flood is not amplified. Requests the client sent behind its login's last message
wait for the connection (:meth:`ClientLogin.pipelined`), and with kproxy's own login
(``sasl.upstream``) for that login's end, as every request of a connection kproxy logs in on does
(kproxy/sasl/login_gate.py).

The session shows it every request only while :attr:`ClientLogin.gating` (before the login, or
with a session lifetime); in relay mode there is none, and the session checks one attribute per
frame.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from kproxy.protocol.api_keys import SASL_AUTHENTICATE, SASL_HANDSHAKE
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.framing import FrameSplitter
from kproxy.sasl.authenticator import MAX_RECEIVE_SIZE, AuthAnswer, ClientAuth
from kproxy.sasl.requests import SaslRequest

R = TypeVar("R", bound=SaslRequest)  # the session's kind of request (its Exchange)
_SASL_APIS = frozenset((SASL_HANDSHAKE, SASL_AUTHENTICATE))


class TerminateError(ProtocolError):
    """A raw token the session cannot take: the connection closes (a request the session refuses)."""


class ClientLogin(Generic[R]):
    """The client's login to kproxy on one connection (see the module's docstring).

    ``frames`` is the session's splitter of client frames: bounded by the login's receive size
    until the client logged in, then given ``max_frame_size`` back."""

    def __init__(self, auth: ClientAuth, frames: FrameSplitter, max_frame_size: int) -> None:
        self.auth = auth
        self._frames = frames
        self._max_frame_size = max_frame_size
        if auth.gating:
            frames.max_frame_size = min(max_frame_size, MAX_RECEIVE_SIZE)  # until logged in
        self._verification: AuthAnswer | None = None  # a verification to hand the server after this chunk
        self._verifying: R | None = None  # the SaslAuthenticate it answers (None: a raw token)
        self.detached = True  # no upstream connection asked for yet (before the first login)
        self._attach_due = False  # the first login just succeeded: ask for the connection at the end of this list
        self._after_login = b""  # requests read behind the login's last message, for the broker once it is ready

    @property
    def gating(self) -> bool:
        """Whether every request must be shown to :meth:`gate` (not logged in yet, or a login that ends)."""
        return self.auth.gating

    @property
    def logging_in(self) -> bool:
        """Before the client's first login succeeded."""
        return self.auth.principal is None

    @property
    def pending(self) -> bool:
        """Whether the command list being made is to end with the upstream connection
        (:attr:`attach_due`) or a verification (:meth:`take_verification`)."""
        return self._verification is not None or self._attach_due

    @property
    def attach_due(self) -> bool:
        """The first login just succeeded: the upstream connection is to be asked for once the
        answer that says so is on its way (then :meth:`attached`)."""
        return self._attach_due

    def gate(self, ex: R, now: float) -> AuthAnswer | None:
        """A request read while :attr:`gating`: kproxy's answer to a SASL request, or a refusal of
        another request before the login (None: it goes on as any request does)."""
        auth = self.auth
        if ex.api_key in _SASL_APIS:
            return auth.request(ex, now)
        return auth.admits(ex, now)

    def token(self, frame: bytes, now: float, answers_due: bool) -> AuthAnswer:
        """A raw SASL token after SaslHandshake v0 (``frame`` with its size prefix). ``answers_due``:
        earlier requests are still unanswered, which a raw token cannot wait behind."""
        if answers_due:
            # A raw answer has no correlation id to wait its turn with: a client sends its token once
            # the SaslHandshake is answered (every client does; a broker reads one message at a time).
            raise TerminateError("SASL token sent before the answers to earlier requests", offset=0)
        return self.auth.token(frame[4:], now)

    def answered(self, answer: AuthAnswer, ex: R | None) -> bool:
        """Take in what kproxy's SASL server said about ``ex`` (None: a raw token). False when it
        asked for a verification first (:meth:`take_verification`; the answer comes from
        :meth:`verified`); True when the answer is to be sent now, and the close it asks for done
        (after :data:`~kproxy.sasl.authenticator.FAILED_AUTHENTICATION_DELAY` when there is an answer)."""
        if answer.verify is not None:
            self._verification = answer
            self._verifying = ex
            return False
        if self.auth.principal is not None:
            if self.detached:
                self._attach_due = True  # the upstream connection is asked for once the answer is on its way
            if self._frames.max_frame_size != self._max_frame_size:
                self._frames.max_frame_size = self._max_frame_size
        return True

    def take_verification(self) -> AuthAnswer | None:
        """The answer asking for a verification (its ``verify`` and ``verify_key``) to hand the
        server, taken; None: none asked for."""
        verification, self._verification = self._verification, None
        return verification

    def verified(self, ok: bool | None, now: float) -> tuple[AuthAnswer, R | None]:
        """The result of the verification taken (None: the server did not run it): the answer that
        stands for the one it held, and the request it answers (None: a raw token)."""
        ex, self._verifying = self._verifying, None
        return self.auth.verified(ok, now), ex

    def attached(self, pipelined: bytes) -> None:
        """The upstream connection is asked for; ``pipelined``: what the client sent behind its
        login's last message (b"": nothing), for :meth:`pipelined` once the connection is open."""
        self._attach_due = False
        self.detached = False
        self._after_login = pipelined

    def pipelined(self) -> list[bytes]:
        """The requests read behind the client's login, taken (sent once the broker may have them)."""
        after, self._after_login = self._after_login, b""
        return [after] if after else []

    def cluster_api_versions(self, ex: R) -> bytes | None:
        """The cluster's own answer to the client's ApiVersions ``ex`` at its version (before the
        upstream connection is open: kproxy/server/discovery.py); None when none is known."""
        source = self.auth.api_versions
        return source(ex.correlation_id, ex.api_version) if source is not None else None
