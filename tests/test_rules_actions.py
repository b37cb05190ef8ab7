"""Rule action kinds are units: one module each, registered by YAML name, found by the loader, the
apply step and the policy through the registry and their own hooks (kproxy/rules/actions/).

The proof of the shape is a kind written here, in the test, and registered the way
kproxy/rules/actions/registry.py registers the others: it loads from YAML, edits responses, holds
them, and is counted and noted like every built-in kind, with nothing else of kproxy changed.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import struct
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

import kproxy.rules.actions as actions_package
from kproxy.protocol.record_faults import Selector
from kproxy.protocol.records import RecordBudget
from kproxy.protocol.response_faults import set_throttle_time
from kproxy.rules import RulesError, load_text
from kproxy.rules.actions.base import HitKey, RuleAction, Step
from kproxy.rules.actions.draft import VerdictDraft
from kproxy.rules.actions.registry import ACTION_KINDS
from kproxy.rules.yaml_nodes import BAD, Bad, NodeReader
from tests.test_rules_session import HEARTBEAT, Completed, Driver, body, heartbeat, heartbeat_answer, rules

if TYPE_CHECKING:
    import yaml

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "rules" / "kproxy-rules.schema.json").read_text())
# The modules of kproxy/rules/actions that are not a kind: the base class, the verdict draft, the
# registry, and what the three record kinds share.
NOT_KINDS = {"base", "direction", "draft", "registry", "records"}


@dataclass(frozen=True, slots=True)
class SlowQuota(RuleAction):
    """A kind made up for this test: hold the response ``ms`` and report it in throttle_time_ms."""

    ms: int

    kind: ClassVar[str] = "slow_quota"
    keys: ClassVar[tuple[str, ...]] = ("ms",)
    counts_held: ClassVar[bool] = True
    decides: ClassVar[bool] = True

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        ms = reader.required(m, at, path, "ms", "milliseconds")
        return reader.made(at, path, {"ms": BAD if ms is None else reader.integer(ms, f"{path}.ms", 1, 60_000)}, cls)

    @property
    def edits_response(self) -> bool:
        return True

    def response_step(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                      ) -> Step | None:
        ms = self.ms
        return f"slow_quota throttle_time_ms={ms}", lambda f: set_throttle_time(f, api_key, api_version, ms)

    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        draft.hold(self.ms / 1000, key, at_response=True)
        draft.fault(key, f"response held {self.ms}ms")


@pytest.fixture
def slow_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ACTION_KINDS, SlowQuota.kind, SlowQuota)


def test_each_module_of_the_package_is_one_registered_kind_named_as_its_yaml_name() -> None:
    kinds_by_module: dict[str, list[type[RuleAction]]] = {}
    for info in pkgutil.iter_modules(actions_package.__path__):
        if info.name in NOT_KINDS:
            continue
        module = importlib.import_module(f"{actions_package.__name__}.{info.name}")
        kinds_by_module[info.name] = [v for v in vars(module).values() if isinstance(v, type)
                                      and issubclass(v, RuleAction) and v.__module__ == module.__name__]
    assert {name: [k.kind for k in kinds] for name, kinds in kinds_by_module.items()} == \
        {name: [name] for name in kinds_by_module}
    assert {name: kinds[0] for name, kinds in kinds_by_module.items()} == ACTION_KINDS


def test_each_registered_kind_has_its_own_test_module() -> None:
    """rules/README.md's promise: a kind's tests are in tests/test_rules_action_<kind>.py."""
    tests = Path(__file__).parent
    missing = [kind for kind in ACTION_KINDS if not (tests / f"test_rules_action_{kind}.py").is_file()]
    assert not missing, f"kinds without tests/test_rules_action_<kind>.py: {missing}"


def test_the_editors_schema_describes_each_registered_kind_with_the_keys_it_reads() -> None:
    """rules/kproxy-rules.schema.json (what editors validate with) follows the registry."""
    defs = SCHEMA["$defs"]
    assert set(ACTION_KINDS) <= set(defs)

    def keys(schema: dict[str, Any]) -> set[str]:  # a kind's mapping, or its alternatives' together
        return set(schema.get("properties", ())).union(*(keys(s) for s in schema.get("oneOf", ())))

    assert {name: keys(defs[name]) for name, kind in ACTION_KINDS.items() if kind.keys} == \
        {name: set(kind.keys) for name, kind in ACTION_KINDS.items() if kind.keys}


@pytest.mark.usefixtures("slow_quota")
def test_a_kind_added_by_its_module_and_registration_alone_is_loaded_applied_and_counted() -> None:
    d = Driver(rules("slow_quota: {ms: 250}"))
    d.live.recent = deque(maxlen=10)
    seen = d.session.observer = Completed()
    d.client(heartbeat(1))
    assert [struct.unpack_from(">i", f, 8)[0] for f in d.upstream] == [1]
    d.broker(heartbeat_answer(1))
    assert d.to_client == []  # held: the kind's part of the verdict
    d.tick(0.3)
    assert d.answered() == [1]
    assert body(HEARTBEAT, 4, d.to_client[0])["throttle_time_ms"] == 250  # its response step
    d.session.report()
    counts = d.injector.counts
    assert counts.hits[("r1", "slow_quota", "false")] == 2  # its verdict part, then its response note
    assert ("r1", "slow_quota") in counts.held  # a kind that holds gets its held-time series
    assert seen.done[0].rule_decisions == (
        ("r1", "slow_quota", "response held 250ms", False),
        ("r1", "slow_quota", "slow_quota throttle_time_ms=250: 1 changed", False))
    assert [(r.rule, r.action) for r in d.live.recent] == [("r1", "slow_quota")] * 2


@pytest.mark.usefixtures("slow_quota")
def test_a_registered_kind_reads_its_own_parameters_with_the_loader_s_messages() -> None:
    with pytest.raises(RulesError) as bad:
        load_text(rules("slow_quota: {msec: 5}"), "r.yaml")
    assert [str(p) for p in bad.value.problems] == [
        "r.yaml:7: rules[0].actions[0].slow_quota.msec: unknown key (did you mean 'ms'?)",
        "r.yaml:7: rules[0].actions[0].slow_quota.ms: missing (milliseconds)"]
    with pytest.raises(RulesError, match=r"slow_quota\.ms: must be <= 60000"):
        load_text(rules("slow_quota: {ms: 70000}"))


def test_an_unknown_kind_is_refused_with_the_closest_registered_name() -> None:
    with pytest.raises(RulesError, match=r"actions\[0\]\.slow_quota: unknown action \(did you mean 'slow_close'\?\)"):
        load_text(rules("slow_quota: {ms: 5}"))
