"""The rule-editing logic of the admin API: JSON in, a new :class:`~kproxy.rules.RuleSet` in force.

No HTTP here (that is :mod:`kproxy.admin.api_server`): a :class:`RuleBook` takes decoded JSON values,
validates them with the rule-file loader (:func:`kproxy.rules.load.load_data`, so a rule means the
same and fails with the same reasons whether it comes from a file or from the API), and puts every
change in force with one :meth:`LiveRules.install(..., origin="admin") <kproxy.policy.live_rules.LiveRules.install>`.

Every edit has two halves: a planner (``plan_add``, ``plan_apply``...: a pure function of a
:class:`Draft`, which parses, validates and builds the new :class:`RuleSet`) and :meth:`RuleBook.commit`
(puts it in force). :meth:`RuleBook.edit` runs the planner and the injector's build in a worker
thread, so a PUT of 10,000 rules does not hold the connections waiting on the trio loop.

The file's rules: whatever was put in force with an origin other than ``"admin"`` (the ``--rules``
file at start, a reload of it, or nothing). The book notices such a replacement at its next call
and takes it as the new baseline: a file reload wins over earlier admin edits, and
:meth:`RuleBook.reset` returns to it. While the rules in force came from the API, the listing
says ``diverged: true``.

An edit of one rule (add, replace, enable, disable, dry run, delete) leaves the others running: every
rule it does not change keeps its schedule (``after_requests``, ``first``, ``every`` counters, the
start of ``after_seconds``/``for_seconds``), its throttle buckets, its hits since load and its seeded
draws' positions (kproxy/policy/live_rules.py, ``carry``); the rule edited starts afresh. Replacing
every rule (``apply``) and ``reset`` start every rule afresh, as a file reload does. Hit counters
are Prometheus counters, kept per rule id for the life of the process either way.

Call from the server's trio thread only (LiveRules' contract); the planners, and
:mod:`kproxy.admin.listing` on a :meth:`RuleBook.view`, from any thread.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from kproxy.admin.listing import ADMIN, View, describe, listing
from kproxy.logfmt import q
from kproxy.offloop import off_loop_build
from kproxy.policy.faults import FaultRecord
from kproxy.policy.injector import FaultInjector
from kproxy.policy.live_rules import LiveRules
from kproxy.rules.load import RulesError, load_data
from kproxy.rules.model import Rule, RuleSet, sequence_problems

log = logging.getLogger("kproxy.admin")

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


@dataclass(frozen=True)
class Draft:
    """What an edit is planned from: the rules in force and the book's state, at one moment."""

    rules: tuple[Rule, ...]
    seed: int
    generation: int
    specs: Mapping[str, Any]
    baseline: RuleSet | None
    baseline_origin: str


@dataclass
class Change:
    """An edit planned from a :class:`Draft`: the rule set to put in force and what to say of it."""

    rules: RuleSet | None
    origin: str
    specs: dict[str, Any]
    action: str
    rule_id: str = "-"
    what: str = ""
    rule: Rule | None = None  # the rule added, replaced or changed
    created: bool = False
    injector: FaultInjector | None = None
    prepared: bool = False  # injector built (LiveRules.prepare), maybe off the loop
    carry: bool = False  # the rules it leaves unchanged carry on (LiveRules.prepare's carry)
    generation: int = 0  # the generation it went in force as (set by RuleBook.commit)


Planner = Callable[[Draft], Change]


