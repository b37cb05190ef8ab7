"""Where a run's time went, per test module: the sum of its tests' setup, call and teardown times.

tests/conftest.py feeds every test report to a :class:`ModuleTimes` and prints its longest modules
at the end of the run (``--module-times=N``, 0 for none). Under pytest-xdist the reports reach the
controller from every worker, so the table covers the whole run; a module's figure is the time a
worker spent on it (its module fixtures included, and a session fixture in whichever module first
asked for it), which is what a module scheduled last adds to the run's wall time.

Beside the seconds, the CPU seconds the module cost: its worker's own, and those of the processes
its tests started and waited for (brokers, kproxy processes, pip, Spark's JVMs), read with
``getrusage`` around every phase. Seconds much above CPU seconds are a module waiting (on a broker,
a sleep, a subprocess's start-up): more workers than cores run such modules side by side, where a
module whose CPU seconds equal its seconds only takes cores from the others. A process that
outlives its test, or is never waited for (a container started through podman), is not counted.
"""

from __future__ import annotations

import resource
from collections import defaultdict


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children waited for, so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class ModuleTimes:
    """Seconds, CPU seconds and test counts per module path (``tests/test_x.py``), from test reports."""

    def __init__(self) -> None:
        self._seconds: defaultdict[str, float] = defaultdict(float)
        self._cpu: defaultdict[str, float] = defaultdict(float)
        self._tests: defaultdict[str, int] = defaultdict(int)

    def add(self, nodeid: str, when: str, duration: float, cpu: float = 0.0) -> None:
        """Count one phase (``setup``, ``call`` or ``teardown``) of the test ``nodeid``: its
        ``duration`` and the ``cpu`` seconds it cost."""
        module = nodeid.split("::", 1)[0]
        self._seconds[module] += duration
        self._cpu[module] += cpu
        if when == "call":
            self._tests[module] += 1

    def total(self) -> float:
        """Seconds of every phase of every test reported: the run's time summed over its workers."""
        return sum(self._seconds.values())

    def cpu_total(self) -> float:
        """CPU seconds of every phase of every test reported."""
        return sum(self._cpu.values())

    def longest(self, count: int) -> list[tuple[str, float, int]]:
        """The ``count`` modules that took longest: (module, seconds, tests run), longest first."""
        ranked = sorted(self._seconds.items(), key=lambda item: (-item[1], item[0]))
        return [(module, seconds, self._tests[module]) for module, seconds in ranked[:count]]

    def cpu(self, module: str) -> float:
        """The CPU seconds ``module`` cost."""
        return self._cpu[module]

    def lines(self, count: int) -> list[str]:
        """The table printed at the end of a run."""
        total = self.total()
        rows = self.longest(count)
        if not rows:
            return []
        width = max(len(module) for module, _, _ in rows)
        out = [f"{'module':<{width}}  {'seconds':>8}  {'cpu':>8}  {'share':>6}  {'tests':>6}"]
        for module, seconds, tests in rows:
            share = seconds / total if total else 0.0
            out.append(f"{module:<{width}}  {seconds:>8.1f}  {self._cpu[module]:>8.1f}  {share:>6.1%}  {tests:>6}")
        out.append(f"{'all ' + str(len(self._seconds)) + ' modules':<{width}}  {total:>8.1f}  {self.cpu_total():>8.1f}")
        return out
