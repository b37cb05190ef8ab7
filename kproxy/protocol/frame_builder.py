"""Request and response frames of any (api key, version), built from version-independent values.

``request_frame(ApiKey.METADATA, 12, correlation_id=7, topics=[{"name": "t"}])``
gives the whole frame (size prefix included). The values name fields in Kafka's
snake_case; a value for a field that this version lacks is dropped (``topic_id``
before it existed, ``rack`` in Metadata v0, ...), every other field takes the
spec's default. Tests, the demo and fault injection build frames with these; an
error answer to a request is :func:`kproxy.protocol.error_response.error_response`.
"""

from __future__ import annotations

from typing import Any

from kproxy.protocol.errors import UnknownApiError
from kproxy.protocol.framing import frame
from kproxy.protocol.headers import RequestHeader, request_header_version
from kproxy.protocol.message_schemas import Field, MessageType, message_schema
from kproxy.protocol.messages import Body, default_struct
from kproxy.protocol.payloads import encode_request, encode_response

__all__ = ["body_of", "request_body", "request_frame", "response_body", "response_frame", "shape"]

DEFAULT_CLIENT_ID = "kproxy-test"


def shape(fields: tuple[Field, ...], values: dict[str, Any]) -> Body:
    """A struct of exactly ``fields``: defaults, overridden by the ``values`` this version has.

    Values for fields absent in this version are dropped (``topic_id`` before
    it existed, ``rack`` in Metadata v0...); tagged fields appear only when given.
    """
    out = default_struct(fields)
    by_name = {f.name: f for f in fields}
    for name, value in values.items():
        f = by_name.get(name)
        if f is None:
            continue
        if f.fields is not None and value is not None:
            value = [shape(f.fields, v) for v in value] if f.array else shape(f.fields, value)
        out[name] = value
    return out


def body_of(api_key: int, api_version: int, direction: MessageType, **values: Any) -> Body:
    """A body of this kind: the spec's defaults, overridden by ``values`` (see :func:`shape`)."""
    schema = message_schema(api_key, api_version, direction)
    if schema is None:
        raise UnknownApiError(api_key, api_version)
    return shape(schema.fields, values)


def request_body(api_key: int, api_version: int, **values: Any) -> Body:
    """:func:`body_of` a request; raises :class:`UnknownApiError` for a kind the tables lack."""
    return body_of(api_key, api_version, MessageType.REQUEST, **values)


def response_body(api_key: int, api_version: int, **values: Any) -> Body:
    """:func:`body_of` a response; raises :class:`UnknownApiError` for a kind the tables lack."""
    return body_of(api_key, api_version, MessageType.RESPONSE, **values)


def request_frame(api_key: int, api_version: int, correlation_id: int, body: Body | None = None,
                  client_id: str | None = DEFAULT_CLIENT_ID, **values: Any) -> bytes:
    """A whole request frame (size prefix included)."""
    if body is None:
        body = request_body(api_key, api_version, **values)
    header = RequestHeader(api_key, api_version, correlation_id, client_id,
                           request_header_version(api_key, api_version))
    return frame(encode_request(header, body))


def response_frame(api_key: int, api_version: int, correlation_id: int, body: Body | None = None,
                   **values: Any) -> bytes:
    """A whole response frame (size prefix included)."""
    if body is None:
        body = response_body(api_key, api_version, **values)
    return frame(encode_response(correlation_id, api_key, api_version, body))
