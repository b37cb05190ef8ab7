"""The fuzz targets in CI: replay the corpus and every recorded failure, then fuzz each target briefly.

The long runs are ``scripts/fuzz --target NAME --seconds N`` (see docs/RELIABILITY.md).
``KPROXY_FUZZ_SECONDS`` sets the brief run per target (default 6; 0 skips it).
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

import pytest

from tests.fuzz.engine import REGRESSIONS, signature, stored_inputs
from tests.fuzz.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]
SECONDS = float(os.environ.get("KPROXY_FUZZ_SECONDS", "6"))
PER_INPUT_SECONDS = 2.0
PER_INPUT_BYTES = 64 * 1024 * 1024
REGRESSION_RSS_BYTES = 256 * 1024 * 1024

# Recorded failures in code another change owns: they must keep failing until fixed there
# (strict xfail turns the fix into a reminder to drop the entry).
KNOWN: dict[str, str] = {
    # kproxy/rules/load_actions.py (act_mutate_metadata's hide_partitions reader indexes partition_ref's BAD)
    "rules_json/crash-b04da7b5d89b307d17adf0fb04e4b9b4e23ff770":
        "TypeError: 'Bad' object is not subscriptable, load_actions.py:237 (a hide_partitions entry with an "
        "unknown or missing key)",
    "rules_yaml/crash-c713295ec1c1fbb640b290c10cd4eff0e408902e":
        "TypeError: 'Bad' object is not subscriptable, load_actions.py:237 (hide_partitions: [{topic: t}])",
    # kproxy/rules/yaml_nodes.py: NodeReader.scalar constructs a scalar the SafeLoader has no constructor for
    "rules_yaml/crash-a45a9a6b9742aed499a7ef9eafdd0c2a2a91a17f":
        "yaml ConstructorError (tag:yaml.org,2002:value) out of load_path, yaml_nodes.py:102: a rule file "
        "that is '=' (any plain '=' scalar read as a value)",
    "rules_yaml/crash-90dc73a6c7a70d2a27e9dc7af7743cae74741236":
        "yaml ConstructorError (a local tag, '!pi') out of load_path, yaml_nodes.py:102: 'seed: !pi 3'",
    # issue 19 defect 1: rule patterns matched by a backtracking engine (kproxy/rules/model.py, engine.py)
    "rules_yaml/slow-49e6f6b6256e17d02bf39dd246d0aa8489d36b48":
        "slow: client_id '(a+)+$' met by a client id of 23 'a' and '!' (re backtracks, seconds per request)",
    # issue 19 defect 10: a throttle rate the loader accepts overflows at run time (kproxy/rules/load_actions.py)
    "rules_yaml/crash-d7fd062cab03044b616c61215412e2eea1ac4cd3":
        "OverflowError: cannot convert float infinity to integer, rule_policy.py:436: throttle "
        "bytes_per_second 5.0e-324 (delay inf) on the second Produce",
    # kproxy/rules/sources.py: load_directory composes a file again for each problem across files (_line)
    "rules_yaml/slow-4fe9ba4cfdd8db5dba408612689b3b9d5fea076d":
        "slow: 60 rule ids repeated in a second file of a directory: each problem's line re-composes the "
        "whole file (sources.py _line), quadratic",
    # issue 19 defect 2: the admin API's JSON decoding (kproxy/admin/server.py respond, json.loads)
    "rules_json/crash-3a62b6dbcffb83ec96c3d90b25f2298db0bf3c55":
        "RecursionError out of AdminServer.respond: a body of 100,000 nested JSON arrays",
    "rules_json/crash-7de9a89f8beaa50f746e48bf7c0f0508df2c1c60":
        "RecursionError out of AdminServer.respond: rules nested 900 arrays deep",
    "rules_json/crash-54b66397ec8349a2b654aa1c7a169156beb2a08a":
        "ValueError out of AdminServer.respond: a 5,001-digit integer (int max str digits)",
    "admin_http/crash-046b3566b9b2a8b864582a493a4a879749da0b2e":
        "RecursionError ends AdminServer.serve: PUT /rules with rules nested 900 arrays deep",
    "admin_http/crash-898c4c8e27913c59081d61a1f66c0fc15e5d8604":
        "ValueError ends AdminServer.serve: PUT /rules with a 5,001-digit integer",
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


@pytest.mark.skipif(SECONDS <= 0, reason="KPROXY_FUZZ_SECONDS=0")
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_briefly(target: str, tmp_path: Path) -> None:
    """Coverage-guided (atheris) or mutation fuzzing of one target for a few seconds: no failure found.

    A failing input is left in ``tmp_path`` and printed; add it under
    tests/fuzz/regressions/<target>/ (scripts/fuzz does that by itself).
    """
    cmd = [sys.executable, "-m", "tests.fuzz.engine", "--target", target, "--seconds", str(SECONDS),
           "--artifacts", str(tmp_path / "failures"), "--seed", "1", "--quiet",
           "--no-generated-coverage"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=SECONDS + 90)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    failures = summary["failures"]
    if failures:
        known = [f for f in failures if _matches_known(target, f)]
        detail = "\n".join(f"{f}: {Path(f).read_bytes().hex() if Path(f).is_file() else ''}" for f in failures)
        if len(known) == len(failures):
            pytest.xfail(f"only already-recorded failures found again:\n{detail}")
        pytest.fail(f"fuzzing {target} found failures:\n{detail}\n{done.stderr[-4000:]}")
    assert summary["runs"] > 0, f"no input was run: {summary}"
    print(json.dumps(summary))


def _matches_known(target: str, failure: str) -> bool:
    """Does a new failing input fail the same way (exception type and kproxy function) as a known one?"""
    path = Path(failure)
    if not path.is_file():
        return False
    mine = _signature(target, path.read_bytes())
    if mine is None:  # a slow input (libFuzzer's timeout): no exception to compare, so never "known"
        return False
    return any(key.startswith(f"{target}/") and not key.split("/")[1].startswith("slow-")
               and _signature(target, (REGRESSIONS / key).read_bytes()) == mine for key in KNOWN)


def _signature(target: str, data: bytes) -> tuple[str, str] | None:
    try:
        with _interrupted_after(2 * PER_INPUT_SECONDS):
            TARGETS[target].run(data)
    except SlowInput:
        return None
    except Exception as exc:
        return signature(exc)
    return None
