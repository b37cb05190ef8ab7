"""What the admin API shows of the rules: JSON values built from a :class:`View`.

A :class:`View` is a snapshot taken on the server's trio thread (cheap: references and one copy
of the hit counters); everything here reads only the view, so a big listing is built, and
encoded, in a worker thread while connections go on. Building is linear in rules + hit series:
the counters are indexed by rule once per listing, not searched once per rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kproxy.protocol.codes import api_snake_name
from kproxy.rules.model import Rule, RuleSet

ADMIN = "admin"  # the LiveRules origin of every change made through the admin API

HitCounts = tuple[dict[str, int], dict[str, int]]  # (hits by action, dry-run hits by action) of one rule


@dataclass(frozen=True)
class View:
    """The rules in force and what the book knows of them, at one moment."""

    rules: RuleSet | None
    generation: int
    origin: str
    baseline_origin: str  # where the rules the API did not make came from (the file, or "none")
    file: str | None  # the file's origin; None: kproxy runs without a file
    seed: int
    specs: Mapping[str, Any]  # rule id -> the JSON it was added or replaced with through the API
    hits: tuple[tuple[tuple[str, str, str], int], ...]  # FaultStats.hits' items: ((rule, action, dry), n)
    # When the rules in force went in force (wall clock; None: no rules), each hit series' count then
    # (FaultInjector.hits_at_load), and when the view was taken: what "since load" is counted from.
    loaded_at: float | None = None
    hits_at_load: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    taken_at: float = 0.0
    # When each rule an admin edit carried on went in force (wall clock): it counts from then, not
    # from ``loaded_at`` (kproxy.policy.injector.FaultInjector.started_wall).
    started: Mapping[str, float] = field(default_factory=dict)
    # Each rule's live state (kproxy.policy.injector.FaultInjector.live_state), for the rules with some.
    state: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def diverged(self) -> bool:
        return self.origin == ADMIN

    def find(self, rule_id: str) -> Rule | None:
        rules = self.rules.rules if self.rules is not None else ()
        return next((r for r in rules if r.id == rule_id), None)


def hit_index(view: View, only: str | None = None) -> dict[str, HitCounts]:
    """Hit counts by rule id (of rule ``only``, when given), in one pass over the counters."""
    index: dict[str, HitCounts] = {}
    for (rule_id, action, dry_run), n in view.hits:
        if only is not None and rule_id != only:
            continue
        counts = index.get(rule_id)
        if counts is None:
            counts = index[rule_id] = ({}, {})
        table = counts[1] if dry_run == "true" else counts[0]
        table[action] = table.get(action, 0) + n
    return index


def load_index(view: View, only: str | None = None) -> dict[str, int]:
    """The hits each rule had counted when the rules went in force (of rule ``only``, when given)."""
    index: dict[str, int] = {}
    for (rule_id, _, _), n in view.hits_at_load.items():
        if only is None or rule_id == only:
            index[rule_id] = index.get(rule_id, 0) + n
    return index


def age_seconds(view: View, rule_id: str | None = None) -> float | None:
    """How long ago the rules in force went in force (None: no rules); with ``rule_id``, that rule
    (its own start when an admin edit of another carried it on)."""
    at = view.loaded_at if rule_id is None else view.started.get(rule_id, view.loaded_at)
    return None if at is None else round(max(0.0, view.taken_at - at), 3)


def hits_since_load(rule: Rule, counts: HitCounts, at_load: Mapping[str, int]) -> int | None:
    """A rule's hits (dry runs included) since the rules went in force; None for a disabled rule,
    which cannot fire."""
    if not rule.enabled:
        return None
    return sum(counts[0].values()) + sum(counts[1].values()) - at_load.get(rule.id, 0)


def listing(view: View) -> dict[str, Any]:
    """``GET /rules``: every rule in force, in order, with its state and hits."""
    index = hit_index(view)
    at_load = load_index(view)
    return {
        "generation": view.generation,
        "origin": view.origin,
        "file": view.file,
        "diverged": view.diverged,
        "seed": view.seed,
        "loaded_at": view.loaded_at,
        "age_seconds": age_seconds(view),
        "rules": [describe(view, r, index, at_load) for r in (view.rules.rules if view.rules is not None else ())],
    }


def never_fired(view: View, only: str | None = None) -> list[dict[str, Any]]:
    """``GET /faults``' ``never_fired``: the enabled rules with no hit since the rules went in force
    (of rule ``only``, when given), in rule order, with how long that has been."""
    index = hit_index(view, only)
    at_load = load_index(view, only)
    rules = view.rules.rules if view.rules is not None else ()
    return [{"id": r.id, "age_seconds": age_seconds(view, r.id)} for r in rules
            if (only is None or r.id == only) and hits_since_load(r, index.get(r.id, ({}, {})), at_load) == 0]


def describe(view: View, rule: Rule, index: Mapping[str, HitCounts] | None = None,
             at_load: Mapping[str, int] | None = None) -> dict[str, Any]:
    """One rule as the API shows it (``index``, ``at_load``: :func:`hit_index` and :func:`load_index`
    of the view, when already built)."""
    if index is None:
        index = hit_index(view, only=rule.id)
    if at_load is None:
        at_load = load_index(view, only=rule.id)
    hits, dry = index.get(rule.id, ({}, {}))
    out: dict[str, Any] = {
        "id": rule.id,
        "description": rule.description,
        "enabled": rule.enabled,
        "dry_run": rule.dry_run,
        "continue": rule.continue_,
        "api": sorted(api_snake_name(k) for k in rule.match.apis) if rule.match.apis is not None else None,
        "actions": [a.kind for a in rule.actions],
        "hits": dict(hits),
        "dry_run_hits": dict(dry),
        "hits_since_load": hits_since_load(rule, (hits, dry), at_load),
        "age_seconds": age_seconds(view, rule.id),
        "source": ADMIN if rule.id in view.specs else view.baseline_origin,
    }
    if rule.id in view.state:
        out["state"] = view.state[rule.id]
    if rule.id in view.specs:
        out["spec"] = view.specs[rule.id]
    return out


__all__ = ["ADMIN", "View", "age_seconds", "describe", "hit_index", "hits_since_load", "listing", "load_index",
           "never_fired"]
