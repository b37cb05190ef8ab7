"""Which client software a connection runs, as it says in ApiVersions v3+ (KIP-511), for ``kproxy_client_info``.

KIP-511 added ``client_software_name`` and ``client_software_version`` to the ApiVersions request
(v3+; ApiVersionsRequest.json), which clients send first on each connection: the Java client says
``apache-kafka-java``, librdkafka ``librdkafka`` unless its binding names itself (confluent-kafka-python:
``confluent-kafka-python``, version ``<its version>-rdkafka-<librdkafka's>``), kafka-python
``kafka-python`` (tests/test_traffic_e2e.py checks the last two). Brokers export them per listener
and network thread as JMX (``kafka.server:type=socket-server-metrics,clientSoftwareName=...,
clientSoftwareVersion=...``, ``connections``); kproxy exports them with the client id, valued at the
connections open.

One :class:`ClientSoftware` per connection (the metrics observer's, when client ids are a label):
it reads the request body of the connection's ApiVersions v3+ (a few dozen bytes, once per
connection) and counts the connection under what it said until the connection closes or says
something else.
"""

from __future__ import annotations

from kproxy.metrics.traffic import LabelledTraffic
from kproxy.protocol.api_keys import API_VERSIONS
from kproxy.protocol.errors import ProtocolError
from kproxy.proxy.exchange import Exchange

KIP_511_VERSION = 3  # the first ApiVersions request version with the client software fields


class ClientSoftware:
    """The client software one connection named, counted in ``kproxy_client_info`` while it is open."""

    __slots__ = ("key", "last", "traffic", "version")
    api_key = API_VERSIONS  # the one request kind it reads

    def __init__(self, traffic: LabelledTraffic) -> None:
        self.traffic = traffic
        self.key: tuple[str, str, str] | None = None  # what this connection is counted under
        self.last = b""  # the last ApiVersions request read, past its correlation id (client id and body)
        self.version = -1  # and its version

    def request(self, exchange: Exchange) -> None:
        """An ApiVersions request of this connection (any version: below v3 there is nothing to read).
        The same request again (but its correlation id) says nothing new: compared, not decoded."""
        if exchange.api_version < KIP_511_VERSION:
            return
        frame = exchange.request
        if (self.key is not None and exchange.api_version == self.version and len(frame) == len(self.last) + 12
                and frame.startswith(self.last, 12)):
            return
        try:
            body = exchange.request_body()
        except ProtocolError:
            return  # a version kproxy cannot read (answered by the KIP-511 fallback) or bad bytes
        self.last, self.version = bytes(frame[12:]), exchange.api_version
        name, version = body.get("client_software_name"), body.get("client_software_version")
        key = self.traffic.software_opened(exchange.client_id, name if isinstance(name, str) else None,
                                           version if isinstance(version, str) else None)
        if self.key is not None:
            self.traffic.software_closed(self.key)  # a second ApiVersions: the last one says
        self.key = key

    def close(self) -> None:
        """The connection closed: it no longer counts."""
        if self.key is not None:
            self.traffic.software_closed(self.key)
            self.key = None