class RuleBook:
    """The rules in force as the admin API sees and edits them.

    Two ways to edit, same planners: the plain methods (:meth:`add`, :meth:`apply`...) plan and put
    in force on the calling thread (small rule sets, tests); :meth:`edit` plans and builds in a
    worker thread and puts in force on the trio thread, one edit at a time (the HTTP server).
    """

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
        self._edits: trio.Lock | None = None  # made on first use: a RuleBook may live outside trio

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

    def view(self) -> View:
        """A snapshot for :mod:`kproxy.admin.listing` (trio thread; the view is read anywhere)."""
        self._sync()
        live = self.live
        rules = live.rules
        injector = live.injector
        return View(rules, live.generation, live.origin, self.baseline_origin,
                    self.baseline_origin if self.baseline is not None else None,
                    rules.seed if rules is not None else self._seed(), dict(self.specs),
                    tuple(live.counts.hits.items()),
                    injector.loaded_wall if injector is not None else None,
                    dict(injector.hits_at_load) if injector is not None else {}, live.wall_clock(),
                    dict(injector.started_wall) if injector is not None else {},
                    injector.live_state(injector.clock()) if injector is not None else {})

    def listing(self) -> dict[str, Any]:
        return listing(self.view())

    def get(self, rule_id: str) -> dict[str, Any]:
        view = self.view()
        rule = view.find(rule_id)
        if rule is None:
            raise error(404, "id", f"no rule {rule_id!r}")
        return describe(view, rule)

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

    # -- editing on the calling thread --------------------------------------------------
    def add(self, body: Any) -> Rule:
        """Append a rule (it is evaluated after the rules already there)."""
        rule = self.commit(plan_add(self.draft(), body)).rule
        assert rule is not None
        return rule

    def put(self, rule_id: str, body: Any) -> tuple[Rule, bool]:
        """Replace a rule in place (same position), or append it; True when it is new."""
        change = self.commit(plan_put(self.draft(), rule_id, body))
        assert change.rule is not None
        return change.rule, change.created

    def set_state(self, rule_id: str, *, enabled: bool | None = None, dry_run: bool | None = None) -> Rule:
        rule = self.commit(plan_set_state(self.draft(), rule_id, enabled, dry_run)).rule
        assert rule is not None
        return rule

    def delete(self, rule_id: str) -> None:
        self.commit(plan_delete(self.draft(), rule_id))

    def apply(self, body: Any) -> RuleSet:
        """Replace every rule: ``body`` is a rule file as JSON (``{"seed": N, "rules": [...]}``)."""
        rules = self.commit(plan_apply(self.draft(), body)).rules
        assert rules is not None
        return rules

    def reset(self) -> None:
        """Back to the file's rules (none if kproxy started without a file)."""
        self.commit(plan_reset(self.draft()))

    # -- editing off the loop -----------------------------------------------------------
    async def edit(self, planner: Planner) -> Change:
        """Plan ``planner`` and build its injector in a worker thread, then put it in force (trio
        thread). Edits queue on one lock and go in force in the order they came: none is lost, none
        undoes another. If the rules are replaced meanwhile (a file reload), the edit is planned
        again from them; a change is never put in force from stale rules.

        Once planning started the edit is finished even if the caller is cancelled, except on
        shutdown, when nothing more is put in force (the server is stopping).
        """
        if self._edits is None:
            self._edits = trio.Lock()
        async with self._edits:
            for _ in range(_REPLANS):
                draft = self.draft()
                change = await trio.to_thread.run_sync(self._plan_and_build, planner, draft)
                await trio.lowlevel.checkpoint_if_cancelled()
                if self.live.generation == draft.generation:
                    # Swapped at once; the series of a big set registered over several loop turns
                    # (LiveRules.put_in_force), shielded: the change is made, its answer must follow.
                    with trio.CancelScope(shield=True):
                        generation = await self.live.put_in_force(change.injector, origin=change.origin,
                                                                  turn=trio.lowlevel.checkpoint)
                    return self._committed(change, generation)
            raise error(503, "(rules)", f"the rules in force changed {_REPLANS} times while this edit was being "
                                        "built (file reloads?): nothing was changed; try again")

    def _plan_and_build(self, planner: Planner, draft: Draft) -> Change:
        with off_loop_build() as build:  # the loop served first meanwhile (kproxy/offloop.py)
            change = planner(draft)
            # LiveRules.prepare: safe off the trio thread
            change.injector = self.live.prepare(change.rules, carry=change.carry)
            build.keep = change.rules is not None and len(change.rules.rules) >= _BIG_RULE_SET
        change.prepared = True
        return change

    # -- the two halves of every edit ---------------------------------------------------
    def draft(self) -> Draft:
        """What an edit is planned from, now (trio thread)."""
        self._sync()
        rules = self.live.rules
        return Draft(rules.rules if rules is not None else (), self._seed(), self.live.generation,
                     dict(self.specs), self.baseline, self.baseline_origin)

    def commit(self, change: Change) -> Change:
        """Put a planned change in force and log it (trio thread)."""
        injector = change.injector if change.prepared else self.live.prepare(change.rules, carry=change.carry)
        return self._committed(change, self.live.install(injector, origin=change.origin))

    def _committed(self, change: Change, generation: int) -> Change:
        """Record and log a change just put in force as ``generation``."""
        change.generation = generation
        self._seen_generation = generation
        self.specs = change.specs
        enabled = self.live.counts.rules_loaded  # set by install: no second pass over 10,000 rules here
        log.info("event=admin_change action=%s rule=%s%s generation=%d rules_enabled=%d diverged=%s",
                 change.action, q(change.rule_id), f" {change.what}" if change.what else "", generation, enabled,
                 "true" if change.origin == ADMIN else "false")
        return change

    def _seed(self) -> int:
        rules = self.live.rules or self.baseline
        return rules.seed if rules is not None else 0


