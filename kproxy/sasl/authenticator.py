"""Terminate mode: kproxy authenticates a client itself, answering its SASL requests as a broker does.

:class:`ClientAuth` is one connection's SASL server, Kafka side (sans-IO): it takes the client's
SaslHandshake and SaslAuthenticate requests, or the raw tokens that follow a SaslHandshake v0
(KIP-43), and says what to answer (response frames built here), whether to close, and who the
client is once it logged in. The mechanisms themselves (PLAIN, SCRAM) are
:mod:`kproxy.sasl.server`'s; the session (kproxy/proxy/session.py) puts the answers in order.

What it does is what Kafka's SaslServerAuthenticator does (clients/.../authenticator/), state by
state:

* before a SaslHandshake is accepted only ApiVersions may come; any other request closes the
  connection without an answer (``Unexpected Kafka request of type METADATA during SASL
  handshake``). Kafka's authenticator answers that ApiVersions itself, from the broker's versions;
  kproxy answers it from the cluster's own answers to kproxy (:data:`ApiVersionsSource`), since it
  opens no upstream connection before the client logged in (kproxy/sasl/client_login.py);
* a SaslHandshake naming a mechanism not offered is answered UNSUPPORTED_SASL_MECHANISM with the
  list offered, then the connection closes; an offered one is answered NONE with the list;
* after SaslHandshake v0 the client's frames are raw tokens, answered with raw tokens; after v1
  they must be SaslAuthenticate requests (v0-v2): any other request is answered ILLEGAL_SASL_STATE
  and the connection closes;
* a refused login is answered SASL_AUTHENTICATION_FAILED with the broker's message (after v0:
  no answer, a broker has none to give) and the connection closes; a close that follows an
  answer comes :data:`FAILED_AUTHENTICATION_DELAY` later, as a broker's does (KIP-306);
* once logged in, the principal is ``User:<name>`` (Kafka's default principal builder), and the
  client's requests go to the broker. With a session lifetime (``sasl.client.session_lifetime``,
  KIP-368: ``connections.max.reauth.ms``), SaslAuthenticate v1+ answers carry
  ``session_lifetime_ms``; the client re-authenticates before it ends (SaslHandshake v1 and
  SaslAuthenticate again, same mechanism and same principal, or the connection closes), and a
  request after the end closes the connection. Without one, SASL requests after the login are
  answered ILLEGAL_SASL_STATE, as a broker's request handler answers them.

Bounds: until the login is done the session reads client frames of at most
:data:`MAX_RECEIVE_SIZE` (Kafka's ``sasl.server.max.receive.size``, 512 KiB), the mechanism
name a client sends is never echoed longer than :data:`MECHANISM_MAX` characters, and a PLAIN
password's slow hash runs off the event loop (:attr:`AuthAnswer.verify`).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass

from kproxy.protocol.api_keys import API_VERSIONS, SASL_AUTHENTICATE, SASL_HANDSHAKE
from kproxy.protocol.codes import ApiKey, ErrorCode, api_name
from kproxy.protocol.error_response import error_response
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.payloads import encode_response
from kproxy.sasl.requests import SaslRequest
from kproxy.sasl.server import CredentialChecker, MechanismServer, Step, invalid_credentials

NONE = 0
UNSUPPORTED_SASL_MECHANISM = int(ErrorCode.UNSUPPORTED_SASL_MECHANISM)
ILLEGAL_SASL_STATE = int(ErrorCode.ILLEGAL_SASL_STATE)
SASL_AUTHENTICATION_FAILED = int(ErrorCode.SASL_AUTHENTICATION_FAILED)
# The versions kproxy answers (the spec's: SaslHandshake 0-1, SaslAuthenticate 0-2), which the
# ApiVersions answers clients get say instead of the broker's (kproxy/proxy/address_rewrite.py).
ANSWERED_VERSIONS = {SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2)}
MAX_RECEIVE_SIZE = 512 * 1024  # Kafka's sasl.server.max.receive.size default
# A refusal's answer is followed by the close this much later (Kafka's connection.failed.authentication.delay.ms
# default, KIP-306): a client reading the answer and the end of the stream together may take the end
# first and lose the answer (kafka-python does, one login in two), and a guesser is slowed down.
FAILED_AUTHENTICATION_DELAY = 0.1
MECHANISM_MAX = 64  # characters of a client's mechanism name kept for a log line
UNSUPPORTED = "unsupported"  # the mechanism label of a login asking for a mechanism not offered
_SIZE = struct.Struct(">i")
# The cluster's answer to an ApiVersions request, as a broker gave it to kproxy: (correlation id, request
# version) -> the response frame (size prefix included) carrying that id; None when none is known.
ApiVersionsSource = Callable[[int, int], bytes | None]


class AuthState(enum.Enum):
    HANDSHAKE = "handshake"  # no mechanism accepted yet: ApiVersions or SaslHandshake
    AUTHENTICATE = "authenticate"  # a mechanism accepted: its messages (SaslAuthenticate, or raw tokens after v0)
    COMPLETE = "complete"  # logged in (a re-authentication may be under way)
    FAILED = "failed"  # refused: the connection is closing


@dataclass(frozen=True, slots=True)
class Outcome:
    """A login that ended, for the server's log line and counter. ``mechanism`` is one offered or
    :data:`UNSUPPORTED`; ``user`` who the client said it was (None: it said nothing readable);
    ``reason``: kproxy's words for a refusal (never the client's secret, never sent to it)."""

    mechanism: str
    success: bool
    user: str | None
    reason: str | None
    reauthentication: bool


@dataclass(frozen=True, slots=True)
class AuthAnswer:
    """What to do about one client message.

    ``frame``: the answer to send (size prefix included), in its turn; None: no answer.
    ``close``: the connection ends after that answer, for this reason (``reject``: the client
    broke the protocol, rather than failed to log in). ``verify``: run this off the event loop
    and hand its result to :meth:`ClientAuth.verified`, whose answer then stands for this one;
    ``verify_key`` names that work (:class:`~kproxy.proxy.commands.VerifyCredentials`).
    """

    frame: bytes | None = None
    close: str | None = None
    reject: bool = False
    verify: Callable[[], bool] | None = None
    verify_key: bytes = b""


class ClientAuth:
    """The SASL server side of one client connection (see the module's docstring).

    ``session_lifetime``: seconds a login lasts before the client must re-authenticate (0: for
    the connection's life). ``on_outcome`` is told of every login that ends. ``api_versions``: the
    cluster's ApiVersions answers, for the client's ApiVersions before its login (None: none known,
    the connection closes at that request).
    """

    __slots__ = ("_checker", "_on_outcome", "_pending", "_reauth", "_server", "_verifying", "api_versions",
                 "expires_at", "mechanism", "principal", "raw", "session_lifetime", "state")

    def __init__(self, checker: CredentialChecker, *, session_lifetime: float = 0.0,
                 on_outcome: Callable[[Outcome], None] | None = None,
                 api_versions: ApiVersionsSource | None = None) -> None:
        self._checker = checker
        self.session_lifetime = session_lifetime
        self._on_outcome = on_outcome
        self.api_versions = api_versions
        self.state = AuthState.HANDSHAKE
        self.raw = False  # after SaslHandshake v0: the client's frames are raw tokens
        self.mechanism: str | None = None
        self.principal: str | None = None
        self.expires_at: float | None = None  # when the login ends (session clock); None: never
        self._server: MechanismServer | None = None  # the login (or re-authentication) in progress
        self._reauth = False
        self._verifying = False  # a step's verify runs: nothing more until verified()
        self._pending: SaslRequest | None = None  # the SaslAuthenticate it answers (None: a raw token)

    @property
    def gating(self) -> bool:
        """Whether every request must be shown to :meth:`admits` (not logged in yet, or a login
        that ends): False once logged in for the connection's life."""
        return self.state is not AuthState.COMPLETE or self.expires_at is not None

    # -- requests that are not SASL's ------------------------------------------------------------
    def admits(self, ex: SaslRequest, now: float) -> AuthAnswer | None:
        """A request other than SaslHandshake / SaslAuthenticate: None when it goes on as usual,
        else what to do (close, after an answer or not)."""
        state = self.state
        if self._verifying:  # pipelined behind a login being verified: no client does that
            self.state = AuthState.FAILED
            return AuthAnswer(close=f"{_name(ex)} request while a SASL login is being verified", reject=True)
        if state is AuthState.COMPLETE:
            if self.expires_at is not None and now >= self.expires_at:
                return AuthAnswer(close="SASL session expired: the client did not re-authenticate within "
                                        "sasl.client.session_lifetime", reject=True)
            return None
        if state is AuthState.HANDSHAKE:
            if ex.api_key == API_VERSIONS:
                return None
            self.state = AuthState.FAILED
            return AuthAnswer(close=f"Unexpected Kafka request of type {_name(ex)} during SASL handshake",
                              reject=True)
        if state is AuthState.AUTHENTICATE:
            self.state = AuthState.FAILED
            reason = f"Unexpected Kafka request of type {_name(ex)} during SASL authentication"
            return AuthAnswer(frame=_error_answer(ex, ILLEGAL_SASL_STATE, reason), close=reason, reject=True)
        return AuthAnswer(close="SASL authentication failed")

    # -- SASL requests -----------------------------------------------------------------------------
    def request(self, ex: SaslRequest, now: float) -> AuthAnswer:
        """A SaslHandshake or SaslAuthenticate request (tracked in order by the session)."""
        if self.state is AuthState.FAILED:
            return AuthAnswer(close="SASL authentication failed")
        if self._verifying:
            self.state = AuthState.FAILED
            return AuthAnswer(close=f"{_name(ex)} request while a SASL login is being verified", reject=True)
        if ex.api_key == SASL_HANDSHAKE:
            return self._handshake(ex)
        return self._authenticate(ex, now)

    def token(self, token: bytes, now: float) -> AuthAnswer:
        """A raw token (after SaslHandshake v0; the frame without its size prefix)."""
        if self.state is AuthState.FAILED:
            return AuthAnswer(close="SASL authentication failed")
        if self._verifying:
            self.state = AuthState.FAILED
            return AuthAnswer(close="SASL token while a SASL login is being verified", reject=True)
        assert self._server is not None
        return self._step(self._server.respond(token), None, now)

    def verified(self, ok: bool | None, now: float) -> AuthAnswer:
        """The result of the last answer's ``verify`` (None: not run, the server had too many under
        way for the client's address): the answer that stands for it."""
        assert self._server is not None
        ex, self._pending = self._pending, None
        self._verifying = False
        if self.state is AuthState.FAILED:  # the connection is closing (a request came meanwhile)
            return AuthAnswer()
        return self._step(self._server.verified(ok), ex, now)

    def _handshake(self, ex: SaslRequest) -> AuthAnswer:
        state = self.state
        if state is AuthState.AUTHENTICATE:
            self.state = AuthState.FAILED
            reason = f"Unexpected Kafka request of type {_name(ex)} during SASL authentication"
            return AuthAnswer(frame=_error_answer(ex, ILLEGAL_SASL_STATE, reason), close=reason, reject=True)
        reauth = state is AuthState.COMPLETE
        if reauth and (not self.session_lifetime or ex.api_version < 1 or self._server is not None):
            # No re-authentication offered (or a second one at once): what a broker's request handler answers.
            return AuthAnswer(frame=_handshake_answer(ex, ILLEGAL_SASL_STATE, ()))
        try:
            body = ex.request_body()
        except ProtocolError as exc:
            return AuthAnswer(close=f"unreadable SaslHandshake v{ex.api_version} request: {exc}", reject=True)
        mechanism = body.get("mechanism")
        offered = self._checker.mechanisms
        if not isinstance(mechanism, str) or mechanism not in offered:
            shown = mechanism[:MECHANISM_MAX] if isinstance(mechanism, str) else None
            self.state = AuthState.FAILED
            self._report(UNSUPPORTED, False, None, f"mechanism {shown!r} not offered ({', '.join(offered)})")
            return AuthAnswer(frame=_handshake_answer(ex, UNSUPPORTED_SASL_MECHANISM, offered),
                              close=f"unsupported SASL mechanism {shown!r}")
        self._reauth = reauth
        self._server = self._checker.server(mechanism)
        if reauth and mechanism != self.mechanism:
            self._server = _Refused(mechanism, f"SASL mechanism '{mechanism}' requested by client is not supported "
                                               f"for re-authentication of mechanism '{self.mechanism}'")
        else:
            self.mechanism = mechanism
        if not reauth:
            self.state = AuthState.AUTHENTICATE
            self.raw = ex.api_version == 0
        return AuthAnswer(frame=_handshake_answer(ex, NONE, offered))

    def _authenticate(self, ex: SaslRequest, now: float) -> AuthAnswer:
        state = self.state
        if state is AuthState.HANDSHAKE:
            self.state = AuthState.FAILED
            return AuthAnswer(close="Unexpected Kafka request of type SASL_AUTHENTICATE during SASL handshake",
                              reject=True)
        if state is AuthState.COMPLETE and self._server is None:
            return AuthAnswer(frame=_authenticate_answer(ex, ILLEGAL_SASL_STATE,
                                                         "SaslAuthenticate request received after successful "
                                                         "authentication"))
        server = self._server
        assert server is not None
        try:
            auth_bytes = ex.request_body().get("auth_bytes")
        except ProtocolError as exc:
            return AuthAnswer(close=f"unreadable SaslAuthenticate v{ex.api_version} request: {exc}", reject=True)
        step = server.respond(bytes(auth_bytes) if isinstance(auth_bytes, bytes | bytearray | memoryview) else b"")
        return self._step(step, ex, now)

    def _step(self, step: Step, ex: SaslRequest | None, now: float) -> AuthAnswer:
        """The answer to a mechanism's step, for a SaslAuthenticate ``ex`` (None: a raw token)."""
        if step.verify is not None:
            self._pending = ex
            self._verifying = True
            return AuthAnswer(verify=step.verify, verify_key=step.verify_key)
        server = self._server
        assert server is not None
        if not step.done:
            return AuthAnswer(frame=_authenticate_answer(ex, NONE, None, step.challenge) if ex is not None
                              else _raw(step.challenge))
        self._server = None
        reauth = self._reauth
        if step.user is not None:
            principal = "User:" + step.user
            if reauth and principal != self.principal:
                step = Step(error=f"Cannot change principals during re-authentication from {self.principal}: "
                                  f"{principal}", reason="another user on re-authentication")
            else:
                self.principal = principal
                self.state = AuthState.COMPLETE
                self.raw = False
                lifetime_ms = int(self.session_lifetime * 1000)
                self.expires_at = now + self.session_lifetime if lifetime_ms else None
                self._report(server.mechanism, True, step.user, None)
                if ex is None:
                    return AuthAnswer(frame=_raw(step.challenge))
                return AuthAnswer(frame=_authenticate_answer(ex, NONE, None, step.challenge, lifetime_ms))
        self.state = AuthState.FAILED
        self._report(server.mechanism, False, server.user, step.reason)
        error = step.error or invalid_credentials(server.mechanism, reauth)
        close = f"SASL authentication failed: {error}"
        if ex is None:
            return AuthAnswer(close=close)  # after SaslHandshake v0 a broker closes without a word
        return AuthAnswer(frame=_authenticate_answer(ex, SASL_AUTHENTICATION_FAILED, error), close=close)

    def _report(self, mechanism: str, success: bool, user: str | None, reason: str | None) -> None:
        if self._on_outcome is not None:
            self._on_outcome(Outcome(mechanism, success, user, reason, self._reauth))


class _Refused:
    """The server of a re-authentication that asked for another mechanism: refuses the first message."""

    def __init__(self, mechanism: str, error: str) -> None:
        self.mechanism = mechanism
        self.user: str | None = None
        self._error = error

    def respond(self, message: bytes) -> Step:
        return Step(error=self._error, reason="another mechanism on re-authentication")

    def verified(self, ok: bool | None) -> Step:
        raise AssertionError("no verification asked")


def _name(ex: SaslRequest) -> str:
    """The request's api as Kafka's ApiKeys enum names it (METADATA, SASL_HANDSHAKE, ...)."""
    try:
        return ApiKey(ex.api_key).name
    except ValueError:
        return api_name(ex.api_key)


def _framed(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload


def _raw(token: bytes) -> bytes:
    return _framed(token)


def _handshake_answer(ex: SaslRequest, error_code: int, mechanisms: tuple[str, ...]) -> bytes:
    return _framed(encode_response(ex.correlation_id, SASL_HANDSHAKE, ex.api_version,
                                   {"error_code": error_code, "mechanisms": list(mechanisms)}))


def _authenticate_answer(ex: SaslRequest, error_code: int, message: str | None, auth_bytes: bytes = b"",
                         lifetime_ms: int = 0) -> bytes:
    return _framed(encode_response(ex.correlation_id, SASL_AUTHENTICATE, ex.api_version,
                                   {"error_code": error_code, "error_message": message, "auth_bytes": auth_bytes,
                                    "session_lifetime_ms": lifetime_ms}))


def _error_answer(ex: SaslRequest, error_code: int, message: str) -> bytes | None:
    """Any request answered with ``error_code`` (None when kproxy cannot build that answer)."""
    try:
        return error_response(ex.request, error_code, message=message)
    except ProtocolError:
        return None
