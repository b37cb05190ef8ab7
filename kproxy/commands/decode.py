"""``kproxy decode``: Kafka frames, as raw bytes or as a hex dump, to one JSON object per frame.

The pipeline, one function per stage, none of which does I/O:

1. :func:`load_input` turns the bytes as read into an :class:`Input`: the Kafka
   bytes, and for hex input a map from those bytes back to the hex text.
2. :func:`frame_spans` cuts the Kafka bytes into frames (:class:`FrameSpan`), with
   or without 4-byte size prefixes.
3. :class:`FrameDecoder` turns each frame into a JSON-ready dict, remembering the
   requests it has seen so that a later response with the same correlation id
   decodes as that request's response.

:func:`decode_input` chains the three. Everything wrong with the input raises
:class:`InputError` (one line of text, naming a byte offset); nothing else is
raised for bad input.

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

Output (one dict per frame)
---------------------------
``frame`` (index), ``byte_offset`` (where the frame, size prefix included,
starts in the Kafka bytes), ``size`` (bytes after the size prefix),
``direction`` (``"request"``/``"response"``), ``api_key``, ``api_name`` (Kafka's
name, ``"Metadata"``), ``api_version``, ``correlation_id``, ``header_version``,
``client_id`` (requests), ``answers`` (responses: index of the request frame
matched by correlation id, or ``null`` when ``--api-key``/``--api-version``
gave the kind), ``header_tagged_fields`` (when present), then ``body``.

Body values follow :mod:`kproxy.protocol.messages` (snake_case names): uuids as
their canonical string, ``bytes`` fields as lowercase hex, unknown tagged fields
as ``{"tag": hex}``, non-finite floats as ``"NaN"``/``"Infinity"``/``"-Infinity"``.
A ``records`` field becomes ``{"size", "batches", ["truncated_tail"]}``, each batch
summarised from its header (byte offset within the field, magic, codec, offsets,
count, timestamps, producer fields for magic 2, CRC and whether it matches),
with its ``records`` when :attr:`DecodeOptions.records` is set. Record keys,
values and header values are a JSON string when they are printable UTF-8,
``{"hex": "..."}`` otherwise, or ``null``.

An (api key, version) the tables do not know is data, not an error: the frame
gets ``"unknown_api": true``, a ``note`` and ``body_hex`` instead of ``body``.
"""

from __future__ import annotations

import bisect
import math
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from kproxy.protocol.errors import CorruptRecordsError, ProtocolError, UnknownApiError
from kproxy.protocol.frames import Request, decode_request, decode_response
from kproxy.protocol.framing import DEFAULT_MAX_FRAME_SIZE, SIZE_PREFIX, check_frame_size
from kproxy.protocol.headers import RequestHeader, decode_request_header, peek_correlation_id
from kproxy.protocol.messages import Body, codec
from kproxy.protocol.records import (
    BatchInfo,
    Record,
    compute_crc,
    count_records,
    decode_records,
    iter_batches,
)
from kproxy.protocol.schema import Direction, Field
from kproxy.protocol.tables import api_name

__all__ = [
    "DecodeOptions",
    "FrameDecoder",
    "FrameSpan",
    "Input",
    "InputError",
    "decode_input",
    "frame_spans",
    "load_input",
    "parse_hex",
]

InputFormat = Literal["auto", "hex", "raw"]
DirectionChoice = Literal["auto", "request", "response"]
JsonDict = dict[str, Any]


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


@dataclass(frozen=True, slots=True)
class DecodeOptions:
    """What ``kproxy decode`` was asked for; the defaults detect everything.

    ``api_key``/``api_version`` name the kind of responses with no request before
    them in the input; both or neither must be given.
    """

    input_format: InputFormat = "auto"
    size_prefix: bool | None = None  # None: detect; False: the input is one frame without it
    direction: DirectionChoice = "auto"
    api_key: int | None = None
    api_version: int | None = None
    records: bool = False
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE

    def __post_init__(self) -> None:
        if (self.api_key is None) != (self.api_version is None):
            raise ValueError("api_key and api_version go together")


# ---------------------------------------------------------------------------- input


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


# --------------------------------------------------------------------------- frames


@dataclass(frozen=True, slots=True)
class FrameSpan:
    """One frame: ``byte_offset`` is where it starts (its size prefix, if any), ``payload_offset``
    where the bytes after the prefix start; both index the Kafka bytes."""

    index: int
    byte_offset: int
    payload_offset: int
    payload: bytes


