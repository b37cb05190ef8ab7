"""The marks that choose ``scripts/test --fast``'s tests (tests/conftest.py) name tests that exist,
and the fast selection reaches no broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import PURE_PASS_MODULES, SLOW_FIXTURES, SLOW_MODULES, SLOW_TESTS, TESTS


def test_every_slow_module_and_test_exists() -> None:
    missing = [m for m in SLOW_MODULES if not (TESTS / m).is_file()]
    assert not missing, f"tests/conftest.py SLOW_MODULES names modules that do not exist: {missing}"
    for test in SLOW_TESTS:
        module, _, name = test.partition("::")
        path = TESTS / module
        assert path.is_file(), f"tests/conftest.py SLOW_TESTS: no module {module}"
        assert f"def {name}(" in path.read_text(), f"tests/conftest.py SLOW_TESTS: no test {name} in {module}"


def test_every_module_of_the_pure_pass_exists() -> None:
    missing = [m for m in PURE_PASS_MODULES if not (TESTS / m).is_file()]
    assert not missing, f"tests/conftest.py PURE_PASS_MODULES names modules that do not exist: {missing}"


def test_slow_fixtures_are_fixtures_of_the_suite() -> None:
    text = (TESTS / "conftest.py").read_text()
    missing = [f for f in SLOW_FIXTURES if f"def {f}(" not in text]
    assert not missing, f"tests/conftest.py SLOW_FIXTURES names no fixture of its own: {missing}"


def test_this_module_runs_in_the_fast_suite(request: pytest.FixtureRequest) -> None:
    marks = {m.name for m in request.node.iter_markers()}
    assert not marks & {"broker", "slow"}, marks
    assert Path(__file__).parent == TESTS
