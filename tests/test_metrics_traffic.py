"""Traffic by topic and by client, producer batches and client software (kproxy/metrics/traffic.py),
counted exactly from the bytes that went through a :class:`Session`:

* per topic and per client, bytes and records of Produce requests and Fetch responses equal the
  batches' own sizes and counts, whatever the shape (several topics and partitions, several
  batches in a range, compressed batches, null records), Fetch v13+ topics named by the ids a
  Metadata answer taught, a partial batch at the end of a Fetch answer left out;
* a frame whose records cannot all be counted adds its bytes but no records anywhere;
* producer batches by client, codec and acks, and their sizes by codec;
* ``kproxy_client_info`` counts open connections by the software they named (KIP-511), down when
  they close;
* whatever a client sends (100,000 topic names, client ids, software names), the series stay
  within ``label_cap`` per label and /metrics under 1 MB, the caches within their bounds;
* with the labels off, none of these series exist and records are counted as before;
* whatever bytes a client or broker sends (a byte changed, a frame cut), nothing raises and every
  series agrees with the others.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from kproxy.metrics.exposition import LiveGauges, make_registry
from kproxy.metrics.stats import StatsOptions, TrafficStats
from kproxy.metrics.traffic import BATCH_BYTES_BUCKETS, CACHE_SLACK
from kproxy.metrics.traffic_observer import MetricsObserver
from kproxy.protocol.compression import Codec
from kproxy.protocol.errors import CorruptRecordsError
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.records import (
    Record,
    count_records,
    encode_batch_v2,
    encode_message_set,
    one_batch_count,
    v2_totals,
)
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.exchange import Exchange
from kproxy.proxy.session import Session

PRODUCE, FETCH, METADATA, API_VERSIONS = 0, 1, 3, 18
ORDERS_ID = uuid.UUID("0f6e3f8e-1b0a-4c1e-9d55-6a3c1e2b7a01")


def batch(n: int, codec: int = Codec.NONE, base: int = 0, size: int = 10) -> bytes:
    return encode_batch_v2([Record(offset=base + i, timestamp=1000 + i, key=b"k%d" % i, value=b"v" * size,
                                   headers=[]) for i in range(n)], base_offset=base, codec=codec)


def labelled(**options: Any) -> TrafficStats:
    return TrafficStats(StatsOptions(**{"client_id_label": True, "topic_label": True, **options}))


class Connection:
    """One client connection through a Session with the metrics observer, request by request."""

    def __init__(self, stats: TrafficStats, client_id: str = "app-1") -> None:
        self.observer = MetricsObserver(stats).for_broker(None)
        self.session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), observer=self.observer)
        self.client_id = client_id
        self.correlation = 0

    def exchange(self, api_key: int, version: int, request: dict[str, Any], response: dict[str, Any]) -> None:
        self.correlation += 1
        self.session.receive_client(request_frame(api_key, version, self.correlation, client_id=self.client_id,
                                                  **request))
        if api_key != PRODUCE or request.get("acks", 1) != 0:
            self.session.receive_upstream(response_frame(api_key, version, self.correlation, **response))
        self.session.report()

    def produce(self, version: int, topics: dict[str, dict[int, bytes | None]], acks: int = 1) -> None:
        key = "topic_id" if version >= 13 else "name"
        data = [{key: ORDERS_ID if version >= 13 else name,
                 "partition_data": [{"index": p, "records": r} for p, r in parts.items()]}
                for name, parts in topics.items()]
        answer = [{key: ORDERS_ID if version >= 13 else name,
                   "partition_responses": [{"index": p, "error_code": 0} for p in parts]}
                  for name, parts in topics.items()]
        self.exchange(PRODUCE, version, {"acks": acks, "timeout_ms": 1000, "topic_data": data}, {"responses": answer})

    def fetch(self, version: int, topics: dict[Any, dict[int, bytes | None]]) -> None:
        key = "topic_id" if version >= 13 else "topic"
        request = [{key: t, "partitions": [{"partition": p, "fetch_offset": 0} for p in parts]}
                   for t, parts in topics.items()]
        answer = [{key: t, "partitions": [{"partition_index": p, "error_code": 0, "high_watermark": 9,
                                           "records": r} for p, r in parts.items()]}
                  for t, parts in topics.items()]
        self.exchange(FETCH, version, {"max_wait_ms": 0, "min_bytes": 1, "topics": request},
                      {"responses": answer})

    def metadata(self, version: int, topics: dict[str, uuid.UUID]) -> None:
        self.exchange(METADATA, version, {"topics": [{"name": t} for t in topics]},
                      {"brokers": [], "topics": [{"error_code": 0, "name": t, "topic_id": i, "partitions": []}
                                                 for t, i in topics.items()]})

    def api_versions(self, version: int, name: str, software_version: str) -> None:
        self.exchange(API_VERSIONS, version, {"client_software_name": name,
                                              "client_software_version": software_version},
                      {"error_code": 0, "api_keys": []})

    def close(self) -> None:
        self.observer.close()


def exposition(stats: TrafficStats) -> str:
    return generate_latest(make_registry(stats, LiveGauges)).decode()


def series(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of ``name`` in a text exposition: sorted (label, value) pairs -> value."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for line in text.split("\n"):  # (not splitlines: a label value may hold \v, \f, \x1c...)
        m = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if m is not None and m.group(1) == name:
            out[tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or "")))] = float(m.group(3))
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    return series(text, name).get(tuple(sorted(labels.items())))


# -- bytes and records per topic and client --------------------------------------------------------------
def test_produce_and_fetch_are_counted_per_topic_and_client_from_the_batches() -> None:
    stats = labelled()
    orders = [batch(3), batch(2, Codec.GZIP, base=3)]  # two batches in one range
    payments = batch(5, Codec.ZSTD, size=300)
    app = Connection(stats, "app-1")
    app.produce(9, {"orders": {0: orders[0] + orders[1], 1: None}, "payments": {2: payments}})
    app.produce(3, {"orders": {1: batch(4, Codec.LZ4)}}, acks=-1)
    reader = Connection(stats, "reader")
    tail = batch(7)[:40]  # a partial batch a broker leaves at the end of a Fetch answer
    reader.fetch(12, {"orders": {0: orders[0] + orders[1] + tail}, "payments": {2: None}})
    text = exposition(stats)
    produced_orders = len(orders[0]) + len(orders[1]) + len(batch(4, Codec.LZ4))
    assert value(text, "kproxy_topic_bytes_total", topic="orders", direction="produce") == produced_orders
    assert value(text, "kproxy_topic_records_total", topic="orders", direction="produce") == 3 + 2 + 4
    assert value(text, "kproxy_topic_bytes_total", topic="payments", direction="produce") == len(payments)
    assert value(text, "kproxy_topic_records_total", topic="payments", direction="produce") == 5
    assert value(text, "kproxy_topic_bytes_total", topic="orders", direction="fetch") == len(orders[0]) + len(orders[1])
    assert value(text, "kproxy_topic_records_total", topic="orders", direction="fetch") == 5
    assert value(text, "kproxy_topic_bytes_total", topic="payments", direction="fetch") is None  # no records: no range
    assert value(text, "kproxy_client_bytes_total", client_id="app-1", direction="produce") == produced_orders + len(
        payments)
    assert value(text, "kproxy_client_records_total", client_id="app-1", direction="produce") == 14
    assert value(text, "kproxy_client_bytes_total", client_id="reader", direction="fetch") == len(orders[0]) + len(
        orders[1])
    assert value(text, "kproxy_client_records_total", client_id="reader", direction="fetch") == 5
    assert value(text, "kproxy_client_bytes_total", client_id="reader", direction="produce") is None
    # The per-api records counter is the same count, walked once.
    assert stats.records == {"produce": 14, "fetch": 5}


def test_produce_batches_by_client_codec_and_acks_and_their_sizes() -> None:
    stats = labelled()
    app = Connection(stats, "app-1")
    first, second, big = batch(3), batch(2, Codec.GZIP, base=3), batch(40, Codec.SNAPPY, size=200)
    app.produce(9, {"orders": {0: first + second, 1: big}})
    app.produce(9, {"orders": {0: batch(1)}}, acks=0)
    app.produce(9, {"orders": {0: batch(1)}}, acks=-1)
    app.produce(9, {"orders": {0: batch(1)}}, acks=7)  # not an acks a producer means: folded
    text = exposition(stats)
    assert series(text, "kproxy_produce_batches_total") == {
        (("acks", "1"), ("client_id", "app-1"), ("compression", "none")): 1,
        (("acks", "1"), ("client_id", "app-1"), ("compression", "gzip")): 1,
        (("acks", "1"), ("client_id", "app-1"), ("compression", "snappy")): 1,
        (("acks", "0"), ("client_id", "app-1"), ("compression", "none")): 1,
        (("acks", "-1"), ("client_id", "app-1"), ("compression", "none")): 1,
        (("acks", "other"), ("client_id", "app-1"), ("compression", "none")): 1}
    sizes = {"none": [len(first), len(batch(1)), len(batch(1)), len(batch(1))], "gzip": [len(second)],
             "snappy": [len(big)]}
    for codec, observed in sizes.items():
        assert value(text, "kproxy_produce_batch_bytes_sum", compression=codec) == sum(observed)
        assert value(text, "kproxy_produce_batch_bytes_count", compression=codec) == len(observed)
        for bound in BATCH_BYTES_BUCKETS:
            assert value(text, "kproxy_produce_batch_bytes_bucket", compression=codec, le=repr(bound)) == sum(
                1 for n in observed if n <= bound)


def test_a_batch_of_exactly_a_bucket_bound_counts_in_that_bucket() -> None:
    """Prometheus buckets are ``le``: a batch of exactly a bound's size is in it, whether it came
    alone in its Produce or with others."""
    for bound in (256, 1024):
        [exact] = [b for b in (batch(1, size=v) for v in range(bound)) if len(b) == bound]
        for alone in (True, False):
            stats = labelled()
            partitions = {0: exact} if alone else {0: exact, 1: batch(1)}
            Connection(stats).produce(9, {"orders": partitions})
            text = exposition(stats)
            assert value(text, "kproxy_produce_batch_bytes_bucket", compression="none", le=repr(float(bound))) == (
                1 if alone else 2), (bound, alone)


def test_fetch_v13_topics_are_named_by_the_ids_metadata_taught() -> None:
    stats = labelled()
    reader = Connection(stats, "reader")
    unknown = uuid.UUID(int=77)
    reader.fetch(13, {ORDERS_ID: {0: batch(2)}})  # no Metadata yet: the id's text
    reader.metadata(12, {"orders": ORDERS_ID})
    reader.fetch(13, {ORDERS_ID: {0: batch(3)}, unknown: {0: batch(1)}})
    text = exposition(stats)
    assert value(text, "kproxy_topic_records_total", topic=str(ORDERS_ID), direction="fetch") == 2
    assert value(text, "kproxy_topic_records_total", topic="orders", direction="fetch") == 3
    assert value(text, "kproxy_topic_records_total", topic=str(unknown), direction="fetch") == 1


def test_produce_v13_topics_by_id_too() -> None:
    stats = labelled()
    app = Connection(stats, "app-1")
    app.metadata(12, {"orders": ORDERS_ID})
    app.produce(13, {"orders": {0: batch(4)}})
    text = exposition(stats)
    assert value(text, "kproxy_topic_records_total", topic="orders", direction="produce") == 4
    assert value(text, "kproxy_topic_bytes_total", topic="orders", direction="produce") == len(batch(4))


def test_a_frame_whose_records_cannot_be_counted_adds_bytes_but_no_records() -> None:
    stats = labelled()
    app = Connection(stats, "app-1")
    good = batch(2)
    broken = bytearray(batch(3))
    broken[16] = 9  # an unknown magic: unreadable
    app.produce(7, {"orders": {0: good}, "payments": {0: bytes(broken)}})
    # Legacy (magic 1) records are counted too, compressed ones within the budget.
    legacy = encode_message_set([Record(offset=i, timestamp=5, key=None, value=b"x") for i in range(4)],
                                magic=1, codec=Codec.GZIP)
    app.produce(2, {"orders": {1: legacy}})
    text = exposition(stats)
    assert value(text, "kproxy_topic_bytes_total", topic="orders", direction="produce") == len(good) + len(legacy)
    assert value(text, "kproxy_topic_bytes_total", topic="payments", direction="produce") == len(broken)
    assert value(text, "kproxy_topic_records_total", topic="orders", direction="produce") == 4  # the legacy ones
    assert value(text, "kproxy_topic_records_total", topic="payments", direction="produce") == 0
    assert value(text, "kproxy_client_records_total", client_id="app-1", direction="produce") == 4
    assert stats.records_uncounted["produce"] == 1 and stats.records["produce"] == 4
    # Legacy entries are not v2 batches: no producer batch series for them.
    assert value(text, "kproxy_produce_batches_total", client_id="app-1", compression="gzip", acks="1") is None


def test_a_negative_record_count_is_malformed_not_subtracted() -> None:
    """A v2 batch header whose records_count is negative (never valid: the general walk refuses it)
    once made every reader of headers add it: kproxy_records_total and the topic's records went down."""
    bad = bytearray(batch(2))
    bad[57:61] = (-2**31 + 5).to_bytes(4, "big", signed=True)
    with pytest.raises(CorruptRecordsError):
        count_records(bytes(bad))
    assert one_batch_count(bytes(bad), 0, len(bad)) is None
    assert v2_totals(bytes(bad), 0, len(bad)) == (0, 0, 0)
    stats = labelled()
    app = Connection(stats, "app-1")
    app.produce(9, {"orders": {0: bytes(bad)}, "payments": {0: batch(3)}})
    unlabelled = TrafficStats()
    Connection(unlabelled, "app-1").produce(9, {"orders": {0: bytes(bad)}})
    text = exposition(stats)
    assert value(text, "kproxy_topic_records_total", topic="orders", direction="produce") == 0
    assert value(text, "kproxy_topic_records_total", topic="payments", direction="produce") == 0
    assert value(text, "kproxy_topic_bytes_total", topic="orders", direction="produce") == len(bad)
    assert stats.records_uncounted["produce"] == 1 and "produce" not in stats.records
    assert unlabelled.records_uncounted["produce"] == 1 and "produce" not in unlabelled.records


