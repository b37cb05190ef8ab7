"""The fuzz targets in CI: replay the corpus and every recorded failure, then fuzz each target briefly.

The brief run is a check, not a search: that every target still runs under the fuzzer (its seeds
load, its harness holds) and that the inputs a change makes easy to reach, the first few thousand
mutations of the seeds, find no failure. Finding the deep ones is the long runs' job:
``scripts/fuzz --target NAME --seconds N`` (docs/RELIABILITY.md), whose new failures land in
tests/fuzz/regressions/ and replay here on every run.

Its budget follows the targets' coverage over time (docs/TESTING.md has the figures): the edges a
target reaches in a run's first second are nearly all it reaches in six, so each target gets two
seconds, the least libFuzzer's whole-second clock allows. All the targets run from one process
(``tests.fuzz.engine --targets``) that instruments kproxy once and forks a libFuzzer child per
target: the instrumentation costs more than a brief run's fuzzing, and a fork costs nothing.
``KPROXY_FUZZ_SECONDS`` sets the brief run per target (default 2; 0 skips it).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz.engine import REGRESSIONS, signature, stored_inputs
from tests.fuzz.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]
SECONDS = float(os.environ.get("KPROXY_FUZZ_SECONDS", "2"))
PER_INPUT_SECONDS = 2.0
PER_INPUT_BYTES = 64 * 1024 * 1024
REGRESSION_RSS_BYTES = 256 * 1024 * 1024

# Recorded failures in code another change owns: they must keep failing until fixed there
# (strict xfail turns the fix into a reminder to drop the entry).
KNOWN: dict[str, str] = {
}


def _regressions() -> list[object]:
    params: list[object] = []
    for name in sorted(TARGETS):
        root = REGRESSIONS / name
        for path in sorted(root.iterdir()) if root.is_dir() else []:
            key = f"{name}/{path.name}"
            marks = [pytest.mark.xfail(strict=True, reason=KNOWN[key])] if key in KNOWN else []
            params.append(pytest.param(name, path, id=key, marks=marks))
    return params


def test_every_known_failure_is_still_stored() -> None:
    missing = [key for key in KNOWN if not (REGRESSIONS / key).is_file()]
    assert not missing, f"KNOWN names inputs that are not in tests/fuzz/regressions: {missing}"


class _OverTime(Exception):
    pass


class SlowInput(AssertionError):
    """An input stopped past its time bound."""


@contextlib.contextmanager
def _interrupted_after(seconds: float) -> Iterator[None]:
    """Stop a slow input (a known one, until its fix) at the next Python bytecode past ``seconds``:
    the replay costs the suite that long, not the minutes a bomb takes."""
    def stop(signum: int, frame: object) -> None:
        raise _OverTime

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _OverTime:
        raise SlowInput(f"over {seconds} s: stopped") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(("target", "path"), _regressions())
def test_regression(target: str, path: Path) -> None:
    """Every input that ever failed a target passes it now, within the time bound of a fuzzed input.

    Timed without tracemalloc (it slows allocation-heavy inputs tenfold); memory is bounded by the
    process's peak RSS, which a decompression bomb would raise far past REGRESSION_RSS_BYTES.
    """
    prepare = TARGETS[target].prepare
    if prepare is not None:
        prepare()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.monotonic()
    with _interrupted_after(2 * PER_INPUT_SECONDS):
        TARGETS[target].run(path.read_bytes())
    took = time.monotonic() - t0
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert took <= PER_INPUT_SECONDS, f"{took:.2f} s (bound {PER_INPUT_SECONDS} s)"
    assert grew <= REGRESSION_RSS_BYTES, f"peak RSS grew {grew >> 20} MiB"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_corpus_and_seeds(target: str) -> None:
    """Seeds and the stored corpus pass, each within its time and memory bound."""
    inputs = [(f"seed {i}", d) for i, d in enumerate(TARGETS[target].seeds())]
    inputs += [(str(p.relative_to(ROOT)), d) for p, d in stored_inputs(target) if "regressions" not in p.parts]
    assert inputs, f"target {target} has no seeds"
    prepare = TARGETS[target].prepare
    if prepare is not None:
        prepare()
    # A first pass untraced: the codecs a target meets are generated and compiled on first use, once per
    # process, which under tracemalloc costs several times the inputs themselves; the bounds are on the
    # inputs, timed and traced in the second pass.
    for label, data in inputs:
        if "regressions" not in label:
            TARGETS[target].run(data)
    failures = []
    tracemalloc.start()
    try:
        for label, data in inputs:
            if "regressions" in label:
                continue
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            t0 = time.monotonic()
            TARGETS[target].run(data)
            took = time.monotonic() - t0
            peak = tracemalloc.get_traced_memory()[1] - before
            if took > PER_INPUT_SECONDS or peak > PER_INPUT_BYTES:
                failures.append(f"{label}: {took:.2f} s, {peak >> 20} MiB peak")
    finally:
        tracemalloc.stop()
    assert not failures, "inputs over their budget:\n" + "\n".join(failures)


@pytest.fixture(scope="module")
def brief_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The brief run of every target this session selected, from one process that instruments kproxy once
    and forks a libFuzzer child per target (``--targets``): the engine's JSON summary by target, its
    stderr, and where failing inputs went."""
    targets = sorted({str(item.callspec.params["target"]) for item in request.session.items
                      if isinstance(item, pytest.Function) and item.originalname == "test_fuzz_briefly"})
    artifacts = tmp_path_factory.mktemp("fuzz-failures")
    cmd = [sys.executable, "-m", "tests.fuzz.engine", "--targets", ",".join(targets), "--seconds", str(SECONDS),
           "--artifacts", str(artifacts), "--seed", "1", "--quiet", "--no-generated-coverage"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=len(targets) * (SECONDS + 30) + 90)
    summaries = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            summary = json.loads(line)
            summaries[summary["target"]] = summary
    return {"summaries": summaries, "stderr": done.stderr, "returncode": done.returncode}


