"""Terminate mode with real clients: librdkafka and kafka-python log in to kproxy, which checks them
against its credentials file and forwards their traffic to the real Tansu broker (plaintext).

The clients check kproxy's SCRAM server signature themselves: a wrong one fails their login. What
they report for a wrong password is the broker's error text, as Kafka sends it. Around it: the
principal in the connection's log lines, for rules and in the capture; nothing secret in anything
the run wrote; a login that never ends closed by the frame deadline; failed logins counted and
rate-limited in the log; the credentials file re-read when it changes.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError as KafkaPythonError

from kproxy.logfmt import parse_logfmt
from kproxy.sasl.credentials import (
    PLAIN_MAX_ITERATIONS,
    PLAIN_MIN_ITERATIONS,
    CredentialStore,
    user_credentials,
    with_user,
    without_user,
)
from kproxy.sasl.credentials_file import load_credentials, save_credentials
from kproxy.testing import Broker, ProxyThread, running_proxy
from kproxy.testing.tansu import free_port
from tests.sasl_front import SaslFront
from tests.support.e2e import consume_confluent, consume_kafka_python, create_topic, produce_confluent, unique
from tests.support.sasl import SASL_AUTHENTICATE, SASL_HANDSHAKE, SaslSocket

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PASSWORDS = {"alice": "alice-Secret-7f3a", "bob": "bob-Secret-91c2"}
SCRAM_FAILED = "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"
PLAIN_FAILED = "Authentication failed: Invalid username or password"


def _store() -> CredentialStore:
    store = CredentialStore()
    for user, password in PASSWORDS.items():
        store = with_user(store, user, user_credentials(password, MECHANISMS, plain_iterations=PLAIN_MIN_ITERATIONS))
    return store


@pytest.fixture
def credentials(tmp_path: Path) -> Path:
    path = tmp_path / "credentials.yaml"
    save_credentials(path, _store())
    return path


@pytest.fixture
def terminating(tansu: Broker, credentials: Path) -> Iterator[ProxyThread]:
    with running_proxy(tansu.bootstrap, sasl__client__mode="terminate",
                       sasl__client__credentials_file=str(credentials)) as proxy:
        yield proxy


def _librdkafka(user: str, mechanism: str, password: str | None = None) -> dict[str, Any]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": PASSWORDS[user] if password is None else password}


def _kafka_python(user: str, mechanism: str, password: str | None = None) -> dict[str, Any]:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism, "sasl_plain_username": user,
            "sasl_plain_password": PASSWORDS[user] if password is None else password}


def _closed_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    return [parse_logfmt(r.getMessage()) for r in caplog.records if "event=connection_closed" in r.getMessage()]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_logs_in_with_each_mechanism_and_its_traffic_flows(
        tansu: Broker, terminating: ProxyThread, mechanism: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kproxy")
    topic = unique(f"terminate-{mechanism.lower()}")
    create_topic(tansu.bootstrap, topic, partitions=2)  # straight to the broker: kproxy's clients must log in
    sent = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(20)]
    produce_confluent(terminating.bootstrap, topic, sent, **_librdkafka("alice", mechanism)).flush(5)
    got = consume_confluent(terminating.bootstrap, topic, 2, len(sent), **_librdkafka("bob", mechanism))
    assert sorted(got) == sorted(sent)
    principals = {line.get("principal") for line in _closed_lines(caplog)}
    assert {"User:alice", "User:bob"} <= principals
    counts = terminating.server.stats.sasl_authentications
    assert counts[("client", mechanism, "success")] >= 2 and counts[("client", mechanism, "failure")] == 0


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_logs_in_with_each_mechanism_and_its_traffic_flows(
        tansu: Broker, terminating: ProxyThread, mechanism: str) -> None:
    topic = unique(f"terminate-kp-{mechanism.lower()}")
    create_topic(tansu.bootstrap, topic, partitions=1)
    producer = KafkaProducer(bootstrap_servers=terminating.bootstrap, **_kafka_python("alice", mechanism))
    try:
        for i in range(10):
            producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, partition=0).get(timeout=20)
    finally:
        producer.close(timeout=10)
    got = consume_kafka_python(terminating.bootstrap, topic, 1, 10, **_kafka_python("bob", mechanism))
    assert sorted(got) == [(b"k%d" % i, b"v%d" % i) for i in range(10)]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_kafka_python_with_raw_tokens_after_handshake_v0(
        terminating: ProxyThread, mechanism: str, caplog: pytest.LogCaptureFixture) -> None:
    """A client set to Kafka 0.10.1 sends SaslHandshake v0, then bare tokens (KIP-43's first form)."""
    caplog.set_level(logging.INFO, logger="kproxy")
    consumer = KafkaConsumer(bootstrap_servers=terminating.bootstrap, api_version=(0, 10, 1),
                             **_kafka_python("bob", mechanism))
    try:
        assert isinstance(consumer.topics(), set)  # a Metadata answered by the broker, after the login
    finally:
        consumer.close()
    assert terminating.server.stats.sasl_authentications[("client", mechanism, "success")] >= 1
    deadline = time.monotonic() + 10
    while "User:bob" not in {line.get("principal") for line in _closed_lines(caplog)}:
        assert time.monotonic() < deadline, "no connection_closed line names User:bob"
        time.sleep(0.1)


@pytest.mark.parametrize(("mechanism", "message"), [
    ("PLAIN", PLAIN_FAILED),
    ("SCRAM-SHA-256", SCRAM_FAILED.format("SCRAM-SHA-256")),
])
def test_a_wrong_password_is_refused_with_the_brokers_error(
        terminating: ProxyThread, mechanism: str, message: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kproxy")
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": terminating.bootstrap, "error_cb": errors.append,
                         "message.timeout.ms": 3000, **_librdkafka("alice", mechanism, "guess")})
    producer.produce("never", value=b"x")
    producer.flush(5)
    del producer  # it would keep trying to log in
    auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert auth and message in auth[0].str(), errors
    # kafka-python gives up bootstrapping (a timeout) and logs why each attempt failed: kproxy's words.
    caplog.set_level(logging.WARNING, logger="kafka")
    with pytest.raises(KafkaPythonError):
        KafkaProducer(bootstrap_servers=terminating.bootstrap, bootstrap_timeout_ms=3000,
                      **_kafka_python("bob", mechanism, "guess"))
    reported = [r.getMessage() for r in caplog.records if r.name.startswith("kafka.")]
    assert any(f"SaslAuthenticationFailedError: {message}" in line for line in reported), "\n".join(reported)
    closed = _closed_lines(caplog)
    assert closed and all("principal" not in line for line in closed)
    assert any(line["reason"] == f"SASL authentication failed: {message}" for line in closed)
    assert terminating.server.stats.sasl_authentications[("client", mechanism, "failure")] >= 2


