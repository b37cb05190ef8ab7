"""The event-loop watchdog: a held loop is measured, exported and named in one log line."""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import trio

from kproxy.metrics.fixed_histogram import LOOP_LAG_BUCKETS, Histogram
from kproxy.server import loopwatch
from kproxy.server.loopwatch import LoopWatch, RunQueueWait, ThreadTimes
from kproxy.testing import Broker, free_port, running_proxy
from tests.support.loopwatch import LAG, loop_held_max, loop_lag_max, reset_loop_lag, stalls_over


def hold_the_loop_for_a_while(seconds: float) -> None:
    """What a stuck handler looks like from the loop: a synchronous call that does not return."""
    time.sleep(seconds)


def _blocked_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The stall lines of the watch this test runs on its own loop (this thread), not of an
    in-process proxy another test of the worker left running, which the same stall holds too."""
    return [r.getMessage() for r in caplog.records
            if "event_loop_blocked" in r.getMessage() and r.thread == threading.get_ident()]


async def test_a_held_loop_is_measured_and_named(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kproxy.server")
    watch = LoopWatch(Histogram(LOOP_LAG_BUCKETS), Histogram(LOOP_LAG_BUCKETS))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.run)
        await trio.sleep(0.3)
        quiet = watch.max_lag
        hold_the_loop_for_a_while(0.4)
        await trio.sleep(0.2)  # the heartbeat runs again, logs
        nursery.cancel_scope.cancel()
    assert quiet < 0.05, f"an idle loop lagged {quiet * 1000:.1f} ms"
    assert 0.3 < watch.max_lag < 1.0
    assert 0.3 < watch.max_held <= watch.max_lag  # a sleeping thread waits for no CPU: held, not starved
    for histogram in (watch.histogram, watch.held):
        over = sum(histogram.counts[LOOP_LAG_BUCKETS.index(0.1) + 1:])
        assert over == 1, histogram.counts
    lines = _blocked_lines(caplog)
    assert len(lines) == 1, lines
    assert "hold_the_loop_for_a_while" in lines[0] and "tests/test_loopwatch.py" in lines[0], lines[0]
    assert "lag_ms=" in lines[0] and "cpu_wait_ms=" in lines[0]


async def test_lag_spent_waiting_for_a_cpu_is_not_counted_as_held(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kproxy.server")
    waited = [0.0]  # the loop thread's run-queue wait, as the kernel would count it
    watch = LoopWatch(Histogram(LOOP_LAG_BUCKETS), Histogram(LOOP_LAG_BUCKETS), cpu_wait=lambda: waited[0])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.run)
        await trio.sleep(0.2)
        hold_the_loop_for_a_while(0.3)
        waited[0] += 0.25  # of the 0.3 s, 0.25 s runnable without a CPU: held the remaining 0.05 s at most
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    assert 0.25 < watch.max_lag < 1.0
    assert watch.max_held < watch.max_lag - 0.2, (watch.max_held, watch.max_lag)
    held_over = sum(watch.held.counts[LOOP_LAG_BUCKETS.index(0.1) + 1:])
    lag_over = sum(watch.histogram.counts[LOOP_LAG_BUCKETS.index(0.1) + 1:])
    assert (held_over, lag_over) == (0, 1), (watch.held.counts, watch.histogram.counts)
    lines = _blocked_lines(caplog)
    assert len(lines) == 1 and "cpu_wait_ms=250" in lines[0], lines


async def test_a_loop_waiting_for_the_gil_names_the_thread_that_held_it(caplog: pytest.LogCaptureFixture) -> None:
    # Sorting a list of floats is one C call that keeps the GIL throughout: the loop thread is
    # neither running nor waiting for a core meanwhile, and the sentinel cannot sample it.
    caplog.set_level(logging.WARNING, logger="kproxy.server")
    values = [random.random() for _ in range(2_000_000)]
    go, sorted_, end = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        go.wait(10)
        sorted(values)
        sorted_.set()
        end.wait(10)  # alive when the heartbeat logs: a thread that ended is not read again

    holder = threading.Thread(target=hold, name="gil-holder", daemon=True)
    holder.start()
    watch = LoopWatch(Histogram(LOOP_LAG_BUCKETS), Histogram(LOOP_LAG_BUCKETS))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.run)
        await trio.sleep(0.3)  # the sentinel has read the threads, the holder among them
        go.set()
        while not sorted_.is_set():
            await trio.sleep(0.05)
        await trio.sleep(0.2)  # the heartbeat runs again, logs
        nursery.cancel_scope.cancel()
    end.set()
    lines = _blocked_lines(caplog)
    assert len(lines) == 1, lines
    others = lines[0].partition(" others=")[2]
    assert others.startswith('"gil-holder cpu='), lines[0]  # the busiest thread first
    held_by_holder = int(others.partition("cpu=")[2].partition("ms")[0])
    assert held_by_holder > 100, lines[0]


def test_thread_times_follow_threads_as_they_come_and_go() -> None:
    reader = ThreadTimes()
    try:
        started = threading.Event()
        stop = threading.Event()
        spinner = threading.Thread(target=lambda: (started.set(), _spin_until(stop)), daemon=True)
        spinner.start()
        started.wait(5)
        first = reader.read()
        assert spinner.native_id in first and threading.get_native_id() in first
        time.sleep(0.2)
        second = reader.read()
        assert second[spinner.native_id][0] - first[spinner.native_id][0] > 0.01  # it ran
        stop.set()
        spinner.join(5)
        deadline = time.monotonic() + 5  # the kernel's thread ends a little after Python's join
        while spinner.native_id in reader.read() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert spinner.native_id not in reader.read()  # ended: its file closed, left out
    finally:
        reader.close()
    assert reader.read() == {} or threading.get_native_id() in reader.read()  # reopens when read again
    reader.close()


def _spin_until(stop: threading.Event) -> None:
    while not stop.is_set():
        pass


def test_the_run_queue_wait_counts_time_runnable_without_a_cpu() -> None:
    # This thread and a spinning child process share one CPU: the kernel gives each about half of it,
    # so over a busy stretch the thread waits about as long as it runs; alone it waits for nothing.
    reader = RunQueueWait(threading.get_native_id())
    affinity = os.sched_getaffinity(0)
    cpu = min(affinity)
    spinner = subprocess.Popen([sys.executable, "-c", "import os, sys\n"
                                f"os.sched_setaffinity(0, {{{cpu}}}); print('spinning', flush=True)\n"
                                "while True: pass"], stdout=subprocess.PIPE, text=True)
    try:
        assert spinner.stdout is not None and spinner.stdout.readline().strip() == "spinning"
        os.sched_setaffinity(0, {cpu})  # this thread only
        before, started = reader(), time.monotonic()
        _spin(0.6)
        shared, took = reader() - before, time.monotonic() - started
    finally:
        os.sched_setaffinity(0, affinity)
        spinner.kill()
        spinner.wait()
        reader.close()
    assert 0.1 < shared < took, f"waited {shared:.3f} s for a CPU over {took:.3f} s sharing one"
    assert reader() == 0.0  # closed: reads nothing


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


async def test_a_loop_that_does_not_come_back_is_reported_by_the_sentinel(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.WARNING, logger="kproxy.server")
    monkeypatch.setattr(loopwatch, "STUCK_AFTER", 0.3)
    watch = LoopWatch(Histogram(LOOP_LAG_BUCKETS), Histogram(LOOP_LAG_BUCKETS))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.run)
        await trio.sleep(0.1)
        hold_the_loop_for_a_while(0.6)
        # Logged by the sentinel thread while the loop was still held.
        stuck = [r for r in caplog.records if "event_loop_stuck" in r.getMessage()]
        nursery.cancel_scope.cancel()
    assert len(stuck) == 1, [r.getMessage() for r in caplog.records]
    assert "hold_the_loop_for_a_while" in stuck[0].getMessage()


@pytest.mark.broker
def test_the_proxy_exports_its_loop_lag(tansu: Broker) -> None:
    with running_proxy(tansu.bootstrap, metrics_listen=f"127.0.0.1:{free_port()}") as proxy:
        time.sleep(0.3)
        assert loop_lag_max(proxy) < 0.1
        proxy.call(hold_the_loop_for_a_while, 0.25)
        time.sleep(0.2)
        assert loop_lag_max(proxy) > 0.2
        assert loop_held_max(proxy) > 0.2  # held by a call on the loop, not waiting for a CPU
        assert proxy.server is not None and proxy.server.metrics_server is not None
        url = f"http://127.0.0.1:{proxy.server.metrics_server.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        assert stalls_over(text, 0.1) == 1 and stalls_over(text, 0.1, LAG) == 1
        assert stalls_over(text, 10.0) == 0 and stalls_over(text, 10.0, LAG) == 0
        reset_loop_lag(proxy)
        time.sleep(0.2)
        assert loop_lag_max(proxy) < 0.1
