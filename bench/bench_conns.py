"""Cost per request as connections grow, and memory per idle connection: kproxy beside the bare pipe.

    .venv/bin/python bench/bench_conns.py [--counts 1,1000] [--rounds 3] [--variants bare,metrics]
                                          [--tree LABEL=DIR] [--idle 1000] [--no-pipelined]

A focused cut of bench_proxy.py (its load generator, idle-connection and /proc helpers, from
bench/_load.py, _paths.py and _phases.py) for working on the pumps (kproxy/server/connection.py,
fastio.py): one Tansu broker, the bare pipe
(bench/pipe.py) and one kproxy process per variant (and per ``--tree`` checkout, e.g. a
``git worktree add --detach`` of main as "before"), all in the same run. For each connection
count N, pipelined ApiVersions v3 with 100 in flight in all (N when N > 100), as bench_proxy's
scale phase does; proxy CPU µs per request from /proc/PID/stat, the path order rotated per round,
medians over rounds. Also the pipelined phase of bench_proxy (4 connections x 100 in flight,
req/s, and each kproxy's reads and writes per request: how its pumps batched) and KB of RSS per
idle connection. ``KPROXY_BENCH_PROFILE=DIR`` in the environment makes
each kproxy process write a cProfile to DIR (bench/run_kproxy.py).

The "flat" figure is issue 14's: kproxy's CPU per request over the pipe's at the largest count,
divided by the same ratio at the smallest (target at most 1.2).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import _tansu  # noqa: E402
import _wire as wire  # noqa: E402
from _load import run_load  # noqa: E402
from _paths import VARIANTS, Hop, cpu_seconds, started, variant_command  # noqa: E402
from _phases import idle_connections_rss, rotated  # noqa: E402
from _util import table  # noqa: E402


def per_request(p: Hop, n: int, per_conn_total: int) -> tuple[float, float]:
    """(proxy CPU s per request, requests/s) for ApiVersions spread over ``n`` connections."""
    assert p.pid is not None
    depth = max(1, 100 // n)
    count = max(2 * depth, per_conn_total // n)
    cpu0, wall0 = cpu_seconds(p.pid), time.perf_counter()
    res = run_load(p.port, wire.api_versions_request(), connections=n, depth=depth, count=count)
    return (cpu_seconds(p.pid) - cpu0) / max(1, res.all_responses), res.all_responses / (time.perf_counter() - wall0)


def churn(p: Hop, n: int) -> tuple[float, float]:
    """(proxy CPU s per connection, connections/s) for ``n`` connections that each make one
    ApiVersions round trip and close: the set-up and tear-down every count's figure includes."""
    assert p.pid is not None
    cpu0, wall0 = cpu_seconds(p.pid), time.perf_counter()
    res = run_load(p.port, wire.api_versions_request(), connections=n, depth=1, count=1)
    return (cpu_seconds(p.pid) - cpu0) / n, res.all_responses / (time.perf_counter() - wall0)


def syscalls(pid: int) -> int:
    """The read and write system calls process ``pid`` made so far (/proc/PID/io: syscr + syscw)."""
    with open(f"/proc/{pid}/io") as f:
        found = dict(line.split(":", 1) for line in f)
    return int(found["syscr"]) + int(found["syscw"])


