"""A blocking Kafka connection that speaks SASL by hand (SaslHandshake, SaslAuthenticate, raw
tokens), for tests that drive kproxy's terminate mode where a client library would not go:
stopping half-way, logging in wrongly in a tight loop."""

from __future__ import annotations

import socket
from typing import Any

import scramp

from kproxy.protocol import decode_response
from kproxy.protocol.frame_builder import request_frame

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


class SaslSocket:
    """One connection to ``port`` on loopback; every wait bounded by ``timeout`` seconds."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.correlation_id = 0

    def __enter__(self) -> SaslSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, api_key: int, api_version: int, **values: Any) -> None:
        self.correlation_id += 1
        self.sock.sendall(request_frame(api_key, api_version, self.correlation_id, **values))

    def request(self, api_key: int, api_version: int, **values: Any) -> dict[str, Any]:
        """Send a request and decode its answer's body."""
        self.send(api_key, api_version, **values)
        frame = self.receive_frame()
        return decode_response(frame[4:], api_key, api_version).body

    def receive_frame(self) -> bytes:
        head = self._exactly(4)
        return head + self._exactly(int.from_bytes(head, "big"))

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError(f"closed by kproxy after {len(data)} of {n} bytes")
            data += chunk
        return data

    def closed_by_peer(self) -> bool:
        """Whether kproxy closed the connection (waits up to the socket's timeout for it)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def scram_login(self, mechanism: str, user: str, password: str) -> dict[str, Any]:
        """SaslHandshake v1, then SCRAM in SaslAuthenticate v2: the last answer's body."""
        assert self.request(SASL_HANDSHAKE, 1, mechanism=mechanism)["error_code"] == 0
        client = scramp.ScramClient([mechanism], user, password)
        first = self.request(SASL_AUTHENTICATE, 2, auth_bytes=client.get_client_first().encode())
        if first["error_code"]:
            return first
        client.set_server_first(bytes(first["auth_bytes"]).decode())
        return self.request(SASL_AUTHENTICATE, 2, auth_bytes=client.get_client_final().encode())
