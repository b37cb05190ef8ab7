"""The per-request path's shared scans (kproxy/protocol/scan.py).

* ``scan_request``: a Produce request going through a Session with metrics and a rules policy
  is scanned once (the exchange's :attr:`~kproxy.proxy.session.Exchange.request_scan`), and both
  readers get what they got from their own scans before: the rule matches the request's topic,
  the metrics count its records (the ranges the metrics' own scan found, on any body, readable
  or not); ``bytes``, ``bytearray`` and ``memoryview`` frames scan alike.
* ``produce_answer_errors``: the hand-written read of a producer's usual Produce answer agrees
  with the generated errors-only scanner on every Produce version, for any shape and any
  corruption of the bytes (or leaves the frame to it: None), and does take the usual shape; in
  the values mode (consumer lag's base offsets) too; ``produce_answer`` (the capture's: every
  code kept) agrees with the full scanner alike.
* ``one_batch_count``: the metrics' in-place count of a one-batch records range is what
  ``count_records`` of that range gives, or leaves the range to it.
"""

from __future__ import annotations

import struct
import tracemalloc
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kproxy.proxy.exchange as exchange_module
import kproxy.rules.frame_facts as facts_module
from kproxy.metrics.fault_stats import FaultStats
from kproxy.metrics.stats import StatsOptions, TrafficStats
from kproxy.metrics.traffic_observer import MetricsObserver
from kproxy.policy.live_rules import LiveRules
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.fetch_scan import fetch_answer_scan, fetch_answer_untagged
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.headers import request_body_offset
from kproxy.protocol.message_schemas import MessageType, supported_versions
from kproxy.protocol.produce_scan import produce_answer as produce_answer_entry
from kproxy.protocol.produce_scan import produce_answer_errors, produce_answer_untagged, produce_request_scan
from kproxy.protocol.records import (
    Record,
    count_records,
    encode_batch_v2,
    encode_message_set,
    one_batch_count,
    one_batch_header,
    v2_batches,
    v2_totals,
)
from kproxy.protocol.scan import SCAN_FAILURES, Entry, RequestScan, scan_request, scanner
from kproxy.protocol.scan_types import ScanEntries
from kproxy.protocol.splice import splice_body
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.session import Exchange, Session
from kproxy.rules import load_text
from kproxy.rules.frame_facts import FrameFacts

PRODUCE = 0
FETCH = 1
PRODUCE_VERSIONS = range(supported_versions(PRODUCE)[0], supported_versions(PRODUCE)[1] + 1)  # type: ignore[index]
TOPIC_RULE = """
seed: 7
rules:
  - id: orders-rule
    match: {api: produce, topic: 'ord*'}
    actions:
      - delay: {ms: 0}
"""


def batch(n: int) -> bytes:
    return encode_batch_v2([Record(offset=i, timestamp=0, key=None, value=b"v" * 10, headers=[]) for i in range(n)])


def produce(version: int, correlation_id: int, topic: str = "orders", records: bytes | None = None) -> bytes:
    return request_frame(PRODUCE, version, correlation_id, acks=1, timeout_ms=1000, topic_data=[
        {"name": topic, "partition_data": [{"index": 0, "records": batch(3) if records is None else records}]}])


def produce_answer(version: int, correlation_id: int) -> bytes:
    return response_frame(PRODUCE, version, correlation_id, responses=[
        {"name": "orders", "partition_responses": [{"index": 0, "error_code": 0, "base_offset": 7}]}])


