"""Run a fuzz target: coverage-guided with atheris (libFuzzer) when installed, else a mutation loop.

    python -m tests.fuzz.engine --target messages --seconds 3600      # what scripts/fuzz runs
    python -m tests.fuzz.engine --list

Inputs start from the target's seeds (built with kproxy's encoders), the stored
corpus (tests/fuzz/corpus/<target>/) and every recorded failure
(tests/fuzz/regressions/<target>/). New coverage goes to a work corpus (not the
repository's); a failing input is written to ``--artifacts`` (by default
tests/fuzz/regressions/<target>/, so it becomes a regression test at once).

Per input, time and memory are bounded: libFuzzer's ``-timeout`` and
``-rss_limit_mb`` (atheris), or a wall-clock check per input in the fallback loop.
The last line printed is a JSON summary (inputs run, exec/s, failures) that
tests/fuzz/test_fuzz.py and docs/RELIABILITY.md use.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
REGRESSIONS = HERE / "regressions"
MAX_LEN = 65536  # libFuzzer's default of 4 KiB is below many valid frames
PER_INPUT_SECONDS = 5  # a decoder is linear in its input: seconds on 64 KiB means a pathology
RSS_LIMIT_MB = 2048


def stored_inputs(target: str) -> Iterator[tuple[Path, bytes]]:
    """The repository's corpus and regression inputs of a target, sorted by path."""
    for root in (CORPUS / target, REGRESSIONS / target):
        if root.is_dir():
            for path in sorted(root.iterdir()):
                if path.is_file() and not path.name.startswith("."):
                    yield path, path.read_bytes()


def write_seeds(target: str, into: Path) -> int:
    """Seeds and the stored corpus, not the regressions: a known failure would end every run at once."""
    from tests.fuzz.targets import TARGETS

    into.mkdir(parents=True, exist_ok=True)
    count = 0
    for data in TARGETS[target].seeds():
        (into / hashlib.sha1(data).hexdigest()).write_bytes(data)
        count += 1
    for path, data in stored_inputs(target):
        if REGRESSIONS in path.parents:
            continue
        (into / hashlib.sha1(data).hexdigest()).write_bytes(data)
        count += 1
    return count


# -- fallback: a plain mutation loop (no coverage feedback) ------------------------------------
_INTERESTING = [b"\x00", b"\xff", b"\x7f", b"\x80", b"\x00\x00", b"\xff\xff", b"\x7f\xff", b"\x80\x00",
                b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00",
                b"\x00\x00\x10\x00", b"\x01", b"\xfe\xff\xff\xff\x0f"]


def mutate(data: bytes, pool: list[bytes], rnd: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        op = rnd.randrange(7)
        pos = rnd.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] ^= 1 << rnd.randrange(8)
        elif op == 1 and buf:
            buf[min(pos, len(buf) - 1)] = rnd.randrange(256)
        elif op == 2:
            token = rnd.choice(_INTERESTING)
            buf[pos : pos + len(token)] = token
        elif op == 3:
            buf[pos:pos] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
        elif op == 4 and buf:
            del buf[pos : pos + rnd.randint(1, 16)]
        elif op == 5 and pool:
            other = rnd.choice(pool)
            cut = rnd.randrange(len(other) + 1)
            buf[pos:] = other[cut:]
        elif op == 6:
            del buf[pos:]
    return bytes(buf[:MAX_LEN])


def run_loop(target: str, seconds: float, artifacts: Path, seed: int) -> dict[str, object]:
    from tests.fuzz.targets import TARGETS

    run = TARGETS[target].run
    prepare = TARGETS[target].prepare
    if prepare is not None:
        prepare()
    pool = [*TARGETS[target].seeds()] + [d for p, d in stored_inputs(target) if REGRESSIONS not in p.parents]
    rnd = random.Random(seed)
    failures: list[str] = []
    runs = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        data = mutate(rnd.choice(pool), pool, rnd) if pool else rnd.randbytes(rnd.randrange(64))
        t0 = time.monotonic()
        try:
            run(data)
        except Exception:
            failures.append(_save(artifacts, data, traceback.format_exc()))
        else:
            if time.monotonic() - t0 > PER_INPUT_SECONDS:
                failures.append(_save(artifacts, data, f"slow input: {time.monotonic() - t0:.1f} s"))
            elif rnd.random() < 0.02 and len(pool) < 5000:
                pool.append(data)  # without coverage feedback: keep a few survivors to mutate further
        runs += 1
        if len(failures) >= 5:
            break
    elapsed = time.monotonic() - start
    return {"target": target, "engine": "mutation-loop", "runs": runs, "seconds": round(elapsed, 1),
            "exec_per_s": int(runs / elapsed) if elapsed else 0, "failures": failures}


