"""Opening upstream connections: the first address that accepts, TLS included, each within
``limits.connect_timeout``; every failure counted per address and broker
(``kproxy_upstream_connect_failures_total``), unless it was kproxy's own probe.

A client connection gets its upstream connection at accept, or in terminate mode once its login
succeeded (kproxy/server/connection.py executes the session's ConnectUpstream); the upstream
checks (kproxy/server/upstream_health.py) and broker discovery connect through here too.
"""

from __future__ import annotations

import ssl

import trio

from kproxy.config import Config
from kproxy.host_port import HostPort
from kproxy.metrics.stats import TrafficStats
from kproxy.server.sockets import open_tcp, os_reason
from kproxy.server.tls_reload import LiveTls


class UpstreamUnavailable(Exception):
    """No upstream address accepted a connection. The message names each address with its
    reason; ``reasons`` are the reasons alone (for a caller that names the address itself)."""

    def __init__(self, failures: list[tuple[HostPort, str]]) -> None:
        super().__init__("upstream unavailable: " + "; ".join(f"{addr}: {why}" for addr, why in failures))
        self.reasons = [why for _, why in failures]


class UpstreamConnector:
    """Connects to the brokers of one :class:`Config` (its upstream TLS, its connect timeout).

    ``tls`` is the upstream side's TLS in force (None: plaintext): each connection's handshake uses
    the context in force when it begins (kproxy/server/tls_reload.py replaces it on rotation)."""

    def __init__(self, config: Config, stats: TrafficStats) -> None:
        self.config = config
        self.stats = stats
        self.tls = LiveTls.upstream(config.upstream_tls)

    async def connect(self, addresses: list[HostPort], node_id: str, *, probe: bool = False
                      ) -> tuple[trio.abc.Stream, HostPort]:
        """Connect to the first address that accepts (TLS included); failures are counted
        per address and ``node_id`` unless ``probe`` (broker discovery). Raises
        :class:`UpstreamUnavailable` when none did."""
        errors: list[tuple[HostPort, str]] = []
        for addr in addresses:
            try:
                with trio.fail_after(self.config.limits.connect_timeout):
                    sock = await open_tcp(addr.host, addr.port)
                    if self.tls is None:
                        return sock, addr
                    name = self.config.upstream_tls.server_name or addr.host
                    tls = trio.SSLStream(sock, self.tls.context, server_hostname=name)
                    try:
                        await tls.do_handshake()
                    except BaseException:
                        await trio.aclose_forcefully(sock)
                        raise
                    return tls, addr
            except trio.TooSlowError:
                errors.append((addr, "timed out"))
            except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
                errors.append((addr, os_reason(exc)))
            if not probe:
                self.stats.upstream_connect_failed(str(addr), node_id)
        raise UpstreamUnavailable(errors)
