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


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger("kproxy")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
