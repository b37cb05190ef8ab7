"""The capture observer on a sans-IO session: exact frames in, exact records out (no disk, no sockets)."""

from __future__ import annotations

import struct
import time
import uuid
from typing import Any

import pytest

from kproxy.capture.observer import CaptureObserver, ConnectionInfo, split_peer
from kproxy.capture.record_builder import EARLY_READ_BYTES, EarlyRead, PayloadOptions, RecordBuilder, as_dict
from kproxy.capture.record_schema import COLUMN_NAMES
from kproxy.protocol import encode_request, frame
from kproxy.protocol.frame_builder import request_body, request_frame, response_frame
from kproxy.protocol.headers import RequestHeader
from kproxy.protocol.records import Record, encode_batch_v2
from kproxy.protocol.topic_ids import TopicIdNames
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.commands import ForwardUpstream, SendToClient
from kproxy.proxy.session import Session

PRODUCE, FETCH, METADATA, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP = 0, 1, 3, 10, 11, 12, 13
TOPIC_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")

# The items' fields schema versions 3, 4 and 5 added, when an exchange carries no offsets nor write times
# (tests/test_capture_offsets.py) nor Produce batches.
NO_OFFSETS = {"group_id": None, "committed_offset": None, "high_watermark": None, "base_offset": None,
              "last_offset": None, "max_timestamp": None, "producer_id": None, "producer_epoch": None,
              "base_sequence": None, "batch_crc": None, "codec": None}


def _head(batch: bytes) -> dict[str, Any]:
    """The producer fields version 5 gives a Produce item: its batch's header, read here by Kafka's layout."""
    crc, attributes = struct.unpack_from(">Ih", batch, 17)
    producer, epoch, sequence = struct.unpack_from(">qhi", batch, 43)
    return {"producer_id": producer, "producer_epoch": epoch, "base_sequence": sequence, "batch_crc": crc,
            "codec": attributes & 7}

def _batch(n: int, base: int = 0, **producer: int) -> bytes:
    return encode_batch_v2([Record(offset=base + i, timestamp=1000 + i, key=b"key%d" % i, value=b"v" * (i + 1))
                            for i in range(n)], base_offset=base, **producer)


class Harness:
    """A session whose observer is a capture observer; each exchange it offers is read at once (as
    the writer thread reads a batch) into a record dict."""

    def __init__(self, listener: str = "broker-7", topics: TopicIdNames | None = None,
                 payloads: PayloadOptions | None = None, early: bool = True) -> None:
        self.records: list[dict[str, Any]] = []
        conn = ConnectionInfo(connection_id="c-1", client_host="10.0.0.9", client_port=5555, listener=listener,
                              upstream="b1:9092")
        self.builder = RecordBuilder(topics if topics is not None else TopicIdNames(), payloads or PayloadOptions())
        self.observer = CaptureObserver(conn, self._sink, reader=self.builder if early else None)
        self.session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), observer=self.observer)
        self.observer.identity = self.session  # records carry the session's principal, as the server wires it
        self.held_bytes = 0
        self.items: list[tuple[Any, ...]] = []

    def _sink(self, item: tuple[Any, ...], nbytes: int) -> bool:
        self.held_bytes += nbytes
        self.items.append(item)
        self.records.append(as_dict(self.builder.row(item)))
        return True

    def exchange(self, request: bytes, response: bytes | None) -> dict[str, Any]:
        before = len(self.records)
        assert self.session.receive_client(request) == [ForwardUpstream(request)]
        if response is not None:
            [sent] = self.session.receive_upstream(response)
            assert isinstance(sent, SendToClient)
        self.session.report()
        assert len(self.records) == before + 1
        return self.records[-1]


def _produce(version: int, correlation_id: int, acks: int, txn: str | None, batches: dict[int, bytes]) -> bytes:
    body = request_body(PRODUCE, version, transactional_id=txn, acks=acks, timeout_ms=1500,
                        topic_data=[{"name": "orders", "partition_data": [{"index": p, "records": b}
                                                                          for p, b in batches.items()]}])
    header = RequestHeader(PRODUCE, version, correlation_id, "shop", 2 if version >= 9 else 1, {})
    return frame(encode_request(header, body))


