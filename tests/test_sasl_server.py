"""kproxy's server side of PLAIN and SCRAM (kproxy/sasl/server.py), played against scramp's client.

scramp checks kproxy's server signature (``set_server_final`` raises on a wrong one), and kproxy
checks scramp's proof: an error on either side fails here. Refusals say what a Kafka broker says.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import scramp

from kproxy.sasl import scram
from kproxy.sasl.credentials import PLAIN_MIN_ITERATIONS, CredentialStore, user_credentials, with_user
from kproxy.sasl.credentials_file import load_credentials, save_credentials
from kproxy.sasl.server import (
    AUTHZID_DIFFERS,
    PLAIN_INVALID,
    PLAIN_NO_PASSWORD,
    CredentialChecker,
    MechanismServer,
    Step,
    invalid_credentials,
)

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.fixture(scope="module")
def checker() -> CredentialChecker:
    alice = user_credentials("alice-secret", MECHANISMS, plain_iterations=PLAIN_MIN_ITERATIONS)
    bob = user_credentials("bob-secret", ["SCRAM-SHA-256"])
    return CredentialChecker(CredentialStore({"alice": alice, "bob": bob}), MECHANISMS)


def _plain(checker: CredentialChecker, message: bytes) -> tuple[Step, Step | None]:
    """The first step of a PLAIN login, and the step its verification gives (None: none asked)."""
    server = checker.server("PLAIN")
    step = server.respond(message)
    if step.verify is None:
        return step, None
    return step, server.verified(step.verify())


def _scram(checker: CredentialChecker, mechanism: str, user: str, password: str) -> tuple[Step, scramp.ScramClient]:
    server = checker.server(mechanism)
    client = scramp.ScramClient([mechanism], user, password)
    first = server.respond(client.get_client_first().encode())
    assert not first.done and first.challenge.startswith(b"r=")
    client.set_server_first(first.challenge.decode())
    return server.respond(client.get_client_final().encode()), client


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_accepts_the_password_and_proves_itself(checker: CredentialChecker, mechanism: str) -> None:
    final, client = _scram(checker, mechanism, "alice", "alice-secret")
    assert final.user == "alice" and final.error is None
    client.set_server_final(final.challenge.decode())  # scramp raises if kproxy's signature is wrong


@pytest.mark.parametrize(("user", "password", "reason"), [
    ("alice", "wrong", "wrong password"),
    ("mallory", "alice-secret", "unknown user"),
    ("bob", "bob-secret", "mechanism not enabled for this user"),  # bob has SCRAM-SHA-256 only
])
def test_scram_refuses_as_kafka_does(checker: CredentialChecker, user: str, password: str, reason: str) -> None:
    final, _ = _scram(checker, "SCRAM-SHA-512", user, password)
    assert final.user is None
    assert final.error == "Authentication failed during authentication due to invalid credentials with SASL " \
                          "mechanism SCRAM-SHA-512"
    assert final.reason == reason


def test_an_unknown_user_gets_the_same_salt_every_time(checker: CredentialChecker) -> None:
    """A made-up salt that changed between attempts would tell who exists (RFC 5802 section 5.1)."""
    def salt(user: str) -> str:
        first = checker.server("SCRAM-SHA-256").respond(f"n,,n={user},r=abcdefgh".encode())
        return dict(part.split("=", 1) for part in first.challenge.decode().split(","))["s"]

    assert salt("mallory") == salt("mallory") != salt("eve")


@pytest.mark.parametrize(("message", "reason"), [
    (b"p=tls-unique,,n=alice,r=abc", "client-first"),
    (b"n,,n=alice", "expected n=user,r=nonce"),
    (b"n,,n=alice,r=abc,tokenauth=true", "extensions are not supported"),
    ("n,,n=alice,r=ab\u00e9c".encode(), "not printable ASCII"),  # found by fuzzing: UnicodeEncodeError
    (b"n,,n=al=3Xice,r=abc", "bad escape"),
    (b"\xff\xfe", "not UTF-8"),
    (b"n,,n=" + b"a" * 5000 + b",r=abc", "message of"),
])
def test_scram_refuses_malformed_first_messages(checker: CredentialChecker, message: bytes, reason: str) -> None:
    step = checker.server("SCRAM-SHA-256").respond(message)
    assert step.error == invalid_credentials("SCRAM-SHA-256") and reason in (step.reason or "")


def test_scram_refuses_a_final_message_that_does_not_answer_its_first(checker: CredentialChecker) -> None:
    for tamper in (lambda final: final.replace("c=biws", "c=eSws"),  # channel binding "y,," for "n,,"
                   lambda final: final.replace(",r=", ",r=X"),  # another nonce
                   lambda final: final.rpartition(",p=")[0]):  # no proof
        server = checker.server("SCRAM-SHA-256")
        client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "alice-secret")
        client.set_server_first(server.respond(client.get_client_first().encode()).challenge.decode())
        step = server.respond(tamper(client.get_client_final()).encode())
        assert step.error == invalid_credentials("SCRAM-SHA-256") and step.user is None


def test_scram_with_a_matching_authzid_and_an_escaped_name() -> None:
    """A user name with ``,`` and ``=`` comes escaped (RFC 5802: ``=2C``, ``=3D``); the client side
    here is kproxy's own SCRAM arithmetic, itself checked against scramp (tests/test_sasl_scram.py)."""
    store = CredentialStore({"a,b=c": user_credentials("pw", ["SCRAM-SHA-256"])})
    checker = CredentialChecker(store, MECHANISMS)
    server = checker.server("SCRAM-SHA-256")
    bare = f"n={scram.escape_name('a,b=c')},r=clientnonce"
    header = "n,a=a=2Cb=3Dc,"
    first = server.respond((header + bare).encode())
    attrs = scram.attributes(first.challenge.decode())
    salted = scram.salted_password("SCRAM-SHA-256", "pw", scram.unb64(attrs["s"], "s"), int(attrs["i"]))
    without_proof = f"c={scram.b64(header.encode())},r={attrs['r']}"
    auth_message = f"{bare},{first.challenge.decode()},{without_proof}".encode()
    proof = scram.client_proof("SCRAM-SHA-256", salted, auth_message)
    final = server.respond(f"{without_proof},p={scram.b64(proof)}".encode())
    assert final.user == "a,b=c"
    expected = scram.server_signature("SCRAM-SHA-256", scram.server_key_of("SCRAM-SHA-256", salted), auth_message)
    assert final.challenge == b"v=" + scram.b64(expected).encode()
    other = checker.server("SCRAM-SHA-256").respond(b"n,a=bob,n=a=2Cb=3Dc,r=xyz")
    assert other.error == AUTHZID_DIFFERS


