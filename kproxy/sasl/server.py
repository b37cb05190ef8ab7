"""The server side of SASL PLAIN (RFC 4616) and SCRAM (RFC 5802), as a Kafka broker plays it.

Sans-IO: a client's messages in, challenges and a verdict out (:class:`Step`). The Kafka framing
around them (SaslHandshake, SaslAuthenticate, raw tokens) is :mod:`kproxy.sasl.authenticator`'s.

:class:`CredentialChecker` is one per server: the users in force (:attr:`CredentialChecker.store`,
replaced when the credentials file changes; a login in progress keeps the store it began with),
the PLAIN passwords verified so far (:class:`VerifiedPasswords`) and the made-up entries of
unknown users (:class:`~kproxy.sasl.unknown_users.MadeUpEntries`, keyed by the file's ``decoy_key``).
:meth:`CredentialChecker.server` makes one mechanism's server for one login.

What a client is told is what a Kafka broker tells it (SaslServerAuthenticator, PlainSaslServer,
ScramSaslServer): ``Authentication failed: Invalid username or password`` for PLAIN,
``Authentication failed during authentication due to invalid credentials with SASL mechanism
SCRAM-SHA-256`` for anything wrong in a SCRAM exchange, whose reason Kafka keeps from the client
(it "may contain sensitive data like the existence of the user"). Unknown users are refused
exactly as wrong passwords are, after the same work: a made-up entry stands in for theirs, with
an iteration count and a salt length drawn from the file's own entries and a salt made from the
user name (RFC 5802 section 5.1), the same at each attempt and across restarts; PLAIN hashes
against it, SCRAM answers with it and refuses the proof.

Costs: a SCRAM exchange is a few HMACs (microseconds). A PLAIN login is the slow hash of its
entry (a fraction of a second by design), handed out as :attr:`Step.verify` to run off the event
loop, unless the same password of the same entry was verified before (:class:`VerifiedPasswords`),
with :attr:`Step.verify_key` naming it (the server runs one hash per key at a time).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from kproxy.sasl import scram
from kproxy.sasl.credentials import (
    PASSWORD_MAX,
    PLAIN,
    USER_NAME_MAX,
    CredentialStore,
    PlainHash,
    verify_plain,
)
from kproxy.sasl.unknown_users import MadeUpEntries

# Kafka's texts (clients/.../security/plain/internals/PlainSaslServer.java, SaslServerAuthenticator.java).
PLAIN_INVALID = "Authentication failed: Invalid username or password"
PLAIN_NO_USER = "Authentication failed: username not specified"
PLAIN_NO_PASSWORD = "Authentication failed: password not specified"
AUTHZID_DIFFERS = "Authentication failed: Client requested an authorization id that is different from username"
# The most a SCRAM client message may hold: a name and a nonce, their attributes, the proof.
SCRAM_MESSAGE_MAX = 4 * USER_NAME_MAX


def invalid_credentials(mechanism: str, reauthenticating: bool = False) -> str:
    """The message a Kafka broker gives for a login whose reason it keeps to itself."""
    during = "re-authentication" if reauthenticating else "authentication"
    return f"Authentication failed during {during} due to invalid credentials with SASL mechanism {mechanism}"


@dataclass(frozen=True, slots=True)
class Step:
    """What a mechanism server says to one client message.

    ``challenge``: the bytes to send back (empty for none). The exchange is over when ``user``
    (accepted, as this user) or ``error`` (refused, with the broker's message) is set. ``verify``:
    work to run off the event loop first (a PLAIN password's slow hash); its result goes to the
    server's ``verified`` and that step is the answer; ``verify_key`` names that work (a keyed
    digest of the entry and the password). ``reason``: why it was refused, for kproxy's own log
    line (never sent to the client: Kafka keeps it from clients).
    """

    challenge: bytes = b""
    user: str | None = None
    error: str | None = None
    verify: Callable[[], bool] | None = None
    verify_key: bytes = b""
    reason: str | None = None

    @property
    def done(self) -> bool:
        return self.user is not None or self.error is not None


class MechanismServer(Protocol):
    """One login's server side: :meth:`respond` to each client message until a step is done;
    :meth:`verified` with the result of a step's ``verify`` (None: it was not run)."""

    mechanism: str
    user: str | None  # who the client says it is, once it said so (for the log line of a refusal)

    def respond(self, message: bytes) -> Step: ...

    def verified(self, ok: bool | None) -> Step: ...


class VerifiedPasswords:
    """PLAIN passwords verified since kproxy started, kept as keyed digests (HMAC-SHA-256 under a
    random per-process key), never as passwords: a client that logs in again with the password
    verified last for its user's entry skips the slow hash. Any other password, or an entry that
    changed, takes the slow hash again. At most ``max_users`` users are kept (then it starts over).
    Used on the event loop only."""

    __slots__ = ("_by_user", "_key", "max_users")

    def __init__(self, max_users: int = 100_000) -> None:
        self._key = secrets.token_bytes(32)
        self._by_user: dict[str, tuple[PlainHash, bytes]] = {}
        self.max_users = max_users

    def _digest(self, user: str, password: bytes) -> bytes:
        return hmac.new(self._key, user.encode("utf-8") + b"\x00" + password, hashlib.sha256).digest()

    def work_key(self, user: str, stored: PlainHash, password: bytes) -> bytes:
        """What names the hash of ``password`` against ``stored``: the logins that ask for the same
        one at once share it (kproxy/server/password_checks.py). A keyed digest: not the password."""
        material = b"\x00".join((user.encode("utf-8"), stored.salt, stored.iterations.to_bytes(8, "big"),
                                  stored.hash, password))
        return hmac.new(self._key, b"work\x00" + material, hashlib.sha256).digest()

    def accepts(self, user: str, stored: PlainHash, password: bytes) -> bool:
        found = self._by_user.get(user)
        return found is not None and found[0] == stored and hmac.compare_digest(found[1], self._digest(user, password))

    def remember(self, user: str, stored: PlainHash, password: bytes) -> None:
        if len(self._by_user) >= self.max_users and user not in self._by_user:
            self._by_user.clear()
        self._by_user[user] = (stored, self._digest(user, password))


class CredentialChecker:
    """The users and mechanisms of terminate mode, for every connection of one server.

    ``mechanisms``: the ones offered, in the order a SaslHandshake response lists them. ``store``
    may be replaced at any time (a reloaded file): logins begun keep the store they began with.
    """

    def __init__(self, store: CredentialStore, mechanisms: Iterable[str]) -> None:
        self.mechanisms = tuple(mechanisms)
        self.verified = VerifiedPasswords()
        self.store = store

    @property
    def store(self) -> CredentialStore:
        return self._store

    @store.setter
    def store(self, store: CredentialStore) -> None:
        self._store = store
        self._made_up = MadeUpEntries(store)

    def server(self, mechanism: str) -> MechanismServer:
        """A server for one login with ``mechanism`` (one of :attr:`mechanisms`)."""
        if mechanism == PLAIN:
            return PlainServer(self.store, self.verified, self._made_up)
        return ScramServer(mechanism, self.store, self._made_up)


def unknown_reason(store: CredentialStore, user: str) -> str:
    """The logged reason (never the client's answer) for a login with no entry for its mechanism:
    the user may exist with other mechanisms only (``kproxy credentials add --mechanism``)."""
    return "mechanism not enabled for this user" if user in store.users else "unknown user"


class PlainServer:
    """PLAIN: one client message, ``[authzid] NUL authcid NUL passwd`` (RFC 4616)."""

    mechanism = PLAIN

    def __init__(self, store: CredentialStore, verified: VerifiedPasswords, made_up: MadeUpEntries) -> None:
        self._store = store
        self._verified = verified
        self._made_up = made_up
        self.user: str | None = None
        self._pending: tuple[PlainHash, bytes, bool] | None = None  # the entry and password hashed, known

    def respond(self, message: bytes) -> Step:
        parts = message.split(b"\x00")
        if len(parts) != 3:
            return Step(error=invalid_credentials(PLAIN), reason=f"expected 3 NUL-separated tokens, got {len(parts)}")
        authzid, name, password = parts
        if not name:
            return Step(error=PLAIN_NO_USER, reason="no user name")
        if len(name) > USER_NAME_MAX:
            return Step(error=PLAIN_INVALID, reason=f"user name over {USER_NAME_MAX} bytes")
        try:
            self.user = name.decode("utf-8")
        except UnicodeDecodeError:
            return Step(error=invalid_credentials(PLAIN), reason="user name is not UTF-8")
        if not password:
            return Step(error=PLAIN_NO_PASSWORD, reason="no password")
        if authzid and authzid != name:
            return Step(error=AUTHZID_DIFFERS, reason="authorization id differs from the user name")
        if len(password) > PASSWORD_MAX:
            return Step(error=PLAIN_INVALID, reason=f"password over {PASSWORD_MAX} bytes")
        stored = self._store.plain(self.user)
        if stored is not None and self._verified.accepts(self.user, stored, password):
            return Step(user=self.user)
        known = stored is not None
        if stored is None:
            stored = self._made_up.plain(self.user)
        self._pending = (stored, password, known)
        return Step(verify=functools.partial(verify_plain, stored, password),
                    verify_key=self._verified.work_key(self.user, stored, password))

    def verified(self, ok: bool | None) -> Step:
        assert self._pending is not None and self.user is not None, "verified() without a verification asked"
        stored, password, known = self._pending
        self._pending = None
        if ok is None:
            return Step(error=PLAIN_INVALID, reason="not checked: too many password checks under way from "
                                                    "the client's address")
        if ok and known:
            self._verified.remember(self.user, stored, password)
            return Step(user=self.user)
        return Step(error=PLAIN_INVALID, reason="wrong password" if known else unknown_reason(self._store, self.user))


class ScramServer:
    """SCRAM-SHA-256/512: client-first, server-first, client-final, server-final (RFC 5802 section 3)."""

    def __init__(self, mechanism: str, store: CredentialStore, made_up: MadeUpEntries) -> None:
        self.mechanism = mechanism
        self._store = store
        self._made_up = made_up
        self.user: str | None = None
        self._cred: scram.ScramCredential | None = None
        self._known = False
        self._gs2_header = ""
        self._first_bare = ""
        self._server_first = ""
        self._nonce = ""

    def verified(self, ok: bool | None) -> Step:
        raise AssertionError("SCRAM asks for no verification off the loop")

    def respond(self, message: bytes) -> Step:
        if len(message) > SCRAM_MESSAGE_MAX:
            return self._refuse(f"message of {len(message)} bytes")
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            return self._refuse("message is not UTF-8")
        try:
            return self._client_first(text) if self._cred is None else self._client_final(text)
        except scram.ScramError as exc:
            return self._refuse(str(exc))

    def _refuse(self, reason: str) -> Step:
        return Step(error=invalid_credentials(self.mechanism), reason=reason)

    def _client_first(self, text: str) -> Step:
        # gs2-header "n,," or "y,," (kproxy offers no -PLUS mechanism, so no channel binding: "p=" is refused).
        cbind, sep1, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not (sep1 and sep2) or cbind not in ("n", "y"):
            raise scram.ScramError("client-first: not 'n,' or 'y,' then an authzid and the bare message")
        if authzid and not authzid.startswith("a="):
            raise scram.ScramError("client-first: bad authzid")
        parts = bare.split(",")
        if len(parts) < 2 or not parts[0].startswith("n=") or not parts[1].startswith("r=") or len(parts[1]) < 3:
            raise scram.ScramError("client-first: expected n=user,r=nonce")
        if not all("!" <= c <= "~" for c in parts[1][2:]):  # RFC 5802: printable ASCII, no ","
            raise scram.ScramError("client-first: the nonce is not printable ASCII")
        # Extensions (Kafka's tokenauth=true of delegation tokens, RFC 5802's m=): kproxy knows none.
        if len(parts) > 2:
            raise scram.ScramError(f"client-first: extensions are not supported ({parts[2][:40]!r})")
        user = scram.unescape_name(parts[0][2:])
        self.user = user
        if not user:
            raise scram.ScramError("client-first: empty user name")
        if authzid and scram.unescape_name(authzid[2:]) != user:
            return Step(error=AUTHZID_DIFFERS, reason="authorization id differs from the user name")
        cred = self._store.scram(user, self.mechanism)
        self._known = cred is not None
        self._cred = cred if cred is not None else self._made_up.scram(self.mechanism, user)
        self._gs2_header = text[:len(cbind) + len(authzid) + 2]
        self._first_bare = bare
        self._nonce = parts[1][2:] + scram.nonce()
        self._server_first = f"r={self._nonce},s={scram.b64(self._cred.salt)},i={self._cred.iterations}"
        return Step(challenge=self._server_first.encode("ascii"))

    def _client_final(self, text: str) -> Step:
        if self._server_first == "":
            raise scram.ScramError("client-final after a refused client-first")
        without_proof, sep, proof_text = text.rpartition(",p=")
        if not sep:
            raise scram.ScramError("client-final: no proof")
        attrs = without_proof.split(",")
        if len(attrs) != 2 or not attrs[0].startswith("c=") or not attrs[1].startswith("r="):
            raise scram.ScramError("client-final: expected c=...,r=...,p=...")
        if scram.unb64(attrs[0][2:], "channel binding") != self._gs2_header.encode("utf-8"):
            raise scram.ScramError("client-final: channel binding differs from the gs2 header")
        if not hmac.compare_digest(attrs[1][2:].encode(), self._nonce.encode()):
            raise scram.ScramError("client-final: nonce differs from the server's")
        proof = scram.unb64(proof_text, "proof")
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        cred = self._cred
        assert cred is not None
        self._server_first = ""  # one final message per login
        assert self.user is not None
        if not scram.verify_client_proof(cred, auth_message, proof):
            return self._refuse("wrong password" if self._known else unknown_reason(self._store, self.user))
        signature = scram.server_signature(self.mechanism, cred.server_key, auth_message)
        return Step(challenge=b"v=" + scram.b64(signature).encode("ascii"), user=self.user)
