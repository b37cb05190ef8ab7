"""Hostile clients and broken brokers, through a real kproxy over raw sockets.

Each test here reproduces what a misbehaving peer can do to kproxy from the
outside: announce frames it never sends, collide correlation ids so that one
answer is read as another, or answer with bytes that do not parse. kproxy must
keep memory tied to bytes actually received, never let client bytes choose an
upstream target, and end a connection with one log line, never a traceback.
"""

from __future__ import annotations

import logging
import socket
import struct
import time
import tracemalloc
from typing import Any

import pytest
import trio

from kproxy.logfmt import LogfmtFormatter
from kproxy.protocol.frame_builder import request_frame
from kproxy.protocol.framing import FrameSplitter
from kproxy.testing import Broker, ProxyThread, proxy_config, running_server
from tests.support.fakecluster import FakeBroker, Received, fake_cluster
from tests.support.kafkaclient import KafkaClient

MiB = 1024 * 1024


async def wait_until(predicate: object, timeout: float = 5.0) -> None:
    assert callable(predicate)
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.005)


# -- a size prefix alone ----------------------------------------------------------------------------
def test_a_size_prefix_alone_allocates_nothing_like_the_announced_frame() -> None:
    """Ten streams each announce a 100 MiB frame and send nothing more: a few KB each, not 1 GB."""
    splitters = [FrameSplitter() for _ in range(10)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for splitter in splitters:
            assert splitter.split(struct.pack(">i", 100 * MiB) + b"abc")[0] == []
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 10 * 4096, f"{held} bytes held for 70 bytes received"
    assert [s.buffered for s in splitters] == [7] * 10


def test_large_frame_memory_grows_with_bytes_received() -> None:
    size = 64 * MiB
    splitter = FrameSplitter()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        chunk = b"z" * (64 * 1024)
        splitter.split(struct.pack(">i", size) + chunk)
        for _ in range(15):  # 1 MiB in all
            splitter.split(chunk)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert splitter.buffered == 4 + MiB
    assert held < 3 * MiB, f"{held} bytes held for 1 MiB received of a {size}-byte frame"


async def test_ten_connections_announcing_100_mib_each_hold_a_few_kb() -> None:
    """The same through a real kproxy: ten raw sockets send only a 4-byte size prefix."""
    async with fake_cluster((0,)) as cluster, running_server(proxy_config(cluster.bootstrap)) as server:
        with trio.fail_after(10):
            await server.warmed.wait()  # start-up discovery and codec warm-up allocate: not measured
        streams = [await trio.open_tcp_stream("127.0.0.1", server.bootstrap_port) for _ in range(10)]
        try:
            await wait_until(lambda: len(server.connections) == 10)
            await trio.sleep(0.1)
            tracemalloc.start(30)
            try:
                for stream in streams:
                    await stream.send_all(struct.pack(">i", 100 * MiB))
                await wait_until(lambda: all(c.stats.bytes_from_client == 4 for c in server.connections))
                await trio.sleep(0.1)
                snapshot = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
            ours = snapshot.filter_traces([tracemalloc.Filter(True, f"*/kproxy/{d}/*", all_frames=True)
                                           for d in ("server", "proxy", "protocol")])
            held = sum(stat.size for stat in ours.statistics("filename"))
            assert held < 10 * 8192, f"kproxy holds {held} bytes for 40 bytes received"
        finally:
            for stream in streams:
                await trio.aclose_forcefully(stream)


# -- correlation ids chosen to confuse answers -------------------------------------------------------
PRODUCE, METADATA = 0, 3


def fake_broker_entry(node_id: int, host: str, port: int) -> bytes:
    """One Metadata v12 broker entry: node id, compact host, port, null rack, no tags."""
    raw = host.encode()
    return struct.pack(">i", node_id) + bytes([len(raw) + 1]) + raw + struct.pack(">i", port) + b"\x00\x00"


def routes_of(proxy: ProxyThread) -> dict[int, str]:
    assert proxy.server is not None
    server = proxy.server
    return dict(proxy.call(lambda: {n: str(r.upstream) for n, r in server.addresses.routes.items()}))


def listener_names(proxy: ProxyThread) -> set[str]:
    assert proxy.server is not None
    server = proxy.server
    return set(proxy.call(lambda: {lst.name for lst in server.listeners.values()}))


def test_acks0_produce_and_metadata_sharing_an_id_cannot_choose_upstream_targets(
        tansu: Broker, proxy: ProxyThread, caplog: pytest.LogCaptureFixture) -> None:
    """Tansu answers acks=0 Produce, echoing the topic name. Sent under the id of a Metadata
    request, that answer would be read as the Metadata answer: the topic name below is laid out
    so that it reads as a broker list (Tansu's node re-pointed, a new node 7 with a listener)."""
    deadline = time.monotonic() + 10
    while not routes_of(proxy) and time.monotonic() < deadline:  # start-up discovery learned Tansu
        time.sleep(0.02)
    [(tansu_node, tansu_addr)] = routes_of(proxy).items()
    listeners = listener_names(proxy)
    # Read as a Metadata v12 body, Tansu's Produce v9 answer starts: responses count (1), the topic
    # name's compact length, then the name. Two name bytes end throttle_time_ms; then the brokers.
    name = b"xx\x03" + fake_broker_entry(tansu_node, "evil.test", 6666) + fake_broker_entry(7, "evil.test", 6666)
    produce = request_frame(PRODUCE, 9, 5, transactional_id=None, acks=0, timeout_ms=1000,
                            topic_data=[{"name": name.decode(), "partition_data": [{"index": 0, "records": b""}]}])
    metadata = request_frame(METADATA, 12, 5, topics=None)
    caplog.set_level(logging.INFO, logger="kproxy")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(produce + metadata)
        got = b""
        while True:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            got += data
    assert routes_of(proxy) == {tansu_node: tansu_addr}, "client bytes chose an upstream target"
    assert listener_names(proxy) == listeners
    assert got == b"", "the request reusing the id is refused: the connection closes unanswered"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any("event=connection_closed" in r.getMessage()
                                                   for r in caplog.records):
        time.sleep(0.02)
    [closed] = [r.getMessage() for r in caplog.records if "event=connection_closed" in r.getMessage()]
    assert "bad request from client: Metadata v12 request reuses correlation id 5" in closed


# -- malformed broker answers: one log line, never a traceback --------------------------------------
HEARTBEAT, SASL_HANDSHAKE, API_VERSIONS = 12, 17, 18
HEARTBEAT_BODY = {"group_id": "g", "generation_id": 1, "member_id": "m"}
# What the client asks, and the raw bytes the broker answers with after the correlation id.
# Answers kproxy must read (ApiVersions to cap it, SaslHandshake v0 for its error code, anything
# with broker addresses) end the connection; the rest pass as they are (metrics read their header
# tags too, and must shrug).
MALFORMED_ANSWERS: dict[str, tuple[int, int, dict[str, Any], bytes]] = {
    "api_versions_empty": (API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}, b""),
    "api_versions_one_byte": (API_VERSIONS, 0, {}, b"\x00"),
    "api_versions_cut_in_keys": (API_VERSIONS, 2, {}, b"\x00\x00\x00\x00\x00\x05\x00"),
    "sasl_handshake_empty": (SASL_HANDSHAKE, 0, {"mechanism": "GSSAPI"}, b""),
    "sasl_handshake_one_byte": (SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"}, b"\x00"),
    "metadata_header_tags_cut_short": (METADATA, 12, {"topics": None}, b"\x02\x00"),
    "metadata_header_tags_past_the_end": (METADATA, 12, {"topics": None}, b"\x01\x00\x7f\x00"),
    "passed_header_tags_not_shortest": (HEARTBEAT, 4, HEARTBEAT_BODY, b"\xff\x00\x00\x00"),
    "passed_header_tags_cut_short": (HEARTBEAT, 4, HEARTBEAT_BODY, b"\x01\x00"),
    "passed_header_tags_past_the_end": (HEARTBEAT, 4, HEARTBEAT_BODY, b"\x01\x00\x7f\x00"),
    "passed_header_tags_missing": (HEARTBEAT, 4, HEARTBEAT_BODY, b""),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED_ANSWERS))