def test_a_rule_for_alice_applies_to_alice_only(tansu: Broker, credentials: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - id: alice-refused\n    match: {api: produce, principal: alice}\n"
                     "    actions:\n      - inject_error: {error: TOPIC_AUTHORIZATION_FAILED}\n")
    topic = unique("terminate-rule")
    create_topic(tansu.bootstrap, topic, partitions=1)
    with running_proxy(tansu.bootstrap, rules=str(rules), sasl__client__mode="terminate",
                       sasl__client__credentials_file=str(credentials)) as proxy:
        outcomes: dict[str, list[KafkaError | None]] = {}
        for user in ("alice", "bob"):
            producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": "shared-app",
                                 "message.timeout.ms": 8000, "enable.idempotence": False,
                                 **_librdkafka(user, "SCRAM-SHA-256")})
            results: list[KafkaError | None] = []
            for i in range(3):
                producer.produce(topic, value=f"{user}-{i}".encode(), partition=0,
                                 on_delivery=lambda err, _msg, out=results: out.append(err))
            producer.flush(15)
            outcomes[user] = results
        hits = sum(n for (rule, _, _), n in proxy.server.stats.faults.hits.items() if rule == "alice-refused")
    refused = KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert len(outcomes["alice"]) == 3 and all(e is not None and e.code() == refused for e in outcomes["alice"])
    assert outcomes["bob"] == [None, None, None]
    assert hits >= 1
    stored = consume_confluent(tansu.bootstrap, topic, 1, 3)
    assert sorted(value for _, value in stored) == [b"bob-0", b"bob-1", b"bob-2"]


