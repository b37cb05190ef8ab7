"""Whole request and response payloads: header plus body.

A *payload* here is a frame without its 4-byte size prefix (see
:mod:`kproxy.protocol.framing`). Requests decode on their own; a response needs
the api key and version of the request it answers, since Kafka responses do not
say what they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from kproxy.protocol.headers import (
    NO_TAGS,
    RequestHeader,
    ResponseHeader,
    decode_request_header,
    decode_response_header,
    encode_request_header,
    encode_response_header,
    response_header_version,
)
from kproxy.protocol.message_schemas import MessageType
from kproxy.protocol.messages import Body, require_codec


@dataclass(frozen=True, slots=True)
class Request:
    header: RequestHeader
    body: Body


@dataclass(frozen=True, slots=True)
class Response:
    header: ResponseHeader
    api_key: int
    api_version: int
    body: Body


def decode_request(payload: bytes) -> Request:
    """Decode a request payload; offsets in errors are relative to ``payload``."""
    payload = bytes(payload)
    header = decode_request_header(payload)
    codec = require_codec(header.api_key, header.api_version, MessageType.REQUEST)
    return Request(header, codec.decode(payload, header.size))


def encode_request(header: RequestHeader, body: Body) -> bytes:
    codec = require_codec(header.api_key, header.api_version, MessageType.REQUEST)
    out = bytearray(encode_request_header(header))
    codec.encode_into(out, body)
    return bytes(out)


def decode_response(payload: bytes, api_key: int, api_version: int) -> Response:
    """Decode a response payload to a request of (api_key, api_version)."""
    payload = bytes(payload)
    codec = require_codec(api_key, api_version, MessageType.RESPONSE)
    header = decode_response_header(payload, api_key, api_version)
    return Response(header, api_key, api_version, codec.decode(payload, header.size))


def encode_response(correlation_id: int, api_key: int, api_version: int, body: Body,
                    header_tags: dict[int, bytes] | None = None) -> bytes:
    codec = require_codec(api_key, api_version, MessageType.RESPONSE)
    header = ResponseHeader(correlation_id, response_header_version(api_key, api_version), header_tags or NO_TAGS)
    out = bytearray(encode_response_header(header))
    codec.encode_into(out, body)
    return bytes(out)
