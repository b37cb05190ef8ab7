"""The slow PLAIN password hashes of terminate mode, run in worker threads, and the client sockets
their waits watch.

Which hash runs, which are shared and which are refused is
:class:`~kproxy.sasl.password_queue.PasswordQueue`'s (kproxy/sasl/password_queue.py: at most so
many at once, one per key in flight, charged per peer address and served in turn, dropped when
nobody waits). :class:`PasswordChecks` (one per server) runs what it says in worker threads and
wakes the logins waiting for each result; the address a connection is charged to is
:func:`charged_to`'s (an IPv6 address by its /64). A hash already running cannot be stopped (a
thread is not interruptible): it finishes, and its result is dropped when nobody waits for it.

The caller (kproxy/server/connection.py) cancels its wait when the client closes
(:func:`closed_already`, :func:`client_gone`) or the login's deadline passes. Used from the trio
loop only; the threads only hash.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from kproxy.sasl.password_queue import (
    PER_ADDRESS,
    QUEUED_MAX,
    RUNNING_PER_ADDRESS,
    THREADS,
    PasswordCheck,
    PasswordQueue,
)

if TYPE_CHECKING:
    import outcome  # trio's own (a result or an error, as start_thread_soon delivers it)

log = logging.getLogger("kproxy.sasl")


class PasswordChecks:
    """Every password hash of one server, run in worker threads (see the module's docstring); the
    counters are its queue's."""

    def __init__(self, threads: int = THREADS, per_address: int = PER_ADDRESS, queued_max: int = QUEUED_MAX,
                 running_per_address: int = RUNNING_PER_ADDRESS) -> None:
        self._queue = PasswordQueue(threads, per_address, queued_max, running_per_address)
        self._done: dict[PasswordCheck, trio.Event] = {}  # the checks queued or running, and their end

    @property
    def queued(self) -> int:
        return self._queue.queued

    @property
    def running(self) -> int:
        return self._queue.running

    @property
    def runs(self) -> int:
        """Hashes started since the server started (each ran to its end)."""
        return self._queue.runs

    @property
    def refused(self) -> int:
        """Logins not checked: over an address's share or the queue's bound."""
        return self._queue.refused

    async def check(self, charged_to: str, key: bytes, work: Callable[[], bool]) -> bool | None:
        """The result of ``work`` (a password's hash and comparison, run in a worker thread), shared
        with every other caller of the same ``key`` while it is queued or running; None when it was
        not checked (:meth:`~kproxy.sasl.password_queue.PasswordQueue.ask`): the caller refuses the
        login. Cancelling the wait leaves a hash that someone else waits for, or that runs already;
        a queued one nobody waits for any more is dropped."""
        job = self._queue.ask(charged_to, key, work)
        if job is None:
            return None
        done = self._done.get(job)
        if done is None:
            done = self._done[job] = trio.Event()
            self._dispatch()
        try:
            await done.wait()
        finally:
            self._queue.left(job)
            if not job.waiters and not job.started:
                del self._done[job]  # dropped from the queue: it never runs
        return job.result

    def _dispatch(self) -> None:
        """Start the hashes the queue says may run now."""
        while (job := self._queue.next()) is not None:
            deliver = functools.partial(self._deliver, trio.lowlevel.current_trio_token(), job)
            trio.lowlevel.start_thread_soon(job.work, deliver, name="kproxy-password-check")

    def _deliver(self, token: trio.lowlevel.TrioToken, job: PasswordCheck, result: outcome.Outcome[bool]) -> None:
        """In the worker thread, once the hash ended: its result to the loop."""
        with contextlib.suppress(trio.RunFinishedError):  # the server is gone: nobody waits
            token.run_sync_soon(self._finished, job, result)

    def _finished(self, job: PasswordCheck, result: outcome.Outcome[bool]) -> None:
        try:
            ok = result.unwrap() is True
        except Exception:
            log.exception("event=password_check_crashed")
            ok = False
        self._queue.finished(job, ok)
        self._done.pop(job).set()
        self._dispatch()


def charged_to(stream: trio.abc.Stream, fallback: str) -> str:
    """The address a connection's hashes are charged to: the peer's IP address, an IPv6 one as its
    /64 (one host's usual share, which it may spread its connections over); ``fallback`` for a
    stream without a socket peer."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if not isinstance(stream, trio.SocketStream):
        return fallback
    try:
        host = stream.socket.getpeername()[0]
    except OSError:
        return fallback
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return str(host)
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped
        if mapped is not None:
            return str(mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def closed_already(stream: trio.abc.Stream) -> bool:
    """Whether the client's socket says, now, that it closed (a client that sent its login and left
    at once): nothing is read, nothing waited for. False for a stream without a socket."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if not isinstance(stream, trio.SocketStream):
        return False
    # trio's sockets have no non-blocking call that returns at once: a stdlib socket object over the
    # same descriptor, detached after (never closed: the descriptor stays the connection's).
    peek = socket.socket(fileno=stream.socket.fileno())
    try:
        return peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset by the peer
        return True
    finally:
        peek.detach()


async def client_gone(stream: trio.abc.Stream) -> bool:
    """Wait until the client's socket says it closed (True), or until it has bytes to read, which
    tell nothing here (False: the pump reads them later). A stream without a socket: never returns
    True (the login's deadline ends the wait). Reads nothing: the bytes stay for the pump."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if not isinstance(stream, trio.SocketStream):
        await trio.sleep_forever()
    try:
        return await stream.socket.recv(1, socket.MSG_PEEK) == b""
    except OSError:  # reset by the peer
        return True
