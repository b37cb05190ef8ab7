"""Decode and encode message bodies of every API key and version in the tables.

A decoded body is a plain ``dict`` keyed by Kafka's field names in snake_case
(``throttle_time_ms``, ``brokers``...); nested structs are dicts, arrays are
lists, ``uuid`` fields are :class:`uuid.UUID`, ``bytes`` and ``records`` fields
are ``bytes`` (records stay undecoded: see :mod:`kproxy.protocol.records`).
Tagged fields appear only when they were on the wire; unknown ones are kept
under ``"_unknown_tags"``. The contract that makes a proxy safe:

    encode_body(k, v, d, decode_body(k, v, d, data)) == data

for every byte string that decodes. Dicts, not dataclasses, because the codec
must serve ~700 (api, version, direction) layouts with generated code and stay
fast on responses of 100,000 partitions; :func:`default_body` builds a
complete value to edit when a rule needs a fresh message.
"""

from __future__ import annotations

import struct
import threading
import uuid
from typing import Any

from kproxy.protocol.codegen import CompiledSchema, FieldFunctions, SchemaCompiler
from kproxy.protocol.errors import DecodeError, EncodeError, UnknownApiError
from kproxy.protocol.message_schemas import Field, MessageSchema, MessageType, message_schema
from kproxy.protocol.primitives import Malformed

Body = dict[str, Any]
# What a bug-free generated decoder can still raise on hostile bytes.
_DECODE_FAILURES = (Malformed, struct.error, IndexError, ValueError, OverflowError, RecursionError)
_ENCODE_FAILURES = (struct.error, KeyError, TypeError, AttributeError, ValueError, OverflowError,
                    IndexError)


class MessageCodec:
    """The compiled functions of one (api key, version, direction).

    Get one from :func:`codec`; instances are immutable and shared.
    """

    __slots__ = ("_fast", "_lock", "_traced", "schema")

    def __init__(self, schema: MessageSchema) -> None:
        self.schema = schema
        self._fast = SchemaCompiler(schema, traced=False).build()
        self._traced: CompiledSchema | None = None
        self._lock = threading.Lock()

    def _diagnostics(self) -> CompiledSchema:
        with self._lock:
            if self._traced is None:
                self._traced = SchemaCompiler(self.schema, traced=True).build()
            return self._traced

    # -- whole bodies ----------------------------------------------------------------
    def decode(self, data: bytes, offset: int = 0) -> Body:
        """Decode a whole body occupying ``data[offset:]``.

        Raises :class:`DecodeError` naming the byte offset (relative to ``data``)
        and field path of the first problem, including trailing bytes.
        """
        data = bytes(data)
        try:
            body, end = self._fast.decode(data, offset)
        except _DECODE_FAILURES:
            self._explain_decode(data, offset)
            raise AssertionError("unreachable") from None
        if end != len(data):
            raise DecodeError(f"{len(data) - end} bytes left over after the {self.schema.name} "
                              f"v{self.schema.api_version} body", offset=end)
        return body  # type: ignore[no-any-return]

    def _explain_decode(self, data: bytes, offset: int) -> None:
        trace: list[Any] = [offset, ""]
        label = f"{self.schema.name} v{self.schema.api_version}"
        try:
            self._diagnostics().decode(data, offset, trace, "")
        except _DECODE_FAILURES as exc:
            raise DecodeError(_describe(exc, label), offset=trace[0],
                              field=trace[1].lstrip(".") or None) from None
        # The fast build failed where the traced one did not: a codegen bug. Say so.
        raise DecodeError(f"internal codec inconsistency decoding {label}", offset=offset)

    def encode(self, body: Body) -> bytes:
        """Encode a body; raises :class:`EncodeError` naming the offending field."""
        out = bytearray()
        try:
            self._fast.encode(out, body)
        except _ENCODE_FAILURES:
            self._explain_encode(body)
        return bytes(out)

    def encode_into(self, out: bytearray, body: Body) -> None:
        """Append the body's encoding to ``out`` (saves a copy when framing)."""
        mark = len(out)
        try:
            self._fast.encode(out, body)
        except _ENCODE_FAILURES:
            del out[mark:]
            self._explain_encode(body)

    def _explain_encode(self, body: Body) -> None:
        trace: list[Any] = [0, ""]
        label = f"{self.schema.name} v{self.schema.api_version}"
        try:
            self._diagnostics().encode(bytearray(), body, trace, "")
        except _ENCODE_FAILURES as exc:
            what = f"missing field {exc.args[0]!r}" if isinstance(exc, KeyError) else _describe(exc, label)
            raise EncodeError(f"cannot encode {label}: {what}", field=trace[1].lstrip(".") or None) from None
        raise EncodeError(f"internal codec inconsistency encoding {label}")

    # -- single top-level fields (the splice path) -------------------------------------
    def field_functions(self, name: str) -> FieldFunctions:
        """(decode, encode, skip) of one top-level field's value; KeyError if absent."""
        return self._fast.fields[name]

    def skip(self, data: bytes, offset: int) -> int:
        """Offset just past a whole body starting at ``offset`` (no values built).

        Raises :class:`DecodeError` when the body is malformed.
        """
        try:
            return self._fast.skip(data, offset)  # type: ignore[no-any-return]
        except _DECODE_FAILURES:
            self._explain_decode(bytes(data), offset)
            raise AssertionError("unreachable") from None


