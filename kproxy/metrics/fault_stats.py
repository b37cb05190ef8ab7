"""What fault-injection rules did, counted for ``/metrics``: hits, injected errors, throttles, the
rule set in force and its reloads.

Plain dicts on the hot path, as :mod:`kproxy.metrics.stats` keeps traffic: one dict operation per
fault; :mod:`kproxy.metrics.exposition` turns them into metric families when Prometheus scrapes.
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from typing import Any

from kproxy.metrics.fixed_histogram import BROKER_BUCKETS, Histogram


@dataclass
class FaultStats:
    """What fault-injection rules did (kproxy/policy/policy.py counts; one dict operation per fault).

    Rule ids come from the rules loaded, api and error names from Kafka's tables. The series of a
    rule no longer loaded are removed when the rules are replaced (:meth:`keep_rules`), so
    ``/metrics`` stays as big as the rules in force however often they are edited; a rule that
    comes back starts again from 0, which Prometheus' ``rate()`` and ``increase()`` read as a reset.
    """

    hits: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (rule, action, dry_run "true"/"false")
    injected_errors: dict[tuple[str, str], int] = field(default_factory=dict)  # (api, error name)
    throttle_seconds: dict[str, float] = field(default_factory=dict)  # rule -> seconds of throttle applied
    connection_faults: dict[tuple[str, str], int] = field(default_factory=dict)  # (rule, action): drops, closes
    rules_loaded: int = 0
    # Rule set replacements (kproxy/policy/live_rules.py): the generation in force, and the reloads of
    # the rules file by result, born at zero so that the first failed reload is an increase an alert sees.
    rules_generation: int = 0
    reloads: dict[str, int] = field(default_factory=lambda: {"success": 0, "failure": 0})
    # Frames whose record actions were skipped: editing them needed more than their RecordBudget.
    records_over_budget: int = 0
    # (rule, action) -> how long responses were held back by a delay or throttle (kproxy_rule_held_seconds):
    # the rules' time, kept out of kproxy_overhead_seconds.
    held: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    # (rule, action, direction) -> bytes written through a byte-level toxic (bandwidth, slicer, limit_data,
    # delay at: wire) that rule installed: kproxy_rule_wire_bytes_total.
    wire_bytes: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def held_histogram(self, key: tuple[str, str]) -> Histogram:
        """The ``kproxy_rule_held_seconds`` histogram of ``(rule, action)``, made on first use (a rule
        set's delays and throttles are made at load, at zero, so dashboards see every one)."""
        hist = self.held.get(key)
        if hist is None:
            hist = self.held[key] = Histogram(BROKER_BUCKETS)
        return hist

    def keep_rules(self, rule_ids: Container[str], chunk: int = 0) -> Iterator[int]:
        """Remove the series of every rule not in ``rule_ids`` (the rules now loaded), ``chunk`` keys
        looked at per step (0: all at once); yields after each step how many went in it, so that a
        caller on the event loop can give the loop a turn between steps (100,000 series take a walk
        of each map keyed by rule id)."""
        # keys (rule, ...); the held histogram of responses no rule holds is ("", ""): no rule id is "".
        by_rule: tuple[dict[Any, Any], ...] = (self.hits, self.connection_faults, self.held, self.wire_bytes)
        for table in (*by_rule, self.throttle_seconds):
            keys = list(table)  # a copy: counting goes on between steps
            step = chunk or len(keys) or 1
            for start in range(0, len(keys), step):
                part = keys[start:start + step]
                stale = [k for k in part if k and k not in rule_ids] if table is self.throttle_seconds else [
                    k for k in part if k[0] and k[0] not in rule_ids]
                for key in stale:
                    table.pop(key, None)
                yield len(stale)
