"""Frame transformations for fault injection (kproxy/protocol/response_faults.py, field_rewrite.py,
endpoints.py, record_faults.py): each on frames built with the codec for every version that has the
field; the result decodes, exactly the asked change is made and everything else is equal."""

from __future__ import annotations

import copy
import struct
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords

from kproxy.protocol import MessageType, decode_request, decode_response
from kproxy.protocol.compression import Codec
from kproxy.protocol.endpoints import rewrite_endpoints
from kproxy.protocol.error_response import error_response
from kproxy.protocol.errors import (
    ApiVersionsMutationError,
    CorruptRecordsError,
    EndpointRewriteError,
    ErrorCodeMutationError,
    FieldRewriteError,
    MetadataMutationError,
    MutationError,
    ProtocolError,
    RecordsMutationError,
    ThrottleTimeError,
)
from kproxy.protocol.field_rewrite import FieldEdit, rename_topics, rewrite_fields
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.headers import response_body_offset
from kproxy.protocol.message_schemas import ERROR_CODE_FIELDS, all_message_kinds, message_schema, supported_versions
from kproxy.protocol.messages import default_body
from kproxy.protocol.record_faults import CorruptTarget, corrupt_records, duplicate_records, replace_schema_ids
from kproxy.protocol.records import (
    Record,
    count_records,
    decode_all,
    encode_batch_v2,
    encode_message_set,
    iter_batches,
    verify_crc,
)
from kproxy.protocol.response_faults import (
    HiddenLeader,
    MetadataEdits,
    downgrade_api_versions,
    mutate_metadata,
    replace_error_codes,
    set_throttle_time,
)
from kproxy.protocol.scan import scan_body
from tests.test_records import kafka_codecs  # noqa: F401  (a fixture: kafka-python's codecs through cramjam)

PRODUCE, FETCH, METADATA, API_VERSIONS, DESCRIBE_CONFIGS, DESCRIBE_CLUSTER, DESCRIBE_TOPIC_PARTITIONS = \
    0, 1, 3, 18, 32, 60, 75
LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, UNSUPPORTED_VERSION = 5, 6, 35
ALL_CODECS = [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]


def versions(api_key: int, first: int = 0) -> list[int]:
    lo, hi = supported_versions(api_key) or (0, -1)
    return list(range(max(lo, first), hi + 1))


def body_of_response(api_key: int, version: int, frame: bytes) -> dict[str, Any]:
    return decode_response(frame[4:], api_key, version).body


def test_mutation_errors_are_protocol_errors() -> None:
    for kind in (ThrottleTimeError, MetadataMutationError, ApiVersionsMutationError, ErrorCodeMutationError,
                 FieldRewriteError, RecordsMutationError, EndpointRewriteError):
        assert issubclass(kind, MutationError) and issubclass(kind, ProtocolError)


# ------------------------------------------------------------------------------ throttle time

RESPONSE_KINDS = [(k, v) for k, v, d in all_message_kinds() if d is MessageType.RESPONSE]
THROTTLED = [(k, v) for k, v in RESPONSE_KINDS
             if any(f.name == "throttle_time_ms" and f.tag is None
                    for f in message_schema(k, v, MessageType.RESPONSE).fields)]  # type: ignore[union-attr]


@pytest.mark.parametrize(("api_key", "version"), THROTTLED, ids=str)
def test_throttle_time_set_in_every_response_that_has_it(api_key: int, version: int) -> None:
    body = default_body(api_key, version, MessageType.RESPONSE)
    body["throttle_time_ms"] = 7
    frame = response_frame(api_key, version, 31, body)
    result = set_throttle_time(frame, api_key, version, 1500)
    assert result.changed == 1
    got = decode_response(result.frame[4:], api_key, version)
    assert got.header.correlation_id == 31
    assert got.body == {**body, "throttle_time_ms": 1500}
    diff = [i for i, (a, b) in enumerate(zip(frame, result.frame, strict=True)) if a != b]
    assert len(result.frame) == len(frame) and diff and diff[-1] - diff[0] < 4  # one int32, in place


def test_throttle_time_keeps_a_larger_broker_value_and_returns_the_same_object() -> None:
    frame = response_frame(PRODUCE, 9, 1, throttle_time_ms=9000)
    same = set_throttle_time(frame, PRODUCE, 9, 100)
    assert same.changed == 0 and same.frame is frame
    forced = set_throttle_time(frame, PRODUCE, 9, 100, at_least=False)
    assert body_of_response(PRODUCE, 9, forced.frame)["throttle_time_ms"] == 100
    clamped = set_throttle_time(frame, PRODUCE, 9, 2**40)
    assert body_of_response(PRODUCE, 9, clamped.frame)["throttle_time_ms"] == 2**31 - 1


def test_throttle_time_refused_where_the_version_has_none() -> None:
    with pytest.raises(ThrottleTimeError):
        set_throttle_time(response_frame(PRODUCE, 0, 1), PRODUCE, 0, 10)
    with pytest.raises(ThrottleTimeError):
        set_throttle_time(response_frame(API_VERSIONS, 0, 1), API_VERSIONS, 0, 10)


