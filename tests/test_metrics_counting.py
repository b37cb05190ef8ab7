"""What a running kproxy counts, checked exactly where the count is known.

* error codes are counted under the API of the request each response answers, even
  when a client pipelines different APIs and the answers come back after later
  requests were read (the observer sees requests and completions interleaved);
* a frame refused for its size is counted on the side it came from (``request_*`` or
  ``response_*``), the other side staying at zero;
* histogram buckets are Prometheus ``le`` buckets: a value exactly on a bound is in
  that bound's bucket.

A real :class:`ProxyServer` runs in the test's trio run in front of the scripted fake
broker (tests/support/fakecluster.py); what it counts is read from its stats and from
the text exposition Prometheus would scrape.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any

import pytest
import trio
from prometheus_client import generate_latest

from kproxy.metrics.exposition import LiveGauges, make_registry
from kproxy.metrics.fixed_histogram import BROKER_BUCKETS, OVERHEAD_BUCKETS, Histogram
from kproxy.metrics.stats import TrafficStats
from kproxy.protocol import frame
from kproxy.protocol.codes import error_code
from kproxy.protocol.frame_builder import request_frame, response_body
from kproxy.testing import proxy_config, running_server
from tests.support.fakecluster import METADATA, PRODUCE, FakeBroker, Received, fake_cluster
from tests.support.kafkaclient import KafkaClient

LIST_OFFSETS = 2
UNKNOWN_API = 30000  # passes through kproxy untouched
UNKNOWN_TOPIC = error_code("UNKNOWN_TOPIC_OR_PARTITION")
NOT_LEADER = error_code("NOT_LEADER_OR_FOLLOWER")
LEADER_NOT_AVAILABLE = error_code("LEADER_NOT_AVAILABLE")


def exposition(stats: TrafficStats) -> str:
    return generate_latest(make_registry(stats, LiveGauges)).decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one series in a text exposition (labels matched exactly, in any order)."""
    for line in text.splitlines():
        m = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if m is None or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if found == labels:
            return float(m.group(3))
    return None


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.005)


# -- errors under the API each response answers ------------------------------------------------
async def test_pipelined_apis_have_their_errors_counted_under_their_own_api() -> None:
    """Metadata, Produce and ListOffsets pipelined on one connection, answered only once
    kproxy has read all three: the last request read is ListOffsets, yet each response's
    errors belong to the API it answers."""
    async with fake_cluster((0,)) as cluster, running_server(proxy_config(cluster.bootstrap)) as server:
        all_read = trio.Event()

        async def metadata(broker: FakeBroker, received: Received) -> dict[str, object]:
            # The broker answers nothing before kproxy's metrics have seen the three requests.
            await all_read.wait()
            return response_body(METADATA, received.api_version, brokers=[], topics=[
                {"error_code": UNKNOWN_TOPIC, "name": "gone-1", "partitions": []},
                {"error_code": UNKNOWN_TOPIC, "name": "gone-2", "partitions": []}])

        async def produce(broker: FakeBroker, received: Received) -> dict[str, object]:
            return response_body(PRODUCE, received.api_version, responses=[
                {"name": "orders", "partition_responses": [{"index": 0, "error_code": NOT_LEADER}]}])

        async def list_offsets(broker: FakeBroker, received: Received) -> dict[str, object]:
            return response_body(LIST_OFFSETS, received.api_version, topics=[
                {"name": "orders", "partitions": [
                    {"partition_index": i, "error_code": LEADER_NOT_AVAILABLE if i else 0} for i in range(4)]}])

        cluster.handlers.update({METADATA: metadata, PRODUCE: produce, LIST_OFFSETS: list_offsets})
        stats = server.stats
        async with await KafkaClient.connect(server.bootstrap_port) as client:
            pipelined = b"".join([
                request_frame(METADATA, 12, 1, topics=[{"name": "gone-1"}, {"name": "gone-2"}]),
                request_frame(PRODUCE, 9, 2, acks=1, timeout_ms=1000, topic_data=[
                    {"name": "orders", "partition_data": [{"index": 0, "records": None}]}]),
                request_frame(LIST_OFFSETS, 7, 3, replica_id=-1, topics=[
                    {"name": "orders", "partitions": [{"partition_index": i, "timestamp": -1} for i in range(4)]}]),
            ])
            await client.send_raw(pipelined)
            await wait_until(lambda: sum(stats.broker(None).requests.values()) == 3)
            assert not stats.broker(None).responses, "no answer may come back before all three requests are read"
            all_read.set()
            got = [struct.unpack_from(">i", await client.receive_frame())[0] for _ in range(3)]
            assert got == [1, 2, 3]
        await wait_until(lambda: sum(stats.broker(None).responses.values()) == 3)
        expected = {("metadata", "UNKNOWN_TOPIC_OR_PARTITION"): 2, ("produce", "NOT_LEADER_OR_FOLLOWER"): 1,
                    ("list_offsets", "LEADER_NOT_AVAILABLE"): 3}
        # Every answer came through the bootstrap port: node_id "bootstrap".
        assert list(stats.brokers) == ["bootstrap"]
        assert stats.broker(None).errors == expected, f"errors counted (api, error): {sorted(expected.items())}"
        text = exposition(stats)
        assert sample(text, "kproxy_response_errors_total", api="produce", error="NOT_LEADER_OR_FOLLOWER",
                      node_id="bootstrap", **{"class": "retriable"}) == 1
        assert sample(text, "kproxy_response_errors_total", api="list_offsets",
                      error="UNKNOWN_TOPIC_OR_PARTITION", node_id="bootstrap", **{"class": "retriable"}) is None
        # One response each, however many of its partitions carried an error.
        assert stats.broker(None).responses_with_errors == {
            ("metadata", "retriable"): 1, ("produce", "retriable"): 1, ("list_offsets", "retriable"): 1}


