"""Consumer lag's protocol side (kproxy/protocol/offset_reads.py): the values mode of the scans and its readers.

* The values mode reads, in every version kproxy's tables know of each kind it covers (OffsetCommit
  and OffsetFetch requests and answers, ListOffsets requests and answers, Fetch, Metadata and
  Produce answers), exactly the fields the full decoder finds, with their topic, partition and
  error code, in body order, in both walks (full and errors-only); and it changes nothing else the
  scan reports.
* The readers turn those reads into committed offsets and watermarks as Kafka means them:
  OffsetCommit partitions the answer accepted; OffsetFetch offsets of groups and partitions without
  errors (v0-7 the request's group, v8+ per group); Fetch watermarks of partitions without errors
  (v13+ by topic id); ListOffsets only for timestamp -1 at read_uncommitted; Metadata v10+ ids;
  Produce answers' log end offsets (base offset plus the records the request carried, counted from
  its batch headers, every Produce version and record format); the group every version of every
  group request names, read in place (as the decoder and the values mode read it).
* Bodies built with kproxy's codec; frames are cut and changed byte by byte: never an exception,
  and a body the scan refuses teaches nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from kproxy.protocol.compression import Codec
from kproxy.protocol.frame_builder import request_body, response_body
from kproxy.protocol.message_schemas import PARTITION_FIELDS, Field, MessageType, message_schema, supported_versions
from kproxy.protocol.messages import decode_body, encode_body
from kproxy.protocol.offset_reads import (
    GROUP_REQUESTS,
    OFFSET_FIELDS,
    fetch_watermarks,
    group_ids,
    latest_offsets,
    metadata_topic_ids,
    offset_commits,
    offset_fetches,
    produce_appends,
    produce_end_offsets,
    produce_record_counts,
    values_of,
)
from kproxy.protocol.records import Record, encode_batch_v2, encode_message_set
from kproxy.protocol.scan import (
    SCAN_FAILURES,
    RequestScan,
    run_scanner,
    run_values_scanner,
    scan_body,
    scan_request,
    scanner,
)
from kproxy.protocol.scan_types import ScanEntries

PRODUCE, FETCH, LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH = 0, 1, 2, 3, 8, 9
JOIN_GROUP, HEARTBEAT, SYNC_GROUP, TXN_OFFSET_COMMIT, CONSUMER_GROUP_HEARTBEAT = 11, 12, 14, 28, 68
T1, T2 = uuid.UUID(int=0x1111), uuid.UUID(int=0x2222)


def versions(api_key: int) -> range:
    span = supported_versions(api_key)
    assert span is not None
    return range(span[0], span[1] + 1)


def kinds() -> list[tuple[int, int, MessageType]]:
    return [(api, v, d) for api, d in OFFSET_FIELDS for v in versions(api)]


# -- populated bodies of every kind (values for fields a version lacks are dropped) ----------------------
def partitions(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"partition_index": p, "partition": p, **{k: (v(p) if callable(v) else v) for k, v in extra.items()}}
            for p in range(n)]


def topics(**extra: Any) -> list[dict[str, Any]]:
    return [{"name": name, "topic": name, "topic_id": tid, "partitions": partitions(2, **extra)}
            for name, tid in (("orders", T1), ("payments", T2))]


def body(api_key: int, api_version: int, direction: MessageType) -> dict[str, Any]:
    if (api_key, direction) == (OFFSET_COMMIT, MessageType.REQUEST):
        return request_body(api_key, api_version, group_id="billing",
                            topics=topics(committed_offset=lambda p: 100 + p, committed_metadata="m"))
    if (api_key, direction) == (OFFSET_COMMIT, MessageType.RESPONSE):
        return response_body(api_key, api_version, topics=topics(error_code=lambda p: 25 * p))
    if (api_key, direction) == (OFFSET_FETCH, MessageType.REQUEST):
        return request_body(api_key, api_version, group_id="billing", topics=[{"name": "orders",
                                                                               "partition_indexes": [0, 1]}],
                            groups=[{"group_id": "billing"}, {"group_id": "audit"}])
    if (api_key, direction) == (OFFSET_FETCH, MessageType.RESPONSE):
        found = topics(committed_offset=lambda p: 40 + p, error_code=0)
        return response_body(api_key, api_version, topics=found, groups=[
            {"group_id": "billing", "topics": found}, {"group_id": "audit", "topics": found, "error_code": 16}])
    if (api_key, direction) == (LIST_OFFSETS, MessageType.REQUEST):
        return request_body(api_key, api_version, isolation_level=0, topics=topics(timestamp=lambda p: -1 - p))
    if (api_key, direction) == (LIST_OFFSETS, MessageType.RESPONSE):
        return response_body(api_key, api_version, topics=topics(offset=lambda p: 70 + p, timestamp=-1,
                                                                 old_style_offsets=lambda p: [70 + p, 0]))
    if (api_key, direction) == (FETCH, MessageType.RESPONSE):
        return response_body(api_key, api_version, responses=topics(high_watermark=lambda p: 900 + p,
                                                                    error_code=lambda p: 6 * p))
    if (api_key, direction) == (METADATA, MessageType.RESPONSE):
        return response_body(api_key, api_version, topics=topics())
    if (api_key, direction) == (PRODUCE, MessageType.RESPONSE):
        return response_body(api_key, api_version, responses=[
            {"name": name, "topic_id": tid, "partition_responses": [
                {"index": p, "error_code": 6 * p, "base_offset": 500 + p, "log_append_time_ms": 7,
                 "log_start_offset": 3, "record_errors": [{"batch_index": 1}] if p else []} for p in (0, 1)]}
            for name, tid in (("orders", T1), ("payments", T2))])
    raise AssertionError((api_key, direction))


def encoded(api_key: int, api_version: int, direction: MessageType, value: dict[str, Any] | None = None) -> bytes:
    return encode_body(api_key, api_version, direction, body(api_key, api_version, direction) if value is None
                       else value)


# -- the reference: what a values-mode scan must read, from the full decoder's dict -----------------------
def reference(fields: tuple[Field, ...], d: dict[str, Any], wanted: frozenset[str], topic: Any = None,
              top: bool = True) -> list[tuple[Any, ...]]:
    plain = [f for f in fields if f.tag is None]
    name = next((f for f in plain if f.entity_type == "topicName" and f.type == "string" and not f.array), None)
    tid = next((f for f in plain if f.name == "topic_id" and f.type == "uuid" and not f.array), None)
    if name is not None or tid is not None:
        topic = d[name.name] if name is not None else None
        if topic is None and tid is not None:
            topic = d[tid.name]
    part = next((d[f.name] for f in plain if f.name in PARTITION_FIELDS | {"index"} and f.type == "int32"
                 and not f.array), None)
    has_part = any(f.name in PARTITION_FIELDS | {"index"} and f.type == "int32" and not f.array for f in plain)
    code = next((d[f.name] for f in plain if f.is_error_code), None)
    out: list[tuple[Any, ...]] = []
    for f in plain:
        if f.type == "struct" and f.fields is not None and d[f.name] is not None:
            for item in d[f.name] if f.array else [d[f.name]]:
                out += reference(f.fields, item, wanted, topic, False)
    valued = [f for f in plain if f.name in wanted and f.type != "struct"]
    if valued:
        val = d[valued[0].name]
        if valued[0].array:
            val = val[0] if val else None
        ctx = topic if (name is not None or tid is not None or not top) else None
        out.append((ctx, part, code, val) if has_part else (ctx, val, code))
    return out


@pytest.mark.parametrize(("api_key", "api_version", "direction"), kinds(),
                         ids=[f"{a}-v{v}-{d.name.lower()}" for a, v, d in kinds()])
def test_the_values_mode_reads_what_the_decoder_finds(api_key: int, api_version: int, direction: MessageType) -> None:
    data = encoded(api_key, api_version, direction)
    schema = message_schema(api_key, api_version, direction)
    assert schema is not None
    expected = reference(schema.fields, decode_body(api_key, api_version, direction, data),
                         OFFSET_FIELDS[(api_key, direction)])
    for errors_only in (False, True):
        found = scan_body(api_key, api_version, direction, data, errors_only=errors_only, values=True)
        assert found.values == expected, errors_only
        plain = scan_body(api_key, api_version, direction, data, errors_only=errors_only)
        assert (list(found.entries), found.records) == (plain.entries, plain.records)  # nothing else changed
    if api_key != METADATA or api_version >= 10:
        assert expected, "the populated body holds values to read"


def test_the_request_scan_shared_by_every_reader_is_made_in_values_mode() -> None:
    from kproxy.protocol.scan import scan_request

    data = encoded(OFFSET_COMMIT, 8, MessageType.REQUEST)
    found = scan_request(OFFSET_COMMIT, 8, data, 0)
    assert found is not None and isinstance(found[0], ScanEntries)
    assert found[0] == [("orders", 0, None), ("orders", 1, None), ("payments", 0, None), ("payments", 1, None)]
    assert found[0].values[-1] == (None, "billing", None)
    produce = scan_request(0, 9, encode_body(0, 9, MessageType.REQUEST, request_body(0, 9)), 0)
    assert produce is not None and not isinstance(produce[0], ScanEntries)  # other kinds as before


# -- the readers -----------------------------------------------------------------------------------
def scans(api_key: int, api_version: int, request: dict[str, Any] | None, response: dict[str, Any]
          ) -> tuple[RequestScan | None, RequestScan | None]:
    """The request's shared scan and the answer's metrics scan (errors only), both in values mode."""
    req = None
    if request is not None:
        fn = scanner(api_key, api_version, MessageType.REQUEST, values=True)
        req = run_values_scanner(fn, encode_body(api_key, api_version, MessageType.REQUEST, request), 0)
    fn = scanner(api_key, api_version, MessageType.RESPONSE, errors_only=True, values=True)
    return req, run_values_scanner(fn, encode_body(api_key, api_version, MessageType.RESPONSE, response), 0)


def commits(request: RequestScan | None, response: RequestScan | None) -> Any:
    """offset_commits of the two scans, as kproxy.metrics.consumer_lag.ConsumerLag.answer reads them."""
    return offset_commits(values_of(request), None if response is None else response[0])


def fetches(request: RequestScan | None, response: RequestScan | None, api_version: int) -> Any:
    return offset_fetches(values_of(request), values_of(response), [] if response is None else response[0],
                          api_version)


def latest(request: RequestScan | None, response: RequestScan | None) -> Any:
    return latest_offsets(values_of(request), values_of(response))


def named(api_version: int, first_id: int) -> Any:
    return (lambda name, tid: tid) if api_version >= first_id else (lambda name, tid: name)


@pytest.mark.parametrize("api_version", versions(OFFSET_COMMIT))
def test_an_offset_commit_counts_the_partitions_its_answer_accepted(api_version: int) -> None:
    topic = named(api_version, 10)
    request = body(OFFSET_COMMIT, api_version, MessageType.REQUEST)
    accepted = response_body(OFFSET_COMMIT, api_version, topics=topics(error_code=0))
    assert commits(*scans(OFFSET_COMMIT, api_version, request, accepted)) == [
        ("billing", topic("orders", T1), 0, 100), ("billing", topic("orders", T1), 1, 101),
        ("billing", topic("payments", T2), 0, 100), ("billing", topic("payments", T2), 1, 101)]
    # Partition 1 of each topic refused (ILLEGAL_GENERATION): its offset was not committed.
    partly = body(OFFSET_COMMIT, api_version, MessageType.RESPONSE)
    assert commits(*scans(OFFSET_COMMIT, api_version, request, partly)) == [
        ("billing", topic("orders", T1), 0, 100), ("billing", topic("payments", T2), 0, 100)]
    req, resp = scans(OFFSET_COMMIT, api_version, request, accepted)
    assert commits(req, None) == [] and commits(None, resp) == []  # a scan failed: nothing


@pytest.mark.parametrize("api_version", versions(OFFSET_FETCH))
def test_an_offset_fetch_answer_gives_the_committed_offsets_of_groups_without_errors(api_version: int) -> None:
    topic = named(api_version, 10)
    request = body(OFFSET_FETCH, api_version, MessageType.REQUEST)
    answer = body(OFFSET_FETCH, api_version, MessageType.RESPONSE)
    expected = [("billing", topic(name, tid), p, 40 + p) for name, tid in (("orders", T1), ("payments", T2))
                for p in (0, 1)]
    # v8+: the second group's error (COORDINATOR_NOT_AVAILABLE) leaves it out; v0-7: the request's group.
    assert fetches(*scans(OFFSET_FETCH, api_version, request, answer), api_version) == expected
    # No offset committed (-1), a partition's error: left out.
    gaps = topics(committed_offset=lambda p: -1 if p else 40, error_code=0)
    gaps[1]["partitions"][0]["error_code"] = 614  # UNSTABLE_OFFSET_COMMIT
    answer = response_body(OFFSET_FETCH, api_version, topics=gaps, groups=[{"group_id": "billing", "topics": gaps}])
    assert fetches(*scans(OFFSET_FETCH, api_version, request, answer), api_version) == [
        ("billing", topic("orders", T1), 0, 40)]
    if 2 <= api_version < 8:  # the answer's top-level error: nothing of it
        answer = response_body(OFFSET_FETCH, api_version, topics=gaps, error_code=15)
        assert fetches(*scans(OFFSET_FETCH, api_version, request, answer), api_version) == []
    if api_version < 8:  # the group is the request's: without its scan, nothing
        assert fetches(None, scans(OFFSET_FETCH, api_version, request, answer)[1], api_version) == []


@pytest.mark.parametrize("api_version", versions(FETCH))
def test_a_fetch_answer_gives_the_high_watermarks_of_partitions_without_errors(api_version: int) -> None:
    topic = named(api_version, 13)
    _, answer = scans(FETCH, api_version, None, body(FETCH, api_version, MessageType.RESPONSE))
    # Partition 1 of each topic answered NOT_LEADER_OR_FOLLOWER: its watermark is not one.
    assert fetch_watermarks(values_of(answer)) == [(topic("orders", T1), 0, 900), (topic("payments", T2), 0, 900)]
    assert fetch_watermarks(None) == []


@pytest.mark.parametrize("api_version", versions(LIST_OFFSETS))
def test_only_a_list_offsets_for_the_latest_offset_at_read_uncommitted_gives_watermarks(api_version: int) -> None:
    request = body(LIST_OFFSETS, api_version, MessageType.REQUEST)  # partition 0: -1 (latest), 1: -2 (earliest)
    answer = body(LIST_OFFSETS, api_version, MessageType.RESPONSE)
    assert latest(*scans(LIST_OFFSETS, api_version, request, answer)) == [("orders", 0, 70),
                                                                                  ("payments", 0, 70)]
    failed = response_body(LIST_OFFSETS, api_version, topics=topics(offset=-1, error_code=6, old_style_offsets=[]))
    assert latest(*scans(LIST_OFFSETS, api_version, request, failed)) == []
    assert latest(None, scans(LIST_OFFSETS, api_version, request, answer)[1]) == []
    if api_version >= 2:  # read_committed answers the last stable offset: not a watermark
        committed = request_body(LIST_OFFSETS, api_version, isolation_level=1, topics=topics(timestamp=-1))
        assert latest(*scans(LIST_OFFSETS, api_version, committed, answer)) == []


@pytest.mark.parametrize("api_version", versions(METADATA))
def test_metadata_answers_teach_topic_ids_from_v10(api_version: int) -> None:
    _, answer = scans(METADATA, api_version, None, body(METADATA, api_version, MessageType.RESPONSE))
    assert metadata_topic_ids(values_of(answer)) == ([(T1, "orders"), (T2, "payments")] if api_version >= 10
                                                     else [])
    zero = response_body(METADATA, api_version, topics=[{"name": "gone", "topic_id": uuid.UUID(int=0)}])
    assert metadata_topic_ids(values_of(scans(METADATA, api_version, None, zero)[1])) == []


def records(n: int, api_version: int, codec: int = Codec.NONE) -> bytes:
    """``n`` records as a producer of that Produce version sends them: v2 batches from v3 (KIP-98),
    legacy message sets before (magic 1 from v2, magic 0 before)."""
    found = [Record(offset=i, timestamp=1000 + i, key=None, value=b"v%d" % i) for i in range(n)]
    if api_version >= 3:
        return encode_batch_v2(found, codec=codec)
    return encode_message_set(found, magic=1 if api_version == 2 else 0, codec=codec)


def produce_frame(api_version: int, partitions: dict[tuple[str, int], bytes | None]) -> bytes:
    from kproxy.protocol.frame_builder import request_frame

    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (name, p), data in partitions.items():
        by_topic.setdefault(name, []).append({"index": p, "records": data})
    ids = {"orders": T1, "payments": T2}
    return request_frame(PRODUCE, api_version, 7, acks=-1, timeout_ms=1000, topic_data=[
        {"name": name, "topic_id": ids[name], "partition_data": parts} for name, parts in by_topic.items()])


def counted(frame: bytes, api_version: int) -> Any:
    """produce_record_counts of a Produce frame; given the metrics' count of its records (as
    kproxy.metrics.traffic_observer gives it) or not, the same."""
    from kproxy.metrics.traffic import count_ranges
    from kproxy.protocol.headers import request_body_offset

    offset = request_body_offset(frame, PRODUCE, api_version)
    assert offset is not None
    scan = scan_request(PRODUCE, api_version, frame, offset)
    found = produce_record_counts(frame, scan)
    assert scan is not None and produce_record_counts(frame, scan, count_ranges(frame, scan[1])) == found
    return found


@pytest.mark.parametrize("api_version", versions(PRODUCE))
def test_a_produce_request_counts_its_records_per_partition_from_the_batch_headers(api_version: int) -> None:
    topic = named(api_version, 13)
    # The latest max timestamp of each partition's v2 batches (record i written at 1000 + i ms); a
    # legacy message set's is not read (-1).
    def written(latest: int) -> int:
        return latest if api_version >= 3 else -1

    # One partition, one batch (the usual Produce, read by hand); then two topics, three partitions,
    # a compressed set among them (v2: its header's count; legacy: the wrapper's inner messages).
    assert counted(produce_frame(api_version, {("orders", 3): records(5, api_version)}), api_version) == [
        (topic("orders", T1), 3, 5, written(1004))]
    two = produce_frame(api_version, {("orders", 0): records(2, api_version),
                                      ("orders", 1): records(7, api_version, Codec.GZIP),
                                      ("payments", 0): records(1, api_version) + records(3, api_version)})
    assert counted(two, api_version) == [(topic("orders", T1), 0, 2, written(1001)),
                                         (topic("orders", T1), 1, 7, written(1006)),
                                         (topic("payments", T2), 0, 4, written(1002))]
    # A partition without records: the ranges no longer pair with the partitions, nothing is counted.
    gap = produce_frame(api_version, {("orders", 0): None, ("orders", 1): records(2, api_version)})
    assert counted(gap, api_version) is None
    assert produce_record_counts(two, None) is None


def test_a_produce_request_over_the_record_budget_or_unreadable_is_not_counted() -> None:
    from kproxy.protocol.records import DEFAULT_RECORD_BUDGET

    # A legacy gzip wrapper of zeros that inflates past the frame's budget (a decompression bomb).
    bomb = encode_message_set([Record(offset=0, timestamp=0, key=None, value=bytes(DEFAULT_RECORD_BUDGET + 1))],
                              magic=1, codec=Codec.GZIP)
    assert counted(produce_frame(2, {("orders", 0): records(2, 2), ("orders", 1): bomb}), 2) is None
    bad = bytearray(records(3, 2))
    bad[16] = 5  # the first message's magic (after offset, size and crc): no format kproxy knows
    assert counted(produce_frame(2, {("orders", 0): bytes(bad)}), 2) is None


@pytest.mark.parametrize("api_version", versions(PRODUCE))
def test_a_produce_answer_gives_the_log_end_offset_of_each_partition_it_accepted(api_version: int) -> None:
    topic = named(api_version, 13)
    answer = scans(PRODUCE, api_version, None, body(PRODUCE, api_version, MessageType.RESPONSE))[1]
    produced = [(topic("orders", T1), 0, 3, 7000), (topic("orders", T1), 1, 3, 7001),
                (topic("payments", T2), 0, 9, -1)]
    # Partition 1 of each topic answered NOT_LEADER_OR_FOLLOWER: its records were not appended. The
    # second topic's partition 0: base 500 + 9 records.
    assert produce_end_offsets(produced, values_of(answer)) == [(topic("orders", T1), 0, 503),
                                                                (topic("payments", T2), 0, 509)]
    # The offsets given and when they were written (as the request's batch headers say).
    assert produce_appends(produced, values_of(answer)) == [(topic("orders", T1), 0, 500, 3, 7000),
                                                            (topic("payments", T2), 0, 500, 9, -1)]
    # A partition the request carried no records for, or named twice: nothing.
    assert produce_end_offsets([(topic("orders", T1), 0, 0, -1), (topic("payments", T2), 0, 1, -1),
                                (topic("payments", T2), 0, 2, -1)], values_of(answer)) == []
    assert produce_end_offsets(produced, None) == []
    refused = response_body(PRODUCE, api_version, responses=[{"name": "orders", "topic_id": T1, "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": -1}]}])  # no offset: nothing
    assert produce_end_offsets(produced, values_of(scans(PRODUCE, api_version, None, refused)[1])) == []


LEAVE_GROUP = 13
GROUP_KINDS = [(a, v) for a in sorted(GROUP_REQUESTS | {LEAVE_GROUP, OFFSET_COMMIT, OFFSET_FETCH, TXN_OFFSET_COMMIT})
               for v in versions(a)]


def group_request(api_key: int, api_version: int, group: str) -> tuple[bytes, int]:
    """A request frame of ``api_key`` naming ``group`` (every other field populated) and its body offset."""
    from kproxy.protocol.frame_builder import request_frame
    from kproxy.protocol.headers import request_body_offset

    frame = request_frame(api_key, api_version, 3, group_id=group, transactional_id="tx-1", member_id="m-1",
                          group_instance_id="i-1", topics=topics(committed_offset=5),
                          groups=[{"group_id": group}, {"group_id": "audit"}],
                          topic_partitions=[{"topic_id": T1, "partitions": [0, 1]}])
    offset = request_body_offset(frame, api_key, api_version)
    assert offset is not None
    return frame, offset


@pytest.mark.parametrize(("api_key", "api_version"), GROUP_KINDS, ids=[f"{a}-v{v}" for a, v in GROUP_KINDS])
def test_every_group_request_names_its_group_read_in_place(api_key: int, api_version: int) -> None:
    from kproxy.protocol.request_fields import request_group_id

    frame, offset = group_request(api_key, api_version, "billing-é")
    decoded = decode_body(api_key, api_version, MessageType.REQUEST, frame, offset)
    several = api_key == OFFSET_FETCH and api_version >= 8  # KIP-709: groups in an array, from the scan
    assert request_group_id(frame, api_key, api_version, offset) == (None if several else decoded["group_id"])
    if several:
        found = scan_request(api_key, api_version, frame, offset)
        assert group_ids(values_of(found)) == ["billing-é", "audit"]
    else:  # the same name the scans' values mode reads (bad UTF-8 replaced alike)
        good, at = group_request(api_key, api_version, "billing-ÿ")
        bad = good.replace("ÿ".encode(), b"\xff ")  # an invalid UTF-8 byte, the length unchanged
        assert request_group_id(bad, api_key, api_version, at) == "billing-\ufffd "
        if api_key == OFFSET_COMMIT:
            assert group_ids(values_of(scan_request(api_key, api_version, bad, at))) == ["billing-\ufffd "]
    # Cut anywhere, or a byte changed: an answer or None, never an exception.
    for cut in range(offset, len(frame)):
        request_group_id(frame[:cut], api_key, api_version, offset)
    for at in range(offset, min(len(frame), offset + 24)):
        for value in (0x00, 0x7F, 0x80, 0xFF):
            request_group_id(frame[:at] + bytes([value]) + frame[at + 1:], api_key, api_version, offset)
    assert request_group_id(frame, api_key, api_version, None) is None
    assert request_group_id(frame, 3, 12, offset) is None  # a kind that opens otherwise (Metadata)
    assert request_group_id(frame, api_key, 999, offset) is None  # a version kproxy does not know


# -- malformed bodies ------------------------------------------------------------------------------------
def _reads(api_key: int, api_version: int, request: RequestScan | None, response: RequestScan | None) -> list[Any]:
    """What the kind's reader takes from the two scans (as ConsumerLag.answer reads them,
    kproxy/metrics/consumer_lag.py)."""
    if api_key == OFFSET_COMMIT:
        return commits(request, response)
    if api_key == OFFSET_FETCH:
        return fetches(request, response, api_version) if response is not None else []
    if api_key == LIST_OFFSETS:
        return latest(request, response)
    if api_key == FETCH:
        return fetch_watermarks(values_of(response))
    if api_key == PRODUCE:
        return produce_end_offsets([(topic, p, 4, -1) for topic in ("orders", "payments", T1, T2) for p in (0, 1)],
                                   values_of(response))
    return metadata_topic_ids(values_of(response))


@pytest.mark.parametrize(("api_key", "api_version", "direction"), kinds(),
                         ids=[f"{a}-v{v}-{d.name.lower()}" for a, v, d in kinds()])
def test_cut_and_changed_bodies_raise_nothing_and_a_refused_one_teaches_nothing(
        api_key: int, api_version: int, direction: MessageType) -> None:
    data = encoded(api_key, api_version, direction)
    whole = scan_body(api_key, api_version, direction, data, errors_only=direction is MessageType.RESPONSE,
                      values=True)
    fn = scanner(api_key, api_version, direction, errors_only=direction is MessageType.RESPONSE, values=True)
    other = scanner(api_key, api_version, direction.__class__(1 - direction), values=True)
    good = run_values_scanner(other, encoded(api_key, api_version, direction.__class__(1 - direction)), 0) \
        if (api_key, direction.__class__(1 - direction)) in OFFSET_FIELDS else None
    variants = [data[:cut] for cut in range(len(data))]
    variants += [data[:at] + bytes([b]) + data[at + 1:] for at in range(len(data)) for b in (0x00, 0x7F, 0xFF)]
    for bad in variants:
        found = run_values_scanner(fn, bad, 0)
        plain = run_scanner(scanner(api_key, api_version, direction, errors_only=direction is MessageType.RESPONSE),
                            bad, 0)
        assert (found is None) == (plain is None)  # the values mode refuses what the plain scan refuses
        request, response = (found, good) if direction is MessageType.REQUEST else (good, found)
        reads = _reads(api_key, api_version, request, response)  # never raises
        if found is None:
            if direction is MessageType.RESPONSE or (api_key, api_version >= 8) != (OFFSET_FETCH, True):
                assert reads == []  # (an OffsetFetch v8+ answer names its groups: its request is not read)
        elif len(bad) < len(data):  # cut after what the walk reads: the same reads as the whole body's
            assert found[0].values == whole.values  # type: ignore[attr-defined]
    assert SCAN_FAILURES  # (what a refused body raises inside the scanner, caught by the runners)