def frame_spans(data: bytes, options: DecodeOptions) -> Iterator[FrameSpan]:
    """The frames in ``data``, lazily: an error surfaces when its frame is reached.

    With ``options.size_prefix`` False the whole input is one frame. When it is
    None (detect), the input is size-prefixed frames if the prefixes tile it
    exactly; otherwise it is one frame without a prefix if it decodes as one
    (a known request, or a response whose kind the options give), and else
    size-prefixed frames again, so that the error names the broken prefix.
    """
    if not data:
        raise InputError(0, "empty input")
    whole = FrameSpan(0, 0, 0, data)
    if options.size_prefix is False or (
        options.size_prefix is None and not _tiles(data, options.max_frame_size) and _decodes(whole, options)
    ):
        yield whole
    else:
        yield from _split_frames(data, options.max_frame_size)


def _tiles(data: bytes, max_frame_size: int) -> bool:
    pos = 0
    while len(data) - pos >= 4:
        (size,) = SIZE_PREFIX.unpack_from(data, pos)
        if not 0 <= size <= max_frame_size:
            return False
        pos += 4 + size
    return pos == len(data)


def _decodes(span: FrameSpan, options: DecodeOptions) -> bool:
    try:
        return "body" in FrameDecoder(options).decode(span)
    except InputError:
        return False


def _split_frames(data: bytes, max_frame_size: int) -> Iterator[FrameSpan]:
    pos = 0
    index = 0
    while pos < len(data):
        left = len(data) - pos
        if left < 4:
            raise InputError(pos, f"truncated size prefix: {left} bytes left where a frame's 4-byte size "
                             "should be")
        (size,) = SIZE_PREFIX.unpack_from(data, pos)
        try:
            check_frame_size(size, max_frame_size, offset=pos)
        except ProtocolError as exc:
            raise InputError(pos, exc.reason) from None
        if size > left - 4:
            raise InputError(pos, f"truncated frame: its size prefix announces {size} bytes but only "
                             f"{left - 4} follow (give --no-size if the input has no size prefix)")
        yield FrameSpan(index, pos, pos + 4, data[pos + 4 : pos + 4 + size])
        pos += 4 + size
        index += 1


# -------------------------------------------------------------------------- decoding


@dataclass(frozen=True, slots=True)
class _Kind:
    """The kind of a response: from the request it answers (``request_frame``) or the options."""

    api_key: int
    api_version: int
    request_frame: int | None


