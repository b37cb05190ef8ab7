"""The ``reset_connection`` action (kproxy/rules/actions/reset_connection.py) through a real
Session, sans-IO: a deliberate abort (a TCP RST), counted as a connection fault. With real clients:
tests/test_rules_client_notes.py, tests/test_rules_draws_reconnect.py."""

from __future__ import annotations

from kproxy.proxy.commands import CloseKind
from tests.test_rules_session import Driver, heartbeat, produce, rules


def test_reset_connection_ends_the_connection_deliberately_with_a_reset() -> None:
    d = Driver(rules("reset_connection"))
    d.client(produce(1, -1), heartbeat(2), produce(3, -1))
    assert d.closed is not None and d.closed.kind is CloseKind.DELIBERATE and d.closed.abort is True
    assert len(d.upstream) == 1  # produce 1 went before the rule; nothing after it
    assert d.injector.counts.connection_faults == {("r1", "reset_connection"): 1}
