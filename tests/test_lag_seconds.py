"""Consumer lag in seconds and the time to catch up (kproxy/metrics/consumer_lag.py, lag_exposition.py), sans-IO.

Produce frames whose v2 batches carry known max timestamps go through a real
:class:`~kproxy.proxy.session.Session` with the metrics' observer (tests/test_lag_metrics.py's
``Proxy``), on a clock the test moves:

* a records range's write time is the latest max timestamp of its whole v2 batches (none: -1);
* lag seconds are the age, at the view's wall-clock time, of the write time of the first offset the
  group has not committed: the append holding it, else the nearest one kept; 0 when caught up;
  absent without any write time seen;
* a partition keeps at most WRITTEN_POINTS write times, at most one a second, thinned so that an old
  offset's age stays close; a log that restarts lower starts over; an answer that comes late is
  not taken; the table stays within its byte bound under ever new topics, evicting the oldest;
* Fetch answers date offsets too (their batches' first and last offsets and max timestamp): a
  partition written around kproxy and read through it has lag seconds; bounded alike;
* catch-up seconds: lag over (consume rate - produce rate), rates over RATE_WINDOW at least;
  absent while the group does not gain; 0 when caught up.
"""

from __future__ import annotations

import contextlib
import tracemalloc

import pytest

from kproxy.metrics.consumer_lag import RATE_WINDOW, WRITTEN_POINTS, ConsumerLag, written_at
from kproxy.metrics.lag_exposition import lag_series
from kproxy.protocol.compression import Codec
from kproxy.protocol.errors import CorruptRecordsError
from kproxy.protocol.offset_reads import batches_written, written_spans
from kproxy.protocol.records import (
    Record,
    count_records,
    encode_batch_v2,
    encode_message_set,
    iter_batches,
    v2_dated,
    v2_max_timestamp,
)
from tests.test_lag_metrics import FETCH, PRODUCE, TOPIC_ID, Proxy

EPOCH = 1_800_000_000_000  # ms: the write times' origin here


def produce(proxy: Proxy, base: int, n: int, written: int, *, partition: int = 0, topic: str = "orders") -> None:
    """A Produce of ``n`` records to ``partition`` in one v2 batch whose max timestamp is ``written`` (ms),
    answered with ``base``."""
    records = [Record(offset=i, timestamp=written - (n - 1 - i) * 10, key=None, value=b"v") for i in range(n)]
    proxy.exchange(PRODUCE, 9, {"acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": topic, "topic_id": TOPIC_ID, "partition_data": [{"index": partition,
                                                                  "records": encode_batch_v2(records)}]}]},
        {"responses": [{"name": topic, "topic_id": TOPIC_ID, "partition_responses": [
            {"index": partition, "error_code": 0, "base_offset": base}]}]})


