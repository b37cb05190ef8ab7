"""A scripted authenticating Kafka front for the tests: SASL answered as a Kafka broker answers it, then
the real Tansu broker behind it.

Why a front: the embedded Tansu cannot be the authenticating broker. With ``broker --authentication``
it offers SCRAM-SHA-256/512 and OAUTHBEARER but not PLAIN, ``tansu user create`` against it fails,
and its memory storage keeps no SCRAM credentials, so every login is refused (checked directly with
librdkafka). So this front answers the SASL part of the protocol itself, as Apache Kafka's broker
does (SaslServerAuthenticator and SocketServer; KIP-43, KIP-152, KIP-255, KIP-368), and passes every
other request of an authenticated connection to a Tansu broker of its own, whose Metadata names the
front: clients reach that cluster through the front only.

What it does as a Kafka broker does:

* SaslHandshake v0 and v1 (v0: raw size-prefixed tokens follow, no Kafka header, and a refused
  login closes the connection with no answer); an unknown mechanism is answered
  UNSUPPORTED_SASL_MECHANISM with the enabled list, then the connection closes.
* SaslAuthenticate v0-v2: SASL_AUTHENTICATION_FAILED with Kafka's own messages (PLAIN's
  "Authentication failed: Invalid username or password"; SCRAM's "Authentication failed during
  authentication due to invalid credentials with SASL mechanism ..."; OAUTHBEARER's error JSON as a
  challenge, then, after the client's ``%x01``, that JSON as the message), then the connection
  closes. ``session_lifetime_ms`` in v1+ (KIP-368) when :attr:`SaslFront.session_lifetime_ms` is set
  (bounded by an OAUTHBEARER token's ``exp``, as Kafka bounds it by the credential's lifetime).
* Before authentication only ApiVersions (forwarded to Tansu: its answer lists the SASL apis) and
  SaslHandshake are accepted; any other request closes the connection ("Unexpected Kafka request of
  type ... during SASL handshake").
* After it: a SaslHandshake begins a re-authentication when the session has a lifetime and the last
  one began at least a second ago (KafkaChannel.maybeBeginServerReauthentication); it must keep the
  mechanism and the principal, and no other request may come until it ends. Otherwise a SASL
  request is answered ILLEGAL_SASL_STATE (KafkaApis). Any other request after the session expired
  closes the connection (SocketServer: "Disconnecting expired channel"), clients that cannot
  re-authenticate (SaslAuthenticate v0) included.
* One request at a time per connection, as a Kafka broker's muted channel: a request is forwarded
  to Tansu and its answer relayed before the next is read (an acks=0 Produce's answer, which Tansu
  sends, is dropped). So responses stay in request order and re-authentication waits its turn.
* Sizes: a frame before authentication is at most 512 KiB (Kafka's sasl max receive size), after
  it 100 MiB (socket.request.max.bytes); bigger ones close the connection.

SCRAM is scramp's (an implementation independent of kproxy's; pg8000 uses it); real clients verify
the server's proof, so a wrong front fails them. Credentials change at run time
(:attr:`SaslFront.credentials`), from any thread: new logins use them, established sessions keep
theirs. What happened is kept in :attr:`SaslFront.events` (thread-safe counters and a log).
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import scramp
import trio

from kproxy.protocol.headers import decode_request_header, request_body_offset
from kproxy.protocol.payloads import decode_request, encode_response
from kproxy.protocol.request_fields import produce_acks
from kproxy.testing.tansu import Broker, free_port, run_tansu

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SASL_MAX_RECEIVE = 524288  # SaslServerAuthenticator.MAX_RECEIVE_SIZE
MAX_FRAME = 100 * 1024 * 1024  # socket.request.max.bytes
MIN_REAUTH_INTERVAL_S = 1.0  # KafkaChannel.MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS
PRODUCE, API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 0, 18, 17, 36
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58
_SIZE = struct.Struct(">i")


class Refused(Exception):
    """A login refused: SASL_AUTHENTICATION_FAILED with this message."""


class Credentials:
    """The users (PLAIN and SCRAM) and the OAUTHBEARER token the front accepts; changed at run time
    from any thread (a lock), read at each login."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._passwords: dict[str, str] = {}
        self._scram: dict[tuple[str, str], tuple[bytes, bytes, bytes, int]] = {}
        self._oauth: tuple[str | None, str | None] = (None, None)

    def set_password(self, user: str, password: str) -> None:
        """Accept ``user`` with ``password`` (PLAIN) and its SCRAM credentials of both hashes (fresh salts)."""
        scram_info = {mech: scramp.ScramMechanism(mech).make_auth_info(password, iteration_count=4096)
                      for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512")}
        with self._lock:
            self._passwords[user] = password
            for mech, info in scram_info.items():
                self._scram[(mech, user)] = info

    def remove_user(self, user: str) -> None:
        with self._lock:
            self._passwords.pop(user, None)
            for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                self._scram.pop((mech, user), None)

    def set_oauth(self, *, subject: str | None = None, token: str | None = None) -> None:
        """Accept an unsecured JWS whose ``sub`` is ``subject`` (and not expired), or exactly ``token``."""
        with self._lock:
            self._oauth = (subject, token)

    def password(self, user: str) -> str | None:
        with self._lock:
            return self._passwords.get(user)

    def scram(self, mechanism: str, user: str) -> tuple[bytes, bytes, bytes, int]:
        with self._lock:
            found = self._scram.get((mechanism, user))
        if found is None:
            raise scramp.ScramException("unknown user")
        return found

    def oauth(self) -> tuple[str | None, str | None]:
        with self._lock:
            return self._oauth


@dataclass
class Events:
    """What the front saw, counted (thread-safe): ``accepted`` connections; ``logins[(mechanism, result)]``
    with result ``ok``, ``refused``, ``reauth_ok``, ``reauth_refused``; ``closes[reason]``; ``log`` in order."""

    accepted: int = 0
    logins: Counter[tuple[str, str]] = field(default_factory=Counter)
    closes: Counter[str] = field(default_factory=Counter)
    principals: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def login(self, mechanism: str, result: str, principal: str | None = None) -> None:
        with self.lock:
            self.logins[(mechanism, result)] += 1
            if principal is not None:
                self.principals.append(principal)
            self.log.append(f"login {mechanism} {result} {principal or ''}".strip())

    def accept(self) -> None:
        with self.lock:
            self.accepted += 1

    def close(self, reason: str) -> None:
        with self.lock:
            self.closes[reason] += 1
            self.log.append(f"close {reason}")

    def count(self, result: str, mechanism: str | None = None) -> int:
        with self.lock:
            return sum(n for (mech, res), n in self.logins.items()
                       if res == result and (mechanism is None or mech == mechanism))


# -- the mechanisms' server sides (one object per login) ----------------------------------------
class PlainServer:
    """RFC 4616 ``[authzid] NUL authcid NUL passwd``, as Kafka's PlainSaslServer checks it."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise Refused("Invalid SASL/PLAIN response: expected 3 tokens, got " + str(len(parts)))
        authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
        if not user:
            raise Refused("Authentication failed: username not specified")
        if not password:
            raise Refused("Authentication failed: password not specified")
        if self.credentials.password(user) != password:
            raise Refused("Authentication failed: Invalid username or password")
        if authzid and authzid != user:
            raise Refused("Authentication failed: Client requested an authorization id that is different from "
                          "username")
        return b"", "User:" + user


class ScramServer:
    """scramp's server: client-first -> server-first, client-final -> server-final (and done)."""

    def __init__(self, credentials: Credentials, mechanism: str) -> None:
        self.mechanism = mechanism
        self.user: str | None = None
        self.server = scramp.ScramMechanism(mechanism).make_server(self._lookup(credentials))
        self.round = 0

    def _lookup(self, credentials: Credentials) -> Any:
        def auth_fn(user: str) -> tuple[bytes, bytes, bytes, int]:
            self.user = user
            return credentials.scram(self.mechanism, user)
        return auth_fn

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        self.round += 1
        # SCRAM's failures are SaslExceptions in Kafka: the client gets this message, never the cause
        # (SaslServerAuthenticator: it may tell whether the user exists).
        refusal = ("Authentication failed during authentication due to invalid credentials with SASL mechanism "
                   + self.mechanism)
        try:
            if self.round == 1:
                self.server.set_client_first(token.decode("utf-8"))
                return self.server.get_server_first().encode(), None
            if self.round == 2:
                self.server.set_client_final(token.decode("utf-8"))
                assert self.user is not None
                return self.server.get_server_final().encode(), "User:" + self.user
        except (scramp.ScramException, UnicodeDecodeError):
            raise Refused(refusal) from None
        raise Refused(refusal)


class OAuthBearerServer:
    """RFC 7628's client message (``gs2-header %x01 auth=Bearer TOKEN %x01 [k=v %x01]... %x01``) with
    an unsecured JWS checked as Kafka's OAuthBearerUnsecuredValidatorCallbackHandler does (alg none,
    ``sub``, ``exp`` in the future), or against an exact token. A bad token is answered with the error
    JSON as a challenge; the client's ``%x01`` then ends the login refused with that JSON."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials
        self.error: str | None = None
        self.expires_ms: int | None = None

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        if self.error is not None:
            if token == b"\x01":
                raise Refused(self.error)
            raise Refused("Authentication failed: unexpected message after an error")
        try:
            principal = self._check(token)
        except ValueError:
            self.error = json.dumps({"status": "invalid_token"})
            return self.error.encode(), None
        return b"", principal

    def _check(self, message: bytes) -> str:
        text = message.decode("utf-8")
        gs2, sep, rest = text.partition("\x01")
        if not sep or not gs2.startswith(("n,", "y,")):
            raise ValueError("bad gs2 header")
        pairs = dict(part.split("=", 1) for part in rest.split("\x01") if part)
        auth = pairs.get("auth", "")
        if not auth.startswith("Bearer "):
            raise ValueError("no bearer token")
        token = auth[len("Bearer "):]
        subject, exact = self.credentials.oauth()
        if exact is not None and token != exact:
            raise ValueError("not the expected token")
        header_b64, payload_b64, signature = token.split(".")
        header = json.loads(_unb64url(header_b64))
        claims = json.loads(_unb64url(payload_b64))
        if header.get("alg") != "none" or signature:
            raise ValueError("not an unsecured JWS")
        if subject is not None and claims.get("sub") != subject:
            raise ValueError("wrong subject")
        exp = claims.get("exp")
        if not isinstance(exp, int | float) or exp * 1000 <= time.time() * 1000:
            raise ValueError("expired or no exp")
        self.expires_ms = int(exp * 1000)
        return "User:" + str(claims["sub"])


def mechanism_server(mechanism: str, credentials: Credentials) -> PlainServer | ScramServer | OAuthBearerServer:
    """The server side of one login with ``mechanism`` (one of :data:`MECHANISMS`)."""
    if mechanism == "PLAIN":
        return PlainServer(credentials)
    if mechanism == "OAUTHBEARER":
        return OAuthBearerServer(credentials)
    return ScramServer(credentials, mechanism)


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def unsecured_jws(subject: str, lifetime_s: float = 3600.0) -> str:
    """An unsecured JWS (RFC 7515 ``alg: none``) naming ``subject``, as librdkafka's
    ``sasl.oauthbearer.config=principal=...`` makes one: for a token file."""
    now = time.time()

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")
    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'iat': int(now), 'exp': int(now + lifetime_s)})}."


# -- one connection ----------------------------------------------------------------------------
class _Closed(Exception):
    """End the connection; the reason is counted."""


class _Connection:
    def __init__(self, front: SaslFront, client: trio.abc.Stream, upstream: trio.SocketStream) -> None:
        self.front = front
        self.client = client
        self.upstream = upstream
        self.buffer = bytearray()
        self.up_buffer = bytearray()
        self.state = "versions"  # versions -> handshake -> authenticate -> done (reauth: handshake again)
        self.raw_tokens = False  # after SaslHandshake v0
        self.mechanism: str | None = None
        self.login: PlainServer | ScramServer | OAuthBearerServer | None = None
        self.principal: str | None = None
        self.reauthenticating = False
        self.expires_at: float | None = None  # monotonic time the session ends (KIP-368)
        self.reauth_started = 0.0

    async def run(self) -> None:
        while True:
            frame = await self._read(self.client, self.buffer,
                                     SASL_MAX_RECEIVE if self.state != "done" else MAX_FRAME)
            if frame is None:
                return
            if self.raw_tokens:
                await self._token(frame)
                continue
            header = decode_request_header(frame)
            key = header.api_key
            if self.state != "done":
                await self._authenticating(key, header.api_version, frame)
            elif key == SASL_HANDSHAKE and self._may_reauthenticate():
                self.reauthenticating = True
                self.reauth_started = time.monotonic()
                self.state = "handshake"
                await self._authenticating(key, header.api_version, frame)
            elif self.expires_at is not None and time.monotonic() > self.expires_at:
                raise _Closed("session expired")
            elif key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
                await self._answer(frame, self._illegal_state_body(key, header.api_version))
            else:
                await self._forward(key, header.api_version, frame)

    def _may_reauthenticate(self) -> bool:
        return self.expires_at is not None and time.monotonic() - self.reauth_started >= MIN_REAUTH_INTERVAL_S

    async def _authenticating(self, key: int, version: int, frame: bytes) -> None:
        if key == API_VERSIONS and self.state == "versions":
            self.state = "handshake"
            await self._forward(key, version, frame)
            return
        if key == SASL_HANDSHAKE and self.state in ("versions", "handshake"):
            await self._handshake(version, frame)
            return
        if key == SASL_AUTHENTICATE and self.state == "authenticate" and not self.raw_tokens:
            await self._authenticate(version, frame)
            return
        during = "authentication" if self.state == "authenticate" else "handshake"
        raise _Closed(f"unexpected request (api key {key}) during SASL {during}")

    async def _handshake(self, version: int, frame: bytes) -> None:
        mechanism = decode_request(frame).body["mechanism"]
        enabled = list(self.front.mechanisms)
        if mechanism not in enabled:
            await self._answer(frame, {"error_code": UNSUPPORTED_SASL_MECHANISM, "mechanisms": enabled})
            raise _Closed(f"unsupported mechanism {mechanism!r}")
        if self.reauthenticating and mechanism != self.mechanism:
            await self._answer(frame, {"error_code": ILLEGAL_SASL_STATE, "mechanisms": enabled})
            raise _Closed("mechanism changed during re-authentication")
        self.mechanism = mechanism
        self.login = mechanism_server(mechanism, self.front.credentials)
        await self._answer(frame, {"error_code": 0, "mechanisms": enabled})
        self.state = "authenticate"
        self.raw_tokens = version == 0

    async def _authenticate(self, version: int, frame: bytes) -> None:
        request = decode_request(frame)
        try:
            reply, principal = self._step(bytes(request.body["auth_bytes"]))
        except Refused as exc:
            await self._answer(frame, {"error_code": SASL_AUTHENTICATION_FAILED, "error_message": str(exc),
                                       "auth_bytes": b"", "session_lifetime_ms": 0})
            raise _Closed("authentication failed") from None
        lifetime_ms = self._complete(principal, version) if principal is not None else 0
        await self._answer(frame, {"error_code": 0, "error_message": None, "auth_bytes": reply,
                                   "session_lifetime_ms": lifetime_ms})

    async def _token(self, frame: bytes) -> None:
        """A raw token after SaslHandshake v0: answered raw; a refusal closes with no answer."""
        try:
            reply, principal = self._step(frame)
        except Refused:
            raise _Closed("authentication failed") from None
        if principal is not None:
            self._complete(principal, 0)
            self.raw_tokens = False
        await self.client.send_all(_SIZE.pack(len(reply)) + reply)

    def _step(self, token: bytes) -> tuple[bytes, str | None]:
        assert self.login is not None and self.mechanism is not None
        try:
            reply, principal = self.login.step(token)
        except Refused:
            self.front.events.login(self.mechanism, "reauth_refused" if self.reauthenticating else "refused")
            raise
        if principal is not None and self.reauthenticating and principal != self.principal:
            self.front.events.login(self.mechanism, "reauth_refused", principal)
            raise Refused(f"Cannot change principals during re-authentication from {self.principal}: {principal}")
        return reply, principal

    def _complete(self, principal: str, version: int) -> int:
        """A login succeeded: the session's lifetime (KIP-368), sent to clients of v1+ only, enforced on all."""
        assert self.mechanism is not None
        self.front.events.login(self.mechanism, "reauth_ok" if self.reauthenticating else "ok", principal)
        self.principal = principal
        self.state = "done"
        self.reauthenticating = False
        now_ms = time.time() * 1000
        lifetime = self.front.session_lifetime_ms or None
        if isinstance(self.login, OAuthBearerServer) and self.login.expires_ms is not None:
            left = max(0, int(self.login.expires_ms - now_ms))
            lifetime = left if lifetime is None else min(lifetime, left)
        self.expires_at = None if lifetime is None else time.monotonic() + lifetime / 1000
        return (lifetime or 0) if version >= 1 else 0

    @staticmethod
    def _illegal_state_body(key: int, version: int) -> dict[str, Any]:
        if key == SASL_HANDSHAKE:
            return {"error_code": ILLEGAL_SASL_STATE, "mechanisms": []}
        return {"error_code": ILLEGAL_SASL_STATE, "auth_bytes": b"", "session_lifetime_ms": 0,
                "error_message": "SaslAuthenticate request received after successful authentication"}

    async def _answer(self, frame: bytes, body: dict[str, Any]) -> None:
        header = decode_request_header(frame)
        payload = encode_response(header.correlation_id, header.api_key, header.api_version, body)
        await self.client.send_all(_SIZE.pack(len(payload)) + payload)

    async def _forward(self, key: int, version: int, frame: bytes) -> None:
        """One request to Tansu and its answer back (an acks=0 Produce's answer dropped)."""
        await self.upstream.send_all(_SIZE.pack(len(frame)) + frame)
        answer = await self._read(self.upstream, self.up_buffer, MAX_FRAME)
        if answer is None:
            raise _Closed("broker closed")
        if key == PRODUCE:
            offset = request_body_offset(_SIZE.pack(len(frame)) + frame, PRODUCE, version)
            if offset is not None and produce_acks(_SIZE.pack(len(frame)) + frame, version, offset) == 0:
                return
        await self.client.send_all(_SIZE.pack(len(answer)) + answer)

    @staticmethod
    async def _read(stream: trio.abc.Stream, buffer: bytearray, limit: int) -> bytes | None:
        """The next frame's payload (no size prefix); None at a clean end of stream."""
        while True:
            if len(buffer) >= 4:
                (size,) = _SIZE.unpack_from(buffer, 0)
                if not 0 <= size <= limit:
                    raise _Closed(f"frame of {size} bytes over {limit}")
                if len(buffer) >= 4 + size:
                    frame = bytes(buffer[4:4 + size])
                    del buffer[:4 + size]
                    return frame
            data = await stream.receive_some(65536)
            if not data:
                if buffer:
                    raise _Closed("closed mid-frame")
                return None
            buffer += data


class SaslFront:
    """``with SaslFront() as front: front.bootstrap``: the front and its own Tansu broker, serving in a
    background thread until the block ends.

    ``mechanisms``: the ones the handshake accepts (Kafka's ``sasl.enabled.mechanisms``);
    ``session_lifetime_ms``: KIP-368's ``connections.max.reauth.ms`` (0: sessions never expire).
    Both may change while it runs (they apply to new logins). ``ssl_context``: serve TLS first, then
    SASL (a SASL_SSL listener).
    """

    def __init__(self, *, mechanisms: tuple[str, ...] = MECHANISMS, session_lifetime_ms: int = 0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.ssl_context = ssl_context
        self.mechanisms = mechanisms
        self.session_lifetime_ms = session_lifetime_ms
        self.credentials = Credentials()
        self.events = Events()
        self.port = free_port()
        self.broker: Broker | None = None
        self._stack = contextlib.ExitStack()
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel: trio.CancelScope | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="sasl-front", daemon=True)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def reset(self) -> None:
        """As new: no users, no token, every mechanism, sessions that never expire, no events (a test's
        start; connections still open keep their logins)."""
        self.mechanisms = MECHANISMS
        self.session_lifetime_ms = 0
        self.credentials = Credentials()
        self.events = Events()

    def __enter__(self) -> SaslFront:
        self.broker = self._stack.enter_context(run_tansu(advertised=self.bootstrap))
        self._thread.start()
        if not self._started.wait(20) or self._error is not None:
            self._stack.close()
            raise RuntimeError(f"the SASL front did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None and self._cancel is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._cancel.cancel, trio_token=self._token)
        self._thread.join(10)
        self._stack.close()

    def _main(self) -> None:
        async def serve() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as self._cancel:
                listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(trio.serve_listeners, self._handle, listeners)
                    self._started.set()

        try:
            trio.run(serve)
        except BaseException as exc:
            self._error = exc
            self._started.set()

    async def _handle(self, tcp: trio.SocketStream) -> None:
        assert self.broker is not None
        self.events.accept()
        client: trio.abc.Stream = tcp
        try:
            if self.ssl_context is not None:
                client = trio.SSLStream(tcp, self.ssl_context, server_side=True)
                with trio.fail_after(10):
                    await client.do_handshake()
            upstream = await trio.open_tcp_stream(self.broker.host, self.broker.port)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError):
            self.events.close("handshake failed or broker unreachable")
            await trio.aclose_forcefully(tcp)
            return
        reason = "client closed"
        try:
            await _Connection(self, client, upstream).run()
        except _Closed as exc:
            reason = str(exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            reason = f"stream error {type(exc).__name__}"
        finally:
            self.events.close(reason)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(upstream)
                await trio.aclose_forcefully(client)


@contextlib.contextmanager
def running_front(users: dict[str, str] | None = None, **options: Any) -> Iterator[SaslFront]:
    """A :class:`SaslFront` with these users (name -> password) accepted."""
    with SaslFront(**options) as front:
        for user, password in (users or {}).items():
            front.credentials.set_password(user, password)
        yield front
