"""Whether one action of one rule is still in force: what connection-wide faults last as long as.

A fault a rule starts on a connection and that outlives the request that started it (a byte-level
toxic, :mod:`kproxy.policy.rule_toxics`; a black hole, kproxy/proxy/session.py) lasts while its rule is in
force: while the rule set in force holds a rule of that id with that very action, not in a dry run,
whose time conditions (``schedule``'s ``after_seconds``, ``for_seconds``, ``period_seconds``,
``window``) hold: a fault of a flapping rule ends with each of its windows.
Request-counting conditions (``first``, ``every``, ``after_requests``) and ``probability`` choose the
requests that start the fault, not how long it lasts. So the end of its time window, a reload that
removes or changes the rule, or its deletion, disabling or dry run through the admin API ends the
fault on every connection, at the next moment the connection asks.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Protocol

from kproxy.policy.injector import FaultInjector
from kproxy.rules.model import Schedule


class HasInjector(Protocol):
    """Where the rule set in force is read (kproxy.policy.live_rules.LiveRules)."""

    @property
    def injector(self) -> FaultInjector | None: ...


class RuleInForce:
    """Whether ``action`` of rule ``rule_id`` is in force in the rule set ``live`` holds now
    (:class:`kproxy.proxy.verdict.InForce`). The action is a value, equal to one of the rule's
    actions while it is unchanged (rule actions are frozen dataclasses)."""

    __slots__ = ("action", "live", "rule_id")

    def __init__(self, live: HasInjector, rule_id: str, action: Hashable) -> None:
        self.live = live
        self.rule_id = rule_id
        self.action = action

    def in_force(self) -> bool:
        injector = self.live.injector
        if injector is None:
            return False
        plan = injector.plans.get(self.rule_id)
        if plan is None or self.action not in plan.acting:
            return False
        schedule = plan.schedule
        if schedule is None:
            return True
        state = injector.engine.state(self.rule_id)
        started = state.started if state is not None else injector.engine.loaded_at
        return in_time(schedule, injector.clock() - started)


def in_time(schedule: Schedule, elapsed: float) -> bool:
    """Whether ``schedule``'s time conditions hold ``elapsed`` seconds after its rule set was loaded."""
    if not schedule.in_time(elapsed):
        return False
    return schedule.window is None or schedule.window.contains(time.time())


__all__ = ["HasInjector", "RuleInForce", "in_time"]
