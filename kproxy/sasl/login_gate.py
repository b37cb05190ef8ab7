"""The login gate: the client held while kproxy's own login to the broker runs (``sasl.upstream``).

:class:`LoginGate` is one connection's gate, a unit the session owns and calls (sans-IO: client
chunks and broker answers in, frames for the broker and the login's end out). While a login runs
(:class:`~kproxy.sasl.upstream_login.UpstreamLogin`, the SASL exchange itself) the client's chunks
are held (:meth:`LoginGate.hold`) and none of its requests goes up; the login's own frames go up
instead, and the broker's answers to them (:meth:`LoginGate.answer`) never reach the client. The
first login is begun by the client's first chunk (in terminate mode, the client is held from its
own login on, :meth:`LoginGate.hold_from_now`, and the login begun by :meth:`LoginGate.begin` once
the upstream connection is open); each re-authentication (KIP-368) by the session's timer
(:meth:`LoginGate.on_timer`). Each login's end is a :class:`LoginEnd`: on success, the chunks held,
for the session to read as if they had just come; on a refusal or a timeout, the reason to close
(:data:`REFUSAL_LINGER_S` after the answer, as a broker closes) and, for a first login, the
client's first request answered with the broker's error where that answer can carry it
(ApiVersions can). After a refusal the client is read no more: the gate stays shut.

The session makes a gate only with ``login`` and asks it one attribute per client chunk
(:attr:`LoginGate.held`); a broker frame reaches it only when it matches no request of the client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.framing import FrameSplitter
from kproxy.sasl.authenticator import FAILED_AUTHENTICATION_DELAY
from kproxy.sasl.upstream_login import SUCCESS, LoginResult, UpstreamLogin, refusal_answer

# A refused upstream login closes this long after its answer, as a broker does (Kafka's
# connection.failed.authentication.delay.ms, 100 ms by default).
REFUSAL_LINGER_S: Final = FAILED_AUTHENTICATION_DELAY

Held = list[tuple[bytes | bytearray, float | None]]  # client chunks, each with when it was read


@dataclass(frozen=True, slots=True)
class LoginEnd:
    """How a login ended, for the client. ``close`` None: it succeeded, and ``held`` are the client's
    chunks to read now, in order. Else the connection closes for ``close`` (a refusal, a timeout)
    after ``answer``, the broker's error as the answer to the client's first request (None: none),
    or for ``error`` when that request could not be read."""

    held: Held = field(default_factory=list)
    close: str | None = None
    answer: bytes | None = None
    error: ProtocolError | None = None  # the client's first request could not be read: close for it instead


class LoginGate:
    """The login gate of one client connection (see the module's docstring).

    ``refuses`` says whether a correlation id may still be answered to the client (the login's ids
    must never be one). ``frames`` is the session's splitter of client frames, read only to find a
    refused first login's first request. ``hold_first``: the client is held from its first chunk
    (False in terminate mode, where kproxy's own login begins once the client logged in).
    """

    def __init__(self, login: UpstreamLogin, refuses: Callable[[int], bool], frames: FrameSplitter, *,
                 hold_first: bool = True) -> None:
        self.login = login
        self._refuses = refuses
        self._frames = frames
        # The client chunks held while a login runs; None: none runs, the client is read.
        self.held: Held | None = [] if hold_first else None
        self._wake_asked: float | None = None  # the last wake-up asked (the login's deadline or next re-authentication)

    @property
    def deadline(self) -> float | None:
        """When the login under way runs out of time (None: none runs)."""
        return self.login.deadline

    def hold(self, chunk: bytes | bytearray, read_at: float | None) -> bytes:
        """A client chunk read while :attr:`held` is set: held. The connection's first one begins the
        first login: its first frames for the broker are returned (b"": nothing goes up now)."""
        assert self.held is not None
        self.held.append((chunk, read_at))
        if self.login.logins:
            return b""
        return self.login.begin(self._refuses)

    def hold_from_now(self) -> None:
        """Terminate mode: the client logged in and the upstream connection is asked for; its
        chunks are held from now until kproxy's own login on that connection ends."""
        self.held = []

    def begin(self) -> bytes:
        """The upstream connection is open (terminate mode, after the client's login): the first
        login begins. Its first frames for the broker."""
        return self.login.begin(self._refuses)

    def awaits(self, correlation_id: int) -> bool:
        """Whether a broker frame with ``correlation_id`` answers one of the login's requests."""
        return self.login.awaits(correlation_id)

    def answer(self, correlation_id: int, frame: bytes) -> tuple[bytes, LoginEnd | None]:
        """The broker answered one of the login's requests: the login's next frames for the broker
        (b"": none), and its end when it ended."""
        out, result = self.login.answer(correlation_id, frame, self._refuses)
        return out, (self._ended(result) if result is not None else None)

    def on_timer(self, now: float) -> tuple[bytes, LoginEnd | None]:
        """The session's timer: the login that ran out of time ends (a :class:`LoginEnd` that
        closes); a re-authentication that is due begins (the client is held; its first frames)."""
        login = self.login
        if login.deadline is not None and now >= login.deadline:
            return b"", self._ended(login.timed_out())
        if self.held is None and login.due(now):
            self.held = []  # a re-authentication: the client's requests wait until it ends
            return login.begin(self._refuses), None
        return b"", None

    def wake(self, again: bool = False) -> float | None:
        """The wake-up to ask for: the login's deadline or next re-authentication, when it changed
        since the last asked, or ``again`` (on_timer: the server forgot the last). None: none."""
        login = self.login
        when = login.deadline if login.deadline is not None else login.reauth_at
        asked, self._wake_asked = self._wake_asked, when
        return when if when is not None and (again or when != asked) else None

    def refuse_client_sasl(self, request: bytes) -> bytes | None:
        """The answer to the client's own SASL request (kproxy logged in itself: nothing to relay)."""
        return self.login.refuse_client_sasl(request)

    def _ended(self, result: LoginResult) -> LoginEnd:
        held = self.held or []
        if result.result == SUCCESS:
            self.held = None
            return LoginEnd(held)
        self.held = held or [(b"", None)]  # shut for good: the client is read no more
        try:
            first = self._frames.split(held[0][0])[0] if held and self.login.logins == 1 else []
        except ProtocolError as exc:
            return LoginEnd(close=result.reason, error=exc)
        answer = refusal_answer(first[0], result.error_code, result.message) if first else None
        return LoginEnd(close=result.reason, answer=answer)
