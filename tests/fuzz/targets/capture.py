"""Fuzz target of the capture's record builder, fed real exchanges of a sans-IO session.

An input is one flags byte, then frames in the session target's format
(:func:`tests.fuzz.targets.session.session_input`). A :class:`~kproxy.proxy.session.Session`
with a :class:`~kproxy.capture.observer.CaptureObserver` reads them (so each exchange, its
frames and its offsets are the ones kproxy would capture); the observer's offers go to one
:class:`~kproxy.capture.record_builder.RecordBuilder` (the writer's reading, and the early reads of big
Produce requests and Fetch responses), then to Arrow columns as the writer makes them.

Flags: bit 0 keeps payloads (records decoded, decompressed, under the builder's own caps);
bit 1 closes the connection at the end (requests never answered still make records).

The documented outcomes (kproxy/capture/record_builder.py): one row per exchange, an unreadable
exchange still makes a row; no exception from the observer or the builder; every row converts
to the capture's Arrow schema (a value out of its column's type would cost the writer the
whole row group).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tests.fuzz.targets.registry import target
from tests.fuzz.targets.session import session_input, session_ops

KEEP_PAYLOADS, CLOSE_AT_END = 1, 2


def records_fields() -> Iterator[tuple[int, bytes]]:
    """(highest magic, records field) of every encoding: v2 batches of each codec, legacy message sets."""
    from kproxy.protocol.compression import Codec
    from kproxy.protocol.records import Record, encode_batch_v2, encode_message_set

    records = [Record(10 + i, 1_700_000_000_000 + i, b"k%d" % i, b"\x00\x00\x00\x00\x07v" * (i + 1),
                      [("h", b"x")]) for i in range(3)]
    legacy = [Record(10 + i, 1_700_000_000_000 + i, b"k", b"\x00\x00\x00\x00\x07v%d" % i) for i in range(3)]
    for codec in Codec:
        yield 2, encode_batch_v2(records, base_offset=10, codec=codec)
        if codec != Codec.ZSTD:  # legacy messages predate zstd
            yield 1, encode_message_set(legacy, magic=1, codec=codec)
            yield 0, encode_message_set([Record(r.offset, -1, r.key, r.value) for r in legacy], magic=0, codec=codec)
    yield 2, encode_batch_v2(records, base_offset=10) + encode_batch_v2(records[:1], base_offset=10)[:-3]


# Versions the seeds use: the lowest, where legacy message sets end, topic ids begin, the highest.
PRODUCE_VERSIONS = (0, 2, 3, 9, 11)
FETCH_VERSIONS = (0, 3, 4, 12, 13, 16)
TOPIC_ID = "5f2d1c0e-9a3b-4c7d-8e6f-1a2b3c4d5e6f"


def produce_frames(version: int, correlation_id: int, records: bytes, acks: int = -1) -> tuple[bytes, bytes]:
    """A Produce request carrying ``records`` (two partitions) and its answer, whole frames."""
    from kproxy.protocol.frame_builder import request_frame, response_frame

    partitions = [{"index": 0, "partition_index": 0, "records": records},
                  {"index": 1, "partition_index": 1, "records": records}]
    request = request_frame(0, version, correlation_id, acks=acks, timeout_ms=1000,
                            transactional_id="tx" if version >= 3 else None,
                            topic_data=[{"name": "orders", "partition_data": partitions}])
    answer = [{"index": 0, "error_code": 0, "base_offset": 5}, {"index": 1, "error_code": 6}]
    response = response_frame(0, version, correlation_id,
                              responses=[{"name": "orders", "partition_responses": answer}])
    return request, response


def fetch_frames(version: int, correlation_id: int, records: bytes) -> tuple[bytes, bytes]:
    """A Fetch request and its answer carrying ``records`` (two partitions), whole frames."""
    import uuid

    from kproxy.protocol.frame_builder import request_frame, response_frame

    topic: dict[str, Any] = {"topic": "orders", "topic_id": uuid.UUID(TOPIC_ID)}
    request = request_frame(1, version, correlation_id, max_wait_ms=100, min_bytes=1,
                            topics=[{**topic, "partitions": [{"partition": 0}, {"partition": 1}]}])
    partitions = [{"partition_index": 0, "error_code": 0, "high_watermark": 20, "records": records},
                  {"partition_index": 1, "error_code": 1, "high_watermark": 20, "records": records}]
    response = response_frame(1, version, correlation_id, responses=[{**topic, "partitions": partitions}])
    return request, response


def _metadata_with_topic_id(correlation_id: int) -> tuple[bytes, bytes]:
    import uuid

    from kproxy.protocol.frame_builder import request_frame, response_frame

    topic = {"name": "orders", "topic_id": uuid.UUID(TOPIC_ID),
             "partitions": [{"partition_index": 0, "leader_id": 1, "replica_nodes": [1], "isr_nodes": [1]}]}
    return (request_frame(3, 12, correlation_id, topics=[{"name": "orders", "topic_id": uuid.UUID(TOPIC_ID)}]),
            response_frame(3, 12, correlation_id, brokers=[{"node_id": 1, "host": "b1", "port": 9092}],
                           topics=[topic]))


def _capture_seeds() -> Iterator[bytes]:
    fields = list(records_fields())
    for magic, records in fields:
        ops: list[tuple[int, bytes]] = []
        cid = 1
        versions = [(0, v) for v in PRODUCE_VERSIONS] + [(1, v) for v in FETCH_VERSIONS]
        for api, version in versions:
            if (magic == 2) != (version >= (3 if api == 0 else 4)):
                continue  # legacy message sets up to Produce v2 and Fetch v3, v2 batches after
            request, response = (produce_frames if api == 0 else fetch_frames)(version, cid, records)
            ops += [(0, request[4:]), (1, response[4:])]
            cid += 1
        yield bytes([KEEP_PAYLOADS]) + session_input(ops)
    # Metadata teaching a topic id, then a Fetch v13 naming it; an acks=0 Produce; one left unanswered.
    meta = _metadata_with_topic_id(1)
    fetch = fetch_frames(13, 2, fields[0][1])
    quiet = produce_frames(9, 3, fields[0][1], acks=0)[0]
    pending = produce_frames(9, 4, fields[2][1])[0]
    yield bytes([KEEP_PAYLOADS | CLOSE_AT_END]) + session_input(
        [(0, meta[0][4:]), (1, meta[1][4:]), (0, fetch[0][4:]), (1, fetch[1][4:]), (0, quiet[4:]), (0, pending[4:])])
    # A Metadata answer over CACHE_FRAME (its own memo, topic ids learnt), then a Fetch v13 of one of them.
    import uuid

    from kproxy.protocol.frame_builder import request_frame, response_frame

    topics = [{"name": f"t{i}", "topic_id": uuid.UUID(int=i + 1), "partitions": [
        {"partition_index": p, "leader_id": 1, "replica_nodes": [1], "isr_nodes": [1]} for p in range(3)]}
        for i in range(60)]
    big_meta = response_frame(3, 12, 1, brokers=[{"node_id": 1, "host": "b1", "port": 9092}], topics=topics)
    yield bytes([KEEP_PAYLOADS]) + session_input(
        [(0, request_frame(3, 12, 1, topics=None)[4:]), (1, big_meta[4:]), (0, fetch[0][4:]), (1, fetch[1][4:])])
    # Big enough to be read early (EARLY_READ_BYTES) on the event loop.
    from kproxy.protocol.records import Record, encode_batch_v2

    big = encode_batch_v2([Record(i, 1_700_000_000_000, b"k", b"v" * 300, []) for i in range(60)])
    request, response = produce_frames(9, 1, big)
    frequest, fresponse = fetch_frames(12, 2, big)
    yield bytes([0]) + session_input([(0, request[4:]), (1, response[4:]), (0, frequest[4:]), (1, fresponse[4:])])


_SCHEMA: list[Any] = []


def _arrow_check(rows: list[tuple[Any, ...]]) -> None:
    """Each column of ``rows`` converts to its Arrow type (kproxy.capture.writer.arrow_schema)."""
    import pyarrow as pa

    from kproxy.capture.writer import arrow_schema

    if not _SCHEMA:
        _SCHEMA.append(arrow_schema())
    schema = _SCHEMA[0]
    if not rows:
        return
    assert all(len(row) == len(schema) for row in rows), "a row of the wrong width"
    for i, field in enumerate(schema):
        values = [row[i] for row in rows]
        if pa.types.is_list(field.type):
            names = [f.name for f in field.type.value_type]
            values = [None if v is None else [dict(zip(names, item, strict=True)) for item in v] for v in values]
        try:
            pa.array(values, type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise AssertionError(f"column {field.name} ({field.type}): {exc}: {values!r:.300}") from None


def _prepare() -> None:
    """pyarrow imported, the schema built, and each seed's scanners generated, as in a running capture."""
    _arrow_check([])
    for data in _capture_seeds():
        fuzz_capture_records(data)


