"""SCRAM's arithmetic and message syntax (RFC 5802), for SCRAM-SHA-256 and SCRAM-SHA-512 (KIP-84).

Both sides of an exchange are built from these pieces:

- keys: ``salted_password = Hi(password, salt, i)``, ``client_key = HMAC(salted, "Client Key")``,
  ``stored_key = H(client_key)``, ``server_key = HMAC(salted, "Server Key")``. A credential store
  keeps ``salt``, ``iterations``, ``stored_key`` and ``server_key`` (:class:`ScramCredential`), never
  the password: a server can check a proof and prove itself with them, but cannot log in as the user.
- proofs: ``client_proof = client_key XOR HMAC(stored_key, auth_message)`` and
  ``server_signature = HMAC(server_key, auth_message)``, where ``auth_message`` is
  ``client-first-bare + "," + server-first + "," + client-final-without-proof``.
- messages: comma-separated ``k=v`` attributes (:func:`attributes`); user names escape ``,`` and ``=``
  as ``=2C`` and ``=3D`` (:func:`escape_name`, :func:`unescape_name`).

Nothing here does I/O or keeps state between calls; comparisons of secrets are constant-time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

# Kafka's mechanism names -> hashlib names. Kafka has no SCRAM-SHA-1 (KIP-84).
HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# Kafka refuses fewer iterations than this (ScramMechanism's minIterations) and more than 16384.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096
# The gs2 header of a client without channel binding and without an authorization id.
GS2_HEADER = "n,,"


class ScramError(ValueError):
    """A SCRAM message that does not parse, or a proof that does not verify; the text says which."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What a server stores for one user and mechanism: enough to verify, not to log in."""

    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def hash_name(mechanism: str) -> str:
    """The hashlib name of a Kafka SCRAM mechanism; :class:`ScramError` for another one."""
    try:
        return HASHES[mechanism]
    except KeyError:
        raise ScramError(f"unsupported SCRAM mechanism {mechanism!r} (supported: {', '.join(HASHES)})") from None


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """``Hi(Normalize(password), salt, i)``: PBKDF2 with the mechanism's HMAC.

    Normalize is the password's UTF-8 bytes, no SASLprep: what Kafka's own ScramFormatter does, so a
    credential made here matches one the broker's tools make for the same password.
    """
    return hashlib.pbkdf2_hmac(hash_name(mechanism), password.encode("utf-8"), salt, iterations)


def _hmac(mechanism: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hash_name(mechanism)).digest()


def _h(mechanism: str, data: bytes) -> bytes:
    return hashlib.new(hash_name(mechanism), data).digest()


def credential(mechanism: str, password: str, *, salt: bytes | None = None,
               iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
    """The stored form of ``password`` (a fresh 24-byte random salt unless one is given)."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ScramError(f"iterations {iterations} outside Kafka's {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    salt = secrets.token_bytes(24) if salt is None else salt
    salted = salted_password(mechanism, password, salt, iterations)
    client_key = _hmac(mechanism, salted, b"Client Key")
    return ScramCredential(mechanism, salt, iterations, _h(mechanism, client_key),
                           _hmac(mechanism, salted, b"Server Key"))


def client_proof(mechanism: str, salted: bytes, auth_message: bytes) -> bytes:
    """The client's proof for ``auth_message``, from its salted password."""
    client_key = _hmac(mechanism, salted, b"Client Key")
    signature = _hmac(mechanism, _h(mechanism, client_key), auth_message)
    return bytes(a ^ b for a, b in zip(client_key, signature, strict=True))


def server_signature(mechanism: str, server_key: bytes, auth_message: bytes) -> bytes:
    """The server's signature for ``auth_message`` (the ``v=`` of server-final)."""
    return _hmac(mechanism, server_key, auth_message)


def server_key_of(mechanism: str, salted: bytes) -> bytes:
    """The server key a client derives to check the server's signature."""
    return _hmac(mechanism, salted, b"Server Key")


def verify_client_proof(cred: ScramCredential, auth_message: bytes, proof: bytes) -> bool:
    """Whether ``proof`` shows knowledge of the password behind ``cred`` (constant-time)."""
    signature = _hmac(cred.mechanism, cred.stored_key, auth_message)
    if len(proof) != len(signature):
        return False
    client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
    return hmac.compare_digest(_h(cred.mechanism, client_key), cred.stored_key)


def nonce() -> str:
    """A fresh printable nonce (base64 of 18 random bytes: no ``,``)."""
    return base64.b64encode(secrets.token_bytes(18)).decode("ascii")


def escape_name(name: str) -> str:
    """A user name as SCRAM writes it: ``=`` as ``=3D``, ``,`` as ``=2C``."""
    return name.replace("=", "=3D").replace(",", "=2C")


def unescape_name(text: str) -> str:
    """The inverse of :func:`escape_name`; :class:`ScramError` for a stray ``=``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "=":
            code = text[i + 1:i + 3]
            if code == "3D":
                out.append("=")
            elif code == "2C":
                out.append(",")
            else:
                raise ScramError(f"bad escape {text[i:i + 3]!r} in a SCRAM user name")
            i += 3
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def attributes(message: str) -> dict[str, str]:
    """The ``k=v`` attributes of one SCRAM message, in a dict (first value of a repeated key kept).

    Keys are single letters (RFC 5802 section 5); a part without ``=`` raises :class:`ScramError`.
    """
    out: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise ScramError(f"malformed SCRAM attribute {part[:40]!r}")
        out.setdefault(key, value)
    return out


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str, what: str) -> bytes:
    """Base64 text to bytes; :class:`ScramError` naming ``what`` when it is not base64."""
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ScramError(f"{what} is not base64") from None
