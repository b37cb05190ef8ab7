"""Which response fields carry broker endpoints (``host`` and ``port``), from the schemas.

Any response struct with ``host`` and ``port`` fields holds an endpoint:
Metadata brokers, FindCoordinator, DescribeCluster, the KIP-951
``node_endpoints`` of Produce v10+ and Fetch v16+, ShareFetch/ShareAcknowledge,
the KRaft quorum APIs. Nothing is listed by hand: a new API with endpoints in a
newer spec is covered by regenerating the tables. Both the default address
rewriter (:mod:`kproxy.proxy.address_rewrite`) and the ``rewrite_addresses`` rule action
(:func:`rewrite_endpoints`) find the fields here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from kproxy.protocol.errors import EndpointRewriteError
from kproxy.protocol.headers import response_body_offset
from kproxy.protocol.message_schemas import Field, MessageType, message_schema
from kproxy.protocol.messages import require_codec
from kproxy.protocol.mutation import Mutation, reframe
from kproxy.protocol.splice import splice_body

#: Maps an endpoint (host, port) to its replacement, or None to leave it.
EndpointMap = Callable[[str, int], tuple[str, int] | None]


@functools.cache
def has_endpoint(fields: tuple[Field, ...]) -> bool:
    """Whether a struct, or a struct nested in it, has both ``host`` and ``port``."""
    names = {f.name for f in fields}
    if "host" in names and "port" in names:
        return True
    return any(f.fields is not None and has_endpoint(f.fields) for f in fields)


@functools.cache
def endpoint_fields(api_key: int, api_version: int) -> tuple[str, ...] | None:
    """Top-level response fields holding endpoints; ``()`` when the top level itself
    has host/port (FindCoordinator v0-3); ``None`` when nothing needs rewriting."""
    schema = message_schema(api_key, api_version, MessageType.RESPONSE)
    if schema is None:
        return None
    names = {f.name for f in schema.fields}
    if "host" in names and "port" in names:
        return ()
    found = tuple(f.name for f in schema.fields if f.fields is not None and has_endpoint(f.fields))
    return found or None


def rewrite_endpoints(frame: bytes, api_key: int, api_version: int, mapping: EndpointMap) -> Mutation:
    """Replace the endpoints of a response frame (size prefix included) as ``mapping`` says.

    Every struct with ``host`` and ``port`` is offered to ``mapping``; only the
    top-level fields holding endpoints are decoded and re-encoded, the rest of
    the frame is copied byte for byte. ``changed`` counts replaced endpoints;
    with none, the same ``frame`` object is returned. Raises
    :class:`EndpointRewriteError` when this response carries no endpoints,
    :class:`~kproxy.protocol.errors.DecodeError` on a malformed frame.
    """
    fields = endpoint_fields(api_key, api_version)
    if fields is None:
        raise EndpointRewriteError(f"api key {api_key} v{api_version} responses carry no broker endpoints")
    offset = response_body_offset(frame, api_key, api_version, whole=True)
    count = [0]
    codec = require_codec(api_key, api_version, MessageType.RESPONSE)

    def edit(value: Any) -> Any:
        _map_value(value, mapping, count)
        return value

    if fields == ():
        body = codec.decode(frame, offset)
        _map_value(body, mapping, count)
        if not count[0]:
            return Mutation(frame, 0)
        return Mutation(reframe(frame, offset, codec.encode(body)), count[0])
    spliced, _ = splice_body(api_key, api_version, MessageType.RESPONSE, frame, dict.fromkeys(fields, edit), offset)
    if spliced is None or not count[0]:
        return Mutation(frame, 0)
    return Mutation(reframe(frame, offset, spliced), count[0])


def _map_value(value: Any, mapping: EndpointMap, count: list[int]) -> None:
    if isinstance(value, list):
        for item in value:
            _map_value(item, mapping, count)
        return
    if not isinstance(value, dict):
        return
    host, port = value.get("host"), value.get("port")
    if isinstance(host, str) and isinstance(port, int) and host:
        new = mapping(host, port)
        if new is not None and new != (host, port):
            value["host"], value["port"] = new
            count[0] += 1
    for item in value.values():
        if isinstance(item, list | dict):
            _map_value(item, mapping, count)
