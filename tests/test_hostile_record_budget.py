"""A legacy gzip bomb through every reader of records: capture, captured payloads, record rules.

The 651 KB Produce of tests/test_hostile_server.py (four magic-0 gzip wrappers of 2.58 million
empty messages each, 64 MiB inflated apiece) against the readers besides the metrics' record
count: capture's request reading (on the loop with the capture's thread, in the worker process
by default) and the rules' record editor. Decoded without a budget, it
holds the loop for seconds (2.7 s, 19 s and 9.5 s measured, peaks of 2 GB and 792 MB). Each
scenario here: a real kproxy in front of Tansu, a real client producing throughout, the bomb
sent on a raw socket; the loop is never held over 100 ms, memory stays bounded, the broker's
answer comes back (the frame went on as it came) and the reader that gave up is counted in
``kproxy_records_over_budget_total``.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import socket
import struct
import threading
import time
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kproxy.capture.record_builder import PayloadOptions, RecordBuilder
from kproxy.protocol.compression import Codec
from kproxy.protocol.errors import OverBudgetError, RecordsMutationError
from kproxy.protocol.frame_builder import response_frame
from kproxy.protocol.record_faults import CorruptTarget, corrupt_records
from kproxy.protocol.records import (
    DEFAULT_RECORD_BUDGET,
    RECORD_COST,
    Record,
    RecordBudget,
    encode_batch_v2,
    encode_message_set,
)
from kproxy.testing import Broker, ProxyThread, free_port, running_proxy
from tests.support.e2e import create_topic, unique
from tests.support.loopwatch import BLOCKED, loop_held_max, reset_loop_lag
from tests.support.resilience import assert_unaffected, steady_producer, vm_rss_kb, wait_for
from tests.test_hostile_server import legacy_gzip_wrapper, produce_frame, recv_exact, round_trip

# What the scenario may add to the process's resident memory (kproxy runs in this process): the
# bomb frame itself and kproxy's buffers for it are ~2 MB; an unbounded read was 0.8-2 GB.
RSS_GROWTH_KB = 150 * 1024


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """651 KB on the wire: four gzip wrappers of 2.58 million empty messages each (64 MiB inflated)."""
    return legacy_gzip_wrapper(64 * 1024 * 1024 // 26 - 1) * 4


@dataclass
class Figures:
    """What one scenario measured: for the reliability table, and for the assertions."""

    answered_s: float = float("inf")  # the bomb's answer came back after this long
    worst_probe_s: float = 0.0  # worst ApiVersions round trip of another connection meanwhile
    rss_growth_kb: int = 0  # peak resident memory over the baseline
    loop_lag_s: float = float("inf")


def _sample_rss(stop: threading.Event, peak: list[int]) -> None:
    pid = os.getpid()
    while not stop.wait(0.005):
        peak[0] = max(peak[0], vm_rss_kb(pid))


def _metric(proxy: ProxyThread, reader: str) -> float:
    assert proxy.server is not None and proxy.server.metrics_server is not None
    url = f"http://127.0.0.1:{proxy.server.metrics_server.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(rf'^kproxy_records_over_budget_total\{{reader="{reader}"\}} (\S+)$', text, re.M)
    assert found, f"no kproxy_records_over_budget_total{{reader={reader!r}}} in /metrics"
    return float(found.group(1))


def _send_bomb(proxy: ProxyThread, frame: bytes) -> Figures:
    """The bomb on a raw socket while another connection measures round trips; the figures."""
    figures = Figures()
    stop = threading.Event()
    baseline = vm_rss_kb(os.getpid())
    peak = [baseline]
    sampler = threading.Thread(target=_sample_rss, args=(stop, peak), daemon=True)
    reset_loop_lag(proxy)
    sampler.start()
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=60) as probe, \
                socket.create_connection(("127.0.0.1", proxy.port), timeout=60) as hostile:
            round_trip(probe, 1)
            sent = time.monotonic()
            hostile.sendall(frame)
            answered: list[float] = []

            def read_answer() -> None:
                size = int.from_bytes(recv_exact(hostile, 4), "big")
                if int.from_bytes(recv_exact(hostile, size)[:4], "big") == 7:
                    answered.append(time.monotonic() - sent)

            reader = threading.Thread(target=read_answer, daemon=True)
            reader.start()
            c = 10
            deadline = time.monotonic() + 60
            while (reader.is_alive() or time.monotonic() - sent < 1.0) and time.monotonic() < deadline:
                figures.worst_probe_s = max(figures.worst_probe_s, round_trip(probe, c))
                c += 1
                time.sleep(0.01)
            reader.join(1)
            if answered:
                figures.answered_s = answered[0]
    finally:
        stop.set()
        sampler.join(5)
    figures.rss_growth_kb = peak[0] - baseline
    figures.loop_lag_s = loop_held_max(proxy)
    return figures


@pytest.fixture
def topic(tansu: Broker) -> str:
    name = unique("bomb-steady")
    create_topic(tansu.bootstrap, name, partitions=1)
    return name


SCENARIOS: dict[str, dict[str, Any]] = {
    # The capture's thread: the proxy's loop reads a big Produce request at once (EARLY_READ_BYTES).
    "capture-thread": {"capture__process": False},
    "captured-payloads-thread": {"capture__process": False, "capture__include_payloads": True},
    # The capture's worker process (the default): the loop hands the frame on unread, the worker reads
    # it, counts it in its next report and logs on its own standard error.
    "captured-payloads-worker": {"capture__process": True, "capture__include_payloads": True},
    "corrupt-records-rule": {"rules": "value"},
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_legacy_gzip_bomb_is_read_within_the_budget_and_forwarded(
        scenario: str, tansu: Broker, topic: str, bomb: bytes, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    options = dict(SCENARIOS[scenario])
    reader = "capture"
    if "rules" in options:
        reader = "rules"
        rules = tmp_path / "rules.yaml"
        rules.write_text(f"""rules:
  - id: corrupt-bomb
    match: {{api: produce, topic: bomb}}
    actions:
      - corrupt_records: {{target: {options.pop("rules")}}}
