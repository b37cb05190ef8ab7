"""Log lines as logfmt (``key=value``): one line per event, greppable, parseable by Loki/Vector."""

from __future__ import annotations

import logging
import sys
import time


def q(text: str) -> str:
    """Quote a logfmt value when it holds spaces, quotes or '='."""
    if text and not any(c in text for c in ' "='):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class LogfmtFormatter(logging.Formatter):
    """``ts=... level=... logger=... <message>``; messages are already ``key=value`` pairs."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        line = f"ts={ts} level={record.levelname.lower()} logger={record.name} {record.getMessage()}"
        if record.exc_info:
            line += " traceback=" + q(self.formatException(record.exc_info))
        return line


class Throttle:
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


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger("kproxy")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
