"""The authenticating front of the tests (tests/sasl_front.py) against real clients, directly.

The front stands in for an authenticating Kafka broker in kproxy's SASL tests, so it is checked
first against the clients people run: librdkafka and kafka-python log in with every mechanism
(and verify the front's SCRAM proof: a wrong server side fails them), produce and consume through
it, are refused with Kafka's own error for a wrong password, and re-authenticate (KIP-368) when it
gives sessions a lifetime. A raw client checks what a broker does to a request before
authentication and to one after the session expired. Finally kproxy's relay mode (a client doing
its own SASL through kproxy, no upstream credentials) works through it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio
from confluent_kafka import Producer
from kafka.net.sasl.oauth import AbstractTokenProvider

from kproxy.protocol.codes import ApiKey
from kproxy.testing import running_proxy
from tests.sasl_front import MECHANISMS, SASL_AUTHENTICATION_FAILED, SaslFront, unsecured_jws
from tests.support.e2e import consume_confluent, consume_kafka_python, create_topic, produce_confluent, unique
from tests.support.kafkaclient import KafkaClient

pytestmark = pytest.mark.slow  # clients' retries and backoffs: seconds per test

MESSAGES = [(None, f"m{i}".encode()) for i in range(20)]


class _Token(AbstractTokenProvider):  # type: ignore[misc]
    def __init__(self, subject: str) -> None:
        self.subject = subject

    def token(self) -> str:
        return unsecured_jws(self.subject)


def librdkafka_sasl(mechanism: str, user: str = "alice", password: str = "s3cret") -> dict[str, Any]:
    """librdkafka's settings to log in with ``mechanism`` (OAUTHBEARER: its own unsecured token)."""
    config: dict[str, Any] = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism}
    if mechanism == "OAUTHBEARER":
        return {**config, "enable.sasl.oauthbearer.unsecure.jwt": True,
                "sasl.oauthbearer.config": f"principal={user}"}
    return {**config, "sasl.username": user, "sasl.password": password}


def kafka_python_sasl(mechanism: str, user: str = "alice", password: str = "s3cret") -> dict[str, Any]:
    config: dict[str, Any] = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism}
    if mechanism == "OAUTHBEARER":
        return {**config, "sasl_oauth_token_provider": _Token(user)}
    return {**config, "sasl_plain_username": user, "sasl_plain_password": password}


def accept_alice(front: SaslFront) -> None:
    front.credentials.set_password("alice", "s3cret")
    front.credentials.set_oauth(subject="alice")


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_logs_in_produces_and_consumes(sasl_front: SaslFront, mechanism: str) -> None:
    accept_alice(sasl_front)
    topic = unique("front-rd")
    create_topic(sasl_front.bootstrap, topic, 1, **librdkafka_sasl(mechanism))
    produce_confluent(sasl_front.bootstrap, topic, MESSAGES, **librdkafka_sasl(mechanism))
    got = consume_confluent(sasl_front.bootstrap, topic, 1, len(MESSAGES), **librdkafka_sasl(mechanism))
    assert sorted(v for _, v in got) == sorted(v for _, v in MESSAGES)
    assert sasl_front.events.count("ok", mechanism) >= 2
    assert sasl_front.events.count("refused") == 0
    assert set(sasl_front.events.principals) == {"User:alice"}


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_logs_in_produces_and_consumes(sasl_front: SaslFront, mechanism: str) -> None:
    from kafka import KafkaProducer

    accept_alice(sasl_front)
    topic = unique("front-kp")
    producer = KafkaProducer(bootstrap_servers=sasl_front.bootstrap, **kafka_python_sasl(mechanism))
    try:
        for _, value in MESSAGES:
            producer.send(topic, value=value, partition=0)
        producer.flush(30)
    finally:
        producer.close(10)
    got = consume_kafka_python(sasl_front.bootstrap, topic, 1, len(MESSAGES), **kafka_python_sasl(mechanism))
    assert sorted(v for _, v in got) == sorted(v for _, v in MESSAGES)
    assert sasl_front.events.count("ok", mechanism) >= 2


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_wrong_password_gets_kafkas_error(sasl_front: SaslFront, mechanism: str) -> None:
    accept_alice(sasl_front)
    errors: list[str] = []
    producer = Producer({"bootstrap.servers": sasl_front.bootstrap, "error_cb": lambda e: errors.append(str(e)),
                         "reconnect.backoff.ms": 500, **librdkafka_sasl(mechanism, password="wrong")})
    deadline = time.monotonic() + 15
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    expected = ("Authentication failed: Invalid username or password" if mechanism == "PLAIN" else
                f"Authentication failed during authentication due to invalid credentials with SASL mechanism "
                f"{mechanism}")
    assert any(expected in e for e in errors), errors
    assert sasl_front.events.count("refused", mechanism) >= 1


