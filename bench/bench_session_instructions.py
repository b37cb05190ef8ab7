"""Instructions per exchange through a Session in process, counted by callgrind: what each compiled module buys.

    .venv/bin/python bench/bench_session_instructions.py [--tree LABEL=DIR ...] [--pure] [--pairs 2000]
                                                         [--workloads ...] [--variants ...] [--capture]

Why: the proxy process's count (bench/bench_instructions.py) includes trio's scheduler and epoll,
whose work per request depends on when bytes arrive: two runs of one tree differ by a few percent,
more than a module's share. The session's own work (``receive_client`` + ``receive_upstream`` +
``report``, with the metrics observer and the rules policy as ``kproxy run`` makes them) is the
same instructions for the same bytes: this counts only that, to a fraction of a percent, so a
build variant of ``[tool.kproxy.native]`` (a checkout built with a module left out, ``--tree``)
can be compared with the full build module by module. ``--capture`` counts the capture the same
way: its observer taking a session's exchanges (the loop's side) and its writer reading them into
rows (bench/bench_capture.py's sessions and small kinds). The sockets and the connection pump
(server/connection.py, server/fastio.py) are not in it: measure those with bench_instructions.py.

How: per tree (this one, each ``--tree``, and with ``--pure`` this one with ``KPROXY_PURE=1``) one
worker process runs under callgrind with instrumentation off; per workload and variant
(bench/bench_hotpath.py's sessions and frames) it builds a session, warms it up, and waits; the
driver turns instrumentation on and zeroes the counters, the worker runs ``--pairs`` exchanges,
the driver dumps the counters. The figure is the worker's instructions per exchange.
Prints a Markdown table: each tree's figure and its ratio to the first tree's.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
# Only bench/: kproxy comes from the tree under test (PYTHONPATH), never from this one.
sys.path.insert(0, str(BENCH))

WORKLOADS = ("ApiVersions v3", "Metadata v1", "Produce v7 1x100 B", "Produce v10 1x1 KB",
             "Fetch v11 4 partitions x 1 KB", "Fetch v16 4 partitions x 1 KB", "Heartbeat v4",
             "Fetch v13 1 partition 1 KB")
VARIANTS = ("metrics", "metrics+100 rules", "metrics+1 matching rule")
WARMUP = 300


CAPTURE_KINDS = 4  # bench_capture.py's first kinds: ApiVersions, Metadata, Produce, Fetch (the small ones)


def _session_runs(workloads: list[str], variants: list[str], pairs: int) -> Iterator[tuple[str, Callable[[], None]]]:
    """(label, what to count) per workload and variant: ``pairs`` exchanges through a warmed-up session."""
    import bench_hotpath

    frames = bench_hotpath._frames()
    factories = bench_hotpath._session_factories()
    for workload in workloads:
        request, response = frames[workload]
        for variant in variants:
            session = factories[variant]()

            def run(session: Any = session, request: bytes = request, response: bytes = response, n: int = pairs
                    ) -> None:
                for _ in range(n):
                    session.receive_client(request)
                    session.receive_upstream(response)
                    session.report()

            run(n=WARMUP)
            yield f"{workload}\t{variant}", run


def _capture_runs(pairs: int) -> Iterator[tuple[str, Callable[[], None]]]:
    """(label, what to count) per bench_capture.py kind: the capture observer taking ``pairs``
    exchanges from a session's report (the loop's side), then the writer reading them into rows."""
    import tempfile

    import bench_capture

    with tempfile.TemporaryDirectory() as tmp:
        for kind in range(CAPTURE_KINDS):
            for counted in (False, True):  # once to warm up (imports, caches), once counted
                writer, session = bench_capture._session(Path(tmp), bench_capture._pairs(kind, pairs))
                report: Callable[[], None] = session.report
                if counted:
                    yield f"{bench_capture.KINDS[kind]}\tcapture observer", report
                else:
                    report()
                take = writer.queue.take

                def rows(writer: Any = writer, take: Any = take) -> None:
                    writer.rows(take(pairs))

                if counted:
                    yield f"{bench_capture.KINDS[kind]}\tcapture writer rows", rows
                else:
                    rows()


def worker(workloads: list[str], variants: list[str], pairs: int, capture: bool) -> None:
    """Runs inside the tree under test: per measurement says ``ready LABEL``, waits for a line on
    stdin (instrumentation on), runs it, says ``done``, waits for a line (the dump), then ``end``."""
    runs = _session_runs(workloads, variants, pairs)
    for label, run in itertools.chain(runs, _capture_runs(pairs) if capture else ()):
        print("ready", label, flush=True)
        sys.stdin.readline()
        run()
        print("done", flush=True)
        sys.stdin.readline()
    print("end", flush=True)


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def measure(root: Path, env: dict[str, str], args: argparse.Namespace, work: Path
            ) -> dict[tuple[str, str], float | None]:
    """Instructions per exchange of each (workload, variant) in the tree at ``root`` (None for each
    without callgrind, ``--no-callgrind``: the worker runs as it would, nothing is counted; the smoke run)."""
    from bench_instructions import self_costs

    callgrind = not args.no_callgrind
    work.mkdir(parents=True, exist_ok=True)
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={work}/cg.%p"]
    command = [*(valgrind if callgrind else []),
               sys.executable, str(BENCH / "bench_session_instructions.py"), "--worker", "--pairs", str(args.pairs),
               "--workloads", args.workloads, "--variants", args.variants, *(["--capture"] if args.capture else [])]
    out: dict[tuple[str, str], float | None] = {}
    with (work / "stderr.log").open("wb") as err:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=root,
                                env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(root), **env})
    assert proc.stdin is not None and proc.stdout is not None
    try:
        dumps = 0
        while True:
            said = proc.stdout.readline().decode().rstrip("\n")
            if said == "end":
                break
            if not said.startswith("ready "):
                raise RuntimeError(f"the worker in {root} stopped (see {work / 'stderr.log'})")
            workload, _, variant = said.removeprefix("ready ").partition("\t")
            if callgrind:
                _control(proc.pid, "-i", "on")
                _control(proc.pid, "-z")
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            if proc.stdout.readline().strip() != b"done":
                raise RuntimeError(f"the worker in {root} stopped (see {work / 'stderr.log'})")
            out[(workload, variant)] = None
            if callgrind:
                _control(proc.pid, "-d")
                _control(proc.pid, "-i", "off")
                dumps += 1
                count = sum(self_costs(work / f"cg.{proc.pid}.{dumps}").values()) / args.pairs
                out[(workload, variant)] = count
                print(f"# {root.name}: {workload}, {variant}: {count:,.0f}", file=sys.stderr, flush=True)
            proc.stdin.write(b"next\n")
            proc.stdin.flush()
    finally:
        proc.stdin.close()
        proc.wait(120)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                        help="also count DIR's kproxy (a checkout with its own build)")
    parser.add_argument("--pure", action="store_true", help="also count this tree with KPROXY_PURE=1")
    parser.add_argument("--pairs", type=int, default=2000, help="exchanges counted per workload and variant")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, of: " + ", ".join(WORKLOADS))
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    parser.add_argument("--capture", action="store_true",
                        help="also count the capture: its observer and its writer's rows, per exchange of "
                             "bench_capture.py's small kinds")
    parser.add_argument("--no-callgrind", action="store_true",
                        help="run the workers without valgrind and count nothing (a smoke run of the script)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for w in workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}")
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}")
    if args.worker:
        worker(workloads, variants, args.pairs, args.capture)
        return 0
    if shutil.which("valgrind") is None and not args.no_callgrind:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    trees: list[tuple[str, Path, dict[str, str]]] = [("this tree", BENCH.parent, {})]
    if args.pure:
        trees.append(("pure", BENCH.parent, {"KPROXY_PURE": "1"}))
    for spec in args.tree:
        label, sep, d = spec.partition("=")
        if not sep or not label or not d:
            parser.error(f"--tree takes LABEL=DIR, not {spec!r}")
        trees.append((label, Path(d).resolve(), {}))
    from _util import machine_line, table

    with tempfile.TemporaryDirectory(prefix="kproxy-session-instructions-") as tmp:
        counts = {label: measure(root, env, args, Path(tmp) / str(i)) for i, (label, root, env) in enumerate(trees)}
    first = trees[0][0]
    print(f"### Instructions per exchange through a Session ({machine_line()}; {args.pairs} exchanges each)\n")
    rows = []
    for (w, v), base in counts[first].items():
        row = [w, v, "-" if base is None else f"{base:,.0f}"]
        for label, _, _ in trees[1:]:
            n = counts[label][(w, v)]
            row.append("-" if n is None or base is None else f"{n:,.0f} ({n / base - 1:+.1%})")
        rows.append(row)
    print(table(["workload", "variant", first, *[label for label, _, _ in trees[1:]]], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
