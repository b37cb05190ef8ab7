"""Hostile group ids against consumer lag: a real kproxy (its default configuration, consumer lag on)
in front of the real broker (Tansu), driven over loopback raw sockets.

Any client that can connect names whatever groups it likes: 20,000 Heartbeats, then 10,000
OffsetCommits, each of a distinct group id of 32 KiB (the protocol's longest string). The
coordinator refuses every Heartbeat (no such member) and accepts every commit (a group without
members may commit, as a consumer assigning its own partitions does). What kproxy keeps of them is
what the broker confirmed, ids cut: the tracker holds less than its byte bounds (the bounds
themselves: tests/test_lag_metrics.py), and the process keeps within 64 MiB of what it held before.
"""

from __future__ import annotations

import gc
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from kproxy.metrics.consumer_lag import ConsumerLag
from kproxy.protocol.frame_builder import request_frame
from kproxy.protocol.framing import FrameSplitter
from kproxy.testing import Broker, run_tansu, running_proxy
from tests.support.e2e import create_topic, unique
from tests.support.resilience import vm_rss_kb

MiB = 1024 * 1024
HEARTBEAT, OFFSET_COMMIT = 12, 8
HEARTBEATS, COMMITS = 20_000, 10_000
ID_CHARS = 32767  # a group id as long as a Kafka string can be
WINDOW = 64  # requests in flight on the connection
KEPT_CHARS = 255  # the longest id the tracker keys (kproxy.metrics.consumer_lag.MAX_ID_LENGTH)


@pytest.fixture(scope="module")
def tansu() -> Iterator[Broker]:
    """A broker of this module's own, not the session's: the 10,000 groups of 32 KiB ids committed
    here stay in Tansu's memory, and every later ListGroups of the session's broker would answer
    with all of them (the soak's admin client was disconnected by it)."""
    with run_tansu() as broker:
        yield broker


@pytest.fixture
def topic(tansu: Broker) -> str:
    name = unique("lag-hostile")
    create_topic(tansu.bootstrap, name, partitions=1)
    return name


def group_id(kind: str, i: int) -> str:
    """A distinct 32 KiB group id: the number first, so every one differs early (and late)."""
    head = f"{kind}-{i:06d}-"
    return head + "x" * (ID_CHARS - len(head))


def exchange_all(port: int, frames: Iterator[bytes], n: int) -> list[bytes]:
    """Send ``n`` request frames over one connection, ``WINDOW`` in flight; the answers' payloads."""
    answers: list[bytes] = []
    splitter = FrameSplitter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sent = 0
        while len(answers) < n:
            while sent < n and sent - len(answers) < WINDOW:
                sock.sendall(next(frames))
                sent += 1
            data = sock.recv(1 << 16)
            assert data, f"kproxy closed the connection after {len(answers)} answers"
            for payload in splitter.split(data)[0]:
                answers.append(bytes(payload[:64]))  # (the codes are near the start; the rest is let go)
    return answers


def tracker_bytes(lag: ConsumerLag) -> int:
    """What the tracker's tables hold, measured: each table, its keys, values and their strings."""
    total = 0
    seen: set[int] = set()

    def size(value: Any) -> int:
        if id(value) in seen:
            return 0
        seen.add(id(value))
        n = sys.getsizeof(value)
        if isinstance(value, tuple):
            n += sum(size(item) for item in value)
        return n

    for table in (lag.committed, lag.watermarks, lag.groups):
        items = list(table.items())
        total += sys.getsizeof(table) + 56 * len(items)  # (the table's per-key link, not in getsizeof)
        for key, value in items:
            total += size(key) + size(value)
    return total


def test_distinct_32_kib_group_ids_keep_the_tracker_within_its_byte_bounds(tansu: Broker, topic: str) -> None:
    with running_proxy(tansu.bootstrap) as proxy:
        server = proxy.server
        assert server is not None and server.lag is not None
        lag = server.lag
        gc.collect()
        rss_before = vm_rss_kb(os.getpid())
        beats = (request_frame(HEARTBEAT, 4, i + 1, group_id=group_id("beat", i), generation_id=1,
                               member_id="m-1") for i in range(HEARTBEATS))
        answers = exchange_all(proxy.port, beats, HEARTBEATS)
        commits = (request_frame(OFFSET_COMMIT, 8, i + 1, group_id=group_id("commit", i),
                                 generation_id_or_member_epoch=-1, member_id="", topics=[
                                     {"name": topic, "partitions": [{"partition_index": 0, "committed_offset": i}]}])
                   for i in range(COMMITS))
        answers += exchange_all(proxy.port, commits, COMMITS)
        gc.collect()
        rss_grown = vm_rss_kb(os.getpid()) - rss_before
        held = proxy.call(lambda: tracker_bytes(lag))
        tables = proxy.call(lambda: (len(lag.groups), len(lag.committed), dict(lag.evicted),
                                     max((len(k[0]) for k in lag.committed), default=0),
                                     {k[0].startswith("beat-") for k in lag.groups}))
    groups, committed, evicted, longest, beat_groups = tables
    print(f"hostile group ids: {HEARTBEATS} Heartbeats and {COMMITS} OffsetCommits of 32 KiB ids: tracker holds "
          f"{held / MiB:.1f} MiB ({groups} groups, {committed} committed offsets, evicted {evicted}), "
          f"test process RSS {rss_grown / 1024:+.0f} MiB")
    assert len(answers) == HEARTBEATS + COMMITS
    assert held < 2 * lag.max_bytes, f"the tracker holds {held / MiB:.1f} MiB"
    assert rss_grown < 64 * 1024, f"RSS grew {rss_grown / 1024:.0f} MiB"
    assert True not in beat_groups, "a Heartbeat the coordinator refused was kept as a sighting"
    assert committed == groups == COMMITS, "each commit the broker accepted, and its group, is kept"
    assert longest == KEPT_CHARS, "... under its id cut"