# -- one broker identity: node_id ----------------------------------------------------------------
def produce_body(partition: int) -> dict[str, Any]:
    return {"acks": 1, "timeout_ms": 1000,
            "topic_data": [{"name": "orders", "partition_data": [{"index": partition, "records": None}]}]}


async def test_each_brokers_traffic_and_connections_carry_its_node_id() -> None:
    """Three fake brokers: requests, latency and errors of a connection through broker N's listener
    are counted under node_id N (the bootstrap port's under "bootstrap"), and the client side and the
    upstream side of the connection metrics name the broker by that same node_id."""
    async with fake_cluster((0, 1, 2)) as cluster, running_server(proxy_config(cluster.bootstrap)) as server:
        cluster.add_topic("orders", [0, 1, 2])  # partition i is led by node i
        stats = server.stats
        async with await KafkaClient.connect(server.bootstrap_port) as boot:
            brokers = (await boot.request(METADATA, 12, topics=None)).body["brokers"]
        ports = {b["node_id"]: b["port"] for b in brokers}
        async with await KafkaClient.connect(ports[1]) as one, await KafkaClient.connect(ports[2]) as two:
            for _ in range(2):
                await one.request(PRODUCE, 9, **produce_body(1))  # node 1 leads partition 1: no error
            await two.request(PRODUCE, 9, **produce_body(0))      # node 2 does not lead 0: NOT_LEADER_OR_FOLLOWER
            await wait_until(lambda: sum(stats.broker(2).responses.values()) == 1)
            live = exposition(stats)
        await wait_until(lambda: not any(stats.client_connections.values()))
        text = exposition(stats)
        address = {n: b.address for n, b in cluster.brokers.items()}
    assert set(stats.brokers) == {"bootstrap", "1", "2"}
    assert stats.broker(None).requests == {("metadata", 12): 1}
    assert stats.broker(1).requests == {("produce", 9): 2}
    assert stats.broker(2).requests == {("produce", 9): 1}
    assert stats.broker(1).errors == {}
    assert stats.broker(2).errors == {("produce", "NOT_LEADER_OR_FOLLOWER"): 1}
    assert sample(text, "kproxy_requests_total", api="produce", version="9", node_id="1") == 2
    assert sample(text, "kproxy_requests_total", api="metadata", version="12", node_id="bootstrap") == 1
    assert sample(text, "kproxy_broker_latency_seconds_count", api="produce", node_id="1") == 2
    assert sample(text, "kproxy_broker_latency_seconds_count", api="produce", node_id="2") == 1
    assert sample(text, "kproxy_response_errors_total", api="produce", error="NOT_LEADER_OR_FOLLOWER",
                  node_id="2", **{"class": "retriable"}) == 1
    assert sample(text, "kproxy_responses_with_errors_total", api="produce", node_id="2",
                  **{"class": "retriable"}) == 1
    for node in ("1", "2"):
        # Both sides of the open connection, by the same node_id: broker-N's listener, node N's address.
        assert sample(live, "kproxy_client_connections_active", listener=f"broker-{node}", node_id=node) == 1
        assert sample(live, "kproxy_upstream_connections_active", upstream=address[int(node)], node_id=node) == 1
        assert sample(text, "kproxy_client_connections_accepted_total", listener=f"broker-{node}", node_id=node) == 1
        assert sample(text, "kproxy_upstream_connections_active", upstream=address[int(node)], node_id=node) == 0
    assert sample(text, "kproxy_client_connections_accepted_total", listener="bootstrap", node_id="bootstrap") == 1
    # Overhead is kproxy's own time, not a broker's: by api only.
    assert sample(text, "kproxy_overhead_seconds_count", api="produce") == 3


