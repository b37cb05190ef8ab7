"""The users kproxy checks clients against in terminate mode, as its credentials file holds them.

The file (YAML, or JSON, which YAML reads too) keeps, per user and mechanism, what checks a
password and never the password itself::

    version: 1
    decoy_key: <base64>
    users:
      alice:
        PLAIN: {algorithm: pbkdf2-hmac-sha512, iterations: 210000, salt: <base64>, hash: <base64>}
        SCRAM-SHA-256: {iterations: 4096, salt: <base64>, stored_key: <base64>, server_key: <base64>}
        SCRAM-SHA-512: {iterations: 4096, salt: <base64>, stored_key: <base64>, server_key: <base64>}

* SCRAM entries are what a Kafka broker stores for the user (``kafka-configs --alter
  --add-config 'SCRAM-SHA-256=[...]'``: salt, iterations, StoredKey, ServerKey; RFC 5802 section
  3): enough to check a client's proof and to prove kproxy knows the user, not to log in as them.
* PLAIN sends the password itself, so its entry is a slow salted hash of it: PBKDF2-HMAC-SHA-512
  (:data:`PLAIN_ALGORITHM`) with a per-user random salt and :data:`PLAIN_ITERATIONS` iterations by
  default (OWASP's figure for that hash), checked with a constant-time comparison. A Kafka
  broker keeps PLAIN passwords in clear in its JAAS file; kproxy's file does not.

* ``decoy_key`` (32 random bytes, written once with the file's first user) keys the made-up entries
  a login of a user the file does not hold is checked against (:mod:`kproxy.sasl.unknown_users`),
  so that they stay the same across restarts: it tells nothing about any password.

A user logs in only with the mechanisms their entry has. Everything here is sans-IO: the file's
parsed document in (:func:`parse_document`), a document out (:func:`to_document`); reading,
watching and writing the file are the server's and the command line's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kproxy.logfmt import excerpt
from kproxy.sasl import scram

VERSION = 1
PLAIN = "PLAIN"
PLAIN_ALGORITHM = "pbkdf2-hmac-sha512"
# OWASP's Password Storage Cheat Sheet (2023) figure for PBKDF2-HMAC-SHA512: 210,000.
PLAIN_ITERATIONS = 210_000
# Bounds of an entry's iterations: below, the hash is too cheap to slow a guesser down; above, one
# login would hold a verification thread for many seconds (a file's typo must not do that).
PLAIN_MIN_ITERATIONS = 10_000
PLAIN_MAX_ITERATIONS = 5_000_000
SALT_BYTES = 24
DECOY_KEY_BYTES = 32  # the file's key for the made-up entries of unknown users
DECOY_KEY_MIN_BYTES = 16  # a shorter one could be guessed from the made-up entries it gives
MECHANISMS = (PLAIN, *scram.HASHES)  # every mechanism an entry can have, in the order they are written
# The longest user name and password kproxy accepts, in UTF-8 bytes (a client's longer one is refused
# before any hashing). kproxy/sasl/relay.py reads relayed user names to the same length.
USER_NAME_MAX = 1024
PASSWORD_MAX = 1024
KEY_EXCERPT = 80  # a document key a problem names (a user name, a mechanism), at most this many characters


class CredentialsError(ValueError):
    """A credentials document kproxy refuses: ``problems`` names each one, ``path: reason``."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True, slots=True)
class PlainHash:
    """What checks a PLAIN password: PBKDF2-HMAC-SHA-512 of it under ``salt`` and ``iterations``."""

    salt: bytes
    iterations: int
    hash: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class UserCredentials:
    """One user's entries: ``plain`` (None: no PLAIN login) and the SCRAM ones by mechanism name."""

    plain: PlainHash | None = None
    scram: Mapping[str, scram.ScramCredential] = field(default_factory=dict)

    @property
    def mechanisms(self) -> tuple[str, ...]:
        return tuple(m for m in MECHANISMS if (m == PLAIN and self.plain is not None) or m in self.scram)