def steady(proxy: Proxy, seconds: int, per_second: int = 10, start: int = 0) -> None:
    """A producer writing ``per_second`` records a second for ``seconds`` seconds from offset ``start``,
    in batches of a tenth of a second (kproxy's clock and the write times move together)."""
    for tick in range(seconds * 10):
        produce(proxy, start + tick * per_second // 10, per_second // 10, EPOCH + tick * 100 + 100)
        proxy.clock.now += 0.1


def wall(proxy: Proxy) -> float:
    """The wall-clock time matching the proxy's clock (the write times' origin at clock 1000.0)."""
    return EPOCH / 1000 + proxy.clock.now - 1000.0


def test_lag_seconds_are_the_age_of_the_first_record_not_committed() -> None:
    proxy = Proxy()
    steady(proxy, 10)  # offsets 0..99, offset o written at about EPOCH + o * 100 ms
    proxy.commit(8, "billing", "orders", {0: 30})
    assert proxy.lag is not None
    view = proxy.lag.view(proxy.clock.now, wall(proxy))
    assert view.lag == {("billing", "orders", 0): 70}
    # Offset 30 was written 3.1 s after EPOCH (kept to the second: the nearest write time kproxy
    # kept, within a second of it); the view is 10 s after EPOCH.
    assert abs(view.lag_seconds[("billing", "orders", 0)] - (10 - 3.1)) <= 1.0
    # Time passes, nothing is consumed: it grows second for second.
    proxy.clock.now += 5
    later = proxy.lag.view(proxy.clock.now, wall(proxy)).lag_seconds[("billing", "orders", 0)]
    assert later - view.lag_seconds[("billing", "orders", 0)] == 5
    # Caught up: 0; a group on a partition whose writes kproxy never saw: no value.
    proxy.commit(8, "billing", "orders", {0: 100})
    proxy.fetch(11, "payments", {0: 50})
    proxy.commit(8, "billing", "payments", {0: 10})
    view = proxy.lag.view(proxy.clock.now, wall(proxy))
    assert view.lag_seconds == {("billing", "orders", 0): 0.0}
    assert view.lag[("billing", "payments", 0)] == 40


def test_the_write_time_is_the_append_holding_the_offset_or_the_nearest() -> None:
    points = [10, 19, 5000, 40, 49, 8000, 100, 100, 9000]
    assert [written_at(points, o) for o in (10, 15, 19, 40, 100)] == [5000, 5000, 5000, 8000, 9000]
    # Between two: the nearer in offsets (the earlier on a tie); outside: the first or the last.
    assert [written_at(points, o) for o in (20, 29, 30, 39, 60, 90, 0, 500)] == [
        5000, 5000, 8000, 8000, 8000, 9000, 5000, 9000]


def test_a_records_range_gives_the_latest_max_timestamp_of_its_whole_v2_batches() -> None:
    def batch(*times: int) -> bytes:
        return encode_batch_v2([Record(offset=i, timestamp=t, key=None, value=b"v") for i, t in enumerate(times)])

    two = batch(5000, 7000) + batch(6000)
    assert v2_max_timestamp(two, 0, len(two)) == 7000
    # A truncated tail (a batch cut short) is not read; a range that opens with none: -1.
    assert v2_max_timestamp(two, 0, len(two) - 1) == 7000
    assert v2_max_timestamp(two, 0, 40) == -1
    legacy = encode_message_set([Record(offset=0, timestamp=9000, key=None, value=b"v")], magic=1)
    assert v2_max_timestamp(legacy, 0, len(legacy)) == -1


def test_one_read_of_each_batch_header_dates_the_batches_and_counts_their_records() -> None:
    """v2_dated: each whole v2 batch's offsets and max timestamp, as the general reader of the headers
    gives them, and the range's records as count_records counts them up to where it stops (a legacy
    tail, a cut batch, a negative count: the count goes on from there, the dates stop at the first
    entry that is no whole v2 batch)."""
    def batch(base: int, *times: int, codec: int = Codec.NONE) -> bytes:
        return encode_batch_v2([Record(offset=base + i, timestamp=t, key=None, value=b"v" * 30)
                                for i, t in enumerate(times)], base_offset=base, codec=codec)

    legacy = encode_message_set([Record(offset=0, timestamp=9000, key=None, value=b"v")], magic=1)
    whole = batch(10, 5000, 7000) + batch(12, 6000, codec=Codec.LZ4) + batch(13, 4000, 4500, 4100)
    negative = bytearray(batch(20, 8000))
    negative[57:61] = (-1).to_bytes(4, "big", signed=True)
    cases = {"whole": whole, "cut": whole[:-5], "legacy tail": whole + legacy, "legacy": legacy + whole,
             "negative count": whole + bytes(negative) + batch(21, 8100), "short": whole[:40]}
    for label, data in cases.items():
        for start in (0, 3):
            padded = b"\0" * start + bytes(data)
            dates: list[tuple[int, int, int]] = []
            records, stop = v2_dated(padded, start, len(padded), dates)
            headers = []
            with contextlib.suppress(CorruptRecordsError):  # (the general reader refuses a negative count)
                for info in iter_batches(memoryview(padded)[start:]):
                    if info.magic != 2 or info.offset + info.length > len(padded) - start:
                        break
                    headers.append((info.base_offset, info.base_offset + info.last_offset_delta,
                                    info.max_timestamp))
            if label == "negative count":
                headers += [(20, 20, 8000), (21, 21, 8100)]  # dated on past the count's stop
            assert dates == headers, label
            expected_stop = {"whole": len(padded), "cut": start + len(whole) - len(batch(13, 4000, 4500, 4100)),
                             "legacy tail": start + len(whole), "legacy": start, "short": start,
                             "negative count": start + len(whole)}[label]
            assert stop == expected_stop, label
            assert records == count_records(memoryview(padded)[start:stop]), label
    assert batches_written(whole, 0, len(whole), 2) == [(10, 11, 7000), (12, 15, 6000)]
    assert written_spans([(1, 2, 5), (3, 3, 9), (4, 8, 7)], 8) == [(1, 2, 5), (3, 3, 9), (4, 8, 7)]


def test_a_partition_keeps_a_bounded_number_of_write_times_spread_over_its_history() -> None:
    proxy = Proxy(stale_after=7200)
    for second in range(3600):  # an hour of 10 records a second: offset o written at about EPOCH + o * 100 ms
        produce(proxy, second * 10, 10, EPOCH + second * 1000 + 1000)
        proxy.clock.now += 1
    lag = proxy.lag
    assert lag is not None
    (points, _), = lag.written.values()
    assert len(points) == 3 * WRITTEN_POINTS
    assert points[0] == 0 and points[-3] >= 35_990  # the first append and a recent one kept
    # An offset of any age: its lag in seconds within a quarter of its age (denser where it is recent).
    for committed in (35_900, 35_000, 30_000, 18_000, 6_000, 100):
        proxy.commit(8, "g", "orders", {0: committed})
        seconds = lag.view(proxy.clock.now, wall(proxy)).lag_seconds[("g", "orders", 0)]
        age = 3600 - committed / 10
        assert abs(seconds - age) <= max(1.0, 0.25 * age), (committed, seconds, age)


def test_a_late_answer_is_not_taken_and_a_log_that_restarts_lower_starts_over() -> None:
    proxy = Proxy()
    lag = proxy.lag
    assert lag is not None
    produce(proxy, 100, 10, EPOCH)
    proxy.clock.now += 1
    produce(proxy, 110, 10, EPOCH + 1000)
    proxy.clock.now += 1
    produce(proxy, 105, 1, EPOCH + 5000)  # offsets known already: another producer's answer, late
    assert list(lag.written[("orders", 0)][0]) == [100, 109, EPOCH, 110, 119, EPOCH + 1000]
    proxy.clock.now += 1
    produce(proxy, 0, 5, EPOCH + 9000)  # below every kept offset: the topic was made again
    assert list(lag.written[("orders", 0)][0]) == [0, 4, EPOCH + 9000]


def test_the_write_times_stay_within_their_byte_bound_under_ever_new_topics() -> None:
    budget = 256 * 1024
    lag = ConsumerLag(stale_after=60, max_bytes=budget)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(3000):
            key = (f"{i:08d}" + "t" * 240, i % 7)
            for j in range(WRITTEN_POINTS + 4):  # each partition full (its points thinned past the cap)
                lag._write(key, j * 10, j * 10 + 9, EPOCH + j * 1000, 1000.0)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0 < lag.written_bytes <= budget
    assert held < 2 * budget, f"{held} bytes held"
    assert 100 < len(lag.written) < 3000
    assert lag.evicted["write_time"] == 3000 - len(lag.written)
    assert all(len(points) == 3 * WRITTEN_POINTS for points, _ in lag.written.values())
    lag.watermark([], 1061.0)  # an expiry pass: everything is stale
    assert lag.written_bytes == 0 and not lag.written


def test_the_catchup_time_is_the_lag_over_what_the_group_gains_a_second() -> None:
    proxy = Proxy()
    lag = proxy.lag
    assert lag is not None

    def series() -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
        found = lag_series(lag.view(proxy.clock.now, wall(proxy)), 100, True)
        return found.catchup, found.lag_seconds

    # Produced at 10 a second; the group commits 30 a second from offset 0, every half second.
    offset = committed = 0
    for tick in range(2 * int(RATE_WINDOW) * 10):
        produce(proxy, offset, 1, EPOCH + tick * 100 + 100)
        offset += 1
        if tick % 5 == 4:
            committed = min(offset, committed + 15)
            proxy.commit(8, "g", "orders", {0: committed})
        proxy.clock.now += 0.1
    # Kept up (it can consume no faster than the producer writes): 0 to catch up.
    proxy.commit(8, "g", "orders", {0: offset})
    committed = offset
    assert series() == ({("g", "orders"): 0.0}, {("g", "orders"): 0.0})
    # The group stopped for 30 s; then 30 a second against the producer's 10.
    for _ in range(300):
        produce(proxy, offset, 1, EPOCH + int((proxy.clock.now - 1000) * 1000))
        offset += 1
        proxy.clock.now += 0.1
    assert not series()[0]  # stopped: nothing to catch up at
    assert abs(series()[1][("g", "orders")] - 30) <= 3  # (the write times kept thinned: within a tenth)
    for tick in range(2 * int(RATE_WINDOW) * 10):
        produce(proxy, offset, 1, EPOCH + int((proxy.clock.now - 1000) * 1000))
        offset += 1
        if tick % 5 == 4:
            committed += 15
            proxy.commit(8, "g", "orders", {0: committed})
        proxy.clock.now += 0.1
    catchup = series()[0][("g", "orders")]
    behind = offset - committed
    assert behind == 100 and abs(catchup - behind / (30 - 10)) <= 0.1 * behind / 20, (catchup, behind)
    # Caught up: 0.
    proxy.commit(8, "g", "orders", {0: offset})
    assert series() == ({("g", "orders"): 0.0}, {("g", "orders"): 0.0})


def fetched(proxy: Proxy, topic: str, mark: int, base: int, n: int, written: int, version: int = 12) -> None:
    """A Fetch answer for partition 0 of ``topic`` (watermark ``mark``) with ``n`` records from ``base`` in
    one v2 batch whose records were written a millisecond apart, the last at ``written`` (ms)."""
    records = [Record(offset=base + i, timestamp=written - (n - 1 - i), key=None, value=b"v") for i in range(n)]
    proxy.exchange(FETCH, version, {}, {"responses": [{"topic": topic, "topic_id": TOPIC_ID, "partitions": [
        {"partition_index": 0, "high_watermark": mark, "records": encode_batch_v2(records, base_offset=base)}]}]})


def test_fetch_answers_date_the_offsets_of_a_partition_written_around_kproxy() -> None:
    """No Produce through kproxy: the Fetch answers of a consumer reading through it date the offsets
    (their batches' first and last offsets, their max timestamp), so a stopped group gets lag seconds."""
    proxy = Proxy()
    for second in range(10):  # another group reads 10 records a second as they are written
        fetched(proxy, "orders", 10 * second + 10, 10 * second, 10, EPOCH + 1000 * second + 900)
        proxy.clock.now += 1.0
    proxy.commit(8, "billing", "orders", {0: 35})
    assert proxy.lag is not None
    view = proxy.lag.view(proxy.clock.now, wall(proxy))
    assert view.lag == {("billing", "orders", 0): 100 - 35}
    # Offset 35 is in the batch of offsets 30 to 39, whose latest record was written at EPOCH + 3.9 s.
    assert view.lag_seconds[("billing", "orders", 0)] == pytest.approx(10 - 3.9)


def test_fetch_write_times_stay_within_the_key_bound_under_ever_new_topics() -> None:
    proxy = Proxy(max_keys=50)
    for i in range(400):
        fetched(proxy, f"topic-{i}", 10, 0, 10, EPOCH + i)
    assert proxy.lag is not None
    assert len(proxy.lag.written) == 50 and proxy.lag.evicted["write_time"] == 350


def test_a_consumer_behind_has_the_batch_headers_read_at_most_once_a_second() -> None:
    """A Fetch answer of offsets already dated (a group behind re-reading them) counts as the second's
    look at the partition: a newer answer within that second is not read, one after it is."""
    proxy = Proxy()
    fetched(proxy, "orders", 10, 0, 10, EPOCH + 900)
    proxy.clock.now += 2.0
    fetched(proxy, "orders", 10, 0, 10, EPOCH + 900)  # known offsets: nothing to learn
    proxy.clock.now += 0.5
    fetched(proxy, "orders", 20, 10, 10, EPOCH + 2400)  # within a second of the last look: not read
    assert proxy.lag is not None
    assert list(proxy.lag.written[("orders", 0)][0]) == [0, 9, EPOCH + 900]
    proxy.clock.now += 0.6
    fetched(proxy, "orders", 30, 20, 10, EPOCH + 3000)
    assert list(proxy.lag.written[("orders", 0)][0]) == [0, 9, EPOCH + 900, 20, 29, EPOCH + 3000]
