"""The ``close_connection`` action (kproxy/rules/actions/close_connection.py) through a real
Session, sans-IO: a deliberate close (a FIN), counted as a connection fault. With real clients:
tests/test_rules_client_notes.py."""

from __future__ import annotations

from kproxy.proxy.commands import CloseKind
from tests.test_rules_session import Driver, heartbeat, produce, rules


def test_close_connection_ends_the_connection_deliberately_with_a_fin() -> None:
    d = Driver(rules("close_connection"))
    d.client(produce(1, -1), heartbeat(2), produce(3, -1))
    assert d.closed is not None and d.closed.kind is CloseKind.DELIBERATE and d.closed.abort is False
    assert len(d.upstream) == 1  # produce 1 went before the rule; nothing after it
    assert d.injector.counts.connection_faults == {("r1", "close_connection"): 1}