@pytest.mark.skipif(SECONDS <= 0, reason="KPROXY_FUZZ_SECONDS=0")
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_briefly(target: str, brief_runs: dict[str, Any]) -> None:
    """Coverage-guided (atheris) or mutation fuzzing of one target for a few seconds: no failure found.

    A failing input is left in the module's temporary directory and printed; add it under
    tests/fuzz/regressions/<target>/ (scripts/fuzz does that by itself).
    """
    summary = brief_runs["summaries"].get(target)
    assert summary is not None, f"no summary for {target} (exit {brief_runs['returncode']}):\n" \
                                f"{brief_runs['stderr'][-4000:]}"
    failures = summary["failures"]
    if failures:
        known = [f for f in failures if _matches_known(target, f)]
        detail = "\n".join(f"{f}: {Path(f).read_bytes().hex() if _is_file(f) else ''}" for f in failures)
        if len(known) == len(failures):
            pytest.xfail(f"only already-recorded failures found again:\n{detail}")
        pytest.fail(f"fuzzing {target} found failures:\n{detail}\n{brief_runs['stderr'][-4000:]}")
    assert summary["runs"] > 0, f"no input was run: {summary}"
    print(json.dumps(summary))


def _matches_known(target: str, failure: str) -> bool:
    """Does a new failing input fail the same way (exception type and kproxy function) as a known one?"""
    if not _is_file(failure):
        return False
    path = Path(failure)
    mine = _signature(target, path.read_bytes())
    if mine is None:  # a slow input (libFuzzer's timeout): no exception to compare, so never "known"
        return False
    return any(key.startswith(f"{target}/") and not key.split("/")[1].startswith("slow-")
               and _signature(target, (REGRESSIONS / key).read_bytes()) == mine for key in KNOWN)


def _is_file(failure: str) -> bool:
    """Is a failure an input's path (not the engine's account of a crash without one)?"""
    try:
        return Path(failure).is_file()
    except OSError:  # a message too long for a file name
        return False


def _signature(target: str, data: bytes) -> tuple[str, str] | None:
    try:
        with _interrupted_after(2 * PER_INPUT_SECONDS):
            TARGETS[target].run(data)
    except SlowInput:
        return None
    except Exception as exc:
        return signature(exc)
    return None
