"""What a :class:`~kproxy.proxy.session.Session` asks its server to do (mitmproxy's layers and
h11 speak the same way: the protocol state machine decides, the I/O code executes).

The session's ``receive_client``, ``receive_upstream`` and ``on_timer`` each return a
list of these, to be executed in list order. Every command is immutable (its fields are
``Final``: mypy refuses an assignment, and so does a compiled build at run time) and slotted: the
server keeps none of them past its execution. Each writes its own ``__init__``, which a compiled
build (kproxy/native.py) makes native code: the dataclass decorator's own would be an interpreted
function, several times the cost, on every chunk (the decorator still makes ``__eq__`` and ``__repr__``).

Ordering contract: a :class:`SendToClient` is always first in its list, so that the
server can claim the client side for it before it awaits anything else (responses
leave in request order: two lists returned one after the other must reach the client
in that order, whichever task executes them). Likewise two lists' :class:`ForwardUpstream`
must reach the broker in the order the session returned them (the order it expects the answers
in): the server claims the upstream side for them when a list is returned, before it awaits
anything. They come from ``receive_client``, and with an upstream login (kproxy's own SASL) also
from ``receive_upstream`` (the login's next request, the client's requests held during it) and
``on_timer`` (a re-authentication's first request).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from kproxy.proxy.addresses import BrokerRoute


class RejectReason(enum.StrEnum):
    """Why a connection was refused for what a peer sent: the only values of the
    ``kproxy_frames_rejected_total{reason}`` label (dashboards and alerts match these
    strings; deploy/prometheus/alerts.yml). ``request_*``: the client's bytes,
    ``response_*``: the broker's."""

    REQUEST_OVERSIZE = "request_oversize"  # a size prefix over limits.max_frame_size (or negative)
    REQUEST_SESSION = "request_session"  # a request the session cannot take (see proxy/session.py)
    REQUEST_TIMEOUT = "request_timeout"  # a request frame not whole within limits.frame_timeout
    RESPONSE_OVERSIZE = "response_oversize"
    RESPONSE_SESSION = "response_session"  # desynchronised or unrewritable response


class CloseKind(enum.Enum):
    """Why a :class:`CloseConnection` closes: counted and logged apart."""

    REJECT = "reject"  # a peer broke the protocol; ``reject`` says how (a metric counts it)
    DELIBERATE = "deliberate"  # kproxy chose to (a fault-injection rule): not a protocol error
    END = "end"  # the exchange is over in an orderly way


@dataclass(slots=True)
class ForwardUpstream:
    """Write ``data`` (whole request frames) to the broker. When the chunk read from the
    client held exactly the frames going out, unchanged, ``data`` *is* that chunk (no copy).

    ``more``: further frames to write after ``data``, in one vectored write (``os.writev``):
    big frames that joining into one ``bytes`` would copy once more. Empty for small ones.
    """

    data: Final[bytes]
    more: Final[tuple[bytes, ...]]

    def __init__(self, data: bytes, more: tuple[bytes, ...] = ()) -> None:
        self.data = data
        self.more = more

    def payload(self) -> bytes:
        """Every byte to write, as one object (for readers that want that: not the server)."""
        return b"".join((self.data, *self.more)) if self.more else self.data


@dataclass(slots=True)
class SendToClient:
    """Write ``data`` (whole response frames, in request order) to the client, once every
    route in ``routes`` has a listener: the brokers those responses advertise must be
    reachable before the client reads their addresses. As for :class:`ForwardUpstream`,
    ``data`` is the chunk read from the broker itself when nothing in it changed, and
    ``more`` holds further big frames to write after it in one vectored write."""

    data: Final[bytes]
    routes: Final[Sequence[BrokerRoute]]
    more: Final[tuple[bytes | bytearray | memoryview, ...]]

    def __init__(self, data: bytes, routes: Sequence[BrokerRoute] = (),
                 more: tuple[bytes | bytearray | memoryview, ...] = ()) -> None:
        self.data = data
        self.routes = routes
        self.more = more

    def payload(self) -> bytes:
        """Every byte to write, as one object (for readers that want that: not the server)."""
        return b"".join((self.data, *self.more)) if self.more else self.data


@dataclass(slots=True)
class CloseConnection:
    """End the connection (both sides). ``reason`` is the text for the
    ``event=connection_closed ... reason=...`` log line; ``reject`` is set exactly when
    ``kind`` is :attr:`CloseKind.REJECT`; ``abort`` only with :attr:`CloseKind.DELIBERATE`."""

    reason: Final[str]
    kind: Final[CloseKind]
    reject: Final[RejectReason | None]
    abort: Final[bool]  # end with a TCP RST (SO_LINGER 0) rather than a FIN: a reset_connection rule
    # Seconds to wait, once what came before it is written, before closing (nothing read meanwhile): a
    # refused login's, as a broker delays it (connection.failed.authentication.delay.ms), so that the
    # client reads the refusal before the close (kafka-python loses an answer that comes with the FIN).
    linger: Final[float]

    def __init__(self, reason: str, kind: CloseKind, reject: RejectReason | None = None, abort: bool = False,
                 linger: float = 0.0) -> None:
        self.reason = reason
        self.kind = kind
        self.reject = reject
        self.abort = abort
        self.linger = linger

    @classmethod
    def rejected(cls, reject: RejectReason, reason: str) -> CloseConnection:
        return cls(reason, CloseKind.REJECT, reject)

    @classmethod
    def for_error(cls, exc: Exception, oversize: RejectReason, otherwise: RejectReason, side: str) -> CloseConnection:
        """The reject for a protocol error met on one ``side`` (the log line keeps its text as it was):
        ``oversize`` for a frame over the size limit, else ``otherwise``."""
        from kproxy.protocol.errors import FrameSizeError

        return cls.rejected(oversize if isinstance(exc, FrameSizeError) else otherwise, f"{side}: {exc}")


@dataclass(slots=True)
class WakeAt:
    """Call the session's ``on_timer(now)`` at ``when`` (on the clock the session was given)
    or soon after. The server keeps the earliest time asked and not yet passed; a session
    that still needs a later one asks again from ``on_timer``."""

    when: Final[float]

    def __init__(self, when: float) -> None:
        self.when = when


@dataclass(frozen=True, slots=True)
class VerifyCredentials:
    """Run ``work`` off the event loop (a PLAIN password's slow hash: kproxy/sasl/server.py), then
    hand its result to the session's ``verified`` and execute the commands that returns. ``key``
    names the work (a keyed digest of the entry and the password, not the password): the server
    runs one ``work`` per key at a time and gives every login that asked for it its result. The
    server may not run it at all (too many hashes under way for the client's address): ``verified``
    gets None then. The client is not read meanwhile: a SASL client waits for the answer anyway.
    Comes last in its list, and only from ``receive_client``."""

    work: Callable[[], bool]
    key: bytes


@dataclass(frozen=True, slots=True)
class ConnectUpstream:
    """Open the upstream connection now, then hand the session's ``upstream_connected`` the fact and
    execute the commands it returns (the first requests for the broker). Terminate mode only: a
    session that answers its client's login itself has no upstream connection until that login
    succeeded (kproxy/sasl/client_login.py), so a client that never logs in costs the cluster nothing.
    Comes last in its list, once per connection, and nothing is written upstream before it; when no
    upstream address accepts, the connection closes, as a client of a dead upstream sees it."""


CONNECT_UPSTREAM = ConnectUpstream()

Command = ForwardUpstream | SendToClient | CloseConnection | WakeAt | VerifyCredentials | ConnectUpstream
