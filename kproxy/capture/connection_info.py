"""Who a capture's connection is: what every record of it carries."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionInfo:
    """Who a connection is: what every record of it carries (:class:`kproxy.capture.observer.CaptureObserver`
    is made with it)."""

    connection_id: str
    client_host: str
    client_port: int | None
    listener: str
    upstream: str
    principal: str | None = None
    cluster: str | None = None  # the listener's (the config's clusters:)
    # The broker behind a ``broker-N`` listener; None behind the bootstrap listener (read per record:
    # worked out once).
    node_id: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        prefix, _, node = self.listener.partition("-")
        object.__setattr__(self, "node_id", int(node) if prefix == "broker" and node.lstrip("-").isdigit() else None)
