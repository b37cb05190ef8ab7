"""bench_proxy.py's ``--scale`` phases: proxy CPU per request from 1 to 1,000 connections, and per
Metadata request from 10 to 100,000 partitions (against bench/fake_broker.py).

Each returns Markdown blocks (a heading, what was measured, the tables) for the report.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from pathlib import Path

import _wire as wire
from _load import round_trips, run_load
from _paths import BENCH, Hop, cpu_seconds, pipe_hop, started, variant_hops
from _phases import rotated
from _util import percentile, table, verdict

CONNECTION_COUNTS = (1, 10, 100, 1000)
PARTITION_COUNTS = (10, 1_000, 100_000)


# -- connections --------------------------------------------------------------------------------
def cpu_per_request_at(p: Hop, n: int, per_conn_total: int) -> tuple[float, float]:
    """(proxy CPU s per request, requests/s) of pipelined ApiVersions over ``n`` connections, at
    least 100 in flight in all (depth 100/n per connection). Connections are opened, and closed,
    outside the measured span: at 1,000 connections of a few requests each, accept and close
    would otherwise be most of the figure."""
    pid = p.pid
    assert pid is not None
    depth = max(1, 100 // n)
    count = max(2 * depth, per_conn_total // n)
    marks: list[tuple[float, float]] = []  # (proxy CPU s, wall s) when the load starts and ends

    def mark() -> None:
        marks.append((cpu_seconds(pid), time.perf_counter()))

    res = run_load(p.port, wire.api_versions_request(), connections=n, depth=depth, count=count, on_ready=mark,
                   on_drained=mark)
    (cpu0, wall0), (cpu1, wall1) = marks
    done = max(1, res.all_responses)
    return (cpu1 - cpu0) / done, done / (wall1 - wall0)


def connection_rows(proxies: list[Hop], cpu: dict[tuple[int, str], float],
                    rate: dict[tuple[int, str], float]) -> list[list[str]]:
    """Per connection count, each proxy's CPU µs per request (requests/s)."""
    return [[f"{n:,}", f"{max(n, 100):,}", *[f"{1e6 * cpu[(n, p.name)]:.0f} ({rate[(n, p.name)]:,.0f}/s)"
                                             for p in proxies]] for n in CONNECTION_COUNTS]


def flatness_rows(proxies: list[Hop], cpu: dict[tuple[int, str], float]) -> list[list[str]]:
    """Each kproxy's CPU per request over the pipe's, at the largest count against the smallest.
    The pipe's own cost per request grows with the connection count (fewer requests per wake-up),
    so "flat" is judged on kproxy's cost relative to the pipe's at the same count."""
    rows: list[list[str]] = []
    if not any(q.name == "pipe" for q in proxies):
        return rows
    first, last = CONNECTION_COUNTS[0], CONNECTION_COUNTS[-1]
    for p in proxies:
        if not p.name.startswith("kproxy"):
            continue
        at_first = cpu[(first, p.name)] / cpu[(first, "pipe")]
        at_last = cpu[(last, p.name)] / cpu[(last, "pipe")]
        rows.append([f"{p.name}: CPU per request / pipe's, at {last:,} connections vs at {first}",
                     f"{at_last:.2f}x vs {at_first:.2f}x ({at_last / at_first:.2f})", "<= 1.2 (flat)",
                     verdict(at_last / at_first <= 1.2)])
    return rows


def phase_connections(proxies: list[Hop], quick: bool, rounds: int = 3) -> list[str]:
    """Proxy CPU per pipelined ApiVersions from 1 to 1,000 connections, every proxy in each of
    ``rounds`` rounds, the order rotated per round; medians. One connection with 100 in flight
    settles into large or small batches per read from run to run (its CPU per request moved
    25-105 µs between single runs), hence rounds."""
    per_conn_total = 2000 if quick else 12000
    samples: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for n in CONNECTION_COUNTS:
        for r in range(rounds):
            for p in rotated(proxies, r):
                samples.setdefault((n, p.name), []).append(cpu_per_request_at(p, n, per_conn_total))
        print(f"  scale: {n} connections done", file=sys.stderr)
    cpu = {k: statistics.median(c for c, _ in v) for k, v in samples.items()}
    rate = {k: statistics.median(r for _, r in v) for k, v in samples.items()}
    out = [f"#### Scale: connections\n\nProxy CPU µs per pipelined ApiVersions v3 request (requests/s in "
           f"parentheses; medians of {rounds} rounds), the load spread over N connections (100 in flight in all, "
           "N when N > 100; "
           "connections opened, and one round trip made on each, before the CPU and the time are read; "
           "closed after).\n",
           table(["connections", "in flight", *[p.name for p in proxies]], connection_rows(proxies, cpu, rate)),
           "", table(["metric", "measured", "target", "status"], flatness_rows(proxies, cpu))]
    return ["\n".join(out)]


