"""The ``drop_response`` action (kproxy/rules/actions/drop_response.py) through a real Session,
sans-IO: the answer it swallows, and the ones after it that flow."""

from __future__ import annotations

from tests.test_rules_session import Driver, heartbeat, heartbeat_answer, rules


def test_drop_response_swallows_one_answer_and_later_ones_flow() -> None:
    d = Driver(rules("drop_response", "{api: heartbeat, schedule: {first: 1}}"))
    d.client(heartbeat(1), heartbeat(2))
    d.broker(heartbeat_answer(1), heartbeat_answer(2))
    assert d.answered() == [2]
    assert d.session.in_flight_count == 0