async def test_malformed_broker_answer_ends_the_connection_in_one_log_line(
        kind: str, caplog: pytest.LogCaptureFixture) -> None:
    api_key, version, values, body = MALFORMED_ANSWERS[kind]
    caplog.set_level(logging.DEBUG, logger="kproxy")
    async with fake_cluster((0,)) as cluster, running_server(proxy_config(cluster.bootstrap)) as server:
        async def malformed(broker: FakeBroker, received: Received) -> bytes:
            return struct.pack(">i", received.correlation_id) + body

        cluster.handlers[api_key] = malformed
        caplog.clear()
        async with await KafkaClient.connect(server.bootstrap_port) as client:
            correlation_id = await client.send(api_key, version, **values)
            if kind.startswith("passed_"):
                assert await client.receive_frame() == struct.pack(">i", correlation_id) + body
            else:
                assert await client.closed_by_peer() == b"", "nothing malformed reaches the client"
        await wait_until(lambda: not server.connections)
    records = [r for r in caplog.records if r.name.startswith("kproxy")]
    lines = [LogfmtFormatter().format(r) for r in records]
    assert not [line for line in lines if "\n" in line or "traceback=" in line], lines
    assert not [r for r in records if r.exc_info or r.levelno >= logging.ERROR], lines
    closes = [line for line in lines if "event=connection_closed" in line]
    assert len(closes) == 1, lines
    reason = "reason=\"client closed\"" if kind.startswith("passed_") else "reason=\"bad response from upstream:"
    assert reason in closes[0]
    assert not [line for line in lines if "event=connection_crashed" in line]
