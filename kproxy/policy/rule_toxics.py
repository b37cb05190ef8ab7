"""Byte-level toxics of rules, as a connection installs them: their owner and their order.

A rule action that acts below the frame (``bandwidth``, ``slicer``, ``limit_data``, ``delay`` with
``at: wire``) asks, on every request its rule hits, for a toxic on the connection's bytes
(:meth:`~kproxy.rules.actions.draft.VerdictDraft.wire_toxic`). The policy turns each ask into a
:class:`~kproxy.toxics.WireOrder` whose owner is a :class:`RuleToxic`; the connection installs
an order once (the same key again, while installed, does nothing).

How long a toxic lasts: while its rule is in force (:mod:`kproxy.policy.in_force`), asked before
every chunk: the end of the rule's time window, or a reload or admin edit that removes or changes
it, ends the toxic at the connection's next chunk (bytes it already scheduled leave as scheduled).
A later hit of the rule installs it afresh. A dry-run rule counts its hits and installs nothing.
"""

from __future__ import annotations

from collections.abc import Hashable

from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.faults import count
from kproxy.policy.in_force import HasInjector, RuleInForce
from kproxy.policy.injector import FaultInjector
from kproxy.rules.actions.draft import HitKey
from kproxy.toxics import Direction, Toxic, WireOrder


class RuleToxic:
    """The owner of the toxics one action of one rule installs (:class:`~kproxy.toxics.Owner`);
    ``kind`` its kind (the action's name in its hit counter key)."""

    __slots__ = ("counts", "kind", "label", "life", "rule_id")

    def __init__(self, live: HasInjector, rule_id: str, action: Hashable, kind: str, counts: FaultStats) -> None:
        self.life = RuleInForce(live, rule_id, action)
        self.rule_id = rule_id
        self.kind = kind
        self.counts = counts
        self.label = f"rule {rule_id}: {kind}"

    def in_force(self) -> bool:
        return self.life.in_force()

    def passed(self, direction: Direction, nbytes: int) -> None:
        key = (self.rule_id, self.kind, direction.value)
        wire = self.counts.wire_bytes
        wire[key] = wire.get(key, 0) + nbytes

    def cut(self, direction: Direction) -> None:
        count(self.counts.connection_faults, (self.rule_id, self.kind))


_MADE_CAP = 1024  # orders remembered per connection: rule sets edited again and again start it afresh


class WireOrders:
    """One connection's orders, one per (rule id, action): made once, handed out with every hit."""

    __slots__ = ("_made", "counts", "live")

    def __init__(self, live: HasInjector, counts: FaultStats) -> None:
        self.live = live
        self.counts = counts
        self._made: dict[tuple[str, Hashable, Direction], WireOrder] = {}

    def orders(self, injector: FaultInjector, asked: list[tuple[HitKey, Hashable, Direction, Toxic]]
               ) -> tuple[WireOrder, ...]:
        out = []
        for key, action, direction, toxic in asked:
            name = (key[0], action, direction)
            order = self._made.get(name)
            if order is None:
                if len(self._made) >= _MADE_CAP:
                    self._made.clear()
                owner = RuleToxic(self.live, key[0], action, key[1], self.counts)
                rule = next((r for r in injector.rules.rules if r.id == key[0]), None)
                seed = rule.seed if rule is not None and rule.seed is not None else injector.rules.seed
                order = self._made[name] = WireOrder(name, owner, direction, toxic, f"{seed}\x1f{key[0]}")
            out.append(order)
        return tuple(out)


__all__ = ["RuleToxic", "WireOrders"]
