"""Leader epoch floors on frames (kproxy.protocol.leader_epochs): every answer that carries a current
leader's epoch keeps at least the epoch kproxy advertised, until the broker's own reaches it; requests
carrying an epoch only kproxy advertised reach the broker with the broker's own."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from kproxy.protocol import decode_request, decode_response
from kproxy.protocol.codes import ApiKey
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.headers import request_body_offset
from kproxy.protocol.leader_epochs import (
    NEEDLES_CAP,
    LeaderEpochFloors,
    broker_epochs,
    floor_leader_epochs,
    unfloor_request_epochs,
)
from kproxy.protocol.message_schemas import supported_versions

PRODUCE, FETCH, LIST_OFFSETS, METADATA = ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.METADATA
OFFSET_FOR_LEADER_EPOCH, DESCRIBE_TOPIC_PARTITIONS = ApiKey.OFFSET_FOR_LEADER_EPOCH, ApiKey.DESCRIBE_TOPIC_PARTITIONS
SHARE_FETCH, SHARE_ACKNOWLEDGE = ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE
NOT_LEADER_OR_FOLLOWER = 6
TOPIC_ID = uuid.UUID("3f1d2c4b-0000-4000-8000-000000000001")


def versions(api_key: int, first: int = 0) -> list[int]:
    lo, hi = supported_versions(api_key) or (0, -1)
    return list(range(max(lo, first), hi + 1))


def body(api_key: int, version: int, frame: bytes) -> dict[str, Any]:
    return decode_response(frame[4:], api_key, version).body


def request_body(api_key: int, version: int, frame: bytes) -> dict[str, Any]:
    return decode_request(frame[4:]).body


def raised_floors(epoch: int = 5, topic: str = "orders", partition: int = 0, leader: int = 2) -> LeaderEpochFloors:
    """Floors as a move_leader of ``topic``/``partition`` to ``leader`` at ``epoch`` leaves them."""
    floors = LeaderEpochFloors()
    floors.raised(topic, TOPIC_ID, partition, epoch, leader=leader)
    return floors


# -- answers --------------------------------------------------------------------------------------
def metadata(version: int, epoch: int = 0) -> bytes:
    partitions = [{"partition_index": p, "leader_id": 1, "leader_epoch": epoch, "replica_nodes": [1],
                   "isr_nodes": [1], "offline_replicas": []} for p in range(2)]
    return response_frame(METADATA, version, 7, brokers=[{"node_id": 1, "host": "b1", "port": 9092}],
                          topics=[{"name": "orders", "topic_id": TOPIC_ID, "partitions": partitions},
                                  {"name": "other", "topic_id": uuid.uuid4(), "partitions": partitions}])


def epochs_of(value: dict[str, Any], topics: str = "topics") -> dict[tuple[str, int], int]:
    out = {}
    for t in value[topics]:
        for p in t.get("partitions", t.get("partition_responses")):
            index = p.get("partition_index", p.get("index"))
            holder = p.get("current_leader", p)
            out[t.get("name", t.get("topic")) or str(t.get("topic_id")), index] = holder["leader_epoch"]
    return out


@pytest.mark.parametrize("version", versions(METADATA, 7))
def test_metadata_keeps_the_floor_of_the_raised_partition_only(version: int) -> None:
    floors = raised_floors(5)
    frame = metadata(version)
    result = floor_leader_epochs(frame, METADATA, version, floors)
    assert result.changed == 1
    assert epochs_of(body(METADATA, version, result.frame)) == {
        ("orders", 0): 5, ("orders", 1): 0, ("other", 0): 0, ("other", 1): 0}
    assert body(METADATA, version, result.frame)["brokers"] == body(METADATA, version, frame)["brokers"]


@pytest.mark.parametrize("version", versions(METADATA, 0)[:7])
def test_metadata_before_v7_has_no_epoch_and_comes_back_as_is(version: int) -> None:
    frame = metadata(version)
    assert floor_leader_epochs(frame, METADATA, version, raised_floors()).frame is frame


def test_the_floor_is_forgotten_once_the_broker_reaches_it_or_passes_it() -> None:
    for broker in (5, 6):
        floors = raised_floors(5)
        assert floor_leader_epochs(metadata(12, 4), METADATA, 12, floors).changed == 1
        assert len(floors)
        frame = metadata(12, broker)
        result = floor_leader_epochs(frame, METADATA, 12, floors)
        assert result.frame is frame, "the broker's own epoch goes to the client as it is"
        assert not floors, "forgotten (by name and by id)"
        assert floor_leader_epochs(metadata(12, 0), METADATA, 12, floors).changed == 0


def test_a_topic_created_again_under_its_name_does_not_inherit_the_floor() -> None:
    floors = raised_floors(5)
    again = metadata(12, 0).replace(TOPIC_ID.bytes, uuid.uuid4().bytes)
    assert floor_leader_epochs(again, METADATA, 12, floors).frame is again
    assert not floors
    floors = raised_floors(5)
    floors.raised("orders", uuid.uuid4(), 0, 1)  # a rule raising the new topic's epoch: its own floor
    assert floors.floor("orders", 0).epoch == 1 and floors.floor(TOPIC_ID, 0) is None  # type: ignore[union-attr]


def test_a_raise_is_remembered_and_never_lowered_by_a_lower_raise() -> None:
    floors = LeaderEpochFloors()
    frame = metadata(12, 3)
    # What a rule's move_leader hands the policy: the broker's own epochs of the partitions it moves
    # (read before the rule raised them); an epoch above it in this answer is kproxy's.
    assert floor_leader_epochs(frame, METADATA, 12, floors, raised={("orders", 1): 2, ("orders", 0): 3}).frame is frame
    assert floors.floor("orders", 0) is None, "its epoch is the broker's own: nothing raised, nothing kept"
    floor = floors.floor("orders", 1)
    assert floor is not None and (floor.epoch, floor.broker) == (3, 2)
    assert floors.floor(TOPIC_ID, 1) is floors.floor("orders", 1), "found by topic id too"
    floors.raised("orders", None, 1, 9)
    floors.raised("orders", None, 1, 4)
    assert floors.floor("orders", 1).epoch == 9  # type: ignore[union-attr]
    assert epochs_of(body(METADATA, 12, floor_leader_epochs(frame, METADATA, 12, floors).frame))[("orders", 1)] == 9


def test_the_same_answer_again_gets_the_same_epochs_without_a_decode_until_a_floor_changes() -> None:
    floors = raised_floors(5)
    answer = metadata(12)
    first = floor_leader_epochs(answer, METADATA, 12, floors)
    again = answer[:4] + (99).to_bytes(4, "big") + answer[8:]  # another correlation id
    second = floor_leader_epochs(again, METADATA, 12, floors)
    assert second.changed == first.changed == 1
    assert second.frame[8:] == first.frame[8:] and second.frame[4:8] == (99).to_bytes(4, "big")
    floors.raised("orders", TOPIC_ID, 1, 3, leader=1)  # a floor changed: worked out again
    assert epochs_of(body(METADATA, 12, floor_leader_epochs(again, METADATA, 12, floors).frame))[("orders", 1)] == 3
    unchanged = metadata(12, 9)  # the broker passed every floor: forgotten, and the answer goes as it is
    assert floor_leader_epochs(unchanged, METADATA, 12, floors).frame is unchanged and not floors


def test_an_unknown_epoch_is_never_raised() -> None:
    floors = raised_floors(5)
    frame = metadata(12, -1)
    assert floor_leader_epochs(frame, METADATA, 12, floors).frame is frame
    assert len(floors) == 2, "kept: -1 says nothing of the broker's epoch"


def test_broker_epochs_reads_the_named_partitions_only() -> None:
    assert broker_epochs(metadata(12, 4), METADATA, 12, {("orders", 1), ("nope", 0)}) == {("orders", 1): 4}
    assert broker_epochs(metadata(12, -1), METADATA, 12, {("orders", 1)}) == {}
    assert broker_epochs(metadata(6, 4), METADATA, 6, {("orders", 1)}) == {}


def test_a_frame_not_naming_a_floored_topic_is_not_decoded() -> None:
    floors = LeaderEpochFloors()
    floors.raised("payments", uuid.uuid4(), 0, 5)
    assert not floors.named_in(metadata(12)) and floors.named_in(b"..payments..")
    junk = b"\x00\x00\x00\x04junk"  # would not decode
    assert floor_leader_epochs(junk, METADATA, 12, floors).frame is junk
    floors.raised(None, TOPIC_ID, 0, 5)
    assert floors.named_in(fetch_request(16, 5)), "a topic id is searched for as its 16 bytes"
    many = LeaderEpochFloors()
    for t in range(NEEDLES_CAP + 1):
        many.raised(f"t{t}", None, 0, 1)
    assert many.named_in(b""), "past the cap it cannot tell"


def test_nothing_remembered_means_the_same_object_without_decoding() -> None:
    frame = b"\x00\x00\x00\x04junk"  # would not decode
    assert floor_leader_epochs(frame, METADATA, 12, LeaderEpochFloors()).frame is frame


def test_describe_topic_partitions_is_floored() -> None:
    partitions = [{"partition_index": 0, "leader_id": 1, "leader_epoch": 1, "replica_nodes": [1], "isr_nodes": [1],
                   "eligible_leader_replicas": [], "last_known_elr": [], "offline_replicas": []}]
    frame = response_frame(DESCRIBE_TOPIC_PARTITIONS, 0, 3, topics=[
        {"name": "orders", "topic_id": TOPIC_ID, "partitions": partitions}])
    result = floor_leader_epochs(frame, DESCRIBE_TOPIC_PARTITIONS, 0, raised_floors(5))
    assert epochs_of(body(DESCRIBE_TOPIC_PARTITIONS, 0, result.frame)) == {("orders", 0): 5}


def current_leader(epoch: int) -> dict[str, Any]:
    return {"error_code": NOT_LEADER_OR_FOLLOWER, "current_leader": {"leader_id": 2, "leader_epoch": epoch}}


@pytest.mark.parametrize("version", versions(PRODUCE, 10))
def test_produce_current_leader_is_floored(version: int) -> None:
    frame = response_frame(PRODUCE, version, 3, responses=[
        {"name": "orders", "topic_id": TOPIC_ID,  # by name up to v12, by id from v13
         "partition_responses": [{"index": 0, **current_leader(2)}, {"index": 1, "error_code": 0}]}])
    result = floor_leader_epochs(frame, PRODUCE, version, raised_floors(5))
    [topic] = body(PRODUCE, version, result.frame)["responses"]
    assert topic["partition_responses"][0]["current_leader"] == {"leader_id": 2, "leader_epoch": 5}
    assert "current_leader" not in topic["partition_responses"][1] or \
        topic["partition_responses"][1]["current_leader"]["leader_epoch"] == -1


@pytest.mark.parametrize("version", versions(FETCH, 12))
def test_fetch_current_leader_is_floored_by_name_or_by_topic_id(version: int) -> None:
    topic = {"topic": "orders", "topic_id": TOPIC_ID}
    frame = response_frame(FETCH, version, 3, responses=[
        {**topic, "partitions": [{"partition_index": 0, "records": None, **current_leader(2)}]}])
    result = floor_leader_epochs(frame, FETCH, version, raised_floors(5))
    [answer] = body(FETCH, version, result.frame)["responses"]
    assert answer["partitions"][0]["current_leader"]["leader_epoch"] == 5


def test_a_fetch_answer_without_an_error_on_a_floored_partition_is_not_decoded() -> None:
    records = b"\x00" * 64
    frame = response_frame(FETCH, 16, 3, responses=[{"topic_id": TOPIC_ID, "partitions": [
        {"partition_index": 0, "records": records},
        {"partition_index": 1, **current_leader(2)}]}])  # an error, with a current leader, elsewhere
    assert floor_leader_epochs(frame, FETCH, 16, raised_floors(5)).frame is frame


def test_a_hint_naming_another_leader_than_advertised_keeps_the_brokers_epoch() -> None:
    # While move_leader sends clients to node 2, node 2's NOT_LEADER_OR_FOLLOWER names the broker's
    # leader (1) at its own epoch: raised, it would win over the rule; as is, the client ignores it.
    floors = raised_floors(5, leader=2)
    frame = response_frame(PRODUCE, 10, 3, responses=[{"name": "orders", "partition_responses": [
        {"index": 0, "error_code": NOT_LEADER_OR_FOLLOWER, "current_leader": {"leader_id": 1, "leader_epoch": 2}}]}])
    assert floor_leader_epochs(frame, PRODUCE, 10, floors).frame is frame
    # Once the rule ends, metadata advertises the broker's leader at the floor: its hints follow.
    floor_leader_epochs(metadata(12, 2), METADATA, 12, floors)
    result = floor_leader_epochs(frame, PRODUCE, 10, floors)
    [topic] = body(PRODUCE, 10, result.frame)["responses"]
    assert topic["partition_responses"][0]["current_leader"] == {"leader_id": 1, "leader_epoch": 5}


@pytest.mark.parametrize("api_key", [SHARE_FETCH, SHARE_ACKNOWLEDGE])
def test_share_answers_current_leader_is_floored(api_key: int) -> None:
    frame = response_frame(api_key, 0, 3, responses=[
        {"topic_id": TOPIC_ID, "partitions": [{"partition_index": 0, **current_leader(2)}]}])
    result = floor_leader_epochs(frame, api_key, 0, raised_floors(5))
    assert body(api_key, 0, result.frame)["responses"][0]["partitions"][0]["current_leader"]["leader_epoch"] == 5


def test_epochs_of_the_log_are_left_as_the_broker_wrote_them() -> None:
    # ListOffsets' epoch is the returned offset's, OffsetForLeaderEpoch's the epoch whose end offset it
    # answers: a client checks them against the broker's log, where a raised epoch reads as truncation.
    floors = raised_floors(5)
    lo = response_frame(LIST_OFFSETS, 7, 3, topics=[
        {"name": "orders", "partitions": [{"partition_index": 0, "offset": 10, "leader_epoch": 0}]}])
    ofle = response_frame(OFFSET_FOR_LEADER_EPOCH, 4, 3, topics=[
        {"topic": "orders", "partitions": [{"partition": 0, "leader_epoch": 0, "end_offset": 10}]}])
    assert floor_leader_epochs(lo, LIST_OFFSETS, 7, floors).frame is lo
    assert floor_leader_epochs(ofle, OFFSET_FOR_LEADER_EPOCH, 4, floors).frame is ofle


def test_the_table_is_bounded_and_forgets_the_oldest_raise() -> None:
    floors = LeaderEpochFloors(cap=4)
    for p in range(3):
        floors.raised(f"t{p}", None, 0, 1)
    floors.raised("t3", uuid.uuid4(), 0, 1)  # known by name and by id: two keys, room for them made
    assert floors.floor("t0", 0) is None and floors.floor("t1", 0) is not None and floors.floor("t3", 0) is not None
    assert floors.forgotten == 1 and len(floors) == 4


# -- requests -------------------------------------------------------------------------------------
def fetch_request(version: int, epoch: int) -> bytes:
    topic: dict[str, Any] = {"topic": "orders"} if version < 13 else {"topic_id": TOPIC_ID}
    return request_frame(FETCH, version, 9, topics=[{**topic, "partitions": [
        {"partition": 0, "current_leader_epoch": epoch, "fetch_offset": 3},
        {"partition": 1, "current_leader_epoch": epoch, "fetch_offset": 3}]}])


def list_offsets_request(version: int, epoch: int) -> bytes:
    return request_frame(LIST_OFFSETS, version, 9, topics=[{"name": "orders", "partitions": [
        {"partition_index": 0, "current_leader_epoch": epoch, "timestamp": -1}]}])


def ofle_request(version: int, epoch: int) -> bytes:
    return request_frame(OFFSET_FOR_LEADER_EPOCH, version, 9, topics=[{"topic": "orders", "partitions": [
        {"partition": 0, "current_leader_epoch": epoch, "leader_epoch": 0}]}])


def current_epochs(frame: bytes) -> list[int]:
    value = request_body(0, 0, frame)
    return [p["current_leader_epoch"] for t in value["topics"] for p in t["partitions"]]


def unfloor(frame: bytes, api_key: int, version: int, floors: LeaderEpochFloors) -> bytes:
    offset = request_body_offset(frame, api_key, version)
    assert offset is not None
    return unfloor_request_epochs(frame, api_key, version, offset, floors).frame


CASES = ([(FETCH, v, fetch_request) for v in versions(FETCH, 9)]
         + [(LIST_OFFSETS, v, list_offsets_request) for v in versions(LIST_OFFSETS, 4)]
         + [(OFFSET_FOR_LEADER_EPOCH, v, ofle_request) for v in versions(OFFSET_FOR_LEADER_EPOCH, 2)])


@pytest.mark.parametrize(("api_key", "version", "make"), CASES)
def test_an_epoch_only_kproxy_advertised_reaches_the_broker_as_the_brokers_own(api_key: int, version: int,
                                                                               make: Any) -> None:
    floors = raised_floors(5)
    # The broker's own epoch not seen since the raise: -1, which every one of these requests reads
    # as "no check".
    assert current_epochs(unfloor(make(version, 5), api_key, version, floors))[0] == -1
    floors.seen("orders", TOPIC_ID, 0, 2, 1)  # an answer kproxy did not raise: the broker is at 2
    assert current_epochs(unfloor(make(version, 5), api_key, version, floors))[0] == 2
    assert current_epochs(unfloor(make(version, 3), api_key, version, floors))[0] == 2
    for kept in (2, 1, 6):  # the broker's own or older (it fences those itself), or past the floor
        frame = make(version, kept)
        assert unfloor(frame, api_key, version, floors) is frame
    if api_key == FETCH:  # partition 1 has no floor
        assert current_epochs(unfloor(make(version, 5), api_key, version, floors)) == [2, 5]


@pytest.mark.parametrize(("api_key", "version", "make"),
                         [(FETCH, 8, fetch_request), (LIST_OFFSETS, 3, list_offsets_request),
                          (OFFSET_FOR_LEADER_EPOCH, 1, ofle_request)])
def test_requests_without_a_current_leader_epoch_go_as_they_are(api_key: int, version: int, make: Any) -> None:
    frame = make(version, 5)
    assert unfloor(frame, api_key, version, raised_floors(5)) is frame
