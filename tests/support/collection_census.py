"""What each collected test is, for the suite's tests of its own scheduling (tests/test_suite_marks.py):
its module (relative to tests/), its marks and its fixtures. Loaded as a plugin (``pytest
--collect-only -p tests.support.collection_census``), it prints one ``CENSUS {json}`` line per test
once the collection (and tests/conftest.py's marking) is done."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
PREFIX = "CENSUS "


@dataclass(frozen=True)
class CollectedTest:
    module: str
    marks: frozenset[str]
    fixtures: frozenset[str]


def describe(items: Iterable[pytest.Item]) -> list[CollectedTest]:
    return [CollectedTest(item.path.relative_to(TESTS).as_posix(), frozenset(m.name for m in item.iter_markers()),
                      frozenset(getattr(item, "fixturenames", ())))
            for item in items if item.path.is_relative_to(TESTS)]


def parse(output: str) -> list[CollectedTest]:
    """The facts a run with this plugin printed."""
    rows = [json.loads(line.removeprefix(PREFIX)) for line in output.splitlines() if line.startswith(PREFIX)]
    return [CollectedTest(r["module"], frozenset(r["marks"]), frozenset(r["fixtures"])) for r in rows]


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    for facts in describe(session.items):
        row = {**asdict(facts), "marks": sorted(facts.marks), "fixtures": sorted(facts.fixtures)}
        print(PREFIX + json.dumps(row))
