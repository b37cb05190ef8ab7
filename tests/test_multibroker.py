"""Address rewriting against a scripted multi-broker cluster (tests/support/fakecluster.py).

A real :class:`ProxyServer` runs in the test's trio run; requests are encoded
with kproxy's codec and sent over loopback TCP. The proxy advertises
``kproxy.test`` so that a leaked broker address (the fakes listen on
127.0.0.1) cannot pass for a rewritten one.
"""

from __future__ import annotations

import logging
import random
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from kproxy.protocol import MessageType, Response, frame, message_schema
from kproxy.protocol.message_schemas import supported_versions
from kproxy.server import proxy_server
from kproxy.server.proxy_server import ProxyServer
from kproxy.testing import proxy_config, running_server
from tests.support.fakecluster import (
    API_VERSIONS,
    COORDINATOR_NOT_AVAILABLE,
    DESCRIBE_CLUSTER,
    FETCH,
    FIND_COORDINATOR,
    METADATA,
    NOT_LEADER_OR_FOLLOWER,
    PRODUCE,
    FakeCluster,
    endpoints,
    fake_cluster,
)
from tests.support.kafkaclient import KafkaClient

ADVERTISED = "kproxy.test"
SASL_HANDSHAKE, LIST_OFFSETS = 17, 2
UNKNOWN_API = 30000  # no Kafka API has this key


@pytest.fixture
async def cluster() -> AsyncIterator[FakeCluster]:
    async with fake_cluster((0, 1, 2)) as c:
        c.add_topic("orders", [0, 1, 2])
        yield c


@pytest.fixture
async def proxy(cluster: FakeCluster) -> AsyncIterator[ProxyServer]:
    async with running_server(proxy_config(cluster.bootstrap, advertised_host=ADVERTISED)) as server:
        yield server


async def client(server: ProxyServer, port: int | None = None, **kwargs: Any) -> KafkaClient:
    return await KafkaClient.connect(port or server.bootstrap_port, **kwargs)


def assert_rewritten(response: Response | dict[str, Any], cluster: FakeCluster,
                     server: ProxyServer) -> list[tuple[Any, Any]]:
    """Every endpoint names the proxy, at a port it listens on; none names a fake broker."""
    body = response.body if isinstance(response, Response) else response
    found = list(endpoints(body))
    for host, port in found:
        if (host, port) == ("", -1):
            continue  # "no coordinator": nothing to rewrite
        assert host == ADVERTISED, f"host {host!r} leaked in {body}"
        assert port not in cluster.ports_used, f"broker port {port} leaked in {body}"
        assert port in server.listeners, f"no listener on advertised port {port}"
    return found


async def reaches(server: ProxyServer, port: int, cluster: FakeCluster) -> int:
    """Which fake node a new connection to proxy port ``port`` ends up at."""
    probe = f"probe-{random.getrandbits(32):08x}"
    async with await client(server, port, client_id=probe) as c:
        response = await c.request(METADATA, 12, topics=[])
    [hit] = [r for r in cluster.received if r.request is not None and r.request.header.client_id == probe]
    assert response.body["controller_id"] == hit.node_id  # the fake answers with its own id
    return hit.node_id


def broker_ports(response: Response, id_field: str = "node_id") -> dict[int, int]:
    return {b[id_field]: b["port"] for b in response.body["brokers"]}


def versions(api_key: int) -> list[int]:
    span = supported_versions(api_key)
    assert span is not None
    return list(range(span[0], span[1] + 1))


# -- listeners per broker -------------------------------------------------------------------
@pytest.mark.parametrize("version", [0, 1, 4, 9, 12, 13])
async def test_metadata_opens_a_listener_per_broker_forwarding_to_that_broker(
        cluster: FakeCluster, proxy: ProxyServer, version: int) -> None:
    async with await client(proxy) as c:
        response = await c.request(METADATA, version, topics=None)
    assert_rewritten(response, cluster, proxy)
    ports = broker_ports(response)
    assert sorted(ports) == [0, 1, 2]
    assert len(set(ports.values())) == 3
    for node_id, port in ports.items():
        assert await reaches(proxy, port, cluster) == node_id


