"""Fault-injection rules, sans-IO: YAML -> frozen rule objects -> decisions.

* :mod:`.model`   - the rule values (match keys, one class per action kind).
* :mod:`.load`    - YAML text/files -> :class:`RuleSet`, every problem as ``file:line: key: reason``.
* :mod:`.sources` - a rule file or a directory of them (a mounted ConfigMap) -> one :class:`RuleSet`.
* :mod:`.request` - :class:`RequestFacts`, what the engine reads of a request (a plain value interface).
* :mod:`.facts`   - those facts read lazily from a live request frame.
* :mod:`.engine`  - :class:`RuleEngine`: facts in, :class:`Decision` out, seeded and reproducible.
* :mod:`.bucket`  - token buckets for ``throttle`` (time passed in).
* :mod:`.apply`   - a hit's actions done to request and response frames (through
  :mod:`kproxy.protocol`'s mutations, record faults, field and endpoint rewrites).

This package imports :mod:`kproxy.protocol` and PyYAML only; ``kproxy.proxy``
never imports it (it declares the policy interface it needs; the server wires
the two), as pyproject.toml's import contracts enforce.
"""

from kproxy.rules.engine import NO_DECISION, Decision, RuleEngine, RuleHit
from kproxy.rules.load import Problem, RulesError, load_file, load_text
from kproxy.rules.model import Rule, RuleSet
from kproxy.rules.request import RequestFacts, StaticFacts
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