# ---------------------------------------------------------------------------------- metadata


def metadata_frame(version: int) -> bytes:
    brokers = [{"node_id": n, "host": f"b{n}", "port": 9090 + n, "rack": None} for n in (1, 2, 3)]
    partitions = [{"partition_index": p, "leader_id": p + 1, "leader_epoch": 4, "replica_nodes": [1, 2, 3],
                   "isr_nodes": [1, 2, 3], "offline_replicas": []} for p in range(3)]
    topics = [{"name": "orders", "partitions": partitions},
              {"name": "other", "partitions": copy.deepcopy(partitions)}]
    return response_frame(METADATA, version, 5, brokers=brokers, controller_id=3, topics=topics)


@pytest.mark.parametrize("version", versions(METADATA))
def test_hide_broker_removes_it_and_its_leadership(version: int) -> None:
    frame = metadata_frame(version)
    before = body_of_response(METADATA, version, frame)
    result = mutate_metadata(frame, METADATA, version, MetadataEdits(hide_brokers=frozenset({3})))
    after = body_of_response(METADATA, version, result.frame)
    expected = copy.deepcopy(before)
    expected["brokers"] = [b for b in before["brokers"] if b["node_id"] != 3]
    if "controller_id" in expected:
        expected["controller_id"] = -1
    for topic in expected["topics"]:
        for p in topic["partitions"]:
            p["isr_nodes"] = [1, 2]
            if "offline_replicas" in p:
                p["offline_replicas"] = [3]
            if p["leader_id"] == 3:
                p["leader_id"], p["error_code"] = -1, LEADER_NOT_AVAILABLE
    assert after == expected
    assert result.changed == 1 + ("controller_id" in expected) + 6


@pytest.mark.parametrize("version", versions(METADATA))
def test_move_leader_shrink_isr_hide_partition_touch_only_the_selected(version: int) -> None:
    frame = metadata_frame(version)
    before = body_of_response(METADATA, version, frame)
    edits = MetadataEdits(move_leader={("orders", 0): 3}, shrink_isr={("orders", 1): (2,)},
                          hide_partitions=frozenset({("orders", 2)}))
    after = body_of_response(METADATA, version, mutate_metadata(frame, METADATA, version, edits).frame)
    expected = copy.deepcopy(before)
    orders = expected["topics"][0]["partitions"]
    orders[0]["leader_id"] = 3
    if "leader_epoch" in orders[0]:
        orders[0]["leader_epoch"] = 5  # bumped, or clients ignore the move (KIP-320)
    orders[1]["isr_nodes"] = [2]
    # A hidden partition stays listed, leaderless, as a cluster lists one whose leader is gone.
    orders[2]["leader_id"], orders[2]["error_code"] = -1, LEADER_NOT_AVAILABLE
    assert after == expected


@pytest.mark.parametrize("version", versions(METADATA))
def test_hiding_every_broker_keeps_the_answering_one_or_else_the_first_listed(version: int) -> None:
    frame = metadata_frame(version)
    every = MetadataEdits(hide_brokers=frozenset({1, 2, 3}))
    for answering, kept in ((2, 2), (None, 1)):
        after = body_of_response(METADATA, version, mutate_metadata(frame, METADATA, version, every, answering).frame)
        assert [b["node_id"] for b in after["brokers"]] == [kept]
        # What the kept broker leads keeps its leader; the others' partitions are leaderless.
        assert [p["leader_id"] for p in after["topics"][0]["partitions"]] == [
            p + 1 if p + 1 == kept else -1 for p in range(3)]
    # The answering broker is never hidden, though others remain.
    after = body_of_response(METADATA, version, mutate_metadata(
        frame, METADATA, version, MetadataEdits(hide_brokers=frozenset({1, 3})), 3).frame)
    assert [b["node_id"] for b in after["brokers"]] == [2, 3]


@pytest.mark.parametrize("version", versions(DESCRIBE_CLUSTER))
def test_describe_cluster_never_lists_no_broker(version: int) -> None:
    brokers = [{"broker_id": n, "host": f"b{n}", "port": 9090 + n} for n in (1, 2)]
    frame = response_frame(DESCRIBE_CLUSTER, version, 1, brokers=brokers, controller_id=2)
    after = body_of_response(DESCRIBE_CLUSTER, version, mutate_metadata(
        frame, DESCRIBE_CLUSTER, version, MetadataEdits(hide_brokers=frozenset({1, 2}))).frame)
    assert [b["broker_id"] for b in after["brokers"]] == [1] and after["controller_id"] == -1


def test_hidden_leader_moves_to_an_in_sync_replica_when_asked() -> None:
    frame = metadata_frame(12)
    edits = MetadataEdits(hide_brokers=frozenset({3}), hidden_leader=HiddenLeader.MOVE)
    after = body_of_response(METADATA, 12, mutate_metadata(frame, METADATA, 12, edits).frame)
    moved = after["topics"][0]["partitions"][2]
    assert (moved["leader_id"], moved["leader_epoch"], moved["error_code"]) == (1, 5, 0)