def signature(exc: BaseException) -> tuple[str, str]:
    """What kind of failure: the exception type and the innermost kproxy function it passed through."""
    where = ""
    tb = exc.__traceback__
    while tb is not None:
        if "kproxy" in tb.tb_frame.f_code.co_filename:
            where = tb.tb_frame.f_code.co_qualname
        tb = tb.tb_next
    return type(exc).__name__, where


def _save(artifacts: Path, data: bytes, why: str) -> str:
    artifacts.mkdir(parents=True, exist_ok=True)
    path = artifacts / f"crash-{hashlib.sha1(data).hexdigest()}"
    path.write_bytes(data)
    print(f"FAILURE {path}\n{why}", file=sys.stderr)
    return str(path)


# -- atheris: coverage-guided ---------------------------------------------------------------------
# What each target reaches beyond the codec and the session, instrumented for it alone: instrumenting
# a module costs its import several times over, and every brief CI run pays for what it imports.
INSTRUMENTED = ("kproxy.protocol", "kproxy.protocol.records", "kproxy.proxy.session")
TARGET_MODULES: dict[str, tuple[str, ...]] = {
    "rules_yaml": ("kproxy.rules.sources", "kproxy.policy.live_rules", "kproxy.policy.policy"),
    "rules_json": ("kproxy.admin.api_server",),
    "admin_http": ("kproxy.admin.api_server",),
    "capture_records": ("kproxy.capture.observer", "kproxy.capture.record_builder"),
    "record_editors": ("kproxy.protocol.record_faults",),
}


def instrument_kproxy(generated: bool, targets: tuple[str, ...] = ()) -> None:
    """Coverage for libFuzzer: kproxy's modules the ``targets`` reach, and the codecs it generates at run time.

    Must run before anything imports kproxy (the targets module does). The generated
    decoders, scanners and skippers (kproxy/protocol/codegen.py) are compiled from
    source strings, out of reach of import hooks: each namespace they are built in is
    instrumented right after it is filled.
    """
    import importlib

    import atheris

    with atheris.instrument_imports(include=["kproxy"]):
        for module in (*INSTRUMENTED, *(m for t in targets for m in TARGET_MODULES.get(t, ()))):
            importlib.import_module(module)
    if not generated:
        return
    from kproxy.protocol import codegen, scan

    def instrumented(build: Any) -> Any:
        def wrapper(self: Any) -> Any:
            out = build(self)
            for value in list(self.ns.values()):
                code = getattr(value, "__code__", None)
                if code is not None and code.co_filename.startswith("<kproxy") and not getattr(
                        value, "_fuzz_instrumented", False):
                    atheris.instrument_func(value)
                    value._fuzz_instrumented = True
            return out
        return wrapper

    codegen.SchemaCompiler.build = instrumented(codegen.SchemaCompiler.build)  # type: ignore[method-assign]
    scan._ScanCompiler.build_scan = instrumented(scan._ScanCompiler.build_scan)  # type: ignore[method-assign]


def atheris_child(target: str, seconds: float, artifacts: Path, work: Path, seed: int, keep_going: bool) -> None:
    """Hand this process to libFuzzer, which exits when done (its stats go to stderr)."""
    import atheris

    from tests.fuzz.targets import TARGETS

    # libFuzzer stops once the whole seconds since its start exceed -max_total_time: one less than
    # ``seconds`` ends the run at ``seconds`` (0 would mean no limit, so a run lasts two at least).
    argv = [sys.argv[0], str(work), f"-max_total_time={max(math.ceil(seconds) - 1, 1)}", f"-max_len={MAX_LEN}",
            f"-timeout={PER_INPUT_SECONDS}", f"-rss_limit_mb={RSS_LIMIT_MB}", f"-seed={seed}",
            f"-artifact_prefix={artifacts}/", "-print_final_stats=1"]
    run = TARGETS[target].run
    prepare = TARGETS[target].prepare
    if prepare is not None:
        prepare()  # not in the first input's time limit
    if keep_going:
        # libFuzzer's own fork mode re-executes the binary, which under Python is the interpreter:
        # record the first input of each kind of failure here and let the run go on.
        seen: set[tuple[str, str]] = set()

        def one(data: bytes) -> None:
            try:
                run(data)
            except Exception as exc:
                kind = signature(exc)
                if kind not in seen:
                    seen.add(kind)
                    _save(artifacts, data, traceback.format_exc())
    else:
        one = run
    atheris.Setup(argv, one)
    atheris.Fuzz()


