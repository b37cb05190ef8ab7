"""bench/bench_analysis.py end to end at its smallest size (a smoke run; see tests/test_bench_smoke.py).

Apart from the other benchmarks because its Spark session (a JVM) is as long as the rest of their
smoke runs put together: a module of its own goes to a worker of its own.
"""

from __future__ import annotations

from tests.test_bench_smoke import TABLE, smoke_run


def test_smoke_run_analysis() -> None:
    smoke_run("bench_analysis.py", ["--records", "1000", "--repeats", "1"], (TABLE,))
