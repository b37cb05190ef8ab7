"""The error-response builder: every known (api, version), two independent decoders, real clients."""

from __future__ import annotations

import io
import uuid
from typing import Any

import pytest
import trio

from kproxy.protocol import MessageType, decode_body, default_body, response_header_version
from kproxy.protocol.error_response import error_response, set_error_codes
from kproxy.protocol.frame_builder import request_frame
from kproxy.protocol.headers import decode_response_header
from kproxy.protocol.message_schemas import all_message_kinds
from kproxy.protocol.messages import require_codec
from kproxy.protocol.scan import scan_body
from tests.support.fakecluster import PRODUCE, Received, fake_cluster
from tests.support.matrix import matrix_cut

NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR, TOPIC_AUTHORIZATION_FAILED = 6, 16, 29
REQUEST_KINDS = [(k, v) for k, v, d in all_message_kinds() if d is MessageType.REQUEST
                 and (k, v, MessageType.RESPONSE) in set(all_message_kinds())]


def _read_back(api_key: int, version: int, frame: bytes) -> tuple[int, dict[str, Any]]:
    assert int.from_bytes(frame[:4], "big", signed=True) == len(frame) - 4
    header = decode_response_header(frame[4:], api_key, version)
    assert header.header_version == response_header_version(api_key, version)
    return header.correlation_id, decode_body(api_key, version, MessageType.RESPONSE, frame[4:], header.size)


def _error_codes(api_key: int, version: int, body: dict[str, Any]) -> list[int]:
    raw = require_codec(api_key, version, MessageType.RESPONSE).encode(body)
    return list(scan_body(api_key, version, MessageType.RESPONSE, raw).error_codes())


# This run's share (tests/support/matrix.py): every api's boundary versions, a seeded sample of the rest.
@pytest.mark.parametrize(("api_key", "version"),
                         matrix_cut(REQUEST_KINDS, lambda k: (*k, MessageType.RESPONSE), "error-response"),
                         ids=lambda x: str(x))
def test_every_known_kind_answers_with_the_error(api_key: int, version: int) -> None:
    """An empty request of each kind: our decoder reads the answer; every code it has is the error."""
    request = request_frame(api_key, version, 424242, default_body(api_key, version, MessageType.REQUEST))
    answer = error_response(request, NOT_LEADER_OR_FOLLOWER)
    correlation_id, body = _read_back(api_key, version, answer)
    assert correlation_id == 424242
    assert set(_error_codes(api_key, version, body)) <= {NOT_LEADER_OR_FOLLOWER}
    schema = require_codec(api_key, version, MessageType.RESPONSE).schema
    top_codes = [f.name for f in schema.fields if f.is_error_code and f.tag is None]
    assert all(body[name] == NOT_LEADER_OR_FOLLOWER for name in top_codes)
    if any(f.name == "throttle_time_ms" for f in schema.fields):
        assert body["throttle_time_ms"] == 0


def _produce_request(version: int) -> bytes:
    topic = {"name": "orders", "partition_data": [{"index": 0, "records": None}, {"index": 1, "records": None},
                                                  {"index": 2, "records": None}]}
    if version >= 13:  # KIP-516: Produce v13 names topics by id
        topic = {"topic_id": uuid.UUID(int=7), **{k: v for k, v in topic.items() if k != "name"}}
    return request_frame(PRODUCE, version, 99, acks=-1, timeout_ms=1000, topic_data=[topic])


@pytest.mark.parametrize("version", range(3, 14))
def test_produce_partitions_answered_and_subset_fails(version: int) -> None:
    require_codec(PRODUCE, version, MessageType.REQUEST)
    _, body = _read_back(PRODUCE, version, error_response(_produce_request(version), NOT_LEADER_OR_FOLLOWER,
                                                          partitions=[1], message="moved"))
    [topic] = body["responses"]
    parts = {p["index"]: p for p in topic["partition_responses"]}
    assert sorted(parts) == [0, 1, 2]
    assert [parts[i]["error_code"] for i in (0, 1, 2)] == [0, NOT_LEADER_OR_FOLLOWER, 0]
    assert all(p["base_offset"] == -1 for p in parts.values())  # nothing was appended
    if "error_message" in parts[1]:
        assert parts[1]["error_message"] == "moved"
        assert parts[0]["error_message"] is None