def test_an_invalid_oauthbearer_token_is_refused_with_the_error_json(sasl_front: SaslFront) -> None:
    sasl_front.credentials.set_oauth(subject="bob")
    errors: list[str] = []
    producer = Producer({"bootstrap.servers": sasl_front.bootstrap, "error_cb": lambda e: errors.append(str(e)),
                         "reconnect.backoff.ms": 500, **librdkafka_sasl("OAUTHBEARER", user="alice")})
    deadline = time.monotonic() + 15
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    assert any("invalid_token" in e for e in errors), errors
    assert sasl_front.events.count("refused", "OAUTHBEARER") >= 1


def test_raw_tokens_after_sasl_handshake_v0(sasl_front: SaslFront) -> None:
    # kafka-python pinned to a 0.10.1 broker logs in with SaslHandshake v0 and raw tokens (KIP-43).
    from kafka import KafkaConsumer

    accept_alice(sasl_front)
    consumer = KafkaConsumer(bootstrap_servers=sasl_front.bootstrap, api_version=(0, 10, 1),
                             request_timeout_ms=15000, **kafka_python_sasl("PLAIN"))
    try:
        assert isinstance(consumer.topics(), set)
    finally:
        consumer.close()
    assert sasl_front.events.count("ok", "PLAIN") >= 1


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_clients_reauthenticate_before_their_session_expires(sasl_front: SaslFront, client: str) -> None:
    accept_alice(sasl_front)
    sasl_front.session_lifetime_ms = 2000
    topic = unique("front-reauth")
    deadline = time.monotonic() + 6
    if client == "librdkafka":
        producer = Producer({"bootstrap.servers": sasl_front.bootstrap, **librdkafka_sasl("SCRAM-SHA-256")})
        while time.monotonic() < deadline:
            producer.produce(topic, b"x", partition=0)
            producer.poll(0.05)
        assert producer.flush(15) == 0
    else:
        from kafka import KafkaProducer

        kp = KafkaProducer(bootstrap_servers=sasl_front.bootstrap, **kafka_python_sasl("SCRAM-SHA-256"))
        try:
            while time.monotonic() < deadline:
                kp.send(topic, b"x", partition=0).get(15)
                time.sleep(0.05)
        finally:
            kp.close(10)
    assert sasl_front.events.count("reauth_ok", "SCRAM-SHA-256") >= 2
    assert sasl_front.events.closes["session expired"] == 0


async def _plain_login(client: KafkaClient, version: int = 1) -> Any:
    await client.request(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN")
    return await client.request(ApiKey.SASL_AUTHENTICATE, version, auth_bytes=b"\0alice\0s3cret")


async def test_a_request_before_authentication_closes_the_connection(sasl_front: SaslFront) -> None:
    accept_alice(sasl_front)
    async with await KafkaClient.connect(sasl_front.port) as client:
        await client.send(ApiKey.METADATA, 1, topics=[])
        assert await client.closed_by_peer() == b""
    assert sasl_front.events.closes["unexpected request (api key 3) during SASL handshake"] == 1


async def test_a_session_past_its_lifetime_is_closed_at_its_next_request(sasl_front: SaslFront) -> None:
    accept_alice(sasl_front)
    sasl_front.session_lifetime_ms = 1000
    async with await KafkaClient.connect(sasl_front.port) as client:
        answer = await _plain_login(client)
        assert answer.body["error_code"] == 0 and answer.body["session_lifetime_ms"] == 1000
        assert (await client.request(ApiKey.METADATA, 1, topics=[])).body["brokers"]
        await trio.sleep(1.2)
        await client.send(ApiKey.METADATA, 1, topics=[])
        assert await client.closed_by_peer() == b""
    assert sasl_front.events.closes["session expired"] == 1


async def test_a_wrong_password_is_answered_then_the_connection_closes(sasl_front: SaslFront) -> None:
    accept_alice(sasl_front)
    async with await KafkaClient.connect(sasl_front.port) as client:
        await client.request(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN")
        answer = await client.request(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=b"\0alice\0guess")
        assert answer.body["error_code"] == SASL_AUTHENTICATION_FAILED
        assert answer.body["error_message"] == "Authentication failed: Invalid username or password"
        assert await client.closed_by_peer() == b""


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_relay_mode_a_client_with_its_own_sasl_through_kproxy(sasl_front: SaslFront, mechanism: str) -> None:
    accept_alice(sasl_front)
    topic = unique("front-relay")
    with running_proxy(sasl_front.bootstrap) as proxy:
        create_topic(proxy.bootstrap, topic, 1, **librdkafka_sasl(mechanism))
        produce_confluent(proxy.bootstrap, topic, MESSAGES, **librdkafka_sasl(mechanism))
        got = consume_confluent(proxy.bootstrap, topic, 1, len(MESSAGES), **librdkafka_sasl(mechanism))
    assert len(got) == len(MESSAGES)
    assert sasl_front.events.count("ok", mechanism) >= 2