@pytest.mark.pure_only  # counts calls of kproxy.protocol.scan.scan_request, which compiled callers make directly
@pytest.mark.parametrize("version", [3, 7, 9, 11])
def test_a_produce_is_scanned_once_for_the_rules_and_the_metrics(version: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def counting(api_key: int, api_version: int, frame: Any, offset: int) -> Any:
        calls.append(api_key)
        return scan_request(api_key, api_version, frame, offset)

    def not_again(*_: Any) -> Any:
        raise AssertionError("the request was scanned a second time")

    monkeypatch.setattr(exchange_module, "scan_request", counting)
    monkeypatch.setattr(facts_module, "scan_request", not_again)  # the rules' own scan (a RequestHeader's)
    monkeypatch.setattr(TrafficStats, "_count_records", not_again)  # the metrics' own scan
    stats = TrafficStats()
    counts = FaultStats()
    live = LiveRules(load_text(TOPIC_RULE), counts=counts)
    session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)),
                      observer=MetricsObserver(stats).for_broker(None), policy=live.policy("127.0.0.1:5555"))
    for correlation_id in (1, 2):
        session.receive_client(produce(version, correlation_id))
        session.receive_upstream(produce_answer(version, correlation_id))
        session.report()
    assert calls == [PRODUCE, PRODUCE]  # one scan per request
    assert stats.records["produce"] == 6  # the metrics read its records ranges
    assert sum(n for (rule, _, _), n in counts.hits.items() if rule == "orders-rule") == 2  # the rule its topic


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=st.sampled_from(list(PRODUCE_VERSIONS)), n=st.integers(0, 3), how=st.one_of(
    st.none(), st.tuples(st.just("cut"), st.integers(0, 200)),
    st.tuples(st.just("flip"), st.integers(0, 200), st.integers(0, 255))))
def test_the_shared_scan_finds_the_records_ranges_the_metrics_scan_found(version: int, n: int, how: Any) -> None:
    # The metrics count Produce records from the ranges of the shared full scan (nothing when it
    # cannot read the body); the errors-only scan is the reference. The two must agree on every
    # body, readable or not: same ranges, and failing on the same bytes.
    frame = mutate(produce(version, 1, records=batch(n) if n else None), how)
    offset = request_body_offset(frame, PRODUCE, version)
    if offset is None:
        return
    fn = scanner(PRODUCE, version, MessageType.REQUEST, errors_only=True)
    assert fn is not None
    ranges: list[tuple[int, int]] | None = []
    try:
        fn(frame, offset, [], ranges, None)
    except SCAN_FAILURES:
        ranges = None
    shared = scan_request(PRODUCE, version, frame, offset)
    assert (None if shared is None else shared[1]) == ranges


def test_a_body_the_scan_cannot_read_has_no_records_counted() -> None:
    # The body's last byte is its tagged-field count: 5 fields announced, none there.
    bad = produce(9, 1)[:-1] + b"\x05"
    offset = request_body_offset(bad, PRODUCE, 9)
    assert offset is not None and scan_request(PRODUCE, 9, bad, offset) is None
    stats = TrafficStats()
    session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)),
                      observer=MetricsObserver(stats).for_broker(None))
    session.receive_client(bad)
    session.report()
    assert "produce" not in stats.records and stats.records_uncounted["produce"] == 0


@pytest.mark.parametrize("version", [3, 9])
def test_bytes_bytearray_and_memoryview_scan_alike(version: int) -> None:
    frame = produce(version, 1, records=batch(2))
    offset = request_body_offset(frame, PRODUCE, version)
    assert offset is not None
    found = scan_request(PRODUCE, version, frame, offset)
    assert found is not None and found[0] == [("orders", 0, None)] and len(found[1]) == 1
    assert scan_request(PRODUCE, version, bytearray(frame), offset) == found
    assert scan_request(PRODUCE, version, memoryview(frame), offset) == found
    assert scan_request(PRODUCE, version, frame[:-3], offset) is None  # records cut short
    assert scan_request(999, 0, frame, offset) is None  # no schema


# -- produce_answer_errors against the generated scanner ---------------------------------------------
def generated(frame: bytes, offset: int, version: int, values: bool = False) -> Any:
    """The generated errors-only scanner's entries (in values mode: and its values)."""
    fn = scanner(PRODUCE, version, MessageType.RESPONSE, errors_only=True, values=values)
    assert fn is not None
    acc: list[Entry] = ScanEntries.empty() if values else []
    try:
        fn(frame, offset, acc, [], None)
    except SCAN_FAILURES:
        return None
    return (list(acc), acc.values) if values else acc  # type: ignore[attr-defined]