def test_topic_wide_selector_and_no_change_returns_the_same_object() -> None:
    frame = metadata_frame(9)
    after = body_of_response(METADATA, 9, mutate_metadata(
        frame, METADATA, 9, MetadataEdits(shrink_isr={("other", None): (1,)})).frame)
    assert [p["isr_nodes"] for p in after["topics"][1]["partitions"]] == [[1]] * 3
    assert [p["isr_nodes"] for p in after["topics"][0]["partitions"]] == [[1, 2, 3]] * 3
    unchanged = mutate_metadata(frame, METADATA, 9, MetadataEdits(hide_brokers=frozenset({42})))
    assert unchanged.frame is frame and unchanged.changed == 0


@pytest.mark.parametrize("version", versions(DESCRIBE_CLUSTER))
def test_describe_cluster_hides_brokers(version: int) -> None:
    brokers = [{"broker_id": n, "host": f"b{n}", "port": 9090 + n} for n in (1, 2)]
    frame = response_frame(DESCRIBE_CLUSTER, version, 1, brokers=brokers, controller_id=2)
    after = body_of_response(DESCRIBE_CLUSTER, version, mutate_metadata(
        frame, DESCRIBE_CLUSTER, version, MetadataEdits(hide_brokers=frozenset({2}))).frame)
    assert [b["broker_id"] for b in after["brokers"]] == [1] and after["controller_id"] == -1


def test_describe_topic_partitions_moves_leaders_and_hides_brokers() -> None:
    parts = [{"partition_index": 0, "leader_id": 1, "leader_epoch": 0, "replica_nodes": [1, 2, 3],
              "isr_nodes": [1, 2, 3], "eligible_leader_replicas": [3], "offline_replicas": []}]
    frame = response_frame(DESCRIBE_TOPIC_PARTITIONS, 0, 1, topics=[{"name": "t", "partitions": parts}])
    after = body_of_response(DESCRIBE_TOPIC_PARTITIONS, 0, mutate_metadata(
        frame, DESCRIBE_TOPIC_PARTITIONS, 0, MetadataEdits(move_leader={("t", 0): 2})).frame)
    assert after["topics"][0]["partitions"][0]["leader_id"] == 2
    hidden = body_of_response(DESCRIBE_TOPIC_PARTITIONS, 0, mutate_metadata(
        frame, DESCRIBE_TOPIC_PARTITIONS, 0, MetadataEdits(hide_brokers=frozenset({3}))).frame)
    p = hidden["topics"][0]["partitions"][0]
    assert (p["isr_nodes"], p["eligible_leader_replicas"], p["offline_replicas"]) == ([1, 2], [], [3])


def test_metadata_mutation_refused_on_other_apis() -> None:
    with pytest.raises(MetadataMutationError):
        mutate_metadata(response_frame(API_VERSIONS, 3, 1), API_VERSIONS, 3, MetadataEdits(hide_brokers=frozenset({1})))


# ------------------------------------------------------------------------------- ApiVersions


def api_versions_frame(version: int, error_code: int = 0) -> bytes:
    keys = [{"api_key": 0, "min_version": 3, "max_version": 11}, {"api_key": 1, "min_version": 4, "max_version": 17},
            {"api_key": 3, "min_version": 0, "max_version": 12}]
    return response_frame(API_VERSIONS, version, 1, error_code=error_code, api_keys=keys)


@pytest.mark.parametrize("version", versions(API_VERSIONS))
def test_downgrade_lowers_only_the_chosen_apis_never_below_min(version: int) -> None:
    frame = api_versions_frame(version)
    before = body_of_response(API_VERSIONS, version, frame)
    result = downgrade_api_versions(frame, version, {0: 7, 1: 0, 60: 0})
    after = body_of_response(API_VERSIONS, version, result.frame)
    expected = copy.deepcopy(before)
    expected["api_keys"][0]["max_version"] = 7
    expected["api_keys"][1]["max_version"] = 4  # its min: an API stays usable
    assert after == expected and result.changed == 2
    assert downgrade_api_versions(frame, version, {3: 20}).frame is frame


def test_downgrade_reads_an_unsupported_version_answer_as_v0() -> None:
    frame = response_frame(API_VERSIONS, 0, 1, error_code=UNSUPPORTED_VERSION,
                           api_keys=[{"api_key": 0, "min_version": 0, "max_version": 11}])
    result = downgrade_api_versions(frame, 3, {0: 5})
    assert body_of_response(API_VERSIONS, 0, result.frame)["api_keys"][0]["max_version"] == 5


def test_downgrade_refuses_a_frame_too_short_for_an_answer() -> None:
    with pytest.raises(ApiVersionsMutationError):
        downgrade_api_versions(b"\0\0\0\4\0\0\0\1", 3, {0: 5})


# ------------------------------------------------------------------------------- error codes


def produce_response(version: int) -> bytes:
    parts = [{"index": p, "error_code": 0, "base_offset": 100 + p} for p in range(3)]
    return response_frame(PRODUCE, version, 8, responses=[{"name": "orders", "partition_responses": parts}])