def run_atheris(target: str, seconds: float, artifacts: Path, work: Path, seed: int, quiet: bool,
                keep_going: bool, generated_coverage: bool) -> dict[str, object]:
    """libFuzzer ends its process when done: run it in a child and read its final stats."""
    import subprocess

    write_seeds(target, work)
    artifacts.mkdir(parents=True, exist_ok=True)
    before = set(artifacts.iterdir())
    cmd = [sys.executable, "-m", "tests.fuzz.engine", "--target", target, "--seconds", str(seconds),
           "--artifacts", str(artifacts), "--work", str(work), "--seed", str(seed), "--child"]
    if keep_going:
        cmd.append("--keep-going")
    if not generated_coverage:
        cmd.append("--no-generated-coverage")
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=HERE.parents[1], stderr=subprocess.PIPE, text=True, errors="replace")
    assert proc.stderr is not None
    stats, tail = _read_libfuzzer(proc.stderr, quiet)
    return _summary(target, proc.wait(), time.monotonic() - start, stats, tail, artifacts, before, quiet)


def run_forked(targets: list[str], seconds: float, artifacts: Path, seed: int, quiet: bool,
               generated_coverage: bool) -> Iterator[dict[str, object]]:
    """The brief runs of several targets from this one process, whose kproxy modules are already
    instrumented for all of them (``instrument_kproxy``): a forked child per target hands itself to
    libFuzzer, so the instrumentation, which costs more than a brief run's fuzzing, is paid once.

    Each target's failing inputs go to ``artifacts/<target>/``; a summary per target is yielded as
    its child ends. The forked child starts with no thread of the parent's, as libFuzzer needs.
    """
    for target in targets:
        into = artifacts / target
        into.mkdir(parents=True, exist_ok=True)
        before = set(into.iterdir())
        with tempfile.TemporaryDirectory(prefix=f"kproxy-fuzz-{target}-") as work:
            write_seeds(target, Path(work))
            read_end, write_end = os.pipe()
            sys.stdout.flush()
            sys.stderr.flush()
            start = time.monotonic()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child: libFuzzer exits it
                code = 1
                try:
                    os.close(read_end)
                    os.dup2(write_end, 2)
                    atheris_child(target, seconds, into, Path(work), seed, keep_going=False)
                    code = 0
                except SystemExit as exc:
                    # atheris ends the run on a failing input so; libFuzzer's exit hook writes that input
                    # out. C's exit runs the hook and ends the child without going back to the parent's
                    # Python (os._exit would skip the hook, and with it the input).
                    sys.stderr.flush()
                    ctypes.CDLL(None).exit(exc.code if isinstance(exc.code, int) else 1)
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            os.close(write_end)
            with os.fdopen(read_end, encoding="utf-8", errors="replace") as stream:
                stats, tail = _read_libfuzzer(stream, quiet)
            _, status = os.waitpid(pid, 0)
            yield _summary(target, os.waitstatus_to_exitcode(status), time.monotonic() - start, stats, tail,
                           into, before, quiet)


def _read_libfuzzer(stream: Iterator[str], quiet: bool) -> tuple[dict[str, str], list[str]]:
    """libFuzzer's final stats (``-print_final_stats``) and the last lines it wrote."""
    stats: dict[str, str] = {}
    tail: list[str] = []
    for line in stream:
        if line.startswith("stat::"):
            key, _, value = line.removeprefix("stat::").partition(":")
            stats[key.strip()] = value.strip()
        tail = [*tail[-60:], line]
        if not quiet:
            sys.stderr.write(line)
    return stats, tail