def test_produce_with_acks_records_partitions_errors_and_identity() -> None:
    h = Harness()
    batches = {0: _batch(3, producer_id=7001, producer_epoch=3, base_sequence=40), 2: _batch(5)}
    response = response_frame(PRODUCE, 9, 4, responses=[{"name": "orders", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 40}, {"index": 2, "error_code": 6, "base_offset": -1}]}])
    rec = h.exchange(_produce(9, 4, -1, "tx-9", batches), response)
    assert set(rec) == set(COLUMN_NAMES)
    assert (rec["api_name"], rec["api_version"], rec["correlation_id"], rec["client_id"]) == ("Produce", 9, 4, "shop")
    assert (rec["acks"], rec["transactional_id"], rec["group_id"]) == (-1, "tx-9", None)
    assert (rec["client_host"], rec["client_port"], rec["node_id"], rec["listener"]) == ("10.0.0.9", 5555, 7,
                                                                                          "broker-7")
    # Partition 0's log end offset after the append: base offset 40 + 3 records; those three (40 to 42)
    # written at their batch header's max timestamp (the records' times: 1000 to 1002).
    assert rec["partitions"] == [
        {"topic": "orders", "partition": 0, "error_code": 0, "record_count": 3, "record_bytes": len(batches[0]),
         **NO_OFFSETS, "high_watermark": 43, "base_offset": 40, "last_offset": 42, "max_timestamp": 1002,
         **_head(batches[0])},
        {"topic": "orders", "partition": 2, "error_code": 6, "record_count": 5, "record_bytes": len(batches[2]),
         **NO_OFFSETS, **_head(batches[2])}]
    # (version 5: each partition's batch's producer; partition 2's producer is not idempotent)
    assert rec["partitions"][0]["producer_id"] == 7001 and rec["partitions"][0]["base_sequence"] == 40
    assert rec["partitions"][1]["producer_id"] == -1
    assert (rec["record_count"], rec["record_bytes"]) == (8, len(batches[0]) + len(batches[2]))
    assert rec["error_code"] is None  # Produce has no top-level code
    assert rec["response_bytes"] == len(response) and rec["broker_latency_ms"] is not None
    assert rec["payloads"] is None and rec["rule_decisions"] == []


@pytest.mark.parametrize(("answered", "expected"), [
    ({0: 6}, [("orders", 0, 6, 3)]),  # one partition both ways: one entry, the response's code
    ({1: 6}, [("orders", 0, None, 3), ("orders", 1, 6, 0)]),  # the response names another partition
    ({0: 0, 1: 6}, [("orders", 0, 0, 3), ("orders", 1, 6, 0)]),
    ({}, [("orders", 0, None, 3)]),  # nothing answered for it
])
def test_a_partition_in_the_request_and_the_response_is_one_entry(answered: dict[int, int],
                                                                   expected: list[tuple[Any, ...]]) -> None:
    h = Harness()
    batch = _batch(3)
    response = response_frame(PRODUCE, 9, 4, responses=[{"name": "orders", "partition_responses": [
        {"index": p, "error_code": code} for p, code in answered.items()]}] if answered else [])
    rec = h.exchange(_produce(9, 4, -1, None, {0: batch}), response)
    assert [(p["topic"], p["partition"], p["error_code"], p["record_count"]) for p in rec["partitions"]] == expected
    assert (rec["record_count"], rec["record_bytes"]) == (3, len(batch))


def test_produce_acks_0_is_a_record_without_response() -> None:
    h = Harness(listener="bootstrap")
    rec = h.exchange(_produce(3, 1, 0, None, {1: _batch(2)}), None)
    assert (rec["acks"], rec["transactional_id"], rec["node_id"]) == (0, None, None)
    assert rec["response_time"] is None and rec["response_bytes"] is None and rec["broker_latency_ms"] is None
    assert rec["record_count"] == 2


def test_group_and_transaction_ids() -> None:
    h = Harness()
    join = h.exchange(request_frame(JOIN_GROUP, 9, 1, group_id="readers", member_id="", protocol_type="consumer"),
                      response_frame(JOIN_GROUP, 9, 1, error_code=79))
    assert join["group_id"] == "readers" and join["error_code"] == 79
    txn = h.exchange(request_frame(FIND_COORDINATOR, 3, 2, key="tx-1", key_type=1),
                     response_frame(FIND_COORDINATOR, 3, 2, error_code=0, node_id=7, host="b1", port=9092))
    assert (txn["transactional_id"], txn["group_id"], txn["error_code"]) == ("tx-1", None, 0)
    group = h.exchange(request_frame(FIND_COORDINATOR, 4, 3, key_type=0, coordinator_keys=["readers"]),
                       response_frame(FIND_COORDINATOR, 4, 3, coordinators=[]))
    assert group["group_id"] == "readers"