def test_no_secret_in_the_logs_the_metrics_or_the_capture(tansu: Broker, credentials: Path, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Right and wrong logins with every mechanism, traffic captured with payloads: neither password
    (nor the wrong one) appears in any log line, the metrics, or any byte of the capture files, read
    raw and decoded."""
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    caplog.set_level(logging.DEBUG, logger="kproxy")
    capture = tmp_path / "capture"
    wrong = "wrong-Guess-5d1e"
    topic = unique("terminate-secrets")
    create_topic(tansu.bootstrap, topic, partitions=1)
    with running_proxy(tansu.bootstrap, sasl__client__mode="terminate", sasl__client__credentials_file=str(credentials),
                       capture__dir=str(capture), capture__include_payloads=True, capture__rotate_seconds=1,
                       metrics_listen=f"127.0.0.1:{free_port()}") as proxy:
        for mechanism in MECHANISMS:
            produce_confluent(proxy.bootstrap, topic, [(b"k", mechanism.encode())],
                              **_librdkafka("alice", mechanism)).flush(5)
            errors: list[KafkaError] = []
            bad = Producer({"bootstrap.servers": proxy.bootstrap, "error_cb": errors.append,
                            "message.timeout.ms": 2000, **_librdkafka("alice", mechanism, wrong)})
            bad.produce(topic, value=b"x")
            bad.flush(4)
            del bad  # no more attempts: the next mechanism's logins are the ones counted
            assert any(e.code() == KafkaError._AUTHENTICATION for e in errors)
        assert proxy.server.metrics_server is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{proxy.server.metrics_server.port}/metrics",
                                    timeout=10) as answer:
            metrics = answer.read().decode()
    secrets = [PASSWORDS["alice"], wrong]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "event=sasl_authentication_failed" in logged and "principal=User:alice" in logged
    for secret in secrets:
        assert secret not in logged and secret not in metrics
    for mechanism in MECHANISMS:
        assert re.search(rf'kproxy_sasl_authentications_total{{mechanism="{mechanism}",result="success",'
                         rf'side="client"}} [1-9]', metrics), metrics
    files = [p for p in capture.rglob("*") if p.is_file()]
    decoded = ""
    for path in files:
        raw = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in raw, path
        if path.suffix == ".parquet":
            decoded += str(pq.read_table(path).to_pylist())
    assert "User:alice" in decoded and "SaslAuthenticate" in decoded  # who logged in, and the exchanges...
    for secret in secrets:
        assert secret not in decoded  # ...and nothing of how


def test_a_login_that_never_ends_is_closed_by_the_frame_deadline(tansu: Broker, credentials: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The whole login is held to one frame's deadline from the connection's first byte: a client
    that stops after SaslHandshake, or keeps sending ApiVersions to look alive, is closed."""
    caplog.set_level(logging.INFO, logger="kproxy")
    with running_proxy(tansu.bootstrap, sasl__client__mode="terminate", sasl__client__credentials_file=str(credentials),
                       limits__frame_timeout=1) as proxy:
        started = time.monotonic()
        with SaslSocket(proxy.port, timeout=5) as stalled:
            assert stalled.request(SASL_HANDSHAKE, 1, mechanism="SCRAM-SHA-256")["error_code"] == 0
            assert stalled.closed_by_peer()
        took = time.monotonic() - started
        with SaslSocket(proxy.port, timeout=5) as chatty:
            chatty.request(18, 3, client_software_name="x", client_software_version="1")
            deadline = time.monotonic() + 4
            closed = False
            while time.monotonic() < deadline and not closed:
                try:
                    chatty.request(18, 3, client_software_name="x", client_software_version="1")
                    time.sleep(0.2)
                except (ConnectionError, OSError):
                    closed = True
        rejected = proxy.server.stats.frames_rejected.get("request_timeout", 0)
    assert 0.9 <= took < 4, took
    assert closed
    reasons = [line["reason"] for line in _closed_lines(caplog)]
    assert reasons.count("SASL login not complete within frame_timeout 1 s") == 2, reasons
    assert rejected == 2


def test_the_deadline_holds_while_a_password_waits_for_its_hash(tansu: Broker, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A login whose password waits for its hash (queued behind others, or a slow one) is still held
    to the login's deadline: it was renewed while the hash was awaited, so a flood of logins kept
    connections past it. Here the hash takes longer than the deadline (the most iterations a file
    may hold): the connection closes at the deadline, unanswered."""
    caplog.set_level(logging.INFO, logger="kproxy")
    path = tmp_path / "slow.yaml"
    save_credentials(path, with_user(CredentialStore(), "slow", user_credentials(
        "slow-pw", ["PLAIN"], plain_iterations=PLAIN_MAX_ITERATIONS)))
    with running_proxy(tansu.bootstrap, sasl__client__mode="terminate", sasl__client__credentials_file=str(path),
                       limits__frame_timeout=1) as proxy, SaslSocket(proxy.port, timeout=10) as sock:
        assert sock.request(SASL_HANDSHAKE, 1, mechanism="PLAIN")["error_code"] == 0
        began = time.monotonic()
        sock.send(SASL_AUTHENTICATE, 2, auth_bytes=b"\x00slow\x00wrong")
        assert sock.closed_by_peer()
        took = time.monotonic() - began
    assert took < 1.5, took
    reasons = [line["reason"] for line in _closed_lines(caplog)]
    assert reasons == ["SASL login not complete within frame_timeout 1 s"], reasons


def test_an_address_over_its_share_of_hashes_is_refused_unhashed_a_second_later(
        tansu: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One address with 16 distinct passwords being hashed (1 running, 15 queued: slow ones) gets
    its 17th login refused without a hash, a second later rather than at once (a flood's refused
    connections must not come straight back); closing the 16 drops the queued hashes."""
    caplog.set_level(logging.INFO, logger="kproxy")
    path = tmp_path / "slow.yaml"
    save_credentials(path, with_user(CredentialStore(), "slow", user_credentials(
        "slow-pw", ["PLAIN"], plain_iterations=PLAIN_MAX_ITERATIONS)))
    with running_proxy(tansu.bootstrap, sasl__client__mode="terminate",
                       sasl__client__credentials_file=str(path)) as proxy, contextlib.ExitStack() as stack:
        waiting = [stack.enter_context(SaslSocket(proxy.port, timeout=10)) for _ in range(16)]
        for i, sock in enumerate(waiting):
            assert sock.request(SASL_HANDSHAKE, 1, mechanism="PLAIN")["error_code"] == 0
            sock.send(SASL_AUTHENTICATE, 2, auth_bytes=b"\x00slow\x00guess-%d" % i)
        checks = proxy.server.client_auth.password_checks
        deadline = time.monotonic() + 10
        while checks.queued + checks.running < 16 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (checks.running, checks.queued) == (1, 15)
        with SaslSocket(proxy.port, timeout=10) as over:
            assert over.request(SASL_HANDSHAKE, 1, mechanism="PLAIN")["error_code"] == 0
            began = time.monotonic()
            answer = over.request(SASL_AUTHENTICATE, 2, auth_bytes=b"\x00slow\x00another-guess")
            took = time.monotonic() - began
        assert answer["error_code"] == 58 and answer["error_message"] == PLAIN_FAILED
        assert 0.9 <= took < 5, took
        assert checks.refused == 1 and checks.runs == 1
        stack.close()  # the 16 leave: their queued hashes go
        deadline = time.monotonic() + 10
        while checks.queued and time.monotonic() < deadline:
            time.sleep(0.02)
        assert checks.queued == 0 and checks.runs == 1
    failures = [r.getMessage() for r in caplog.records if "event=sasl_authentication_failed" in r.getMessage()]
    assert failures and "not checked: too many password checks under way" in failures[0], failures


def test_failed_logins_are_counted_each_and_logged_at_most_once_per_interval(
        terminating: ProxyThread, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kproxy")
    started = time.monotonic()
    for _ in range(15):
        with SaslSocket(terminating.port) as sock:
            answer = sock.scram_login("SCRAM-SHA-512", "mallory", "guess")
            assert answer["error_code"] == 58 and answer["error_message"] == SCRAM_FAILED.format("SCRAM-SHA-512")
            assert sock.closed_by_peer()
    took = time.monotonic() - started
    lines = [parse_logfmt(r.getMessage()) for r in caplog.records
             if "event=sasl_authentication_failed" in r.getMessage()]
    # One line at once, then at most one per 10 s standing for those held back (a loaded machine may
    # take over 10 s for the 15 logins).
    assert 1 <= len(lines) <= 1 + int(took // 10), (took, lines)
    assert lines[0]["occurrences"] == "1" and sum(int(line["occurrences"]) for line in lines) <= 15
    assert all(line["user"] == "mallory" and line["reason"] == "unknown user" for line in lines)
    assert terminating.server.stats.sasl_authentications[("client", "SCRAM-SHA-512", "failure")] == 15


def test_a_login_with_a_mechanism_the_user_lacks_logs_why_and_tells_the_client_nothing_more(
        tansu: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """carol exists with SCRAM-SHA-512 only: her PLAIN login is logged as such, not as an unknown
    user, while the client gets the broker's generic answer, as for a wrong password or an unknown
    user (the failed-login line is rate-limited: one login here, its line logged at once)."""
    caplog.set_level(logging.INFO, logger="kproxy")
    path = tmp_path / "credentials.yaml"
    save_credentials(path, with_user(CredentialStore(), "carol", user_credentials("carol-Secret-0b1d",
                                                                                   ["SCRAM-SHA-512"])))
    with running_proxy(tansu.bootstrap, sasl__client__mode="terminate",
                       sasl__client__credentials_file=str(path)) as proxy:
        with SaslSocket(proxy.port) as sock:
            assert sock.request(SASL_HANDSHAKE, 1, mechanism="PLAIN")["error_code"] == 0
            answer = sock.request(SASL_AUTHENTICATE, 2, auth_bytes=b"\x00carol\x00carol-Secret-0b1d")
        deadline = time.monotonic() + 10
        while not (lines := [parse_logfmt(r.getMessage()) for r in caplog.records
                             if "event=sasl_authentication_failed" in r.getMessage()]):
            assert time.monotonic() < deadline, "no sasl_authentication_failed line"
            time.sleep(0.05)
    assert [(line["user"], line["mechanism"], line["reason"]) for line in lines] == [
        ("carol", "PLAIN", "mechanism not enabled for this user")]
    assert (answer["error_code"], answer["error_message"]) == (58, PLAIN_FAILED)


def test_a_changed_credentials_file_applies_to_the_next_logins(terminating: ProxyThread, credentials: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kproxy")

    def login(user: str, password: str) -> int:
        with SaslSocket(terminating.port) as sock:
            return int(sock.scram_login("SCRAM-SHA-256", user, password)["error_code"])

    def eventually(user: str, password: str, code: int) -> None:
        deadline = time.monotonic() + 10
        while login(user, password) != code:
            assert time.monotonic() < deadline, f"{user}'s login still not {code}"
            time.sleep(0.2)

    assert login("carol", "carol-pw") == 58
    save_credentials(credentials, with_user(load_credentials(credentials), "carol",
                                            user_credentials("carol-pw", ["SCRAM-SHA-256"])))
    eventually("carol", "carol-pw", 0)
    good = load_credentials(credentials)
    credentials.write_text(credentials.read_text().replace("stored_key:", "stored-key:", 1))  # does not load
    time.sleep(1.5)  # a few polls: one warning line, the users in force kept
    assert login("alice", PASSWORDS["alice"]) == 0 and login("carol", "carol-pw") == 0
    failed = [r.getMessage() for r in caplog.records if "event=credentials_reload_failed" in r.getMessage()]
    assert len(failed) == 1 and "unknown key" in failed[0] and "users_in_force=3" in failed[0], failed
    save_credentials(credentials, without_user(good, "alice"))
    eventually("alice", PASSWORDS["alice"], 58)
    assert login("carol", "carol-pw") == 0
    assert any("event=credentials_reloaded" in r.getMessage() and "users=2" in r.getMessage() for r in caplog.records)


def test_librdkafka_reauthenticates_within_the_session_lifetime(tansu: Broker, credentials: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """KIP-368: with sasl.client.session_lifetime, kproxy tells the client how long its login lasts;
    librdkafka logs in again on the same connection before that, and nothing it sends is lost."""
    caplog.set_level(logging.DEBUG, logger="kproxy.sasl")
    topic = unique("terminate-reauth")
    create_topic(tansu.bootstrap, topic, partitions=1)
    with running_proxy(tansu.bootstrap, sasl__client__mode="terminate", sasl__client__credentials_file=str(credentials),
                       sasl__client__session_lifetime=1.5) as proxy:
        errors: list[KafkaError] = []
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "error_cb": errors.append,
                             **_librdkafka("alice", "SCRAM-SHA-256")})
        delivered: list[KafkaError | None] = []
        for i in range(10):
            producer.produce(topic, value=b"%d" % i, partition=0, on_delivery=lambda e, _m: delivered.append(e))
            producer.flush(5)
            time.sleep(0.5)
        opened = proxy.server.connections_total
    assert delivered == [None] * 10 and not errors
    again = [r.getMessage() for r in caplog.records
             if "event=sasl_authenticated" in r.getMessage() and "reauthentication=True" in r.getMessage()]
    assert len(again) >= 2, again
    assert opened <= 3  # the bootstrap connection and the broker's, kept: no reconnect to log in
    assert len(consume_confluent(tansu.bootstrap, topic, 1, 10)) == 10


def test_the_gateway_clients_log_in_to_kproxy_and_kproxy_to_the_cluster(
        sasl_front: SaslFront, credentials: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Both sides at once, the sidecar of deploy/kubernetes/sidecar-example.yaml: the application logs
    in to kproxy as alice (checked against kproxy's credentials file), and kproxy logs in to the
    authenticating cluster as its own service user (sasl.upstream), which is all the cluster sees.
    A rule scoped to alice sees alice, not the service user."""
    caplog.set_level(logging.INFO, logger="kproxy")
    sasl_front.credentials.set_password("kproxy-svc", "svc-Secret-0b7e")
    password = tmp_path / "svc-password"
    password.write_text("svc-Secret-0b7e\n")
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - id: alice-slowed\n    match: {api: produce, principal: alice}\n"
                     "    actions:\n      - delay: {ms: 1}\n")
    topic = unique("gateway")
    with running_proxy(sasl_front.bootstrap, rules=str(rules), sasl__client__mode="terminate",
                       sasl__client__credentials_file=str(credentials), sasl__upstream__mechanism="SCRAM-SHA-512",
                       sasl__upstream__username="kproxy-svc", sasl__upstream__password_file=str(password)) as proxy:
        _started(proxy)
        front_before = (sasl_front.events.accepted, sasl_front.events.count("ok"))
        create_topic(proxy.bootstrap, topic, 1, **_librdkafka("alice", "SCRAM-SHA-256"))
        sent = [(b"k%d" % i, b"v%d" % i) for i in range(10)]
        produce_confluent(proxy.bootstrap, topic, sent, **_librdkafka("alice", "SCRAM-SHA-256")).flush(5)
        got = consume_kafka_python(proxy.bootstrap, topic, 1, len(sent), **_kafka_python("bob", "PLAIN"))
        hits = sum(n for (rule, _, _), n in proxy.server.stats.faults.hits.items() if rule == "alice-slowed")
        counts = dict(proxy.server.stats.sasl_authentications)
    assert sorted(got) == sorted(sent)
    assert set(sasl_front.events.principals) == {"User:kproxy-svc"}  # the cluster sees kproxy's user only
    # Each connection kproxy opened to the cluster was for a client that had logged in, and logged in once.
    opened = sasl_front.events.accepted - front_before[0]
    assert 0 < opened == sasl_front.events.count("ok") - front_before[1] <= counts[("client", "SCRAM-SHA-256",
                                                                                     "success")] + counts[
        ("client", "PLAIN", "success")]
    assert hits >= 1
    assert counts[("upstream", "SCRAM-SHA-512", "success")] >= 3
    assert counts[("client", "SCRAM-SHA-256", "success")] >= 2 and counts[("client", "PLAIN", "success")] >= 1
    principals = {line.get("principal") for line in _closed_lines(caplog)}
    assert {"User:alice", "User:bob"} <= principals and "User:kproxy-svc" not in principals


def _started(proxy: ProxyThread) -> None:
    """kproxy's own start-up connections made: broker discovery and the first upstream check."""
    server = proxy.server
    assert server is not None
    deadline = time.monotonic() + 20
    while not (server.warmed.is_set() and server.health.checked.is_set()):
        assert time.monotonic() < deadline, "kproxy did not finish its start-up checks"
        time.sleep(0.05)


def test_clients_that_do_not_log_in_cost_the_authenticating_cluster_nothing(
        sasl_front: SaslFront, credentials: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The gateway (terminate mode, kproxy logging in upstream as its service user): 20 clients that
    fail their login, or never try it, open no connection to the cluster and make kproxy log in to it
    for none of them; a client that logs in opens one, on which kproxy logs in once."""
    caplog.set_level(logging.INFO, logger="kproxy")
    sasl_front.credentials.set_password("kproxy-svc", "svc-Secret-0b7e")
    password = tmp_path / "svc-password"
    password.write_text("svc-Secret-0b7e\n")
    with running_proxy(sasl_front.bootstrap, sasl__client__mode="terminate", sasl__client__credentials_file=str(
            credentials), sasl__upstream__mechanism="SCRAM-SHA-512", sasl__upstream__username="kproxy-svc",
                       sasl__upstream__password_file=str(password), upstream_check_interval=3600) as proxy:
        _started(proxy)
        server = proxy.server
        assert server is not None
        events = sasl_front.events
        accepted, logins, upstream_logins = events.accepted, events.count("ok"), dict(server.stats.sasl_authentications)
        for i in range(20):
            with SaslSocket(proxy.port) as sock:
                if i % 4 == 0:  # a wrong SCRAM password
                    assert sock.scram_login("SCRAM-SHA-512", "alice", "guess")["error_code"] == 58
                    assert sock.closed_by_peer()
                elif i % 4 == 1:  # a wrong PLAIN password
                    assert sock.request(SASL_HANDSHAKE, 1, mechanism="PLAIN")["error_code"] == 0
                    assert sock.request(SASL_AUTHENTICATE, 2, auth_bytes=b"\x00bob\x00guess")["error_code"] == 58
                    assert sock.closed_by_peer()
                elif i % 4 == 2:  # ApiVersions (answered: the cluster's versions), then gone
                    assert sock.request(18, 3, client_software_name="x", client_software_version="1")["error_code"] == 0
        deadline = time.monotonic() + 10
        while len(_closed_lines(caplog)) < 20:
            assert time.monotonic() < deadline, "kproxy kept connections of clients that left"
            time.sleep(0.05)
        assert (events.accepted, events.count("ok")) == (accepted, logins)  # the cluster heard of none of them
        stats = server.stats
        assert stats.sasl_authentications[("client", "SCRAM-SHA-512", "failure")] == 5
        assert stats.sasl_authentications[("client", "PLAIN", "failure")] == 5
        assert {k: v for k, v in stats.sasl_authentications.items() if k[0] == "upstream"} == {
            k: v for k, v in upstream_logins.items() if k[0] == "upstream"}
        assert not any(stats.upstream_connections.values())
        assert [line["upstream"] for line in _closed_lines(caplog)] == ["-"] * 20
        # One that logs in: one connection to the cluster, one login of kproxy's on it, its Metadata answered.
        with SaslSocket(proxy.port) as sock:
            assert sock.scram_login("SCRAM-SHA-256", "alice", PASSWORDS["alice"])["error_code"] == 0
            assert sock.request(3, 12, topics=None)["brokers"]
            assert (events.accepted, events.count("ok")) == (accepted + 1, logins + 1)
            assert sum(stats.upstream_connections.values()) == 1
    assert events.principals[-1] == "User:kproxy-svc"
