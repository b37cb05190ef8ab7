"""One direction of a connection with byte-level toxics installed: a queue and the task that
writes it out as its :class:`~kproxy.toxics.WireShaper` says (what to write when).

Installed on the first toxic of a direction (:class:`ToxicWriter`), it takes that direction's
writes in the pumps' place: a write queues the bytes (stamped with the time) and returns at once
unless :data:`QUEUE_BYTES` are already queued, then waits for room (backpressure as before: a
pump that cannot write stops reading). One task writes the queue in order, each piece no earlier
than its due time. Once no toxic of the direction is in force and the queue is empty, the task
gives the direction back its plain writers and ends: the connection pays nothing more for it.

The writing tasks of all connections share one budget of loop time (:class:`WriteBudget`,
WRITE_BUDGET of every BUDGET_WINDOW): once it is spent they sleep until the next window, so
connections without toxics keep their turns however many bytes the toxics cut into writes.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence

import trio

from kproxy.server.fastio import VectorWriter, Writer
from kproxy.toxics import Installed, Owner, Toxic, WireShaper

# Bytes a direction's queue holds before its writers wait: a read's worth (limits.read_size's
# default), so that a pump reading ahead of a slow toxic holds one read, not the stream.
QUEUE_BYTES = 256 * 1024
# A writer that finds its pieces already due yields to the scheduler every this many writes.
YIELD_EVERY = 64
# All toxic writers of the loop together write for at most WRITE_BUDGET seconds of every
# BUDGET_WINDOW; a writer that finds the budget spent sleeps to the window's end (one timer per
# batch of writes). A 1-byte slicer on many connections costs a write per byte: without a bound
# their writes would fill every turn of the loop, and every other connection would wait behind them.
BUDGET_WINDOW = 0.004
WRITE_BUDGET = 0.002

Buffer = bytes | bytearray | memoryview


class WriteBudget:
    """The time the toxic writers of one trio run may spend writing (see WRITE_BUDGET)."""

    __slots__ = ("left", "window_end")

    def __init__(self) -> None:
        self.window_end = 0.0
        self.left = WRITE_BUDGET

    def resume_at(self, now: float) -> float | None:
        """None when a writer may write at ``now``; else when the next window opens."""
        if now >= self.window_end:
            self.window_end = now + BUDGET_WINDOW
            self.left = WRITE_BUDGET
        return None if self.left > 0 else self.window_end


_BUDGET: trio.lowlevel.RunVar[WriteBudget] = trio.lowlevel.RunVar("kproxy_toxic_write_budget")


def write_budget() -> WriteBudget:
    """This trio run's budget (one per loop: the loop is what the connections share)."""
    try:
        return _BUDGET.get()
    except LookupError:
        budget = WriteBudget()
        _BUDGET.set(budget)
        return budget


class ToxicWriter:
    """The writes of one direction, through its toxics (see the module docstring).

    ``write`` and ``writev`` have the pumps' writer signatures; ``restore`` gives the direction back
    its plain writers; ``end(reason)`` ends the connection (a ``limit_data`` cut).
    """

    def __init__(self, shaper: WireShaper, write: Writer, restore: Callable[[], None],
                 end: Callable[[str], None], touch: Callable[[], None]) -> None:
        self.shaper = shaper
        self._raw = write
        self._restore = restore
        self._end = end
        self._touch = touch
        self._queue: deque[tuple[float, Buffer]] = deque()
        self._queued = 0
        self._more = trio.Event()  # set when the queue gets a chunk
        self._room = trio.Event()  # set when the queue falls under QUEUE_BYTES
        self.running = False

    def install(self, owner: Owner, toxic: Toxic, rng: random.Random, nursery: trio.Nursery) -> Installed:
        """Add a toxic (its stage on this connection, returned), starting the writing task if needed."""
        installed = self.shaper.install(owner, toxic, rng)
        if not self.running:
            self.running = True
            nursery.start_soon(self._run)
        return installed

    async def write(self, data: Buffer) -> None:
        if not self.running:  # the task gave the plain writers back while this write was on its way
            await self._raw(bytes(data))
            return
        self._queue.append((trio.current_time(), data))
        self._queued += len(data)
        self._more.set()
        while self._queued > QUEUE_BYTES and self.running:
            self._room = trio.Event()
            await self._room.wait()

    async def writev(self, buffers: Sequence[Buffer]) -> None:
        await self.write(b"".join(buffers))

    async def _run(self) -> None:
        try:
            await self._write_queue()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.running = False
            self._end(f"stream error: {exc!r}")  # as the pumps end on a failed write

    async def _write_queue(self) -> None:
        shaper, queue, raw = self.shaper, self._queue, self._raw
        budget, clock = write_budget(), trio.current_time
        writes = 0
        while True:
            if not queue:
                if not shaper.active or all(not e.owner.in_force() for e in shaper.installed):
                    for e in shaper.installed:
                        e.ended = True
                    shaper.installed.clear()
                    self.running = False
                    self._restore()
                    self._room.set()
                    return
                self._more = trio.Event()
                await self._more.wait()
                continue
            now, data = queue.popleft()
            began = clock()
            for due, piece in shaper.shape(data, now):
                at = clock()
                if due > at:
                    budget.left -= at - began
                    await trio.sleep_until(due)
                    writes, began = 0, clock()
                elif (resume := budget.resume_at(at)) is not None:
                    await trio.sleep_until(resume)
                    writes, began = 0, clock()
                elif writes >= YIELD_EVERY:
                    budget.left -= at - began
                    await trio.lowlevel.checkpoint()
                    writes, began = 0, clock()
                await raw(piece if isinstance(piece, bytes) else bytes(piece))
                writes += 1
                self._touch()
                at = clock()
                budget.left -= at - began
                began = at
            self._queued -= len(data)
            if self._queued <= QUEUE_BYTES:
                self._room.set()
            if shaper.cut is not None:
                self._end(f"{shaper.cut.label}: {shaper.direction.value} bytes reached")
                return


__all__ = ["QUEUE_BYTES", "ToxicWriter", "VectorWriter"]
