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

In terminate mode (kproxy answers the clients' SASL itself) kproxy also keeps each broker's
answers to ApiVersions at every version it reads (:class:`ClusterVersions`), refreshed by each
upstream check (kproxy/server/upstream_health.py): a client's ApiVersions before its login is answered from
them, with no upstream connection of its own (kproxy/sasl/client_login.py).
"""

from __future__ import annotations

import struct

import trio

from kproxy import __version__
from kproxy.protocol.codes import ApiKey, ErrorCode
from kproxy.protocol.error_response import api_versions_answer
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.headers import RequestHeader
from kproxy.protocol.message_schemas import supported_versions
from kproxy.protocol.payloads import decode_response, encode_request
from kproxy.sasl.authenticator import ApiVersionsSource

METADATA = ApiKey.METADATA
API_VERSIONS = ApiKey.API_VERSIONS
METADATA_VERSION = 1  # every Kafka since 0.10 answers it; brokers with rack, no topics asked
DISCOVERY_CLIENT_ID = "kproxy-discovery"
_SIZE = struct.Struct(">i")
_CORRELATION_ID = struct.Struct(">i")
_READ_LOW, _READ_HIGH = supported_versions(API_VERSIONS) or (0, 0)
_READ_VERSIONS = range(_READ_LOW, _READ_HIGH + 1)  # the ApiVersions versions kproxy reads
_UNSUPPORTED_VERSION = int(ErrorCode.UNSUPPORTED_VERSION)


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


async def fetch_api_versions_answers(stream: trio.abc.Stream, max_frame_size: int) -> dict[int, bytes]:
    """What the broker answers ApiVersions at every version kproxy reads (0 to 4): version -> the
    response frame, size prefix included (see :func:`answers_by_version`). One request, at the highest
    version kproxy reads: a broker's SASL listener takes one ApiVersions before the login, but for
    KIP-511's retry at the versions named by its UNSUPPORTED_VERSION answer (an older broker), which
    is the second. Raises :class:`ProtocolError` for an answer it cannot take."""
    version = _READ_VERSIONS[-1]
    for _ in range(2):
        await stream.send_all(request_frame(API_VERSIONS, version, correlation_id=version,
                                            client_id=DISCOVERY_CLIENT_ID, client_software_name="kproxy",
                                            client_software_version=__version__))
        head = await _receive_exactly(stream, 4)
        size = _SIZE.unpack(head)[0]
        if not 6 <= size <= max_frame_size:
            raise trio.BrokenResourceError(f"api versions response of {size} bytes is out of bounds")
        payload = await _receive_exactly(stream, size)
        (correlation_id, error_code) = struct.unpack_from(">ih", payload, 0)
        if correlation_id != version:
            raise ProtocolError(f"ApiVersions v{version} answered under correlation id {correlation_id}")
        if error_code != _UNSUPPORTED_VERSION:
            return answers_by_version(version, head + payload)
        # KIP-511: an older broker answers with a v0 body naming the ApiVersions versions it speaks.
        keys = decode_response(payload, API_VERSIONS, 0).body.get("api_keys") or []
        version = min(next((int(k["max_version"]) for k in keys if k["api_key"] == API_VERSIONS), 0), version)
    raise ProtocolError("ApiVersions refused at the version the broker named (UNSUPPORTED_VERSION twice)")


def answers_by_version(version: int, frame: bytes) -> dict[int, bytes]:
    """The broker's answer to ApiVersions at each version kproxy reads, from its answer ``frame`` at
    ``version``: that frame itself; below it, the same values in each version's fields (no throttle
    time in v0, no features before v3, and before v4 no supported feature of min version 0: the
    spec's note, KAFKA-17011); above it, what a broker answers a version it does not speak (KIP-511:
    UNSUPPORTED_VERSION with a v0 body and its ApiVersions range). Correlation ids are the broker's;
    the caller gives each answer its own. Raises :class:`ProtocolError` for a frame that does not decode."""
    body = decode_response(frame[4:], API_VERSIONS, version).body
    answers: dict[int, bytes] = {}
    for v in _READ_VERSIONS:
        if v == version:
            answers[v] = frame
        elif v > version:
            span = next(((k["min_version"], k["max_version"]) for k in body.get("api_keys") or []
                         if k["api_key"] == API_VERSIONS), (0, version))
            answers[v] = api_versions_answer(0, _UNSUPPORTED_VERSION, [(int(API_VERSIONS), *span)])
        else:
            values = dict(body)
            if v < 4 and values.get("supported_features"):
                values["supported_features"] = [f for f in values["supported_features"] if f["min_version"] > 0]
            answers[v] = response_frame(API_VERSIONS, v, 0, **values)
    return answers


class ClusterVersions:
    """The cluster's ApiVersions answers (:func:`fetch_api_versions_answers`), per broker, as the
    last upstream check of each got them: what a client's ApiVersions before its terminate-mode
    login is answered with. A broker not checked yet answers as the bootstrap servers did."""

    def __init__(self, fallback: str) -> None:
        self.fallback = fallback  # the node label of the bootstrap servers
        self._answers: dict[str, dict[int, bytes]] = {}

    @property
    def known(self) -> bool:
        return bool(self._answers)

    def learn(self, node_id: str, answers: dict[int, bytes]) -> None:
        self._answers[node_id] = answers

    def source(self, node_id: str) -> ApiVersionsSource:
        """The answers of broker ``node_id`` (its node label) for one client connection's session."""

        def answer(correlation_id: int, api_version: int) -> bytes | None:
            found = self._answers.get(node_id) or self._answers.get(self.fallback)
            if found is None and self._answers:
                found = next(iter(self._answers.values()))
            frame = found.get(api_version) if found is not None else None
            if frame is None:
                return None
            return frame[:4] + _CORRELATION_ID.pack(correlation_id) + frame[8:]

        return answer


async def _receive_exactly(stream: trio.abc.Stream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        if not chunk:
            raise trio.BrokenResourceError("upstream closed during broker discovery")
        buf += chunk
    return bytes(buf)
