"""Fuzz target of consumer lag: a sans-IO session with the metrics' observer and a lag tracker.

Inputs are the session target's (tests/fuzz/targets/session.py), with the side byte's upper seven
bits read as seconds the clock moves before the frame (bit 0 stays the side): values go stale,
groups are sighted again or not, the tables are cut of their stale front. The tracker is made with
small bounds (a few keys, a few KiB), so eviction by count and by bytes is reached at once.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from tests.fuzz.targets.registry import target
from tests.fuzz.targets.session import session_input

_OP = struct.Struct(">BH")  # as the session target's: side (and here seconds), payload length
MAX_KEYS = 8
MAX_BYTES = 4096
STALE_AFTER = 60.0
TOPIC_ID = "00000000-0000-0000-0000-000000000abc"


def _ops(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(side, seconds the clock moves first, frame payload) of each frame of an input."""
    pos = 0
    while len(data) - pos >= _OP.size:
        side, n = _OP.unpack_from(data, pos)
        pos += _OP.size
        yield side & 1, side >> 1, data[pos : pos + n]
        pos += n


def _seeds() -> Iterator[bytes]:
    import uuid

    from kproxy.protocol.frame_builder import request_frame, response_frame

    topic_id = uuid.UUID(TOPIC_ID)

    def pair(key: int, version: int, cid: int, request: dict[str, Any], answer: dict[str, Any] | None,
             seconds: int = 0) -> list[tuple[int, bytes]]:
        out = [(seconds << 1, request_frame(key, version, cid, **request)[4:])]
        if answer is not None:
            out.append((1, response_frame(key, version, cid, **answer)[4:]))
        return out

    partitions: list[dict[str, Any]] = [{"partition_index": 0, "committed_offset": 5},
                                        {"partition_index": 1, "committed_offset": 7}]
    commit: dict[str, Any] = {"group_id": "billing", "topics": [
        {"name": "orders", "topic_id": topic_id, "partitions": partitions}]}
    accepted: dict[str, Any] = {"topics": [{"name": "orders", "topic_id": topic_id, "partitions": [
        {"partition_index": 0, "error_code": 0}, {"partition_index": 1, "error_code": 22}]}]}
    fetched: dict[str, Any] = {"responses": [{"topic": "orders", "topic_id": topic_id, "partitions": [
        {"partition_index": 0, "high_watermark": 40}, {"partition_index": 1, "high_watermark": 9}]}]}
    group: dict[str, Any] = {"group_id": "billing", "member_id": "m-1", "generation_id": 1}
    ops: list[tuple[int, bytes]] = []
    ops += pair(3, 12, 1, {}, {"topics": [{"name": "orders", "topic_id": topic_id}]})
    ops += pair(11, 9, 2, {**group, "protocol_type": "consumer", "protocols": []}, {"error_code": 0})
    ops += pair(14, 5, 3, group, {"error_code": 0})
    ops += pair(8, 8, 4, commit, accepted)
    ops += pair(8, 9, 5, commit, accepted, seconds=30)
    ops += pair(1, 11, 6, {}, fetched)
    ops += pair(1, 13, 7, {}, fetched, seconds=20)
    ops += pair(12, 4, 8, group, {"error_code": 0}, seconds=50)
    ops += pair(12, 4, 9, {**group, "group_id": "probe"}, {"error_code": 25}, seconds=50)
    ops += pair(9, 8, 10, {"groups": [{"group_id": "billing"}]}, {"groups": [
        {"group_id": "billing", "topics": [{"name": "orders", "partitions": [
            {"partition_index": 0, "committed_offset": 6}]}]},
        {"group_id": "gone", "error_code": 16, "topics": []}]})
    ops += pair(9, 7, 11, {"group_id": "billing", "topics": [{"name": "orders", "partition_indexes": [0]}]},
                {"topics": [{"name": "orders", "partitions": [{"partition_index": 0, "committed_offset": 6}]}]})
    ops += pair(2, 7, 12, {"isolation_level": 0, "topics": [{"name": "orders", "partitions": [
        {"partition_index": 0, "timestamp": -1}]}]},
        {"topics": [{"name": "orders", "partitions": [{"partition_index": 0, "offset": 44}]}]})
    yield session_input(ops)
    # Ever new long group ids, each commit accepted: eviction by bytes, ids cut.
    many: list[tuple[int, bytes]] = []
    for i in range(12):
        long_commit = {**commit, "group_id": f"g{i}-" + "x" * 400}
        many += pair(8, 8, 20 + i, long_commit, accepted, seconds=7)
    yield session_input(many)
    yield session_input([*ops[:4], (127 << 1, ops[4][1])])  # a request two minutes on, never answered


@target(_seeds, warm=True)
def fuzz_consumer_lag(data: bytes) -> None:
    """A sans-IO Session whose observer feeds a ConsumerLag (small bounds), frames from both sides,
    the clock moving as the input says: never an exception; after each frame every table within
    its key and byte bounds, each table's byte count what its keys cost, no id past the cut; the
    view and its series made without error, no lag below 0."""
    from kproxy.metrics.consumer_lag import (
        MAX_ID_LENGTH,
        ConsumerLag,
        _committed_cost,
        _group_cost,
        _watermark_cost,
        _written_cost,
    )
    from kproxy.metrics.lag_exposition import lag_series
    from kproxy.metrics.stats import StatsOptions, TrafficStats
    from kproxy.metrics.traffic_observer import MetricsObserver
    from kproxy.protocol.framing import frame
    from kproxy.proxy.address_rewrite import ResponseRewriter
    from kproxy.proxy.addresses import AddressMap
    from kproxy.proxy.commands import CloseConnection
    from kproxy.proxy.session import Session

    now = [1000.0]
    lag = ConsumerLag(stale_after=STALE_AFTER, max_keys=MAX_KEYS, max_bytes=MAX_BYTES)
    observer = MetricsObserver(TrafficStats(StatsOptions(consumer_lag=True)), lag).for_broker(None)
    session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), max_in_flight=64,
                      clock=lambda: now[0], observer=observer)
    for side, seconds, payload in _ops(data):
        now[0] += seconds
        commands = session.receive_client(frame(payload)) if side == 0 else session.receive_upstream(frame(payload))
        session.report()
        tables = ((len(lag.committed), lag.committed_bytes, sum(_committed_cost(k) for k in lag.committed)),
                  (len(lag.watermarks), lag.watermark_bytes, sum(_watermark_cost(k) for k in lag.watermarks)),
                  (len(lag.groups), lag.group_bytes, sum(_group_cost(k) for k in lag.groups)),
                  (len(lag.written), lag.written_bytes, sum(_written_cost(k) for k in lag.written)))
        for keys, counted, cost in tables:
            assert keys <= MAX_KEYS and counted == cost <= MAX_BYTES, tables
        for group, topic, _ in lag.committed:
            assert len(group) <= MAX_ID_LENGTH and (not isinstance(topic, str) or len(topic) <= MAX_ID_LENGTH)
        for topic, _ in lag.watermarks:
            assert not isinstance(topic, str) or len(topic) <= MAX_ID_LENGTH
        assert all(len(group) <= MAX_ID_LENGTH for group in lag.groups)
        view = lag.view(now[0])
        assert all(n >= 0 for n in view.lag.values()), view.lag
        lag_series(view, 3, True)
        if any(isinstance(c, CloseConnection) for c in commands):
            return  # the server closes the connection: nothing more is read