# -- client software --------------------------------------------------------------------------------------
def test_client_info_counts_open_connections_by_the_software_they_named() -> None:
    stats = labelled()
    a, b, old = Connection(stats, "app-1"), Connection(stats, "app-1"), Connection(stats, "legacy")
    a.api_versions(3, "librdkafka", "2.3.0")
    b.api_versions(4, "librdkafka", "2.3.0")
    old.api_versions(2, "", "")  # before KIP-511: nothing said, not counted
    info = {(("client_id", "app-1"), ("software_name", "librdkafka"), ("software_version", "2.3.0")): 2}
    assert series(exposition(stats), "kproxy_client_info") == info
    b.api_versions(3, "librdkafka", "2.4.0")  # said again: the last one counts
    a.close()
    assert series(exposition(stats), "kproxy_client_info") == {
        (("client_id", "app-1"), ("software_name", "librdkafka"), ("software_version", "2.4.0")): 1}
    b.close()
    b.close()  # closing twice takes nothing more back
    assert series(exposition(stats), "kproxy_client_info") == {}


def test_the_same_api_versions_again_is_not_decoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client repeating its ApiVersions on a connection (correlation ids aside, the same bytes) costs a
    comparison, not a decode; anything else said is read."""
    decoded: list[int] = []
    real = Exchange.request_body

    def counting(self: Exchange) -> dict[str, Any]:
        decoded.append(self.api_version)
        return real(self)

    monkeypatch.setattr(Exchange, "request_body", counting)
    stats = labelled()
    conn = Connection(stats, "app-1")
    for _ in range(3):
        conn.api_versions(3, "librdkafka", "2.3.0")
    assert decoded == [3]
    conn.api_versions(4, "librdkafka", "2.3.0")
    conn.api_versions(4, "librdkafka", "2.4.0")
    assert decoded == [3, 4, 4]
    assert series(exposition(stats), "kproxy_client_info") == {
        (("client_id", "app-1"), ("software_name", "librdkafka"), ("software_version", "2.4.0")): 1}


# -- bounded whatever clients send ------------------------------------------------------------------------
def test_100000_topics_client_ids_and_software_names_leave_metrics_under_1_mb() -> None:
    stats = labelled()  # label_cap: its default, 100
    one = batch(1)
    n = 100_000
    app = Connection(stats, "app")
    for i in range(0, n, 1000):  # 1,000 topics per request: 100,000 topic names in all
        app.produce(9, {f"topic-{i + j}-{'x' * 40}": {0: one} for j in range(1000)})
        app.fetch(12, {f"fetched-{i + j}": {0: one} for j in range(1000)})
    # A connection per client id, each naming software of its own: the frames are built once, each
    # connection's client id and software name and version written over the template's.
    hello = request_frame(API_VERSIONS, 3, 1, client_id="client-000000", client_software_name="sw-000000",
                          client_software_version="000000.0")
    produce = request_frame(PRODUCE, 9, 2, client_id="client-000000", acks=1, timeout_ms=1000, topic_data=[
        {"name": "orders", "partition_data": [{"index": 0, "records": one}]}])
    answers = (response_frame(API_VERSIONS, 3, 1, error_code=0, api_keys=[])
               + response_frame(PRODUCE, 9, 2, responses=[
                   {"name": "orders", "partition_responses": [{"index": 0, "error_code": 0}]}]))
    for i in range(n):
        conn = Connection(stats)
        tag = b"%06d" % i
        conn.session.receive_client(hello.replace(b"000000", tag) + produce.replace(b"000000", tag))
        conn.session.receive_upstream(answers)
        conn.session.report()
    text = exposition(stats)
    size = len(text.encode())
    assert size < 1_000_000, f"/metrics is {size} bytes"
    for name, label in (("kproxy_topic_bytes_total", "topic"), ("kproxy_client_bytes_total", "client_id"),
                        ("kproxy_produce_batches_total", "client_id"), ("kproxy_client_info", "client_id")):
        values = {dict(key)[label] for key in series(text, name)}
        assert len(values) <= 101 and "other" in values, (name, len(values))
    assert len(series(text, "kproxy_client_info")) <= 2 * 100 + 1
    # Nothing counted was lost to the folding.
    assert sum(series(text, "kproxy_topic_records_total").values()) == 2 * n + n
    assert sum(v for k, v in series(text, "kproxy_client_info").items()) == n
    # The hot path's caches are bounded too.
    traffic = stats.labelled
    assert all(len(cache) <= 100 + CACHE_SLACK for cache in traffic._topic_cache)
    assert len(traffic._client_cache) <= 100 + CACHE_SLACK


def test_with_the_labels_off_nothing_of_it_is_counted() -> None:
    stats = TrafficStats()
    app = Connection(stats, "app-1")
    app.api_versions(3, "librdkafka", "2.3.0")
    app.produce(9, {"orders": {0: batch(3, Codec.GZIP)}})
    app.fetch(12, {"orders": {0: batch(3)}})
    text = exposition(stats)
    for name in ("kproxy_topic_bytes_total", "kproxy_topic_records_total", "kproxy_client_bytes_total",
                 "kproxy_client_records_total", "kproxy_produce_batches_total", "kproxy_produce_batch_bytes_count",
                 "kproxy_client_info"):
        assert not series(text, name), name
    assert stats.records == {"produce": 3, "fetch": 3}


# -- any bytes ----------------------------------------------------------------------------------------------
def _mutated(frame: bytes, at: int, byte: int, cut: int) -> bytes:
    """``frame`` with one byte of its body changed and ``cut`` bytes taken off its end (the size
    prefix kept as it was: the session reads the frame it says, or waits for the rest)."""
    body = bytearray(frame)
    at = 8 + at % max(1, len(body) - 8)
    body[at] = byte
    return bytes(body[:max(8, len(body) - cut)])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(at=st.integers(0, 10_000), byte=st.integers(0, 255), cut=st.sampled_from([0, 0, 0, 1, 7, 40]),
       version=st.sampled_from([3, 7, 9, 13]), which=st.sampled_from(["produce", "fetch"]))
def test_changed_bytes_never_break_the_count_and_every_series_agrees(at: int, byte: int, cut: int, version: int,
                                                                     which: str) -> None:
    """Produce requests and Fetch answers with a byte changed or cut short, through a Session: nothing
    raises, and what is counted adds up: the records by topic, by client and kproxy_records_total are
    one count; bytes by topic and by client too."""
    stats = labelled()
    conn = Connection(stats, "app-1")
    records = batch(3) + batch(2, Codec.GZIP, base=3)
    if which == "produce":
        key = "topic_id" if version >= 13 else "name"
        request = request_frame(PRODUCE, version, 1, client_id="app-1", acks=1, timeout_ms=1000, topic_data=[
            {key: ORDERS_ID if version >= 13 else "orders", "partition_data": [{"index": 0, "records": records},
                                                                               {"index": 1, "records": batch(1)}]}])
        conn.session.receive_client(_mutated(request, at, byte, cut))
    else:
        version = 12 if version < 13 else 13
        key = "topic_id" if version >= 13 else "topic"
        topic = ORDERS_ID if version >= 13 else "orders"
        conn.session.receive_client(request_frame(FETCH, version, 1, client_id="app-1", max_wait_ms=0, topics=[
            {key: topic, "partitions": [{"partition": 0, "fetch_offset": 0}]}]))
        answer = response_frame(FETCH, version, 1, responses=[{key: topic, "partitions": [
            {"partition_index": p, "error_code": 0, "high_watermark": 9, "records": r}
            for p, r in ((0, records), (1, batch(1)))]}])
        conn.session.receive_upstream(_mutated(answer, at, byte, cut))
    conn.session.report()
    conn.close()
    text = exposition(stats)
    counted = stats.records.get(which, 0)
    by_topic = {dict(k)["direction"]: 0.0 for k in series(text, "kproxy_topic_records_total")}
    for k, v in series(text, "kproxy_topic_records_total").items():
        by_topic[dict(k)["direction"]] += v
    assert by_topic.get(which, 0) == counted
    assert sum(v for k, v in series(text, "kproxy_client_records_total").items()
               if dict(k)["direction"] == which) == counted
    assert sum(v for k, v in series(text, "kproxy_topic_bytes_total").items()) == sum(
        v for k, v in series(text, "kproxy_client_bytes_total").items())