@pytest.mark.parametrize("version", versions(PRODUCE))
def test_replace_error_codes_in_a_chosen_partition(version: int) -> None:
    frame = produce_response(version)
    before = body_of_response(PRODUCE, version, frame)
    result = replace_error_codes(frame, PRODUCE, version, NOT_LEADER_OR_FOLLOWER, partitions={1}, message="m")
    after = body_of_response(PRODUCE, version, result.frame)
    expected = copy.deepcopy(before)
    failed = expected["responses"][0]["partition_responses"][1]
    failed["error_code"] = NOT_LEADER_OR_FOLLOWER
    if "error_message" in failed:
        failed["error_message"] = "m"
    assert after == expected and result.changed == 1


@pytest.mark.parametrize("version", versions(FETCH, 4))
def test_replace_error_codes_in_fetch_drops_the_records(version: int) -> None:
    batch = encode_batch_v2([Record(0, 1, None, b"v", [])])
    key = {"topic_id": uuid.UUID(int=3)} if version >= 13 else {"topic": "t"}
    parts = [{"partition_index": p, "records": batch, "high_watermark": 1} for p in range(2)]
    frame = response_frame(FETCH, version, 2, responses=[{**key, "partitions": parts}])
    after = body_of_response(FETCH, version, replace_error_codes(frame, FETCH, version, 6, partitions={0}).frame)
    got = after["responses"][0]["partitions"]
    assert (got[0]["error_code"], got[0]["records"]) == (6, b"")
    assert (got[1]["error_code"], got[1]["records"]) == (0, batch)


def test_replace_error_codes_refused_without_a_matching_code() -> None:
    with pytest.raises(ErrorCodeMutationError):
        replace_error_codes(produce_response(9), PRODUCE, 9, 6, partitions={42})


# ----------------------------------------------------------------------------- field rewrite


def produce_request(version: int, records: bytes | None = None, topics: tuple[str, ...] = ("orders",),
                    acks: int = -1) -> bytes:
    data = []
    for i, name in enumerate(topics):
        key = {"topic_id": uuid.UUID(int=i + 1)} if version >= 13 else {"name": name}
        data.append({**key, "partition_data": [{"index": p, "records": records} for p in range(2)]})
    return request_frame(PRODUCE, version, 77, acks=acks, timeout_ms=3000, topic_data=data)


@pytest.mark.parametrize("version", versions(PRODUCE))
def test_rewrite_acks_in_every_produce_version(version: int) -> None:
    frame = produce_request(version, encode_batch_v2([Record(0, 5, b"k", b"v", [])]))
    before = decode_request(frame[4:])
    result = rewrite_fields(frame, PRODUCE, version, MessageType.REQUEST, [FieldEdit("acks", value=1)])
    after = decode_request(result.frame[4:])
    assert after.header == before.header and after.body == {**before.body, "acks": 1} and result.changed == 1
    # acks is an int16: only its two bytes may differ.
    diff = [i for i, (a, b) in enumerate(zip(frame, result.frame, strict=True)) if a != b]
    assert len(result.frame) == len(frame) and 1 <= len(diff) <= 2 and diff[-1] - diff[0] <= 1


@pytest.mark.parametrize("version", versions(PRODUCE, 0)[:13])
def test_rewrite_maps_topic_prefixes_and_client_id(version: int) -> None:
    frame = produce_request(version, None, topics=("orders-a", "audit"))
    result = rename_topics(frame, PRODUCE, version, MessageType.REQUEST, [("orders-", "staging-orders-")])
    after = decode_request(result.frame[4:])
    assert [t["name"] for t in after.body["topic_data"]] == ["staging-orders-a", "audit"]
    renamed = rewrite_fields(result.frame, PRODUCE, version, MessageType.REQUEST,
                             [FieldEdit("client_id", values={"kproxy-test": "batch-7"}),
                              FieldEdit("topic_data[].partition_data[].index", values={1: 9})])
    again = decode_request(renamed.frame[4:])
    assert again.header.client_id == "batch-7" and again.header.correlation_id == 77
    assert [p["index"] for p in again.body["topic_data"][1]["partition_data"]] == [0, 9]
    assert renamed.changed == 3


@pytest.mark.parametrize("version", versions(DESCRIBE_CONFIGS))
def test_rewrite_a_config_value_in_a_response(version: int) -> None:
    configs = [{"name": "retention.ms", "value": "1000"}, {"name": "cleanup.policy", "value": "delete"}]
    frame = response_frame(DESCRIBE_CONFIGS, version, 3, results=[{"resource_name": "t", "configs": configs}])
    before = body_of_response(DESCRIBE_CONFIGS, version, frame)
    result = rewrite_fields(frame, DESCRIBE_CONFIGS, version, MessageType.RESPONSE,
                            [FieldEdit("results[].configs[].value", values={"delete": "compact"})])
    after = body_of_response(DESCRIBE_CONFIGS, version, result.frame)
    expected = copy.deepcopy(before)
    expected["results"][0]["configs"][1]["value"] = "compact"
    assert after == expected and result.changed == 1


