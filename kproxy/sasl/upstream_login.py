"""kproxy's own SASL login on one upstream connection (sans-IO: Kafka frames out, answers in).

For a client that does not do SASL itself (``sasl.upstream``, docs/SASL.md), kproxy logs in to the
broker on every upstream connection it opens, before any of the client's requests goes up:

1. ApiVersions v0 and SaslHandshake v1, pipelined (one round trip): the first says which
   SaslAuthenticate versions the broker reads (v2 at most, the highest kproxy reads), the second
   names the mechanism. Kafka's own clients send ApiVersions first too; a broker answers in order.
2. SaslAuthenticate (v1+ where the broker has it: KIP-152, KIP-368) with each client message of
   the mechanism (:mod:`kproxy.sasl.client`), until the mechanism is done or the broker refuses.
3. On success, when the broker gave the session a lifetime (``session_lifetime_ms``, KIP-368),
   a re-authentication is due at 85-95 % of it (what Kafka's Java client does), and never within a
   second of the last login's start (a broker refuses to begin one sooner: KafkaChannel). A
   re-authentication is SaslHandshake v1 and the SaslAuthenticate rounds again, on the same
   connection: :meth:`UpstreamLogin.begin` with the credentials as they are then (a rotated
   secret is used from the next login on).

Every request carries kproxy's own correlation id (negative, and never one the session's client
may still be answered under: ``refuses``) and client id ``kproxy``; the answers are consumed here
and never reach the client. :class:`~kproxy.proxy.session.Session` holds the client's requests
while a login is in progress and forwards them after it, in order; kproxy/server/upstream_auth.py
drives the same machine over a bare stream (broker discovery).

Each login ends in one :class:`LoginResult`, handed to ``report`` (metrics, log lines) and
returned: ``success``; ``failure`` when the broker refused (its error code and message);
``error`` when an answer could not be accepted (unreadable, a SCRAM signature that does not
verify: the broker does not hold the credential) or did not come in time. Nothing of the secret
is in a result.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from kproxy.protocol.api_keys import API_VERSIONS, SASL_AUTHENTICATE, SASL_HANDSHAKE
from kproxy.protocol.codes import ErrorCode, error_name
from kproxy.protocol.error_response import api_versions_answer, error_response
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.message_schemas import MessageType
from kproxy.protocol.messages import Body, require_codec
from kproxy.protocol.payloads import decode_response
from kproxy.sasl.client import Credentials, MechanismClient, SaslClientError, ScramKeys, client_for
from kproxy.sasl.scram import ScramError

SASL_AUTHENTICATION_FAILED = int(ErrorCode.SASL_AUTHENTICATION_FAILED)
UNSUPPORTED_SASL_MECHANISM = int(ErrorCode.UNSUPPORTED_SASL_MECHANISM)
ILLEGAL_SASL_STATE = int(ErrorCode.ILLEGAL_SASL_STATE)
SASL_AUTHENTICATE_MAX = 2  # the highest version kproxy's tables read
CLIENT_ID = "kproxy"
REAUTH_SHARE = (0.85, 0.95)  # of the session's lifetime, as Kafka's client (SaslClientAuthenticator)
MIN_REAUTH_INTERVAL_S = 1.0  # KafkaChannel.MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS
MESSAGE_MAX = 300  # characters kept of a broker's error message (for a log line)

SUCCESS, FAILURE, ERROR = "success", "failure", "error"


@dataclass(frozen=True, slots=True)
class LoginResult:
    """How one login ended. ``error_code``: the broker's for a failure, SASL_AUTHENTICATION_FAILED
    for an error, 0 for a success; ``message``: what to log (the broker's words, or kproxy's)."""

    mechanism: str
    reauthentication: bool
    result: str
    error_code: int = 0
    message: str = ""
    session_lifetime_ms: int = 0

    @property
    def reason(self) -> str:
        """One line for a log: what failed and why (empty for a success)."""
        if self.result == SUCCESS:
            return ""
        what = "re-authentication" if self.reauthentication else "authentication"
        return f"upstream SASL {what} ({self.mechanism}) {self.result}: {error_name(self.error_code)}: {self.message}"


Report = Callable[[LoginResult], None]


class UpstreamLogin:
    """The logins of one upstream connection, one at a time (see the module's docstring).

    ``credentials`` is read at each login's start; ``timeout`` bounds each login (seconds on
    ``clock``, the session's). Between logins: :attr:`reauth_at` (None: none due). During one:
    :attr:`deadline` and :meth:`awaits` (a correlation id is one of its requests').
    """

    def __init__(self, credentials: Callable[[], Credentials], *, timeout: float = 10.0,
                 clock: Callable[[], float] = time.perf_counter, report: Report | None = None,
                 keys: ScramKeys | None = None, rng: random.Random | None = None,
                 on_client_sasl: Callable[[], None] | None = None) -> None:
        self.credentials = credentials
        self.on_client_sasl = on_client_sasl  # called at the client's first SASL request (refused)
        self.client_sasl_refused = 0
        self.timeout = timeout
        self.clock = clock
        self.report = report
        self.keys = keys
        self.rng = rng or random.Random()
        self.mechanism = ""
        self.reauth_at: float | None = None
        self.deadline: float | None = None
        self.logins = 0  # logins begun on this connection
        self._pending: dict[int, int] = {}  # correlation id -> api key, of requests not answered yet
        self._abandoned: set[int] = set()  # requests of a login that ended before their answers came
        self._client: MechanismClient | None = None
        self._auth_version = 1
        self._started = 0.0
        self._next_id = -1

    @property
    def in_progress(self) -> bool:
        return self.deadline is not None

    def due(self, now: float) -> bool:
        """Whether a re-authentication should begin now."""
        return self.deadline is None and self.reauth_at is not None and now >= self.reauth_at

    def awaits(self, correlation_id: int) -> bool:
        return correlation_id in self._pending or correlation_id in self._abandoned

    def begin(self, refuses: Callable[[int], bool]) -> bytes:
        """The frames that begin a login (ApiVersions and SaslHandshake for the first, SaslHandshake
        alone for a re-authentication), as one write."""
        credentials = self.credentials()
        self.mechanism = credentials.mechanism
        self._client = client_for(credentials, self.keys)
        self._started = self.clock()
        self.deadline = self._started + self.timeout
        self.reauth_at = None
        self._pending.clear()
        first = self.logins == 0
        self.logins += 1
        out = self._request(API_VERSIONS, 0, {}, refuses) if first else b""
        return out + self._request(SASL_HANDSHAKE, 1, {"mechanism": self.mechanism}, refuses)

    def answer(self, correlation_id: int, frame: bytes, refuses: Callable[[int], bool]
               ) -> tuple[bytes, LoginResult | None]:
        """Take the broker's answer (whole frame) to one of this login's requests: the frames to send
        next (b"" for none) and the result once the login ended. The answer to a request of a login
        that ended already (refused at ApiVersions, the SaslHandshake sent with it) is dropped."""
        if correlation_id in self._abandoned:
            self._abandoned.discard(correlation_id)
            return b"", None
        api_key = self._pending.pop(correlation_id)
        version = {API_VERSIONS: 0, SASL_HANDSHAKE: 1}.get(api_key, self._auth_version)
        try:
            body = decode_response(frame[4:], api_key, version).body
            if api_key == API_VERSIONS:
                return b"", self._versions(body)
            if api_key == SASL_HANDSHAKE:
                return self._handshake(body, refuses)
            return self._authenticated(body, refuses)
        except ProtocolError as exc:
            return b"", self._end(ERROR, SASL_AUTHENTICATION_FAILED, f"unreadable answer: {exc}")
        except (SaslClientError, ScramError) as exc:
            return b"", self._end(ERROR, SASL_AUTHENTICATION_FAILED, str(exc))

    def refuse_client_sasl(self, request: bytes) -> bytes | None:
        """The answer to the client's own SaslHandshake or SaslAuthenticate (whole frame): kproxy
        logged in itself, so there is nothing to relay. What a Kafka broker answers on a connection
        that needs no login (KafkaApis on a PLAINTEXT listener, or after authentication):
        ILLEGAL_SASL_STATE. None for a version kproxy cannot answer."""
        self.client_sasl_refused += 1
        if self.client_sasl_refused == 1 and self.on_client_sasl is not None:
            self.on_client_sasl()
        api_key, version = int.from_bytes(request[4:6], "big"), int.from_bytes(request[6:8], "big")
        correlation_id = int.from_bytes(request[8:12], "big", signed=True)
        values: dict[str, object] = {"error_code": ILLEGAL_SASL_STATE}
        if api_key == SASL_AUTHENTICATE:
            values["error_message"] = ("kproxy logs in to the cluster itself (sasl.upstream): connect to it "
                                       "without SASL")
        try:
            return response_frame(api_key, version, correlation_id, None, **values)
        except ProtocolError:
            return None

    def timed_out(self) -> LoginResult:
        """The login in progress did not end within ``timeout``."""
        return self._end(ERROR, SASL_AUTHENTICATION_FAILED, f"no answer within {self.timeout:g} s")

    def _versions(self, body: Body) -> LoginResult | None:
        code = int(body.get("error_code") or 0)
        if code:
            return self._end(ERROR, code, f"ApiVersions answered {error_name(code)}")
        versions = {k["api_key"]: k["max_version"] for k in body.get("api_keys") or []}
        if SASL_AUTHENTICATE not in versions or versions.get(SASL_HANDSHAKE, 0) < 1:
            return self._end(ERROR, ILLEGAL_SASL_STATE, "the broker has no SaslHandshake v1 and SaslAuthenticate "
                                                        "(Kafka before 1.0, or not a Kafka broker)")
        self._auth_version = min(int(versions[SASL_AUTHENTICATE]), SASL_AUTHENTICATE_MAX)
        return None

    def _handshake(self, body: Body, refuses: Callable[[int], bool]) -> tuple[bytes, LoginResult | None]:
        code = int(body.get("error_code") or 0)
        if code == UNSUPPORTED_SASL_MECHANISM:
            offered = ", ".join(str(m) for m in body.get("mechanisms") or []) or "none"
            return b"", self._end(FAILURE, code, f"the broker does not offer {self.mechanism} (it offers: {offered})")
        if code == ILLEGAL_SASL_STATE:
            return b"", self._end(FAILURE, code, "the broker refused the handshake (ILLEGAL_SASL_STATE: is its "
                                                 "listener a SASL one?)")
        if code:
            return b"", self._end(FAILURE, code, f"SaslHandshake answered {error_name(code)}")
        assert self._client is not None
        return self._authenticate(self._client.first(), refuses), None

    def _authenticated(self, body: Body, refuses: Callable[[int], bool]
                       ) -> tuple[bytes, LoginResult | None]:
        assert self._client is not None
        code = int(body.get("error_code") or 0)
        if code:
            message = body.get("error_message") or self._client.error or error_name(code)
            return b"", self._end(FAILURE, code, str(message)[:MESSAGE_MAX])
        auth_bytes = body.get("auth_bytes")
        following = self._client.respond(bytes(auth_bytes) if isinstance(auth_bytes, bytes | bytearray) else b"")
        if following is not None:
            return self._authenticate(following, refuses), None
        lifetime_ms = max(0, int(body.get("session_lifetime_ms") or 0))
        return b"", self._end(SUCCESS, 0, "", lifetime_ms)

    def _authenticate(self, message: bytes, refuses: Callable[[int], bool]) -> bytes:
        return self._request(SASL_AUTHENTICATE, self._auth_version, {"auth_bytes": message}, refuses)

    def _request(self, api_key: int, version: int, body: dict[str, object], refuses: Callable[[int], bool]) -> bytes:
        correlation_id = self._next_id
        while refuses(correlation_id) or correlation_id in self._pending:
            correlation_id -= 1
        self._next_id = correlation_id - 1 if correlation_id > -(2**31) + 1 else -1
        self._pending[correlation_id] = api_key
        return request_frame(api_key, version, correlation_id, None, CLIENT_ID, **body)

    def _end(self, result: str, code: int, message: str, lifetime_ms: int = 0) -> LoginResult:
        now = self.clock()
        done = LoginResult(self.mechanism, self.logins > 1, result, code, message, lifetime_ms)
        self.deadline = None
        self._abandoned.update(self._pending)
        self._pending.clear()
        self._client = None
        if result == SUCCESS and lifetime_ms > 0:
            share = self.rng.uniform(*REAUTH_SHARE)
            self.reauth_at = max(now + lifetime_ms / 1000 * share, self._started + MIN_REAUTH_INTERVAL_S)
        if self.report is not None:
            self.report(done)
        return done


def refusal_answer(request: bytes, error_code: int, message: str) -> bytes | None:
    """The answer a client's request gets when kproxy could not log in for it: the request's
    response with ``error_code`` (and ``message`` in its error_message fields), when that response
    has an error code of its own at the top; None otherwise (an answer with no error at the top
    would read as a success: the client gets the connection closed instead).

    ApiVersions, which clients send first, is answered with a v0 body whatever its version, as a
    broker answers it at an error (KIP-511): kafka-python reads an ApiVersions answer carrying an
    error as v0, Kafka's Java client falls back to v0, librdkafka reads the error code alone.
    """
    try:
        api_key, api_version = int.from_bytes(request[4:6], "big", signed=True), int.from_bytes(request[6:8], "big")
        if api_key == API_VERSIONS:
            return api_versions_answer(int.from_bytes(request[8:12], "big", signed=True), error_code)
        fields = require_codec(api_key, api_version, MessageType.RESPONSE).schema.fields
        if not any(f.name == "error_code" for f in fields):
            return None
        return error_response(request, error_code, message=message)
    except (ProtocolError, ValueError):
        return None