def _summary(target: str, code: int, elapsed: float, stats: dict[str, str], tail: list[str], artifacts: Path,
             before: set[Path], quiet: bool) -> dict[str, object]:
    failures = sorted(str(p) for p in set(artifacts.iterdir()) - before)
    if code != 0 and not failures:
        failures = [f"libFuzzer exited with {code}: " + "".join(tail[-20:])]
    if failures and quiet:
        sys.stderr.write("".join(tail))
    runs = int(stats.get("number_of_executed_units", 0))
    return {"target": target, "engine": "atheris", "runs": runs, "seconds": round(elapsed, 1),
            "exec_per_s": int(stats.get("average_exec_per_sec", 0)),
            "new_units": int(stats.get("new_units_added", 0)), "peak_rss_mb": int(stats.get("peak_rss_mb", 0)),
            "failures": failures}


def _target_list(text: str) -> list[str]:
    """NAME,NAME,... or 'all': target names, each checked against the registry."""
    from tests.fuzz.targets import TARGETS

    names = sorted(TARGETS) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown targets {unknown} (--list names them)" if unknown else "no target")
    return names


def main(argv: list[str] | None = None) -> int:
    from tests.fuzz.targets import TARGETS

    parser = argparse.ArgumentParser(prog="scripts/fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=sorted(TARGETS), help="what to fuzz")
    parser.add_argument("--targets", type=_target_list, help="several targets, NAME,NAME,... or 'all', one "
                        "after the other from one instrumented process (atheris only; the brief CI runs use it): "
                        "a JSON summary line per target")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long (default 60)")
    parser.add_argument("--artifacts", type=Path, help="where failing inputs go "
                        "(default tests/fuzz/regressions/<target>/)")
    parser.add_argument("--work", type=Path, help="work corpus that keeps new coverage (default: a temporary dir)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (0: from the clock)")
    parser.add_argument("--no-atheris", action="store_true", help="the plain mutation loop even if atheris is here")
    parser.add_argument("--quiet", action="store_true", help="only the summary (and the output of a failure)")
    parser.add_argument("--list", action="store_true", help="list targets and exit")
    parser.add_argument("--keep-going", action="store_true",
                        help="record each failure and go on (libFuzzer fork mode; for runs of hours)")
    parser.add_argument("--no-generated-coverage", action="store_true",
                        help="leave the generated codecs uninstrumented: ~1000x faster per input, blind to "
                             "their branches (the brief CI runs use it)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    seed = args.seed or int(time.time()) % 1_000_000 + 1
    if args.list or not (args.target or args.targets):
        for name, t in sorted(TARGETS.items()):
            print(f"{name:16} {t.doc}")
        return 0
    artifacts = args.artifacts or REGRESSIONS / (args.target or "")
    try:
        import atheris  # noqa: F401
        have_atheris = not args.no_atheris
    except ImportError:
        have_atheris = False
    if args.child:
        atheris_child(args.target, args.seconds, artifacts, args.work, seed, args.keep_going)
        return 0
    if args.targets:
        if args.target or args.keep_going or args.work:
            parser.error("--targets takes neither --target, --keep-going nor --work")
        root = args.artifacts or REGRESSIONS
        results = (run_forked(args.targets, args.seconds, root, seed, args.quiet, not args.no_generated_coverage)
                   if have_atheris else (run_loop(t, args.seconds, root / t, seed) for t in args.targets))
        failed = False
        for result in results:
            print(json.dumps(result), flush=True)
            failed = failed or bool(result["failures"])
        return 1 if failed else 0
    if have_atheris:
        work = args.work or Path(tempfile.mkdtemp(prefix=f"kproxy-fuzz-{args.target}-"))
        try:
            result = run_atheris(args.target, args.seconds, artifacts, work, seed, args.quiet, args.keep_going,
                                 not args.no_generated_coverage)
        finally:
            if args.work is None:
                shutil.rmtree(work, ignore_errors=True)
    else:
        result = run_loop(args.target, args.seconds, artifacts, seed)
    print(json.dumps(result), flush=True)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parents[1]))
    if "--child" in sys.argv:
        instrument_kproxy(generated="--no-generated-coverage" not in sys.argv,
                          targets=(sys.argv[sys.argv.index("--target") + 1],))
    elif "--targets" in sys.argv and "--no-atheris" not in sys.argv and importlib.util.find_spec("atheris"):
        # before the targets module imports kproxy
        named = sys.argv[sys.argv.index("--targets") + 1]  # unchecked here: main checks the names
        instrument_kproxy(generated="--no-generated-coverage" not in sys.argv,
                          targets=tuple(TARGET_MODULES) if named == "all" else tuple(named.split(",")))
    sys.exit(main())