def test_rewrite_keeps_bytes_after_a_request_body() -> None:
    """librdkafka sends some requests with bytes after the body (Metadata v12 with 3): kept as they were."""
    plain = request_frame(METADATA, 12, 4, topics=[{"name": "orders"}])
    frame = struct.pack(">i", len(plain) - 1) + plain[4:] + b"\1\2\3"
    result = rewrite_fields(frame, METADATA, 12, MessageType.REQUEST, [FieldEdit("topics[].name", value="x")])
    assert result.frame.endswith(b"\1\2\3")
    assert struct.unpack_from(">i", result.frame)[0] == len(result.frame) - 4
    renamed = rename_topics(frame, METADATA, 12, MessageType.REQUEST, [("ord", "ORD")])
    assert renamed.frame.endswith(b"\1\2\3") and b"ORDers" in renamed.frame


@pytest.mark.parametrize(("edit", "reason"), [
    (FieldEdit("acks", value="all"), "not an integer"),
    (FieldEdit("acks", value=70000), "outside"),
    (FieldEdit("topic_data[].nme", value="x"), "no field"),
    (FieldEdit("topic_data", value="x"), "no field"),
    (FieldEdit("topic_data[]", value="x"), "struct"),
])
def test_rewrite_refuses_bad_paths_and_values(edit: FieldEdit, reason: str) -> None:
    with pytest.raises(FieldRewriteError, match=reason):
        rewrite_fields(produce_request(9), PRODUCE, 9, MessageType.REQUEST, [edit])


@settings(max_examples=60, deadline=None)
@given(names=st.lists(st.text(st.sampled_from("abc-._"), min_size=1, max_size=8), min_size=1, max_size=4),
       old=st.text(st.sampled_from("abc-"), min_size=1, max_size=3), new=st.text(st.sampled_from("xyz"), max_size=4))
def test_rename_topics_is_exactly_the_prefix_map(names: list[str], old: str, new: str) -> None:
    frame = produce_request(9, None, topics=tuple(names))
    result = rename_topics(frame, PRODUCE, 9, MessageType.REQUEST, [(old, new)])
    got = [t["name"] for t in decode_request(result.frame[4:]).body["topic_data"]]
    assert got == [new + n[len(old):] if n.startswith(old) else n for n in names]
    assert result.changed == sum(1 for n in names if n.startswith(old) and old != new)
    if not result.changed:
        assert result.frame is frame


# ---------------------------------------------------------------------------------- endpoints


@pytest.mark.parametrize("version", versions(METADATA))
def test_rewrite_endpoints_by_map(version: int) -> None:
    frame = metadata_frame(version)
    table = {("b2", 9092): ("elsewhere", 19092)}
    result = rewrite_endpoints(frame, METADATA, version, lambda h, p: table.get((h, p)))
    before, after = body_of_response(METADATA, version, frame), body_of_response(METADATA, version, result.frame)
    expected = copy.deepcopy(before)
    expected["brokers"][1].update(host="elsewhere", port=19092)
    assert after == expected and result.changed == 1


def test_rewrite_endpoints_top_level_and_refusal() -> None:
    frame = response_frame(10, 2, 1, node_id=1, host="b1", port=9091)
    after = body_of_response(10, 2, rewrite_endpoints(frame, 10, 2, lambda h, p: ("x", p + 1)).frame)
    assert (after["host"], after["port"]) == ("x", 9092)
    with pytest.raises(EndpointRewriteError):
        rewrite_endpoints(response_frame(API_VERSIONS, 3, 1), API_VERSIONS, 3, lambda h, p: None)


# ------------------------------------------------------------------------------------ records

SAMPLE = [Record(10 + i, 1_700_000_000_000 + i, None if i == 1 else b"key-%d" % i,
                 b"\x00\x00\x00\x00\x2a" + b"payload-%d" % i if i % 2 == 0 else b"plain-%d" % i,
                 [("trace", b"t%d" % i)] if i else []) for i in range(4)]


def fetch_response(version: int, records: bytes) -> bytes:
    key = {"topic_id": uuid.UUID(int=1)} if version >= 13 else {"topic": "orders"}
    parts = [{"partition_index": p, "records": records, "high_watermark": 14} for p in range(2)]
    return response_frame(FETCH, version, 12, responses=[{**key, "partitions": parts}])


def records_of(api_key: int, version: int, frame: bytes) -> list[bytes]:
    if api_key == PRODUCE:
        body = decode_request(frame[4:]).body
        return [p["records"] for t in body["topic_data"] for p in t["partition_data"]]
    body = body_of_response(FETCH, version, frame)
    return [p["records"] for t in body["responses"] for p in t["partitions"]]


def record_frames(codec: int = Codec.NONE) -> list[tuple[int, int, bytes, bytes]]:
    batch = encode_batch_v2(SAMPLE, base_offset=10, codec=codec, producer_id=9, producer_epoch=1, base_sequence=0)
    out = [(PRODUCE, v, produce_request(v, batch), batch) for v in versions(PRODUCE, 3)]
    out += [(FETCH, v, fetch_response(v, batch), batch) for v in versions(FETCH, 4)]
    return out


