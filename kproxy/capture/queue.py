"""The capture's queue: the event loop offers captured exchanges, the writer thread takes them.

One job, per exchange, on the event loop: compiled (pyproject.toml [tool.kproxy.native]), so that
an offer is a native call and a few native operations, not interpreted code.

Contract of :class:`CaptureQueue`: :meth:`~CaptureQueue.offer` never blocks and never raises; a
full queue (``queue_size`` items, or ``queue_bytes`` of frames referenced) drops the item and
counts it (``full``). It does not wake the writer thread per item (a wake per request costs the
loop a GIL hand-over each time): only once the queue is a quarter full, in items or bytes.
:meth:`~CaptureQueue.take` is the writer thread's. The items sit in a deque (append and popleft
are atomic under the GIL); each counter has one writer: the loop's (``offered``, ``full``, the
bytes offered) or the thread's (the bytes taken), so no increment races another.

:func:`stop_draining` ends the thread that takes from a queue (the in-process writer's, the
worker's shipper's: the same life cycle), once it has taken what was offered before.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

log = logging.getLogger("kproxy.capture")


class CaptureQueue:
    """Items between the event loop and the capture's writer thread (see the module docstring)."""

    def __init__(self, queue_size: int, queue_bytes: int, wake: threading.Event) -> None:
        self.queue_size = queue_size
        self.queue_bytes = queue_bytes
        self.wake = wake  # set to wake the writer thread
        self.items: deque[tuple[Any, int]] = deque()
        self._wake_items = max(1, queue_size // 4)
        self._wake_bytes = queue_bytes // 4
        self.offered = 0
        self.full = 0  # dropped by offer(): the queue was full
        self._offered_bytes = 0
        self._taken_bytes = 0

    def offer(self, item: Any, nbytes: int = 0) -> bool:
        """Queue one item (``nbytes``: the frames it holds on to); False (and counted) when full."""
        self.offered += 1
        q = self.items
        held = self._offered_bytes - self._taken_bytes
        if len(q) >= self.queue_size or held + nbytes > self.queue_bytes:
            self.full += 1
            return False
        q.append((item, nbytes))
        self._offered_bytes += nbytes
        if len(q) == self._wake_items or (held > self._wake_bytes and not self.wake.is_set()):
            self.wake.set()
        return True

    def take(self, n: int) -> list[Any]:
        """Up to ``n`` items, oldest first (the writer thread's)."""
        q = self.items
        items = []
        nbytes = 0
        for _ in range(min(n, len(q))):
            item, size = q.popleft()
            items.append(item)
            nbytes += size
        self._taken_bytes += nbytes
        return items

    def __len__(self) -> int:
        return len(self.items)


def stop_draining(thread: threading.Thread, stop: threading.Event, wake: threading.Event, queue: CaptureQueue,
                  timeout: float) -> None:
    """End ``thread``, the one taking from ``queue`` (the writer's or the shipper's): ``stop`` set
    before ``wake``, so that the thread, woken, sees it and takes what was offered before it ends.
    Waits up to ``timeout`` seconds; a thread still running then is logged with what is left."""
    if not thread.is_alive():
        return
    stop.set()
    wake.set()
    thread.join(timeout)
    if thread.is_alive():
        log.warning("event=capture_close_timeout queued=%d", len(queue))