async def test_node_id_that_appears_later_gets_a_listener(cluster: FakeCluster, proxy: ProxyServer) -> None:
    async with await client(proxy) as c:
        before = broker_ports(await c.request(METADATA, 12, topics=None))
        await cluster.add_broker(7)
        response = await c.request(METADATA, 12, topics=None)
    assert_rewritten(response, cluster, proxy)
    after = broker_ports(response)
    assert sorted(after) == [0, 1, 2, 7]
    assert {n: after[n] for n in before} == before, "known brokers keep their ports"
    assert after[7] not in before.values()
    assert await reaches(proxy, after[7], cluster) == 7


async def test_moved_broker_keeps_its_port_and_new_connections_follow(
        cluster: FakeCluster, proxy: ProxyServer) -> None:
    async with await client(proxy) as c:
        port = broker_ports(await c.request(METADATA, 12, topics=None))[1]
        assert await reaches(proxy, port, cluster) == 1
        await cluster.move_broker(1)
        # Until a response names the new address, the old one (now closed) is all kproxy knows.
        async with await client(proxy, port) as stale:
            assert await stale.closed_by_peer() == b""
        response = await c.request(METADATA, 12, topics=None)
    assert_rewritten(response, cluster, proxy)
    assert broker_ports(response)[1] == port
    assert await reaches(proxy, port, cluster) == 1


async def test_broker_named_only_in_kip951_endpoints_gets_a_listener(
        cluster: FakeCluster, proxy: ProxyServer) -> None:
    await cluster.add_broker(9)
    cluster.advertised = [0]  # Metadata names broker 0 only
    cluster.add_topic("moved", [9])
    async with await client(proxy) as c:
        assert sorted(broker_ports(await c.request(METADATA, 12, topics=None))) == [0]
        response = await c.request(PRODUCE, 10, acks=-1, timeout_ms=1000, topic_data=[
            {"name": "moved", "partition_data": [{"index": 0, "records": None}]}])
    [(_, port)] = assert_rewritten(response, cluster, proxy)
    [part] = response.body["responses"][0]["partition_responses"]
    assert part["error_code"] == NOT_LEADER_OR_FOLLOWER
    assert part["current_leader"]["leader_id"] == 9
    assert await reaches(proxy, port, cluster) == 9


# -- each endpoint-carrying response ----------------------------------------------------------
@pytest.mark.parametrize("version", versions(FIND_COORDINATOR))
async def test_find_coordinator_is_rewritten(cluster: FakeCluster, proxy: ProxyServer, version: int) -> None:
    cluster.coordinators.update({"g-two": 2, "g-one": 1, "g-gone": 5})
    async with await client(proxy) as c:
        if version < 4:
            answers = [(await c.request(FIND_COORDINATOR, version, key=key)).body
                       for key in ("g-two", "g-one", "g-gone")]
            for body in answers:
                assert_rewritten(body, cluster, proxy)
        else:
            response = await c.request(FIND_COORDINATOR, version, key_type=0,
                                       coordinator_keys=["g-two", "g-one", "g-gone"])
            assert_rewritten(response, cluster, proxy)
            answers = response.body["coordinators"]
    two, one, gone = answers
    assert await reaches(proxy, two["port"], cluster) == 2
    assert await reaches(proxy, one["port"], cluster) == 1
    assert (gone["error_code"], gone["node_id"], gone["host"], gone["port"]) == \
        (COORDINATOR_NOT_AVAILABLE, -1, "", -1)


@pytest.mark.parametrize("version", versions(DESCRIBE_CLUSTER))
async def test_describe_cluster_is_rewritten(cluster: FakeCluster, proxy: ProxyServer, version: int) -> None:
    async with await client(proxy) as c:
        response = await c.request(DESCRIBE_CLUSTER, version)
    assert_rewritten(response, cluster, proxy)
    ports = broker_ports(response, "broker_id")
    assert sorted(ports) == [0, 1, 2]
    for node_id, port in ports.items():
        assert await reaches(proxy, port, cluster) == node_id


def produce_values(topic: Any, partitions: list[int]) -> dict[str, Any]:
    return {"acks": 1, "timeout_ms": 1000, "topic_data": [
        {"name": topic.name, "topic_id": topic.topic_id,
         "partition_data": [{"index": p, "records": None} for p in partitions]}]}


