"""Instructions per exchange through a Session in process, counted by callgrind: what each compiled module buys.

    .venv/bin/python bench/bench_session_instructions.py [--tree LABEL=DIR ...] [--pure] [--pairs 2000]
                                                         [--workloads ...] [--variants ...]

Why: the proxy process's count (bench/bench_instructions.py) includes trio's scheduler and epoll,
whose work per request depends on when bytes arrive: two runs of one tree differ by a few percent,
more than a module's share. The session's own work (``receive_client`` + ``receive_upstream`` +
``report``, with the metrics observer and the rules policy as ``kproxy run`` makes them) is the
same instructions for the same bytes: this counts only that, to a fraction of a percent, so a
build variant of ``[tool.kproxy.native]`` (a checkout built with a module left out, ``--tree``)
can be compared with the full build module by module. The sockets and the connection pump
(server/connection.py, server/fastio.py) and the capture are not in it: measure those with
bench_instructions.py.

How: per tree (this one, each ``--tree``, and with ``--pure`` this one with ``KPROXY_PURE=1``) one
worker process runs under callgrind with instrumentation off; per workload and variant
(bench/bench_hotpath.py's sessions and frames) it builds a session, warms it up, and waits; the
driver turns instrumentation on and zeroes the counters, the worker runs ``--pairs`` exchanges,
the driver dumps the counters. The figure is the worker thread's instructions per exchange.
Prints a Markdown table: each tree's figure and its ratio to the first tree's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
# Only bench/: kproxy comes from the tree under test (PYTHONPATH), never from this one.
sys.path.insert(0, str(BENCH))

WORKLOADS = ("ApiVersions v3", "Metadata v1", "Produce v7 1x100 B", "Fetch v11 4 partitions x 1 KB",
             "Heartbeat v4", "Fetch v13 1 partition 1 KB")
VARIANTS = ("metrics", "metrics+100 rules", "metrics+1 matching rule")
WARMUP = 300


def worker(workloads: list[str], variants: list[str], pairs: int) -> None:
    """Runs inside the tree under test: per (workload, variant) says ``ready``, waits for a line on
    stdin (instrumentation on), runs ``pairs`` exchanges, says ``done``, waits (the dump)."""
    import bench_hotpath

    frames = bench_hotpath._frames()
    factories = bench_hotpath._session_factories()
    for workload in workloads:
        request, response = frames[workload]
        for variant in variants:
            session = factories[variant]()
            for _ in range(WARMUP):
                session.receive_client(request)
                session.receive_upstream(response)
                session.report()
            print("ready", flush=True)
            sys.stdin.readline()
            for _ in range(pairs):
                session.receive_client(request)
                session.receive_upstream(response)
                session.report()
            print("done", flush=True)
            sys.stdin.readline()


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def measure(root: Path, env: dict[str, str], workloads: list[str], variants: list[str], pairs: int,
            work: Path, callgrind: bool = True) -> dict[tuple[str, str], float | None]:
    """Instructions per exchange of each (workload, variant) in the tree at ``root`` (None for each
    without ``callgrind``: the worker runs as it would, nothing is counted; the smoke run)."""
    from bench_instructions import self_costs

    work.mkdir(parents=True, exist_ok=True)
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={work}/cg.%p"]
    command = [*(valgrind if callgrind else []),
               sys.executable, str(BENCH / "bench_session_instructions.py"), "--worker", "--pairs", str(pairs),
               "--workloads", ",".join(workloads), "--variants", ",".join(variants)]
    out: dict[tuple[str, str], float | None] = {}
    with (work / "stderr.log").open("wb") as err:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=root,
                                env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(root), **env})
    assert proc.stdin is not None and proc.stdout is not None
    try:
        dumps = 0
        for workload in workloads:
            for variant in variants:
                if proc.stdout.readline().strip() != b"ready":
                    raise RuntimeError(f"the worker in {root} stopped (see {work / 'stderr.log'})")
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
                    count = sum(self_costs(work / f"cg.{proc.pid}.{dumps}").values()) / pairs
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
        worker(workloads, variants, args.pairs)
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
        counts = {label: measure(root, env, workloads, variants, args.pairs, Path(tmp) / str(i),
                                 callgrind=not args.no_callgrind)
                  for i, (label, root, env) in enumerate(trees)}
    first = trees[0][0]
    print(f"### Instructions per exchange through a Session ({machine_line()}; {args.pairs} exchanges each)\n")
    rows = []
    for w in workloads:
        for v in variants:
            base = counts[first][(w, v)]
            row = [w, v, "-" if base is None else f"{base:,.0f}"]
            for label, _, _ in trees[1:]:
                n = counts[label][(w, v)]
                row.append("-" if n is None or base is None else f"{n:,.0f} ({n / base - 1:+.1%})")
            rows.append(row)
    print(table(["workload", "variant", first, *[label for label, _, _ in trees[1:]]], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
