"""A scripted Kafka cluster for tests, built on kproxy's own codec.

The one real broker of the suite (Tansu) is a single node; address rewriting
matters most for what it cannot show: several brokers, node ids that appear
later, brokers that move, coordinators on another node, KIP-951 leader hints.
:class:`FakeCluster` runs one trio listener per node id on an ephemeral
loopback port, decodes requests with :mod:`kproxy.protocol` and answers the
APIs that carry addresses from a small, mutable model of a cluster:

* ApiVersions: ``cluster.api_versions`` (api key -> (min, max)), by default
  every key and range kproxy's tables know; tests may widen ranges or add keys
  kproxy has never heard of.
* Metadata / DescribeCluster: the running brokers (or ``cluster.advertised``),
  ``cluster.topics`` and their partition leaders. ``controller_id`` is the
  node that *answered*, so a test can tell which broker it reached.
* FindCoordinator: v0-3 single answer, v4+ batched ``coordinators``;
  ``cluster.coordinators`` maps a key to a node id (default: lowest node id).
* Produce / Fetch: a partition led by another node gets
  NOT_LEADER_OR_FOLLOWER with ``current_leader`` and, from Produce v10 and
  Fetch v16 (KIP-951), the leader's ``node_endpoints``. Produce acks=0 gets no
  answer.
* Any api key the codec does not know: a raw echo (see :meth:`FakeCluster.echo`).

Every request is recorded in ``cluster.received`` (node id, decoded request,
raw payload). ``cluster.handlers[api_key]`` overrides an answer: an async
function of ``(broker, received)`` returning a body dict, a raw response
payload (``bytes``), or ``None`` for no answer; raise :class:`CloseConnection`
to hang up instead. :class:`tests.support.kafkaclient.KafkaClient` is the matching test client;
frames are built with :mod:`kproxy.protocol.frame_builder`.
"""

from __future__ import annotations

import contextlib
import struct
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import trio

from kproxy.protocol import (
    FrameSplitter,
    Request,
    UnknownApiError,
    decode_request,
    encode_response,
    frame,
    peek_request,
)
from kproxy.protocol.codes import ApiKey, ErrorCode, all_api_keys
from kproxy.protocol.frame_builder import response_body
from kproxy.protocol.message_schemas import supported_versions
from kproxy.protocol.messages import Body
from kproxy.server.discovery import DISCOVERY_CLIENT_ID

# The kinds and codes the fake cluster answers, by their Kafka names (tests import them from here).
PRODUCE, FETCH, METADATA = ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA
FIND_COORDINATOR, API_VERSIONS, DESCRIBE_CLUSTER = ApiKey.FIND_COORDINATOR, ApiKey.API_VERSIONS, ApiKey.DESCRIBE_CLUSTER
NONE, UNKNOWN_TOPIC_OR_PARTITION = ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
NOT_LEADER_OR_FOLLOWER = ErrorCode.NOT_LEADER_OR_FOLLOWER
COORDINATOR_NOT_AVAILABLE = ErrorCode.COORDINATOR_NOT_AVAILABLE
UNSUPPORTED_VERSION = ErrorCode.UNSUPPORTED_VERSION
LOOPBACK = "127.0.0.1"


# -- reading decoded bodies ----------------------------------------------------------------
def endpoints(value: Any) -> Iterator[tuple[Any, Any]]:
    """Every (host, port) pair anywhere in a decoded body."""
    if isinstance(value, dict):
        if "host" in value and "port" in value:
            yield value["host"], value["port"]
        for v in value.values():
            yield from endpoints(v)
    elif isinstance(value, list):
        for v in value:
            yield from endpoints(v)


# -- the cluster ----------------------------------------------------------------------------
class CloseConnection(Exception):
    """Raised by a handler: the fake broker hangs up without answering (after sending
    ``last_words``, raw bytes such as half a frame, if given)."""

    def __init__(self, last_words: bytes = b"") -> None:
        super().__init__("fake broker hangs up")
        self.last_words = last_words