def fast_path(frame: bytes, offset: int, version: int, values: bool = False) -> Any:
    """produce_answer_errors, as :func:`generated` gives it (None: left to the scanner)."""
    found = produce_answer_errors(frame, offset, version, values)
    if found is None or not values:
        return found
    assert isinstance(found, ScanEntries)
    return list(found), found.values


def generated_full(frame: bytes, offset: int, version: int) -> tuple[list[Entry], list[Any]] | None:
    """The full scanner's entries (every partition, whatever its code) and what its values mode
    reads: the capture's scan of a Produce answer."""
    fn = scanner(PRODUCE, version, MessageType.RESPONSE, values=True)
    assert fn is not None
    acc = ScanEntries()
    acc.values = []
    try:
        fn(frame, offset, acc, [], None)
    except SCAN_FAILURES:
        return None
    return list(acc), acc.values


def full_fast(frame: bytes, offset: int, version: int) -> tuple[list[Entry], list[Any]] | None:
    """produce_answer, as :func:`generated_full` gives it."""
    found = produce_answer_entry(frame, offset, version)
    return None if found is None else ([found[:3]], [found])


names = st.one_of(st.sampled_from(["orders", "", "t" * 200, "é-topic"]), st.text(max_size=12))
partition = st.fixed_dictionaries({
    "index": st.integers(-2, 2**31 - 1), "error_code": st.sampled_from([0, 0, 6, -1, 87, 32767]),
    "base_offset": st.integers(-1, 2**40), "log_start_offset": st.integers(-1, 2**40),
    "record_errors": st.lists(st.fixed_dictionaries({"batch_index": st.integers(0, 3),
                                                     "batch_index_error_message": st.none() | st.text(max_size=4)}),
                              max_size=1),
    "error_message": st.none() | st.sampled_from(["", "broken", "x" * 130])})
topic = st.fixed_dictionaries({"name": names, "partition_responses": st.lists(partition, min_size=0, max_size=2)})
mutation = st.one_of(st.none(), st.tuples(st.just("cut"), st.integers(0, 400)),
                     st.tuples(st.just("flip"), st.integers(0, 400), st.integers(0, 255)),
                     st.tuples(st.just("tail"), st.binary(min_size=1, max_size=4)))


def mutate(frame: bytes, how: Any) -> bytes:
    if how is None:
        return frame
    if how[0] == "cut":
        return frame[:max(8, len(frame) - how[1])]
    if how[0] == "flip":
        at = 8 + how[1] % max(1, len(frame) - 8)
        return frame[:at] + bytes([how[2]]) + frame[at + 1:]
    return frame + how[1]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=st.sampled_from(list(PRODUCE_VERSIONS)), topics=st.lists(topic, min_size=0, max_size=2),
       how=mutation)
def test_the_produce_answer_fast_path_agrees_with_the_generated_scanner(version: int, topics: list[dict[str, Any]],
                                                                      how: Any) -> None:
    frame = mutate(response_frame(PRODUCE, version, 1, responses=topics), how)
    offset = 9 if version >= 9 else 8  # response header v1 from v9 (flexible): one empty tag byte
    for values in (False, True):
        fast = fast_path(frame, offset, version, values)
        if fast is not None:
            assert fast == generated(frame, offset, version, values)
    full = full_fast(frame, offset, version)
    if full is not None:
        assert full == generated_full(frame, offset, version)


SHAPES = {
    "plain": {},
    "error message": {"error_message": "x" * 130},
    "record error": {"record_errors": [{"batch_index": 0, "batch_index_error_message": "bad"}]},
    "current leader": {"current_leader": {"leader_id": 2, "leader_epoch": 5}},  # a tagged field (v10+)
}


