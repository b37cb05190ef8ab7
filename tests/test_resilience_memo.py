"""The response rewriter's memo under responses that never repeat (found by tests/test_soak.py).

Every Produce response from v10 (KIP-951 ``node_endpoints``) goes through
:class:`ResponseRewriter`; each carries new offsets, so no two bodies are alike.
The memo's bound (``MEMO_MAX_TOTAL``) must bound the memory it holds, whatever
the bodies look like.
"""

from __future__ import annotations

import tracemalloc

import pytest

import kproxy.proxy.address_rewrite as rewrite
from kproxy.protocol.frame_builder import response_frame
from kproxy.protocol.headers import response_body_offset
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap

BUDGET = 256 * 1024  # a small memo bound, so the test needs few responses to cross it


def produce_response(correlation_id: int, offset: int) -> bytes:
    return response_frame(0, 10, correlation_id, responses=[{"name": "orders", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": offset, "log_append_time_ms": -1, "log_start_offset": 0}]}])


def test_memo_memory_stays_within_its_bound_under_distinct_produce_responses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rewrite, "MEMO_MAX_TOTAL", BUDGET)
    rewriter = ResponseRewriter(AddressMap("kproxy.test", 40000))
    frames = [produce_response(i, 1_000_000 + i) for i in range(3 * BUDGET // 40)]
    body = len(frames[0]) - response_body_offset(frames[0], 0, 10)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        peak = 0
        for n, frame in enumerate(frames):
            rewriter.rewrite(0, 10, frame, response_body_offset(frame, 0, 10))
            if n % 256 == 0:
                peak = max(peak, tracemalloc.get_traced_memory()[0] - base)
    finally:
        tracemalloc.stop()
    assert peak <= 2 * BUDGET, (f"the memo held {peak >> 10} KiB for a bound of {BUDGET >> 10} KiB "
                                f"({len(frames)} distinct Produce responses of {body} body bytes)")


def test_memo_memory_stays_within_its_bound_under_distinct_metadata_responses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Metadata is memoized (it repeats between cluster changes); a client asking for ever new topics
    makes every body distinct: the bound must then count what each entry really holds."""
    monkeypatch.setattr(rewrite, "MEMO_MAX_TOTAL", BUDGET)
    rewriter = ResponseRewriter(AddressMap("kproxy.test", 40000))

    def metadata(i: int) -> bytes:
        return response_frame(3, 12, i, brokers=[{"node_id": 1, "host": "b1.internal", "port": 9092}],
                              topics=[{"name": f"t-{i}", "error_code": 3}])

    frames = [metadata(i) for i in range(3 * BUDGET // 40)]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        peak = 0
        for n, frame in enumerate(frames):
            rewriter.rewrite(3, 12, frame, response_body_offset(frame, 3, 12))
            if n % 256 == 0:
                peak = max(peak, tracemalloc.get_traced_memory()[0] - base)
    finally:
        tracemalloc.stop()
    assert peak <= 2 * BUDGET, f"the memo held {peak >> 10} KiB for a bound of {BUDGET >> 10} KiB"