@dataclass
class Received:
    """One request as a fake broker got it."""

    node_id: int
    api_key: int
    api_version: int
    correlation_id: int
    request: Request | None  # None when the codec does not know (api key, version)
    payload: bytes  # without the size prefix

    @property
    def body(self) -> Body:
        assert self.request is not None
        return self.request.body


@dataclass
class Topic:
    name: str
    leaders: list[int]  # partition index -> leader node id
    topic_id: uuid.UUID = field(default_factory=uuid.uuid4)
    leader_epoch: int = 7


@dataclass
class FakeBroker:
    node_id: int
    host: str = LOOPBACK
    port: int = 0
    rack: str | None = None
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    connections_accepted: int = 0
    open_connections: int = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


Handler = Callable[[FakeBroker, Received], Awaitable[Body | bytes | None]]


class FakeCluster:
    """Fake brokers, one listener each; see the module docstring. Use :func:`fake_cluster`."""

    def __init__(self, nursery: trio.Nursery, *, cluster_id: str = "fake-cluster") -> None:
        self._nursery = nursery
        self.cluster_id = cluster_id
        self.brokers: dict[int, FakeBroker] = {}
        self.topics: dict[str, Topic] = {}
        self.coordinators: dict[str, int] = {}
        self.advertised: list[int] | None = None  # node ids Metadata lists; None: every running broker
        self.api_versions: dict[int, tuple[int, int]] = {
            k: span for k in all_api_keys() if (span := supported_versions(k)) is not None}
        self.handlers: dict[int, Handler] = {}
        self.received: list[Received] = []
        self.discovery_requests = 0  # kproxy's start-up broker discovery, kept out of `received`
        self.ports_used: set[int] = set()  # every port any fake broker ever listened on
        self.next_offset = 0

    # -- topology ---------------------------------------------------------------------------
    async def add_broker(self, node_id: int, *, rack: str | None = None) -> FakeBroker:
        """Start broker ``node_id`` on a fresh ephemeral port."""
        assert node_id not in self.brokers, f"broker {node_id} already runs"
        broker = FakeBroker(node_id, rack=rack)
        await self._nursery.start(self._serve, broker)
        self.brokers[node_id] = broker
        return broker

    def stop_broker(self, node_id: int) -> FakeBroker:
        """Close broker ``node_id``'s listener and its connections."""
        broker = self.brokers.pop(node_id)
        broker.scope.cancel()
        return broker

    async def move_broker(self, node_id: int) -> FakeBroker:
        """The same node id, now on another port; the old port stops listening."""
        old = self.stop_broker(node_id)
        new = await self.add_broker(node_id, rack=old.rack)
        assert new.port != old.port
        return new

    def add_topic(self, name: str, leaders: list[int]) -> Topic:
        topic = self.topics[name] = Topic(name, list(leaders))
        return topic

    @property
    def bootstrap(self) -> str:
        return self.brokers[min(self.brokers)].address

    def of(self, node_id: int) -> list[Received]:
        """Requests node ``node_id`` received, oldest first."""
        return [r for r in self.received if r.node_id == node_id]

    # -- serving ----------------------------------------------------------------------------
    async def _serve(self, broker: FakeBroker, *, task_status: trio.TaskStatus[None]) -> None:
        with broker.scope:
            listeners = await trio.open_tcp_listeners(0, host=broker.host)
            broker.port = listeners[0].socket.getsockname()[1]
            self.ports_used.add(broker.port)
            task_status.started()

            async def handle(stream: trio.SocketStream) -> None:
                await self._handle(broker, stream)

            await trio.serve_listeners(handle, listeners)

    async def _handle(self, broker: FakeBroker, stream: trio.abc.Stream) -> None:
        broker.connections_accepted += 1
        broker.open_connections += 1
        splitter = FrameSplitter()
        try:
            async with stream:
                while True:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    splitter.feed(data)
                    for payload in splitter.frames():
                        try:
                            answer = await self._answer(broker, payload)
                        except CloseConnection as exc:
                            if exc.last_words:
                                await stream.send_all(exc.last_words)
                            return
                        if answer is not None:
                            await stream.send_all(frame(answer))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            broker.open_connections -= 1

    async def _answer(self, broker: FakeBroker, payload: bytes) -> bytes | None:
        api_key, api_version, correlation_id = peek_request(payload)
        try:
            request: Request | None = decode_request(payload)
        except UnknownApiError:
            request = None
        received = Received(broker.node_id, api_key, api_version, correlation_id, request, payload)
        if request is not None and request.header.client_id == DISCOVERY_CLIENT_ID:
            # kproxy's own start-up Metadata request: answered, but not part of what a test sent.
            self.discovery_requests += 1
            body = await self.answer(broker, received)
            assert isinstance(body, dict)
            return encode_response(correlation_id, api_key, api_version, body)
        self.received.append(received)
        handler = self.handlers.get(api_key)
        result = await (handler(broker, received) if handler is not None else self.answer(broker, received))
        if result is None or isinstance(result, bytes):
            return result
        return encode_response(correlation_id, api_key, api_version, result)

    async def answer(self, broker: FakeBroker, received: Received) -> Body | bytes | None:
        """The default answer (handlers that only add a delay or a tweak call this)."""
        if received.request is None:
            return self.echo(received)
        make = {
            API_VERSIONS: self._api_versions, METADATA: self._metadata,
            FIND_COORDINATOR: self._find_coordinator, DESCRIBE_CLUSTER: self._describe_cluster,
            PRODUCE: self._produce, FETCH: self._fetch,
        }.get(received.api_key)
        if make is None:
            return response_body(received.api_key, received.api_version)
        return make(broker, received.api_version, received.body)

    @staticmethod
    def echo(received: Received) -> bytes:
        """Raw answer to an api key the codec does not know: correlation id, b"echo", the request."""
        return struct.pack(">i", received.correlation_id) + b"echo" + received.payload

    # -- answers -----------------------------------------------------------------------------
    def _advertised(self) -> list[FakeBroker]:
        ids = sorted(self.brokers) if self.advertised is None else self.advertised
        return [self.brokers[i] for i in ids if i in self.brokers]

    def _broker_values(self, broker: FakeBroker) -> dict[str, Any]:
        return {"node_id": broker.node_id, "broker_id": broker.node_id, "host": broker.host,
                "port": broker.port, "rack": broker.rack, "is_fenced": False}

    def _api_versions(self, broker: FakeBroker, version: int, body: Body) -> Body:
        keys = [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in
                sorted(self.api_versions.items())]
        return response_body(API_VERSIONS, version, error_code=NONE, api_keys=keys)

    def _metadata(self, broker: FakeBroker, version: int, body: Body) -> Body:
        wanted = body.get("topics")
        every = wanted is None or (version == 0 and not wanted)  # v0: an empty list means all
        names = sorted(self.topics) if every else [t["name"] for t in wanted or ()]
        topics: list[dict[str, Any]] = []
        for name in names:
            topic = self.topics.get(name)
            if topic is None:
                topics.append({"error_code": UNKNOWN_TOPIC_OR_PARTITION, "name": name, "partitions": []})
                continue
            topics.append({"error_code": NONE, "name": name, "topic_id": topic.topic_id, "partitions": [
                {"error_code": NONE, "partition_index": i, "leader_id": leader,
                 "leader_epoch": topic.leader_epoch, "replica_nodes": [leader], "isr_nodes": [leader],
                 "offline_replicas": []}
                for i, leader in enumerate(topic.leaders)]})
        return response_body(METADATA, version, brokers=[self._broker_values(b) for b in self._advertised()],
                             cluster_id=self.cluster_id, controller_id=broker.node_id, topics=topics)

    def _describe_cluster(self, broker: FakeBroker, version: int, body: Body) -> Body:
        return response_body(DESCRIBE_CLUSTER, version, cluster_id=self.cluster_id,
                             controller_id=broker.node_id,
                             brokers=[self._broker_values(b) for b in self._advertised()])

    def _coordinator(self, key: str) -> dict[str, Any]:
        node = self.coordinators.get(key, min(self.brokers))
        found = self.brokers.get(node)
        if found is None:
            return {"key": key, "error_code": COORDINATOR_NOT_AVAILABLE, "node_id": -1, "host": "",
                    "port": -1}
        return {"key": key, "error_code": NONE, "node_id": node, "host": found.host, "port": found.port}

    def _find_coordinator(self, broker: FakeBroker, version: int, body: Body) -> Body:
        if version < 4:
            return response_body(FIND_COORDINATOR, version, **self._coordinator(body["key"]))
        return response_body(FIND_COORDINATOR, version,
                             coordinators=[self._coordinator(k) for k in body["coordinator_keys"]])

    def _topic(self, item: dict[str, Any]) -> Topic | None:
        if "topic_id" in item:
            return next((t for t in self.topics.values() if t.topic_id == item["topic_id"]), None)
        return self.topics.get(item.get("name", item.get("topic", "")))

    def _leader_hint(self, broker: FakeBroker, topic: Topic | None, index: int,
                     hinted: set[int]) -> dict[str, Any]:
        """Error code and KIP-951 fields for one partition as ``broker`` sees it."""
        if topic is None or not 0 <= index < len(topic.leaders):
            return {"error_code": UNKNOWN_TOPIC_OR_PARTITION}
        leader = topic.leaders[index]
        if leader == broker.node_id:
            return {"error_code": NONE}
        hinted.add(leader)
        return {"error_code": NOT_LEADER_OR_FOLLOWER,
                "current_leader": {"leader_id": leader, "leader_epoch": topic.leader_epoch}}

    def _node_endpoints(self, hinted: set[int]) -> list[dict[str, Any]]:
        return [self._broker_values(self.brokers[n]) for n in sorted(hinted) if n in self.brokers]

    def _produce(self, broker: FakeBroker, version: int, body: Body) -> Body | None:
        if body["acks"] == 0:
            return None
        hinted: set[int] = set()
        responses = []
        for item in body["topic_data"]:
            topic = self._topic(item)
            partitions = []
            for part in item["partition_data"]:
                values = {"index": part["index"], "base_offset": -1,
                          **self._leader_hint(broker, topic, part["index"], hinted)}
                if values["error_code"] == NONE:
                    values["base_offset"] = self.next_offset
                    self.next_offset += 1
                partitions.append(values)
            responses.append({"name": item.get("name"), "topic_id": item.get("topic_id"),
                              "partition_responses": partitions})
        extra = {"node_endpoints": self._node_endpoints(hinted)} if hinted else {}
        return response_body(PRODUCE, version, responses=responses, **extra)

    def _fetch(self, broker: FakeBroker, version: int, body: Body) -> Body:
        hinted: set[int] = set()
        responses = []
        for item in body["topics"]:
            topic = self._topic(item)
            partitions = [{"partition_index": p["partition"], "high_watermark": 0, "records": None,
                           **self._leader_hint(broker, topic, p["partition"], hinted)}
                          for p in item["partitions"]]
            responses.append({"topic": item.get("topic"), "topic_id": item.get("topic_id"),
                              "partitions": partitions})
        extra = {"node_endpoints": self._node_endpoints(hinted)} if hinted else {}
        return response_body(FETCH, version, responses=responses, **extra)


@contextlib.asynccontextmanager
async def fake_cluster(node_ids: tuple[int, ...] = (0, 1, 2), **kwargs: Any) -> AsyncIterator[FakeCluster]:
    """A running :class:`FakeCluster`; every broker stops on exit."""
    async with trio.open_nursery() as nursery:
        cluster = FakeCluster(nursery, **kwargs)
        for node_id in node_ids:
            await cluster.add_broker(node_id)
        try:
            yield cluster
        finally:
            nursery.cancel_scope.cancel()
