"""The rule-editing logic of the admin API: JSON in, a new :class:`~kproxy.rules.RuleSet` in force.

No HTTP here (that is :mod:`kproxy.admin.server`): a :class:`RuleBook` takes decoded JSON values,
validates them with the rule-file loader (:func:`kproxy.rules.load.load_data`, so a rule means the
same and fails with the same reasons whether it comes from a file or from the API), and puts every
change in force with one :meth:`LiveRules.replace(..., origin="admin") <kproxy.server.live_rules.LiveRules.replace>`.

The file's rules: whatever was put in force with an origin other than ``"admin"`` (the ``--rules``
file at start, a reload of it, or nothing). The book notices such a replacement at its next call
and takes it as the new baseline: a file reload wins over earlier admin edits, and
:meth:`RuleBook.reset` returns to it. While the rules in force came from the API, the listing
says ``diverged: true``.

Every edit builds a new engine: schedules (``after_requests``, ``first``, ``every``,
``after_seconds``...), throttle buckets and seeded draws of *every* rule restart from the edit,
as after a file reload (kproxy/server/live_rules.py). Hit counters do not: they are Prometheus
counters, kept per rule id for the life of the process.

Call from the server's trio thread only (LiveRules' contract).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import deque
from collections.abc import Mapping
from typing import Any

from kproxy.protocol.tables import api_snake_name
from kproxy.rules.load import RulesError, load_data
from kproxy.rules.model import Rule, RuleSet, action_name
from kproxy.server.live_rules import LiveRules
from kproxy.server.logfmt import q
from kproxy.server.rule_policy import FaultRecord

log = logging.getLogger("kproxy.admin")

ADMIN = "admin"  # the LiveRules origin of every change made here
RECENT_FAULTS = 1000  # records kept for GET /faults
_HINT = re.compile(r"^(?P<reason>.*?) \((?P<hint>did you mean .*)\)$", re.DOTALL)


class AdminError(Exception):
    """A request the book refuses: an HTTP status and JSON errors ``{"path", "reason"[, "hint"]}``."""

    def __init__(self, status: int, errors: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{e['path']}: {e['reason']}" for e in errors))
        self.status = status
        self.errors = errors


def error(status: int, path: str, reason: str) -> AdminError:
    return AdminError(status, [{"path": path, "reason": reason}])


def problems_as_json(exc: RulesError, strip: str = "") -> list[dict[str, str]]:
    """The loader's problems, without their (meaningless) line: key path, reason, did-you-mean hint.
    ``strip`` removes a prefix the book added around the caller's body (``rules[0].``)."""
    out: list[dict[str, str]] = []
    for p in exc.problems:
        path = p.key
        if strip and path.startswith(strip):
            path = path[len(strip):]
        elif strip and path == strip.rstrip("."):
            path = "(body)"
        entry = {"path": path, "reason": p.reason}
        m = _HINT.match(p.reason)
        if m is not None:
            entry["reason"], entry["hint"] = m["reason"], m["hint"]
        out.append(entry)
    return out