def fetch_values(topic: Any, partitions: list[int]) -> dict[str, Any]:
    return {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "topics": [
        {"topic": topic.name, "topic_id": topic.topic_id,
         "partitions": [{"partition": p, "fetch_offset": 0, "partition_max_bytes": 1024}
                        for p in partitions]}]}


@pytest.mark.parametrize(("api_key", "version"), [(PRODUCE, v) for v in versions(PRODUCE)]
                         + [(FETCH, v) for v in versions(FETCH)])
async def test_kip951_node_endpoints_are_rewritten(cluster: FakeCluster, proxy: ProxyServer, api_key: int,
                                                  version: int) -> None:
    topic = cluster.topics["orders"]
    values = (produce_values if api_key == PRODUCE else fetch_values)(topic, [0, 1, 2])
    async with await client(proxy) as c:  # the bootstrap reaches node 0: partitions 1 and 2 live elsewhere
        response = await c.request(api_key, version, **values)
    found = assert_rewritten(response, cluster, proxy)
    parts = response.body["responses"][0]["partition_responses" if api_key == PRODUCE else "partitions"]
    assert [p["error_code"] for p in parts] == [0, NOT_LEADER_OR_FOLLOWER, NOT_LEADER_OR_FOLLOWER]
    schema = message_schema(api_key, version, MessageType.RESPONSE)
    assert schema is not None
    has_endpoints = any(f.name == "node_endpoints" for f in schema.fields)
    assert has_endpoints == (version >= (10 if api_key == PRODUCE else 16))
    if not has_endpoints:
        assert found == []
        return
    by_node = {e["node_id"]: e["port"] for e in response.body["node_endpoints"]}
    assert sorted(by_node) == [1, 2]
    for node_id, port in by_node.items():
        assert await reaches(proxy, port, cluster) == node_id


async def test_no_response_of_any_version_leaks_a_broker_address(cluster: FakeCluster,
                                                                 proxy: ProxyServer) -> None:
    cluster.coordinators["elsewhere"] = 2
    topic = cluster.topics["orders"]
    requests: list[tuple[int, int, dict[str, Any]]] = []
    requests += [(METADATA, v, {"topics": None}) for v in versions(METADATA)]
    requests += [(DESCRIBE_CLUSTER, v, {}) for v in versions(DESCRIBE_CLUSTER)]
    requests += [(FIND_COORDINATOR, v, {"key": "elsewhere", "coordinator_keys": ["elsewhere", "x"]})
                 for v in versions(FIND_COORDINATOR)]
    requests += [(PRODUCE, v, produce_values(topic, [0, 1, 2])) for v in versions(PRODUCE)]
    requests += [(FETCH, v, fetch_values(topic, [0, 1, 2])) for v in versions(FETCH)]
    async with await client(proxy) as c:
        for api_key, version, values in requests:  # pipelined: all sent before any answer is read
            await c.send(api_key, version, **values)
        responses = [await c.receive() for _ in requests]
    seen = 0
    for response in responses:
        seen += len(assert_rewritten(response, cluster, proxy))
    assert seen > 70
    # Belt and braces: no fake broker's port appears as an int32 in any frame either.
    raw_ports = {struct.pack(">i", p) for p in cluster.ports_used}
    async with await client(proxy) as c:
        for api_key, version, values in requests[:20]:
            await c.send(api_key, version, **values)
            c.pending.pop()
            payload = await c.receive_frame()
            assert not any(p in payload for p in raw_ports)


