"""Terminate mode opens a client's upstream connection only once the client logged in.

A real :class:`ProxyServer` in the test's trio run, answering the clients' SASL itself
(``sasl.client.mode: terminate``), in front of a scripted broker (tests/support/fakecluster.py)
that counts the connections it accepts. Clients that fail their login, never try, or send nothing
cost it none; a client's ApiVersions before its login is the cluster's answer all the same; a
client that logs in gets one connection, and if the cluster cannot be reached then, the connection
closes as a client of a dead upstream sees it, with one line saying why. The same with real clients
and an authenticating cluster (kproxy's own login counted there too): tests/test_sasl_terminate_e2e.py.
"""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import scramp
import trio
import trio.testing

from kproxy.logfmt import parse_logfmt
from kproxy.protocol.frame_builder import response_frame
from kproxy.protocol.framing import FrameSplitter
from kproxy.protocol.messages import Body
from kproxy.protocol.payloads import decode_response
from kproxy.sasl.credentials import CredentialStore, user_credentials
from kproxy.sasl.credentials_file import save_credentials
from kproxy.server.discovery import ClusterVersions, answers_by_version, fetch_api_versions_answers
from kproxy.server.proxy_server import ProxyServer
from kproxy.testing import proxy_config, running_server
from tests.support.fakecluster import METADATA, FakeCluster, fake_cluster
from tests.support.kafkaclient import KafkaClient

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
UNSUPPORTED_VERSION, SASL_AUTHENTICATION_FAILED = 35, 58
SCRAM = "SCRAM-SHA-256"


