"""The capture's committed offsets and watermarks (schema version 3) and write times (version 4),
against the live tracker's.

One session's observer is the metrics' (with consumer lag) and the capture's together, as the
server wires them: every version of OffsetCommit, OffsetFetch, Fetch, ListOffsets and Produce goes
through it, and the last committed offset per (group, topic, partition) and the last watermark per
(topic, partition) that the capture's records hold are what the tracker holds (a Produce answer's:
the log end offset). Records of other exchanges carry none; an older capture (version 2, no such
fields) still reads. A Produce answer's items say when the offsets it gave were written, as the
tracker's write-time points do.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from kproxy.capture.observer import CaptureObserver, ConnectionInfo, Tee
from kproxy.capture.record_builder import RecordBuilder, as_dict
from kproxy.capture.record_schema import READABLE_VERSIONS, SCHEMA_VERSION, check_version
from kproxy.metrics.consumer_lag import ConsumerLag
from kproxy.metrics.stats import StatsOptions, TrafficStats
from kproxy.metrics.traffic_observer import MetricsObserver
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.message_schemas import supported_versions
from kproxy.protocol.topic_ids import TopicIdNames
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.session import Session
from tests.test_lag_metrics import produce_records

PRODUCE, FETCH, LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH = 0, 1, 2, 3, 8, 9
TOPIC_ID = uuid.UUID(int=0xCAFE)


def versions(api_key: int) -> range:
    span = supported_versions(api_key)
    assert span is not None
    return range(span[0], span[1] + 1)


class Both:
    """A session seen by the metrics (with a lag tracker) and by the capture (each record read at once)."""

    def __init__(self) -> None:
        self.lag = ConsumerLag()
        self.records: list[dict[str, Any]] = []
        self.builder = RecordBuilder(TopicIdNames())
        capture = CaptureObserver(ConnectionInfo(connection_id="c-1", client_host="10.0.0.9", client_port=5555,
                                                 listener="broker-1", upstream="b1:9092"),
                                  lambda item, _: self.records.append(as_dict(self.builder.row(item))) is None,
                                  clock_offset=0.0)
        metrics = MetricsObserver(TrafficStats(StatsOptions(consumer_lag=True)), self.lag).for_broker(1)
        self.session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), observer=Tee(metrics, capture))
        self.correlation_id = 0

    def exchange(self, api_key: int, api_version: int, request: dict[str, Any], response: dict[str, Any]
                 ) -> dict[str, Any]:
        self.correlation_id += 1
        self.session.receive_client(request_frame(api_key, api_version, self.correlation_id, **request))
        self.session.receive_upstream(response_frame(api_key, api_version, self.correlation_id, **response))
        self.session.report()
        return self.records[-1]

    def offline(self) -> tuple[dict[tuple[str, str, int], int], dict[tuple[str, int], int]]:
        """The last committed offsets and watermarks the capture's records hold, in record order."""
        committed: dict[tuple[str, str, int], int] = {}
        marks: dict[tuple[str, int], int] = {}
        for record in self.records:
            for p in record["partitions"]:
                if p["committed_offset"] is not None:
                    committed[(p["group_id"], p["topic"], p["partition"])] = p["committed_offset"]
                if p["high_watermark"] is not None:
                    marks[(p["topic"], p["partition"])] = p["high_watermark"]
        return committed, marks


def topic(**partition_values: Any) -> list[dict[str, Any]]:
    return [{"name": "orders", "topic": "orders", "topic_id": TOPIC_ID, "partitions": [
        {"partition_index": p, "partition": p, **{k: v(p) if callable(v) else v for k, v in partition_values.items()}}
        for p in range(3)]}]