@pytest.mark.parametrize("version", list(PRODUCE_VERSIONS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_fast_path_agrees_on_every_cut_and_changed_byte_of_a_one_partition_answer(version: int,
                                                                                       shape: str) -> None:
    frame = response_frame(PRODUCE, version, 1, throttle_time_ms=3, responses=[
        {"name": "orders", "partition_responses": [{"index": 4, "error_code": 6, "base_offset": 7,
                                                    **SHAPES[shape]}]}])
    offset = 9 if version >= 9 else 8
    variants = [frame[:end] for end in range(offset, len(frame))]
    variants += [frame[:at] + bytes([value]) + frame[at + 1:]
                 for at in range(offset, len(frame)) for value in (0, 1, 2, 0x7F, 0x80, 0xFF)]
    taken = taken_full = 0
    for variant in variants:
        fast = produce_answer_errors(variant, offset, version)
        if fast is not None:
            taken += 1
            assert fast == generated(variant, offset, version), variant.hex()
        valued = fast_path(variant, offset, version, True)
        assert (valued is None) == (fast is None)
        if valued is not None:
            assert valued == generated(variant, offset, version, True), variant.hex()
        full = full_fast(variant, offset, version)
        if full is not None:
            taken_full += 1
            assert full == generated_full(variant, offset, version), variant.hex()
    if shape == "plain":
        assert taken and taken_full  # some of them (those changing only offsets, say) still take it


@pytest.mark.parametrize("version", list(PRODUCE_VERSIONS))
@pytest.mark.parametrize("code", [0, 6])
def test_the_usual_produce_answer_takes_the_fast_path(version: int, code: int) -> None:
    frame = response_frame(PRODUCE, version, 1, throttle_time_ms=3, responses=[
        {"name": "orders", "partition_responses": [{"index": 4, "error_code": code, "base_offset": 7}]}])
    offset = 9 if version >= 9 else 8
    assert frame[8:9] == (b"\x00" if version >= 9 else struct.pack(">i", 1)[:1])  # the header's size assumed
    fast = produce_answer_errors(frame, offset, version)
    topic: object = uuid.UUID(int=0) if version >= 13 else "orders"  # v13 names the topic by id
    assert fast == ([(topic, 4, code)] if code else [])
    assert fast == generated(frame, offset, version)
    assert fast_path(frame, offset, version, True) == (fast, [(topic, 4, code, 7)])  # the base offset too
    assert produce_answer_entry(frame, offset, version) == (topic, 4, code, 7)
    assert full_fast(frame, offset, version) == generated_full(frame, offset, version)


# -- produce_answer_untagged against the rewrite's splice ------------------------------------------------
def _splice_finds(frame: bytes, offset: int, version: int, api_key: int = PRODUCE) -> Any:
    """What the address rewrite's splice makes of a Produce (or Fetch) answer's node_endpoints:
    None (nothing to change), the names it changed, or "raises"."""
    edits = {"node_endpoints": lambda value: value}
    try:
        spliced, done = splice_body(api_key, version, MessageType.RESPONSE, frame, edits, offset)
    except ProtocolError:
        return "raises"
    return None if spliced is None else done


@pytest.mark.parametrize("version", [v for v in PRODUCE_VERSIONS if v >= 9])
@pytest.mark.parametrize("endpoints", [False, True])
def test_the_untagged_produce_answer_is_what_the_splice_finds_nothing_in(version: int, endpoints: bool) -> None:
    """produce_answer_untagged says "nothing to rewrite" only where the splice, on the same bytes, finds
    nothing to change and raises nothing: on the answer, every cut of it and every changed byte."""
    tagged = {"node_endpoints": [{"node_id": 2, "host": "b2", "port": 9093, "rack": None}]} if (
        endpoints and version >= 10) else {}
    frame = response_frame(PRODUCE, version, 1, throttle_time_ms=3, responses=[
        {"name": "orders", "partition_responses": [{"index": 4, "error_code": 0, "base_offset": 7}]}], **tagged)
    offset = 9
    assert produce_answer_untagged(frame, offset, version) == (not tagged)
    assert (_splice_finds(frame, offset, version) is None) == (not tagged)
    variants = [frame[:end] for end in range(offset, len(frame))] + [frame + b"\x00"]
    variants += [frame[:at] + bytes([value]) + frame[at + 1:]
                 for at in range(offset, len(frame)) for value in (0, 1, 2, 0x7F, 0x80, 0xFF)]
    for variant in variants:
        if produce_answer_untagged(variant, offset, version):
            assert _splice_finds(variant, offset, version) is None, variant.hex()
    # Through the rewriter: the answer with endpoints still has them rewritten, the other is left as is.
    rewriter = ResponseRewriter(AddressMap("kproxy.test", 40000))
    done = rewriter.rewrite(PRODUCE, version, frame, offset)
    assert (done is None) == (not tagged)
    if done is not None:
        assert b"kproxy.test" in done.frame and b"b2" not in done.frame


FETCH_SHAPES = {
    "plain": {},
    "aborted": {"aborted_transactions": [{"producer_id": 5, "first_offset": 3}]},
    "no records": {"records": None},
    "current leader": {"current_leader": {"leader_id": 2, "leader_epoch": 5}},  # a partition's tagged field
}


@pytest.mark.parametrize("version", [16, 17])
@pytest.mark.parametrize("shape", [*FETCH_SHAPES, "node endpoints"])
def test_the_untagged_fetch_answer_is_what_the_splice_finds_nothing_in(version: int, shape: str) -> None:
    """fetch_answer_untagged says "nothing to rewrite" only where the splice, on the same bytes,
    finds nothing to change and raises nothing: on a consumer's answer (two partitions), every cut
    of it and every changed byte; it takes the usual answer and leaves any tagged one to the splice."""
    topic_id = uuid.UUID(int=0xFE7C)
    partition = {"error_code": 0, "high_watermark": 9, "last_stable_offset": 9, "log_start_offset": 0,
                 "preferred_read_replica": -1, "records": batch(2), **FETCH_SHAPES.get(shape, {})}
    endpoints = ({"node_endpoints": [{"node_id": 2, "host": "b2", "port": 9093, "rack": None}]}
                 if shape == "node endpoints" else {})
    frame = response_frame(FETCH, version, 1, throttle_time_ms=0, error_code=0, session_id=7, responses=[
        {"topic_id": topic_id, "partitions": [{"partition_index": p, **partition} for p in range(2)]}], **endpoints)
    offset = 9
    usual = shape in ("plain", "aborted", "no records")
    assert fetch_answer_untagged(frame, offset, version) == usual
    assert (_splice_finds(frame, offset, version, FETCH) is None) == (shape != "node endpoints")
    variants = [frame[:end] for end in range(offset, len(frame))] + [frame + b"\x00"]
    variants += [frame[:at] + bytes([value]) + frame[at + 1:]
                 for at in range(offset, len(frame)) for value in (0, 1, 2, 0x7F, 0x80, 0xFF)]
    for variant in variants:
        if fetch_answer_untagged(variant, offset, version):
            assert _splice_finds(variant, offset, version, FETCH) is None, variant.hex()
    done = ResponseRewriter(AddressMap("kproxy.test", 40000)).rewrite(FETCH, version, frame, offset)
    assert (done is None) == (shape != "node endpoints")
    if done is not None:
        assert b"kproxy.test" in done.frame and b"b2" not in done.frame
    assert not fetch_answer_untagged(frame, offset, 15)  # no node_endpoints before v16: never asked


# -- fetch_answer_scan against the generated scanner ---------------------------------------------------
def fetch_generated(frame: bytes, offset: int, version: int, values: bool) -> Any:
    """The generated errors-only scanner of a Fetch answer: (entries, records ranges), in values mode
    with the values; None where it cannot read the bytes."""
    fn = scanner(FETCH, version, MessageType.RESPONSE, errors_only=True, values=values)
    acc: list[Entry] = ScanEntries.empty() if values else []
    recs: list[Any] = []
    try:
        fn(frame, offset, acc, recs, None)  # type: ignore[misc]
    except SCAN_FAILURES:
        return None
    return (list(acc), recs, acc.values) if values else (acc, recs)  # type: ignore[attr-defined]


def fetch_fast(frame: bytes, offset: int, version: int, values: bool) -> Any:
    found = fetch_answer_scan(frame, offset, version, values)
    if found is None:
        return None
    entries, recs = found
    return (list(entries), recs, entries.values) if values else (entries, recs)  # type: ignore[attr-defined]


fetch_partition = st.fixed_dictionaries({
    "partition_index": st.integers(-2, 2**31 - 1), "error_code": st.sampled_from([0, 0, 1, 6, -1, 32767]),
    "high_watermark": st.integers(-1, 2**40), "last_stable_offset": st.integers(-1, 2**40),
    "aborted_transactions": st.none() | st.lists(st.fixed_dictionaries(
        {"producer_id": st.integers(0, 9), "first_offset": st.integers(0, 9)}), max_size=2),
    "records": st.sampled_from([None, b"", batch(1), batch(3)])})
fetch_topic = st.fixed_dictionaries({"topic_id": st.uuids(), "partitions": st.lists(fetch_partition, max_size=3)})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=st.sampled_from([16, 17]), topics=st.lists(fetch_topic, max_size=2),
       code=st.sampled_from([0, 0, 87]), how=mutation)
def test_the_fetch_answer_fast_path_agrees_with_the_generated_scanner(version: int, topics: list[dict[str, Any]],
                                                                    code: int, how: Any) -> None:
    frame = mutate(response_frame(FETCH, version, 1, error_code=code, session_id=3, responses=topics), how)
    for values in (False, True):
        fast = fetch_fast(frame, 9, version, values)
        if fast is not None:
            assert fast == fetch_generated(frame, 9, version, values)
        elif how is None:
            pytest.fail("the usual answer, whole and unchanged, was left to the scanner")


@pytest.mark.parametrize("version", [16, 17])
@pytest.mark.parametrize("shape", list(FETCH_SHAPES))
def test_the_fetch_scan_agrees_on_every_cut_and_changed_byte(version: int, shape: str) -> None:
    partition = {"error_code": 1, "high_watermark": 9, "last_stable_offset": 9, "log_start_offset": 0,
                 "preferred_read_replica": -1, "records": batch(2), **FETCH_SHAPES[shape]}
    frame = response_frame(FETCH, version, 1, throttle_time_ms=0, error_code=0, session_id=7, responses=[
        {"topic_id": uuid.UUID(int=0xFE7C), "partitions": [{"partition_index": p, **partition} for p in range(2)]}])
    variants = [frame] + [frame[:end] for end in range(9, len(frame))]
    variants += [frame[:at] + bytes([value]) + frame[at + 1:]
                 for at in range(9, len(frame)) for value in (0, 1, 2, 0x7F, 0x80, 0xFF)]
    taken = 0
    for variant in variants:
        for values in (False, True):
            fast = fetch_fast(variant, 9, version, values)
            if fast is not None:
                taken += 1
                assert fast == fetch_generated(variant, 9, version, values), variant.hex()
    assert bool(taken) == (shape != "current leader")  # a partition's tagged field: the scanner's
    # And only the versions it knows: before v16 (no node_endpoints) the scanner reads them all.
    assert fetch_answer_scan(frame, 9, 15) is None


# -- one_batch_count against count_records -------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=2), legacy=st.booleans(),
       cut=st.integers(0, 80), flip=st.none() | st.tuples(st.integers(0, 70), st.integers(0, 255)))