def crc_ok(records: bytes) -> bool:
    try:
        for batch in iter_batches(records):
            verify_crc(batch)
    except CorruptRecordsError:
        return False
    return True


def kafka_python_crc_ok(records: bytes) -> bool:
    reader = MemoryRecords(records)
    ok = True
    while reader.has_next():
        ok = reader.next_batch().validate_crc() and ok
    return ok


@pytest.mark.parametrize(("api_key", "version", "frame", "batch"), record_frames(), ids=lambda x: str(x)[:12])
def test_corrupt_crc_fails_both_decoders_and_changes_nothing_else(api_key: int, version: int, frame: bytes,
                                                                 batch: bytes) -> None:
    result = corrupt_records(frame, api_key, version, CorruptTarget.CRC)
    assert result.changed == 2 and len(result.frame) == len(frame)
    for records in records_of(api_key, version, result.frame):
        assert not crc_ok(records) and not kafka_python_crc_ok(records)
        assert len(records) == len(batch) and sum(a != b for a, b in zip(records, batch, strict=True)) == 1
    assert crc_ok(batch) and kafka_python_crc_ok(batch)


@pytest.mark.usefixtures("kafka_codecs")
@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: Codec(c).name)
@pytest.mark.parametrize("target", [t for t in CorruptTarget if t is not CorruptTarget.CRC], ids=lambda t: t.value)
def test_field_corruption_keeps_the_crc_valid_and_flips_only_that_field(codec: int, target: CorruptTarget) -> None:
    for api_key, version, frame, _ in record_frames(codec)[::4]:
        result = corrupt_records(frame, api_key, version, target)
        for records in records_of(api_key, version, result.frame):
            assert crc_ok(records) and kafka_python_crc_ok(records)
            (batch,) = iter_batches(records)
            assert batch.codec == codec and batch.producer_id == 9 and batch.record_count == 4
            got = decode_all(records)
            for old, new in zip(SAMPLE, got, strict=True):
                flip = {CorruptTarget.KEY: "key", CorruptTarget.VALUE: "value"}.get(target)
                expected = old
                if flip and getattr(old, flip):
                    raw = getattr(old, flip)
                    expected = Record(old.offset, old.timestamp, **{**_kv(old), flip: bytes([raw[0] ^ 0xFF]) + raw[1:]},
                                      headers=old.headers)
                if target is CorruptTarget.HEADERS:
                    expected = Record(old.offset, old.timestamp, old.key, old.value,
                                      [(k, bytes([v[0] ^ 0xFF]) + v[1:]) for k, v in old.headers])  # type: ignore[index]
                if target is CorruptTarget.TIMESTAMP:
                    expected = Record(old.offset, old.timestamp - 365 * 24 * 3600 * 1000, old.key, old.value,
                                      old.headers)
                assert new == expected


def _kv(r: Record) -> dict[str, bytes | None]:
    return {"key": r.key, "value": r.value}


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD], ids=lambda c: Codec(c).name)
def test_duplicated_batches_decode_with_the_right_counts(codec: int) -> None:
    for api_key, version, frame, batch in record_frames(codec):
        result = duplicate_records(frame, api_key, version, copies=2)
        assert result.changed == 2
        for records in records_of(api_key, version, result.frame):
            assert records == batch * 3 and count_records(records) == 12
            assert decode_all(records) == SAMPLE * 3


def test_schema_ids_replaced_only_in_wire_format_values() -> None:
    for api_key, version, frame, _ in record_frames(Codec.GZIP):
        result = replace_schema_ids(frame, api_key, version, 999999)
        assert result.changed == 4  # two wire-format values in each of two partitions
        for records in records_of(api_key, version, result.frame):
            got = decode_all(records)
            for old, new in zip(SAMPLE, got, strict=True):
                if old.value is not None and old.value[0] == 0:
                    assert new.value == b"\0" + (999999).to_bytes(4, "big") + old.value[5:]
                else:
                    assert new == old


def test_selector_limits_records_faults_to_chosen_partitions() -> None:
    _, version, frame, batch = record_frames()[0]
    result = corrupt_records(frame, PRODUCE, version, CorruptTarget.CRC, only=lambda t, p: (t, p) == ("orders", 1))
    first, second = records_of(PRODUCE, version, result.frame)
    assert first == batch and not crc_ok(second)


def test_legacy_message_sets_crc_and_duplicates() -> None:
    legacy = encode_message_set([Record(0, 5, b"k", b"v", []), Record(1, 6, None, b"w", [])], magic=1)
    frame = produce_request(2, legacy)
    broken = records_of(PRODUCE, 2, corrupt_records(frame, PRODUCE, 2).frame)[0]
    assert not crc_ok(broken) and not kafka_python_crc_ok(broken)
    doubled = records_of(PRODUCE, 2, duplicate_records(frame, PRODUCE, 2).frame)[0]
    entries = [bytes(b.raw) for b in iter_batches(legacy)]  # one entry per uncompressed legacy message
    assert doubled == b"".join(e * 2 for e in entries) and count_records(doubled) == 4
    assert corrupt_records(frame, PRODUCE, 2, CorruptTarget.HEADERS).frame is frame  # legacy has no headers


