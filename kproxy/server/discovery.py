"""Learning the cluster's brokers at start-up, so their ports listen before any client asks.

Without this, a restarted kproxy would open a broker's port only when some
client's Metadata response named it: clients holding cached metadata (every
long-lived producer and consumer) would reconnect straight to broker ports
that are not there yet. kproxy asks the cluster itself: one Metadata request
(v1: every broker, no topics) over a fresh upstream connection.

The same connection asks ApiVersions, so that kproxy can compile, before the
first client arrives, the codecs of the versions clients will pick (the highest
both sides speak): compiling one costs milliseconds, which the first request of
each kind would otherwise pay.
"""

from __future__ import annotations

import struct

import trio

from kproxy.protocol.headers import RequestHeader
from kproxy.protocol.payloads import decode_response, encode_request
from kproxy.protocol.tables import ApiKey

METADATA = ApiKey.METADATA
API_VERSIONS = ApiKey.API_VERSIONS
METADATA_VERSION = 1  # every Kafka since 0.10 answers it; brokers with rack, no topics asked
DISCOVERY_CLIENT_ID = "kproxy-discovery"
_SIZE = struct.Struct(">i")


async def fetch_brokers(stream: trio.abc.Stream, max_frame_size: int) -> list[tuple[int, str, int]]:
    """Send one Metadata request on ``stream``; return ``(node_id, host, port)`` of every broker.

    Raises :class:`kproxy.protocol.ProtocolError` on a malformed answer and trio's
    stream errors when the connection fails.
    """
    header = RequestHeader(METADATA, METADATA_VERSION, correlation_id=1, client_id=DISCOVERY_CLIENT_ID)
    payload = encode_request(header, {"topics": []})
    await stream.send_all(_SIZE.pack(len(payload)) + payload)
    size = _SIZE.unpack(await _receive_exactly(stream, 4))[0]
    if not 0 <= size <= max_frame_size:
        raise trio.BrokenResourceError(f"metadata response of {size} bytes is out of bounds")
    response = decode_response(await _receive_exactly(stream, size), METADATA, METADATA_VERSION)
    return [(b["node_id"], b["host"], b["port"]) for b in response.body["brokers"]]


async def fetch_api_versions(stream: trio.abc.Stream, max_frame_size: int) -> dict[int, int]:
    """ApiVersions v0 (every broker answers it): the highest version the broker speaks, per api key."""
    header = RequestHeader(API_VERSIONS, 0, correlation_id=2, client_id=DISCOVERY_CLIENT_ID)
    payload = encode_request(header, {})
    await stream.send_all(_SIZE.pack(len(payload)) + payload)
    size = _SIZE.unpack(await _receive_exactly(stream, 4))[0]
    if not 0 <= size <= max_frame_size:
        raise trio.BrokenResourceError(f"api versions response of {size} bytes is out of bounds")
    response = decode_response(await _receive_exactly(stream, size), API_VERSIONS, 0)
    return {k["api_key"]: k["max_version"] for k in response.body["api_keys"] or []}


async def _receive_exactly(stream: trio.abc.Stream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        if not chunk:
            raise trio.BrokenResourceError("upstream closed during broker discovery")
        buf += chunk
    return bytes(buf)
