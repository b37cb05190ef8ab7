"""The SASL token mode of a session: raw size-prefixed tokens, no Kafka header.

After a successful SaslHandshake v0 the client and broker exchange raw SASL tokens
(KIP-43's first form) until the mechanism's exchange is over; the session passes them
on opaquely. :class:`SaslTokens` exists only while that lasts (the session holds None
otherwise), and says when it ends: after the rounds the mechanism fixes (PLAIN and
OAUTHBEARER: one, SCRAM: two), or, for another mechanism, when the client sends something
that reads as a Kafka request, which then gets every check a request gets.
"""

from __future__ import annotations

import struct

from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.schema import supported_versions
from kproxy.proxy.exchange import Exchange

# Rounds of a SaslHandshake v0 exchange whose length the mechanism fixes.
SASL_ROUNDS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}
_REQUEST_FIXED = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id
_INT16 = struct.Struct(">h")


class SaslTokens:
    """One token exchange in progress. ``rounds_left``: broker tokens still to come, or None when
    the mechanism does not fix it (the client's next Kafka request ends the exchange)."""

    __slots__ = ("rounds_left",)

    def __init__(self, mechanism: str | None) -> None:
        self.rounds_left = SASL_ROUNDS.get((mechanism or "").upper())

    def broker_token(self) -> bool:
        """A token frame came from the broker; whether the exchange is over with it."""
        if self.rounds_left is None:
            return False
        self.rounds_left -= 1
        return self.rounds_left <= 0

    def ends_with(self, frame: bytes) -> bool:
        """Whether this client frame reads as a Kafka request, which ends the exchange (only for a
        mechanism whose rounds are not fixed: otherwise every client frame is a token).

        It does when it starts with a request header for an API kproxy knows, at any
        version (the header layout does not depend on it), with a client id length
        that fits: such a frame then goes through every check a request gets in Kafka
        mode, the refusal of versions kproxy cannot read included. GSSAPI tokens
        cannot look like that: they start 0x60 (RFC 2743 section 3.1 framing) or with
        a per-message token id of RFC 1964 / RFC 4121 (0x01 to 0x05), while every api
        key kproxy knows is below 256, so its first byte is 0x00.
        """
        if self.rounds_left is not None or len(frame) < 14:
            return False
        _, api_key, api_version, _ = _REQUEST_FIXED.unpack_from(frame, 0)
        (client_id_len,) = _INT16.unpack_from(frame, 12)
        return (api_version >= 0 and -1 <= client_id_len <= len(frame) - 14
                and supported_versions(api_key) is not None)


def handshake_mechanism(ex: Exchange) -> str | None:
    """The mechanism a SaslHandshake v0 request names (None when its body cannot be read)."""
    try:
        body = ex.request_body()
    except ProtocolError:
        return None
    mechanism = body.get("mechanism")
    return mechanism if isinstance(mechanism, str) else None


def handshake_succeeded(frame: bytes) -> bool:
    """Whether a SaslHandshake v0 response frame says NONE (the token mode begins).

    Raises :class:`~kproxy.protocol.errors.ProtocolError` when it is too short for an error code.
    """
    if len(frame) < 10:
        raise ProtocolError(f"SaslHandshake v0 response of {len(frame)} bytes has no error code", offset=8)
    (error_code,) = _INT16.unpack_from(frame, 8)
    return int(error_code) == 0
