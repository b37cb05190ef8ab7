"""What a topic-scoped inject_error costs on a hit: split + merge of a Produce, in-place edit of a Fetch.

    .venv/bin/python bench/bench_partition_split.py [--repeats N]

A Produce (v9) and a Fetch answer (v13, topics by id) of 100 partitions (10 topics of 10
partitions, 1 KiB of records each); the rule selects one topic (10 partitions). Timed, per
request: the Produce's split (the rest re-encoded) plus the merge of the broker's answer to the
rest; the Fetch answer's selected entries replaced (the request goes whole). Requests that no
topic-scoped rule hits never reach this code. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import machine_line, table

from kproxy.protocol.codes import ApiKey
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.partition_split import replace_entries, split_request
from kproxy.protocol.records import Record, encode_batch_v2

TOPICS, PARTITIONS, NOT_LEADER = 10, 10, 6
IDS = [uuid.UUID(int=i + 1) for i in range(TOPICS)]


def _records() -> bytes:
    return encode_batch_v2([Record(offset=i, timestamp=0, key=b"k%d" % i, value=b"v" * 100) for i in range(8)])


def _produce() -> tuple[bytes, bytes]:
    records = _records()
    request = request_frame(ApiKey.PRODUCE, 9, 1, transactional_id=None, acks=-1, timeout_ms=1000, topic_data=[
        {"name": f"t{t}", "partition_data": [{"index": p, "records": records} for p in range(PARTITIONS)]}
        for t in range(TOPICS)])
    answer = response_frame(ApiKey.PRODUCE, 9, 1, responses=[
        {"name": f"t{t}", "partition_responses": [{"index": p, "error_code": 0, "base_offset": 7}
                                                  for p in range(PARTITIONS)]}
        for t in range(1, TOPICS)])  # the broker answers the rest: every topic but t0
    return request, answer


def _fetch_answer() -> bytes:
    records = _records()
    return response_frame(ApiKey.FETCH, 13, 1, responses=[
        {"topic_id": IDS[t], "partitions": [{"partition_index": p, "high_watermark": 9, "records": records}
                                            for p in range(PARTITIONS)]}
        for t in range(TOPICS)])


def _time(run: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeats):
            run()
        best = min(best, (time.perf_counter() - started) / repeats)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    request, answer = _produce()
    produce_chosen = lambda topic, partition: topic == "t0"  # noqa: E731
    fetch_chosen = lambda topic, partition: topic == IDS[0]  # noqa: E731

    def produce() -> None:
        split = split_request(request, produce_chosen)
        assert split is not None and split.request is not None
        split.merge(answer, NOT_LEADER)

    fetch = _fetch_answer()
    split = split_request(request, produce_chosen)
    assert split is not None and len(split.selected) == PARTITIONS
    assert replace_entries(fetch, ApiKey.FETCH, 13, NOT_LEADER, fetch_chosen).changed == PARTITIONS
    rows = [
        ("Produce v9 split + merge", len(request), _time(produce, args.repeats)),
        ("Produce v9 split alone", len(request), _time(lambda: split_request(request, produce_chosen), args.repeats)),
        ("Fetch v13 answer, entries replaced", len(fetch),
         _time(lambda: replace_entries(fetch, ApiKey.FETCH, 13, NOT_LEADER, fetch_chosen), args.repeats)),
    ]
    print(machine_line())
    print()
    print(table(["100 partitions, 10 selected", "frame bytes", "µs per request"],
                [[name, f"{size:,}", f"{seconds * 1e6:,.0f}"] for name, size, seconds in rows]))


if __name__ == "__main__":
    main()
