"""One direction of a connection with byte-level toxics installed: a queue and the task that
writes it out as its :class:`~kproxy.wire_toxics.WireShaper` says (what to write when).

Installed on the first toxic of a direction (:class:`ToxicWriter`), it takes that direction's
writes in the pumps' place: a write queues the bytes (stamped with the time) and returns at once
unless :data:`QUEUE_BYTES` are already queued, then waits for room (backpressure as before: a
pump that cannot write stops reading). One task writes the queue in order, each piece no earlier
than its due time. Once no toxic of the direction is in force and the queue is empty, the task
gives the direction back its plain writers and ends: the connection pays nothing more for it.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence

import trio

from kproxy.server.fastio import VectorWriter, Writer
from kproxy.wire_toxics import Installed, Owner, Toxic, WireShaper

# Bytes a direction's queue holds before its writers wait: a read's worth (limits.read_size's
# default), so that a pump reading ahead of a slow toxic holds one read, not the stream.
QUEUE_BYTES = 256 * 1024
# A writer that finds its pieces already due yields to the scheduler every this many writes.
YIELD_EVERY = 64

Buffer = bytes | bytearray | memoryview


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
            for due, piece in shaper.shape(data, now):
                if due > trio.current_time():
                    await trio.sleep_until(due)
                    writes = 0
                elif writes >= YIELD_EVERY:
                    await trio.lowlevel.checkpoint()
                    writes = 0
                await raw(piece if isinstance(piece, bytes) else bytes(piece))
                writes += 1
                self._touch()
            self._queued -= len(data)
            if self._queued <= QUEUE_BYTES:
                self._room.set()
            if shaper.cut is not None:
                self._end(f"{shaper.cut.label}: {shaper.direction.value} bytes reached")
                return


__all__ = ["QUEUE_BYTES", "ToxicWriter", "VectorWriter"]
