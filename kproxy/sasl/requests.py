"""What kproxy's SASL code reads of a client's Kafka request: :class:`SaslRequest`.

The session's :class:`~kproxy.proxy.exchange.Exchange` is one; SASL names only what it reads, so
that it sits below the session and never imports it.
"""

from __future__ import annotations

from typing import Any, Protocol


class SaslRequest(Protocol):
    """A client's request, its header read (the request frame, size prefix included)."""

    @property
    def correlation_id(self) -> int: ...

    @property
    def api_key(self) -> int: ...

    @property
    def api_version(self) -> int: ...

    @property
    def request(self) -> bytes: ...

    def request_body(self) -> dict[str, Any]:
        """The request body, decoded; :class:`~kproxy.protocol.errors.ProtocolError` when it cannot be."""
        ...
