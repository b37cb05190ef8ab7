"""Proxy benchmark: direct vs a bare trio pipe vs kproxy vs `tansu proxy`, against one Tansu broker.

    .venv/bin/python bench/bench_proxy.py [--rounds N] [--quick] [--variants LIST] [--scale] [--seconds S]

Every path is measured in the same run, against the same broker, in rounds
whose path order rotates; medians of the rounds are reported. Processes: the
Tansu broker, the byte pipe (bench/pipe.py), kproxy (bench/run_kproxy.py) and
Tansu's own Rust proxy each run in their own process; the load generator is
this process (raw sockets, requests pre-encoded with kproxy's codec, responses
counted by their size prefix, so the client costs the same on every path).

Phases:

1. sequential round trips (ApiVersions v3, Metadata v1), one request at a time
   on one connection: p50/p99 and what each proxy *adds* over direct;
2. pipelined small requests: 4 connections x 100 in flight, requests/s;
3. Produce v7 of ~100 KB batches (acks=1), 2 connections x 5 in flight, MB/s;
4. Fetch v11 of ~5 MB responses (max bytes 8 MB), 2 connections x 2 in flight, MB/s;
5. each proxy's CPU seconds per GB forwarded over phases 3 and 4, and its RSS
   growth with 1,000 idle connections open through it;
6. with ``--scale``: proxy CPU per request from 1 to 1,000 connections, and per
   Metadata request from 10 to 100,000 partitions (against bench/fake_broker.py,
   which answers a canned Metadata of any size at once).

kproxy runs in several *variants* side by side (``--variants``, named presets,
one kproxy process each; see VARIANTS): no observer, metrics (the default, the
path named plain ``kproxy``), 100 loaded rules none of which match, one matching
0 ms delay rule, capture on, everything on at once, and an A/A copy (a second
process identical to plain kproxy: what it differs by is the run's noise floor,
below which a feature's cost cannot be seen). Rule files come from
bench/_rules.py, written into a temporary directory. The "Targets" tables judge
the hot path's budget: each feature's cost over the variant without it, and
everything on against the bare pipe; ratios are computed within a round, then
the median over rounds is taken.

Prints Markdown tables for docs/PERFORMANCE.md. The parts: bench/_paths.py (the
paths and their processes), _load.py (the load generator), _phases.py (latency,
throughput, idle RSS), _scale.py (``--scale``), _targets.py, _report.py (the tables).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import _tansu  # noqa: E402
from _paths import (  # noqa: E402
    AA,
    DEFAULT_VARIANTS,
    QUICK_VARIANTS,
    VARIANTS,
    Hop,
    pipe_hop,
    rss_kb,
    started,
    tansu_proxy,
    variant_hops,
)
from _phases import ThroughputLog, idle_rss_rows, phase_latency, sanity, setup_topics, throughput_phases  # noqa: E402
from _report import Measurements, print_report  # noqa: E402
from _scale import phase_connections, phase_partitions  # noqa: E402
from _util import machine_line  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, help="rounds per phase, medians reported (default 5; with --quick 2)")
    parser.add_argument("--quick", action="store_true", help="2 rounds unless --rounds, shorter phases (a smoke run)")
    parser.add_argument("--idle-connections", type=int, default=1000)
    parser.add_argument("--seconds", type=float, help="length of each pipelined run (default 1.5; with --quick 1)")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds each proxy is left to settle around its idle-connections RSS readings "
                             "(default 1; 0 for a smoke run)")
    parser.add_argument("--variants", default=None, metavar="LIST",
                        help=f"kproxy presets side by side, comma-separated, from {', '.join(VARIANTS)} "
                             f"(default {DEFAULT_VARIANTS}; with --quick {QUICK_VARIANTS}); 'metrics' (the path "
                             "named plain 'kproxy') is always run")
    parser.add_argument("--scale", action="store_true",
                        help="also measure cost per request from 1 to 1,000 connections and per Metadata request "
                             "from 10 to 100,000 partitions (bench/fake_broker.py)")
    parser.add_argument("--kproxy-env", action="append", default=[], metavar="KEY=VALUE",
                        help="also measure a second kproxy process run with this environment variable "
                             "(repeatable), e.g. MALLOC_TRIM_THRESHOLD_=268435456, side by side with the plain one")
    parser.add_argument("--kproxy-tree", action="append", default=[], metavar="LABEL=DIR",
                        help="also measure the kproxy of another checkout (e.g. before=/tmp/kproxy-old made with "
                             "`git worktree add --detach /tmp/kproxy-old COMMIT`): its bench/run_kproxy.py runs with "
                             "that tree first on PYTHONPATH, side by side with this one (repeatable)")
    args = parser.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.seconds = args.seconds or (1.0 if args.quick else 1.5)
    keys = [k.strip() for k in (args.variants or (QUICK_VARIANTS if args.quick else DEFAULT_VARIANTS)).split(",")
            if k.strip()]
    unknown = [k for k in keys if k not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    if "metrics" not in keys:
        keys.insert(0, "metrics")
    args.keys = keys
    return args


@dataclass
class Run:
    """Where this run keeps its files: rule files and captures (removed at the end), logs, this Python."""

    workdir: Path
    logs: Path
    py: str


@dataclass
class Paths:
    """The paths of one run against the broker, and why ``tansu proxy`` is not one of them."""

    broker_pid: int
    broker_port: int
    hops: list[Hop]
    tansu_proxy_problem: str


def other_kproxies(stack: contextlib.ExitStack, run: Run, upstream: str, env_items: list[str],
                   trees: list[str]) -> list[Hop]:
    """``--kproxy-env``'s kproxy process and one per ``--kproxy-tree`` checkout."""
    hops = []
    if env_items:
        env = dict(item.split("=", 1) for item in env_items)
        proc, port = stack.enter_context(started(
            [run.py, str(BENCH / "run_kproxy.py"), "--upstream", upstream], "kproxy (env)",
            run.logs / "bench-kproxy-env.log", env))
        hops.append(Hop("kproxy " + " ".join(env_items), port, proc))
    for item in trees:
        label, _, tree = item.partition("=")
        root = Path(tree).resolve()
        proc, port = stack.enter_context(started(
            [run.py, str(root / "bench" / "run_kproxy.py"), "--upstream", upstream], f"kproxy {label}",
            run.logs / f"bench-kproxy-{label}.log", {"PYTHONPATH": str(root)}, cwd=root))
        hops.append(Hop(f"kproxy {label}", port, proc, tree=True))
    return hops