@target(_capture_seeds, _prepare)
def fuzz_capture_records(data: bytes) -> None:
    """Capture records of a real session's exchanges: a row per exchange, no exception, rows fit the Arrow schema."""
    from kproxy.capture.observer import CaptureObserver, ConnectionInfo
    from kproxy.capture.record_builder import PayloadOptions, RecordBuilder
    from kproxy.protocol.framing import frame
    from kproxy.proxy.address_rewrite import ResponseRewriter
    from kproxy.proxy.addresses import AddressMap
    from kproxy.proxy.commands import CloseConnection
    from kproxy.proxy.session import Session

    if not data:
        return
    flags = data[0]
    builder = RecordBuilder(payloads=PayloadOptions(include=bool(flags & KEEP_PAYLOADS), max_bytes=64,
                                                    max_records=20))
    offered: list[tuple[Any, ...]] = []

    def sink(item: tuple[Any, ...], held: int) -> bool:
        offered.append(item)
        return True

    conn = ConnectionInfo(connection_id="fuzz-1", client_host="10.0.0.9", client_port=5555, listener="broker-1",
                          upstream="b1:9092")
    observer = CaptureObserver(conn, sink, 0.0, reader=builder)
    clock = iter(range(1, 1 << 30))
    session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), max_in_flight=64,
                      clock=lambda: float(next(clock)), observer=observer)
    for side, payload in session_ops(data[1:]):
        whole = frame(payload)
        commands = session.receive_client(whole) if side == 0 else session.receive_upstream(whole)
        session.report()
        if any(isinstance(c, CloseConnection) for c in commands):
            break
    if flags & CLOSE_AT_END:
        observer.close()
    rows = builder.rows(offered)
    assert len(rows) == len(offered), "not one row per exchange"
    if rows:
        _arrow_check(rows)
