"""Big Metadata answers on the capture writer: read once per body, TopicIdNames still right."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from kproxy.capture.record_builder import (
    BIG_MEMO_BYTES,
    CACHE_FRAME,
    RecordBuilder,
)
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.topic_ids import TopicIdNames
from tests.test_capture_observer import Harness

METADATA, FETCH = 3, 1


def _ids(n: int, seed: int = 0) -> list[uuid.UUID]:
    return [uuid.UUID(int=(seed << 32) + i + 1) for i in range(n)]


def _answer(cid: int, ids: list[uuid.UUID], failing: int | None = None, prefix: str = "t") -> bytes:
    """A Metadata v12 answer of len(ids) topics x 8 partitions; partition 3 of topic ``failing`` has code 5."""
    topics = [{"name": f"{prefix}-{t:03d}", "topic_id": topic_id, "partitions": [
        {"partition_index": p, "leader_id": 1, "replica_nodes": [1, 2], "isr_nodes": [1, 2],
         "error_code": 5 if (t == failing and p == 3) else 0} for p in range(8)]}
        for t, topic_id in enumerate(ids)]
    frame = response_frame(METADATA, 12, cid, brokers=[], cluster_id="c", controller_id=1, topics=topics)
    assert len(frame) > CACHE_FRAME
    return frame


def _metadata(h: Harness, cid: int, answer: bytes) -> dict[str, Any]:
    return h.exchange(request_frame(METADATA, 12, cid, topics=None), answer)


def _reads(monkeypatch: pytest.MonkeyPatch, h: Harness) -> list[int]:
    """Counts the builder's full reads of Metadata response frames: each begins with its topic ids
    learnt (the builder's TopicIdNames, an interpreted object in every build: patched on the instance)."""
    calls: list[int] = []
    topics = h.builder.topics
    original = topics.learn_metadata

    def counted(response: bytes, api_version: int, body_offset: int = 0) -> int | None:
        calls.append(METADATA)
        return original(response, api_version, body_offset)

    monkeypatch.setattr(topics, "learn_metadata", counted)
    return calls


def test_a_repeated_big_metadata_answer_is_read_once_and_each_record_is_its_own(monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    h = Harness()
    reads = _reads(monkeypatch, h)
    ids = _ids(40)
    records = [_metadata(h, cid, _answer(cid, ids, failing=7)) for cid in (1, 2, 3)]
    assert reads.count(METADATA) == 1
    assert [r["correlation_id"] for r in records] == [1, 2, 3]
    for rec in records:
        assert rec["partitions"] == [{"topic": "t-007", "partition": 3, "error_code": 5, "record_count": 0,
                                      "record_bytes": 0, "group_id": None, "committed_offset": None,
                                      "high_watermark": None, "base_offset": None, "last_offset": None,
                                      "max_timestamp": None, "producer_id": None, "producer_epoch": None,
                                      "base_sequence": None, "batch_crc": None, "codec": None}]
        assert rec["response_bytes"] == len(_answer(1, ids, failing=7))
    # The same size, another content (the failing partition elsewhere): read, never taken for the first.
    other = _metadata(h, 4, _answer(4, ids, failing=9))
    assert reads.count(METADATA) == 2
    assert other["partitions"][0]["topic"] == "t-009"


def test_a_remembered_answer_teaches_its_names_again_once_names_were_forgotten() -> None:
    names = TopicIdNames(cap=40)
    h = Harness(topics=names)
    first, second = _ids(40, seed=1), _ids(40, seed=2)
    _metadata(h, 1, _answer(1, first))
    _metadata(h, 2, _answer(2, second, prefix="u"))  # forgets every name of the first answer
    assert names.name(first[5]) == str(first[5])
    _metadata(h, 3, _answer(3, first))  # remembered, but what it taught was forgotten since
    fetch = Harness(topics=names)
    rec = fetch.exchange(
        request_frame(FETCH, 13, 4, topics=[{"topic_id": first[5], "partitions": [{"partition": 0}]}]),
        response_frame(FETCH, 13, 4, responses=[{"topic_id": first[5], "partitions": [
            {"partition_index": 0, "error_code": 0, "records": None}]}]))
    assert rec["partitions"][0]["topic"] == "t-005"


def test_the_big_answer_memo_is_bounded_by_bytes() -> None:
    builder = RecordBuilder()
    h = Harness()
    h.builder = builder
    for cid in range(400):  # 400 different answers
        _metadata(h, cid, _answer(cid, _ids(40, seed=cid)))
        assert builder._big_bytes <= BIG_MEMO_BYTES
    assert 0 < len(builder._big) <= BIG_MEMO_BYTES // 1024


