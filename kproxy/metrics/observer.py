"""The bridge from a proxy session's events to :class:`~kproxy.metrics.stats.TrafficStats`."""

from __future__ import annotations

from kproxy.metrics.stats import PRODUCE, TrafficStats
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.headers import decode_request_header
from kproxy.proxy.session import Exchange, response_body_offset


class MetricsObserver:
    """Implements :class:`kproxy.proxy.session.SessionObserver` for one stats object.

    Shared by all sessions of a server: it keeps no per-connection state.
    """

    __slots__ = ("client_ids", "stats")

    def __init__(self, stats: TrafficStats) -> None:
        self.stats = stats
        self.client_ids = stats.options.client_id_label

    def request(self, exchange: Exchange, frame: bytes) -> None:
        client_id = None
        if self.client_ids:
            try:
                client_id = decode_request_header(memoryview(frame)[4:]).client_id
            except ProtocolError:
                client_id = None
        self.stats.request(exchange.api_key, exchange.api_version, len(frame), client_id,
                           frame if exchange.api_key == PRODUCE else None)

    def complete(self, exchange: Exchange) -> None:
        response = exchange.response
        if response is None:
            self.stats.no_response(exchange.api_key, exchange.overhead_seconds)
            return
        offset = exchange.body_offset  # the session's, when it rewrote this response (headers are kept)
        if not offset:
            try:
                offset = response_body_offset(response, exchange.api_key, exchange.api_version)
            except (ProtocolError, IndexError):
                offset = len(response)
        self.stats.response(exchange.api_key, exchange.api_version, response, offset,
                            exchange.broker_seconds, exchange.overhead_seconds)