class RuleBook:
    """The rules in force as the admin API sees and edits them."""

    def __init__(self, live: LiveRules) -> None:
        self.live = live
        if live.recent is None:
            live.recent = deque(maxlen=RECENT_FAULTS)
        # Connections opened while no rule exists must still get the rules added later.
        live.mutable = True
        self.baseline: RuleSet | None = live.rules
        self.baseline_origin = live.origin
        self._seen_generation = live.generation
        self.specs: dict[str, Any] = {}  # rule id -> the JSON it was added or replaced with here

    # -- reading ------------------------------------------------------------------------
    def _sync(self) -> None:
        """Adopt a replacement made elsewhere (a file reload) as the new baseline."""
        live = self.live
        if live.generation != self._seen_generation and live.origin != ADMIN:
            self.baseline, self.baseline_origin = live.rules, live.origin
            self.specs.clear()
        self._seen_generation = live.generation

    @property
    def diverged(self) -> bool:
        self._sync()
        return self.live.origin == ADMIN

    def listing(self) -> dict[str, Any]:
        self._sync()
        rules = self.live.rules
        return {
            "generation": self.live.generation,
            "origin": self.live.origin,
            "file": self.baseline_origin if self.baseline is not None else None,
            "diverged": self.live.origin == ADMIN,
            "seed": rules.seed if rules is not None else self._seed(),
            "rules": [self.describe(r) for r in (rules.rules if rules is not None else ())],
        }

    def get(self, rule_id: str) -> dict[str, Any]:
        return self.describe(self._find(rule_id))

    def describe(self, rule: Rule) -> dict[str, Any]:
        hits: dict[str, int] = {}
        dry: dict[str, int] = {}
        for (rid, action, dry_run), n in list(self.live.counts.hits.items()):
            if rid == rule.id:
                table = dry if dry_run == "true" else hits
                table[action] = table.get(action, 0) + n
        out: dict[str, Any] = {
            "id": rule.id,
            "description": rule.description,
            "enabled": rule.enabled,
            "dry_run": rule.dry_run,
            "continue": rule.continue_,
            "api": sorted(api_snake_name(k) for k in rule.match.apis) if rule.match.apis is not None else None,
            "actions": [action_name(a) for a in rule.actions],
            "hits": hits,
            "dry_run_hits": dry,
            "source": ADMIN if rule.id in self.specs else self.baseline_origin,
        }
        if rule.id in self.specs:
            out["spec"] = self.specs[rule.id]
        return out

    def faults(self, limit: int = 100, rule: str | None = None) -> list[dict[str, Any]]:
        """The most recent faults, newest first."""
        recent = self.live.recent or ()
        out: list[dict[str, Any]] = []
        for record in reversed(recent):
            if rule is not None and record.rule != rule:
                continue
            out.append(_fault_json(record))
            if len(out) >= limit:
                break
        return out

    # -- editing ------------------------------------------------------------------------
    def add(self, body: Any) -> Rule:
        """Append a rule (it is evaluated after the rules already there)."""
        rule = self._parse_rule(body)
        rules = self._current()
        if any(r.id == rule.id for r in rules):
            raise error(409, "id", f"rule {rule.id!r} exists: PUT /rules/{rule.id} replaces it")
        self._put_in_force((*rules, rule), "add", rule.id)
        self.specs[rule.id] = body
        return rule

    def put(self, rule_id: str, body: Any) -> tuple[Rule, bool]:
        """Replace a rule in place (same position), or append it; True when it is new."""
        if isinstance(body, Mapping) and "id" not in body:
            body = {"id": rule_id, **body}
        rule = self._parse_rule(body)
        if rule.id != rule_id:
            raise error(400, "id", f"the body's id {rule.id!r} differs from the URL's {rule_id!r}")
        rules = list(self._current())
        at = next((i for i, r in enumerate(rules) if r.id == rule_id), None)
        if at is None:
            rules.append(rule)
        else:
            rules[at] = rule
        self._put_in_force(tuple(rules), "add" if at is None else "replace", rule_id)
        self.specs[rule_id] = body
        return rule, at is None

    def set_state(self, rule_id: str, *, enabled: bool | None = None, dry_run: bool | None = None) -> Rule:
        rule = self._find(rule_id)
        changes: dict[str, bool] = {}
        if enabled is not None:
            changes["enabled"] = enabled
        if dry_run is not None:
            changes["dry_run"] = dry_run
        new = dataclasses.replace(rule, **changes)  # type: ignore[arg-type]
        rules = tuple(new if r.id == rule_id else r for r in self._current())
        what = ",".join(f"{k}={str(v).lower()}" for k, v in changes.items()) or "nothing"
        self._put_in_force(rules, "set", rule_id, what)
        spec = self.specs.get(rule_id)
        if isinstance(spec, dict):
            self.specs[rule_id] = {**spec, **changes}
        return new

    def delete(self, rule_id: str) -> None:
        self._find(rule_id)
        self._put_in_force(tuple(r for r in self._current() if r.id != rule_id), "delete", rule_id)
        self.specs.pop(rule_id, None)

    def apply(self, body: Any) -> RuleSet:
        """Replace every rule: ``body`` is a rule file as JSON (``{"seed": N, "rules": [...]}``)."""
        if not isinstance(body, Mapping):
            raise error(400, "(body)", f"expected a JSON object with 'rules', got {_kind(body)}")
        try:
            rules = load_data(dict(body), ADMIN)
        except RulesError as exc:
            raise AdminError(400, problems_as_json(exc)) from None
        self._sync()
        self.live.replace(rules, origin=ADMIN)
        self._seen_generation = self.live.generation
        self.specs = {r.id: spec for r, spec in zip(rules.rules, body.get("rules") or (), strict=False)}
        self._log("apply", "-", f"rules={len(rules.rules)}")
        return rules

    def reset(self) -> None:
        """Back to the file's rules (none if kproxy started without a file)."""
        self._sync()
        self.live.replace(self.baseline, origin=self.baseline_origin)
        self._seen_generation = self.live.generation
        self.specs.clear()
        self._log("reset", "-", f"to={q(self.baseline_origin)}")

    # -- helpers ------------------------------------------------------------------------
    def _seed(self) -> int:
        rules = self.live.rules or self.baseline
        return rules.seed if rules is not None else 0

    def _current(self) -> tuple[Rule, ...]:
        self._sync()
        rules = self.live.rules
        return rules.rules if rules is not None else ()

    def _find(self, rule_id: str) -> Rule:
        for rule in self._current():
            if rule.id == rule_id:
                return rule
        raise error(404, "id", f"no rule {rule_id!r}")

    def _parse_rule(self, body: Any) -> Rule:
        if not isinstance(body, Mapping):
            raise error(400, "(body)", f"expected a rule as a JSON object, got {_kind(body)}")
        try:
            parsed = load_data({"rules": [dict(body)]}, ADMIN)
        except RulesError as exc:
            raise AdminError(400, problems_as_json(exc, strip="rules[0].")) from None
        return parsed.rules[0]

    def _put_in_force(self, rules: tuple[Rule, ...], action: str, rule_id: str, what: str = "") -> None:
        try:
            ruleset = RuleSet(rules, self._seed(), ADMIN)
        except ValueError as exc:  # RuleSet's own invariants (duplicate ids)
            raise error(409, "id", str(exc)) from None
        generation = self.live.replace(ruleset, origin=ADMIN)
        self._seen_generation = generation
        self._log(action, rule_id, what)

    def _log(self, action: str, rule_id: str, what: str) -> None:
        rules = self.live.rules
        enabled = sum(1 for r in rules.rules if r.enabled) if rules is not None else 0
        log.info("event=admin_change action=%s rule=%s%s generation=%d rules_enabled=%d diverged=%s", action,
                 q(rule_id), f" {what}" if what else "", self.live.generation, enabled,
                 "true" if self.live.origin == ADMIN else "false")


def _fault_json(record: FaultRecord) -> dict[str, Any]:
    return dataclasses.asdict(record)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


__all__ = ["ADMIN", "AdminError", "RuleBook", "problems_as_json"]
