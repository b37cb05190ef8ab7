"""kproxy logs in to the cluster for its clients (``sasl.upstream``), end to end: real clients that
do not do SASL (librdkafka, kafka-python), through kproxy, to the authenticating front of
tests/sasl_front.py (SASL answered as Kafka answers it, then Tansu, which cannot authenticate).

Each mechanism for each client; broker discovery and TLS upstream (TLS first, then SASL);
re-authentication (KIP-368) with pipelined requests in flight, against a front that closes
connections whose session expired as Kafka does; a rotated secret (front first, then the file,
a Kubernetes-style symlink swap) used from the next login with no client error; a wrong password
refused with the broker's error, one log line; a client's own SASL refused; and the secrets
nowhere in what a run writes (logs, metrics, capture files, error messages).
"""

from __future__ import annotations

import logging
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Producer

from kproxy.protocol.codes import ApiKey
from kproxy.testing import free_port, running_proxy
from tests.sasl_front import MECHANISMS, SaslFront, unsecured_jws
from tests.support.e2e import (
    consume_confluent,
    consume_kafka_python,
    create_topic,
    no_protocol_errors_in_kproxy,
    produce_confluent,
    unique,
)
from tests.support.k8s_secret import kubernetes_secret, swap
from tests.support.kafkaclient import KafkaClient
from tests.support.pki import server_pki

MESSAGES = [(None, f"m{i}".encode()) for i in range(20)]


def upstream_options(directory: Path, mechanism: str, secret: str = "s3cret") -> dict[str, Any]:
    """kproxy's options to log in as alice with ``mechanism`` (the secret in a file under ``directory``;
    OAUTHBEARER: an unsecured token naming alice unless ``secret`` is a token)."""
    directory.mkdir(parents=True, exist_ok=True)
    if mechanism == "OAUTHBEARER":
        token = directory / "token"
        token.write_text(unsecured_jws("alice") if secret == "s3cret" else secret)
        return {"sasl__upstream__mechanism": mechanism, "sasl__upstream__token_file": str(token)}
    password = directory / "password"
    password.write_text(secret + "\n")
    return {"sasl__upstream__mechanism": mechanism, "sasl__upstream__username": "alice",
            "sasl__upstream__password_file": str(password)}


def accept_alice(front: SaslFront, password: str = "s3cret") -> None:
    front.credentials.set_password("alice", password)
    front.credentials.set_oauth(subject="alice")


def kafka_python_roundtrip(bootstrap: str, topic: str) -> list[Any]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    try:
        for f in [producer.send(topic, value=v, partition=0) for _, v in MESSAGES]:
            f.get(timeout=15)
    finally:
        producer.close(10)
    return consume_kafka_python(bootstrap, topic, 1, len(MESSAGES))


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def sasl_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("kproxy") and "SASL" in r.getMessage()]


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_clients_without_sasl_produce_and_consume_as_kproxys_login(
        sasl_front: SaslFront, tmp_path: Path, caplog: pytest.LogCaptureFixture, mechanism: str, client: str) -> None:
    accept_alice(sasl_front)
    topic = unique(f"up-{client}")
    with no_protocol_errors_in_kproxy(caplog), \
            running_proxy(sasl_front.bootstrap, **upstream_options(tmp_path, mechanism)) as proxy:
        create_topic(proxy.bootstrap, topic, 1)
        if client == "librdkafka":
            produce_confluent(proxy.bootstrap, topic, MESSAGES)
            got = consume_confluent(proxy.bootstrap, topic, 1, len(MESSAGES))
        else:
            got = kafka_python_roundtrip(proxy.bootstrap, topic)
    assert sorted(v for _, v in got) == sorted(v for _, v in MESSAGES)
    assert sasl_front.events.count("ok", mechanism) >= 2  # discovery's and the clients' connections
    assert sasl_front.events.count("refused") == 0
    assert set(sasl_front.events.principals) == {"User:alice"}
    assert not sasl_lines(caplog)


def test_broker_discovery_logs_in_before_any_client(sasl_front: SaslFront, tmp_path: Path) -> None:
    accept_alice(sasl_front)
    with running_proxy(sasl_front.bootstrap, **upstream_options(tmp_path, "SCRAM-SHA-512")) as proxy:
        assert proxy.server is not None
        deadline = time.monotonic() + 15
        while not proxy.server.warmed.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.server.warmed.is_set(), "brokers not discovered: discovery did not log in"
        assert any(listener.node_id is not None for listener in list(proxy.server.listeners.values()))
    assert sasl_front.events.count("ok", "SCRAM-SHA-512") == 1


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return server_pki(tmp_path_factory.mktemp("pki"))