def test_one_batch_count_is_count_records_of_the_range_or_leaves_it(counts: list[int], legacy: bool, cut: int,
                                                                     flip: tuple[int, int] | None) -> None:
    data = b"".join(encode_message_set([Record(offset=0, timestamp=0, key=None, value=b"v", headers=[])] * n)
                    if legacy else batch(n) for n in counts)
    if flip is not None:
        data = data[:flip[0]] + bytes([flip[1]]) + data[flip[0] + 1:]
    framed = b"head" + data[:len(data) - cut] + b"tail"
    start, end = 4, len(framed) - 4
    found = one_batch_count(framed, start, end)
    if found is not None:
        assert found == count_records(memoryview(framed)[start:end])
    elif len(counts) == 1 and not legacy and not cut and flip is None:
        pytest.fail("one whole v2 batch was left to count_records")


@settings(max_examples=300, deadline=None)
@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=2), codec=st.sampled_from([0, 1, 3]),
       legacy=st.booleans(), cut=st.integers(0, 80),
       flip=st.none() | st.tuples(st.integers(0, 70), st.integers(0, 255)))
def test_the_walks_of_v2_headers_agree_with_count_records(counts: list[int], codec: int, legacy: bool, cut: int,
                                                          flip: tuple[int, int] | None) -> None:
    """The metrics' in-place readers of v2 headers (kproxy/metrics/traffic.py): one_batch_header is
    v2_batches' one batch or None; v2_totals is v2_batches summed; what they count of a range is
    count_records' count of the same bytes, or they leave the rest (``stop``) to it."""
    records = [Record(offset=0, timestamp=0, key=None, value=b"v", headers=[])]
    data = b"".join(encode_message_set(records * n) if legacy else
                    encode_batch_v2([Record(offset=i, timestamp=0, key=None, value=b"v", headers=[]) for i in range(n)],
                                    codec=codec)
                    for n in counts)
    if flip is not None:
        data = data[:flip[0]] + bytes([flip[1]]) + data[flip[0] + 1:]
    framed = b"head" + data[:len(data) - cut] + b"tail"
    start, end = 4, len(framed) - 4
    batches: list[tuple[int, int, int]] = []
    stop = v2_batches(framed, start, end, batches)
    assert v2_totals(framed, start, end) == (sum(n for _, _, n in batches), sum(b for b, _, _ in batches), stop)
    head = one_batch_header(framed, start, end)
    if head is not None:
        assert batches == [head] and stop == end
    elif len(counts) == 1 and not legacy and not cut and flip is None:
        pytest.fail("one whole v2 batch was left to the walk")
    try:
        whole = count_records(memoryview(framed)[start:end])
    except ProtocolError:
        return
    assert sum(n for _, _, n in batches) + count_records(memoryview(framed)[stop:end]) == whole


