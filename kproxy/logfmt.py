"""Log lines as logfmt (``key=value``) or JSON: one line per event, greppable, parseable by Loki/Vector.

Code logs logfmt messages (``event=connection_closed peer=... reason=...``) whatever the output
format; :class:`JsonFormatter` turns each into one JSON object with the same keys, so a field has
one name in both formats, and with JSON types: a count or a duration is a JSON number, a flag a
JSON boolean, as log pipelines (Loki, Elasticsearch, Datadog) map and compare them.
"""

from __future__ import annotations

import json
import logging
import re
import reprlib
import sys
import time
from contextvars import ContextVar


def q(text: str) -> str:
    """A logfmt value: as it is, or quoted when it is empty or holds spaces, quotes, '=' or any
    character that is not printable.

    Inside quotes, a backslash and a quote are escaped with a backslash, and every character
    Python does not call printable (line breaks of any kind - ``\\n``, ``\\r``, U+2028 - tabs,
    other control and format characters: terminal escapes among them) is written as an escape
    (``\\n``, ``\\r``, ``\\t``, ``\\xNN``, ``\\uNNNN``, ``\\UNNNNNNNN``): whatever a client sends
    (its client id, say), the line stays one line and its pairs stay apart.
    :func:`parse_logfmt` reverses it.
    """
    if text and text.isprintable() and not any(c in text for c in ' "='):
        return text
    return '"' + _UNSAFE.sub(_escape, text) + '"'


# In a quoted value: the backslash, the quote and anything outside printable ASCII (sorted out by _escape).
_UNSAFE = re.compile(r'[\\"]|[^\x20-\x7e]')
_NAMED = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    named = _NAMED.get(c)
    if named is not None:
        return named
    if c.isprintable():
        return c  # printable beyond ASCII (an accent, a CJK character): kept as it is
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


_UNESCAPE = re.compile(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|.)", re.DOTALL)
_UNNAMED = {"n": "\n", "r": "\r", "t": "\t"}


def _unescape(m: re.Match[str]) -> str:
    seq = m.group(1)
    if len(seq) > 1:
        return chr(int(seq[1:], 16))
    return _UNNAMED.get(seq, seq)


def clip(text: str, limit: int = 256) -> str:
    """``text`` cut to ``limit`` characters, marked with its full length when cut: a value a client
    chose (a client id is up to 32767 bytes) must not make every line about it that long."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[{len(text)} chars]"


EXCERPT_CHARS = 200
_EXCERPT = reprlib.Repr()
_EXCERPT.maxlevel = 3
_EXCERPT.maxlist = _EXCERPT.maxtuple = _EXCERPT.maxset = _EXCERPT.maxfrozenset = _EXCERPT.maxdeque = 8
_EXCERPT.maxdict = 6
_EXCERPT.maxstring = _EXCERPT.maxother = EXCERPT_CHARS
_EXCERPT.maxlong = 60


def excerpt(value: object, limit: int = EXCERPT_CHARS, *, quoted: bool = True) -> str:
    """``value`` as a message quotes it: its repr (``quoted``; else its text), at most ``limit``
    characters, cut with ``...``. A value read from a file or sent by a client may be of any size:
    the repr of a long or deep list, dict or string is built only as far as it is shown
    (:mod:`reprlib`), never in full."""
    try:
        text = _EXCERPT.repr(value) if quoted else str(value)[:limit + 1]
    except ValueError:  # an int past Python's digits limit for text (YAML reads 5,000 digits as one)
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


# The cluster whose work the running task does, when kproxy serves several (each cluster's tasks set
# it: a task inherits its starter's): every line logged in it says ``cluster=NAME`` after ``logger``.
LOG_CLUSTER: ContextVar[str | None] = ContextVar("kproxy_log_cluster", default=None)


class LogfmtFormatter(logging.Formatter):
    """``ts=... level=... logger=... [cluster=...] <message>``; messages are already ``key=value`` pairs."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        cluster = LOG_CLUSTER.get()
        line = f"ts={ts} level={record.levelname.lower()} logger={record.name} " + (
            f"cluster={q(cluster)} " if cluster is not None else "") + record.getMessage()
        if record.exc_info:
            line += " traceback=" + q(self.formatException(record.exc_info))
        return line


_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')


def parse_logfmt(message: str) -> dict[str, str]:
    """The ``key=value`` pairs of a logfmt message (quoted values unquoted, as :func:`q` quoted them).

    Text that is not a pair is kept under ``msg`` rather than lost.
    """
    out: dict[str, str] = {}
    rest: list[str] = []
    pos = 0
    for m in _PAIR.finditer(message):
        if message[pos:m.start()].strip():
            rest.append(message[pos:m.start()].strip())
        key, value = m.group(1), m.group(2)
        if value.startswith('"') and value.endswith('"') and len(value) >= 2:
            value = _UNESCAPE.sub(_unescape, value[1:-1])
        out[key] = value
        pos = m.end()
    if message[pos:].strip():
        rest.append(message[pos:].strip())
    if rest:
        out["msg"] = " ".join(rest)
    return out


# Keys whose values are names someone chose (a client id, a rule id, a topic) or lists, never
# numbers whatever they look like: a client id "42" stays the string "42", so that a field has one
# JSON type in every line (a pipeline maps a field's type from the first value it sees, and refuses
# lines that disagree later). node_id is "bootstrap" or a broker's id, as the metrics' label.
STRING_KEYS = frozenset({
    "client_id", "principal", "rule", "topic", "partition", "node_id", "peer", "connection", "listener",
    "upstream", "address", "advertised_host", "detail", "reason", "msg", "where", "file", "path", "option",
})
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)\.[0-9]+(?:[eE][-+]?[0-9]+)?")


def typed(key: str, value: str) -> str | int | float | bool:
    """A logfmt value as JSON should carry it: ``135`` an int, ``0.003`` a float, ``true`` and
    ``false`` booleans, anything else (and every value of :data:`STRING_KEYS`) the string itself.
    A number written with leading zeros (``007``) stays a string: it would not read back as written."""
    if key in STRING_KEYS:
        return value
    if value == "true":
        return True
    if value == "false":
        return False
    if _INT.fullmatch(value):
        return int(value)
    if _FLOAT.fullmatch(value):
        return float(value)
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, then the message's own keys, their
    values typed by :func:`typed`."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        entry: dict[str, str | int | float | bool] = {"ts": ts, "level": record.levelname.lower(),
                                                      "logger": record.name}
        cluster = LOG_CLUSTER.get()
        if cluster is not None:
            entry["cluster"] = cluster
        for key, value in parse_logfmt(record.getMessage()).items():
            entry.setdefault(key, typed(key, value))  # ts/level/logger are the record's own
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        # JSON escapes only U+0000..U+001F itself: line breaks beyond them (U+0085, U+2028, U+2029) and
        # other characters that are not printable are escaped here, so a line stays one line.
        return _UNSAFE_JSON.sub(_json_escape, json.dumps(entry, ensure_ascii=False))


_UNSAFE_JSON = re.compile(r"[^\x20-\x7e]")


def _json_escape(m: re.Match[str]) -> str:
    c = m.group()
    if c.isprintable():
        return c
    code = ord(c)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON writes characters beyond the BMP
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def setup_logging(level: str, fmt: str = "logfmt") -> None:
    """kproxy's loggers to stderr at ``level``, as ``fmt`` (``logfmt`` or ``json``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger("kproxy")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