def traffic(both: Both) -> None:
    """Every version of every exchange the lag reads, offsets moving version by version."""
    both.exchange(METADATA, 12, {}, {"topics": [{"name": "orders", "topic_id": TOPIC_ID}]})
    for i, v in enumerate(versions(OFFSET_COMMIT)):  # partition 2 refused each time
        both.exchange(OFFSET_COMMIT, v, {"group_id": "billing", "topics": topic(committed_offset=lambda p, i=i: i + p)},
                      {"topics": topic(error_code=lambda p: 27 if p == 2 else 0)})
    for i, v in enumerate(versions(OFFSET_FETCH)):
        found = topic(committed_offset=lambda p, i=i: 100 + i + p, error_code=0)
        both.exchange(OFFSET_FETCH, v, {"group_id": "audit", "groups": [{"group_id": "audit"}]},
                      {"topics": found, "groups": [{"group_id": "audit", "topics": found},
                                                   {"group_id": "other", "topics": found, "error_code": 16}]})
    for i, v in enumerate(versions(FETCH)):
        both.exchange(FETCH, v, {}, {"responses": topic(high_watermark=lambda p, i=i: 200 + i + p,
                                                        error_code=lambda p, i=i: 6 if p == 1 and i % 2 else 0)})
    for i, v in enumerate(versions(LIST_OFFSETS)):
        both.exchange(LIST_OFFSETS, v, {"isolation_level": 0, "topics": topic(timestamp=lambda p: -1 if p else -2)},
                      {"topics": topic(offset=lambda p, i=i: 300 + i + p,
                                       old_style_offsets=lambda p, i=i: [300 + i + p])})
    for i, v in enumerate(versions(PRODUCE)):  # partitions 0 and 1 get 2 + p records at 400 + 10 i; 2 refused
        data = [{"index": p, "records": produce_records(2 + p, v)} for p in range(3)]
        both.exchange(PRODUCE, v, {"acks": -1, "timeout_ms": 1000, "topic_data": [
            {"name": "orders", "topic_id": TOPIC_ID, "partition_data": data}]},
            {"responses": [{"name": "orders", "topic_id": TOPIC_ID, "partition_responses": [
                {"index": p, "error_code": 6 if p == 2 else 0, "base_offset": -1 if p == 2 else 400 + 10 * i}
                for p in range(3)]}]})


def test_the_capture_records_the_offsets_the_live_tracker_reads() -> None:
    both = Both()
    traffic(both)
    committed, marks = both.offline()
    view = both.lag.view(both.session.clock())
    assert committed == view.committed and marks == view.watermarks
    last = {api: len(versions(api)) - 1 for api in (OFFSET_COMMIT, OFFSET_FETCH, FETCH, LIST_OFFSETS)}
    assert committed == {("billing", "orders", p): last[OFFSET_COMMIT] + p for p in (0, 1)} | {  # 2: refused
        ("audit", "orders", p): 100 + last[OFFSET_FETCH] + p for p in range(3)}  # "other": its group's error
    # Fetch's last watermarks, then ListOffsets' latest (timestamp -1) for partitions 1 and 2 (0 asked -2),
    # then the last Produce's log end offsets of partitions 0 and 1 (2 refused).
    end = 400 + 10 * (len(versions(PRODUCE)) - 1)
    assert marks == {("orders", 0): end + 2, ("orders", 1): end + 3, ("orders", 2): 300 + last[LIST_OFFSETS] + 2}


def test_a_produce_record_dates_the_offsets_its_answer_gave_as_the_tracker_does() -> None:
    """Every Produce version: the items of the partitions the answer accepted carry the range it gave
    (base offset 400 + 10 i, 2 + p records) and their batch header's max timestamp (the records' last
    time, 1001 + p; none for a legacy message set, v0-2); the tracker's first write-time point of each
    partition (it takes at most one a second) is the first dated item's."""
    both = Both()
    traffic(both)
    dated: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    produces = [r for r in both.records if r["api_name"] == "Produce"]
    assert len(produces) == len(versions(PRODUCE))
    for i, (v, record) in enumerate(zip(versions(PRODUCE), produces, strict=True)):
        items = {p["partition"]: (p["base_offset"], p["last_offset"], p["max_timestamp"])
                 for p in record["partitions"]}
        stamp = (lambda p: 1001 + p) if v >= 3 else (lambda p: None)
        assert items == {p: (400 + 10 * i, 400 + 10 * i + 1 + p, stamp(p)) for p in (0, 1)} | {
            2: (None, None, None)}, v  # 2: refused
        for p in (0, 1):
            if stamp(p) is not None:
                dated.setdefault(("orders", p), []).append(items[p])
    kept = {key[1]: tuple(points[:3]) for key, (points, _) in both.lag.written.items()}
    assert kept == {p: dated[("orders", p)][0] for p in (0, 1)}


def _fetched(n: int, base: int, first_time: int) -> bytes:
    """``n`` records from offset ``base``, written at ``first_time`` ms and a millisecond apart."""
    from kproxy.protocol.records import Record, encode_batch_v2

    return encode_batch_v2([Record(offset=base + i, timestamp=first_time + i, key=None, value=b"v")
                            for i in range(n)], base_offset=base)


