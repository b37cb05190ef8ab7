"""What the suite says about its own time (tests/support/module_times.py), the threads a module
leaves busy (tests/support/thread_cpu.py) and the order it hands modules to the workers in
(tests/conftest.py LONGEST_FIRST), checked through real pytest runs of real modules."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from tests.conftest import LONGEST_FIRST, TESTS
from tests.support.interpreter_state import StateWatch
from tests.support.module_times import ModuleTimes
from tests.support.thread_cpu import BUSY_SECONDS, StrayThreads, thread_cpu

ROOT = TESTS.parent


def pytest_run(*args: str) -> str:
    """``pytest ARGS`` from the checkout, in its own process, without this run's options; its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_module_times_add_every_phase_and_count_each_test_once() -> None:
    times = ModuleTimes()
    for nodeid, seconds in (("tests/test_a.py::test_one", 1.0), ("tests/test_a.py::test_two[x]", 2.0),
                            ("tests/test_b.py::Case::test_three", 4.0)):
        for when, share in (("setup", 0.25), ("call", 0.5), ("teardown", 0.25)):
            times.add(nodeid, when, seconds * share)
    assert times.longest(5) == [("tests/test_b.py", 4.0, 1), ("tests/test_a.py", 3.0, 2)]
    assert times.longest(1) == [("tests/test_b.py", 4.0, 1)]
    assert times.total() == 7.0
    times.add("tests/test_a.py::test_one", "teardown", 0.0, cpu=0.5)
    assert times.cpu("tests/test_a.py") == 0.5 and times.cpu("tests/test_b.py") == 0.0
    lines = times.lines(5)
    assert lines[1].split() == ["tests/test_b.py", "4.0", "0.0", "57.1%", "1"]
    assert lines[-1].split() == ["all", "2", "modules", "7.0", "0.5"]
    assert ModuleTimes().lines(5) == []


def test_a_run_ends_with_its_longest_modules_also_across_workers() -> None:
    out = pytest_run("-q", "-n", "2", "--dist", "loadfile", "--module-times=2", "tests/test_framing.py",
                     "tests/test_wire.py")
    assert "longest test modules" in out, out
    table = out[out.index("longest test modules"):].splitlines()
    assert table[1].split() == ["module", "seconds", "cpu", "share", "tests"], table
    rows = [line.split() for line in table[2:4]]
    assert sorted(row[0] for row in rows) == ["tests/test_framing.py", "tests/test_wire.py"], table
    assert all(float(row[1]) > 0 for row in rows) and float(rows[0][1]) >= float(rows[1][1]), table
    passed = int(out.split(" passed")[0].split()[-1])
    assert all(float(row[2]) > 0 for row in rows), table  # the CPU the workers spent on them, reported too
    assert sum(int(row[4]) for row in rows) == passed, (table, passed)  # reports from both workers
    assert table[4].split()[:3] == ["all", "2", "modules"], table
    assert "longest test modules" not in pytest_run("-q", "-n", "0", "--module-times=0", "tests/test_framing.py")


def test_the_longest_modules_are_collected_first_and_each_module_stays_in_its_order() -> None:
    missing = [m for m in LONGEST_FIRST if not (TESTS / m).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names modules that do not exist: {missing}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    long_one = next(m for m in LONGEST_FIRST if m.startswith("test_rules_patterns"))
    listed = [line for line in pytest_run("-q", "--collect-only", "tests/test_framing.py", f"tests/{long_one}",
                                          "tests/test_wire.py").splitlines() if "::" in line]
    modules = [line.split("::")[0] for line in listed]
    first_other = modules.index("tests/test_framing.py")
    assert set(modules[:first_other]) == {f"tests/{long_one}"} and f"tests/{long_one}" not in modules[first_other:]
    assert modules[first_other:] == sorted(modules[first_other:], key=["tests/test_framing.py",
                                                                       "tests/test_wire.py"].index)
    framing = [line.split("::")[1].split("[")[0] for line in listed if line.startswith("tests/test_framing.py")]
    source = (TESTS / "test_framing.py").read_text()
    assert framing == sorted(framing, key=lambda name: source.index(f"def {name}(")), framing  # a module's own order


def _until_it_ran(thread: threading.Thread, cpu_seconds: float) -> None:
    """Wait until ``thread`` has spent ``cpu_seconds`` more of CPU (on a loaded machine a spinning
    thread gets less than its wall time), 60 s at most."""
    def used() -> float:
        return thread_cpu().get(thread.native_id or -1, ("", 0.0))[1]

    start, deadline = used(), time.monotonic() + 60
    while used() - start < cpu_seconds and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_busy_thread_another_module_left_is_named_and_one_of_this_module_is_not() -> None:
    strays = StrayThreads()
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    strays.begin("tests/test_a.py")
    left = threading.Thread(target=spin, name="left-behind", daemon=True)
    left.start()
    try:
        strays.end("tests/test_a.py")  # its home is test_a.py: the module that started it
        strays.begin("tests/test_a.py")
        _until_it_ran(left, BUSY_SECONDS * 1.5)
        assert strays.end("tests/test_a.py") == []  # busy in its own module's test: not a stray
        strays.begin("tests/test_b.py")
        _until_it_ran(left, BUSY_SECONDS * 1.5)
        named = strays.end("tests/test_b.py")
    finally:
        stop.set()
        left.join()
    assert len(named) == 1 and named[0].startswith("left-behind (from tests/test_a.py): "), named


def test_a_setting_a_test_leaves_changed_is_named_and_one_put_back_is_not() -> None:
    watch, interval = StateWatch(), sys.getswitchinterval()
    try:
        watch.begin()
        sys.setswitchinterval(0.001)
        sys.setswitchinterval(interval)
        assert watch.end() == []
        watch.begin()
        sys.setswitchinterval(0.001)
        assert watch.end() == [f"switch interval: {interval:g} s -> 0.001 s"]
    finally:
        sys.setswitchinterval(interval)