@pytest.mark.parametrize("version", [0, 4, 7, 11, 12, 13, 15, 16, 17])
def test_fetch_partitions_by_name_or_id(version: int) -> None:
    topic: dict[str, Any] = {"partitions": [{"partition": 5, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                                             "current_leader_epoch": -1, "log_start_offset": -1,
                                             "last_fetched_epoch": -1}]}
    if version >= 13:
        topic["topic_id"] = uuid.UUID(int=3)
    else:
        topic["topic"] = "events"
    frame = request_frame(1, version, 5, replica_id=-1, max_wait_ms=500, min_bytes=1, topics=[topic])
    _, body = _read_back(1, version, error_response(frame, NOT_LEADER_OR_FOLLOWER))
    [answer] = body["responses"]
    assert answer.get("topic_id", answer.get("topic")) in (uuid.UUID(int=3), "events")
    [part] = answer["partitions"]
    assert (part["partition_index"], part["error_code"], part["high_watermark"]) == (5, NOT_LEADER_OR_FOLLOWER, -1)
    assert part["records"] == b""


def test_offset_fetch_partition_indexes_become_partitions() -> None:
    frame = request_frame(9, 5, 1, group_id="g", topics=[{"name": "t", "partition_indexes": [1, 2]}])
    _, body = _read_back(9, 5, error_response(frame, NOT_COORDINATOR))
    assert [(p["partition_index"], p["error_code"], p["committed_offset"])
            for p in body["topics"][0]["partitions"]] == [(1, NOT_COORDINATOR, -1), (2, NOT_COORDINATOR, -1)]
    assert body["error_code"] == NOT_COORDINATOR


def test_find_coordinator_batched_keys_each_answered() -> None:
    frame = request_frame(10, 4, 1, key_type=0, coordinator_keys=["g1", "g2"])
    _, body = _read_back(10, 4, error_response(frame, NOT_COORDINATOR))
    assert [(c["key"], c["error_code"], c["node_id"], c["port"]) for c in body["coordinators"]] == [
        ("g1", NOT_COORDINATOR, -1, -1), ("g2", NOT_COORDINATOR, -1, -1)]


def test_api_versions_uses_response_header_v0_even_when_flexible() -> None:
    answer = error_response(request_frame(18, 3, 77, client_software_name="x", client_software_version="1"), 35)
    assert answer[4:8] == (77).to_bytes(4, "big")
    _, body = _read_back(18, 3, answer)
    assert body["error_code"] == 35


def test_trailing_request_bytes_are_ignored() -> None:
    """librdkafka sends some requests with bytes after the body; brokers answer them."""
    frame = request_frame(3, 12, 8, topics=[{"name": "a", "topic_id": uuid.UUID(int=0)}])
    padded = (len(frame) - 4 + 3).to_bytes(4, "big") + frame[4:] + b"\0\0\0"
    _, body = _read_back(3, 12, error_response(padded, TOPIC_AUTHORIZATION_FAILED))
    assert [(t["name"], t["error_code"]) for t in body["topics"]] == [("a", TOPIC_AUTHORIZATION_FAILED)]


