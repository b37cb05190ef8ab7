"""The credentials file of terminate mode: what it holds, what it refuses, and `kproxy credentials`.

The file never holds a password: PLAIN as a salted PBKDF2-HMAC-SHA-512 hash, SCRAM as Kafka
stores it. scramp (an independent SCRAM implementation) logs in against the keys kproxy wrote,
so keys derived wrongly fail here.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import scramp

from kproxy.cli import main
from kproxy.sasl import scram
from kproxy.sasl.credentials import (
    PLAIN_MIN_ITERATIONS,
    CredentialsError,
    CredentialStore,
    parse_document,
    plain_hash,
    to_document,
    user_credentials,
    verify_plain,
    with_user,
    without_user,
)
from kproxy.sasl.credentials_file import load_credentials, save_credentials

FAST = PLAIN_MIN_ITERATIONS  # the cheapest PLAIN hash a file may hold: tests need not spend 210,000 iterations


def test_a_plain_hash_checks_its_password_only() -> None:
    stored = plain_hash("s3cret", iterations=FAST)
    assert verify_plain(stored, b"s3cret")
    assert not verify_plain(stored, b"s3cret ")
    assert not verify_plain(stored, b"")
    other = plain_hash("s3cret", iterations=FAST)
    assert other.salt != stored.salt and other.hash != stored.hash  # a fresh salt each time


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_entries_let_an_independent_server_check_the_password(mechanism: str) -> None:
    """scramp's server, given the stored entry alone, accepts scramp's client with the password and
    refuses it without: the entry is Kafka's StoredKey/ServerKey, derived as RFC 5802 says."""
    entry = user_credentials("pässword", [mechanism], plain_iterations=FAST)
    cred = entry.scram[mechanism]
    doc = to_document(CredentialStore({"bob": entry}))
    assert "pässword" not in repr(doc) and set(doc["users"]["bob"][mechanism]) == {
        "iterations", "salt", "stored_key", "server_key"}
    for password, accepted in (("pässword", True), ("password", False)):
        server = scramp.ScramMechanism(mechanism).make_server(
            lambda _user: (cred.salt, cred.stored_key, cred.server_key, cred.iterations))
        client = scramp.ScramClient([mechanism], "bob", password)
        server.set_client_first(client.get_client_first())
        client.set_server_first(server.get_server_first())
        if accepted:
            server.set_client_final(client.get_client_final())
            client.set_server_final(server.get_server_final())
        else:
            with pytest.raises(scramp.ScramException):
                server.set_client_final(client.get_client_final())


def test_the_document_round_trips_and_holds_no_password(tmp_path: Path) -> None:
    store = with_user(CredentialStore(), "alice", user_credentials("alice-secret", ["PLAIN", "SCRAM-SHA-256"],
                                                                  plain_iterations=FAST))
    store = with_user(store, "b,o=b", user_credentials("bob-secret", ["SCRAM-SHA-512"]))
    path = tmp_path / "credentials.yaml"
    save_credentials(path, store)
    text = path.read_text()
    assert "secret" not in text
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert load_credentials(path) == store
    assert parse_document(to_document(store)) == store
    assert store.users["alice"].mechanisms == ("PLAIN", "SCRAM-SHA-256")
    assert without_user(store, "alice").users.keys() == {"b,o=b"}
    with pytest.raises(KeyError):
        without_user(store, "carol")


def test_json_is_read_too(tmp_path: Path) -> None:
    import json

    store = with_user(CredentialStore(), "alice", user_credentials("pw", ["SCRAM-SHA-256"]))
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps(to_document(store)))
    assert load_credentials(path) == store


