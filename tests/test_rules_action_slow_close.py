"""The ``slow_close`` action (kproxy/rules/actions/slow_close.py) through its interface: its reader
(and the former meaning of its name, now ``blackhole``'s) and its verdict in a real Session, sans-IO."""

from __future__ import annotations

import pytest

from kproxy.rules import RulesError, load_text
from tests.test_rules_session import (
    HOLE_FOR_2S,
    Driver,
    heartbeat,
    heartbeat_answer,
    produce,
    produce_answer,
    rules,
    upstream_ids,
)


def test_slow_close_passes_traffic_and_asks_the_close_late_while_its_rule_lasts() -> None:
    d = Driver(rules("slow_close: {delay_ms: 1500}", HOLE_FOR_2S))
    assert d.session.close_delay_s() == 0.0
    d.client(produce(1, -1), heartbeat(2))
    assert upstream_ids(d) == [1, 2], "slow_close lets the traffic through"
    d.broker(produce_answer(1), heartbeat_answer(2))
    assert d.answered() == [1, 2] and d.closed is None
    assert d.session.close_delay_s() == 1.5
    d.clock.now += 2.5  # the rule's window is over: a close now comes at once
    assert d.session.close_delay_s() == 0.0


@pytest.mark.parametrize("former", ["slow_close: {ms: 5}", "slow_close: {ms: 5, forward: true}"])
def test_the_former_slow_close_is_refused_with_where_its_meaning_went(former: str) -> None:
    with pytest.raises(RulesError) as bad:
        load_text(rules(former), "r.yaml")
    (problem,) = bad.value.problems
    assert "slow_close no longer swallows traffic" in str(problem) and "blackhole: {close_after_ms: N}" in str(problem)