def test_totals_add_every_brokers_counters_up() -> None:
    """What `kproxy demo` reports across brokers: counters summed, histograms merged bucket by bucket."""
    stats = TrafficStats()
    heartbeat = frame(struct.pack(">ih", 1, 0))
    for node, seconds in ((None, 0.001), (1, 0.001), (1, 0.5), (2, 2.0)):
        stats.request(stats.broker(node), 12, 0, 10, None)
        stats.response(stats.broker(node), 12, 0, heartbeat, 8, broker_seconds=seconds, overhead_seconds=0.0001)
    total = stats.totals()
    assert total.requests == total.responses == {("heartbeat", 0): 4}
    latency = total.broker_latency["heartbeat"]
    assert dict(latency.cumulative())["0.001"] == 2 and dict(latency.cumulative())["+Inf"] == 4
    assert latency.sum == pytest.approx(2.502)
    assert stats.broker(1).broker_latency["heartbeat"].sum == pytest.approx(0.501)  # the brokers' own untouched


async def test_a_dead_brokers_connect_failures_carry_its_node_id() -> None:
    async with fake_cluster((0, 1)) as cluster, \
            running_server(proxy_config(cluster.bootstrap, upstream_check_interval=3600)) as server:
        async with await KafkaClient.connect(server.bootstrap_port) as boot:
            ports = {b["node_id"]: b["port"] for b in (await boot.request(METADATA, 12, topics=None)).body["brokers"]}
        dead = cluster.stop_broker(1)
        async with await KafkaClient.connect(ports[1]) as c:
            assert await c.closed_by_peer() == b""
    assert server.stats.upstream_connect_failures.get((dead.address, "1")) == 1
    assert sample(exposition(server.stats), "kproxy_upstream_connect_failures_total", upstream=dead.address,
                  node_id="1") == 1


# -- rejected frames by side -------------------------------------------------------------------
def opaque(correlation_id: int, body: bytes = b"") -> bytes:
    """A request of an api key nobody knows (header v1, null client id): forwarded as is."""
    return frame(struct.pack(">hhih", UNKNOWN_API, 0, correlation_id, -1) + body)


async def test_oversize_response_is_counted_as_a_response_reject() -> None:
    async with fake_cluster((0,)) as cluster, \
            running_server(proxy_config(cluster.bootstrap, limits__max_frame_size=1024)) as server:
        async def big(broker: FakeBroker, received: Received) -> bytes:
            return struct.pack(">i", received.correlation_id) + b"B" * 2000

        cluster.handlers[UNKNOWN_API] = big
        async with await KafkaClient.connect(server.bootstrap_port) as client:
            await client.send_raw(opaque(1))
            assert await client.closed_by_peer() == b""
        await wait_until(lambda: sum(server.stats.frames_rejected.values()) > 0)
        counted = {reason: n for reason, n in server.stats.frames_rejected.items() if n}
        assert counted == {"response_oversize": 1}, f"rejected frames by reason: {server.stats.frames_rejected}"
        text = exposition(server.stats)
        assert sample(text, "kproxy_frames_rejected_total", reason="response_oversize") == 1
        assert sample(text, "kproxy_frames_rejected_total", reason="request_oversize") == 0


async def test_oversize_request_is_counted_as_a_request_reject() -> None:
    async with fake_cluster((0,)) as cluster, \
            running_server(proxy_config(cluster.bootstrap, limits__max_frame_size=1024)) as server:
        async with await KafkaClient.connect(server.bootstrap_port) as client:
            await client.send_raw(struct.pack(">i", 4096) + b"z" * 200)
            assert await client.closed_by_peer() == b""
        await wait_until(lambda: sum(server.stats.frames_rejected.values()) > 0)
        counted = {reason: n for reason, n in server.stats.frames_rejected.items() if n}
        assert counted == {"request_oversize": 1}, f"rejected frames by reason: {server.stats.frames_rejected}"


# -- histogram buckets are inclusive (le) -----------------------------------------------------
@pytest.mark.parametrize("bounds", [BROKER_BUCKETS, OVERHEAD_BUCKETS], ids=["broker", "overhead"])
def test_value_on_a_bucket_bound_is_in_that_bucket(bounds: tuple[float, ...]) -> None:
    for i, bound in enumerate(bounds):
        hist = Histogram(bounds)
        hist.observe(bound)
        cumulative = dict(hist.cumulative())
        assert cumulative[repr(bound)] == 1, f"{bound} not counted in le={bound}"
        if i:
            assert cumulative[repr(bounds[i - 1])] == 0, f"{bound} counted in le={bounds[i - 1]}"
        assert cumulative["+Inf"] == 1


def test_latency_on_a_bound_is_exposed_in_that_bucket() -> None:
    stats = TrafficStats()
    response = frame(struct.pack(">ih", 1, 0))  # Heartbeat v0: correlation id, error code NONE
    stats.response(stats.broker(1), 12, 0, response, 8, broker_seconds=0.001, overhead_seconds=0.0001)
    text = exposition(stats)
    assert sample(text, "kproxy_broker_latency_seconds_bucket", api="heartbeat", node_id="1", le="0.0005") == 0
    assert sample(text, "kproxy_broker_latency_seconds_bucket", api="heartbeat", node_id="1", le="0.001") == 1
    assert sample(text, "kproxy_overhead_seconds_bucket", api="heartbeat", le="5e-05") == 0
    assert sample(text, "kproxy_overhead_seconds_bucket", api="heartbeat", le="0.0001") == 1
