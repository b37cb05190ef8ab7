"""The interpreter's switch interval has one owner (kproxy.offloop.short_switch_interval), whose
blocks nest and overlap across threads: the interval kproxy found comes back when the last leaves."""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kproxy.offloop import SHORT_SWITCH_INTERVAL, off_loop_build, short_switch_interval
from kproxy.protocol.frame_builder import request_frame, response_frame
from tests.test_capture_observer import Harness

METADATA = 3


@pytest.fixture(autouse=True)
def interval() -> Iterator[float]:
    """The interval every test starts from (5 ms, the interpreter's own), put back after."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield 0.005
    sys.setswitchinterval(before)


def _in_thread(target: Any) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_overlapping_blocks_in_two_threads_restore_the_first_interval_when_the_last_leaves(interval: float) -> None:
    entered, leave = threading.Event(), threading.Event()

    def first() -> None:
        with short_switch_interval():
            entered.set()
            assert leave.wait(10)

    thread = _in_thread(first)
    assert entered.wait(10)
    assert sys.getswitchinterval() == SHORT_SWITCH_INTERVAL
    with short_switch_interval():  # entered second, left first
        with short_switch_interval():  # nested
            pass
        assert sys.getswitchinterval() == SHORT_SWITCH_INTERVAL
    assert sys.getswitchinterval() == SHORT_SWITCH_INTERVAL, "the first thread is still inside"
    leave.set()
    thread.join(10)
    assert sys.getswitchinterval() == interval


def test_a_block_never_raises_an_interval_set_lower_already() -> None:
    sys.setswitchinterval(0.0001)
    low = sys.getswitchinterval()  # (kept in microseconds: read back, not compared with 0.0001)
    with short_switch_interval():
        assert sys.getswitchinterval() == low
    assert sys.getswitchinterval() == low


def test_a_block_left_by_an_exception_gives_the_interval_back(interval: float) -> None:
    with pytest.raises(RuntimeError), short_switch_interval():
        raise RuntimeError("the work failed")
    assert sys.getswitchinterval() == interval


def _huge_metadata_answer() -> bytes:
    topics = [{"name": f"t-{t:03d}", "topic_id": uuid.UUID(int=t + 1), "partitions": [
        {"partition_index": p, "leader_id": 1, "replica_nodes": [1, 2], "isr_nodes": [1, 2], "error_code": 0}
        for p in range(8)]} for t in range(400)]
    return response_frame(METADATA, 12, 1, brokers=[], cluster_id="c", controller_id=1, topics=topics)


def test_a_huge_capture_read_and_a_rule_build_overlapping_leave_the_interval_they_found(
        monkeypatch: pytest.MonkeyPatch, interval: float) -> None:
    """The capture's writer thread reads a huge Metadata answer in its turn (the interval cut, as
    CaptureWriter._run cuts it) while a rule set is built on another thread (cut too); the read
    ends first, the build after. The build
    still runs with the short interval once the read is done, and the 5 ms found at first is what
    stays after both."""
    reading, finish_read = threading.Event(), threading.Event()
    h = Harness()
    # The read's first step: its topic ids learnt (the builder's TopicIdNames, an interpreted object in
    # every build: patched on the instance).
    original = h.builder.topics.learn_metadata

    def slow(*args: Any) -> Any:
        reading.set()
        assert finish_read.wait(10)
        return original(*args)

    monkeypatch.setattr(h.builder.topics, "learn_metadata", slow)
    answer = _huge_metadata_answer()
    rows: list[dict[str, Any]] = []

    def turn() -> None:
        with short_switch_interval():
            rows.append(h.exchange(request_frame(METADATA, 12, 1, topics=None), answer))

    writer = _in_thread(turn)
    assert reading.wait(10)
    assert sys.getswitchinterval() == SHORT_SWITCH_INTERVAL
    with off_loop_build():
        finish_read.set()
        writer.join(10)
        assert rows and rows[0]["api_key"] == METADATA
        assert sys.getswitchinterval() == SHORT_SWITCH_INTERVAL, "the build still runs: the interval stays cut"
    assert sys.getswitchinterval() == interval