def test_set_error_codes_replaces_a_decoded_response_in_place() -> None:
    fields = require_codec(PRODUCE, 9, MessageType.RESPONSE).schema.fields
    body = default_body(PRODUCE, 9, MessageType.RESPONSE)
    body["responses"] = [{"name": "t", "partition_responses": [
        {"index": i, "error_code": 0, "base_offset": 10, "log_append_time_ms": -1, "log_start_offset": 0,
         "record_errors": [], "error_message": None} for i in range(3)]}]
    assert set_error_codes(fields, body, NOT_LEADER_OR_FOLLOWER, partitions={0, 2}) == 2
    assert [p["error_code"] for p in body["responses"][0]["partition_responses"]] == [6, 0, 6]


# -- independent decoders -------------------------------------------------------------------
SAMPLE = [(0, 3), (0, 9), (0, 11), (1, 4), (1, 12), (2, 5), (3, 1), (3, 12), (8, 8), (9, 5), (10, 2), (10, 4),
          (11, 7), (12, 4), (14, 5), (18, 0), (18, 3), (19, 7), (22, 4), (32, 4), (60, 1)]


def _sample_request(api_key: int, version: int) -> bytes:
    if api_key == PRODUCE:
        return _produce_request(version)
    values: dict[str, Any] = {
        1: {"replica_id": -1, "topics": [{"topic": "t", "topic_id": uuid.UUID(int=1), "partitions": [
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}]}]},
        2: {"replica_id": -1, "topics": [{"name": "t", "partitions": [{"partition_index": 0, "timestamp": -1}]}]},
        3: {"topics": [{"name": "t", "topic_id": uuid.UUID(int=0)}]},
        8: {"group_id": "g", "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 1}]}]},
        19: {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1}]},
        32: {"resources": [{"resource_type": 2, "resource_name": "t", "configuration_keys": None}]},
        9: {"group_id": "g", "topics": [{"name": "t", "partition_indexes": [0]}]},
        10: {"key": "g", "key_type": 0, "coordinator_keys": ["g"]},
    }.get(api_key, {})
    return request_frame(api_key, version, 31337, **values)


@pytest.mark.parametrize(("api_key", "version"), SAMPLE)
def test_kio_reads_the_same_answer(api_key: int, version: int) -> None:
    kio_index = pytest.importorskip("kio.index")
    kio_serial = pytest.importorskip("kio.serial")
    answer = error_response(_sample_request(api_key, version), NOT_LEADER_OR_FOLLOWER)
    header = decode_response_header(answer[4:], api_key, version)
    cls = kio_index.load_response_schema(api_key, version)
    entity, size = kio_serial.entity_reader(cls)(answer[4 + header.size:], 0)
    assert size == len(answer) - 4 - header.size
    # Tagged error codes absent from the wire (CreateTopics' TopicConfigErrorCode) read as 0 there.
    codes = [c for c in _kio_error_codes(entity) if c]
    assert codes and set(codes) == {NOT_LEADER_OR_FOLLOWER}
    assert codes == _our_codes(_read_back(api_key, version, answer)[1])


def _kio_error_codes(value: Any) -> list[int]:
    import dataclasses

    out: list[int] = []
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.name.endswith("error_code"):
                out.append(int(getattr(item, "value", item)))
            else:
                out.extend(_kio_error_codes(item))
    elif isinstance(value, tuple | list):
        for item in value:
            out.extend(_kio_error_codes(item))
    return out


@pytest.mark.parametrize(("api_key", "version"), SAMPLE)
def test_kafka_python_reads_the_same_answer(api_key: int, version: int) -> None:
    from tests.test_codec_crosscheck import KP_CLASSES

    cls = KP_CLASSES.get((api_key, MessageType.RESPONSE))
    if cls is None or version > cls.max_version:
        pytest.skip("kafka-python has no class for this kind")
    if api_key == 18:
        pytest.skip("kafka-python reads any ApiVersions answer with an error as v0 (the KIP-511 fallback)")
    answer = error_response(_sample_request(api_key, version), NOT_LEADER_OR_FOLLOWER)
    header = decode_response_header(answer[4:], api_key, version)
    message = cls.decode(io.BytesIO(answer[4 + header.size:]).read(), version=version)
    ours = _read_back(api_key, version, answer)[1]
    assert _kp_codes(message.to_dict() if hasattr(message, "to_dict") else vars(message)) == \
        _our_codes(ours)


