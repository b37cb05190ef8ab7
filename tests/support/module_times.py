"""Where a run's time went, per test module: the sum of its tests' setup, call and teardown times.

tests/conftest.py feeds every test report to a :class:`ModuleTimes` and prints its longest modules
at the end of the run (``--module-times=N``, 0 for none). Under pytest-xdist the reports reach the
controller from every worker, so the table covers the whole run; a module's figure is the time a
worker spent on it (its module fixtures included, and a session fixture in whichever module first
asked for it), which is what a module scheduled last adds to the run's wall time.
"""

from __future__ import annotations

from collections import defaultdict


class ModuleTimes:
    """Seconds and test counts per module path (``tests/test_x.py``), from test reports."""

    def __init__(self) -> None:
        self._seconds: defaultdict[str, float] = defaultdict(float)
        self._tests: defaultdict[str, int] = defaultdict(int)

    def add(self, nodeid: str, when: str, duration: float) -> None:
        """Count one phase (``setup``, ``call`` or ``teardown``) of the test ``nodeid``."""
        module = nodeid.split("::", 1)[0]
        self._seconds[module] += duration
        if when == "call":
            self._tests[module] += 1

    def total(self) -> float:
        """Seconds of every phase of every test reported: the run's time summed over its workers."""
        return sum(self._seconds.values())

    def longest(self, count: int) -> list[tuple[str, float, int]]:
        """The ``count`` modules that took longest: (module, seconds, tests run), longest first."""
        ranked = sorted(self._seconds.items(), key=lambda item: (-item[1], item[0]))
        return [(module, seconds, self._tests[module]) for module, seconds in ranked[:count]]

    def lines(self, count: int) -> list[str]:
        """The table printed at the end of a run."""
        total = self.total()
        rows = self.longest(count)
        if not rows:
            return []
        width = max(len(module) for module, _, _ in rows)
        out = [f"{'module':<{width}}  {'seconds':>8}  {'share':>6}  {'tests':>6}"]
        for module, seconds, tests in rows:
            share = seconds / total if total else 0.0
            out.append(f"{module:<{width}}  {seconds:>8.1f}  {share:>6.1%}  {tests:>6}")
        out.append(f"{'all ' + str(len(self._seconds)) + ' modules':<{width}}  {total:>8.1f}")
        return out