@pytest.mark.parametrize(("document", "problem"), [
    ([1, 2], "(document): must be a mapping"),
    ({"version": 2, "users": {}}, "version: 2: this kproxy reads version 1"),
    ({"users": {}, "user": {}}, "user: unknown key"),
    ({"users": ["alice"]}, "users: must map user names"),
    ({"users": {"alice": {}}}, "users.alice: must map mechanisms"),
    ({"users": {"alice": {"GSSAPI": {}}}}, "users.alice.GSSAPI: unknown mechanism"),
    ({"users": {"al\x00ice": {"PLAIN": {}}}}, "control characters are not allowed"),
    ({"users": {"alice": {"PLAIN": {"algorithm": "md5", "iterations": 20000, "salt": "AA==",
                                    "hash": "AA=="}}}}, "users.alice.PLAIN.algorithm: 'md5'"),
    ({"users": {"alice": {"PLAIN": {"algorithm": "pbkdf2-hmac-sha512", "iterations": 10, "salt": "AA==",
                                    "hash": "A" * 88}}}}, "users.alice.PLAIN.iterations: must be an integer from"),
    ({"users": {"alice": {"PLAIN": {"algorithm": "pbkdf2-hmac-sha512", "iterations": 20000, "salt": "AA==",
                                    "hash": "AA=="}}}}, "users.alice.PLAIN.hash: 1 bytes, a SHA-512 hash has 64"),
    ({"users": {"alice": {"SCRAM-SHA-256": {"iterations": 4096, "salt": "not base64!", "stored_key": "AA==",
                                            "server_key": "AA=="}}}}, "users.alice.SCRAM-SHA-256.salt: not base64"),
    ({"users": {"alice": {"SCRAM-SHA-256": {"iterations": 100, "salt": "AA==", "stored_key": "A" * 44,
                                            "server_key": "A" * 44}}}},
     "users.alice.SCRAM-SHA-256.iterations: must be an integer from 4096 to 16384"),
    ({"users": {"alice": {"SCRAM-SHA-512": {"iterations": 4096, "salt": "AA==", "stored_key": "A" * 44,
                                            "server_key": "A" * 44, "password": "x"}}}},
     "users.alice.SCRAM-SHA-512.password: unknown key"),
    ({"decoy_key": "AAAA", "users": {}}, "decoy_key: 3 bytes, at least 16 are needed"),
    ({"decoy_key": 7, "users": {}}, "decoy_key: must be base64 text"),
    ({"decoy_key": "not base64!", "users": {}}, "decoy_key: not base64"),
])
def test_a_bad_document_is_refused_naming_where(document: object, problem: str) -> None:
    with pytest.raises(CredentialsError) as caught:
        parse_document(document)
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_an_empty_file_has_no_users(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_credentials(path) == CredentialStore()


def test_what_cannot_be_read_is_refused_with_the_path(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match=r"missing\.yaml: cannot read: No such file"):
        load_credentials(tmp_path / "missing.yaml")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(CredentialsError, match=r"not a regular file \(a FIFO\)"):
        load_credentials(fifo)
    bad = tmp_path / "bad.yaml"
    bad.write_text("users:\n  alice: [\n")
    with pytest.raises(CredentialsError, match=r"bad\.yaml:3: not YAML"):
        load_credentials(bad)


def test_passwords_and_names_kproxy_refuses_to_store() -> None:
    for password, problem in (("", "empty"), ("a\x00b", "NUL"), ("x" * 1025, "longer than 1024")):
        with pytest.raises(CredentialsError, match=problem):
            user_credentials(password, ["SCRAM-SHA-256"])
    with pytest.raises(CredentialsError, match="OAUTHBEARER"):
        user_credentials("pw", ["OAUTHBEARER"])
    with pytest.raises(CredentialsError, match="iterations"):
        user_credentials("pw", ["SCRAM-SHA-256"], scram_iterations=1000)
    with pytest.raises(CredentialsError, match="user name"):
        with_user(CredentialStore(), "", user_credentials("pw", ["SCRAM-SHA-256"]))


# -- kproxy credentials ---------------------------------------------------------------------------
def _cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str,
         stdin: str = "") -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    status = main(["credentials", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_command_adds_lists_replaces_and_removes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "creds.yaml"
    secret = tmp_path / "bob.txt"
    secret.write_text("bob-from-file\n")
    assert _cli(monkeypatch, capsys, "add", "alice", "--file", str(path), "--password-stdin",
                "--plain-iterations", str(FAST), stdin="alice-secret\nignored\n")[0] == 0
    assert _cli(monkeypatch, capsys, "add", "bob", "--file", str(path), "--password-file", str(secret),
                "--mechanisms", "scram-sha-512")[0] == 0
    status, out, _ = _cli(monkeypatch, capsys, "list", "--file", str(path))
    assert status == 0 and out == "alice\tPLAIN,SCRAM-SHA-256,SCRAM-SHA-512\nbob\tSCRAM-SHA-512\n"
    store = load_credentials(path)
    plain = store.plain("alice")
    assert plain is not None and verify_plain(plain, b"alice-secret")
    assert not verify_plain(plain, b"alice-secret\nignored")
    text = path.read_text()
    assert "alice-secret" not in text and "bob-from-file" not in text
    # The password of a user again: new entries (new salts), the other user's untouched.
    assert _cli(monkeypatch, capsys, "add", "alice", "--file", str(path), "--password-stdin", "--mechanisms",
                "SCRAM-SHA-256", stdin="changed\n")[0] == 0
    again = load_credentials(path)
    assert again.users["alice"].mechanisms == ("SCRAM-SHA-256",) and again.users["bob"] == store.users["bob"]
    assert _cli(monkeypatch, capsys, "remove", "alice", "--file", str(path))[0] == 0
    assert load_credentials(path).users.keys() == {"bob"}
    status, _, err = _cli(monkeypatch, capsys, "remove", "alice", "--file", str(path))
    assert status == 2 and "no user 'alice'" in err


def test_the_command_never_takes_a_password_as_a_flag_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "creds.yaml"
    status, _, err = _cli(monkeypatch, capsys, "add", "alice", "--file", str(path), "--password", "visible")
    assert status == 2 and "error: ambiguous option: --password" in err and not path.exists()
    # No terminal to ask on and no source named: refused, not read from stdin unasked.
    status, _, err = _cli(monkeypatch, capsys, "add", "alice", "--file", str(path), stdin="piped\n")
    assert status == 2 and "--password-file PATH or --password-stdin" in err and not path.exists()


def test_the_command_refuses_to_overwrite_a_file_that_does_not_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "creds.yaml"
    path.write_text("users: {alice: {PLAIN: {}}}\n")
    status, _, err = _cli(monkeypatch, capsys, "add", "bob", "--file", str(path), "--password-stdin", stdin="pw\n")
    assert status == 2 and "users.alice.PLAIN.algorithm" in err
    assert path.read_text() == "users: {alice: {PLAIN: {}}}\n"


def test_the_file_defaults_to_kproxy_runs_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "from-env.yaml"
    monkeypatch.setenv("KPROXY_SASL_CLIENT_CREDENTIALS_FILE", str(path))
    assert _cli(monkeypatch, capsys, "add", "carol", "--password-stdin", "--mechanisms", "SCRAM-SHA-256",
                stdin="pw\n")[0] == 0
    assert load_credentials(path).users.keys() == {"carol"}
    monkeypatch.delenv("KPROXY_SASL_CLIENT_CREDENTIALS_FILE")
    status, _, err = _cli(monkeypatch, capsys, "list")
    assert status == 2 and "no credentials file" in err


def test_scram_credentials_match_what_kafka_would_store() -> None:
    """RFC 7677's SCRAM-SHA-256 example, salted as there: the stored and server keys kproxy writes are
    the ones any implementation derives (so a Kafka broker given them accepts the same password)."""
    salt = scram.unb64("W22ZaJ0SNY7soEsUEjb6gQ==", "salt")
    cred = scram.credential("SCRAM-SHA-256", "pencil", salt=salt, iterations=4096)
    mech = scramp.ScramMechanism("SCRAM-SHA-256")
    _, stored, server_key, _ = mech.make_auth_info("pencil", iteration_count=4096, salt=salt)
    assert (cred.stored_key, cred.server_key) == (stored, server_key)


def test_the_decoy_key_is_made_once_and_kept_by_every_edit(tmp_path: Path) -> None:
    """The key of the unknown users' made-up entries (kproxy/sasl/unknown_users.py) is written with the
    first user and kept by every later add and remove, so their salts stay what they were."""
    path = tmp_path / "credentials.yaml"
    store = with_user(CredentialStore(), "alice", user_credentials("a-pw", ["SCRAM-SHA-256"]))
    assert store.decoy_key is not None and len(store.decoy_key) == 32
    save_credentials(path, store)
    assert load_credentials(path).decoy_key == store.decoy_key
    edited = without_user(with_user(load_credentials(path), "bob", user_credentials("b-pw", ["SCRAM-SHA-256"])),
                          "alice")
    assert edited.decoy_key == store.decoy_key
    assert with_user(CredentialStore(), "alice", store.users["alice"]).decoy_key != store.decoy_key