@pytest.fixture(scope="module")
def credentials(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("terminate") / "credentials.yaml"
    save_credentials(path, CredentialStore({"alice": user_credentials("alice-pw", [SCRAM])}))
    return path


async def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


@contextlib.asynccontextmanager
async def terminating(credentials: Path, cluster_versions: dict[int, tuple[int, int]] | None = None,
                      **options: Any) -> AsyncIterator[tuple[FakeCluster, ProxyServer]]:
    """kproxy in terminate mode before one fake broker, its start-up work done (broker discovery, the
    first upstream check: the cluster's ApiVersions answers known); later checks an hour away."""
    async with fake_cluster((0,)) as cluster:
        if cluster_versions:
            cluster.api_versions.update(cluster_versions)
        config = proxy_config(cluster.bootstrap, sasl__client__mode="terminate",
                              sasl__client__credentials_file=str(credentials), upstream_check_interval=3600,
                              **options)
        async with running_server(config) as server:
            await wait_until(lambda: server.warmed.is_set() and server.health.checked.is_set())
            assert server.cluster_versions is not None and server.cluster_versions.known
            yield cluster, server


async def scram_login(client: KafkaClient, user: str, password: str) -> Body:
    """SaslHandshake v1 then SCRAM in SaslAuthenticate v2 (kproxy's signature checked): the last answer."""
    assert (await client.request(SASL_HANDSHAKE, 1, mechanism=SCRAM)).body["error_code"] == 0
    sc = scramp.ScramClient([SCRAM], user, password)
    first = (await client.request(SASL_AUTHENTICATE, 2, auth_bytes=sc.get_client_first().encode())).body
    if first["error_code"]:
        return first
    sc.set_server_first(bytes(first["auth_bytes"]).decode())
    final = (await client.request(SASL_AUTHENTICATE, 2, auth_bytes=sc.get_client_final().encode())).body
    if not final["error_code"]:
        sc.set_server_final(bytes(final["auth_bytes"]).decode())
    return final


def closed_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    return [parse_logfmt(r.getMessage()) for r in caplog.records if "event=connection_closed" in r.getMessage()]


async def test_clients_that_do_not_log_in_cost_the_cluster_no_connection(
        credentials: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kproxy")
    async with terminating(credentials) as (cluster, server):
        broker = cluster.brokers[0]
        accepted = broker.connections_accepted  # kproxy's own: broker discovery, the first check

        async def wrong_password() -> None:
            async with await KafkaClient.connect(server.bootstrap_port) as client:
                answer = await scram_login(client, "alice", "guess")
                assert answer["error_code"] == SASL_AUTHENTICATION_FAILED
                assert await client.closed_by_peer() == b""

        async def unknown_user() -> None:
            async with await KafkaClient.connect(server.bootstrap_port) as client:
                assert (await scram_login(client, "mallory", "guess"))["error_code"] == SASL_AUTHENTICATION_FAILED

        async def versions_then_gone() -> None:
            async with await KafkaClient.connect(server.bootstrap_port) as client:
                answer = await client.request(API_VERSIONS, 3, client_software_name="t", client_software_version="1")
                assert answer.body["error_code"] == 0

        async def silent() -> None:
            async with await KafkaClient.connect(server.bootstrap_port):
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            for attempt in (wrong_password, unknown_user, versions_then_gone, silent) * 5:
                nursery.start_soon(attempt)
        await wait_until(lambda: len(closed_lines(caplog)) == 20)
        assert broker.connections_accepted == accepted and cluster.received == []
        stats = server.stats
        assert stats.sasl_authentications[("client", SCRAM, "failure")] == 10
        assert not any(stats.upstream_connections.values())
        assert sum(stats.upstream_connect_failures.values()) == 0
        assert [line["upstream"] for line in closed_lines(caplog)] == ["-"] * 20

        # A client that logs in gets one connection, opened after its login, and its requests go on it.
        async with await KafkaClient.connect(server.bootstrap_port) as client:
            assert (await scram_login(client, "alice", "alice-pw"))["error_code"] == 0
            metadata = await client.request(METADATA, 12, topics=None)
            assert [b["port"] for b in metadata.body["brokers"]] != [broker.port]  # kproxy's, not the broker's
            assert broker.connections_accepted == accepted + 1
            assert [r.api_key for r in cluster.received] == [METADATA]  # nothing of the login
            assert stats.upstream_connections[(broker.address, "bootstrap")] == 1
        await wait_until(lambda: len(closed_lines(caplog)) == 21)
        assert stats.upstream_connections[(broker.address, "bootstrap")] == 0
        assert closed_lines(caplog)[-1]["upstream"] == broker.address


@pytest.mark.parametrize("version", [0, 3, 4])
async def test_api_versions_before_the_login_is_the_clusters_answer(credentials: Path, version: int) -> None:
    """The cluster's versions (Metadata up to v9 only, here), capped as a broker's answer is, and
    kproxy's SASL versions where the cluster has none: what the client got when kproxy forwarded it."""
    async with terminating(credentials, {METADATA: (0, 9)}) as (cluster, server):
        cluster.api_versions.pop(SASL_HANDSHAKE)
        async with await KafkaClient.connect(server.bootstrap_port) as client:
            answer = await client.request(API_VERSIONS, version, client_software_name="t", client_software_version="1")
        keys = {k["api_key"]: (k["min_version"], k["max_version"]) for k in answer.body["api_keys"]}
        assert answer.header.correlation_id == 1 and answer.body["error_code"] == 0
        assert keys[METADATA] == (0, 9) and keys[SASL_HANDSHAKE] == (0, 1) and keys[SASL_AUTHENTICATE] == (0, 2)
        assert keys[API_VERSIONS] == (0, 4)
        assert cluster.received == [] and cluster.brokers[0].open_connections == 0


async def test_a_client_that_logs_in_while_the_cluster_is_down_is_closed_with_one_line(
        credentials: Path, caplog: pytest.LogCaptureFixture) -> None:
    """As a client of a dead upstream (closed without an answer: test_connection_failures.py), once its
    login succeeded; its connection_closed line says why, and the connect failure is counted."""
    caplog.set_level(logging.INFO, logger="kproxy")
    async with terminating(credentials, limits__connect_timeout=2) as (cluster, server):
        address = cluster.brokers[0].address
        cluster.stop_broker(0)
        failures = server.stats.upstream_connect_failures.get((address, "bootstrap"), 0)
        async with await KafkaClient.connect(server.bootstrap_port) as client:
            assert (await scram_login(client, "alice", "alice-pw"))["error_code"] == 0  # kproxy's login: it works
            await client.send(METADATA, 12, topics=None)
            assert await client.closed_by_peer() == b""
        await wait_until(lambda: len(closed_lines(caplog)) == 1)
    [line] = closed_lines(caplog)
    assert line["reason"] == f"upstream unavailable: {address}: connection refused", line
    assert line["principal"] == "User:alice" and line["upstream"] == "-"
    assert server.stats.upstream_connect_failures[(address, "bootstrap")] == failures + 1
    assert server.stats.sasl_authentications[("client", SCRAM, "success")] == 1


@pytest.mark.parametrize(("options", "reason"), [
    ({"limits__frame_timeout": 0.5}, "SASL login not complete within frame_timeout 0.5 s"),
    ({"limits__idle_timeout": 0.5}, "idle timeout"),
])
async def test_a_client_that_sends_nothing_is_closed_by_the_deadlines_with_no_upstream(
        credentials: Path, caplog: pytest.LogCaptureFixture, options: dict[str, float], reason: str) -> None:
    """Not a byte after the connect: the login's deadline runs from the start (frame_timeout), and the
    idle timeout as ever; the cluster never hears of the client."""
    caplog.set_level(logging.INFO, logger="kproxy")
    async with terminating(credentials, **options) as (cluster, server):
        accepted = cluster.brokers[0].connections_accepted
        started = trio.current_time()
        async with await KafkaClient.connect(server.bootstrap_port) as client:
            assert await client.closed_by_peer() == b""
        took = trio.current_time() - started
        await wait_until(lambda: len(closed_lines(caplog)) == 1)
        assert cluster.brokers[0].connections_accepted == accepted
    assert 0.4 <= took < 4, took
    assert [line["reason"] for line in closed_lines(caplog)] == [reason]


# -- the cluster's ApiVersions answers, as the upstream check learns them ----------------------------
def _v4_answer() -> bytes:
    return response_frame(API_VERSIONS, 4, 4, throttle_time_ms=0, api_keys=[
        {"api_key": API_VERSIONS, "min_version": 0, "max_version": 4}, {"api_key": METADATA, "min_version": 0,
                                                                       "max_version": 12}],
        supported_features=[{"name": "group.version", "min_version": 0, "max_version": 1},
                            {"name": "metadata.version", "min_version": 1, "max_version": 25}],
        finalized_features_epoch=3, finalized_features=[{"name": "metadata.version", "max_version_level": 25,
                                                         "min_version_level": 25}])


def test_each_version_answers_as_the_broker_does() -> None:
    """From one v4 answer: v4 as it came, v3 without the supported feature of min version 0 (the spec's
    note, KAFKA-17011), v1-v2 without features, v0 without throttle time either."""
    frame = _v4_answer()
    answers = answers_by_version(4, frame)
    assert answers[4] == frame
    v3 = decode_response(answers[3][4:], API_VERSIONS, 3).body
    assert [f["name"] for f in v3["supported_features"]] == ["metadata.version"]
    assert v3["finalized_features_epoch"] == 3 and len(v3["api_keys"]) == 2
    assert set(decode_response(answers[1][4:], API_VERSIONS, 1).body) == {"error_code", "api_keys", "throttle_time_ms"}
    assert set(decode_response(answers[0][4:], API_VERSIONS, 0).body) == {"error_code", "api_keys"}
    # A broker speaking ApiVersions up to v3 answers a v4 request as KIP-511 says.
    older = answers_by_version(3, answers[3])
    v4 = decode_response(older[4][4:], API_VERSIONS, 0).body
    assert v4["error_code"] == UNSUPPORTED_VERSION
    assert [(k["api_key"], k["min_version"], k["max_version"]) for k in v4["api_keys"]] == [(API_VERSIONS, 0, 4)]


def test_a_broker_not_checked_yet_answers_as_the_bootstrap_servers() -> None:
    versions = ClusterVersions("bootstrap")
    assert not versions.known and versions.source("1")(7, 3) is None
    boot = answers_by_version(4, _v4_answer())
    versions.learn("bootstrap", boot)
    answer = versions.source("1")(7, 3)
    assert answer is not None and answer[4:8] == struct.pack(">i", 7) and answer[8:] == boot[3][8:]
    own = answers_by_version(3, answers_by_version(4, _v4_answer())[3])
    versions.learn("1", own)
    answer = versions.source("1")(8, 4)
    assert answer is not None and answer[4:8] == struct.pack(">i", 8) and answer[8:] == own[4][8:]


async def test_the_check_asks_once_and_again_at_the_version_an_older_broker_names() -> None:
    """One ApiVersions at v4 (a SASL listener takes one before the login); an older broker's
    UNSUPPORTED_VERSION names its versions, and the second request asks at its highest."""
    ours, theirs = trio.testing.memory_stream_pair()
    asked: list[int] = []

    async def older_broker() -> None:
        splitter = FrameSplitter()
        while len(asked) < 2:
            splitter.feed(await theirs.receive_some())
            for request in splitter.raw_frames():
                version, correlation_id = struct.unpack_from(">hi", request, 6)
                asked.append(version)
                keys = [{"api_key": API_VERSIONS, "min_version": 0, "max_version": 3}]
                if version > 3:  # KIP-511: a v0 body
                    answer = response_frame(API_VERSIONS, 0, correlation_id, error_code=UNSUPPORTED_VERSION,
                                            api_keys=keys)
                else:
                    answer = response_frame(API_VERSIONS, version, correlation_id, api_keys=keys)
                await theirs.send_all(answer)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(older_broker)
        with trio.fail_after(5):
            answers = await fetch_api_versions_answers(ours, 1 << 20)
    assert asked == [4, 3]
    assert sorted(answers) == [0, 1, 2, 3, 4]
    assert decode_response(answers[4][4:], API_VERSIONS, 0).body["error_code"] == UNSUPPORTED_VERSION
    assert decode_response(answers[3][4:], API_VERSIONS, 3).body["error_code"] == 0
