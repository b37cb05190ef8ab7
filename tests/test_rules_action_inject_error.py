"""The ``inject_error`` action (kproxy/rules/actions/inject_error.py) through its interface: its
answers made in the broker's place (``mode: respond``) and its edits of the broker's codes
(``mode: replace``) on real frames, and both through a real Session, sans-IO."""

from __future__ import annotations

import struct

import pytest

from kproxy.protocol import decode_response
from kproxy.protocol.records import Record, encode_batch_v2
from kproxy.rules.apply import apply_to_request, apply_to_response
from tests.test_protocol_mutations import produce_request, produce_response
from tests.test_rules_apply import NOT_LEADER_OR_FOLLOWER, POLICY_VIOLATION, PRODUCE, actions, response_body
from tests.test_rules_session import (
    HEARTBEAT,
    REBALANCE_IN_PROGRESS,
    Driver,
    body,
    codes,
    heartbeat,
    heartbeat_answer,
    produce,
    produce_answer,
    rules,
)


@pytest.mark.parametrize("version", [3, 9, 12])
def test_respond_answers_locally_with_the_request_correlation_id(version: int) -> None:
    frame = produce_request(version, encode_batch_v2([Record(0, 1, None, b"v", [])]))
    out = apply_to_request(actions("- inject_error: {error: NOT_LEADER_OR_FOLLOWER}", "{api: produce}"), frame)
    assert not out.forward and out.answer is not None and out.frame is frame
    got = decode_response(out.answer[4:], PRODUCE, version)
    assert got.header.correlation_id == 77
    codes = {p["error_code"] for t in got.body["responses"] for p in t["partition_responses"]}
    assert codes == {NOT_LEADER_OR_FOLLOWER}
    assert out.notes == ("inject_error NOT_LEADER_OR_FOLLOWER respond",)


def test_produce_acks_0_never_gets_an_answer() -> None:
    frame = produce_request(9, encode_batch_v2([Record(0, 1, None, b"v", [])]), acks=0)
    out = apply_to_request(actions("- inject_error: {error: 6}", "{api: produce}"), frame)
    assert not out.forward and out.answer is None
    assert "acks=0" in out.notes[0]


def test_replace_rewrites_the_broker_codes_of_chosen_partitions() -> None:
    frame = produce_response(9)
    acts = actions("- inject_error: {error: POLICY_VIOLATION, mode: replace, partitions: [2], message: no}",
                   "{api: produce}")
    assert apply_to_request(acts, produce_request(9)).forward  # replace acts on the response only
    out = apply_to_response(acts, frame, PRODUCE, 9)
    parts = response_body(PRODUCE, 9, out.frame)["responses"][0]["partition_responses"]
    assert [p["error_code"] for p in parts] == [0, 0, POLICY_VIOLATION]
    assert parts[2]["error_message"] == "no"
    assert out.notes == ("inject_error POLICY_VIOLATION replace: 1 changed",)


def test_respond_answers_locally_in_request_order_and_keeps_the_correlation_id() -> None:
    d = Driver(rules("inject_error: {error: REBALANCE_IN_PROGRESS}"))
    d.client(produce(1, -1), heartbeat(2), produce(3, -1))
    assert [struct.unpack_from(">i", f, 8)[0] for f in d.upstream] == [1, 3]  # the heartbeat never went up
    assert d.to_client == []  # the local answer waits behind produce 1
    d.broker(produce_answer(1))
    assert d.answered() == [1, 2]
    assert body(HEARTBEAT, 4, d.to_client[1])["error_code"] == REBALANCE_IN_PROGRESS
    d.broker(produce_answer(3))
    assert d.answered() == [1, 2, 3]


def test_replace_rewrites_the_broker_codes_of_chosen_partitions_only() -> None:
    d = Driver(rules("inject_error: {error: NOT_LEADER_OR_FOLLOWER, mode: replace, partitions: [1]}",
                     "{api: produce}"))
    d.client(produce(1, -1, partitions=(0, 1)))
    assert len(d.upstream) == 1
    d.broker(produce_answer(1, partitions=(0, 1)))
    assert d.answered() == [1]
    assert codes(d.to_client[0]) == [0, NOT_LEADER_OR_FOLLOWER]


def test_acks0_produce_never_gets_an_answer_even_an_injected_one() -> None:
    d = Driver(rules("inject_error: {error: NOT_LEADER_OR_FOLLOWER}", "{api: produce}"))
    d.client(produce(1, 0), heartbeat(2))
    assert [struct.unpack_from(">h", f, 4)[0] for f in d.upstream] == [HEARTBEAT]  # swallowed, not forwarded
    d.broker(heartbeat_answer(2))
    assert d.answered() == [2]
