"""Request bodies as JSON, within bounds: what an admin client sends is refused with a 400 before
it can cost the decoder (or the YAML the rule loader renders it to) more than its size.

Python's decoder recurses once per nesting level and converts integers of any length, so
unbounded it fails on 100,000 nested arrays (RecursionError) and on a 5,001-digit number
(ValueError), and a few hundred levels break the rule loader's own recursion. Here:

* nesting is at most :data:`MAX_DEPTH` levels (a rule file needs under ten), and a body holds at
  most :data:`MAX_CONTAINERS` arrays and objects (10,000 rules take ~50,000), checked by a scan
  that stops at the first excess, before anything is decoded: the decoder runs in C holding the
  GIL, and a megabyte of empty arrays would keep every other thread (the trio loop) waiting;
* a number is at most :data:`MAX_NUMBER_CHARS` characters (an int64 needs 20);
* ``NaN`` and ``Infinity`` are refused (they are not JSON: RFC 8259).

A body over :data:`C_DECODE_MAX` is decoded by the standard library's pure-Python scanner: the C
one holds the GIL for the whole document, so a big rule file would keep the trio loop waiting;
the Python one lets the loop in between values (at several times the CPU, in a worker thread).

Pure and thread-safe: the admin server decodes in a worker thread.
"""

from __future__ import annotations

import json
import json.scanner
import re
from typing import Any, NoReturn

from kproxy.admin.book import AdminError, error

MAX_DEPTH = 32
MAX_CONTAINERS = 100_000
MAX_NUMBER_CHARS = 40
C_DECODE_MAX = 64 * 1024

# One step of the scan: a bracket, a quote, an escape, or a run of anything else. Every match is
# short (at most 64 KiB, never backtracking): the regex engine holds the GIL for each call, and one
# call over a megabyte-long string would keep every other thread (the trio loop) waiting.
_TOKEN = re.compile(r'[\[\]{}"]|\\.?|[^\[\]{}"\\]{1,65536}', re.DOTALL)


def decode(body: bytes) -> Any:
    """The JSON value of ``body``; :class:`AdminError` 400 (path ``(body)``) saying what is wrong."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(400, "(body)", f"not JSON: not UTF-8 at byte {exc.start}") from None
    problem = _shape_problem(text)
    if problem:
        raise error(400, "(body)", problem)
    decoder = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=_constant)
    if len(text) > C_DECODE_MAX:
        decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    try:
        return decoder.decode(text)
    except json.JSONDecodeError as exc:
        raise error(400, "(body)", f"not JSON: {exc}") from None


def _shape_problem(text: str) -> str:
    """What is too deep or too many in the brackets outside strings ("" if nothing); whether they
    match is the decoder's business."""
    depth = containers = 0
    in_string = False
    for m in _TOKEN.finditer(text):
        c = m.group()
        if in_string:
            in_string = c != '"'  # an escaped quote is a token of its own: never this one
        elif c == '"':
            in_string = True
        elif c == "[" or c == "{":
            depth += 1
            containers += 1
            if depth > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
            if containers > MAX_CONTAINERS:
                return f"more than {MAX_CONTAINERS} arrays and objects"
        elif c == "]" or c == "}":
            depth -= 1
    return ""


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        _refuse_number(text)
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        _refuse_number(text)
    return float(text)


def _refuse_number(text: str) -> NoReturn:
    raise error(400, "(body)", f"a number of {len(text)} characters ({text[:12]}...): at most {MAX_NUMBER_CHARS}")


def _constant(name: str) -> NoReturn:
    raise error(400, "(body)", f"{name} is not JSON (RFC 8259): write numbers as numbers")


__all__ = ["C_DECODE_MAX", "MAX_CONTAINERS", "MAX_DEPTH", "MAX_NUMBER_CHARS", "AdminError", "decode"]
