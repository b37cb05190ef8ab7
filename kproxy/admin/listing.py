"""What the admin API shows of the rules: JSON values built from a :class:`View`.

A :class:`View` is a snapshot taken on the server's trio thread (cheap: references and one copy
of the hit counters); everything here reads only the view, so a big listing is built, and
encoded, in a worker thread while connections go on. Building is linear in rules + hit series:
the counters are indexed by rule once per listing, not searched once per rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kproxy.protocol.tables import api_snake_name
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


def listing(view: View) -> dict[str, Any]:
    """``GET /rules``: every rule in force, in order, with its state and hits."""
    index = hit_index(view)
    return {
        "generation": view.generation,
        "origin": view.origin,
        "file": view.file,
        "diverged": view.diverged,
        "seed": view.seed,
        "rules": [describe(view, r, index) for r in (view.rules.rules if view.rules is not None else ())],
    }


def describe(view: View, rule: Rule, index: Mapping[str, HitCounts] | None = None) -> dict[str, Any]:
    """One rule as the API shows it (``index``: :func:`hit_index` of the view, when already built)."""
    if index is None:
        index = hit_index(view, only=rule.id)
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
        "source": ADMIN if rule.id in view.specs else view.baseline_origin,
    }
    if rule.id in view.specs:
        out["spec"] = view.specs[rule.id]
    return out


__all__ = ["ADMIN", "View", "describe", "hit_index", "listing"]
