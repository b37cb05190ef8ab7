"""The ``slicer`` action (kproxy/rules/actions/slicer.py) through its interface: its reader and the
byte-level toxic (slices) its verdict orders in a real Session, sans-IO. The slicing itself:
tests/test_wire_toxics.py; with real clients and a broker: tests/test_rules_toxics.py."""

from __future__ import annotations

import pytest

from kproxy.rules import RulesError, load_text
from kproxy.toxics import Direction, Slices
from tests.test_rules_session import Driver, heartbeat, rules


def test_slicer_orders_slices_in_both_directions_with_its_delay_in_seconds() -> None:
    d = Driver(rules("slicer: {average_bytes: 4, size_variation: 3, delay_us: 20, direction: both}"))
    d.client(heartbeat(1))
    (order,) = d.session.wire_orders
    assert (order.direction, order.toxic) == (Direction.BOTH, Slices(4, 3, 20e-6))
    assert order.owner.label == "rule r1: slicer"


def test_a_size_variation_as_large_as_the_average_is_refused_where_it_is() -> None:
    with pytest.raises(RulesError) as bad:
        load_text(rules("slicer: {average_bytes: 4, size_variation: 4}"), "s.yaml")
    assert [str(p) for p in bad.value.problems] == [
        "s.yaml:7: rules[0].actions[0].slicer: size_variation must be >= 0 and below average_bytes (4), got 4"]