@pytest.mark.usefixtures("kafka_codecs")
@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4], ids=lambda c: Codec(c).name)
def test_legacy_field_corruption_keeps_every_crc_valid(magic: int, codec: int) -> None:
    sample = [Record(0, 5, b"k", b"\0\0\0\0\1v", []), Record(1, 6, None, b"w", []), Record(2, 7, b"", None, [])]
    legacy = encode_message_set(sample, magic=magic, codec=codec)
    frame = produce_request(2, legacy)
    for target, expected in [
        (CorruptTarget.VALUE, [b"\xff\0\0\0\1v", b"\x88", None]),
        (CorruptTarget.KEY, [r.value for r in sample]),
    ]:
        result = corrupt_records(frame, PRODUCE, 2, target)
        (records, _) = records_of(PRODUCE, 2, result.frame)
        assert kafka_python_crc_ok(records)
        got = decode_all(records)  # checks the inner messages' CRCs of a compressed wrapper too
        assert [r.value for r in got] == expected
        assert [r.key for r in got] == ([b"\x94", None, b""] if target is CorruptTarget.KEY else [b"k", None, b""])
        assert [r.offset for r in got] == [0, 1, 2]
    shifted = corrupt_records(frame, PRODUCE, 2, CorruptTarget.TIMESTAMP)
    if magic == 0:
        assert shifted.frame is frame  # magic 0 has no timestamps
    else:
        got = decode_all(records_of(PRODUCE, 2, shifted.frame)[0])
        assert [r.timestamp for r in got] == [t - 365 * 24 * 3600 * 1000 for t in (5, 6, 7)]
    ids = replace_schema_ids(frame, PRODUCE, 2, 258)
    assert decode_all(records_of(PRODUCE, 2, ids.frame)[0])[0].value == b"\0\0\0\1\2v"


def test_truncated_fetch_tail_is_kept_and_empty_records_untouched() -> None:
    batch = encode_batch_v2(SAMPLE, base_offset=10)
    frame = fetch_response(12, batch + batch[:30])
    (records, _) = records_of(FETCH, 12, duplicate_records(frame, FETCH, 12).frame)
    assert records == batch + batch + batch[:30]
    empty = fetch_response(12, b"")
    assert corrupt_records(empty, FETCH, 12).frame is empty


def test_records_faults_refused_elsewhere_and_on_garbage() -> None:
    with pytest.raises(RecordsMutationError):
        corrupt_records(metadata_frame(9), METADATA, 9)
    garbage = produce_request(9, b"\0" * 8 + struct.pack(">i", 3) + b"\0" * 20)
    with pytest.raises(RecordsMutationError):
        duplicate_records(garbage, PRODUCE, 9)


def test_body_offset_needs_a_consistent_size_prefix() -> None:
    """What the frame transformations ask for (whole=True): a frame cut short, or with the next
    frame's bytes after it, is refused rather than edited and re-framed."""
    frame = produce_response(9)
    assert response_body_offset(frame, PRODUCE, 9, whole=True) == response_body_offset(frame, PRODUCE, 9)
    for bad in (frame[:-1], frame + frame[:6], frame[:3], struct.pack(">i", 2) + b"\0\0"):
        with pytest.raises(ProtocolError):
            response_body_offset(bad, PRODUCE, 9, whole=True)
    with pytest.raises(ProtocolError):  # a mutation on a frame with trailing bytes
        replace_error_codes(frame + frame[:6], PRODUCE, 9, NOT_LEADER_OR_FOLLOWER)


_bytes_or_none = st.none() | st.binary(max_size=12)
_records = st.lists(st.tuples(_bytes_or_none, _bytes_or_none,
                              st.lists(st.tuples(st.text(max_size=4), _bytes_or_none), max_size=2)),
                    min_size=1, max_size=6)


@settings(max_examples=80, deadline=None)
@given(rows=_records, codec=st.sampled_from([Codec.NONE, Codec.GZIP, Codec.ZSTD]),
       target=st.sampled_from(list(CorruptTarget)), version=st.sampled_from(versions(PRODUCE, 3)),
       schema_id=st.integers(-(2**31), 2**31 - 1))
