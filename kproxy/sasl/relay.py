"""The SASL token mode of a session: raw size-prefixed tokens, no Kafka header.

After a successful SaslHandshake v0 the client and broker exchange raw SASL tokens
(KIP-43's first form) until the mechanism's exchange is over; the session passes them
on opaquely. :class:`SaslTokens` exists only while that lasts (the session holds None
otherwise), and says when it ends: after the rounds the mechanism fixes (PLAIN and
OAUTHBEARER: one, SCRAM: two), or, for another mechanism, when the client sends something
that reads as a Kafka request, which then gets every check a request gets.

:class:`SaslRelay` follows the SASL requests a session forwards until their answers: the
token mode an accepted SaslHandshake v0 begins, and the login. :class:`SaslLogin` reads who logs
in, from the exchange in either form (raw tokens after SaslHandshake v0, or SaslAuthenticate
requests after v1, KIP-152): the user name the client's first message names
(:func:`plain_user`, :func:`scram_user`), kept as the connection's principal only once the
broker's answer says the login succeeded.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from kproxy.protocol.api_keys import SASL_HANDSHAKE
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.headers import response_body_offset
from kproxy.protocol.message_schemas import MessageType, supported_versions
from kproxy.protocol.messages import decode_body
from kproxy.sasl.requests import SaslRequest

# Rounds of a SaslHandshake v0 exchange whose length the mechanism fixes.
SASL_ROUNDS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}
_REQUEST_FIXED = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id
_INT16 = struct.Struct(">h")
# The longest user name read, in UTF-8 bytes; a longer one leaves the principal unknown. A client's
# first message is read no further than a name this long (and its framing) needs.
USER_NAME_MAX = 1024
_SCRAM_FIRST_MAX = 4 * USER_NAME_MAX  # gs2 header, authzid, user name, nonce and extensions


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


def handshake_mechanism(ex: SaslRequest) -> str | None:
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



class SaslRelay:
    """The SASL requests of one connection that the session forwards, until their answers:
    whether a SaslHandshake v0 begins the token mode, and the :class:`SaslLogin` that
    SaslAuthenticate requests (and the raw tokens) feed. Made at a connection's first SASL
    request: other connections never pay for it."""

    __slots__ = ("awaiting", "login")

    def __init__(self) -> None:
        # Correlation id -> the mechanism a SaslHandshake names (None: a SaslAuthenticate, or a
        # mechanism that cannot be read).
        self.awaiting: dict[int, str | None] = {}
        self.login = SaslLogin()

    def request(self, ex: SaslRequest) -> None:
        """A SaslHandshake or SaslAuthenticate request goes to the broker."""
        if ex.api_key == SASL_HANDSHAKE:
            self.awaiting[ex.correlation_id] = handshake_mechanism(ex)
            return
        self.awaiting[ex.correlation_id] = None
        self.login.client_token(_auth_bytes(ex.request_body))

    def answer(self, ex: SaslRequest, frame: bytes) -> tuple[SaslTokens | None, str | None]:
        """The broker's answer (whole frame) to a request of :attr:`awaiting`: the token mode it
        begins (an accepted SaslHandshake v0), and the principal of a login it ends accepted.

        Raises :class:`~kproxy.protocol.errors.ProtocolError` when a SaslHandshake v0 answer is
        too short for an error code (the stream cannot be read on: raw tokens may follow or not).
        """
        mechanism = self.awaiting.pop(ex.correlation_id)
        if ex.api_key == SASL_HANDSHAKE:
            if mechanism is None:
                return None, None  # an unreadable mechanism: the broker refuses it, no login follows
            try:
                accepted = handshake_succeeded(frame)
            except ProtocolError:
                if ex.api_version == 0:
                    raise
                return None, None
            if not accepted:
                return None, None
            self.login.handshake(mechanism)
            return (SaslTokens(mechanism) if ex.api_version == 0 else None), None
        try:
            body = decode_body(ex.api_key, ex.api_version, MessageType.RESPONSE, frame,
                               response_body_offset(frame, ex.api_key, ex.api_version))
        except ProtocolError:
            return None, self.login.broker_token(None, False)  # not an answer that says it succeeded
        return None, self.login.broker_token(_auth_bytes(lambda: body), body.get("error_code") == 0)


def _auth_bytes(read: Callable[[], dict[str, Any]]) -> bytes | None:
    """The ``auth_bytes`` of a SaslAuthenticate body ``read`` decodes; None when it cannot."""
    try:
        found = read().get("auth_bytes")
    except ProtocolError:
        return None
    return bytes(found) if isinstance(found, bytes | bytearray | memoryview) else None


class SaslLogin:
    """The SASL logins of one connection, as kproxy relays them: the principal they establish.

    Fed in exchange order: :meth:`handshake` when the broker accepted a SaslHandshake's mechanism
    (either version), :meth:`client_token` with each client message (a raw token after
    SaslHandshake v0, a SaslAuthenticate request's ``auth_bytes`` after v1), :meth:`broker_token`
    with each answer. ``principal`` is ``User:<name>``, as Kafka's default principal builder
    names a SASL user, once a PLAIN or SCRAM login named a user and the broker's last answer
    of it accepted it: PLAIN's one answer without an error; SCRAM's second (server-final)
    answer without an error and carrying ``v=`` (RFC 5802 section 7; a broker refusing a raw
    v0 login closes the connection instead). A refused or unfinished login leaves ``principal``
    as it was: a Kafka broker ends a connection whose re-authentication (KIP-368) fails, and
    accepts one only for the same principal. Other mechanisms (OAUTHBEARER, GSSAPI) name no
    user kproxy reads: they leave it unknown. Only the user name is read of a client's
    message: a password or proof is never decoded nor kept.
    """

    __slots__ = ("_answers", "_claimed", "_mechanism", "_messages", "principal")

    def __init__(self) -> None:
        self.principal: str | None = None
        self._mechanism: str | None = None
        self._claimed: str | None = None  # the user the login in progress names
        self._messages = 0  # client messages of the login in progress
        self._answers = 0  # broker answers of the login in progress

    def handshake(self, mechanism: str | None) -> None:
        """The broker accepted ``mechanism``: a login begins."""
        self._mechanism = (mechanism or "").upper()
        self._claimed = None
        self._messages = self._answers = 0

    def client_token(self, token: bytes | None) -> None:
        """A client message (None: unreadable); the first of a login names its user."""
        self._messages += 1
        if self._messages == 1 and token is not None:
            mechanism = self._mechanism
            if mechanism == "PLAIN":
                self._claimed = plain_user(token)
            elif mechanism is not None and mechanism.startswith("SCRAM-"):
                self._claimed = scram_user(token)

    def broker_token(self, token: bytes | None, accepted: bool) -> str | None:
        """A broker answer (``accepted``: it carries no error); the principal when it ends a
        login that succeeded, else None."""
        if not accepted:
            # A refused login names no one; a client message after it begins another (a Kafka
            # broker closes the connection instead, another broker may let the client try again).
            self._claimed = None
            self._messages = self._answers = 0
            return None
        self._answers += 1
        claimed = self._claimed
        if claimed is None:
            return None
        mechanism = self._mechanism or ""
        if mechanism == "PLAIN":
            done = self._answers == 1
        else:  # SCRAM: the server-final message, a verifier (an "e=" error is a refusal)
            done = self._answers == 2 and token is not None and token.startswith(b"v=")
        if not done:
            return None
        self._claimed = None
        self.principal = "User:" + claimed
        return self.principal


def plain_user(message: bytes) -> str | None:
    """The user a PLAIN message names (RFC 4616: ``[authzid] NUL authcid NUL passwd``): the
    authorization id when given, else the authentication id; None when malformed, not UTF-8 or
    longer than :data:`USER_NAME_MAX` bytes. The password, after the second NUL, is not read."""
    first = message.find(b"\x00", 0, USER_NAME_MAX + 1)
    if first < 0:
        return None
    second = message.find(b"\x00", first + 1, first + 2 + USER_NAME_MAX)
    if second < 0:
        return None
    name = message[:first] or message[first + 1:second]  # a Kafka broker refuses an authzid that is not the authcid
    return _text(name)


def scram_user(message: bytes) -> str | None:
    """The user a SCRAM client-first message names (RFC 5802 section 7:
    ``gs2-cbind-flag "," [a=authzid] "," [m=...,] n=username "," r=nonce ["," extensions]``),
    with ``=2C`` and ``=3D`` read as ``,`` and ``=``. None when malformed, when it asks for a
    mandatory extension (``m=``), or when it logs in with a delegation token (Kafka's
    ``tokenauth=true`` extension: the principal is then the token's owner, which the message
    does not name). A Kafka broker refuses an authzid that is not the user name."""
    if len(message) > _SCRAM_FIRST_MAX:
        return None
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        return None
    parts = text.split(",")
    if len(parts) < 4 or not (parts[0] in ("n", "y") or parts[0].startswith("p=")):
        return None
    if parts[1] and not parts[1].startswith("a="):
        return None
    user, nonce = parts[2], parts[3]
    if not user.startswith("n=") or not nonce.startswith("r="):
        return None
    if "tokenauth=true" in parts[4:]:
        return None
    name = _saslname(user[2:])
    return None if name is None or len(name.encode()) > USER_NAME_MAX else name


def _saslname(text: str) -> str | None:
    """A SCRAM ``saslname`` decoded (``=2C`` -> ``,``, ``=3D`` -> ``=``); None when empty or
    when ``=`` starts anything else."""
    if not text:
        return None
    if "=" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        at = text.find("=", i)
        if at < 0:
            out.append(text[i:])
            break
        out.append(text[i:at])
        escape = text[at + 1:at + 3]
        if escape == "2C":
            out.append(",")
        elif escape == "3D":
            out.append("=")
        else:
            return None
        i = at + 3
    return "".join(out)


def _text(name: bytes) -> str | None:
    if not name or len(name) > USER_NAME_MAX:
        return None
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        return None