def test_plain_accepts_the_password_after_the_slow_hash_then_remembers_it() -> None:
    store = CredentialStore({"alice": user_credentials("alice-secret", ["PLAIN"],
                                                       plain_iterations=PLAIN_MIN_ITERATIONS)})
    checker = CredentialChecker(store, MECHANISMS)
    first, verified = _plain(checker, b"\x00alice\x00alice-secret")
    assert first.verify is not None and verified is not None and verified.user == "alice"
    # The same password again: accepted without the slow hash.
    again, none = _plain(checker, b"alice\x00alice\x00alice-secret")
    assert again.user == "alice" and none is None
    # Another password: the slow hash again (a remembered digest never refuses on its own), refused.
    wrong, refused = _plain(checker, b"\x00alice\x00alice-secreT")
    assert wrong.verify is not None and refused is not None
    assert refused.error == PLAIN_INVALID and refused.reason == "wrong password"
    # The entry changed (a new file): what was remembered no longer counts.
    checker.store = CredentialStore({"alice": user_credentials("alice-secret", ["PLAIN"],
                                                               plain_iterations=PLAIN_MIN_ITERATIONS)})
    again, verified = _plain(checker, b"\x00alice\x00alice-secret")
    assert again.verify is not None and verified is not None and verified.user == "alice"


@pytest.mark.parametrize(("message", "error", "reason"), [
    (b"\x00mallory\x00alice-secret", PLAIN_INVALID, "unknown user"),
    (b"\x00bob\x00bob-secret", PLAIN_INVALID, "mechanism not enabled for this user"),  # bob has no PLAIN entry
    (b"\x00alice\x00", PLAIN_NO_PASSWORD, "no password"),
    (b"bob\x00alice\x00alice-secret", AUTHZID_DIFFERS, "authorization id"),
    (b"alice-secret", invalid_credentials("PLAIN"), "expected 3 NUL-separated tokens, got 1"),
    (b"\x00" + b"a" * 2000 + b"\x00pw", PLAIN_INVALID, "user name over 1024 bytes"),
    # Just over the bound (not over twice it): a password is refused before its slow hash is paid.
    (b"\x00alice\x00" + b"p" * 1025, PLAIN_INVALID, "password over 1024 bytes"),
])
def test_plain_refuses_as_kafka_does(checker: CredentialChecker, message: bytes, error: str, reason: str) -> None:
    first, verified = _plain(checker, message)
    step = verified or first
    assert step.user is None and step.error == error and reason in (step.reason or "")


