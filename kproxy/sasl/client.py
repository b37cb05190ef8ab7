"""The client side of the SASL mechanisms kproxy logs in to brokers with: messages in, messages out.

Each :class:`MechanismClient` plays one login. :meth:`~MechanismClient.first` is the first client
message; :meth:`~MechanismClient.respond` takes each message the broker answers without an error
(the ``auth_bytes`` of a SaslAuthenticate response) and returns the next client message, or None
once the login is complete on the client's side. A broker message that is wrong for the mechanism
raises :class:`SaslClientError`, whose text never holds a secret.

* PLAIN (RFC 4616): ``NUL user NUL password``; the broker's answer is empty.
* SCRAM-SHA-256/512 (RFC 5802, KIP-84): client-first, server-first (salt, iterations and the
  nonce, which must extend the client's), client-final with the proof, server-final whose ``v=``
  signature must verify (a broker that cannot prove it knows the credential is refused), or ``e=``.
  Fewer than 4096 or more than 16384 iterations are refused, as Kafka's own client does. The
  salted password, the costly part (PBKDF2), is kept per password, salt and iteration count
  (:class:`ScramKeys`): a broker keeps one salt per user, so a connection storm pays it once.
* OAUTHBEARER (RFC 7628, KIP-255): ``n,, %x01 auth=Bearer TOKEN %x01 %x01``; an empty answer
  completes it; a non-empty one is the broker's error (a JSON status), to which the client sends
  ``%x01`` and the broker then refuses the login (:attr:`MechanismClient.error` keeps the JSON).
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from dataclasses import dataclass, field

from kproxy.sasl import scram

PLAIN = "PLAIN"
OAUTHBEARER = "OAUTHBEARER"
MECHANISMS = (PLAIN, *scram.HASHES, OAUTHBEARER)
KVSEP = b"\x01"  # RFC 7628's separator; alone, the client's answer to an error


class SaslClientError(ValueError):
    """A broker message the mechanism cannot accept (the text says what; no secret in it)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """What kproxy logs in with: the mechanism, the user (None for OAUTHBEARER) and the secret (the
    password, or the token), which ``repr`` never shows."""

    mechanism: str
    username: str | None
    secret: str = field(repr=False)


class ScramKeys:
    """Salted passwords already computed, by (mechanism, password, salt, iterations): at most
    ``size`` of them, the least recently used dropped first. Shared by the logins of one process."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._keys: OrderedDict[tuple[str, str, bytes, int], bytes] = OrderedDict()

    def salted(self, mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
        key = (mechanism, password, salt, iterations)
        found = self._keys.get(key)
        if found is None:
            found = self._keys[key] = scram.salted_password(mechanism, password, salt, iterations)
            if len(self._keys) > self.size:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(key)
        return found


class MechanismClient:
    """One login's client side (see the module's docstring); made by :func:`client_for`."""

    mechanism: str = ""
    error: str | None = None  # OAUTHBEARER: the broker's error JSON, before it refuses

    def first(self) -> bytes:
        raise NotImplementedError

    def respond(self, message: bytes) -> bytes | None:
        raise NotImplementedError


class PlainClient(MechanismClient):
    mechanism = PLAIN

    def __init__(self, credentials: Credentials) -> None:
        self._message = b"\x00" + (credentials.username or "").encode() + b"\x00" + credentials.secret.encode()

    def first(self) -> bytes:
        return self._message

    def respond(self, message: bytes) -> bytes | None:
        return None  # the broker's one answer without an error: done


class ScramClient(MechanismClient):
    def __init__(self, credentials: Credentials, keys: ScramKeys | None = None) -> None:
        self.mechanism = credentials.mechanism
        scram.hash_name(self.mechanism)  # ScramError for a mechanism that is not SCRAM
        self._password = credentials.secret
        self._keys = keys
        self._nonce = scram.nonce()
        self._first_bare = f"n={scram.escape_name(credentials.username or '')},r={self._nonce}"
        self._auth_message = b""
        self._server_key = b""
        self._round = 0

    def first(self) -> bytes:
        return (scram.GS2_HEADER + self._first_bare).encode()

    def respond(self, message: bytes) -> bytes | None:
        self._round += 1
        try:
            text = message.decode("utf-8")
            if self._round == 1:
                return self._final(text).encode()
            if self._round == 2:
                self._verify(text)
                return None
        except (UnicodeDecodeError, scram.ScramError) as exc:
            raise SaslClientError(f"{self.mechanism}: {exc}") from None
        raise SaslClientError(f"{self.mechanism}: a broker message after the login ended")

    def _final(self, server_first: str) -> str:
        attrs = scram.attributes(server_first)
        if "e" in attrs:
            raise scram.ScramError(f"the broker refused: {attrs['e'][:200]}")
        server_nonce, salt_text, iterations_text = attrs.get("r", ""), attrs.get("s"), attrs.get("i", "")
        if not server_nonce.startswith(self._nonce) or len(server_nonce) == len(self._nonce):
            raise scram.ScramError("the broker's nonce does not extend kproxy's")
        if salt_text is None or not iterations_text.isdigit():
            raise scram.ScramError("server-first message without a salt or an iteration count")
        iterations = int(iterations_text)
        if not scram.MIN_ITERATIONS <= iterations <= scram.MAX_ITERATIONS:
            raise scram.ScramError(f"{iterations} iterations, outside {scram.MIN_ITERATIONS}..{scram.MAX_ITERATIONS}")
        salt = scram.unb64(salt_text, "the salt")
        salted = (self._keys.salted(self.mechanism, self._password, salt, iterations) if self._keys is not None
                  else scram.salted_password(self.mechanism, self._password, salt, iterations))
        without_proof = f"c={scram.b64(scram.GS2_HEADER.encode())},r={server_nonce}"
        self._auth_message = f"{self._first_bare},{server_first},{without_proof}".encode()
        self._server_key = scram.server_key_of(self.mechanism, salted)
        proof = scram.client_proof(self.mechanism, salted, self._auth_message)
        return f"{without_proof},p={scram.b64(proof)}"

    def _verify(self, server_final: str) -> None:
        attrs = scram.attributes(server_final)
        if "e" in attrs:
            raise scram.ScramError(f"the broker refused: {attrs['e'][:200]}")
        signature = scram.unb64(attrs.get("v", ""), "the server signature")
        expected = scram.server_signature(self.mechanism, self._server_key, self._auth_message)
        if not hmac.compare_digest(signature, expected):
            raise scram.ScramError("the broker's signature does not verify: it does not hold this credential")


class OAuthBearerClient(MechanismClient):
    mechanism = OAUTHBEARER

    def __init__(self, credentials: Credentials) -> None:
        self._message = b"n,," + KVSEP + b"auth=Bearer " + credentials.secret.encode() + KVSEP + KVSEP
        self._answered = False

    def first(self) -> bytes:
        return self._message

    def respond(self, message: bytes) -> bytes | None:
        if self._answered:
            raise SaslClientError("OAUTHBEARER: a broker message after the login ended")
        self._answered = True
        if not message:
            return None
        # RFC 7628 section 3.2.2: the server's error; the client answers %x01 and the server fails the login.
        self.error = message[:1024].decode("utf-8", "replace")
        return KVSEP


def client_for(credentials: Credentials, keys: ScramKeys | None = None) -> MechanismClient:
    """The client side of ``credentials.mechanism`` (one of :data:`MECHANISMS`)."""
    mechanism = credentials.mechanism
    if mechanism == PLAIN:
        return PlainClient(credentials)
    if mechanism == OAUTHBEARER:
        return OAuthBearerClient(credentials)
    return ScramClient(credentials, keys)
