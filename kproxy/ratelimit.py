"""Rate-limited log lines, for events that can repeat thousands of times a second.

Stands alone (the standard library only) so that every layer that logs from a hot or
failing path can use it: the server (accept failing), the capture's writer thread (a disk
failing), the record readers (frames over their budget).
"""

from __future__ import annotations

import time


class LogRateLimit:
    """At most one log line per ``interval`` seconds for an event that can repeat thousands of
    times a second (accept failing while descriptors are exhausted, say).

    Call :meth:`due` at every occurrence: it returns how many occurrences the line to log now
    stands for (this one and those held back since the last line), or None while the interval
    runs. The first occurrence is always logged at once.
    """

    __slots__ = ("_held", "_next", "interval")

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._next = 0.0
        self._held = 0

    def due(self) -> int | None:
        self._held += 1
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.interval
        count, self._held = self._held, 0
        return count
