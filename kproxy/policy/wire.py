"""Byte-level toxics of rules, as a connection installs them: their owner and their order.

A rule action that acts below the frame (``bandwidth``, ``slicer``, ``limit_data``, ``delay`` with
``at: wire``) asks, on every request its rule hits, for a toxic on the connection's bytes
(:meth:`~kproxy.rules.actions.draft.VerdictDraft.wire_toxic`). The policy turns each ask into a
:class:`~kproxy.wire_toxics.WireOrder` whose owner is a :class:`RuleToxic`; the connection installs
an order once (the same key again, while installed, does nothing).

How long a toxic lasts: while its rule is in force, that is while the rule set in force holds a
rule of that id with that very action, not in a dry run, whose time conditions (``schedule``'s
``after_seconds``, ``for_seconds``, ``window``) hold; request-counting conditions (``first``,
``every``, ``after_requests``) and ``probability`` choose the requests that install it, not how
long it stays. It is asked before every chunk: a reload that removes or changes the rule, or the
end of its time window, ends the toxic at the connection's next chunk (bytes it already
scheduled leave as scheduled). A later hit of the rule installs it afresh. A dry-run rule counts
its hits and installs nothing.
"""

from __future__ import annotations

import time
from typing import Protocol

from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.faults import count
from kproxy.policy.injector import FaultInjector
from kproxy.rules.actions.base import HitKey, RuleAction
from kproxy.rules.model import Schedule
from kproxy.wire_toxics import Direction, Toxic, WireOrder


class _HasInjector(Protocol):
    @property
    def injector(self) -> FaultInjector | None: ...


class RuleToxic:
    """The owner of the toxics one action of one rule installs (:class:`~kproxy.wire_toxics.Owner`)."""

    __slots__ = ("action", "counts", "label", "live", "rule_id")

    def __init__(self, live: _HasInjector, rule_id: str, action: RuleAction, counts: FaultStats) -> None:
        self.live = live
        self.rule_id = rule_id
        self.action = action
        self.counts = counts
        self.label = f"rule {rule_id}: {action.kind}"

    def in_force(self) -> bool:
        injector = self.live.injector
        if injector is None:
            return False
        plan = injector.plans.get(self.rule_id)
        if plan is None or self.action not in plan.acting:
            return False
        schedule = plan.schedule
        return schedule is None or _in_time(schedule, injector.clock() - injector.engine.loaded_at)

    def passed(self, direction: Direction, nbytes: int) -> None:
        key = (self.rule_id, self.action.kind, direction.value)
        wire = self.counts.wire_bytes
        wire[key] = wire.get(key, 0) + nbytes

    def cut(self, direction: Direction) -> None:
        count(self.counts.connection_faults, (self.rule_id, self.action.kind))


def _in_time(schedule: Schedule, elapsed: float) -> bool:
    """Whether ``schedule``'s time conditions hold ``elapsed`` seconds after its rule set was loaded."""
    if elapsed < schedule.after_s:
        return False
    if schedule.for_s is not None and elapsed >= schedule.after_s + schedule.for_s:
        return False
    return schedule.window is None or schedule.window.contains(time.time())


_MADE_CAP = 1024  # orders remembered per connection: rule sets edited again and again start it afresh


class WireOrders:
    """One connection's orders, one per (rule id, action): made once, handed out with every hit."""

    __slots__ = ("_made", "counts", "live")

    def __init__(self, live: _HasInjector, counts: FaultStats) -> None:
        self.live = live
        self.counts = counts
        self._made: dict[tuple[str, RuleAction, Direction], WireOrder] = {}

    def orders(self, injector: FaultInjector, asked: list[tuple[HitKey, RuleAction, Direction, Toxic]]
               ) -> tuple[WireOrder, ...]:
        out = []
        for key, action, direction, toxic in asked:
            name = (key[0], action, direction)
            order = self._made.get(name)
            if order is None:
                if len(self._made) >= _MADE_CAP:
                    self._made.clear()
                owner = RuleToxic(self.live, key[0], action, self.counts)
                rule = next((r for r in injector.rules.rules if r.id == key[0]), None)
                seed = rule.seed if rule is not None and rule.seed is not None else injector.rules.seed
                order = self._made[name] = WireOrder(name, owner, direction, toxic, f"{seed}\x1f{key[0]}")
            out.append(order)
        return tuple(out)


__all__ = ["RuleToxic", "WireOrders"]
