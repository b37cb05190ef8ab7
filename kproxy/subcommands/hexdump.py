"""The input of ``kproxy decode``: raw Kafka bytes, or a hex dump of them, with offsets traced back.

:func:`load_input` turns the bytes as read into an :class:`Input` (the Kafka bytes,
and for hex input a map from those bytes back to the hex text); every problem is
an :class:`InputError`, the one error type of ``kproxy decode``.

Hex input
---------
Accepted as tcpdump (``-x``, ``-X``), Wireshark ("Copy as Hex Dump", the packet
bytes pane, "hex stream"), ``xxd`` and ``hexdump -C`` print it:

* an offset column is dropped: ``0x0000:`` / ``00000000:`` (with a colon) always;
  a bare ``0000`` (Wireshark, ``hexdump -C``) when every line starts with one,
  followed by two or more spaces, and the values count the bytes before them
  (restarting at 0 for a new packet is allowed);
* hex digits come in groups of any even width (``00``, ``0003``, ``00000012``, a
  whole frame in one word), optionally ``0x``-prefixed (``0x00 0x03``) and
  followed by a comma;
* an ASCII column at the right of a line is dropped when it is separated by two
  or more spaces (or a tab) and renders the line's bytes (``.`` standing for any
  byte; ``hexdump -C``'s ``|...|`` too);
* whitespace and newlines may be anywhere between groups; lines whose first
  non-blank character is ``#`` are comments.

Anything else is an error naming its line and column. Link, IP and TCP headers
are not stripped: give the Kafka bytes only.

Byte offsets in errors count bytes of the input as read, except that for hex
input they count the *decoded* bytes (with the hex line and column added in
parentheses); errors in the hex text itself count characters of the text.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = ["Input", "InputError", "InputFormat", "load_input", "looks_like_text", "parse_hex"]

InputFormat = Literal["auto", "hex", "raw"]


class InputError(Exception):
    """Input that ``kproxy decode`` cannot read: ``str()`` is the one-line message.

    ``offset`` is a byte offset into the input (see the module docstring for what
    it counts), ``reason`` what was wrong, ``where`` an optional place in the hex
    text such as ``" (hex line 3, column 12)"``.
    """

    def __init__(self, offset: int, reason: str, where: str = "") -> None:
        self.offset = offset
        self.reason = reason
        self.where = where
        super().__init__(f"error at byte {offset}{where}: {reason}")

    def located(self, where: str) -> InputError:
        """The same error with ``where`` filled in (kept if it already was)."""
        return self if self.where else InputError(self.offset, self.reason, where)



class _Token(NamedTuple):
    """One whitespace-separated word of hex text (a NamedTuple: dumps have millions)."""

    text: str
    char_offset: int  # in the whole text
    line: int
    column: int  # 1-based
    spaced: bool  # preceded by two or more blanks or a tab: may start an ASCII column


@dataclass(frozen=True, slots=True)
class Input:
    """The Kafka bytes to decode and, for hex input, the hex groups they came from.

    ``groups[i]`` is the word of text holding the bytes from ``group_starts[i]``
    on; both are empty for raw input.
    """

    data: bytes
    group_starts: tuple[int, ...] = ()
    groups: tuple[_Token, ...] = ()

    def where(self, offset: int) -> str:
        """``" (hex line L, column C)"`` for the digits of byte ``offset``; ``""`` for raw input."""
        if not self.groups:
            return ""
        if offset >= len(self.data):
            return " (end of the hex input)"
        index = bisect.bisect_right(self.group_starts, offset) - 1
        token = self.groups[index]
        prefix = 2 if token.text[:2] in ("0x", "0X") else 0
        column = token.column + prefix + 2 * (offset - self.group_starts[index])
        return f" (hex line {token.line}, column {column})"


_TEXT_BYTES = bytes(range(0x20, 0x7F)) + b"\t\n\r\x0b\x0c"


def looks_like_text(raw: bytes) -> bool:
    """Whether ``raw`` is printable ASCII and whitespace only: what auto-detection calls hex.

    A size-prefixed frame never is (its first byte would announce 150 MB or
    more), nor is a request without one (its api key starts with a zero byte).
    """
    return bool(raw) and not raw.translate(None, _TEXT_BYTES)


def load_input(raw: bytes, input_format: InputFormat = "auto") -> Input:
    """The Kafka bytes in ``raw``: hex-decoded for ``"hex"``, as-is for ``"raw"``.

    ``"auto"`` means hex when :func:`looks_like_text`. Raises :class:`InputError`
    for empty input and for hex that does not parse.
    """
    if not raw or (input_format != "raw" and not raw.strip()):
        raise InputError(0, "empty input")
    if input_format == "raw" or (input_format == "auto" and not looks_like_text(raw)):
        return Input(bytes(raw))
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise InputError(exc.start, f"bad hex input: byte 0x{raw[exc.start]:02x} is not text") from None
    return parse_hex(text)


# ------------------------------------------------------------------------ hex text

_TOKEN = re.compile(r"\S+")
_HEX_GROUP = re.compile(r"(0[xX])?([0-9a-fA-F]+),?")
_COLON_OFFSET = re.compile(r"(?:0[xX])?([0-9a-fA-F]+):")
_BARE_OFFSET = re.compile(r"[0-9a-fA-F]{4,}")


@dataclass(frozen=True, slots=True)
class _Line:
    number: int
    text: str
    start: int  # char offset of the line in the whole text
    tokens: tuple[_Token, ...]


@dataclass(frozen=True, slots=True)
class _ParsedLine:
    offset: int | None  # value of the offset column, when one was dropped
    tokens: tuple[_Token, ...]  # the hex groups, offset and ASCII columns dropped
    groups: list[bytes]  # their bytes

    @property
    def size(self) -> int:
        return sum(map(len, self.groups))


def parse_hex(text: str) -> Input:
    """Decode a hex dump (formats in the module docstring) into an :class:`Input`.

    Raises :class:`InputError` naming the character offset, line and column of
    the first group that is not hex, or offset 0 when there are no hex digits.
    """
    lines = _tokenize(text)
    parsed = _parse_with_bare_offsets(lines)
    if parsed is None:
        parsed = [_parse_line(line, strip_bare_offset=False) for line in lines]
    starts: list[int] = []
    tokens: list[_Token] = []
    position = 0
    for line in parsed:
        for token, group in zip(line.tokens, line.groups, strict=True):
            if group:
                starts.append(position)
                tokens.append(token)
                position += len(group)
    data = b"".join(group for line in parsed for group in line.groups)
    if not data:
        raise InputError(0, "no hex digits in the input")
    return Input(data, tuple(starts), tuple(tokens))


def _tokenize(text: str) -> list[_Line]:
    """Non-blank, non-comment lines, split into whitespace-separated tokens."""
    lines = []
    start = 0
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        body = line.rstrip("\r\n")
        if body.strip() and not body.lstrip().startswith("#"):
            lines.append(_Line(number, body, start, _line_tokens(body, start, number)))
        start += len(line)
    return lines


def _line_tokens(body: str, start: int, number: int) -> tuple[_Token, ...]:
    tokens = []
    previous_end = 0
    for match in _TOKEN.finditer(body):
        gap = body[previous_end : match.start()]
        spaced = len(gap) >= 2 or "\t" in gap
        tokens.append(_Token(match.group(), start + match.start(), number, match.start() + 1, spaced))
        previous_end = match.end()
    return tuple(tokens)


def _parse_with_bare_offsets(lines: list[_Line]) -> list[_ParsedLine] | None:
    """The lines parsed with a leading bare offset column dropped, if they have one; else None."""
    if not all(_has_bare_offset_candidate(line) for line in lines):
        return None
    try:
        parsed = [_parse_line(line, strip_bare_offset=True) for line in lines]
    except InputError:
        return None
    return parsed if _offsets_count_bytes(parsed) else None


def _has_bare_offset_candidate(line: _Line) -> bool:
    tokens = line.tokens
    if _COLON_OFFSET.fullmatch(tokens[0].text):
        return True
    if not _BARE_OFFSET.fullmatch(tokens[0].text):
        return False
    return len(tokens) == 1 or tokens[1].spaced


def _offsets_count_bytes(parsed: list[_ParsedLine]) -> bool:
    """Whether every line's offset equals the bytes before it (0 may restart a packet)."""
    count = 0
    for line in parsed:
        if line.offset is None:
            return False
        if line.offset != count:
            if line.offset != 0:
                return False
            count = 0
        count += line.size
    return any(line.size for line in parsed)


