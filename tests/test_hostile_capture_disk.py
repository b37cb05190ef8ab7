"""The capture's disk failing under a running kproxy: traffic goes on, the capture comes back.

The partition directory (``DIR/hour=...``) is replaced by a regular file while kproxy writes
into it: completing the open file and opening any new one fail with ENOTDIR. The tests run as
root, which ignores permission bits (a chmod'ed directory stays writable), and a full disk
cannot be made on loopback without privileges of another kind; a path that is not a directory
fails for every user. Meanwhile a real client produces through kproxy and a raw connection
sends ApiVersions requests as fast as they are answered (the capture's queue, 200 items here,
fills while the writer backs off; with the capture's worker process, the default, once the pipe
to it is full): nobody waits on the disk, the loop is never held over 100 ms,
``kproxy_capture_records_total{outcome="written"}`` never goes down, and once the directory is
back, new capture files are written.
"""

from __future__ import annotations

import itertools
import logging
import re
import socket
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kproxy.capture.shipper import CaptureShipper
from kproxy.capture.writer import hour_dir_name
from kproxy.testing import Broker, ProxyThread, free_port, running_proxy
from tests.support.e2e import create_topic, unique
from tests.support.loopwatch import BLOCKED, loop_held_max, reset_loop_lag
from tests.support.resilience import assert_unaffected, steady_producer, wait_for
from tests.test_hostile_server import round_trip

pytest.importorskip("pyarrow")


def _capture_counts(proxy: ProxyThread) -> dict[str, float]:
    assert proxy.server is not None and proxy.server.metrics_server is not None
    url = f"http://127.0.0.1:{proxy.server.metrics_server.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {k: float(v) for k, v in re.findall(r'^kproxy_capture_records_total\{outcome="(\w+)"\} (\S+)$', text, re.M)}


def _complete(directory: Path) -> set[str]:
    return {p.name for p in directory.glob("hour=*/capture-*.parquet")}


@pytest.mark.parametrize("process", [True, False], ids=["worker", "thread"])
def test_the_capture_disk_failing_and_coming_back(process: bool, tansu: Broker, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    """The capture's worker process (the default) and its thread (``capture.process: false``) alike:
    the same writer, the worker's log lines on its standard error."""
    caplog.set_level(logging.INFO, logger="kproxy.capture")
    now = datetime.now(UTC)
    if now.minute == 59 and now.second > 20:  # the records' hour must not change during the test
        time.sleep(62 - now.second)
    topic = unique("capture-disk")
    create_topic(tansu.bootstrap, topic, partitions=1)
    directory = tmp_path / "capture"
    hour = directory / hour_dir_name(int(time.time()) // 3600)
    samples: list[dict[str, float]] = []
    stop = threading.Event()
    with running_proxy(tansu.bootstrap, metrics_listen=f"127.0.0.1:{free_port()}", capture__dir=str(directory),
                       capture__rotate_seconds=2, capture__queue_size=200, capture__process=process) as proxy, \
            steady_producer(proxy.bootstrap, topic) as steady, \
            socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as probe:

        def scrape() -> None:  # the counters across the whole scenario, every 100 ms
            while not stop.wait(0.1):
                samples.append(_capture_counts(proxy))

        scraper = threading.Thread(target=scrape, daemon=True)
        wait_for(lambda: len(_complete(directory)) >= 1, 20, "a first capture file")
        # Broken while a file is open (it is completed, or fails to be, within the 4 s below).
        wait_for(lambda: any(hour.glob(".capture-*.tmp")), 20, "an open capture file")
        reset_loop_lag(proxy)
        scraper.start()
        worst = 0.0
        try:
            hour.rename(tmp_path / "moved")
            hour.write_bytes(b"a regular file where the partition directory was")
            broken_at = time.monotonic()
            c = 0
            while time.monotonic() - broken_at < 4:  # requests as fast as answered: the queue fills
                c += 1
                worst = max(worst, round_trip(probe, c))
            hour.unlink()
            (tmp_path / "moved").rename(hour)
            before = _complete(directory)
            wait_for(lambda: _complete(directory) - before, 30, "a capture file written after the disk came back")
            lag = loop_held_max(proxy)
        finally:
            stop.set()
            scraper.join(5)
        after = _capture_counts(proxy)
        assert proxy.server is not None and proxy.server.capture is not None
        writer = proxy.server.capture.writer
        assert writer._thread.is_alive()
        assert not isinstance(writer, CaptureShipper) or writer.restarts == 0  # the worker survived it
    print(f"\ndisk failing: worst round trip {worst * 1000:.0f} ms, loop lag {lag * 1000:.0f} ms, "
          f"{after.get('dropped', 0):.0f} records dropped, {after.get('abandoned', 0):.0f} abandoned")
    written = [s.get("written", 0.0) for s in samples]
    assert len(written) > 10 and all(a <= b for a, b in itertools.pairwise(written)), written
    assert after["dropped"] > 0  # the queue filled while the writer backed off: dropped, counted
    assert after["abandoned"] > 0  # the file open when the disk failed could not be completed
    assert lag < BLOCKED, f"the event loop was held {lag * 1000:.0f} ms"
    assert worst < 0.5, f"a request waited {worst:.2f} s while the capture's disk failed"
    assert_unaffected(steady)
    lines = [r.getMessage() for r in caplog.records] + capfd.readouterr().err.splitlines()
    assert len([line for line in lines if "event=capture_write_failed" in line]) == 1, lines
    assert any("event=capture_write_recovered" in line for line in lines)