def test_group_requests_carry_their_member_ids_and_session_timeout() -> None:
    # (version 5: what the report's vanished_member replays; a static member's instance id too)
    h = Harness()
    join = h.exchange(request_frame(JOIN_GROUP, 9, 1, group_id="readers", member_id="m-1", group_instance_id="i-1",
                                    session_timeout_ms=6000, protocol_type="consumer"),
                      response_frame(JOIN_GROUP, 9, 1, error_code=0))
    assert (join["member_id"], join["group_instance_id"], join["session_timeout_ms"]) == ("m-1", "i-1", 6000)
    beat = h.exchange(request_frame(HEARTBEAT, 4, 2, group_id="readers", generation_id=1, member_id="m-1"),
                      response_frame(HEARTBEAT, 4, 2, error_code=0))
    assert (beat["member_id"], beat["group_instance_id"], beat["session_timeout_ms"]) == ("m-1", None, None)
    leave = h.exchange(request_frame(LEAVE_GROUP, 3, 3, group_id="readers", members=[
        {"member_id": "m-2", "group_instance_id": None}]), response_frame(LEAVE_GROUP, 3, 3, error_code=0, members=[]))
    assert (leave["group_id"], leave["member_id"]) == ("readers", "m-2")
    fetch = h.exchange(request_frame(FETCH, 12, 4, topics=[]), response_frame(FETCH, 12, 4, responses=[]))
    assert (fetch["member_id"], fetch["session_timeout_ms"]) == (None, None)


def test_fetch_by_topic_id_is_named_from_a_metadata_response_of_any_connection() -> None:
    names = TopicIdNames()
    meta = Harness(topics=names)
    meta.exchange(request_frame(METADATA, 12, 1, topics=None),
                  response_frame(METADATA, 12, 1, brokers=[], cluster_id="c", controller_id=7,
                                 topics=[{"name": "orders", "topic_id": TOPIC_ID, "partitions": []}]))
    fetch = Harness(topics=names, payloads=PayloadOptions(include=True, max_bytes=2))
    batch = _batch(4, base=10)
    rec = fetch.exchange(
        request_frame(FETCH, 13, 2, topics=[{"topic_id": TOPIC_ID, "partitions": [{"partition": 1}]}]),
        response_frame(FETCH, 13, 2, responses=[{"topic_id": TOPIC_ID, "partitions": [
            {"partition_index": 1, "error_code": 0, "records": batch}]}]))
    assert rec["partitions"] == [{"topic": "orders", "partition": 1, "error_code": 0, "record_count": 4,
                                  "record_bytes": len(batch), **NO_OFFSETS, "high_watermark": 0,
                                  "base_offset": 10, "last_offset": 13, "max_timestamp": 1003}]
    assert [(p["offset"], p["key"], p["value"], p["key_size"], p["value_size"]) for p in rec["payloads"]] == [
        (10, b"ke", b"v", 4, 1), (11, b"ke", b"vv", 4, 2), (12, b"ke", b"vv", 4, 3), (13, b"ke", b"vv", 4, 4)]
    unknown = Harness()  # a topic id never seen in Metadata stays an id
    rec = unknown.exchange(
        request_frame(FETCH, 13, 3, topics=[]),
        response_frame(FETCH, 13, 3, responses=[{"topic_id": TOPIC_ID, "partitions": [
            {"partition_index": 0, "error_code": 3, "records": None}]}]))
    assert rec["partitions"][0]["topic"] == str(TOPIC_ID) and rec["partitions"][0]["error_code"] == 3


def test_requests_left_unanswered_become_records_at_close_then_the_close_itself() -> None:
    h = Harness()
    h.session.receive_client(request_frame(METADATA, 12, 5, topics=None))
    h.session.report()
    assert h.records == []
    before = time.time()
    h.observer.close("idle timeout")
    rec, closed = h.records
    assert rec["correlation_id"] == 5 and rec["response_time"] is None and rec["response_bytes"] is None
    assert rec["close_reason"] is None
    # (version 5: the close's own record, after the connection's last request's: its time and reason)
    assert (closed["api_key"], closed["api_name"], closed["close_reason"]) == (-1, "ConnectionClosed", "idle timeout")
    assert closed["connection_id"] == rec["connection_id"] and closed["client_host"] == rec["client_host"]
    assert before - 1 <= closed["request_time"] / 1e6 <= time.time() + 1
    assert (closed["response_time"], closed["partitions"], closed["client_id"]) == (None, [], None)