def checked(hops: list[Hop], problem: str) -> tuple[list[Hop], str]:
    """``hops`` once each answered correctly; ``tansu proxy`` is left out (the problem said) if it did not."""
    try:
        sanity(hops)
    except Exception as exc:
        bad = [p for p in hops if p.name == "tansu proxy"]
        if not bad:
            raise
        hops = [p for p in hops if p is not bad[0]]
        sanity(hops)
        return hops, f"`tansu proxy` failed the sanity check: {exc!r}"
    return hops, problem


@contextlib.contextmanager
def open_paths(run: Run, args: argparse.Namespace) -> Iterator[Paths]:
    """The Tansu broker with its topics, and every path in front of it, checked, until the block ends."""
    broker_port = _tansu.free_port()
    upstream = f"127.0.0.1:{broker_port}"
    with _tansu.broker(broker_port, run.logs / "bench-tansu-broker.log") as broker_proc, \
            contextlib.ExitStack() as stack:
        hops = [Hop("direct", broker_port), pipe_hop(stack, run.py, upstream, run.logs)]
        tp_proc, tp_port, problem = stack.enter_context(tansu_proxy(broker_port, run.logs / "bench-tansu-proxy.log"))
        hops += variant_hops(stack, run.py, upstream, args.keys, run.workdir, run.logs)
        hops += other_kproxies(stack, run, upstream, args.kproxy_env, args.kproxy_tree)
        if tp_proc is not None:
            hops.append(Hop("tansu proxy", tp_port, tp_proc))
        setup_topics(broker_port)
        hops, problem = checked(hops, problem)
        yield Paths(broker_proc.pid, broker_port, hops, problem)


def measure(run: Run, args: argparse.Namespace) -> Measurements:
    """Every phase through every path, the scale phases with ``--scale``."""
    with open_paths(run, args) as paths:
        machine = machine_line()
        hops = paths.hops
        rss_rows = idle_rss_rows(hops, args.idle_connections, args.settle)  # first, while every proxy is fresh
        n_seq = 300 if args.quick else 1000
        latency = phase_latency(hops, args.rounds, n_seq)
        print("  latency done", file=sys.stderr)
        log = ThroughputLog(paths.broker_pid)
        throughput = throughput_phases(hops, args.rounds, args.quick, log, args.seconds)
        peak = {p.name: rss_kb(p.pid, "VmHWM") for p in hops if p.pid}
        scale: list[str] = []
        if args.scale:
            # The A/A copy measures noise, not cost: the scale phases leave it out.
            proxies = [p for p in hops if p.pid is not None and p.name != AA]
            scale += phase_connections(proxies, args.quick, args.rounds)
            scale += phase_partitions(run.py, [k for k in args.keys if k != "aa"], run.workdir, run.logs, args.quick)
    return Measurements(machine, hops, args.rounds, paths.tansu_proxy_problem, args.idle_connections, rss_rows,
                        n_seq, latency, throughput, log, peak, scale)


def main() -> int:
    args = parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    run = Run(Path(tempfile.mkdtemp(prefix="kproxy-bench-")), Path(os.environ.get("TMPDIR", "/tmp")), sys.executable)
    try:
        print_report(measure(run, args))
    finally:
        shutil.rmtree(run.workdir, ignore_errors=True)  # rule files and captures
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