def test_record_faults_on_random_batches(rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
                                         codec: int, target: CorruptTarget, version: int, schema_id: int) -> None:
    sample = [Record(i, 1_000 + i, k, v, h) for i, (k, v, h) in enumerate(rows)]
    batch = encode_batch_v2(sample, codec=codec)
    frame = produce_request(version, batch)
    result = corrupt_records(frame, PRODUCE, version, target)
    for records in records_of(PRODUCE, version, result.frame):
        if target is CorruptTarget.CRC:
            assert not crc_ok(records) and len(records) == len(batch)
            if codec != Codec.ZSTD:
                assert not kafka_python_crc_ok(records)
            continue
        assert crc_ok(records)
        if codec != Codec.ZSTD:
            assert kafka_python_crc_ok(records)
        got = decode_all(records)
        assert len(got) == len(sample)
        for old, new in zip(sample, got, strict=True):
            assert new.offset == old.offset
            if target is CorruptTarget.TIMESTAMP:
                assert new.timestamp == old.timestamp - 365 * 24 * 3600 * 1000
                assert (new.key, new.value, new.headers) == (old.key, old.value, old.headers)
                continue
            assert new.timestamp == old.timestamp
            flip = {CorruptTarget.KEY: "key", CorruptTarget.VALUE: "value"}.get(target)
            for name in ("key", "value"):
                before, after = getattr(old, name), getattr(new, name)
                if name == flip and before:
                    assert after == bytes([before[0] ^ 0xFF]) + before[1:]
                else:
                    assert after == before
            if target is CorruptTarget.HEADERS:
                assert new.headers == [(k, bytes([v[0] ^ 0xFF]) + v[1:] if v else v) for k, v in old.headers]
            else:
                assert new.headers == old.headers
    if target is not CorruptTarget.CRC and result.changed == 0:
        assert result.frame is frame
    ids = replace_schema_ids(frame, PRODUCE, version, schema_id)
    wire = [r for r in sample if r.value is not None and len(r.value) >= 5 and r.value[0] == 0
            and r.value[1:5] != schema_id.to_bytes(4, "big", signed=True)]
    assert ids.changed == 2 * len(wire)
    for records in records_of(PRODUCE, version, ids.frame):
        for old, new in zip(sample, decode_all(records), strict=True):
            if old.value is not None and len(old.value) >= 5 and old.value[0] == 0:
                assert new.value == b"\0" + schema_id.to_bytes(4, "big", signed=True) + old.value[5:]
            else:
                assert new == old


@settings(max_examples=300, deadline=None)
@given(junk=st.binary(max_size=120), count=st.integers(-1, 6), codec=st.sampled_from([Codec.NONE, Codec.GZIP]),
       framing=st.sampled_from(["v2", "legacy", "none"]), target=st.sampled_from(list(CorruptTarget)))
def test_hostile_record_bytes_raise_only_protocol_errors(junk: bytes, count: int, codec: int, framing: str,
                                                        target: CorruptTarget) -> None:
    """A v2 batch header or a legacy message prefix that frames arbitrary bytes (a valid length, any
    count or codec, any payload), or bare junk."""
    if framing == "v2":
        header = bytearray(encode_batch_v2([], codec=codec))
        struct.pack_into(">i", header, 8, 49 + len(junk))
        struct.pack_into(">i", header, 57, count)
    elif framing == "legacy":  # offset, size, crc, magic 1, attributes, timestamp: then junk as key/value
        header = bytearray(struct.pack(">qiIbbq", 0, 14 + len(junk), 0, 1, codec, 5))
    else:
        header = bytearray()
    frame = produce_request(2 if framing == "legacy" else 9, bytes(header) + junk)
    version = 2 if framing == "legacy" else 9
    for run in (lambda: corrupt_records(frame, PRODUCE, version, target),
                lambda: duplicate_records(frame, PRODUCE, version),
                lambda: replace_schema_ids(frame, PRODUCE, version, 1)):
        try:
            result = run()
        except ProtocolError:
            continue
        records_of(PRODUCE, version, result.frame)  # whatever came back still decodes as a Produce request


ANSWERABLE = [(k, v) for k, v, d in all_message_kinds() if d is MessageType.REQUEST
              and message_schema(k, v, MessageType.RESPONSE) is not None]


@pytest.mark.parametrize(("api_key", "version"), ANSWERABLE, ids=str)
def test_replace_error_codes_in_every_known_response(api_key: int, version: int) -> None:
    """A broker's answer (here: one naming every topic and partition of a default request, all codes NONE)
    has every error code replaced, and nothing else changed."""
    request = request_frame(api_key, version, 5, default_body(api_key, version, MessageType.REQUEST))
    answer = error_response(request, 0)
    before = body_of_response(api_key, version, answer)
    codes = list(scan_body(api_key, version, MessageType.RESPONSE, answer, response_body_offset(
        answer, api_key, version)).error_codes())
    if not codes:
        with pytest.raises(ErrorCodeMutationError):
            replace_error_codes(answer, api_key, version, NOT_LEADER_OR_FOLLOWER)
        return
    result = replace_error_codes(answer, api_key, version, NOT_LEADER_OR_FOLLOWER, message="injected")
    after = body_of_response(api_key, version, result.frame)
    assert decode_response(result.frame[4:], api_key, version).header.correlation_id == 5
    assert set(scan_body(api_key, version, MessageType.RESPONSE, result.frame, response_body_offset(
        result.frame, api_key, version)).error_codes()) == {NOT_LEADER_OR_FOLLOWER}
    assert _without(after) == _without(before)


def _without(value: Any) -> Any:
    """A body with its error codes and messages blanked (what a replacement may change)."""
    if isinstance(value, list):
        return [_without(v) for v in value]
    if isinstance(value, dict):
        return {k: None if k in ("error_message", *ERROR_CODE_FIELDS) else _without(v) for k, v in value.items()}
    return value