def test_unreadable_request_body_still_makes_a_record() -> None:
    h = Harness()
    garbage = request_frame(JOIN_GROUP, 9, 1, group_id="g")[:-3]  # cut short: the broker will refuse it
    body_len = len(garbage) - 4
    garbage = body_len.to_bytes(4, "big") + garbage[4:]
    rec = h.exchange(garbage, response_frame(JOIN_GROUP, 9, 1, error_code=0))
    assert rec["api_name"] == "JoinGroup" and rec["group_id"] is None


def test_split_peer() -> None:
    assert split_peer("127.0.0.1:5000") == ("127.0.0.1", 5000)
    assert split_peer("[::1]:5000") == ("::1", 5000)
    assert split_peer("unknown") == ("unknown", None)


def test_sasl_user_becomes_the_principal_after_a_successful_authenticate() -> None:
    h = Harness()
    h.exchange(request_frame(17, 1, 1, mechanism="PLAIN"), response_frame(17, 1, 1, error_code=0,
                                                                         mechanisms=["PLAIN"]))
    # The session's principal: the one its rules see (kproxy/sasl/relay.py reads the login).
    failed = h.exchange(request_frame(36, 2, 2, auth_bytes=b"\x00mallory\x00guess"),
                        response_frame(36, 2, 2, error_code=58, error_message="bad", auth_bytes=b""))
    assert failed["principal"] is None and failed["error_code"] == 58
    ok = h.exchange(request_frame(36, 2, 3, auth_bytes=b"\x00alice\x00s3cret"),
                    response_frame(36, 2, 3, error_code=0, auth_bytes=b""))
    later = h.exchange(request_frame(METADATA, 12, 4, topics=None),
                       response_frame(METADATA, 12, 4, brokers=[], cluster_id="c", controller_id=7, topics=[]))
    assert ok["principal"] == later["principal"] == "User:alice"
    assert "s3cret" not in repr(h.records) and "guess" not in repr(h.records)


# -- the event loop's share, and the writer's ----------------------------------------------------
def test_the_loop_side_keeps_references_to_the_frames_and_reads_nothing() -> None:
    items: list[tuple[Any, ...]] = []
    conn = ConnectionInfo(connection_id="c-1", client_host="h", client_port=1, listener="bootstrap", upstream="b:1")
    observer = CaptureObserver(conn, lambda item, nbytes: items.append((item, nbytes)) is None)
    session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), observer=observer)
    request = _produce(9, 4, -1, None, {0: _batch(3)})
    response = response_frame(PRODUCE, 9, 4, responses=[{"name": "orders", "partition_responses": [
        {"index": 0, "error_code": 0}]}])
    session.receive_client(request)
    session.receive_upstream(response)
    session.report()
    [(item, nbytes)] = items
    assert item[3] is request  # the frame itself, not a copy, held until the writer reads it
    assert item[4] == response and nbytes == len(request) + len(response)
    assert item[5:8] == (PRODUCE, 9, 4)  # api, version, correlation id: numbers the session had already


def test_repeated_frames_are_read_once_yet_each_record_is_its_own() -> None:
    h = Harness()
    topics = [{"name": "orders", "partitions": [{"partition_index": 0, "error_code": 5, "leader_id": 7}]}]
    first, second = (h.exchange(request_frame(METADATA, 12, cid, topics=None),
                                response_frame(METADATA, 12, cid, brokers=[], cluster_id="c", controller_id=7,
                                               topics=topics)) for cid in (1, 2))
    assert (first["correlation_id"], second["correlation_id"]) == (1, 2)
    assert first["partitions"] == second["partitions"] == [
        {"topic": "orders", "partition": 0, "error_code": 5, "record_count": 0, "record_bytes": 0, **NO_OFFSETS}]
    # Same sizes, other content: never taken for one another.
    a = h.exchange(request_frame(JOIN_GROUP, 9, 3, group_id="g-a", member_id="", protocol_type="consumer"),
                   response_frame(JOIN_GROUP, 9, 3, error_code=0))
    b = h.exchange(request_frame(JOIN_GROUP, 9, 4, group_id="g-b", member_id="", protocol_type="consumer"),
                   response_frame(JOIN_GROUP, 9, 4, error_code=25))
    assert (a["group_id"], a["error_code"], b["group_id"], b["error_code"]) == ("g-a", 0, "g-b", 25)