class FrameDecoder:
    """Frames to JSON-ready dicts, in input order.

    Keeps the (api key, version) of every request by correlation id; a frame
    whose correlation id matches one, and which is not itself a valid request,
    decodes as that request's response (and the request stops waiting).
    ``decode`` raises :class:`InputError` with offsets into the Kafka bytes.
    """

    def __init__(self, options: DecodeOptions) -> None:
        self._options = options
        self._waiting: dict[int, _Kind] = {}

    def decode(self, span: FrameSpan) -> JsonDict:
        direction = self._options.direction
        if direction == "request":
            return self._request(span)
        if direction == "response":
            return self._response(span, self._response_kind(span))
        return self._either(span)

    def _either(self, span: FrameSpan) -> JsonDict:
        """A valid request; else a response of a known kind; else an unknown-api request; else an error."""
        try:
            request = decode_request(span.payload)
        except ProtocolError as exc:
            return self._not_a_request(span, exc)
        return self._known_request(span, request)

    def _not_a_request(self, span: FrameSpan, failure: ProtocolError) -> JsonDict:
        kind = self._find_kind(span)
        if kind is not None:
            return self._response(span, kind)
        if isinstance(failure, UnknownApiError):
            return self._unknown_request(span)
        raise _neither(span, failure)

    # -- requests ------------------------------------------------------------------
    def _request(self, span: FrameSpan) -> JsonDict:
        try:
            request = decode_request(span.payload)
        except UnknownApiError:
            return self._unknown_request(span)
        except ProtocolError as exc:
            raise _relocate(exc, span) from None
        return self._known_request(span, request)

    def _known_request(self, span: FrameSpan, request: Request) -> JsonDict:
        header = request.header
        out = self._request_head(span, header)
        out["body"] = _BodyWriter(span, header.size, self._options.records).body(
            request.body, header.api_key, header.api_version, Direction.REQUEST)
        return out

    def _unknown_request(self, span: FrameSpan) -> JsonDict:
        try:
            header = decode_request_header(span.payload)
        except ProtocolError as exc:
            raise _relocate(exc, span) from None
        out = self._request_head(span, header)
        out.update(_unknown_body(span.payload[header.size :], header.api_key, header.api_version))
        return out

    def _request_head(self, span: FrameSpan, header: RequestHeader) -> JsonDict:
        """The frame's fields up to the body; the request now waits for its response."""
        self._waiting[header.correlation_id] = _Kind(header.api_key, header.api_version, span.index)
        out = _head(span, "request", header.api_key, header.api_version)
        out.update({"correlation_id": header.correlation_id, "header_version": header.header_version,
                    "client_id": header.client_id})
        if header.tagged_fields:
            out["header_tagged_fields"] = _tags_json(header.tagged_fields)
        return out

    # -- responses -----------------------------------------------------------------
    def _find_kind(self, span: FrameSpan) -> _Kind | None:
        """The kind of response ``span`` would be: its request's, else the options'; None if neither."""
        if len(span.payload) >= 4:
            kind = self._waiting.pop(peek_correlation_id(span.payload), None)
            if kind is not None:
                return kind
        if self._options.api_key is not None and self._options.api_version is not None:
            return _Kind(self._options.api_key, self._options.api_version, None)
        return None

    def _response_kind(self, span: FrameSpan) -> _Kind:
        kind = self._find_kind(span)
        if kind is None:
            what = (f"correlation id {peek_correlation_id(span.payload)}" if len(span.payload) >= 4
                    else "no correlation id")
            raise InputError(span.payload_offset, f"cannot decode response frame {span.index} ({what}): no "
                             "earlier request in the input has its correlation id; give --api-key and "
                             "--api-version")
        return kind

    def _response(self, span: FrameSpan, kind: _Kind) -> JsonDict:
        out = _head(span, "response", kind.api_key, kind.api_version)
        try:
            response = decode_response(span.payload, kind.api_key, kind.api_version)
        except UnknownApiError:
            if len(span.payload) < 4:
                raise InputError(span.payload_offset, f"response frame of {len(span.payload)} bytes has "
                                 "no correlation id") from None
            out.update({"correlation_id": peek_correlation_id(span.payload), "header_version": 0,
                        "answers": kind.request_frame})
            out.update(_unknown_body(span.payload[4:], kind.api_key, kind.api_version))
            return out
        except ProtocolError as exc:
            raise _relocate(exc, span) from None
        header = response.header
        out.update({"correlation_id": header.correlation_id, "header_version": header.header_version,
                    "answers": kind.request_frame})
        if header.tagged_fields:
            out["header_tagged_fields"] = _tags_json(header.tagged_fields)
        out["body"] = _BodyWriter(span, header.size, self._options.records).body(
            response.body, kind.api_key, kind.api_version, Direction.RESPONSE)
        return out


def _head(span: FrameSpan, direction: str, api_key: int, api_version: int) -> JsonDict:
    return {"frame": span.index, "byte_offset": span.byte_offset, "size": len(span.payload),
            "direction": direction, "api_key": api_key, "api_name": api_name(api_key),
            "api_version": api_version}


def _unknown_body(body: bytes, api_key: int, api_version: int) -> JsonDict:
    return {"unknown_api": True,
            "note": f"unknown api: no schema for api key {api_key} version {api_version}; body not decoded",
            "body_hex": body.hex()}


def _tags_json(tags: Mapping[int, bytes]) -> dict[str, str]:
    return {str(tag): bytes(value).hex() for tag, value in tags.items()}


def _relocate(exc: ProtocolError, span: FrameSpan) -> InputError:
    """A codec error (offsets into the payload) as an :class:`InputError` (offsets into the input)."""
    reason = f"{exc.reason} (in {exc.field})" if exc.field else exc.reason
    return InputError(span.payload_offset + (exc.offset or 0), reason)


def _neither(span: FrameSpan, failure: ProtocolError) -> InputError:
    """The request's error, with a hint in case the frame was a response with no kind to decode it."""
    error = _relocate(failure, span)
    if len(span.payload) < 4:
        return error
    hint = (f"; if frame {span.index} is a response (correlation id {peek_correlation_id(span.payload)}), "
            "no earlier request in the input has its correlation id: give --api-key and --api-version")
    return InputError(error.offset, error.reason + hint)


# ------------------------------------------------------------------------ body to JSON


