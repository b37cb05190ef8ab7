"""The marks that choose ``scripts/test --fast``'s tests (tests/conftest.py) name tests that exist,
and the fast selection reaches no broker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import (
    PURE_PASS_MODULES,
    PURE_PASS_TESTS,
    SHARED_SESSION_FIXTURES,
    SHARED_SESSION_MODULES,
    SHARED_SESSION_UNIT,
    SLOW_FIXTURES,
    SLOW_MODULES,
    SLOW_TESTS,
    TESTS,
    SessionSharing,
    compiled_modules,
    may_hold_pure_pass_tests,
    pure_pass_modules,
)
from tests.support.collection_census import CollectedTest, describe, parse


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


def test_the_pure_pass_follows_the_compiled_list() -> None:
    """Every compiled module (pyproject.toml) is exercised by a test module of the pure pass; every
    module the pass names is a kproxy module; a test module is in the pass while it names a compiled one."""
    named = set().union(*PURE_PASS_TESTS.values())
    untested = sorted(compiled_modules() - named)
    assert not untested, f"compiled modules no test module of tests/conftest.py PURE_PASS_TESTS names: {untested}"
    root = TESTS.parent
    unknown = [m for m in named if not (root / (m.replace(".", "/") + ".py")).is_file()]
    assert not unknown, f"tests/conftest.py PURE_PASS_TESTS names modules that do not exist: {unknown}"
    compiled = compiled_modules()
    assert "test_wire.py" in PURE_PASS_MODULES
    assert "test_wire.py" not in pure_pass_modules(compiled - {"kproxy.protocol.primitives"})
    assert "test_session.py" in pure_pass_modules(compiled - {"kproxy.protocol.headers"})  # it names others
    assert pure_pass_modules(frozenset()) == frozenset()


def test_slow_fixtures_are_fixtures_of_the_suite() -> None:
    text = (TESTS / "conftest.py").read_text()
    missing = [f for f in SLOW_FIXTURES if f"def {f}(" not in text]
    assert not missing, f"tests/conftest.py SLOW_FIXTURES names no fixture of its own: {missing}"


def test_this_module_runs_in_the_fast_suite(request: pytest.FixtureRequest) -> None:
    marks = {m.name for m in request.node.iter_markers()}
    assert not marks & {"broker", "slow"}, marks
    assert Path(__file__).parent == TESTS





def whole_suite(request: pytest.FixtureRequest) -> list[CollectedTest]:
    """Every test of the suite, marked as tests/conftest.py marks them: from this session's items when it
    collected the whole suite and kept it (scripts/test), else from a collection of it in a process of
    its own."""
    config = request.config
    paths = {(config.invocation_params.dir / arg.split("::", 1)[0]).resolve() for arg in config.args}
    if paths == {TESTS} and not config.getoption("markexpr") and not config.getoption("keyword"):
        return describe(request.session.items)
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "tests.support.collection_census", "-p", "no:cacheprovider", "-p", "no:randomly",
                           str(TESTS)],
                          cwd=TESTS.parent, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KPROXY_TEST_BUILD": "", "PYTEST_ADDOPTS": ""})
    facts = parse(done.stdout)
    assert done.returncode == 0 and facts, done.stdout[-2000:] + done.stderr[-2000:]
    return facts


def test_the_pure_pass_leaves_out_no_module_that_holds_one_of_its_tests(request: pytest.FixtureRequest) -> None:
    """The pure pass (``-m pure_pass``) does not import the modules ``may_hold_pure_pass_tests`` rules
    out: none of them holds a test marked ``pure_pass``; and the rule does leave modules out."""
    left_out = sorted({t.module for t in whole_suite(request)
                       if "pure_pass" in t.marks and not may_hold_pure_pass_tests(TESTS / t.module)})
    assert not left_out, f"modules holding tests of the pure pass that it would not collect: {left_out}"
    assert may_hold_pure_pass_tests(TESTS / "test_rules_toxics.py")  # pure_only tests, not in PURE_PASS_TESTS
    assert not may_hold_pure_pass_tests(TESTS / "test_suite_times.py")


def test_the_modules_sharing_session_fixtures_are_the_ones_that_use_them(request: pytest.FixtureRequest) -> None:
    """SHARED_SESSION_MODULES (one unit of work, one worker) are the modules whose tests use a fixture of
    SHARED_SESSION_FIXTURES: a module missing makes its worker start another JVM or capture; one listed
    for nothing only keeps the unit longer."""
    using = {t.module for t in whole_suite(request) if t.fixtures & SHARED_SESSION_FIXTURES}
    assert using == SHARED_SESSION_MODULES, (f"use them, not listed: {sorted(using - SHARED_SESSION_MODULES)}; "
                                             f"listed, do not: {sorted(SHARED_SESSION_MODULES - using)}")


def test_the_shared_session_modules_are_one_unit_and_other_modules_their_own() -> None:
    scheduler = SessionSharing.__new__(SessionSharing)
    units = {scheduler._split_scope(f"tests/{m}::test_x") for m in SHARED_SESSION_MODULES}
    assert units == {SHARED_SESSION_UNIT}
    assert scheduler._split_scope("tests/test_session.py::test_x[1]") == "tests/test_session.py"
    assert scheduler._split_scope("tests/fuzz/test_fuzz.py::test_fuzz_briefly[a]") == "tests/fuzz/test_fuzz.py"