def _our_codes(value: Any) -> list[int]:
    if isinstance(value, dict):
        return [c for k, v in value.items() for c in ([v] if k.endswith("error_code") else _our_codes(v))]
    if isinstance(value, list):
        return [c for v in value for c in _our_codes(v)]
    return []


def _kp_codes(value: Any) -> list[int]:
    # As for kio: an absent tagged error code reads as 0; every code the builder set is non-zero here.
    return [c for c in _our_codes(value) if c]


# -- a real client ------------------------------------------------------------------------
async def test_kafka_python_producer_retries_injected_not_leader() -> None:
    """kafka-python meets NOT_LEADER_OR_FOLLOWER built by the builder twice, retries, then succeeds."""
    kafka = pytest.importorskip("kafka")
    async with fake_cluster((0,)) as cluster:
        cluster.add_topic("orders", [0])
        injected: list[int] = []

        async def produce(broker: Any, received: Received) -> Any:
            if len(injected) < 2:
                injected.append(received.correlation_id)
                frame = len(received.payload).to_bytes(4, "big") + received.payload
                return error_response(frame, NOT_LEADER_OR_FOLLOWER)[4:]
            return await cluster.answer(broker, received)

        cluster.handlers[PRODUCE] = produce

        def run_producer() -> Any:
            producer = kafka.KafkaProducer(bootstrap_servers=cluster.bootstrap, retries=5, retry_backoff_ms=50,
                                           request_timeout_ms=5000, max_block_ms=10000, linger_ms=0,
                                           # the fake answers InitProducerId with a default body, not a
                                           # producer id an idempotent producer can use
                                           enable_idempotence=False)
            try:
                return producer.send("orders", b"v").get(timeout=20)
            finally:
                producer.close(timeout=5)

        with trio.fail_after(60):
            metadata = await trio.to_thread.run_sync(run_producer)
        produced = [r for r in cluster.received if r.api_key == PRODUCE]
        assert len(injected) == 2
        assert len(produced) == 3  # two injected errors, then the retry that landed
        # NOT_LEADER_OR_FOLLOWER makes a client refresh its metadata before retrying.
        first_error = cluster.received.index(produced[0])
        assert any(r.api_key == 3 for r in cluster.received[first_error:])
        assert metadata.topic == "orders" and metadata.partition == 0 and metadata.offset >= 0


async def test_librdkafka_producer_retries_injected_not_leader() -> None:
    """librdkafka (confluent-kafka) meets the same injected error and delivers after its retry."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    async with fake_cluster((0,)) as cluster:
        cluster.add_topic("orders", [0])
        injected: list[int] = []

        async def produce(broker: Any, received: Received) -> Any:
            if not injected:
                injected.append(received.correlation_id)
                frame = len(received.payload).to_bytes(4, "big") + received.payload
                return error_response(frame, NOT_LEADER_OR_FOLLOWER)[4:]
            return await cluster.answer(broker, received)

        cluster.handlers[PRODUCE] = produce

        def run_producer() -> list[Any]:
            outcomes: list[Any] = []
            producer = confluent_kafka.Producer({
                "bootstrap.servers": cluster.bootstrap, "retry.backoff.ms": 50, "message.timeout.ms": 20000,
                "enable.idempotence": False, "linger.ms": 0})
            producer.produce("orders", b"v", partition=0, on_delivery=lambda err, msg: outcomes.append(err))
            producer.flush(25)
            return outcomes

        with trio.fail_after(60):
            outcomes = await trio.to_thread.run_sync(run_producer)
        assert outcomes == [None]  # delivered, no error reached the application
        assert len(injected) == 1
        assert len([r for r in cluster.received if r.api_key == PRODUCE]) == 2