def test_captured_exchanges_written_by_the_writer_read_back_as_built(tmp_path: Any) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    from kproxy.capture.writer import CaptureWriter

    payloads = PayloadOptions(include=True, max_bytes=3)
    expected = Harness(payloads=payloads)  # the same exchanges, read as the writer reads them
    writer = CaptureWriter(tmp_path, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600,
                           rows=RecordBuilder(TopicIdNames(), payloads).rows).start()
    conn = expected.observer.conn
    observer = CaptureObserver(conn, lambda item, nbytes: writer.offer(item, nbytes) and expected._sink(item, nbytes))
    session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), observer=observer)
    session.receive_client(_produce(9, 1, -1, "tx", {0: _batch(2), 1: _batch(1)}))
    session.receive_upstream(response_frame(PRODUCE, 9, 1, responses=[{"name": "orders", "partition_responses": [
        {"index": 0, "error_code": 0}, {"index": 1, "error_code": 6}]}]))
    session.receive_client(_produce(9, 2, 0, None, {2: _batch(4)}))  # acks=0: no response
    session.receive_client(request_frame(METADATA, 12, 3, topics=None))
    session.receive_upstream(response_frame(METADATA, 12, 3, brokers=[], cluster_id="c", controller_id=7, topics=[]))
    session.report()
    writer.close()
    [path] = tmp_path.glob("hour=*/capture-*.parquet")
    table = pq.ParquetFile(path).read()
    rows = table.drop_columns(["request_time", "response_time"]).to_pylist()
    want = [{k: v for k, v in rec.items() if k not in ("request_time", "response_time")} for rec in expected.records]
    assert len(rows) == 3 and rows == want
    assert table.column("request_time").cast("int64").to_pylist() == [r["request_time"] for r in expected.records]
    assert rows[0]["payloads"][0]["key"] == b"key" and rows[1]["response_bytes"] is None
    assert writer.written == 3 and writer.dropped == 0


def test_big_produce_requests_and_fetch_responses_are_read_at_once_and_let_go() -> None:
    big = {0: encode_batch_v2([Record(offset=i, timestamp=i, key=None, value=b"x" * 1000) for i in range(40)],
                              base_offset=0)}
    request = _produce(9, 1, -1, None, big)
    assert len(request) >= EARLY_READ_BYTES
    produce_response = response_frame(PRODUCE, 9, 1, responses=[{"name": "orders", "partition_responses": [
        {"index": 0, "error_code": 6}]}])
    fetch_request = request_frame(FETCH, 12, 2, topics=[{"topic": "orders", "partitions": [{"partition": 0}]}])
    fetch_response = response_frame(FETCH, 12, 2, responses=[{"topic": "orders", "partitions": [
        {"partition_index": 0, "error_code": 0, "records": big[0]}]}])
    payloads = PayloadOptions(include=True, max_bytes=4)
    early, later = Harness(payloads=payloads), Harness(payloads=payloads, early=False)
    for h in (early, later):
        h.exchange(request, produce_response)
        h.exchange(fetch_request, fetch_response)
    assert [type(item[3]) for item in early.items] == [EarlyRead, bytes]  # the Produce request, read
    assert [type(item[4]) for item in early.items] == [bytes, EarlyRead]  # the Fetch response, read
    assert early.held_bytes == len(produce_response) + len(fetch_request)  # only the small frames are held
    def timeless(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if not k.endswith(("_time", "_latency_ms"))} for r in records]

    assert timeless(early.records) == timeless(later.records)  # the records the writer thread would read
    produce, fetch = early.records
    assert produce["partitions"] == [{"topic": "orders", "partition": 0, "error_code": 6, "record_count": 40,
                                      "record_bytes": len(big[0]), **NO_OFFSETS, **_head(big[0])}]
    assert produce["request_bytes"] == len(request) and fetch["response_bytes"] == len(fetch_response)
    assert fetch["record_count"] == 40 and len(fetch["payloads"]) == 40 and fetch["payloads"][0]["value"] == b"xxxx"


class _SlowRule:
    """A policy holding every response until 50 ms after its request was read, as a delay rule does,
    and noting it on the exchange as the rules policy does (Exchange.rule_decisions)."""

    def decide(self, exchange: Any) -> Any:
        from kproxy.proxy.session import Verdict

        exchange.rule_decisions = (("slow", "delay", "50.0ms at request", False),
                                   ("watch", "close_connection", "dry run: nothing done", True))
        return Verdict(hold_s=0.05, held_by=("slow", "delay"))