def test_upstream_tls_then_sasl(tmp_path: Path, pki: dict[str, Path]) -> None:
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(pki["cert"]), str(pki["key"]))
    topic = unique("up-tls")
    with SaslFront(ssl_context=context) as front:
        accept_alice(front)
        with running_proxy(front.bootstrap, tls__upstream__enabled=True, tls__upstream__ca=str(pki["ca"]),
                           tls__upstream__server_name="localhost",
                           **upstream_options(tmp_path, "SCRAM-SHA-256")) as proxy:
            create_topic(proxy.bootstrap, topic, 1)
            produce_confluent(proxy.bootstrap, topic, MESSAGES)
            got = consume_confluent(proxy.bootstrap, topic, 1, len(MESSAGES))
        assert len(got) == len(MESSAGES)
        assert front.events.count("ok", "SCRAM-SHA-256") >= 2
        assert not [reason for reason in front.events.closes if reason.startswith("handshake failed")]


# -- re-authentication (KIP-368) ------------------------------------------------------------------
def test_pipelined_requests_keep_their_order_across_reauthentications(sasl_front: SaslFront, tmp_path: Path) -> None:
    """A client pipelining bursts of requests through kproxy while kproxy re-authenticates under it:
    every answer comes back, in order, and the front (which closes an expired session's connection,
    and any connection sending another request during a login) closes none."""
    accept_alice(sasl_front)
    sasl_front.session_lifetime_ms = 2500

    async def pipeline(port: int) -> int:
        bursts = 0
        async with await KafkaClient.connect(port, timeout=15) as client:
            deadline = trio.current_time() + 7.5
            while trio.current_time() < deadline:
                sent = [await client.send(ApiKey.METADATA, 12, topics=[]) for _ in range(25)]
                sent += [await client.send(ApiKey.API_VERSIONS, 3, client_software_name="t",
                                           client_software_version="1") for _ in range(5)]
                for correlation_id in sent:
                    answer = await client.receive()  # asserts the correlation id is the next one sent
                    assert answer.header.correlation_id == correlation_id
                bursts += 1
                await trio.sleep(0.02)
        return bursts

    with running_proxy(sasl_front.bootstrap, **upstream_options(tmp_path, "PLAIN")) as proxy:
        bursts = trio.run(pipeline, proxy.port)
    assert bursts > 10
    assert sasl_front.events.count("reauth_ok", "PLAIN") >= 2
    assert sasl_front.events.count("reauth_refused") == 0
    assert sasl_front.events.closes["session expired"] == 0
    assert not [r for r in sasl_front.events.closes if r.startswith("unexpected request")]


