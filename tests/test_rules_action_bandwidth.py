"""The ``bandwidth`` action (kproxy/rules/actions/bandwidth.py) through its interface: its reader and
the byte-level toxic (a pace) its verdict orders in a real Session, sans-IO. The pace itself:
tests/test_wire_toxics.py; with real clients and a broker: tests/test_rules_toxics.py."""

from __future__ import annotations

import pytest

from kproxy.rules import RulesError, load_text
from kproxy.toxics import Direction, Pace
from tests.test_rules_session import Driver, heartbeat, rules


def test_bandwidth_orders_a_pace_once_per_hit_named_by_its_rule() -> None:
    d = Driver(rules("bandwidth: {bytes_per_second: 1000, direction: upstream}"))
    d.client(heartbeat(1))
    (order,) = d.session.wire_orders
    assert (order.direction, order.toxic) == (Direction.UPSTREAM, Pace(1000.0))
    assert order.owner.label == "rule r1: bandwidth" and order.owner.in_force()
    d.client(heartbeat(2))
    assert d.session.wire_orders[1] is order  # the same order: the connection installs it once
    assert d.injector.counts.hits[("r1", "bandwidth", "false")] == 2


def test_a_dry_run_rule_orders_nothing() -> None:
    d = Driver("""rules:
  - id: r1
    dry_run: true
    match: {api: heartbeat}
    actions:
      - bandwidth: {bytes_per_second: 1000}
""")
    d.client(heartbeat(1))
    assert d.session.wire_orders == []
    assert d.injector.counts.hits[("r1", "bandwidth", "true")] == 1


@pytest.mark.parametrize(("action", "problem"), [
    ("bandwidth: {direction: downstream}", "bandwidth.bytes_per_second: missing (the rate bytes leave at)"),
    ("bandwidth: {bytes_per_second: 0.5}", "bandwidth.bytes_per_second: must be >= 1, got 0.5"),
])
def test_bandwidth_needs_a_rate_of_at_least_one_byte_a_second(action: str, problem: str) -> None:
    with pytest.raises(RulesError) as bad:
        load_text(rules(action), "b.yaml")
    assert [str(p) for p in bad.value.problems] == [f"b.yaml:7: rules[0].actions[0].{problem}"]