def test_an_unknown_plain_user_costs_the_hash_most_users_cost() -> None:
    """A refusal takes as long for a user kproxy does not know as for a wrong password: the decoy
    entry it hashes against has the iterations most entries have (a fuzzed input found unknown
    users hashed at the default 210,000 while the file's users had 10,000: 20 times longer)."""
    checker = CredentialChecker(CredentialStore({"alice": user_credentials(
        "pw", ["PLAIN"], plain_iterations=PLAIN_MIN_ITERATIONS)}), MECHANISMS)
    step = checker.server("PLAIN").respond(b"\x00mallory\x00pw")
    assert step.verify is not None
    assert step.verify.args[0].iterations == PLAIN_MIN_ITERATIONS  # type: ignore[attr-defined]
    checker.store = CredentialStore()
    assert checker.server("PLAIN").respond(b"\x00mallory\x00pw").verify.args[0].iterations == 210_000  # type: ignore[union-attr]


def _final_with_nonce(server: MechanismServer, nonce_of: Callable[[str], str]) -> Step:
    """A SCRAM-SHA-256 login of alice whose client-final carries ``nonce_of(server's nonce)``, with
    the proof a client computes over that message (right for it: only the nonce check can refuse)."""
    bare = "n=alice,r=clientnonce"
    first = server.respond(("n,," + bare).encode()).challenge.decode()
    attrs = scram.attributes(first)
    salted = scram.salted_password("SCRAM-SHA-256", "alice-secret", scram.unb64(attrs["s"], "s"), int(attrs["i"]))
    without_proof = f"c={scram.b64(b'n,,')},r={nonce_of(attrs['r'])}"
    proof = scram.client_proof("SCRAM-SHA-256", salted, f"{bare},{first},{without_proof}".encode())
    return server.respond(f"{without_proof},p={scram.b64(proof)}".encode())


@pytest.mark.parametrize("nonce_of", [
    lambda nonce: nonce[:-1],  # all but the server's last character
    lambda nonce: "clientnonce",  # the client's part only
    lambda nonce: nonce[:len("clientnonce") + 1],
    lambda nonce: "",
], ids=["all-but-last", "client-part", "one-more", "empty"])
def test_scram_refuses_a_final_nonce_that_is_only_a_prefix_of_the_servers(
        checker: CredentialChecker, nonce_of: Callable[[str], str]) -> None:
    """RFC 5802: the client-final's nonce is the whole nonce of server-first. A prefix, with a proof
    right for the message that carries it, is refused (the same message with the whole nonce is
    accepted: only the nonce differs)."""
    assert _final_with_nonce(checker.server("SCRAM-SHA-256"), lambda nonce: nonce).user == "alice"
    step = _final_with_nonce(checker.server("SCRAM-SHA-256"), nonce_of)
    assert step.user is None and step.error == invalid_credentials("SCRAM-SHA-256")
    assert step.reason == "client-final: nonce differs from the server's"


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r", b" "])
def test_plain_refuses_the_password_with_a_line_ending_added(ending: bytes) -> None:
    """``alice-secret\\n`` is another password: refused by the slow hash before any login, and by
    the remembered digest after the right password logged in (both paths compare every byte)."""
    checker = CredentialChecker(CredentialStore({"alice": user_credentials(
        "alice-secret", ["PLAIN"], plain_iterations=PLAIN_MIN_ITERATIONS)}), MECHANISMS)
    first, verified = _plain(checker, b"\x00alice\x00alice-secret" + ending)
    assert first.verify is not None and verified is not None
    assert verified.user is None and verified.error == PLAIN_INVALID and verified.reason == "wrong password"
    _, verified = _plain(checker, b"\x00alice\x00alice-secret")
    assert verified is not None and verified.user == "alice"
    again, verified = _plain(checker, b"\x00alice\x00alice-secret" + ending)
    step = verified or again
    assert step.user is None and step.error == PLAIN_INVALID


