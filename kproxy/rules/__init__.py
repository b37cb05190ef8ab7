"""Fault-injection rules, sans-IO: YAML -> frozen rule objects -> decisions.

* :mod:`.model`         - the rule values (match keys, schedules, rules, rule sets).
* :mod:`.actions`       - the action kinds, one module each (its value, YAML reader, frame edits and
  part of the verdict), listed by YAML name in :mod:`.actions.registry`.
* :mod:`.load`          - YAML text/files -> :class:`RuleSet`, every problem as ``file:line: key: reason``.
* :mod:`.sources`       - a rule file or a directory of them (a mounted ConfigMap) -> one :class:`RuleSet`.
* :mod:`.request_facts` - :class:`RequestFacts`, what the engine reads of a request (a plain value interface).
* :mod:`.frame_facts`   - those facts read lazily from a live request frame.
* :mod:`.engine`        - :class:`RuleEngine`: facts in, :class:`Decision` out, seeded and reproducible.
* :mod:`.bucket`        - token buckets for ``throttle`` (time passed in).
* :mod:`.apply`         - a hit's actions done to request and response frames (through
  :mod:`kproxy.protocol`'s mutations, record faults, field and endpoint rewrites).

This package imports :mod:`kproxy.protocol` and PyYAML only; ``kproxy.proxy``
never imports it (it declares the policy interface it needs; :mod:`kproxy.policy`
wires the two), as pyproject.toml's import contracts enforce.
"""

from kproxy.rules.engine import NO_DECISION, Decision, RuleEngine, RuleHit
from kproxy.rules.load import Problem, RulesError, load_file, load_text
from kproxy.rules.model import Rule, RuleSet
from kproxy.rules.request_facts import RequestFacts, StaticFacts
from kproxy.rules.sources import check_paths, load_path

__all__ = [
    "NO_DECISION",
    "Decision",
    "Problem",
    "RequestFacts",
    "Rule",
    "RuleEngine",
    "RuleHit",
    "RuleSet",
    "RulesError",
    "StaticFacts",
    "check_paths",
    "load_file",
    "load_path",
    "load_text",
]
