"""The slow PLAIN password hashes of terminate mode, run in worker threads and shared fairly among
the addresses that ask for them.

A PLAIN login kproxy has not verified before costs a slow hash (kproxy/sasl/credentials.py), and
a client that has not logged in yet asks for it: without bounds, anyone who can connect could
keep every core hashing for connections long gone and make real logins wait behind them. So
:class:`PasswordChecks` (one per server) runs the hashes of every connection and bounds what each
peer can cause:

* **at most** :data:`THREADS` **hashes at once**, all connections together: each holds a core;
* **one hash per (user, entry, password) in flight** (:meth:`PasswordChecks.check`'s ``key``, a
  keyed digest, never the password): the logins that ask for the same one while it is queued or
  running wait for that one and share its result (a fleet of clients of one user, started at once);
* **charged per peer address** (:func:`charged_to`; an IPv6 address by its /64, what one host is
  usually given): an address has at most :data:`PER_ADDRESS` hashes queued or running, and
  :data:`QUEUED_MAX` wait in all; a login beyond either is not checked (the caller refuses it,
  without hashing);
* **served in turn**: an address has one hash running at a time (:data:`RUNNING_PER_ADDRESS`),
  so while one address floods, the other thread is free for the next address's hash, which starts
  at once; the next hash to run is the oldest of the next address in a round robin over the
  addresses with hashes waiting and none running, so a real client's hash waits for at most one
  hash of each other address, however many one of them queued;
* **dropped when nobody waits**: a queued hash whose every waiter was cancelled (its connection
  closed, its deadline passed) is taken out of the queue and never runs. A hash already running
  cannot be stopped (a thread is not interruptible): it finishes, still charged to its address,
  and its result is dropped.

The caller (kproxy/server/connection.py) cancels its wait when the client closes or the login's
deadline passes. Used from the trio loop only; the threads only hash.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import socket
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import trio

if TYPE_CHECKING:
    import outcome  # trio's own (a result or an error, as start_thread_soon delivers it)

log = logging.getLogger("kproxy.sasl")

# Hashes at once, all connections together: each holds a core for a fraction of a second, so a
# burst of logins queues here rather than starving the event loop's process of CPU (hashlib
# releases the GIL while it hashes).
THREADS: Final = 2
# Distinct hashes one address may have queued or running: a host's real clients log in as a few
# users at a time; more distinct passwords at once is guessing.
PER_ADDRESS: Final = 16
# Distinct hashes waiting for a thread, all addresses together (a bound on memory, and on how
# long the last of them waits).
QUEUED_MAX: Final = 1024
# Hashes one address may have running at once: fewer than THREADS, so that one address alone never
# holds every thread and the next address's hash starts without waiting for one of its to end (the
# price: one address's burst of new logins is hashed one at a time).
RUNNING_PER_ADDRESS: Final = 1


class _Check:
    """One hash: its work, the address charged for it, the logins waiting for its result."""

    __slots__ = ("charged_to", "done", "key", "result", "started", "waiters", "work")

    def __init__(self, key: bytes, charged_to: str, work: Callable[[], bool]) -> None:
        self.key = key
        self.charged_to = charged_to
        self.work = work
        self.waiters = 0
        self.started = False
        self.result = False
        self.done = trio.Event()


class PasswordChecks:
    """Every password hash of one server (see the module's docstring)."""

    def __init__(self, threads: int = THREADS, per_address: int = PER_ADDRESS, queued_max: int = QUEUED_MAX,
                 running_per_address: int = RUNNING_PER_ADDRESS) -> None:
        self.threads = threads
        self.per_address = per_address
        self.queued_max = queued_max
        self.running_per_address = running_per_address
        self._by_key: dict[bytes, _Check] = {}  # queued or running
        # Queued hashes by address; the dict's order is the round robin's (the next served first).
        self._queues: dict[str, deque[_Check]] = {}
        self._charged: Counter[str] = Counter()  # queued or running, by address
        self._running_at: Counter[str] = Counter()  # running, by address
        self.queued = 0
        self.running = 0
        self.runs = 0  # hashes started since the server started (each ran to its end)
        self.refused = 0  # logins not checked: over an address's share or the queue's bound

    async def check(self, charged_to: str, key: bytes, work: Callable[[], bool]) -> bool | None:
        """The result of ``work`` (a password's hash and comparison, run in a worker thread), shared
        with every other caller of the same ``key`` while it is queued or running; None when it was
        not checked (``charged_to`` has :attr:`per_address` hashes under way, or :attr:`queued_max`
        wait): the caller refuses the login. Cancelling the wait leaves a hash that someone else
        waits for, or that runs already; a queued one nobody waits for any more is dropped."""
        job = self._by_key.get(key)
        if job is None:
            if self._charged[charged_to] >= self.per_address or self.queued >= self.queued_max:
                self.refused += 1
                return None
            job = _Check(key, charged_to, work)
            self._by_key[key] = job
            self._charged[charged_to] += 1
            queue = self._queues.get(charged_to)
            if queue is None:
                queue = self._queues[charged_to] = deque()
            queue.append(job)
            self.queued += 1
            self._dispatch()
        job.waiters += 1
        try:
            await job.done.wait()
        finally:
            job.waiters -= 1
            if not job.waiters and not job.started:
                self._drop(job)
        return job.result

    def _dispatch(self) -> None:
        """Start the next queued hashes while threads are free: the oldest of the next address in
        turn that has none running."""
        while self.running < self.threads:
            job = self._next()
            if job is None:
                return
            self.queued -= 1
            job.started = True
            self.running += 1
            self._running_at[job.charged_to] += 1
            self.runs += 1
            deliver = functools.partial(self._deliver, trio.lowlevel.current_trio_token(), job)
            trio.lowlevel.start_thread_soon(job.work, deliver, name="kproxy-password-check")

    def _deliver(self, token: trio.lowlevel.TrioToken, job: _Check, result: outcome.Outcome[bool]) -> None:
        """In the worker thread, once the hash ended: its result to the loop."""
        with contextlib.suppress(trio.RunFinishedError):  # the server is gone: nobody waits
            token.run_sync_soon(self._finished, job, result)

    def _next(self) -> _Check | None:
        for address in self._queues:  # the round robin's order
            if self._running_at[address] < self.running_per_address:
                queue = self._queues.pop(address)
                job = queue.popleft()
                if queue:
                    self._queues[address] = queue  # to the back of the round robin
                return job
        return None

    def _finished(self, job: _Check, result: outcome.Outcome[bool]) -> None:
        self.running -= 1
        left = self._running_at[job.charged_to] - 1
        if left > 0:
            self._running_at[job.charged_to] = left
        else:
            del self._running_at[job.charged_to]
        self._uncharge(job)
        try:
            job.result = result.unwrap() is True
        except Exception:
            log.exception("event=password_check_crashed")
            job.result = False
        job.done.set()
        self._dispatch()

    def _drop(self, job: _Check) -> None:
        queue = self._queues.get(job.charged_to)
        if queue is None or job not in queue:
            return
        queue.remove(job)
        if not queue:
            del self._queues[job.charged_to]
        self.queued -= 1
        self._uncharge(job)

    def _uncharge(self, job: _Check) -> None:
        if self._by_key.get(job.key) is job:
            del self._by_key[job.key]
        left = self._charged[job.charged_to] - 1
        if left > 0:
            self._charged[job.charged_to] = left
        else:
            del self._charged[job.charged_to]


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