class _BodyWriter:
    """A decoded body as JSON values, walking the schema to find ``records`` fields.

    Records fields hold copies of payload bytes; to name input offsets in their
    errors they are found again in the payload, in wire order, from ``cursor``.
    """

    def __init__(self, span: FrameSpan, body_start: int, with_records: bool) -> None:
        self._span = span
        self._cursor = body_start
        self._with_records = with_records

    def body(self, body: Body, api_key: int, api_version: int, direction: Direction) -> JsonDict:
        found = codec(api_key, api_version, direction)
        assert found is not None  # the body was decoded with it
        return self._struct(body, found.schema.fields, "")

    def _struct(self, value: dict[str, Any], fields: tuple[Field, ...], path: str) -> JsonDict:
        by_name = {f.name: f for f in fields}
        return {name: self._field(item, by_name.get(name), f"{path}{name}") for name, item in value.items()}

    def _field(self, value: Any, field: Field | None, path: str) -> Any:
        if field is None or value is None:
            return _plain(value)
        if field.array:
            return [self._element(item, field, f"{path}[{i}]") for i, item in enumerate(value)]
        return self._element(value, field, path)

    def _element(self, value: Any, field: Field, path: str) -> Any:
        if field.type == "struct" and field.fields is not None:
            return self._struct(value, field.fields, path + ".")
        if field.type == "records" and value is not None:
            return self._records(bytes(value), path)
        return _plain(value)

    def _records(self, data: bytes, path: str) -> JsonDict:
        start = self._span.payload.find(data, self._cursor)
        start = self._cursor if start < 0 else start
        self._cursor = start + len(data)
        try:
            return _records_json(data, self._with_records)
        except CorruptRecordsError as exc:
            field = f"{path}, {exc.field}" if exc.field else path
            offset = self._span.payload_offset + start + (exc.offset or 0)
            raise InputError(offset, f"{exc.reason} (in {field})") from None


def _plain(value: Any) -> Any:
    """A decoded scalar, list or dict as JSON: bytes as hex, uuid as text, dict keys as text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return value


def _records_json(data: bytes, with_records: bool) -> JsonDict:
    """A records field summarised batch by batch; raises CorruptRecordsError (offsets into ``data``)."""
    batches = iter_batches(data)
    out: JsonDict = {"size": len(data), "batches": [_batch_json(batch, with_records) for batch in batches]}
    if batches.truncated_tail:
        out["truncated_tail"] = batches.truncated_tail
    return out


def _batch_json(batch: BatchInfo, with_records: bool) -> JsonDict:
    records = decode_records(batch, check_crc=False) if with_records else None
    count = batch.record_count
    if count is None:
        count = len(records) if records is not None else _wrapper_count(batch)
    out: JsonDict = {
        "byte_offset": batch.offset, "size": batch.length, "magic": batch.magic, "codec": batch.codec_name,
        "base_offset": batch.base_offset, "last_offset": batch.last_offset, "record_count": count,
        "timestamp_type": batch.timestamp_type.name.lower(), "base_timestamp": batch.base_timestamp,
        "max_timestamp": batch.max_timestamp,
    }
    if batch.magic >= 2:
        out.update({
            "partition_leader_epoch": batch.partition_leader_epoch, "producer_id": batch.producer_id,
            "producer_epoch": batch.producer_epoch, "base_sequence": batch.base_sequence,
            "transactional": batch.is_transactional, "control": batch.is_control,
        })
    out["crc"] = f"0x{batch.crc:08x}"
    out["crc_valid"] = compute_crc(batch) == batch.crc
    if records is not None:
        out["records"] = [_record_json(record) for record in records]
    return out


def _wrapper_count(batch: BatchInfo) -> int:
    """Messages inside a compressed legacy wrapper (errors re-based onto the records field)."""
    try:
        return count_records(batch.raw)
    except CorruptRecordsError as exc:
        offset = batch.offset + (exc.offset or 0)
        raise CorruptRecordsError(exc.reason, offset=offset, field=exc.field) from None


def _record_json(record: Record) -> JsonDict:
    return {"offset": record.offset, "timestamp": record.timestamp, "key": _blob(record.key),
            "value": _blob(record.value),
            "headers": [{"key": key, "value": _blob(value)} for key, value in record.headers]}


def _blob(value: bytes | None) -> str | dict[str, str] | None:
    """Record bytes: the text when printable UTF-8 (tabs and newlines allowed), else ``{"hex": ...}``."""
    if value is None:
        return None
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": value.hex()}
    if text.isprintable() or all(c.isprintable() or c in "\t\n\r" for c in text):
        return text
    return {"hex": value.hex()}


# ---------------------------------------------------------------------------- all of it


def decode_input(raw: bytes, options: DecodeOptions) -> Iterator[JsonDict]:
    """Every frame of ``raw`` (the input as read) as a JSON-ready dict, in order.

    Lazy: frames before a broken one are yielded before :class:`InputError`
    is raised for it. For hex input the error names the hex line and column.
    """
    data = load_input(raw, options.input_format)
    decoder = FrameDecoder(options)
    try:
        for span in frame_spans(data.data, options):
            yield decoder.decode(span)
    except InputError as exc:
        raise exc.located(data.where(exc.offset)) from None
