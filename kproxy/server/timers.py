"""One task for every connection's deadlines, instead of a watchdog task per connection.

Each connection has a few deadlines (kproxy/server/connection.py: its idle timeout, its request
frame's timeout, the time its session asked to be called back at) and needs waking at the nearest
one. A task per connection sleeping until then costs a task (its memory, a start per connection) and
a cancel scope; :class:`Deadlines` is one task and one heap for all of them.

Contract: a :class:`Timed` object (a connection) says when it next wants :meth:`Timed.on_deadline`
called by :meth:`Deadlines.schedule` (which moves its one live entry: an earlier or later time
replaces the one before); ``on_deadline(now)`` runs on the timer's task, must not block (it may
cancel scopes, start tasks) and schedules again if it still needs a deadline. An object that ends
calls :meth:`Deadlines.forget`: its entries are never acted on again, and are dropped from the heap
well before they come due (a closed connection must not be kept alive for its idle timeout).

Entries are never removed from the heap when replaced (a heap has no cheap removal): a replaced
entry is recognised when it comes up (its time is not the object's ``timer_due``) and skipped; the
heap is rebuilt without them whenever they outnumber the live ones, so it stays within about twice
the number of live objects. Times are trio's clock.
"""

from __future__ import annotations

import heapq
import math
from typing import Protocol

import trio

# The heap is rebuilt without replaced and forgotten entries once it holds more than this many
# entries besides twice the live objects (a small floor: rebuilding a short heap is not worth it).
COMPACT_SLACK = 64


class Timed(Protocol):
    """What :class:`Deadlines` keeps a time for (a connection)."""

    timer_due: float  # the time of its live entry (math.inf: none)

    def on_deadline(self, now: float) -> None: ...


class Deadlines:
    """The deadlines of many :class:`Timed` objects, kept by one task (:meth:`run`)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timed]] = []
        self._seq = 0  # ties broken by insertion order (objects are not comparable)
        self._live: set[int] = set()  # ids of the objects that have a live entry
        self._sleep: trio.CancelScope | None = None  # the task's current sleep (its deadline: the heap's top)

    def __len__(self) -> int:
        """Entries in the heap, replaced ones included (bounded: see the module docstring)."""
        return len(self._heap)

    def schedule(self, timed: Timed, when: float) -> None:
        """Call ``timed.on_deadline`` at ``when`` (or soon after), instead of any time asked before."""
        timed.timer_due = when
        self._live.add(id(timed))
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, timed))
        sleep = self._sleep
        if sleep is not None and when < sleep.deadline:
            sleep.deadline = when
        if len(self._heap) > 2 * len(self._live) + COMPACT_SLACK:
            self._compact()

    def forget(self, timed: Timed) -> None:
        """``timed`` needs no more deadlines (it ended): its entries are skipped, then dropped."""
        timed.timer_due = math.inf
        self._live.discard(id(timed))
        if len(self._heap) > 2 * len(self._live) + COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        self._heap[:] = [entry for entry in self._heap if entry[2].timer_due == entry[0]]
        heapq.heapify(self._heap)

    async def run(self) -> None:
        """Wake each object at its time, for as long as the task runs (cancel it to stop)."""
        while True:
            now = trio.current_time()
            heap = self._heap  # compacted in place: the same list throughout
            while heap and heap[0][0] <= now:
                when, _, timed = heapq.heappop(heap)
                if timed.timer_due != when:
                    continue  # replaced by a later schedule, or forgotten
                timed.timer_due = math.inf
                self._live.discard(id(timed))
                timed.on_deadline(now)  # schedules again if it still needs to
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as self._sleep:
                await trio.sleep_forever()
            self._sleep = None