@pytest.mark.parametrize("version", [v for v in versions(FETCH) if v >= 4])
def test_a_fetch_answer_dates_its_records_live_and_in_the_capture(version: int) -> None:
    """Fetch answers are a second source of write times: each partition's records' first offset, last
    offset and latest max timestamp, in the tracker's points and the record's items alike; an answer
    in which a partition carried no records is read for neither (its ranges would not pair)."""
    both = Both()
    both.exchange(METADATA, 12, {}, {"topics": [{"name": "orders", "topic_id": TOPIC_ID}]})
    rec = both.exchange(FETCH, version, {}, {"responses": topic(
        high_watermark=lambda p: 40, error_code=0, records=lambda p: _fetched(3 + p, 10 * p, 7000 + 100 * p))})
    items = {p["partition"]: (p["base_offset"], p["last_offset"], p["max_timestamp"]) for p in rec["partitions"]}
    expected = {p: (10 * p, 10 * p + 2 + p, 7000 + 100 * p + 2 + p) for p in range(3)}
    assert items == expected
    kept = {key[1]: tuple(points) for key, (points, _) in both.lag.written.items()}
    assert kept == expected

    other = Both()
    rec = other.exchange(FETCH, version, {}, {"responses": topic(
        high_watermark=lambda p: 40, error_code=0, records=lambda p: _fetched(3, 10, 7000) if p else None)})
    assert [p["max_timestamp"] for p in rec["partitions"]] == [None, None, None]
    assert not other.lag.written


