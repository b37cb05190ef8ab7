"""The ``limit_data`` action (kproxy/rules/actions/limit_data.py) through its interface: its reader
and the byte-level toxic (a limit) its verdict orders in a real Session, sans-IO. The cut itself:
tests/test_wire_toxics.py; with real clients and a broker: tests/test_rules_toxics.py."""

from __future__ import annotations

import pytest

from kproxy.rules import RulesError, load_text
from kproxy.toxics import Direction, Limit
from tests.test_rules_session import Driver, heartbeat, rules


def test_limit_data_orders_a_limit_downstream_by_default() -> None:
    d = Driver(rules("limit_data: {bytes: 1000}"))
    d.client(heartbeat(1))
    (order,) = d.session.wire_orders
    assert (order.direction, order.toxic) == (Direction.DOWNSTREAM, Limit(1000))
    assert order.owner.label == "rule r1: limit_data"


def test_a_negative_limit_and_an_unknown_direction_are_refused_where_they_are() -> None:
    with pytest.raises(RulesError) as bad:
        load_text(rules("limit_data: {bytes: -1, direction: sideways}"), "l.yaml")
    assert [str(p) for p in bad.value.problems] == [
        "l.yaml:7: rules[0].actions[0].limit_data.bytes: must be >= 0, got -1",
        "l.yaml:7: rules[0].actions[0].limit_data.direction: expected one of upstream, downstream, both, got "
        "'sideways'"]