# -- ApiVersions and APIs kproxy does not know ------------------------------------------------
@pytest.mark.parametrize("version", versions(API_VERSIONS))
async def test_api_versions_capped_to_what_kproxy_reads(cluster: FakeCluster, proxy: ProxyServer,
                                                        version: int) -> None:
    widened = {PRODUCE: (0, 99), FETCH: (0, 99), METADATA: (0, 99), FIND_COORDINATOR: (0, 99),
               SASL_HANDSHAKE: (0, 99), LIST_OFFSETS: (0, 99), DESCRIBE_CLUSTER: (50, 99),
               UNKNOWN_API: (3, 7)}
    cluster.api_versions.update(widened)
    async with await client(proxy) as c:
        response = await c.request(API_VERSIONS, version, client_software_name="t",
                                   client_software_version="1")
    assert response.body["error_code"] == 0
    got = {e["api_key"]: (e["min_version"], e["max_version"]) for e in response.body["api_keys"]}
    for key in (PRODUCE, FETCH, METADATA, FIND_COORDINATOR, SASL_HANDSHAKE):
        assert got[key] == supported_versions(key), key
    assert DESCRIBE_CLUSTER not in got, "no version both sides speak: hidden"
    assert got[LIST_OFFSETS] == (0, 99), "kproxy need not read ListOffsets: untouched"
    assert got[UNKNOWN_API] == (3, 7), "an api key kproxy never heard of passes untouched"
    order = [e["api_key"] for e in response.body["api_keys"]]
    assert order == sorted(k for k in cluster.api_versions if k != DESCRIBE_CLUSTER)


async def test_unknown_api_version_answered_locally(cluster: FakeCluster, proxy: ProxyServer) -> None:
    async with await client(proxy) as c:
        await c.send_raw(frame(struct.pack(">hhih", API_VERSIONS, 99, 42, -1) + b"\x00future"))
        payload = await c.receive_frame()
    assert payload == struct.pack(">ihih", 42, 35, 1, API_VERSIONS) + struct.pack(">hh", 0, 4)
    assert not [r for r in cluster.received if r.api_key == API_VERSIONS]


async def test_unknown_api_key_passes_byte_for_byte(cluster: FakeCluster, proxy: ProxyServer) -> None:
    odd = struct.pack(">hhih", UNKNOWN_API, 3, 77, 4) + b"test" + bytes(range(256)) + b"\xff" * 3
    async with await client(proxy) as c:
        await c.send(METADATA, 12, topics=[])
        await c.send_raw(frame(odd))
        await c.send(METADATA, 12, topics=[])
        first = await c.receive()
        echoed = await c.receive_frame()
        second = await c.receive()
    assert echoed == struct.pack(">i", 77) + b"echo" + odd
    assert [r.payload for r in cluster.received if r.api_key == UNKNOWN_API] == [odd]
    assert first.header.correlation_id == 1 and second.header.correlation_id == 2


# -- deterministic ports ------------------------------------------------------------------------
def free_port_range(count: int) -> int:
    """A base port such that base .. base+count-1 are all free on loopback right now."""
    for _ in range(100):
        base = random.randrange(20000, 30000)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return base
    raise RuntimeError("no free port range")


async def test_ports_are_broker_port_base_plus_node_id() -> None:
    base = free_port_range(8)
    async with fake_cluster((0, 3, 6)) as cluster, running_server(
            proxy_config(cluster.bootstrap, advertised_host=ADVERTISED, broker_port_base=base)) as server:
        async with await client(server) as c:
            response = await c.request(METADATA, 12, topics=None)
        assert_rewritten(response, cluster, server)
        assert broker_ports(response) == {0: base, 3: base + 3, 6: base + 6}
        await cluster.add_broker(5)
        async with await client(server) as c:
            response = await c.request(DESCRIBE_CLUSTER, 0)
        assert broker_ports(response, "broker_id") == {0: base, 3: base + 3, 5: base + 5, 6: base + 6}
        for node_id, port in broker_ports(response, "broker_id").items():
            assert await reaches(server, port, cluster) == node_id
        assert {base + n for n in (0, 3, 5, 6)} <= set(server.listeners)


