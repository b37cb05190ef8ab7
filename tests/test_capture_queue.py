"""kproxy/capture/queue.py: the bounded queue between the event loop and the thread that drains it,
and how that thread is ended (the writer's and the shipper's close)."""

from __future__ import annotations

import logging
import threading

import pytest

from kproxy.capture.queue import CaptureQueue, stop_draining


def test_a_full_queue_drops_and_counts_and_wakes_the_thread_at_a_quarter() -> None:
    wake = threading.Event()
    queue = CaptureQueue(8, 1000, wake)
    assert queue.offer(0) and not wake.is_set()  # one item: not worth a wake
    assert queue.offer(1) and wake.is_set()  # two, a quarter of eight: woken
    wake.clear()
    assert queue.offer(2) and not wake.is_set()  # (woken once at the quarter, not per item after)
    assert queue.offer("big", 1001) is False and queue.full == 1  # over the bytes bound
    assert queue.take(2) == [0, 1] and len(queue) == 1 and queue.offered == 4


def test_stop_draining_lets_the_thread_take_what_was_offered_then_end() -> None:
    wake, stop = threading.Event(), threading.Event()
    queue = CaptureQueue(100, 10_000, wake)
    taken: list[object] = []

    def drain() -> None:
        while True:
            ending = stop.is_set()  # read first, as the writer does: what came before is queued
            taken.extend(queue.take(100))
            if ending:
                return
            wake.wait(5)
            wake.clear()

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    for i in range(3):
        queue.offer(i)
    stop_draining(thread, stop, wake, queue, 5.0)
    assert not thread.is_alive() and taken == [0, 1, 2]
    stop_draining(thread, stop, wake, queue, 5.0)  # ended already: nothing to do


def test_a_thread_that_does_not_end_in_time_is_logged_with_what_is_left(caplog: pytest.LogCaptureFixture) -> None:
    wake, stop, release = threading.Event(), threading.Event(), threading.Event()
    queue = CaptureQueue(100, 10_000, wake)
    thread = threading.Thread(target=release.wait, args=(10,), daemon=True)  # a thread stuck in a write
    thread.start()
    queue.offer("left")
    try:
        with caplog.at_level(logging.WARNING, logger="kproxy.capture"):
            stop_draining(thread, stop, wake, queue, 0.05)
    finally:
        release.set()
        thread.join(5)
    assert stop.is_set() and wake.is_set()
    assert [r.getMessage() for r in caplog.records] == ["event=capture_close_timeout queued=1"]
