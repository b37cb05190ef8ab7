"""What kproxy checks a login of a user it does not know against: made-up entries that a client
cannot tell from a real user's.

A refusal must not say whether the user exists (Kafka keeps that from clients too). What a client
sees of an entry is SCRAM's salt and iteration count (in the server-first message) and, for
PLAIN, how long the hash takes, which its iteration count sets. So a user the file does not hold
(or holds without the mechanism asked for) gets, per mechanism:

* **an iteration count and a salt length drawn from the file's own entries** of that mechanism:
  the entry at an index the user's name selects (an HMAC of it), so across the names a client tries
  the counts come out as often as the file holds them, and a name gets the same one every time;
* **a salt of that length made from the name** (an HMAC of it), the same at every attempt, as a
  real user's is;
* keys (SCRAM) or a hash (PLAIN) made from the name as well, which no password matches.

The HMAC key is the file's ``decoy_key`` (kept in the file: :mod:`kproxy.sasl.credentials`), so the
made-up entries stay the same across restarts and edits of the file, as the real ones do. A file
without one (written by hand, or by a kproxy before it had them) gets a key derived from its
entries' hashes and keys (secret to whoever has not read the file): the made-up entries then stay
the same across restarts but change when the file changes, which a client watching a name's salt
across the change could notice. Without any entry of a mechanism, kproxy's defaults stand in.

Sans-IO, and cheap: a few HMACs per login (the selection sorts the file's entries once per store).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from kproxy.sasl import scram
from kproxy.sasl.credentials import PLAIN, PLAIN_ITERATIONS, SALT_BYTES, CredentialStore, PlainHash


class MadeUpEntries:
    """The made-up entries of the users ``store`` does not hold (see the module's docstring)."""

    __slots__ = ("_key", "_shapes")

    def __init__(self, store: CredentialStore) -> None:
        self._key = store.decoy_key if store.decoy_key is not None else content_key(store)
        # Per mechanism, the (iterations, salt length) of every entry, sorted: the index a name
        # selects means the same entry at every start.
        shapes: dict[str, list[tuple[int, int]]] = {PLAIN: []}
        for mechanism in scram.HASHES:
            shapes[mechanism] = []
        for entry in store.users.values():
            if entry.plain is not None:
                shapes[PLAIN].append((entry.plain.iterations, len(entry.plain.salt)))
            for mechanism, cred in entry.scram.items():
                shapes[mechanism].append((cred.iterations, len(cred.salt)))
        self._shapes = {mechanism: sorted(found) for mechanism, found in shapes.items()}

    def plain(self, user: str) -> PlainHash:
        """A PLAIN entry for ``user`` that costs what the file's entries cost and that no password matches."""
        iterations, salt_size = self._shape(PLAIN, user, (PLAIN_ITERATIONS, SALT_BYTES))
        return PlainHash(self._derive(PLAIN, "salt", user, salt_size), iterations,
                         self._derive(PLAIN, "hash", user, hashlib.sha512().digest_size))

    def scram(self, mechanism: str, user: str) -> scram.ScramCredential:
        """A SCRAM entry for ``user`` shaped as the file's entries of ``mechanism``; no proof verifies."""
        iterations, salt_size = self._shape(mechanism, user, (scram.DEFAULT_ITERATIONS, SALT_BYTES))
        size = hashlib.new(scram.hash_name(mechanism)).digest_size
        return scram.ScramCredential(mechanism, self._derive(mechanism, "salt", user, salt_size), iterations,
                                     self._derive(mechanism, "stored_key", user, size),
                                     self._derive(mechanism, "server_key", user, size))

    def _shape(self, mechanism: str, user: str, default: tuple[int, int]) -> tuple[int, int]:
        shapes: Sequence[tuple[int, int]] = self._shapes.get(mechanism, ())
        if not shapes:
            return default
        pick = int.from_bytes(self._derive(mechanism, "shape", user, 8), "big")
        return shapes[pick % len(shapes)]

    def _derive(self, mechanism: str, what: str, user: str, size: int) -> bytes:
        out = b""
        block = 0
        while len(out) < size:
            label = f"{mechanism}\x00{what}\x00{block}\x00{user}".encode("utf-8", "surrogatepass")
            out += hmac.new(self._key, label, hashlib.sha256).digest()
            block += 1
        return out[:size]


def content_key(store: CredentialStore) -> bytes:
    """A key for a file without a ``decoy_key``: a digest of every entry's hash and keys, which only
    whoever read the file knows (the same at every start while the file does not change)."""
    digest = hashlib.sha256(b"kproxy made-up entries\x00")
    for name in sorted(store.users):
        entry = store.users[name]
        digest.update(name.encode("utf-8", "surrogatepass") + b"\x00")
        if entry.plain is not None:
            digest.update(entry.plain.hash)
        for mechanism in sorted(entry.scram):
            cred = entry.scram[mechanism]
            digest.update(cred.stored_key + cred.server_key)
    return digest.digest()
