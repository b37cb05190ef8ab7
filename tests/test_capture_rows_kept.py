"""What a capture holds for a fixed sequence of exchanges, kept: the rows the record builder makes,
and the Arrow table the writer makes of them, equal to the ones written down in
tests/support/capture_rows_kept.json.

The exchanges cover each way a row is read (a Produce from the session's shared scan or read in
full, legacy message sets, acks=0, Fetch answers of one or many batches a partition, cut short,
with errors, with topic ids, early reads of big frames, the kinds carrying offsets, payloads kept,
frames that cannot be read), every time and size fixed. A change to how rows are built must leave
them equal; a change to what a row holds is a deliberate one: write the file again with
``python -m tests.test_capture_rows_kept`` and say why in the commit. Only the columns and item
fields the file names are compared (a column added since is not this test's), and not the schema
version.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from kproxy.capture.connection_info import ConnectionInfo
from kproxy.capture.record_builder import EARLY_READ_BYTES, PayloadOptions, RecordBuilder, as_dict
from kproxy.capture.rows import dict_rows
from kproxy.protocol.compression import Codec
from kproxy.protocol.frame_builder import request_body, request_frame, response_frame
from kproxy.protocol.headers import request_body_offset
from kproxy.protocol.records import Record, encode_batch_v2, encode_message_set
from kproxy.protocol.scan import scan_request

pa = pytest.importorskip("pyarrow")

KEPT = Path(__file__).resolve().parent / "support" / "capture_rows_kept.json"
PRODUCE, FETCH, LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH = 0, 1, 2, 3, 8, 9
FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, API_VERSIONS = 10, 11, 12, 18
TOPIC_ID = uuid.UUID(int=0xC0FFEE)
CONN = ConnectionInfo(connection_id="c-7", client_host="10.1.2.3", client_port=45000, listener="broker-2",
                      upstream="b2:9092", principal="User:ops", cluster="east")


def _batch(n: int, base: int, at: int, codec: int = Codec.NONE, size: int = 5) -> bytes:
    return encode_batch_v2([Record(offset=base + i, timestamp=at + i, key=b"k%d" % i, value=b"v" * (size + i))
                            for i in range(n)], base_offset=base, codec=codec)


def _legacy(n: int, magic: int, codec: int = Codec.NONE) -> bytes:
    return encode_message_set([Record(offset=i, timestamp=500 + i, key=None, value=b"m%d" % i) for i in range(n)],
                              magic=magic, codec=codec)


def _fetch(version: int, parts: list[dict[str, Any]], *, topic: str = "orders", asked: list[int] | None = None
           ) -> tuple[bytes, bytes]:
    named = {"topic": topic, "name": topic, "topic_id": TOPIC_ID}
    request = request_frame(FETCH, version, 1, body=request_body(FETCH, version, max_wait_ms=500, min_bytes=1, topics=[
        {**named, "partitions": [{"partition": p, "fetch_offset": 10} for p in (
            asked if asked is not None else [part["partition_index"] for part in parts])]}]))
    response = response_frame(FETCH, version, 1, responses=[{**named, "partitions": [
        {"error_code": 0, "high_watermark": 90, "last_stable_offset": 90, "log_start_offset": 0, **part}
        for part in parts]}])
    return request, response


def _produce(version: int, data: list[dict[str, Any]], answers: list[dict[str, Any]] | None, acks: int = -1
             ) -> tuple[bytes, bytes | None]:
    request = request_frame(PRODUCE, version, 1, acks=acks, timeout_ms=1000, transactional_id=None, topic_data=[
        {"name": "orders", "topic_id": TOPIC_ID, "partition_data": data}])
    if answers is None:
        return request, None
    return request, response_frame(PRODUCE, version, 1, responses=[
        {"name": "orders", "topic_id": TOPIC_ID, "partition_responses": answers}])


def exchanges() -> list[tuple[int, int, bytes, bytes | None, bool]]:
    """(api key, version, request, response, share the session's scan) of the fixed sequence."""
    out: list[tuple[int, int, bytes, bytes | None, bool]] = []

    def add(key: int, version: int, frames: tuple[bytes, bytes | None], shared: bool = False) -> None:
        out.append((key, version, frames[0], frames[1], shared))

    add(API_VERSIONS, 3, (request_frame(API_VERSIONS, 3, 1, client_software_name="golden",
                                        client_software_version="1"), response_frame(API_VERSIONS, 3, 1)))
    add(METADATA, 12, (request_frame(METADATA, 12, 1, topics=None), response_frame(
        METADATA, 12, 1, topics=[{"name": "orders", "topic_id": TOPIC_ID, "partitions": [
            {"partition_index": p, "leader_id": 2} for p in range(4)]}])))
    # Produce: the usual one from the session's scan, read in full, several partitions, legacy, acks=0.
    add(PRODUCE, 7, _produce(7, [{"index": 0, "records": _batch(3, 0, 7000)}],
                             [{"index": 0, "error_code": 0, "base_offset": 41}]), shared=True)
    add(PRODUCE, 7, _produce(7, [{"index": 0, "records": _batch(3, 0, 7000)}],
                             [{"index": 0, "error_code": 0, "base_offset": 44}]))
    add(PRODUCE, 9, _produce(9, [{"index": 0, "records": _batch(2, 0, 7100) + _batch(4, 2, 7300, Codec.ZSTD)},
                                 {"index": 1, "records": _batch(1, 0, 7200, Codec.LZ4)},
                                 {"index": 2, "records": _batch(5, 0, 7400)}],
                             [{"index": 0, "error_code": 0, "base_offset": 100},
                              {"index": 1, "error_code": 0, "base_offset": 200},
                              {"index": 2, "error_code": 6, "base_offset": -1}]))
    add(PRODUCE, 2, _produce(2, [{"index": 0, "records": _legacy(3, 1)}, {"index": 1, "records": _legacy(2, 1,
                                                                                                    Codec.SNAPPY)}],
                             [{"index": 0, "error_code": 0, "base_offset": 7},
                              {"index": 1, "error_code": 0, "base_offset": 9}]))
    add(PRODUCE, 9, _produce(9, [{"index": 3, "records": _batch(2, 0, 7500)}], None, acks=0), shared=True)
    # Fetch: the consumer's steady answer, one partition empty, many batches, a cut, errors, ids, legacy.
    add(FETCH, 11, _fetch(11, [{"partition_index": p, "high_watermark": 42 + p, "records": _batch(1, 41 + p, 8000 + p)}
                               for p in range(4)]))
    add(FETCH, 11, _fetch(11, [{"partition_index": 0, "records": _batch(2, 10, 8100)},
                               {"partition_index": 1, "records": None}]))
    add(FETCH, 12, _fetch(12, [{"partition_index": p, "records": b"".join(_batch(1, i, 9000 + 10 * i + p)
                                                                          for i in range(20))} for p in range(3)]))
    add(FETCH, 11, _fetch(11, [{"partition_index": 0, "records": _batch(3, 5, 8200) + _batch(2, 8, 8300)[:30]},
                               {"partition_index": 1, "records": _batch(2, 0, 8400, Codec.SNAPPY)[:40]}]))
    add(FETCH, 11, _fetch(11, [{"partition_index": 0, "error_code": 6, "high_watermark": -1, "records": None},
                               {"partition_index": 2, "records": _batch(2, 3, 8500)},
                               {"partition_index": 3, "high_watermark": -1, "records": _batch(1, 0, 8600)}],
                          asked=[3, 2, 0, 1]))
    add(FETCH, 13, _fetch(13, [{"partition_index": p, "records": _batch(2, 20 * p, 8700 + p)} for p in range(2)]))
    add(FETCH, 4, _fetch(4, [{"partition_index": 0, "records": _legacy(3, 1)},
                             {"partition_index": 1, "records": _batch(2, 0, 8800)}]))
    add(FETCH, 11, _fetch(11, [{"partition_index": 1, "records": _batch(1, 0, 8900)},
                               {"partition_index": 1, "records": _batch(2, 1, 8950)}]))
    add(FETCH, 11, _fetch(11, [{"partition_index": 0, "records": _batch(1, 0, 9100)}], topic="other"))
    add(FETCH, 11, _fetch(11, [{"partition_index": 0, "records": b"\x00" * 12}]))  # no v2 batch: cut to nothing
    add(FETCH, 11, (_fetch(11, [])[0], None))  # unanswered
    add(FETCH, 11, (_fetch(11, [])[0], _fetch(11, [])[1][:20]))  # unreadable
    # Big frames, read early (EARLY_READ_BYTES).
    add(FETCH, 11, _fetch(11, [{"partition_index": p, "records": b"".join(_batch(10, 10 * i, 9300 + i, size=100)
                                                                         for i in range(6))} for p in range(4)]))
    add(PRODUCE, 7, _produce(7, [{"index": 0, "records": _batch(200, 0, 9400, size=100)}],
                             [{"index": 0, "error_code": 0, "base_offset": 300}]), shared=True)
    # The other kinds carrying offsets or ids.
    topics = [{"name": "orders", "topic": "orders", "partitions": [
        {"partition_index": p, "partition": p, "committed_offset": 5 + p, "timestamp": -1} for p in range(2)]}]
    add(OFFSET_COMMIT, 8, (request_frame(OFFSET_COMMIT, 8, 1, group_id="billing", topics=topics),
                           response_frame(OFFSET_COMMIT, 8, 1, topics=[{"name": "orders", "partitions": [
                               {"partition_index": 0, "error_code": 0}, {"partition_index": 1, "error_code": 22}]}])))
    add(OFFSET_FETCH, 8, (request_frame(OFFSET_FETCH, 8, 1, groups=[{"group_id": "audit"}]),
                          response_frame(OFFSET_FETCH, 8, 1, groups=[{"group_id": "audit", "topics": topics}])))
    add(LIST_OFFSETS, 5, (request_frame(LIST_OFFSETS, 5, 1, isolation_level=0, topics=topics),
                          response_frame(LIST_OFFSETS, 5, 1, topics=[{"name": "orders", "partitions": [
                              {"partition_index": p, "offset": 60 + p} for p in range(2)]}])))
    add(FIND_COORDINATOR, 3, (request_frame(FIND_COORDINATOR, 3, 1, key="billing"),
                              response_frame(FIND_COORDINATOR, 3, 1, error_code=15)))
    add(JOIN_GROUP, 5, (request_frame(JOIN_GROUP, 5, 1, group_id="billing", member_id="m-1"),
                        response_frame(JOIN_GROUP, 5, 1, error_code=79)))
    add(HEARTBEAT, 4, (request_frame(HEARTBEAT, 4, 1, group_id="billing", generation_id=3, member_id="m-1"),
                       response_frame(HEARTBEAT, 4, 1, error_code=27)))
    return out


def captured(builder: RecordBuilder) -> list[tuple[Any, ...]]:
    """The sequence as the capture observer offers it (big frames read early, as it reads them)."""
    items = []
    for i, (key, version, request, response, shared) in enumerate(exchanges()):
        scan = None
        if shared:
            body = request_body_offset(request, key, version)
            assert body is not None
            scan = scan_request(key, version, request, body)
        req: Any = request
        if shared and len(request) >= EARLY_READ_BYTES:
            req, scan = builder.early_request(key, version, request, scan), None
        resp: Any = response
        if key == FETCH and response is not None and len(response) >= EARLY_READ_BYTES:
            resp = builder.early_response(key, version, response, 0)
        t = 100.0 + i
        items.append((CONN, 1_790_000_000.0, "User:ops", req, resp, key, version, 7 + i, len(request),
                      t, t + 0.0001, t + 0.0021, t + 0.0023, False, 0,
                      (0.0005, "slow") if i % 5 == 1 else None,
                      (("slow", "delay", "5ms", False),) if i % 5 == 1 else (), scan))
    return items


def _builders() -> list[RecordBuilder]:
    return [RecordBuilder(), RecordBuilder(payloads=PayloadOptions(include=True, max_bytes=4, max_records=5))]


def _json(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        return bytes.fromhex(value["hex"]) if set(value) == {"hex"} else {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def records_now() -> list[list[dict[str, Any]]]:
    """The records of the sequence, per builder (without and with payloads), as the code makes them now."""
    return [[as_dict(row) for row in b.rows(captured(b))] for b in _builders()]


def _kept() -> list[list[dict[str, Any]]]:
    return _from_json(json.loads(KEPT.read_text()))  # type: ignore[no-any-return]


def _same(kept: Any, now: Any, where: str) -> None:
    """``now`` holds what ``kept`` holds, for the keys ``kept`` names (see the module docstring)."""
    if isinstance(kept, dict):
        assert isinstance(now, dict), where
        for key, value in kept.items():
            if key != "schema_version":
                assert key in now, f"{where}: no {key}"
                _same(value, now[key], f"{where}.{key}")
    elif isinstance(kept, list):
        assert isinstance(now, list) and len(now) == len(kept), f"{where}: {now!r} != {kept!r}"
        for i, (a, b) in enumerate(zip(kept, now, strict=True)):
            _same(a, b, f"{where}[{i}]")
    else:
        assert type(now) is type(kept) and now == kept, f"{where}: {now!r} != {kept!r}"


def test_the_rows_of_a_fixed_sequence_are_the_ones_kept() -> None:
    kept = _kept()
    now = records_now()
    assert len(now) == len(kept)
    for b, (kept_records, records) in enumerate(zip(kept, now, strict=True)):
        assert len(records) == len(kept_records)
        for i, (k, r) in enumerate(zip(kept_records, records, strict=True)):
            _same(k, r, f"builder {b} record {i} ({r['api_name']} v{r['api_version']})")


def test_the_writer_makes_the_same_table_of_them() -> None:
    """The writer's way (rows added to the pending columns as they are made, then Arrow) gives the table
    that the rows, added as record dicts, give: what Spark reads of the file."""
    from kproxy.capture.writer import _table, arrow_schema, pending_columns

    schema = arrow_schema()
    for builder, records in zip(_builders(), records_now(), strict=True):
        made = pending_columns(schema)
        builder.add_rows(captured(builder), made)
        given = pending_columns(schema)
        given.add_rows(dict_rows(records))
        assert _table(made, schema).equals(_table(given, schema))


def test_the_sequence_reads_every_way_it_means_to() -> None:
    """The sequence is what the kept rows are about: early reads, dated Fetch spans, payloads."""
    records = records_now()
    plain = records[0]
    assert len({r["api_name"] for r in plain}) == 10
    spans = [p for r in plain if r["api_name"] == "Fetch" for p in r["partitions"] if p["max_timestamp"] is not None]
    assert len(spans) > 20
    assert any(r["payloads"] for r in records[1])
    assert any(r["response_bytes"] and r["response_bytes"] >= EARLY_READ_BYTES for r in plain)
    assert any(r["request_bytes"] >= EARLY_READ_BYTES for r in plain)


if __name__ == "__main__":  # write the kept rows again (see the module docstring)
    KEPT.write_text(json.dumps(_json(records_now()), indent=None, separators=(",", ":")) + "\n")
    sys.exit(0)