# -- partitions ---------------------------------------------------------------------------------
def metadata_round_trips(paths: list[Hop], n: int, quick: bool) -> tuple[dict[str, list[float]], dict[str, float], int]:
    """Sequential Metadata v1 round trips asking the topic of ``n`` partitions, through every
    path in five slices, the order rotated per slice: (seconds per round trip and proxy CPU
    seconds per path, round trips per path)."""
    frame = wire.metadata_request([f"partitions-{n}"])
    # CPU time comes in clock ticks (10 ms): enough requests that a tick is a small share.
    total = max(10, min(1000, 2_000_000 // n)) if not quick else max(5, min(200, 200_000 // n))
    socks = {p.name: wire.connect(p.port) for p in paths}
    try:
        for p in paths:
            round_trips(socks[p.name], frame, 2)  # warm up (the fake broker encodes on first use)
        samples: dict[str, list[float]] = {p.name: [] for p in paths}
        cpu = {p.name: 0.0 for p in paths}
        per_slice = max(1, total // 5)
        for k in range(5):
            for p in rotated(paths, k):
                cpu0 = cpu_seconds(p.pid) if p.pid else 0.0
                samples[p.name].extend(round_trips(socks[p.name], frame, per_slice))
                if p.pid:
                    cpu[p.name] += cpu_seconds(p.pid) - cpu0
    finally:
        for sock in socks.values():
            sock.close()
    return samples, cpu, 5 * per_slice


def partition_rows(paths: list[Hop], n: int, quick: bool) -> list[list[str]]:
    """The rows of one partition count: each path's p50, added p50 and proxy CPU per request."""
    samples, cpu, requests = metadata_round_trips(paths, n, quick)
    direct50 = percentile(samples["direct"], 50)
    rows = []
    for p in paths:
        p50 = percentile(samples[p.name], 50)
        per_req = cpu[p.name] / requests
        rows.append([f"{n:,}", p.name, f"{p50 * 1e3:.2f}",
                     "-" if p.pid is None else f"{(p50 - direct50) * 1e3:+.2f}",
                     "-" if p.pid is None else f"{per_req * 1e6:,.0f}",
                     "-" if p.pid is None else f"{per_req * 1e9 / n:,.0f}"])
    return rows


def phase_partitions(py: str, keys: list[str], workdir: Path, logs: Path, quick: bool) -> list[str]:
    """Sequential Metadata v1 round trips of 10 to 100,000 partitions through the pipe and each
    kproxy variant, against bench/fake_broker.py: p50, added p50 and proxy CPU per request."""
    counts = (10, 1_000, 10_000) if quick else PARTITION_COUNTS
    rows = []
    with contextlib.ExitStack() as stack:
        _fb_proc, fb_port = stack.enter_context(started(
            [py, str(BENCH / "fake_broker.py"), "--partitions", ",".join(map(str, counts))], "fake broker",
            logs / "bench-fake-broker.log"))
        upstream = f"127.0.0.1:{fb_port}"
        paths = [Hop("direct", fb_port), pipe_hop(stack, py, upstream, logs, " (fake broker)", "-fake"),
                 *variant_hops(stack, py, upstream, keys, workdir, logs, "-fake")]
        time.sleep(3.0)  # kproxy compiles its likely codecs in the background at start: not a request's cost
        for n in counts:
            rows += partition_rows(paths, n, quick)
            print(f"  scale: Metadata of {n:,} partitions done", file=sys.stderr)
    return ["#### Scale: Metadata partitions\n\nSequential Metadata v1 round trips (one topic asked, its "
            "answer canned by bench/fake_broker.py: topics of 100 partitions, 1 replica), medians over the "
            "requests; proxy CPU per request from /proc. The bytes to move grow with the partition count for "
            "every path: compare each kproxy row with the pipe's at the same count.\n\n"
            + table(["partitions", "path", "p50 ms", "added p50 ms", "proxy CPU µs/req", "proxy CPU ns/partition"],
                    rows)]