def _parse_line(line: _Line, *, strip_bare_offset: bool) -> _ParsedLine:
    """One line's hex groups, its offset column and ASCII column dropped."""
    tokens = line.tokens
    offset: int | None = None
    match = _COLON_OFFSET.fullmatch(tokens[0].text)
    if match is None and strip_bare_offset:
        match = _BARE_OFFSET.fullmatch(tokens[0].text)
    if match is not None:
        offset = int(match.group(match.lastindex or 0), 16)
        tokens = tokens[1:]
    groups = [_group_bytes(token) for token in tokens]
    end = _ascii_column_start(line, tokens, groups)
    checked: list[bytes] = []
    for token, group in zip(tokens[:end], groups, strict=False):
        if group is None:
            raise _not_hex(token)
        checked.append(group)
    return _ParsedLine(offset, tokens[:end], checked)


def _group_bytes(token: _Token) -> bytes | None:
    """The bytes a hex group spells, or None when it is not one (odd digit counts included)."""
    match = _HEX_GROUP.fullmatch(token.text)
    if match is None or len(match.group(2)) % 2:
        return None
    return bytes.fromhex(match.group(2))


def _not_hex(token: _Token) -> InputError:
    match = _HEX_GROUP.fullmatch(token.text)
    what = "has an odd number of hex digits" if match is not None else "is not hex"
    return InputError(token.char_offset, f"bad hex input: {_short(token.text)} {what}",
                      f" (line {token.line}, column {token.column})")


