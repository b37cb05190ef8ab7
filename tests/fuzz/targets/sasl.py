"""Fuzz targets of terminate mode's SASL server side, below the Kafka framing: the mechanism servers
(``sasl_server``) and the credentials file (``credentials_file``).

``sasl_server``: the first byte picks the mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), the rest
is cut at :data:`MESSAGE_SEPARATOR` into the client's messages, fed to one login's server
(:meth:`kproxy.sasl.server.CredentialChecker.server`) until a step ends it. A SCRAM client-final
cannot know the server's nonce nor a proof over it, so two placeholders stand for them:
``{nonce}`` becomes the nonce of the server-first, and ``,p={proof}`` at the end the proof a
client with alice's password computes over the message before it. So the fuzzer reaches a whole
exchange and mutates around it. Never an exception; and a login is accepted only as alice, only
with her password, byte for byte (PLAIN), or only over the server's whole nonce (SCRAM).

``credentials_file``: the input is the file's text, loaded as kproxy loads it
(:func:`kproxy.sasl.credentials_file.load_credentials`): only a store or a
:class:`~kproxy.sasl.credentials.CredentialsError` naming each problem may come out. A store must
write back to the same store, and give a SCRAM server-first for each of its users and for one it
does not hold (the made-up entries are built from the file's entries: whatever they hold).
No PLAIN hash runs there (a file may ask for 5,000,000 iterations: kproxy's bound, by design).
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.fuzz.targets.registry import target

MESSAGE_SEPARATOR = b"\n--\n"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PASSWORD = "alice-pw"


@functools.cache
def _checker() -> object:
    from kproxy.sasl.credentials import PLAIN_MIN_ITERATIONS, CredentialStore, user_credentials, with_user
    from kproxy.sasl.server import CredentialChecker

    store = with_user(CredentialStore(), "alice", user_credentials(PASSWORD, MECHANISMS,
                                                                   plain_iterations=PLAIN_MIN_ITERATIONS))
    store = with_user(store, "bob", user_credentials("bob-pw", ["SCRAM-SHA-256"], scram_iterations=8192))
    return CredentialChecker(store, MECHANISMS)


def _sasl_input(mechanism: int, *messages: bytes) -> bytes:
    return bytes([mechanism]) + MESSAGE_SEPARATOR.join(messages)


def _sasl_seeds() -> Iterator[bytes]:
    yield _sasl_input(0, b"\x00alice\x00" + PASSWORD.encode())
    yield _sasl_input(0, b"alice\x00alice\x00" + PASSWORD.encode() + b"\n")
    yield _sasl_input(0, b"\x00mallory\x00pw")
    yield _sasl_input(0, b"a\x00b\x00c\x00d")
    for index in (1, 2):
        yield _sasl_input(index, b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL", b"c=biws,r={nonce},p={proof}")
        yield _sasl_input(index, b"n,a=alice,n=alice,r=abc", b"c=bixhbGljZSw=,r={nonce},p={proof}")
        yield _sasl_input(index, b"y,,n=bob,r=abcdef", b"c=eSws,r={nonce}x,p={proof}")
        yield _sasl_input(index, b"n,,n=mal=2Clory,r=abc", b"c=biws,r=abc,p=AAAA")
        yield _sasl_input(index, b"n,,n=alice,r=abc", b"c=biws,r=abc,p={proof}")  # the client's part only
    yield _sasl_input(1, b"n,,n=alice,r=x", b"c=biws,r={nonce},p={proof}", b"c=biws,r={nonce},p={proof}")


def _with_placeholders(message: bytes, first: bytes, server_first: bytes, mechanism: str) -> bytes:
    """``message`` with the server's nonce and a proof with alice's password put in (module docstring)."""
    from kproxy.sasl import scram

    try:
        attrs = scram.attributes(server_first.decode("ascii"))
        message = message.replace(b"{nonce}", attrs["r"].encode("ascii"))
        without_proof, sep, tail = message.rpartition(b",p=")
        if not sep or tail != b"{proof}":
            return message
        bare = first.decode("utf-8").split(",", 2)[2]
        salted = scram.salted_password(mechanism, PASSWORD, scram.unb64(attrs["s"], "salt"), int(attrs["i"]))
        auth_message = f"{bare},{server_first.decode('ascii')},".encode() + without_proof
        proof = scram.client_proof(mechanism, salted, auth_message)
    except (KeyError, ValueError, IndexError):  # a server-first the fuzzer's first message did not get
        return message
    return without_proof + b",p=" + scram.b64(proof).encode("ascii")


@target(_sasl_seeds, warm=True)
def fuzz_sasl_server(data: bytes) -> None:
    """PLAIN and SCRAM servers fed a client's messages: no exception; only alice, with her password."""
    from kproxy.sasl.server import CredentialChecker, Step

    if not data:
        return
    checker = _checker()
    assert isinstance(checker, CredentialChecker)
    mechanism = MECHANISMS[data[0] % len(MECHANISMS)]
    messages = data[1:].split(MESSAGE_SEPARATOR)[:4]
    server = checker.server(mechanism)
    first = messages[0]
    server_first = b""
    for i, message in enumerate(messages):
        if i and mechanism != "PLAIN":
            message = _with_placeholders(message, first, server_first, mechanism)
        step: Step = server.respond(message)
        if step.verify is not None:
            assert step.verify_key, "a hash without the key that names it"
            step = server.verified(step.verify())
        if step.user is not None:
            assert step.user == "alice", f"accepted as {step.user!r}"
            if mechanism == "PLAIN":
                authzid, _, password = message.split(b"\x00")
                assert password == PASSWORD.encode() and authzid in (b"", b"alice"), message
            else:
                from kproxy.sasl import scram

                nonce = scram.attributes(server_first.decode("ascii"))["r"]
                final = message.decode("utf-8").rpartition(",p=")[0]
                assert final.split(",r=", 1)[1] == nonce, "accepted over another nonce than the server's"
        if step.done:
            return
        server_first = step.challenge