def test_rule_decisions_go_into_the_record_and_held_time_is_not_kproxy_latency() -> None:
    """The record names what the rules did (dry runs flagged), and its kproxy_latency_ms leaves out
    the time a rule held the response, as Exchange.overhead_seconds does."""
    h = Harness()
    now = [10.0]
    h.session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), observer=h.observer,
                        policy=_SlowRule(), clock=lambda: now[0])
    request = request_frame(FIND_COORDINATOR, 3, 5, key="g", key_type=0)
    assert ForwardUpstream(request) in h.session.receive_client(request)
    now[0] = 10.002  # the broker answers in 2 ms
    h.session.receive_upstream(response_frame(FIND_COORDINATOR, 3, 5, error_code=0, node_id=1, host="b1",
                                              port=9092))
    h.session.report()
    assert h.records == []  # held
    now[0] = 10.0501  # released 0.1 ms after the hold's end
    assert any(isinstance(c, SendToClient) for c in h.session.on_timer(now[0]))
    h.session.report()
    [rec] = h.records
    assert rec["rule_decisions"] == [
        {"rule": "slow", "action": "delay", "detail": "50.0ms at request", "dry_run": False},
        {"rule": "watch", "action": "close_connection", "detail": "dry run: nothing done", "dry_run": True}]
    assert rec["broker_latency_ms"] == pytest.approx(2.0)
    assert rec["kproxy_latency_ms"] == pytest.approx(0.1, abs=1e-6)


@pytest.mark.parametrize("version", [3, 7, 9, 11, 13])
def test_the_writer_takes_a_produce_from_the_sessions_scan_and_reads_the_same(version: int,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # A producer's usual Produce (one partition, one v2 batch): its record is built from the scan the
    # session made once for the metrics and the rules (Exchange.request_scan), never by scanning the frame
    # again on the writer thread (the small ones) or on the loop (the big ones read early); the same record
    # a full read of the frame gives.
    def produce(correlation_id: int, batch: bytes) -> bytes:
        body = request_body(PRODUCE, version, transactional_id="tx-1" if version >= 3 else None, acks=-1,
                            timeout_ms=1500, topic_data=[{"name": "orders", "topic_id": TOPIC_ID,
                                                          "partition_data": [{"index": 2, "records": batch}]}])
        header = RequestHeader(PRODUCE, version, correlation_id, "shop", 2 if version >= 9 else 1, {})
        return frame(encode_request(header, body))

    def answer(correlation_id: int) -> bytes:
        return response_frame(PRODUCE, version, correlation_id, responses=[
            {"name": "orders", "topic_id": TOPIC_ID, "partition_responses": [{"index": 2, "error_code": 0}]}])

    small, big = _batch(3), encode_batch_v2([Record(offset=i, timestamp=i, key=None, value=b"x" * 1000)
                                             for i in range(40)])
    full = Harness(early=False)  # the frames held for the writer, and read by it in full (no scan given)
    for correlation_id, batch in ((1, small), (2, big)):
        full.exchange(produce(correlation_id, batch), answer(correlation_id))
    full_records = [as_dict(full.builder.row((*item[:17], None))) for item in full.items]
    shared = Harness()
    reads: list[int] = []
    real = RecordBuilder._request_part

    def counted(self: RecordBuilder, kind: Any, request: bytes, *, early: bool = False) -> Any:
        reads.append(len(request))
        return real(self, kind, request, early=early)

    monkeypatch.setattr(RecordBuilder, "_request_part", counted)
    for correlation_id, batch in ((1, small), (2, big)):
        shared.exchange(produce(correlation_id, batch), answer(correlation_id))
    assert reads == []  # neither frame was scanned again
    assert shared.items[0][17] is not None and type(shared.items[1][3]) is EarlyRead
    timeless = [{k: v for k, v in r.items() if not k.endswith(("_time", "_latency_ms"))} for r in shared.records]
    assert timeless == [{k: v for k, v in r.items() if not k.endswith(("_time", "_latency_ms"))}
                        for r in full_records]
    assert [(p["partition"], p["record_count"]) for r in shared.records for p in r["partitions"]] == [(2, 3), (2, 40)]
    assert shared.records[0]["transactional_id"] == ("tx-1" if version >= 3 else None)
    assert shared.records[0]["acks"] == -1 and shared.records[0]["client_id"] == "shop"