_REPLANS = 3
_BIG_RULE_SET = 1000  # rules; from here a rule set is frozen out of the collector's walks (kproxy.offloop)


# -- planners: pure functions of a draft (any thread) -------------------------------------
def plan_add(draft: Draft, body: Any) -> Change:
    rule = _parse_rule(body)
    if any(r.id == rule.id for r in draft.rules):
        raise error(409, "id", f"rule {rule.id!r} exists: PUT /rules/{rule.id} replaces it")
    return _change(draft, (*draft.rules, rule), "add", rule, {**draft.specs, rule.id: body}, created=True)


def plan_put(draft: Draft, rule_id: str, body: Any) -> Change:
    if isinstance(body, Mapping) and "id" not in body:
        body = {"id": rule_id, **body}
    rule = _parse_rule(body)
    if rule.id != rule_id:
        raise error(400, "id", f"the body's id {rule.id!r} differs from the URL's {rule_id!r}")
    rules = list(draft.rules)
    at = next((i for i, r in enumerate(rules) if r.id == rule_id), None)
    if at is None:
        rules.append(rule)
    else:
        rules[at] = rule
    return _change(draft, tuple(rules), "add" if at is None else "replace", rule, {**draft.specs, rule_id: body},
                   created=at is None)


def plan_set_state(draft: Draft, rule_id: str, enabled: bool | None = None, dry_run: bool | None = None) -> Change:
    rule = _find(draft, rule_id)
    changes: dict[str, bool] = {}
    if enabled is not None:
        changes["enabled"] = enabled
    if dry_run is not None:
        changes["dry_run"] = dry_run
    new = dataclasses.replace(rule, **changes)  # type: ignore[arg-type]
    specs = dict(draft.specs)
    spec = specs.get(rule_id)
    if isinstance(spec, dict):
        specs[rule_id] = {**spec, **changes}
    what = ",".join(f"{k}={str(v).lower()}" for k, v in changes.items()) or "nothing"
    return _change(draft, tuple(new if r.id == rule_id else r for r in draft.rules), "set", new, specs, what=what)


def plan_delete(draft: Draft, rule_id: str) -> Change:
    rule = _find(draft, rule_id)
    specs = {k: v for k, v in draft.specs.items() if k != rule_id}
    return _change(draft, tuple(r for r in draft.rules if r.id != rule_id), "delete", rule, specs)


def plan_apply(draft: Draft, body: Any) -> Change:
    if not isinstance(body, Mapping):
        raise error(400, "(body)", f"expected a JSON object with 'rules', got {_kind(body)}")
    try:
        rules = load_data(dict(body), ADMIN)
    except RulesError as exc:
        raise AdminError(400, problems_as_json(exc)) from None
    specs = {r.id: spec for r, spec in zip(rules.rules, body.get("rules") or (), strict=False)}
    return Change(rules, ADMIN, specs, "apply", what=f"rules={len(rules.rules)}")


def plan_reset(draft: Draft) -> Change:
    return Change(draft.baseline, draft.baseline_origin, {}, "reset", what=f"to={q(draft.baseline_origin)}")


def _change(draft: Draft, rules: tuple[Rule, ...], action: str, rule: Rule, specs: dict[str, Any], *,
            created: bool = False, what: str = "") -> Change:
    try:
        ruleset = RuleSet(rules, draft.seed, ADMIN)
    except ValueError as exc:  # RuleSet's own invariants (duplicate ids)
        raise error(409, "id", str(exc)) from None
    problems = sequence_problems(rules)  # a rule waiting on one it does not leave in the set
    if problems:
        raise AdminError(409, [{"path": f"{rules[i].id}: match.schedule.after", "reason": reason}
                               for i, reason in problems])
    return Change(ruleset, ADMIN, specs, action, rule.id, what, rule, created, carry=True)


def _find(draft: Draft, rule_id: str) -> Rule:
    for rule in draft.rules:
        if rule.id == rule_id:
            return rule
    raise error(404, "id", f"no rule {rule_id!r}")


def _parse_rule(body: Any) -> Rule:
    if not isinstance(body, Mapping):
        raise error(400, "(body)", f"expected a rule as a JSON object, got {_kind(body)}")
    try:
        parsed = load_data({"rules": [dict(body)]}, ADMIN, partial=True)
    except RulesError as exc:
        raise AdminError(400, problems_as_json(exc, strip="rules[0].")) from None
    return parsed.rules[0]


def _fault_json(record: FaultRecord) -> dict[str, Any]:
    return dataclasses.asdict(record)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


__all__ = ["ADMIN", "AdminError", "Change", "Draft", "RuleBook", "plan_add", "plan_apply", "plan_delete", "plan_put",
           "plan_reset", "plan_set_state", "problems_as_json"]