def _server_first(checker: CredentialChecker, user: str, mechanism: str = "SCRAM-SHA-256") -> dict[str, str]:
    first = checker.server(mechanism).respond(f"n,,n={scram.escape_name(user)},r=abcdefgh".encode())
    return scram.attributes(first.challenge.decode())


def test_an_unknown_scram_user_gets_what_the_files_users_get() -> None:
    """A known user's server-first carried its own count (i=8192), an unknown user's the default
    (i=4096): a made-up entry takes its count and salt size from the file's entries."""
    store = CredentialStore({name: user_credentials(f"{name}-pw", ["SCRAM-SHA-256", "SCRAM-SHA-512"],
                                                    scram_iterations=8192) for name in ("alice", "bob")})
    checker = CredentialChecker(store, MECHANISMS)
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        known, unknown = _server_first(checker, "alice", mechanism), _server_first(checker, "mallory", mechanism)
        assert known["i"] == unknown["i"] == "8192"
        assert len(scram.unb64(known["s"], "s")) == len(scram.unb64(unknown["s"], "s"))


def test_an_unknown_users_made_up_salt_survives_a_restart_and_an_edit(tmp_path: Path) -> None:
    """A real user's salt stays across restarts: so does an unknown user's (the file's decoy_key
    keys it, not a per-process one), and across another user's addition."""
    path = tmp_path / "credentials.yaml"
    save_credentials(path, with_user(CredentialStore(), "alice", user_credentials("pw", ["SCRAM-SHA-256"])))
    before = _server_first(CredentialChecker(load_credentials(path), MECHANISMS), "mallory")
    restarted = _server_first(CredentialChecker(load_credentials(path), MECHANISMS), "mallory")
    assert (before["s"], before["i"]) == (restarted["s"], restarted["i"])
    save_credentials(path, with_user(load_credentials(path), "bob", user_credentials("pw", ["SCRAM-SHA-256"])))
    edited = _server_first(CredentialChecker(load_credentials(path), MECHANISMS), "mallory")
    assert before["s"] == edited["s"] != _server_first(CredentialChecker(load_credentials(path), MECHANISMS),
                                                       "eve")["s"]


def test_a_file_without_a_decoy_key_still_gives_the_same_salts_at_each_start() -> None:
    entry = user_credentials("pw", ["SCRAM-SHA-256"])
    one = CredentialChecker(CredentialStore({"alice": entry}), MECHANISMS)
    two = CredentialChecker(CredentialStore({"alice": entry}), MECHANISMS)
    assert _server_first(one, "mallory")["s"] == _server_first(two, "mallory")["s"]


def _refusal_cpu_seconds(checker: CredentialChecker, user: str) -> float:
    server = checker.server("PLAIN")
    step = server.respond(b"\x00" + user.encode() + b"\x00not-the-password")
    assert step.verify is not None
    began = time.thread_time()
    ok = step.verify()
    spent = time.thread_time() - began
    assert server.verified(ok).error == PLAIN_INVALID
    return spent


def test_an_unknown_plain_users_refusal_costs_what_a_known_users_does_with_mixed_counts() -> None:
    """With mixed iteration counts a known user's refusal took its own count's time and an unknown
    user's always the most common count's: alice (many iterations) stood out. Made-up entries take
    their counts from the file's entries, as often as the file holds each: among unknown names
    some cost what alice costs, the others what bob and carol cost, and each name always the same.
    Measured in CPU time of the hashing thread: other work on the machine does not move it."""
    heavy = 16 * PLAIN_MIN_ITERATIONS
    users = {"alice": user_credentials("a", ["PLAIN"], plain_iterations=heavy)}
    users |= {name: user_credentials(name, ["PLAIN"], plain_iterations=PLAIN_MIN_ITERATIONS)
              for name in ("bob", "carol")}
    checker = CredentialChecker(CredentialStore(users), MECHANISMS)
    alice, bob = _refusal_cpu_seconds(checker, "alice"), _refusal_cpu_seconds(checker, "bob")
    assert alice > 4 * bob
    # 30 names: all of them missing alice's count by chance is a 1 in 180,000 event.
    costs = {name: _refusal_cpu_seconds(checker, name) for name in (f"user-{i}" for i in range(30))}
    like_alice = {name for name, spent in costs.items() if spent > alice / 2}
    assert 0 < len(like_alice) < len(costs), costs
    assert all(spent < alice / 2 for name, spent in costs.items() if name not in like_alice)
    assert like_alice == {name for name in costs if _refusal_cpu_seconds(checker, name) > alice / 2}