def _short(text: str) -> str:
    return repr(text if len(text) <= 20 else text[:17] + "...")


def _ascii_column_start(line: _Line, tokens: tuple[_Token, ...], groups: list[bytes | None]) -> int:
    """How many of ``tokens`` are hex groups: those before an ASCII column, or all of them."""
    before: list[bytes] = []
    size = 0
    # An ASCII column may start at any token after the first, even one that looks like hex.
    for index in range(1, len(tokens)):
        previous = groups[index - 1]
        if previous is None:
            break
        before.append(previous)
        size += len(previous)
        token = tokens[index]
        if not token.spaced:
            continue
        rest = line.text[token.char_offset - line.start :].strip()
        if len(rest) <= size + 2 and _renders(rest, b"".join(before)):  # cheap test first
            return index
    return len(tokens)


def _renders(text: str, data: bytes) -> bool:
    """Whether ``text`` is an ASCII rendering of ``data`` (``.`` matching any byte).

    Blanks at either end of ``text`` may have been lost to the column separator
    or the line end, so ``data`` may lose its outer spaces too; ``|...|`` is the
    ``hexdump -C`` form.
    """
    if len(text) >= 2 and text[0] == text[-1] == "|":
        return _same_rendering(text[1:-1], data)
    candidates = {data, data.strip(b" "), data.lstrip(b" "), data.rstrip(b" ")}
    return any(_same_rendering(text, candidate) for candidate in candidates)


def _same_rendering(text: str, data: bytes) -> bool:
    return len(text) == len(data) and all(c == "." or ord(c) == b for c, b in zip(text, data, strict=True))