@dataclass(frozen=True, slots=True)
class CredentialStore:
    """Every user of one credentials file (read-only: a changed file is a new store), and its
    ``decoy_key`` (None: a file without one: module docstring)."""

    users: Mapping[str, UserCredentials] = field(default_factory=dict)
    decoy_key: bytes | None = field(default=None, repr=False)

    def plain(self, user: str) -> PlainHash | None:
        entry = self.users.get(user)
        return entry.plain if entry is not None else None

    def scram(self, user: str, mechanism: str) -> scram.ScramCredential | None:
        entry = self.users.get(user)
        return entry.scram.get(mechanism) if entry is not None else None


# -- PLAIN passwords ---------------------------------------------------------------------------
def plain_hash(password: str, *, iterations: int = PLAIN_ITERATIONS, salt: bytes | None = None) -> PlainHash:
    """The stored form of a PLAIN ``password`` (a fresh random salt unless one is given)."""
    _check_password(password)
    if not PLAIN_MIN_ITERATIONS <= iterations <= PLAIN_MAX_ITERATIONS:
        raise CredentialsError([f"iterations: {iterations} outside {PLAIN_MIN_ITERATIONS}..{PLAIN_MAX_ITERATIONS}"])
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    return PlainHash(salt, iterations, _pbkdf2(password.encode("utf-8"), salt, iterations))


def verify_plain(stored: PlainHash, password: bytes) -> bool:
    """Whether ``password`` (the UTF-8 bytes a client sent) is the one behind ``stored``: the slow
    hash, then a constant-time comparison. Takes as long as the entry's iterations make it (a
    fraction of a second by default): never on the event loop. hashlib releases the GIL meanwhile."""
    return hmac.compare_digest(_pbkdf2(password, stored.salt, stored.iterations), stored.hash)