def test_a_fetch_of_many_batches_dates_them_in_spans_live_and_in_the_capture() -> None:
    """20 batches a partition (a consumer catching up): FETCH_SPANS spans, the batches split evenly among
    them, each dated by its own batches' latest time, not the answer's; the capture's further spans
    are items of their own, without records."""
    from kproxy.protocol.offset_reads import FETCH_SPANS

    both = Both()
    rec = both.exchange(FETCH, 12, {}, {"responses": topic(high_watermark=40, error_code=0, records=lambda p: b"".join(
        _fetched(1, i, 9000 + 100 * i) for i in range(20)))})
    spans = [(k * 20 // FETCH_SPANS, (k + 1) * 20 // FETCH_SPANS - 1) for k in range(FETCH_SPANS)]
    expected = [(first, last, 9000 + 100 * last) for first, last in spans]
    for p in range(3):
        items = [p_ for p_ in rec["partitions"] if p_["partition"] == p]
        assert [(i["base_offset"], i["last_offset"], i["max_timestamp"]) for i in items] == expected
        assert [i["record_count"] for i in items] == [20] + [0] * (FETCH_SPANS - 1)
        points = both.lag.written[("orders", p)][0]
        assert [tuple(points[i:i + 3]) for i in range(0, len(points), 3)] == expected


@pytest.mark.parametrize("version", versions(OFFSET_FETCH))
def test_an_offset_fetch_record_has_one_item_per_group_and_partition(version: int) -> None:
    both = Both()
    found = topic(committed_offset=lambda p: 40 + p, error_code=0)
    rec = both.exchange(OFFSET_FETCH, version, {"group_id": "a", "topics": [{"name": "orders"}],
                                                "groups": [{"group_id": "a"}, {"group_id": "b"}]},
                        {"topics": found, "groups": [{"group_id": "a", "topics": found},
                                                     {"group_id": "b", "topics": found}]})
    items = {(p["group_id"], p["partition"]): p["committed_offset"] for p in rec["partitions"]
             if p["committed_offset"] is not None}
    groups = ("a", "b") if version >= 8 else ("a",)
    assert items == {(g, p): 40 + p for g in groups for p in range(3)}


def test_other_exchanges_and_refused_bodies_carry_no_offsets() -> None:
    both = Both()
    rec = both.exchange(0, 9, {"acks": 1, "topic_data": [{"name": "orders", "partition_data": [{"index": 0}]}]},
                        {"responses": [{"name": "orders", "partition_responses": [{"index": 0}]}]})
    assert [(p["group_id"], p["committed_offset"], p["high_watermark"]) for p in rec["partitions"]] == [
        (None, None, None)]
    both.correlation_id += 1
    good = request_frame(OFFSET_COMMIT, 8, both.correlation_id, group_id="g", topics=topic(committed_offset=5))
    answer = response_frame(OFFSET_COMMIT, 8, both.correlation_id, topics=topic(error_code=0))
    both.session.receive_client(good)
    both.session.receive_upstream((len(answer) - 8).to_bytes(4, "big") + answer[4:-4])  # cut short
    both.session.report()
    assert all(p["committed_offset"] is None for p in both.records[-1]["partitions"])
    assert both.offline() == ({}, {}) and not both.lag.committed


def test_a_produce_whose_records_were_not_all_counted_gives_no_log_end_offset() -> None:
    from kproxy.protocol.compression import Codec
    from kproxy.protocol.records import DEFAULT_RECORD_BUDGET, Record, encode_message_set

    # A legacy gzip wrapper inflating past the frame's record budget: its count is short.
    bomb = encode_message_set([Record(offset=0, timestamp=0, key=None, value=bytes(DEFAULT_RECORD_BUDGET + 1))],
                              magic=1, codec=Codec.GZIP)
    both = Both()
    answered = [{"index": p, "error_code": 0, "base_offset": 50} for p in (0, 1)]
    rec = both.exchange(PRODUCE, 2, {"acks": 1, "topic_data": [{"name": "orders", "partition_data": [
        {"index": 0, "records": produce_records(2, 2)}, {"index": 1, "records": bomb}]}]},
        {"responses": [{"name": "orders", "partition_responses": answered}]})
    assert [p["high_watermark"] for p in rec["partitions"]] == [None, None]
    assert both.offline()[1] == {} and both.lag.view(both.session.clock()).watermarks == {}
    rec = both.exchange(PRODUCE, 2, {"acks": 1, "topic_data": [{"name": "orders", "partition_data": [
        {"index": 0, "records": produce_records(2, 2)}]}]},
        {"responses": [{"name": "orders", "partition_responses": answered[:1]}]})
    assert both.offline()[1] == both.lag.view(both.session.clock()).watermarks == {("orders", 0): 52}


def test_version_5_is_written_and_older_captures_still_read(tmp_path: Path, spark: Any) -> None:
    """A version 2 file (items without the offsets), a version 3 file (items without the write times),
    a version 4 file (items without the batch producers, records without member ids) and a version 5
    file read together under today's schema, as the analysis reads them: the older items' missing
    fields are null."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kproxy.analysis.spark_schema import spark_schema
    from kproxy.capture.writer import CaptureWriter
    from tests.support.capture import record

    assert SCHEMA_VERSION == 5 and READABLE_VERSIONS == (1, 2, 3, 4, 5)
    for version in (1, 2, 3, 4, 5):
        check_version({b"kproxy.capture.schema_version": str(version).encode()}, "f.parquet")
    writer = CaptureWriter(tmp_path / "new", max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600).start()
    writer.offer(record(1, api_key=PRODUCE, api_name="Produce", partitions=[
        {"topic": "t", "partition": 0, "error_code": 0, "record_count": 4, "record_bytes": 10, "high_watermark": 9,
         "base_offset": 5, "last_offset": 8, "max_timestamp": 1234, "producer_id": 7, "codec": 4}]))
    writer.close()
    fields = [("topic", pa.string()), ("partition", pa.int32()), ("error_code", pa.int16()),
              ("record_count", pa.int64()), ("record_bytes", pa.int64())]
    v3 = [("group_id", pa.string()), ("committed_offset", pa.int64()), ("high_watermark", pa.int64())]
    (tmp_path / "old").mkdir()
    item = {"topic": "t", "partition": 0, "error_code": 0, "record_count": 1, "record_bytes": 10}
    pq.write_table(pa.table({"schema_version": pa.array([2], pa.int16()), "partitions": pa.array(
        [[item]], pa.list_(pa.struct(fields)))}), tmp_path / "old" / "capture-v2.parquet")
    pq.write_table(pa.table({"schema_version": pa.array([3], pa.int16()), "partitions": pa.array(
        [[{**item, "group_id": None, "committed_offset": None, "high_watermark": 7}]],
        pa.list_(pa.struct(fields + v3)))}), tmp_path / "old" / "capture-v3.parquet")
    v4 = [("base_offset", pa.int64()), ("last_offset", pa.int64()), ("max_timestamp", pa.int64())]
    pq.write_table(pa.table({"schema_version": pa.array([4], pa.int16()), "partitions": pa.array(
        [[{**item, "group_id": None, "committed_offset": None, "high_watermark": 8, "base_offset": 1,
           "last_offset": 2, "max_timestamp": 99}]], pa.list_(pa.struct(fields + v3 + v4)))}),
        tmp_path / "old" / "capture-v4.parquet")
    files = [str(p) for p in sorted(tmp_path.rglob("*.parquet"))]
    rows = spark.read.schema(spark_schema()).parquet(*files).select("schema_version", "partitions").collect()
    seen = sorted((r["schema_version"], p["high_watermark"], p["base_offset"], p["last_offset"], p["max_timestamp"],
                   p["producer_id"], p["codec"]) for r in rows for p in r["partitions"])
    assert seen == [(2, None, None, None, None, None, None), (3, 7, None, None, None, None, None),
                    (4, 8, 1, 2, 99, None, None), (5, 9, 5, 8, 1234, 7, 4)]
    members = spark.read.schema(spark_schema()).parquet(*files).select("schema_version", "member_id").collect()
    assert sorted((r["schema_version"], r["member_id"]) for r in members) == [(2, None), (3, None), (4, None),
                                                                               (5, None)]
