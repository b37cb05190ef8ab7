"""The mutation audit's bugs (scripts/mutation_audit.py, docs/TESTING.md) still fit the code.

The audit itself runs the named modules once per bug, minutes in all: it is run by hand when the
tests it names change. What every run checks is that each bug can still be put in (its code is
where the audit says, once) and that the modules it runs exist, so the audit cannot rot unseen.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def audit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_audit", ROOT / "scripts" / "mutation_audit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


AUDIT = audit()


@pytest.mark.parametrize("bug", AUDIT.BUGS, ids=lambda b: f"bug{b.number}")
def test_each_bug_still_goes_into_its_code_and_its_tests_exist(bug: object) -> None:
    text = (ROOT / bug.path).read_text()  # type: ignore[attr-defined]
    mutated = bug.apply(text)  # type: ignore[attr-defined]
    assert mutated is not None, f"bug {bug.number}: its code is no longer in {bug.path}"  # type: ignore[attr-defined]
    assert mutated != text
    if not bug.after:  # type: ignore[attr-defined]
        assert text.count(bug.old) == 1, f"bug {bug.number}: its code is in {bug.path} more than once"  # type: ignore[attr-defined]
    for module in bug.modules:  # type: ignore[attr-defined]
        assert (ROOT / module).is_file(), module


def test_the_bugs_are_numbered_as_the_table_of_docs_testing() -> None:
    numbers = [b.number for b in AUDIT.BUGS]
    assert numbers == list(range(1, len(numbers) + 1))
    table = (ROOT / "docs" / "TESTING.md").read_text()
    for bug in AUDIT.BUGS:
        assert f"| {bug.number} | {bug.what} (`{bug.path.removeprefix('kproxy/')}`)" in table, bug.number
