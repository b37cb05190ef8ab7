"""The bridge from a proxy session's events to :class:`~kproxy.metrics.stats.TrafficStats`."""

from __future__ import annotations

from kproxy.metrics.stats import PRODUCE, TrafficStats
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.headers import response_body_offset
from kproxy.proxy.session import Exchange


class MetricsObserver:
    """Implements :class:`kproxy.proxy.session.SessionObserver` for one stats object.

    Shared by all sessions of a server: it keeps no per-connection state. Reads the
    header facts the session parsed (the client id only when it is a label).
    """

    __slots__ = ("client_ids", "stats")

    def __init__(self, stats: TrafficStats) -> None:
        self.stats = stats
        self.client_ids = stats.options.client_id_label

    def request(self, exchange: Exchange) -> None:
        if exchange.api_key == PRODUCE:
            self.stats.request(exchange.api_key, exchange.api_version, exchange.request_size,
                               exchange.client_id if self.client_ids else None, exchange.request,
                               exchange.request_body_offset)
        else:
            self.stats.request(exchange.api_key, exchange.api_version, exchange.request_size,
                               exchange.client_id if self.client_ids else None)

    def complete(self, exchange: Exchange) -> None:
        response = exchange.response
        if response is None:
            self.stats.no_response(exchange.api_key, exchange.overhead_seconds)
            return
        offset = exchange.response_body_offset  # the session's, when it rewrote this response (headers are kept)
        if not offset:
            try:
                offset = response_body_offset(response, exchange.api_key, exchange.api_version)
            except ProtocolError:
                offset = len(response)
        self.stats.response(exchange.api_key, exchange.api_version, response, offset,
                            exchange.broker_seconds, exchange.overhead_seconds)