def _pbkdf2(password: bytes, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha512", password, salt, iterations)


# -- building and editing ----------------------------------------------------------------------
def user_credentials(password: str, mechanisms: Iterable[str], *, plain_iterations: int = PLAIN_ITERATIONS,
                     scram_iterations: int = scram.DEFAULT_ITERATIONS) -> UserCredentials:
    """The entries of one user for ``mechanisms`` (each with a fresh salt) from ``password``."""
    _check_password(password)
    wanted = list(dict.fromkeys(mechanisms))
    unknown = [m for m in wanted if m not in MECHANISMS]
    if unknown or not wanted:
        raise CredentialsError([f"mechanisms: {', '.join(unknown) or 'none given'}: "
                                f"kproxy checks {', '.join(MECHANISMS)}"])
    try:
        scrams = {m: scram.credential(m, password, iterations=scram_iterations) for m in wanted if m != PLAIN}
    except scram.ScramError as exc:
        raise CredentialsError([f"scram iterations: {exc}"]) from None
    plain = plain_hash(password, iterations=plain_iterations) if PLAIN in wanted else None
    return UserCredentials(plain, scrams)


def with_user(store: CredentialStore, user: str, entry: UserCredentials) -> CredentialStore:
    """``store`` with ``user``'s entries replaced by ``entry`` (added when new), and a ``decoy_key``
    (made now when the store has none)."""
    check_user_name(user)
    key = store.decoy_key if store.decoy_key is not None else secrets.token_bytes(DECOY_KEY_BYTES)
    return CredentialStore({**store.users, user: entry}, key)


def without_user(store: CredentialStore, user: str) -> CredentialStore:
    """``store`` without ``user``; KeyError when there is no such user."""
    if user not in store.users:
        raise KeyError(user)
    return CredentialStore({name: entry for name, entry in store.users.items() if name != user}, store.decoy_key)


def check_user_name(user: str) -> None:
    """CredentialsError unless ``user`` is a name a client can log in with: 1 to
    :data:`USER_NAME_MAX` UTF-8 bytes, no NUL (PLAIN's separator) nor control character."""
    if not user or len(user.encode("utf-8", "surrogatepass")) > USER_NAME_MAX:
        raise CredentialsError([f"user name: must be 1 to {USER_NAME_MAX} bytes"])
    if any(ord(c) < 32 or ord(c) == 127 for c in user):
        raise CredentialsError([f"user name {user[:64]!r}: control characters are not allowed"])


def _check_password(password: str) -> None:
    if not password:
        raise CredentialsError(["password: empty"])
    if len(password.encode("utf-8", "surrogatepass")) > PASSWORD_MAX:
        raise CredentialsError([f"password: longer than {PASSWORD_MAX} bytes"])
    if "\x00" in password:
        raise CredentialsError(["password: a NUL character cannot be sent with PLAIN"])


# -- the document ------------------------------------------------------------------------------
def to_document(store: CredentialStore) -> dict[str, Any]:
    """The file's document for ``store`` (users sorted by name; bytes as base64)."""
    document: dict[str, Any] = {"version": VERSION}
    if store.decoy_key is not None:
        document["decoy_key"] = _b64(store.decoy_key)
    users: dict[str, Any] = {}
    for name in sorted(store.users):
        entry = store.users[name]
        out: dict[str, Any] = {}
        if entry.plain is not None:
            out[PLAIN] = {"algorithm": PLAIN_ALGORITHM, "iterations": entry.plain.iterations,
                          "salt": _b64(entry.plain.salt), "hash": _b64(entry.plain.hash)}
        for mechanism in scram.HASHES:
            cred = entry.scram.get(mechanism)
            if cred is not None:
                out[mechanism] = {"iterations": cred.iterations, "salt": _b64(cred.salt),
                                  "stored_key": _b64(cred.stored_key), "server_key": _b64(cred.server_key)}
        users[name] = out
    document["users"] = users
    return document


def parse_document(data: Any) -> CredentialStore:
    """The store a parsed file holds; :class:`CredentialsError` listing every problem
    (``users.alice.SCRAM-SHA-256.salt: not base64``) when any. An empty document (a new or
    emptied file) is a store without users."""
    if data is None:
        return CredentialStore()
    problems: list[str] = []
    if not isinstance(data, Mapping):
        raise CredentialsError([f"(document): must be a mapping with 'version' and 'users', got {_kind(data)}"])
    for key in data:
        if key not in ("version", "decoy_key", "users"):
            problems.append(f"{_key(key)}: unknown key (expected 'version', 'decoy_key' and 'users')")
    version = data.get("version", VERSION)
    if version != VERSION or isinstance(version, bool):
        problems.append(f"version: {excerpt(version)}: this kproxy reads version {VERSION}")
    decoy_key = _decoy_key(data["decoy_key"], problems) if "decoy_key" in data else None
    users_data = data.get("users") or {}
    if not isinstance(users_data, Mapping):
        raise CredentialsError([*problems, f"users: must map user names to entries, got {_kind(users_data)}"])
    users: dict[str, UserCredentials] = {}
    for name, entry_data in users_data.items():
        where = f"users.{_key(name)}"
        if not isinstance(name, str):
            problems.append(f"{where}: a user name must be a string")
            continue
        try:
            check_user_name(name)
        except CredentialsError as exc:
            problems.extend(f"{where}: {p}" for p in exc.problems)
            continue
        entry = _entry(entry_data, where, problems)
        if entry is not None:
            users[name] = entry
    if problems:
        raise CredentialsError(problems)
    return CredentialStore(users, decoy_key)


def _decoy_key(value: Any, problems: list[str]) -> bytes | None:
    if not isinstance(value, str) or not value:
        problems.append(f"decoy_key: must be base64 text, got {_kind(value)}")
        return None
    try:
        key = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        problems.append("decoy_key: not base64")
        return None
    if len(key) < DECOY_KEY_MIN_BYTES:
        problems.append(f"decoy_key: {len(key)} bytes, at least {DECOY_KEY_MIN_BYTES} are needed")
        return None
    return key


def _entry(data: Any, where: str, problems: list[str]) -> UserCredentials | None:
    if not isinstance(data, Mapping) or not data:
        problems.append(f"{where}: must map mechanisms ({', '.join(MECHANISMS)}) to their entries")
        return None
    before = len(problems)
    plain: PlainHash | None = None
    scrams: dict[str, scram.ScramCredential] = {}
    for mechanism, fields_data in data.items():
        at = f"{where}.{_key(mechanism)}"
        if mechanism not in MECHANISMS:
            problems.append(f"{at}: unknown mechanism (kproxy checks {', '.join(MECHANISMS)})")
            continue
        if not isinstance(fields_data, Mapping):
            problems.append(f"{at}: must be a mapping, got {_kind(fields_data)}")
            continue
        if mechanism == PLAIN:
            plain = _plain(fields_data, at, problems)
        else:
            cred = _scram(mechanism, fields_data, at, problems)
            if cred is not None:
                scrams[mechanism] = cred
    return UserCredentials(plain, scrams) if len(problems) == before else None


def _plain(data: Mapping[str, Any], at: str, problems: list[str]) -> PlainHash | None:
    before = len(problems)
    _only(data, ("algorithm", "iterations", "salt", "hash"), at, problems)
    algorithm = data.get("algorithm")
    if algorithm != PLAIN_ALGORITHM:
        problems.append(f"{at}.algorithm: {excerpt(algorithm)}: kproxy reads {PLAIN_ALGORITHM}")
    iterations = _int(data, "iterations", PLAIN_MIN_ITERATIONS, PLAIN_MAX_ITERATIONS, at, problems)
    salt = _bytes(data, "salt", at, problems)
    digest = _bytes(data, "hash", at, problems)
    if digest is not None and len(digest) != hashlib.sha512().digest_size:
        problems.append(f"{at}.hash: {len(digest)} bytes, a SHA-512 hash has 64")
    if len(problems) > before or iterations is None or salt is None or digest is None:
        return None
    return PlainHash(salt, iterations, digest)


def _scram(mechanism: str, data: Mapping[str, Any], at: str, problems: list[str]) -> scram.ScramCredential | None:
    before = len(problems)
    _only(data, ("iterations", "salt", "stored_key", "server_key"), at, problems)
    iterations = _int(data, "iterations", scram.MIN_ITERATIONS, scram.MAX_ITERATIONS, at, problems)
    salt = _bytes(data, "salt", at, problems)
    size = hashlib.new(scram.HASHES[mechanism]).digest_size
    keys = [_bytes(data, name, at, problems) for name in ("stored_key", "server_key")]
    for name, key in zip(("stored_key", "server_key"), keys, strict=True):
        if key is not None and len(key) != size:
            problems.append(f"{at}.{name}: {len(key)} bytes, {mechanism} keys have {size}")
    stored, server = keys
    if len(problems) > before or iterations is None or salt is None or stored is None or server is None:
        return None
    return scram.ScramCredential(mechanism, salt, iterations, stored, server)


def _only(data: Mapping[str, Any], allowed: tuple[str, ...], at: str, problems: list[str]) -> None:
    for key in data:
        if key not in allowed:
            problems.append(f"{at}.{_key(key)}: unknown key (expected {', '.join(allowed)})")


def _int(data: Mapping[str, Any], name: str, lo: int, hi: int, at: str, problems: list[str]) -> int | None:
    value = data.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        problems.append(f"{at}.{name}: must be an integer from {lo} to {hi}, got {excerpt(value)}")
        return None
    return value


def _bytes(data: Mapping[str, Any], name: str, at: str, problems: list[str]) -> bytes | None:
    value = data.get(name)
    if not isinstance(value, str) or not value:
        problems.append(f"{at}.{name}: must be base64 text, got {_kind(value)}")
        return None
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        problems.append(f"{at}.{name}: not base64")
        return None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _key(key: object) -> str:
    """A key of the document as a problem's path names it: at most an excerpt (a key may be of any length)."""
    return excerpt(key, KEY_EXCERPT, quoted=False)


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__
