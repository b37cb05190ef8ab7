"""mutate_metadata against a scripted three-broker cluster (tests/support/fakebroker.py), with librdkafka:
what one real broker cannot show. A rule moves a partition's leader and hides a broker; the client
follows the metadata kproxy hands it: its Produce goes to the new leader, never to the hidden broker.
"""

from __future__ import annotations

from pathlib import Path

import trio
from confluent_kafka import Producer

from kproxy.server.proxy_server import ProxyServer
from kproxy.testing import proxy_config, running_server
from tests.support.fakecluster import METADATA, PRODUCE, FakeCluster, fake_cluster
from tests.support.kafkaclient import KafkaClient

RULES = """
rules:
  - id: election
    match: {api: metadata}
    actions:
      - mutate_metadata:
          move_leader: [{topic: orders, partition: 0, to: 1}]
          hide_brokers: [2]
"""


def produce_one(bootstrap: str) -> None:
    # The fake leader (node 0) is not where the rule sends the client: node 1 refuses it, so the
    # delivery times out; what matters is where librdkafka sent it.
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 3000, "enable.idempotence": False,
                         "topic.metadata.refresh.interval.ms": 500})
    producer.produce("orders", value=b"x", partition=0)
    producer.flush(6)


async def test_a_moved_leader_and_a_hidden_broker_move_a_real_client(tmp_path: Path) -> None:
    rules = tmp_path / "election.yaml"
    rules.write_text(RULES)
    async with fake_cluster((0, 1, 2)) as cluster:
        cluster.add_topic("orders", [0, 1, 2])
        async with running_server(proxy_config(cluster.bootstrap, rules=str(rules))) as server:
            await _check_metadata(server)
            await trio.to_thread.run_sync(produce_one, f"127.0.0.1:{server.bootstrap_port}")
            produced = _produce_nodes(cluster)
    assert produced and set(produced) == {1}, f"Produce for orders/0 reached nodes {produced}"
    assert not any(r.node_id == 2 for r in cluster.received), "the hidden broker was reached"


async def _check_metadata(server: ProxyServer) -> None:
    async with await KafkaClient.connect(server.bootstrap_port) as c:
        body = (await c.request(METADATA, 12, topics=[{"name": "orders"}])).body
    assert sorted(b["node_id"] for b in body["brokers"]) == [0, 1]
    [orders] = body["topics"]
    assert orders["partitions"][0]["leader_id"] == 1


def _produce_nodes(cluster: FakeCluster) -> list[int]:
    return [r.node_id for r in cluster.received if r.api_key == PRODUCE and r.request is not None
            and any(t.get("name") == "orders" for t in r.body["topic_data"])]