async def test_a_broker_port_that_cannot_be_bound_makes_the_proxy_not_ready_until_it_is_free(
        caplog: pytest.LogCaptureFixture) -> None:
    """Clients are still sent to that port (it is the one Metadata answers name): /readyz says so, and
    the listener binds the port again until it can; then the broker is served and kproxy is ready."""
    caplog.set_level(logging.INFO, "kproxy.server")
    base = free_port_range(4)
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", base + 3))
        taken.listen()
        async with fake_cluster((0, 3)) as cluster, running_server(
                proxy_config(cluster.bootstrap, advertised_host=ADVERTISED, broker_port_base=base)) as server:
            with trio.fail_after(10):
                while not {base, base + 3} <= set(server.listeners):
                    await trio.sleep(0.01)
            reason = await server.readiness()
            assert reason is not None and f"listener broker-3 cannot listen on port {base + 3}" in reason, reason
            assert "broker-0" not in reason
            assert await reaches(server, base, cluster) == 0  # the other broker is served
            failed = [r.getMessage() for r in caplog.records if "event=listen_failed" in r.getMessage()]
            assert failed == [f'event=listen_failed listener=broker-3 port={base + 3} error="Address already in use" '
                              "attempts=1 retry_in_s=1"], failed
            taken.close()
            with trio.fail_after(10):
                while (reason := await server.readiness()) is not None:
                    await trio.sleep(0.05)
            assert await reaches(server, base + 3, cluster) == 3
            listening = [r.getMessage() for r in caplog.records if "listener=broker-3" in r.getMessage()
                         and "event=listening" in r.getMessage()]
            assert len(listening) == 1 and " attempts=" in listening[0], listening
    finally:
        taken.close()


async def test_a_port_held_for_long_is_logged_at_doubling_attempts(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries back off, and their failures are logged at the 1st, 2nd, 4th, 8th... attempt only."""
    monkeypatch.setattr(proxy_server, "_LISTEN_RETRY_FIRST", 0.002)
    monkeypatch.setattr(proxy_server, "_LISTEN_RETRY_MAX", 0.01)
    base = free_port_range(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 1))
        taken.listen()
        async with fake_cluster((0, 1)) as cluster, running_server(
                proxy_config(cluster.bootstrap, advertised_host=ADVERTISED, broker_port_base=base)):

            def attempts() -> list[int]:
                return [int(r.getMessage().split(" attempts=")[1].split()[0]) for r in caplog.records
                        if "event=listen_failed listener=broker-1" in r.getMessage()]

            with trio.fail_after(10):
                while 16 not in attempts():
                    await trio.sleep(0.01)
            assert attempts() == [1, 2, 4, 8, 16]


async def test_connections_after_a_test_are_all_closed(cluster: FakeCluster, proxy: ProxyServer) -> None:
    async with await client(proxy) as c:
        ports = broker_ports(await c.request(METADATA, 12, topics=None))
    for port in ports.values():
        await reaches(proxy, port, cluster)
    with trio.fail_after(5):
        while proxy.connections or any(b.open_connections for b in cluster.brokers.values()):
            await trio.sleep(0.01)


async def test_broker_ports_listen_at_start_up_before_any_client_asks() -> None:
    """A restarted kproxy must serve clients that kept cached metadata: it discovers the brokers itself."""
    base = free_port_range(8)
    async with fake_cluster((0, 2, 5)) as cluster, running_server(
            proxy_config(cluster.bootstrap, advertised_host=ADVERTISED, broker_port_base=base)) as server:
        with trio.fail_after(10):
            while not {base, base + 2, base + 5} <= set(server.listeners):
                await trio.sleep(0.01)
        # No client has sent anything yet: the ports were opened from kproxy's own Metadata request.
        assert cluster.received == [] and cluster.discovery_requests >= 1
        with trio.fail_after(10):
            await server.warmed.wait()  # and the codecs clients will use were compiled ahead
        for node_id in (0, 2, 5):
            assert await reaches(server, base + node_id, cluster) == node_id


async def test_failed_discovery_leaves_the_bootstrap_listener_serving() -> None:
    """With the cluster down, discovery keeps retrying in the background; the proxy stays up
    and a client on the bootstrap port is turned away cleanly (no broker port was invented)."""
    base = free_port_range(4)
    dead = free_port_range(1)
    async with running_server(proxy_config(f"127.0.0.1:{dead}", broker_port_base=base)) as server:
        await trio.sleep(0.3)  # a few failed attempts
        assert set(server.listeners) == {server.bootstrap_port}
        stream = await trio.open_tcp_stream("127.0.0.1", server.bootstrap_port)
        with trio.fail_after(10):
            assert await stream.receive_some(10) == b""  # closed: upstream unavailable
        await stream.aclose()
        assert not server.connections