def pipelined(p: Hop, duration: float) -> tuple[float, float, float]:
    """(proxy CPU s per request, requests/s, reads and writes per request) for bench_proxy's pipelined
    phase: 4 conns x 100 in flight. The last says how the pumps batched: a process that read fewer
    frames per read pays more per request for the same per-frame work (on a shared 2-core machine,
    ~0.2 to ~1 read and write per request from one run of one process to the next, and CPU per
    request with them), so compare CPU per request only between runs that batched alike. Counted by
    /proc/PID/io, which sees read/write/writev (kproxy's plain-TCP pumps, kproxy/server/fastio.py) but
    not recv/send (trio's own stream methods, the pipe's): the pipe's column reads "-"."""
    assert p.pid is not None
    cpu0, calls0 = cpu_seconds(p.pid), syscalls(p.pid)
    res = run_load(p.port, wire.api_versions_request(), connections=4, depth=100, duration=duration, warmup=0.3)
    n = max(1, res.all_responses)
    return (cpu_seconds(p.pid) - cpu0) / n, res.responses / res.seconds, (syscalls(p.pid) - calls0) / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", default="1,1000", help="connection counts (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=6000, help="requests per count per round")
    parser.add_argument("--variants", default="bare,metrics", help=f"from {', '.join(VARIANTS)}")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                        help="also run the kproxy (metrics on) of another checkout (repeatable)")
    parser.add_argument("--env", action="append", default=[], metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
                        help="also run this tree's kproxy (the --tree-variant) with these environment variables")
    parser.add_argument("--tree-variant", default="metrics", help="the variant run for each --tree")
    parser.add_argument("--idle", type=int, default=1000, help="idle connections for the RSS figure (0: skip)")
    parser.add_argument("--no-pipelined", action="store_true", help="skip the 4 x 100 pipelined phase")
    parser.add_argument("--churn", type=int, default=1000,
                        help="connections opened for one request each, for the CPU per connection (0: skip)")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    workdir = Path(tempfile.mkdtemp(prefix="kproxy-conns-"))
    py = sys.executable
    port = _tansu.free_port()
    upstream = f"127.0.0.1:{port}"
    with _tansu.broker(port, workdir / "tansu.log"), contextlib.ExitStack() as stack:
        pipe_proc, pipe_port = stack.enter_context(started(
            [py, str(BENCH / "pipe.py"), "--upstream", upstream], "pipe", workdir / "pipe.log"))
        paths = [Hop("pipe", pipe_port, pipe_proc)]
        for key in args.variants.split(","):
            v = VARIANTS[key]
            proc, vport = stack.enter_context(started(variant_command(py, v, upstream, workdir, key), v.path,
                                                      workdir / f"kproxy-{key}.log", dict(v.env)))
            paths.append(Hop(v.path, vport, proc))
        for item in args.tree:
            label, _, tree = item.partition("=")
            root = Path(tree).resolve()
            v = VARIANTS[args.tree_variant]
            cmd = variant_command(py, v, upstream, workdir, args.tree_variant)
            cmd[1] = str(root / "bench" / "run_kproxy.py")
            proc, vport = stack.enter_context(started(cmd, label, workdir / f"kproxy-{label}.log",
                                                      {"PYTHONPATH": str(root)}, cwd=root))
            paths.append(Hop(f"{v.path} [{label}]", vport, proc))
        for item in args.env:
            label, _, pairs = item.partition(":")
            v = VARIANTS[args.tree_variant]
            env = dict(pair.split("=", 1) for pair in pairs.split(","))
            proc, vport = stack.enter_context(started(variant_command(py, v, upstream, workdir, args.tree_variant),
                                                      label, workdir / f"kproxy-{label}.log", env))
            paths.append(Hop(f"{v.path} [{label}]", vport, proc))

        rss: dict[str, float] = {}
        if args.idle:
            for p in paths:
                before, after = idle_connections_rss(p, args.idle)
                rss[p.name] = (after - before) / args.idle
        for p in paths:  # warm-up: imports, caches, listeners
            per_request(p, 4, 2000)
        cpu: dict[tuple[str, str], list[float]] = {}
        rate: dict[tuple[str, str], list[float]] = {}
        calls: dict[tuple[str, str], list[float]] = {}  # the pipelined phase's reads and writes per request
        phases = ([str(n) for n in counts] + ([] if args.no_pipelined else ["4x100"])
                  + ([f"churn{args.churn}"] if args.churn else []))
        for r in range(args.rounds):
            for phase in phases:
                for p in rotated(paths, r):
                    if phase == "4x100":
                        c, q, k = pipelined(p, 1.0)
                        calls.setdefault((phase, p.name), []).append(k)
                    elif phase.startswith("churn"):
                        c, q = churn(p, args.churn)
                    else:
                        c, q = per_request(p, int(phase), args.requests)
                    cpu.setdefault((phase, p.name), []).append(c)
                    rate.setdefault((phase, p.name), []).append(q)
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr)

    def med(d: dict[tuple[str, str], list[float]], phase: str, name: str) -> float:
        return statistics.median(d[(phase, name)])

    rows = []
    for phase in phases:
        if phase.startswith("churn"):
            rows.append([f"{args.churn:,} conns x 1 request: CPU per connection",
                         *[f"{1e6 * med(cpu, phase, p.name):.0f} µs ({med(rate, phase, p.name):,.0f}/s)"
                           for p in paths]])
            continue
        label = "4 conns x 100 (pipelined)" if phase == "4x100" else f"{int(phase):,} conns"
        rows.append([label, *[f"{1e6 * med(cpu, phase, p.name):.0f} µs ({med(rate, phase, p.name):,.0f}/s)"
                              for p in paths]])
        if phase == "4x100":
            rows.append([f"{label}: reads + writes per request",
                         *[f"{med(calls, phase, p.name):.2f}" if p.name != "pipe" else "-" for p in paths]])
    print(table(["phase", *[p.name for p in paths]], rows))
    if len(counts) > 1:
        first, last = str(counts[0]), str(counts[-1])
        flat = []
        for p in paths[1:]:
            # Ratios within a round, then the median over rounds (the machine is shared).
            at_first = statistics.median(a / b for a, b in zip(cpu[(first, p.name)], cpu[(first, "pipe")], strict=True))
            at_last = statistics.median(a / b for a, b in zip(cpu[(last, p.name)], cpu[(last, "pipe")], strict=True))
            flat.append([p.name, f"{at_first:.2f}x", f"{at_last:.2f}x", f"{at_last / at_first:.2f}"])
        print()
        print(table(["proxy", f"CPU/req / pipe's at {first}", f"at {last}", "flat (<= 1.2)"], flat))
    if rss:
        print()
        print(table(["proxy", f"KB per idle connection ({args.idle:,})"], [[n, f"{kb:.1f}"] for n, kb in rss.items()]))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
