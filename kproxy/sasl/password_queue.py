"""Which slow PLAIN password hash runs next, and which are not run at all: terminate mode's bounds on
what a client that has not logged in can make kproxy hash (sans-IO: no threads, no clock).

A PLAIN login kproxy has not verified before costs a slow hash (:mod:`kproxy.sasl.credentials`), and
a client that has not logged in yet asks for it: without bounds, anyone who can connect could keep
every core hashing for connections long gone and make real logins wait behind them. So
:class:`PasswordQueue` (one per server) decides for every connection's hashes:

* **at most** ``threads`` **hashes at once**, all connections together: each holds a core;
* **one hash per (user, entry, password) in flight** (:meth:`PasswordQueue.ask`'s ``key``, a keyed
  digest, never the password): the logins that ask for the same one while it is queued or running
  share it and its result (a fleet of clients of one user, started at once);
* **charged per peer address** (an IPv6 address by its /64, what one host is usually given: the
  server's ``charged_to``): an address has at most ``per_address`` hashes queued or running, and
  ``queued_max`` wait in all; a login beyond either is not checked (the caller refuses it, without
  hashing);
* **served in turn**: an address has at most ``running_per_address`` hashes running, so while one
  address floods, another thread is free for the next address's hash, which starts at once; the
  next hash to run is the oldest of the next address in a round robin over the addresses with
  hashes waiting and none running, so a real client's hash waits for at most one hash of each
  other address, however many one of them queued;
* **dropped when nobody waits**: a queued hash whose every waiter left (:meth:`PasswordQueue.left`)
  is taken out of the queue and never runs. A hash already running finishes, still charged to its
  address, and its result is dropped.

The server (kproxy/server/password_checks.py) runs what :meth:`PasswordQueue.next` hands it in
worker threads, reports each end to :meth:`PasswordQueue.finished` and wakes the waiters.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Final

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


class PasswordCheck:
    """One hash: its work, the address charged for it, how many logins wait for its result."""

    __slots__ = ("charged_to", "key", "result", "started", "waiters", "work")

    def __init__(self, key: bytes, charged_to: str, work: Callable[[], bool]) -> None:
        self.key = key
        self.charged_to = charged_to
        self.work = work
        self.waiters = 0
        self.started = False
        self.result = False


class PasswordQueue:
    """Every password hash of one server, queued or running (see the module's docstring)."""

    def __init__(self, threads: int = THREADS, per_address: int = PER_ADDRESS, queued_max: int = QUEUED_MAX,
                 running_per_address: int = RUNNING_PER_ADDRESS) -> None:
        self.threads = threads
        self.per_address = per_address
        self.queued_max = queued_max
        self.running_per_address = running_per_address
        self._by_key: dict[bytes, PasswordCheck] = {}  # queued or running
        # Queued hashes by address; the dict's order is the round robin's (the next served first).
        self._queues: dict[str, deque[PasswordCheck]] = {}
        self._charged: Counter[str] = Counter()  # queued or running, by address
        self._running_at: Counter[str] = Counter()  # running, by address
        self.queued = 0
        self.running = 0
        self.runs = 0  # hashes started since the server started (each ran to its end)
        self.refused = 0  # logins not checked: over an address's share or the queue's bound

    def ask(self, charged_to: str, key: bytes, work: Callable[[], bool]) -> PasswordCheck | None:
        """A login asks for ``work`` (a password's hash and comparison): the check it waits for,
        shared with every other login of the same ``key`` while that is queued or running (its
        :attr:`~PasswordCheck.waiters` counts this one); None when it is not checked
        (``charged_to`` has ``per_address`` hashes under way, or ``queued_max`` wait)."""
        job = self._by_key.get(key)
        if job is None:
            if self._charged[charged_to] >= self.per_address or self.queued >= self.queued_max:
                self.refused += 1
                return None
            job = PasswordCheck(key, charged_to, work)
            self._by_key[key] = job
            self._charged[charged_to] += 1
            queue = self._queues.get(charged_to)
            if queue is None:
                queue = self._queues[charged_to] = deque()
            queue.append(job)
            self.queued += 1
        job.waiters += 1
        return job

    def left(self, job: PasswordCheck) -> None:
        """A login stopped waiting for ``job`` (its result came, or it gave up): a queued check
        nobody waits for any more is dropped, never run."""
        job.waiters -= 1
        if job.waiters or job.started:
            return
        queue = self._queues.get(job.charged_to)
        if queue is None or job not in queue:
            return
        queue.remove(job)
        if not queue:
            del self._queues[job.charged_to]
        self.queued -= 1
        self._uncharge(job)

    def next(self) -> PasswordCheck | None:
        """The next check to start now, marked running (None: no thread is free, or nothing queued
        may run: each address with checks queued has its share running)."""
        if self.running >= self.threads:
            return None
        for address in self._queues:  # the round robin's order
            if self._running_at[address] < self.running_per_address:
                queue = self._queues.pop(address)
                job = queue.popleft()
                if queue:
                    self._queues[address] = queue  # to the back of the round robin
                self.queued -= 1
                job.started = True
                self.running += 1
                self._running_at[address] += 1
                self.runs += 1
                return job
        return None

    def finished(self, job: PasswordCheck, result: bool) -> None:
        """A check that :meth:`next` started ended with ``result`` (False when its work failed)."""
        self.running -= 1
        left = self._running_at[job.charged_to] - 1
        if left > 0:
            self._running_at[job.charged_to] = left
        else:
            del self._running_at[job.charged_to]
        self._uncharge(job)
        job.result = result

    def _uncharge(self, job: PasswordCheck) -> None:
        if self._by_key.get(job.key) is job:
            del self._by_key[job.key]
        left = self._charged[job.charged_to] - 1
        if left > 0:
            self._charged[job.charged_to] = left
        else:
            del self._charged[job.charged_to]
