"""``kproxy decode``: Kafka frames, as raw bytes or as a hex dump, to one JSON object per frame.

The pipeline, one module per stage, none of which does I/O:

1. :func:`kproxy.subcommands.hexdump.load_input` turns the bytes as read into an
   :class:`~kproxy.subcommands.hexdump.Input`: the Kafka bytes, and for hex input a
   map from those bytes back to the hex text (the hex dump formats read are listed there).
2. :func:`kproxy.subcommands.framespans.frame_spans` cuts the Kafka bytes into frames
   (:class:`~kproxy.subcommands.framespans.FrameSpan`), with or without 4-byte size prefixes.
3. :class:`FrameDecoder` (here) turns each frame into a JSON-ready dict, remembering the
   requests it has seen so that a later response with the same correlation id
   decodes as that request's response.

:func:`decode_input` chains the three. Everything wrong with the input raises
:class:`~kproxy.subcommands.hexdump.InputError` (one line of text, naming a byte
offset); nothing else is raised for bad input.

Output (one dict per frame)
---------------------------
``frame`` (index), ``byte_offset`` (where the frame, size prefix included,
starts in the Kafka bytes), ``size`` (bytes after the size prefix),
``direction`` (``"request"``/``"response"``), ``api_key``, ``api_name`` (as metrics,
rules and logs spell it: ``"metadata"``, ``"find_coordinator"``), ``api_version``,
``correlation_id``, ``header_version``,
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

Requests are read as leniently as brokers read them: bytes after a whole request
body (real librdkafka sends some, e.g. Metadata v12 with 3) are not an error when
nothing else explains the frame; the request gets ``"trailing_bytes": {"byte_offset",
"size", "hex"}`` (``byte_offset`` indexes the Kafka bytes).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kproxy.protocol.codes import api_snake_name
from kproxy.protocol.errors import CorruptRecordsError, ProtocolError, UnknownApiError
from kproxy.protocol.framing import DEFAULT_MAX_FRAME_SIZE
from kproxy.protocol.headers import RequestHeader, decode_request_header, peek_correlation_id
from kproxy.protocol.message_schemas import Field, MessageType
from kproxy.protocol.messages import Body, codec
from kproxy.protocol.payloads import Request, decode_request, decode_response
from kproxy.protocol.records import (
    BatchInfo,
    Record,
    compute_crc,
    count_records,
    decode_records,
    iter_batches,
)
from kproxy.subcommands.framespans import FrameSpan, frame_spans
from kproxy.subcommands.hexdump import InputError, InputFormat, load_input

__all__ = ["DecodeOptions", "FrameDecoder", "decode_input"]

DirectionChoice = Literal["auto", "request", "response"]
JsonDict = dict[str, Any]


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


# -------------------------------------------------------------------------- decoding


def _decodes(span: FrameSpan, options: DecodeOptions) -> bool:
    """Whether ``span`` decodes as one frame (how :func:`frame_spans` tells a frame without a size prefix)."""
    try:
        return "body" in FrameDecoder(options).decode(span)
    except InputError:
        return False


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
        """A valid request; else a response of a known kind; else a request with bytes after its body;
        else an unknown-api request; else an error."""
        try:
            request = decode_request(span.payload)
        except ProtocolError as exc:
            return self._not_a_request(span, exc)
        return self._known_request(span, request)

    def _not_a_request(self, span: FrameSpan, failure: ProtocolError) -> JsonDict:
        kind = self._find_kind(span)
        if kind is not None:
            return self._response(span, kind)
        lenient = self._request_with_trailing_bytes(span)
        if lenient is not None:
            return lenient
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
            lenient = self._request_with_trailing_bytes(span)
            if lenient is None:
                raise _relocate(exc, span) from None
            return lenient
        return self._known_request(span, request)

    def _request_with_trailing_bytes(self, span: FrameSpan) -> JsonDict | None:
        """The frame as a known request whose body ends before the frame does, with the bytes
        after it; None when it is not one (a body that does not parse, or no bytes after it)."""
        payload = span.payload
        try:
            header = decode_request_header(payload)
            c = codec(header.api_key, header.api_version, MessageType.REQUEST)
            if c is None:
                return None
            end = c.skip(payload, header.size)
            if end >= len(payload):
                return None
            request = Request(header, c.decode(payload[:end], header.size))
        except ProtocolError:
            return None
        out = self._known_request(span, request)
        out["trailing_bytes"] = {"byte_offset": span.payload_offset + end, "size": len(payload) - end,
                                 "hex": payload[end:].hex()}
        return out

    def _known_request(self, span: FrameSpan, request: Request) -> JsonDict:
        header = request.header
        out = self._request_head(span, header)
        out["body"] = _BodyWriter(span, header.size, self._options.records).body(
            request.body, header.api_key, header.api_version, MessageType.REQUEST)
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
            response.body, kind.api_key, kind.api_version, MessageType.RESPONSE)
        return out


def _head(span: FrameSpan, direction: str, api_key: int, api_version: int) -> JsonDict:
    return {"frame": span.index, "byte_offset": span.byte_offset, "size": len(span.payload),
            "direction": direction, "api_key": api_key, "api_name": api_snake_name(api_key),
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

    def body(self, body: Body, api_key: int, api_version: int, direction: MessageType) -> JsonDict:
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
        for span in frame_spans(data.data, options.size_prefix, options.max_frame_size,
                                lambda whole: _decodes(whole, options)):
            yield decoder.decode(span)
    except InputError as exc:
        raise exc.located(data.where(exc.offset)) from None
