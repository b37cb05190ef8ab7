"""``match.principal`` with real clients: librdkafka logging in with SASL PLAIN through kproxy.

Tansu's ``--authentication`` refuses every login (its memory storage keeps no users), so the broker
here is the scripted one (tests/support/fakecluster.py) taught SASL: it accepts PLAIN for the users
it knows (alice, bob) and refuses a wrong password with SASL_AUTHENTICATION_FAILED, as a Kafka broker
does. Two producers share one client id and differ by user: a rule for alice refuses alice's
records and leaves bob's alone; the connection log lines name each login's principal.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import KafkaError, Producer

from kproxy.logfmt import parse_logfmt
from kproxy.protocol.frame_builder import response_body
from kproxy.protocol.records import decode_all
from kproxy.testing import proxy_config, running_server
from tests.support.fakecluster import PRODUCE, FakeBroker, FakeCluster, Received, fake_cluster

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM = 58, 33
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}

RULES = """
rules:
  - id: alice-refused
    match: {api: produce, principal: alice}
    actions:
      - inject_error: {error: TOPIC_AUTHORIZATION_FAILED}
"""


def _teach_sasl_plain(cluster: FakeCluster) -> list[str]:
    """The cluster's brokers accept SASL PLAIN for :data:`PASSWORDS`; returns the users they accepted."""
    accepted: list[str] = []

    async def handshake(broker: FakeBroker, received: Received) -> dict[str, Any]:
        ok = received.body["mechanism"] == "PLAIN"
        return response_body(SASL_HANDSHAKE, received.api_version, mechanisms=["PLAIN"],
                             error_code=0 if ok else UNSUPPORTED_SASL_MECHANISM)

    async def authenticate(broker: FakeBroker, received: Received) -> dict[str, Any]:
        _, user, password = bytes(received.body["auth_bytes"]).split(b"\x00", 2)
        name = user.decode()
        if PASSWORDS.get(name) != password.decode():
            return response_body(SASL_AUTHENTICATE, received.api_version, error_code=SASL_AUTHENTICATION_FAILED,
                                 error_message="Authentication failed: Invalid username or password",
                                 auth_bytes=b"")
        accepted.append(name)
        return response_body(SASL_AUTHENTICATE, received.api_version, error_code=0, auth_bytes=b"")

    cluster.handlers[SASL_HANDSHAKE] = handshake
    cluster.handlers[SASL_AUTHENTICATE] = authenticate
    return accepted


def _produce(bootstrap: str, user: str, password: str) -> list[KafkaError | None]:
    """Three records as ``user``, with the client id every user of this test shares; each delivery's error."""
    outcomes: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "shared-app",
                         "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                         "sasl.username": user, "sasl.password": password,
                         "message.timeout.ms": 8000, "enable.idempotence": False, "linger.ms": 0})
    for i in range(3):
        producer.produce("orders", value=f"{user}-{i}".encode(), partition=0,
                         on_delivery=lambda err, msg: outcomes.append(err))
    producer.flush(15)
    return outcomes


