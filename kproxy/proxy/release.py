"""The in-order release of a session's responses, and the shape of the writes that carry them.

:class:`InOrderRelease` holds the exchanges in flight, oldest first, and lets answered ones go
to the client only from the head: a response (from the broker or made by kproxy) waits behind
every earlier request, so responses leave in request order. A policy's hold stops the release
at the held exchange until its time (:attr:`InOrderRelease.wake` asks for a wake-up); a dropped
response releases nothing and the ones behind it go on.

The due frames are handed over as one :class:`~kproxy.proxy.commands.SendToClient`: the chunk
read itself when it held exactly those frames, unchanged (no copy, no join: the common case by
far); else one joined write when small, or one vectored write of the frames as they are when
few and big (``more``; see VECTORED_MIN_BYTES).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from kproxy.protocol.framing import Spanned
from kproxy.proxy.addresses import BrokerRoute
from kproxy.proxy.commands import ForwardUpstream, SendToClient
from kproxy.proxy.exchange import Exchange, Ruling

# Several frames of one chunk that do not go on as the chunk itself are joined into one write, unless
# they are at most this many and at least this big in all: then a vectored write (os.writev) takes them
# as they are, and the copy a join makes (a Produce of 100 KB batches: every byte) is saved.
VECTORED_MAX_FRAMES: Final = 64
VECTORED_MIN_BYTES: Final = 64 * 1024


def _same_frames(due: list[bytes | Spanned], read: Sequence[bytes | Spanned]) -> bool:
    """Whether ``due`` holds the very objects of ``read``, in its order. By index, not through
    ``zip(strict=True)``: compiled, a zip with a keyword is a call through the interpreter's slow
    path, and this runs for every answer."""
    return len(due) == len(read) and all(due[i] is read[i] for i in range(len(due)))


class InOrderRelease:
    """The exchanges in flight and the responses due, of one session.

    ``in_flight``: exchanges read and not yet released, oldest first (local answers waiting
    their turn included): a list, not a deque, since an emptied list holds no buffer where a deque
    keeps a block of 64 slots per idle connection; taking its head moves the few
    pointers behind it (requests in flight: at most ``max_in_flight``). ``ready``: the frames
    due to the client, in order (a :data:`Spanned` frame among them sets ``spanned``), with the
    ``routes`` they carry. ``completed``: exchanges done, for the observer (kept only when
    ``observed``). ``taken``: the session's taken correlation ids, of which a released exchange's
    is freed. ``wake``: the earliest time a held response (or the session, :meth:`want_wake`)
    wants the server to call back; None: none.
    """

    __slots__ = ("clock", "completed", "in_flight", "observed", "ready", "routes", "spanned", "taken", "wake")

    def __init__(self, clock: Callable[[], float], taken: set[int], observed: bool) -> None:
        self.clock = clock
        self.taken = taken
        self.observed = observed
        self.in_flight: list[Exchange] = []
        self.ready: list[bytes | Spanned] = []
        self.spanned = False
        self.routes: list[BrokerRoute] = []
        self.completed: list[Exchange] = []
        self.wake: float | None = None

    def want_wake(self, when: float) -> None:
        if self.wake is None or when < self.wake:
            self.wake = when

    def flush(self) -> None:
        """Release the answered exchanges at the head of ``in_flight``, in request order.

        A held exchange (its ruling's ``release_at`` in the future) stops the release there and
        asks for a wake-up: the ones behind it wait, as they would behind a slow broker. A dropped
        one releases nothing once its answer came, and the ones behind it go on: the broker
        answers in order, so its answer is read before any later one. One swallowed before it
        was ever answered (a local exchange dropped: a black hole's) completes with no response.

        For the observer, each exchange's ``Ruling.held`` is the part of its wait (from its answer
        to its release) that a hold caused: up to the latest ``release_at`` met so far in this
        release, its own or of one ahead of it that it queued behind.
        """
        in_flight = self.in_flight
        held_until = 0.0  # the latest release_at among the exchanges released by this call
        held_by: tuple[str, str] | None = None
        while in_flight and in_flight[0].response is not None:
            ex = in_flight[0]
            ruling = ex.ruling
            if ruling is not None:
                release_at = ruling.release_at
                if release_at:
                    if release_at > self.clock():
                        self.want_wake(release_at)
                        break
                    if release_at > held_until:
                        held_until, held_by = release_at, ruling.held_by
            del in_flight[0]
            self.taken.discard(ex.correlation_id)
            if ruling is not None and ruling.drop:
                if ex.local:
                    ex.response = None  # swallowed before any answer existed: observers see none
            else:
                if ex.response_parts is None:
                    assert ex.response is not None
                    self.ready.append(ex.response)
                else:
                    self.ready.append(ex.response_parts)
                    self.spanned = True
                if ex.routes:
                    self.routes.extend(ex.routes)
            if self.observed:
                ex.completed_at = self.clock()
                if held_until > ex.received_at:
                    if ruling is None:
                        ruling = ex.ruling = Ruling()
                    ruling.held = (held_until - ex.received_at, held_by)
                self.completed.append(ex)

    def take(self, read: Sequence[bytes | Spanned], chunk: bytes, exact: bool) -> SendToClient:
        """The responses due, as one command. ``read``/``chunk``/``exact`` describe the chunk just
        split: when the due frames are exactly its frames, unchanged, the chunk goes as it is."""
        out = self.ready
        self.ready = []
        routes: tuple[BrokerRoute, ...] = ()
        if self.routes:
            routes = tuple(self.routes)
            self.routes.clear()
        if exact and _same_frames(out, read):
            return SendToClient(chunk, routes)
        if self.spanned:
            self.spanned = False
            return _send_pieces(out, routes)
        frames: list[bytes] = out  # type: ignore[assignment]  # no Spanned in it
        if len(frames) == 1:
            return SendToClient(frames[0], routes)
        if vectored(frames):
            return SendToClient(frames[0], routes, tuple(frames[1:]))
        return SendToClient(b"".join(frames), routes)


def vectored(frames: list[bytes]) -> bool:
    """Whether these frames (more than one) go out in one vectored write rather than joined: when
    they are few and big, so that joining them would copy a lot for few buffers saved."""
    return len(frames) <= VECTORED_MAX_FRAMES and sum(map(len, frames)) >= VECTORED_MIN_BYTES


def forward_frames(frames: list[bytes]) -> ForwardUpstream:
    """Several requests going upstream as one command (joined, or vectored: :func:`vectored`)."""
    if vectored(frames):
        return ForwardUpstream(frames[0], tuple(frames[1:]))
    return ForwardUpstream(b"".join(frames))


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