def _describe(exc: BaseException, label: str) -> str:
    if isinstance(exc, IndexError):
        return f"truncated {label}: data ends early"
    if isinstance(exc, struct.error):
        text = str(exc)
        if "requires a buffer" in text or "unpack_from" in text:
            return f"truncated {label}: data ends early"
        return f"bad value in {label}: {text}"
    if isinstance(exc, UnicodeDecodeError):
        return f"invalid UTF-8 in a string of {label}"
    return f"malformed {label}: {exc}"


_codecs: dict[tuple[int, int, MessageType], MessageCodec] = {}
_codecs_lock = threading.Lock()


def codec(api_key: int, api_version: int, direction: MessageType) -> MessageCodec | None:
    """The compiled codec for a message kind, or ``None`` when the tables do not know it.

    Compiled on first use and cached for the life of the process.
    """
    key = (api_key, api_version, direction)
    found = _codecs.get(key)
    if found is not None:
        return found
    schema = message_schema(api_key, api_version, direction)
    if schema is None:
        return None
    with _codecs_lock:
        found = _codecs.get(key)
        if found is None:
            found = _codecs[key] = MessageCodec(schema)
    return found


def require_codec(api_key: int, api_version: int, direction: MessageType) -> MessageCodec:
    found = codec(api_key, api_version, direction)
    if found is None:
        raise UnknownApiError(api_key, api_version)
    return found


def decode_body(api_key: int, api_version: int, direction: MessageType, data: bytes, offset: int = 0) -> Body:
    """Decode a request or response body (the bytes after the header)."""
    return require_codec(api_key, api_version, direction).decode(data, offset)


def encode_body(api_key: int, api_version: int, direction: MessageType, body: Body) -> bytes:
    """Encode a body dict produced by :func:`decode_body` or :func:`default_body`."""
    return require_codec(api_key, api_version, direction).encode(body)


_ZERO_UUID = uuid.UUID(int=0)
_TYPE_DEFAULTS: dict[str, Any] = {"bool": False, "string": "", "bytes": b"", "records": None,
                                  "float64": 0.0, "uuid": _ZERO_UUID}


def default_value(field: Field) -> Any:
    """The value Kafka's generated code starts a field with.

    The spec's ``default`` when given (``"null"`` meaning None); otherwise zero,
    false, empty string, empty bytes, empty list, a default struct, the all-zero
    uuid, or None for records.
    """
    if field.default == "null":
        return None
    if field.array:
        return []
    if field.type == "struct":
        assert field.fields is not None
        return default_struct(field.fields)
    if field.default is not None and field.type != "uuid":
        return field.default
    return _TYPE_DEFAULTS.get(field.type, 0)


def default_struct(fields: tuple[Field, ...]) -> Body:
    """A struct with every non-tagged field at its default."""
    return {f.name: default_value(f) for f in fields if f.tag is None}


def default_body(api_key: int, api_version: int, direction: MessageType) -> Body:
    """A complete body with default values, for building messages from scratch."""
    return default_struct(require_codec(api_key, api_version, direction).schema.fields)