# -- the Produce request fast path of scan_request against the generated scanner --------------------
def generated_request(frame: bytes, offset: int, version: int) -> RequestScan | None:
    fn = scanner(PRODUCE, version, MessageType.REQUEST)
    assert fn is not None
    acc: list[Entry] = []
    recs: list[tuple[int, int]] = []
    try:
        fn(frame, offset, acc, recs, None)
    except SCAN_FAILURES:
        return None
    return acc, recs


REQUEST_SHAPES = {"plain": {}, "transactional": {"transactional_id": "tx-1"}, "no records": {"records": None},
                  "big records": {"records": batch(40)},
                  # (flexible versions: a length of two varint bytes, read by request_fields' reader)
                  "long transactional id": {"transactional_id": "tx-" + "x" * 200}}


@pytest.mark.parametrize("version", list(PRODUCE_VERSIONS))
@pytest.mark.parametrize("shape", list(REQUEST_SHAPES))
def test_the_produce_request_fast_path_agrees_on_every_cut_and_changed_byte(version: int, shape: str) -> None:
    values = dict(REQUEST_SHAPES[shape])
    records = values.pop("records", batch(1))
    frame = request_frame(PRODUCE, version, 1, acks=1, timeout_ms=1000, topic_data=[
        {"name": "orders", "topic_id": uuid.UUID(int=7), "partition_data": [{"index": 3, "records": records}]}],
                          **values)
    offset = request_body_offset(frame, PRODUCE, version)
    assert offset is not None
    usual = produce_request_scan(frame, offset, version)
    assert usual is not None and usual == generated_request(frame, offset, version)
    ends = range(offset, len(frame)) if len(frame) < 400 else [*range(offset, offset + 80), *range(len(frame) - 80,
                                                                                               len(frame))]
    variants = [frame[:end] for end in ends]
    variants += [frame[:at] + bytes([value]) + frame[at + 1:]
                 for at in range(offset, min(len(frame), offset + 90)) for value in (0, 1, 2, 0x7F, 0x80, 0xFF)]
    for variant in variants:
        fast = produce_request_scan(variant, offset, version)
        if fast is not None:
            assert fast == generated_request(variant, offset, version), variant.hex()
        assert scan_request(PRODUCE, version, variant, offset) == generated_request(variant, offset, version)
        assert scan_request(PRODUCE, version, memoryview(variant), offset) == generated_request(variant, offset,
                                                                                               version)


