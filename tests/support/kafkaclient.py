"""A minimal pipelining Kafka client over one trio stream, for driving kproxy and the fake cluster in tests."""

from __future__ import annotations

import struct
from typing import Any

import trio

from kproxy.protocol import FrameSplitter, Response, decode_response, peek_correlation_id
from kproxy.protocol.codes import ApiKey, ErrorCode
from kproxy.protocol.frame_builder import request_frame
from kproxy.protocol.messages import Body

LOOPBACK = "127.0.0.1"
API_VERSIONS, UNSUPPORTED_VERSION = ApiKey.API_VERSIONS, ErrorCode.UNSUPPORTED_VERSION


class KafkaClient:
    """A minimal pipelining Kafka client over one trio stream, for driving kproxy in tests.

    ``send`` encodes a request (tracking what it was, to decode the answer);
    ``receive`` decodes the next response; every wait is bounded by ``timeout``.
    """

    def __init__(self, stream: trio.abc.Stream, *, client_id: str = "kproxy-test",
                 timeout: float = 5.0) -> None:
        self.stream = stream
        self.client_id = client_id
        self.timeout = timeout
        self.splitter = FrameSplitter()
        self.pending: list[tuple[int, int, int]] = []  # (correlation id, api key, api version)
        self.next_correlation_id = 1

    @classmethod
    async def connect(cls, port: int, host: str = LOOPBACK, **kwargs: Any) -> KafkaClient:
        with trio.fail_after(kwargs.get("timeout", 5.0)):
            return cls(await trio.open_tcp_stream(host, port), **kwargs)

    async def __aenter__(self) -> KafkaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)

    async def send(self, api_key: int, api_version: int, body: Body | None = None, **values: Any) -> int:
        correlation_id = self.next_correlation_id
        self.next_correlation_id += 1
        raw = request_frame(api_key, api_version, correlation_id, body, self.client_id, **values)
        self.pending.append((correlation_id, api_key, api_version))
        await self.send_raw(raw)
        return correlation_id

    async def send_raw(self, data: bytes) -> None:
        with trio.fail_after(self.timeout):
            await self.stream.send_all(data)

    async def receive_frame(self) -> bytes:
        """The next response payload (no size prefix), untouched."""
        with trio.fail_after(self.timeout):
            while (payload := self.splitter.next_frame()) is None:
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError("the connection closed")
                self.splitter.feed(data)
        return payload

    async def receive(self) -> Response:
        correlation_id, api_key, api_version = self.pending.pop(0)
        payload = await self.receive_frame()
        assert peek_correlation_id(payload) == correlation_id
        if api_key == API_VERSIONS and struct.unpack_from(">h", payload, 4)[0] == UNSUPPORTED_VERSION:
            api_version = 0  # KIP-511: the answer is a v0 body
        return decode_response(payload, api_key, api_version)

    async def request(self, api_key: int, api_version: int, body: Body | None = None,
                      **values: Any) -> Response:
        await self.send(api_key, api_version, body, **values)
        return await self.receive()

    async def closed_by_peer(self) -> bytes:
        """Wait for the peer to close; returns whatever bytes arrived before (EOF or reset)."""
        got = bytearray()
        with trio.fail_after(self.timeout):
            while True:
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return bytes(got)
                if not data:
                    return bytes(got)
                got += data