def _credentials_seeds() -> Iterator[bytes]:
    from kproxy.sasl.credentials import PLAIN_MIN_ITERATIONS, CredentialStore, user_credentials, with_user
    from kproxy.sasl.credentials_file import dump_credentials

    store = with_user(CredentialStore(), "alice", user_credentials(PASSWORD, MECHANISMS,
                                                                   plain_iterations=PLAIN_MIN_ITERATIONS))
    store = with_user(store, "b,o=b", user_credentials("pw", ["SCRAM-SHA-512"], scram_iterations=16384))
    yield dump_credentials(store).encode()
    yield b'{"version": 1, "users": {"carol": {"SCRAM-SHA-256": {"iterations": 4096, "salt": "c2FsdA==", ' \
          b'"stored_key": "' + b"A" * 43 + b'=", "server_key": "' + b"A" * 43 + b'="}}}}'
    yield b"version: 1\nusers: {}\n"
    yield b"version: 2\ndecoy_key: AAAA\nusers: [alice]\n"
    yield b""


class _Scratch:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="kproxy-fuzz-credentials-"))
        atexit.register(shutil.rmtree, self.root, True)
        self.path = self.root / "credentials.yaml"


@functools.cache
def _scratch() -> _Scratch:
    return _Scratch()


@target(_credentials_seeds, warm=True)
def fuzz_credentials_file(data: bytes) -> None:
    """The credentials file's text: a store or the problems named; a store writes back to itself."""
    from kproxy.sasl import scram
    from kproxy.sasl.credentials import CredentialsError
    from kproxy.sasl.credentials_file import dump_credentials, load_credentials
    from kproxy.sasl.server import CredentialChecker

    path = _scratch().path
    path.write_bytes(data)
    try:
        store = load_credentials(path)
    except CredentialsError as exc:
        assert exc.problems and all(p.startswith(f"{path}") for p in exc.problems), exc.problems
        return
    path.write_text(dump_credentials(store))
    assert load_credentials(path) == store, "the store written back reads as another"
    checker = CredentialChecker(store, MECHANISMS)
    for user in [*list(store.users)[:8], "nobody-in-the-file"]:
        for mechanism in scram.HASHES:
            first = checker.server(mechanism).respond(f"n,,n={scram.escape_name(user)},r=nonce".encode())
            if first.error is None:
                attrs = scram.attributes(first.challenge.decode("ascii"))
                assert scram.MIN_ITERATIONS <= int(attrs["i"]) <= scram.MAX_ITERATIONS