def test_the_fast_paths_leave_versions_they_do_not_know() -> None:
    frame = produce(7, 1)
    offset = request_body_offset(frame, PRODUCE, 7)
    assert offset is not None
    assert produce_request_scan(frame, offset, 7) is not None
    for version in (-1, 14, 99):
        assert produce_request_scan(frame, offset, version) is None
        assert produce_answer_errors(produce_answer(7, 1), 8, version) is None


def test_the_topics_of_a_big_produce_are_read_without_copying_the_frame() -> None:
    # A rule on topics scans a big frame where it lies (the session's bytes), never through a copy; so
    # does scan_request a bytearray (a TLS stream's reads), without the copy to bytes another buffer gets.
    big = produce(7, 1, records=encode_batch_v2([
        Record(offset=0, timestamp=0, key=None, value=b"v" * (2 << 20), headers=[])]))
    exchange = Exchange(1, PRODUCE, 7, len(big), 0.0, 0.0, big)
    facts = FrameFacts(big, exchange)
    offset = exchange.request_body_offset
    assert offset is not None
    as_bytearray = bytearray(big)
    tracemalloc.start()
    try:
        assert dict(facts.topics()) == {"orders": frozenset({0})}
        found = scan_request(PRODUCE, 7, as_bytearray, offset)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found is not None and found[0] == [("orders", 0, None)]
    assert peak < 64 * 1024


@pytest.mark.parametrize("version", list(PRODUCE_VERSIONS))
def test_a_one_partition_produce_answer_is_counted_as_the_scanner_counted_it(version: int) -> None:
    # The fast path's entries go through the same counting as a scan's: error, worst class, topic label.
    stats = TrafficStats(StatsOptions(topic_label=True))
    broker = stats.broker(1)
    for code in (0, 6, 0):
        frame = response_frame(PRODUCE, version, 1, responses=[
            {"name": "orders", "topic_id": uuid.UUID(int=9), "partition_responses": [
                {"index": 4, "error_code": code, "base_offset": 7}]}])
        assert produce_answer_errors(frame, 9 if version >= 9 else 8, version) is not None
        stats.response(broker, PRODUCE, version, frame, 0, 0.001, 0.00001)
    topic = str(uuid.UUID(int=9)) if version >= 13 else "orders"
    assert broker.responses == {("produce", version): 3}
    assert broker.errors == {("produce", "NOT_LEADER_OR_FOLLOWER"): 1}
    assert broker.responses_with_errors == {("produce", "retriable"): 1}
    assert stats.topic_errors == {("produce", topic, "NOT_LEADER_OR_FOLLOWER"): 1}
    assert not stats.undecodable_responses
