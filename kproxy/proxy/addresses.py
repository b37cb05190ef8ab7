"""Which kproxy port stands for which upstream broker.

Clients must never learn a real broker address: every broker kproxy sees in a
response gets a kproxy listener, and the response is rewritten to point there.
This module owns that mapping (sans-IO; the server opens the listeners).

Port assignment is deterministic by default, so a restarted sidecar hands out
the same ports and clients holding cached metadata reconnect to the right
broker: ``port = broker_port_base + node_id``. Node ids too large for that
(KRaft clusters may number brokers in the thousands) fall back to the next
free port above the range, in order of first appearance; a static
``node_id -> port`` map in the config overrides both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kproxy.host_port import HostPort


class PortsExhausted(Exception):
    """Every local port up to ``max_port`` stands for a broker already."""


@dataclass(slots=True)
class BrokerRoute:
    """One upstream broker as kproxy exposes it."""

    node_id: int
    upstream: HostPort
    local_port: int


@dataclass
class AddressMap:
    """node id -> (upstream address, local port). Shared by every session of a proxy.

    ``advertised_host`` is what clients are told (``localhost``, a pod IP, a
    Service name). ``learn`` is the only mutator of routes, and is only called
    with endpoints of responses that parsed whole; ``port_for`` may reserve a
    port for a node not known yet (a response is rewritten before it is known to
    be whole), never a route. A route's upstream may change
    (a broker moved); its local port never does, and listeners look the route
    up per accepted connection, so new connections follow the move.
    """

    advertised_host: str
    broker_port_base: int
    static_ports: dict[int, int] = field(default_factory=dict)
    max_port: int = 65535
    routes: dict[int, BrokerRoute] = field(default_factory=dict)
    # Optional: picks (and reserves) a port for a new broker, e.g. by binding port 0.
    port_allocator: Callable[[int], int] | None = None
    reserved_ports: set[int] = field(default_factory=set)
    pending_ports: dict[int, int] = field(default_factory=dict)  # node id -> port, no route yet

    def _assign_port(self, node_id: int) -> int:
        if node_id in self.static_ports:
            return self.static_ports[node_id]
        if self.port_allocator is not None:
            return self.port_allocator(node_id)
        taken = [r.local_port for r in self.routes.values()] + list(self.pending_ports.values())
        used = set(taken) | self.reserved_ports
        wanted = self.broker_port_base + node_id
        if node_id >= 0 and wanted <= self.max_port and wanted not in used:
            return wanted
        # Past the deterministic range: first free port above it.
        candidate = self.broker_port_base + 1 + max([port - self.broker_port_base for port in taken] + [0])
        while candidate in used:
            candidate += 1
        if candidate > self.max_port:
            raise PortsExhausted(f"no local port left for broker {node_id}")
        return candidate

    def learn(self, node_id: int, host: str, port: int) -> BrokerRoute:
        """Record that broker ``node_id`` is at ``host:port`` upstream; return its route."""
        route = self.routes.get(node_id)
        if route is None:
            pending = self.pending_ports.pop(node_id, -1)
            route = BrokerRoute(node_id, HostPort(host, port),
                                pending if pending >= 0 else self._assign_port(node_id))
            self.routes[node_id] = route
            return route
        known = route.upstream
        # Compared field by field: the usual answer names the broker where it was, and HostPort's
        # dataclass __init__ and __eq__ are interpreted code, called per Metadata answer.
        if known.port != port or known.host != host:
            # The broker moved: same local port, new destination for new connections.
            route.upstream = HostPort(host, port)
        return route

    def port_for(self, node_id: int) -> int:
        """The local port broker ``node_id`` has, or will have once learned (reserved now)."""
        route = self.routes.get(node_id)
        if route is not None:
            return route.local_port
        port = self.pending_ports.get(node_id)
        if port is None:
            port = self.pending_ports[node_id] = self._assign_port(node_id)
        return port

    def route_for_port(self, local_port: int) -> BrokerRoute | None:
        for route in self.routes.values():
            if route.local_port == local_port:
                return route
        return None