async def test_a_rule_for_one_principal_hits_that_users_client_only(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    rules = tmp_path / "alice.yaml"
    rules.write_text(RULES)
    caplog.set_level(logging.INFO, logger="kproxy.connection")
    async with fake_cluster((0,)) as cluster:
        cluster.add_topic("orders", [0])
        accepted = _teach_sasl_plain(cluster)
        async with running_server(proxy_config(cluster.bootstrap, rules=str(rules))) as server:
            bootstrap = f"127.0.0.1:{server.bootstrap_port}"
            alice = await trio.to_thread.run_sync(_produce, bootstrap, "alice", PASSWORDS["alice"])
            bob = await trio.to_thread.run_sync(_produce, bootstrap, "bob", PASSWORDS["bob"])
            written = [r for r in cluster.received if r.api_key == PRODUCE]
    assert {"alice", "bob"} <= set(accepted)
    refused = KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert len(alice) == 3 and all(e is not None and e.code() == refused for e in alice), f"alice's records: {alice}"
    assert bob == [None, None, None], f"bob's records: {bob}"
    # Only bob's records reached the broker: alice's Produce were answered by the rule.
    values = sorted(record.value for r in written for t in r.body["topic_data"] for p in t["partition_data"]
                    for record in decode_all(p["records"] or b""))
    assert values == [b"bob-0", b"bob-1", b"bob-2"]
    closed = [parse_logfmt(r.getMessage()) for r in caplog.records if "event=connection_closed" in r.getMessage()]
    principals = {line.get("principal") for line in closed if line.get("client_id") == "shared-app"}
    assert {"User:alice", "User:bob"} <= principals, closed
    assert not any("secret" in r.getMessage() for r in caplog.records)


async def test_a_refused_login_leaves_no_principal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rules = tmp_path / "alice.yaml"
    rules.write_text(RULES)
    caplog.set_level(logging.INFO, logger="kproxy.connection")
    async with fake_cluster((0,)) as cluster:
        cluster.add_topic("orders", [0])
        _teach_sasl_plain(cluster)
        async with running_server(proxy_config(cluster.bootstrap, rules=str(rules))) as server:
            bootstrap = f"127.0.0.1:{server.bootstrap_port}"

            def wrong_password() -> None:
                producer = Producer({"bootstrap.servers": bootstrap, "client.id": "shared-app",
                                     "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                     "sasl.username": "alice", "sasl.password": "guess",
                                     "message.timeout.ms": 2000})
                producer.produce("orders", value=b"x", partition=0)
                producer.flush(4)

            await trio.to_thread.run_sync(wrong_password)
            server.shutdown()
    closed = [parse_logfmt(r.getMessage()) for r in caplog.records if "event=connection_closed" in r.getMessage()]
    assert closed and all("principal" not in line for line in closed), closed


async def _captured_sasl_run(tmp_path: Path) -> tuple[Path, Path, dict[str, int]]:
    """alice and bob produce through kproxy with :data:`RULES` and capture on: the rule file, the
    capture directory, and the proxy's hits per rule."""
    rules = tmp_path / "alice.yaml"
    rules.write_text(RULES)
    capture = tmp_path / "capture"
    async with fake_cluster((0,)) as cluster:
        cluster.add_topic("orders", [0])
        _teach_sasl_plain(cluster)
        async with running_server(proxy_config(cluster.bootstrap, rules=str(rules), capture__dir=str(capture))) \
                as server:
            bootstrap = f"127.0.0.1:{server.bootstrap_port}"
            await trio.to_thread.run_sync(_produce, bootstrap, "alice", PASSWORDS["alice"])
            await trio.to_thread.run_sync(_produce, bootstrap, "bob", PASSWORDS["bob"])
            live: dict[str, int] = {}
            for (rule, _action, _dry_run), n in server.stats.faults.hits.items():
                live[rule] = live.get(rule, 0) + n
    return rules, capture, live


async def test_the_capture_records_the_principal_the_rules_saw(tmp_path: Path) -> None:
    """Each record carries the session's principal, so a what-if (``kproxy analyze --rules``) matches
    ``principal`` as the proxy did: alice's Produce records carry User:alice and the fault the rule
    injected, bob's User:bob and none."""
    pq = pytest.importorskip("pyarrow.parquet")
    _, capture, _ = await _captured_sasl_run(tmp_path)
    rows = [r for f in sorted(capture.rglob("capture-*.parquet")) for r in pq.ParquetFile(f).read().to_pylist()]
    produce = [r for r in rows if r["api_name"] == "Produce"]
    by_principal = {r["principal"]: bool(r["rule_decisions"]) for r in produce}
    assert by_principal == {"User:alice": True, "User:bob": False}, produce
    # Before a login is accepted, no principal: ApiVersions, SaslHandshake, SaslAuthenticate's request side.
    assert any(r["principal"] is None and r["api_name"] == "SaslHandshake" for r in rows)


async def test_what_if_of_a_sasl_capture_matches_what_the_proxy_did(spark: Any, tmp_path: Path) -> None:
    """``kproxy analyze --rules`` over that capture: the principal rule hits alice's Produce requests,
    as many as the proxy answered, and none of bob's."""
    pq = pytest.importorskip("pyarrow.parquet")
    from kproxy.analysis.job import run_analysis
    from kproxy.analysis.whatif import HITS, WhatIfRules

    rules, capture, live = await _captured_sasl_run(tmp_path)
    result = run_analysis([str(capture)], tmp_path / "out", spark, rules=WhatIfRules.from_file(str(rules)))
    assert {r["rule"]: r["requests"] for r in result.tables["whatif_rules"]} == live
    assert live["alice-refused"] >= 1
    rows = [r for f in sorted(capture.rglob("capture-*.parquet")) for r in pq.ParquetFile(f).read().to_pylist()]
    alices = {r["connection_id"] for r in rows if r["principal"] == "User:alice"}
    hits = pq.read_table(Path(result.out) / HITS).to_pylist()
    assert hits and all(h["api_name"] == "produce" and h["connection_id"] in alices for h in hits), hits