def test_a_producer_with_requests_in_flight_across_reauthentications(sasl_front: SaslFront, tmp_path: Path) -> None:
    accept_alice(sasl_front)
    sasl_front.session_lifetime_ms = 2500
    topic = unique("up-reauth")
    errors: list[str] = []
    delivered: list[bytes] = []
    with running_proxy(sasl_front.bootstrap, **upstream_options(tmp_path, "SCRAM-SHA-512")) as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 0, "acks": "all",
                             "max.in.flight.requests.per.connection": 5, "error_cb": lambda e: errors.append(str(e))})

        def report(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                delivered.append(msg.value())

        sent = 0
        deadline = time.monotonic() + 7
        while time.monotonic() < deadline:
            producer.produce(topic, f"v{sent}".encode(), partition=0, on_delivery=report)
            sent += 1
            producer.poll(0.005)
        assert producer.flush(20) == 0
        got = consume_confluent(proxy.bootstrap, topic, 1, sent)
    assert not errors
    assert len(delivered) == sent and sorted(v for _, v in got) == sorted(delivered)
    assert sasl_front.events.count("reauth_ok", "SCRAM-SHA-512") >= 2
    assert sasl_front.events.closes["session expired"] == 0


# -- a rotated secret ------------------------------------------------------------------------------
def test_a_rotated_secret_is_used_from_the_next_login_with_no_client_error(
        sasl_front: SaslFront, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The password changes at the front, then in the file (a Kubernetes Secret's symlink swap): the
    next logins (re-authentications of the connections open, new connections) use the new one. (A
    login begun between the two steps would be refused, as it would against a real cluster; the
    steps are a few microseconds apart and logins seconds apart.)"""
    caplog.set_level(logging.INFO, logger="kproxy")
    accept_alice(sasl_front, "old-password")
    sasl_front.session_lifetime_ms = 3000
    secret = tmp_path / "secret"
    password = kubernetes_secret(secret, "old-password")
    metrics_port = free_port()
    topic = unique("up-rotate")
    errors: list[str] = []
    with running_proxy(sasl_front.bootstrap, sasl__upstream__mechanism="SCRAM-SHA-256",
                       sasl__upstream__username="alice", sasl__upstream__password_file=str(password),
                       metrics_listen=f"127.0.0.1:{metrics_port}") as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "error_cb": lambda e: errors.append(str(e))})
        sent = 0

        def produce_for(seconds: float) -> None:
            nonlocal sent
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                producer.produce(topic, b"x", partition=0)
                sent += 1
                producer.poll(0.01)

        produce_for(1.0)
        before = sasl_front.events.count("reauth_ok")
        sasl_front.credentials.set_password("alice", "new-password")
        swap(secret, "new-password", "..2024_02_01_00_00_00.1")
        produce_for(4.5)  # every connection re-authenticates in this time (3000 ms sessions)
        assert producer.flush(20) == 0
        got = consume_confluent(proxy.bootstrap, topic, 1, sent)  # new connections: new logins
        metrics = scrape(metrics_port)
    assert not errors
    assert len(got) == sent
    assert sasl_front.events.count("reauth_ok") >= before + 2  # with the new password: the old is refused now
    assert sasl_front.events.count("refused") == sasl_front.events.count("reauth_refused") == 0
    assert [r.getMessage() for r in caplog.records if "sasl_secret" in r.getMessage()] == [
        f"event=sasl_secret_reloaded option=sasl.upstream.password_file file={password}"]
    assert 'kproxy_sasl_authentications_total{mechanism="SCRAM-SHA-256",result="failure",side="upstream"} 0.0' \
        in metrics
    reauths = [line for line in metrics.splitlines()
               if line.startswith("kproxy_sasl_reauthentications_total{") and 'result="success"' in line]
    assert reauths and float(reauths[0].split()[-1]) >= 2


# -- refusals ---------------------------------------------------------------------------------------
def test_a_wrong_password_gets_the_clients_the_brokers_error_and_kproxy_one_line(
        sasl_front: SaslFront, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    accept_alice(sasl_front)
    metrics_port = free_port()
    librdkafka = logging.getLogger("test.librdkafka")
    with running_proxy(sasl_front.bootstrap, metrics_listen=f"127.0.0.1:{metrics_port}",
                       **upstream_options(tmp_path, "PLAIN", "not-the-password")) as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "logger": librdkafka, "reconnect.backoff.ms": 500})
        producer.produce("t", b"x")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any(
                "SASL Authentication failed" in r.getMessage() for r in caplog.records if r.name == librdkafka.name):
            producer.poll(0.2)
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        with pytest.raises(KafkaError):
            KafkaProducer(bootstrap_servers=proxy.bootstrap, bootstrap_timeout_ms=3000, request_timeout_ms=3000)
        metrics = scrape(metrics_port)
        del producer
    # librdkafka reads the error code of its first request's answer (ApiVersions), kafka-python too.
    assert any("ApiVersionRequest failed: Broker: SASL Authentication failed" in r.getMessage()
               for r in caplog.records if r.name == librdkafka.name)
    assert any("SaslAuthenticationFailedError" in r.getMessage() for r in caplog.records if r.name.startswith("kafka"))
    # One line per refused connection, naming the broker's error and words; nothing of the password.
    lines = [line for line in sasl_lines(caplog) if "peer=" in line]  # (not broker discovery's line)
    assert lines
    peers = [line.split("peer=")[1].split()[0] for line in lines]
    assert len(peers) == len(set(peers))
    assert all('reason="upstream SASL authentication (PLAIN) failure: SASL_AUTHENTICATION_FAILED: Authentication '
               'failed: Invalid username or password"' in line for line in lines)
    assert all("not-the-password" not in r.getMessage() for r in caplog.records)
    failures = [line for line in metrics.splitlines()
                if line.startswith('kproxy_sasl_authentications_total{mechanism="PLAIN",result="failure"')]
    assert failures and float(failures[0].split()[-1]) >= 2


def test_a_client_doing_its_own_sasl_is_refused_as_a_plaintext_broker_refuses_it(
        sasl_front: SaslFront, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With sasl.upstream, kproxy is the one logged in: a client's own SaslHandshake is answered
    ILLEGAL_SASL_STATE (what a Kafka broker answers where no login is needed), never relayed."""
    caplog.set_level(logging.INFO)
    accept_alice(sasl_front)
    errors: list[str] = []
    with running_proxy(sasl_front.bootstrap, **upstream_options(tmp_path, "PLAIN")) as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                             "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "s3cret",
                             "error_cb": lambda e: errors.append(str(e)), "reconnect.backoff.ms": 1000})
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            producer.poll(0.2)
        del producer
    assert any("Request not valid in current SASL state" in e for e in errors), errors  # ILLEGAL_SASL_STATE
    refused = [r.getMessage() for r in caplog.records if "client_sasl_refused" in r.getMessage()]
    assert refused and all("ILLEGAL_SASL_STATE" in line for line in refused)
    # Only kproxy's own logins reached the front (discovery's and the client connections').
    assert sasl_front.events.count("refused") == 0 and set(sasl_front.events.principals) == {"User:alice"}


# -- secrets stay secret -----------------------------------------------------------------------------
@pytest.fixture
def captured_dir(tmp_path: Path) -> Iterator[Path]:
    pytest.importorskip("pyarrow")
    directory = tmp_path / "capture"
    yield directory


def test_secrets_are_nowhere_in_what_a_run_writes(sasl_front: SaslFront, tmp_path: Path, captured_dir: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A run through logins, re-authentications, a rotation, a wrong password and a client's own
    SASL; then every log record (kproxy's at debug, the clients'), the metrics, the capture files
    (bytes and rows) and the errors clients saw are searched for the passwords."""
    import pyarrow.parquet as pq

    caplog.set_level(logging.DEBUG)
    first, second, client_secret = (f"{name}-{uuid.uuid4().hex}" for name in ("first", "second", "client"))
    accept_alice(sasl_front, first)
    sasl_front.session_lifetime_ms = 2000
    metrics_port = free_port()
    seen: list[str] = []
    options = upstream_options(tmp_path / "secret", "SCRAM-SHA-256", first)
    with running_proxy(sasl_front.bootstrap, capture__dir=str(captured_dir), metrics_listen=f"127.0.0.1:{metrics_port}",
                       log_level="debug", **options) as proxy:
        topic = unique("up-secret")
        create_topic(proxy.bootstrap, topic, 1)
        produce_confluent(proxy.bootstrap, topic, MESSAGES, error_cb=lambda e: seen.append(str(e)))
        time.sleep(2.5)  # a re-authentication
        sasl_front.credentials.set_password("alice", second)
        Path(options["sasl__upstream__password_file"]).write_text(second)
        assert len(consume_confluent(proxy.bootstrap, topic, 1, len(MESSAGES))) == len(MESSAGES)
        logger = logging.getLogger("test.librdkafka")

        def until(what: str, client: Producer) -> None:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not any(what in r.getMessage() for r in caplog.records):
                client.poll(0.1)

        own = Producer({"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                        "sasl.mechanism": "PLAIN", "sasl.username": "bob", "sasl.password": client_secret,
                        "error_cb": lambda e: seen.append(str(e)), "logger": logger})
        until("client_sasl_refused", own)
        sasl_front.credentials.set_password("alice", "the-front-changed-again")  # kproxy's is wrong now
        refused = Producer({"bootstrap.servers": proxy.bootstrap, "error_cb": lambda e: seen.append(str(e)),
                            "logger": logger})
        refused.produce(topic, b"x")
        until("SASL Authentication failed", refused)
        del refused, own
        metrics = scrape(metrics_port)
    secrets = (first, second, client_secret)
    records = [f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records]
    assert any("upstream SASL authentication (SCRAM-SHA-256) failure" in line for line in records)
    assert any("client_sasl_refused" in line for line in records) and metrics
    files = list(captured_dir.rglob("*.parquet"))
    assert files, "nothing captured"
    rows = [str(row) for f in files for row in pq.read_table(f).to_pylist()]
    written = [*records, metrics, *seen, *rows, *(f.read_bytes().decode("latin-1") for f in files)]
    leaks = [(s, text[:200]) for s in secrets for text in written if s in text]
    assert not leaks