""")
        options["rules"] = str(rules)
    else:
        options["capture__dir"] = str(tmp_path / "capture")
    caplog.set_level(logging.INFO, logger="kproxy")
    with running_proxy(tansu.bootstrap, metrics_listen=f"127.0.0.1:{free_port()}", **options) as proxy, \
            steady_producer(proxy.bootstrap, topic) as steady:
        wait_for(lambda: steady.delivered > 0, 15, "the steady producer's first delivery")
        before = _metric(proxy, reader)
        figures = _send_bomb(proxy, produce_frame(bomb, 7))
        # (a worker's count reaches the proxy with its next report)
        wait_for(lambda: _metric(proxy, reader) >= before + 1, 10, f"the {reader} reader's giving up counted")
        after = _metric(proxy, reader)
    print(f"\n{scenario}: answered in {figures.answered_s * 1000:.0f} ms, worst other round trip "
          f"{figures.worst_probe_s * 1000:.0f} ms, loop lag {figures.loop_lag_s * 1000:.0f} ms, "
          f"RSS +{figures.rss_growth_kb / 1024:.0f} MB")
    assert figures.answered_s < 10, "the bomb's Produce was not answered"
    assert figures.loop_lag_s < BLOCKED, f"the event loop was held {figures.loop_lag_s * 1000:.0f} ms"
    assert figures.worst_probe_s < 0.5, f"another connection waited {figures.worst_probe_s:.2f} s"
    assert figures.rss_growth_kb < RSS_GROWTH_KB, f"resident memory grew {figures.rss_growth_kb // 1024} MB"
    assert after >= before + 1, f"the {reader} reader's giving up was not counted"
    assert_unaffected(steady)
    lines = [r.getMessage() for r in caplog.records] + capfd.readouterr().err.splitlines()  # the worker's: stderr
    over = [line for line in lines if "event=records_over_budget" in line]
    assert len(over) == 1 and f"reader={reader}" in over[0], over
    if reader == "rules":  # the action said why it did nothing; the frame went on as it came
        notes = [r.getMessage() for r in caplog.records
                 if r.name == "kproxy.faults" and "event=fault" in r.getMessage()]
        assert any("skipped" in n and "budget" in n for n in notes), notes


def test_the_editor_gives_up_on_a_bomb_before_changing_anything(bomb: bytes) -> None:
    frame = produce_frame(bomb, 7)
    budget = RecordBudget()
    started = time.perf_counter()
    with pytest.raises(OverBudgetError):
        corrupt_records(frame, 0, 2, CorruptTarget.VALUE, budget=budget)
    assert budget.exhausted and time.perf_counter() - started < 0.1
    # Within the budget the same kind of wrapper is edited: the budget bounds, it does not forbid.
    records = [Record(i, -1, None, b"value-%d" % i, []) for i in range(1000)]
    small = produce_frame(encode_message_set(records, magic=0, codec=Codec.GZIP), 8)
    assert 1000 * RECORD_COST < DEFAULT_RECORD_BUDGET
    assert corrupt_records(small, 0, 2, CorruptTarget.VALUE).changed == 1000


def test_a_wrapper_nested_in_a_wrapper_is_refused_not_recursed() -> None:
    """Kafka refuses compressed messages inside a compressed wrapper; the editor recursed into them
    (each level inflated up to 64 MiB, and enough levels overflow the stack)."""
    inner = encode_message_set([Record(0, -1, None, b"v", [])], magic=0, codec=Codec.GZIP)
    value = gzip.compress(inner, mtime=0)
    body = struct.pack(">bbii", 0, Codec.GZIP, -1, len(value)) + value  # magic, attributes, null key, value
    nested = struct.pack(">qiI", 0, 4 + len(body), zlib.crc32(body)) + body
    with pytest.raises(RecordsMutationError, match="nested compression"):
        corrupt_records(produce_frame(nested, 9), 0, 2, CorruptTarget.VALUE)


def test_a_fetch_response_bomb_is_read_within_the_budget_by_the_capture(bomb: bytes) -> None:
    """A broker's answer goes through the same readers (a Fetch response read on the event loop,
    EARLY_READ_BYTES): the partition before the bomb is counted, the bomb is not read past the
    budget, nothing more is read of the frame (no payloads: the count came first and spent the
    budget), and the frame is counted once."""
    good = encode_batch_v2([Record(offset=i, timestamp=i, key=None, value=b"v%d" % i) for i in range(5)])
    frame = response_frame(1, 12, 3, responses=[{"topic": "orders", "partitions": [
        {"partition_index": 0, "error_code": 0, "records": good},
        {"partition_index": 1, "error_code": 0, "records": bomb}]}])
    builder = RecordBuilder(payloads=PayloadOptions(include=True))
    started = time.perf_counter()
    read = builder.early_response(1, 12, frame, 0)
    assert time.perf_counter() - started < 0.1
    entries, _, _ = read.facts  # (entries, top-level code, the offsets read: schema version 3)
    assert [(partition, records) for _, partition, _, records, _ in entries] == [(0, 5), (1, 0)]
    assert read.payloads == []
    assert builder.over_budget == 1
    # Without the bomb, the same frame is read whole.
    whole = builder.early_response(1, 12, response_frame(1, 12, 4, responses=[{"topic": "orders", "partitions": [
        {"partition_index": 0, "error_code": 0, "records": good}]}]), 0)
    assert [p[4] for p in whole.payloads] == [b"v0", b"v1", b"v2", b"v3", b"v4"]
    assert builder.over_budget == 1
