"""bench_proxy.py's report: the Markdown of docs/PERFORMANCE.md from one run's measurements.

Each ``print_*`` function prints one section (its heading, what was measured, its table, a
blank line) to stdout; :func:`print_report` prints them all in the report's order.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

import _tansu
from _paths import Hop
from _phases import BATCH_BYTES, FETCH_BATCHES, LATENCY_SLICE, LatencyPhase, Throughput, ThroughputLog
from _targets import feature_targets, latency_target_rows, throughput_target_rows
from _util import table


@dataclass
class Measurements:
    """Everything one run measured, for the report."""

    machine: str  # _util.machine_line() when the measuring started
    paths: list[Hop]
    rounds: int
    tansu_proxy_problem: str  # why `tansu proxy` was not measured ("" when it was)
    idle_connections: int
    rss_rows: list[list[str]]
    n_seq: int  # sequential requests per path per round
    latency: LatencyPhase
    throughput: Throughput
    log: ThroughputLog
    peak_rss_kb: dict[str, int]
    scale: list[str]  # the --scale phases' Markdown blocks


def pct(a: float, b: float) -> str:
    return f"{100 * a / b:.0f}%"


def print_header(m: Measurements) -> None:
    print(f"### Proxy benchmark ({m.machine})\n")
    print(f"Broker: Tansu ({Path(_tansu.tansu_binary()).name}, memory storage). Paths: "
          + ", ".join(p.name for p in m.paths) + f". Median of {m.rounds} rounds, path order rotated per round.\n")
    if m.tansu_proxy_problem:
        print(f"**tansu proxy not measured**: {m.tansu_proxy_problem}\n")


def print_latency(m: Measurements) -> None:
    print("#### Sequential round trips (one connection per path, one request at a time)\n")
    print(f"{m.n_seq} requests per path per round, interleaved across paths {LATENCY_SLICE} at a time; "
          f"p50 and p99 of each round, median of {m.rounds} rounds. 'added' = path minus direct in the "
          "same round (p99 differences are noisy on a shared machine and can come out negative). "
          "'proxy CPU' is the proxy process's CPU time per request (from /proc/PID/stat).\n")
    print(table(["request", "path", "p50 µs", "p99 µs", "added p50 µs", "added p99 µs", "proxy CPU µs/req"],
                m.latency.rows))
    print()


def print_throughput(m: Measurements) -> None:
    names = [p.name for p in m.paths]
    tp = m.throughput
    rows = []
    for label, rates in tp.pipelined.items():
        rows.append([f"pipelined {label}, 4 conns x 100 in flight", "req/s",
                     *[f"{rates[n]:,.0f} ({pct(rates[n], rates['direct'])})" for n in names]])
    rows.append([f"Produce v7 ~{BATCH_BYTES // 1000} KB batches, acks=1, 2 conns x 5 in flight", "MB/s",
                 *[f"{tp.produce[n]:.1f} ({pct(tp.produce[n], tp.produce['direct'])})" for n in names]])
    rows.append([f"Fetch v11 ~{FETCH_BATCHES * BATCH_BYTES // 1_000_000} MB responses, 2 conns x 2 in flight", "MB/s",
                 *[f"{tp.fetch[n]:.1f} ({pct(tp.fetch[n], tp.fetch['direct'])})" for n in names]])
    print(f"#### Throughput (median of {m.rounds} rounds; % of direct in parentheses)\n")
    print("MB/s counts request plus response bytes through the path.\n")
    print(table(["load", "unit", *names], rows))
    print()


def print_utilisation(m: Measurements) -> None:
    rows = []
    for (label, name), runs in m.log.utilisation.items():
        client, proxy, broker = (statistics.median(x[i] for x in runs) for i in range(3))
        rows.append([label, name, f"{client:.0f}", "-" if name == "direct" else f"{proxy:.0f}", f"{broker:.0f}"])
    print("CPU use during those runs (% of one core, median of the rounds; the machine has "
          f"{os.cpu_count()} cores in all). A proxy near 100% is the bottleneck of its path.\n")
    print(table(["load", "path", "client %", "proxy %", "broker %"], rows))
    print()


def cost_cells(p: Hop, pipelined_keys: list[str]) -> list[str]:
    """One proxy's CPU µs per pipelined request, CPU s per GB of Produce, of Fetch, of both."""
    cells = [f"{1e6 * p.cpu_s[k] / p.requests[k]:.0f}" if p.requests.get(k) else "-" for k in pipelined_keys]
    for key in ("produce", "fetch"):
        gb = p.bytes_moved.get(key, 0) / 1e9
        cells.append(f"{p.cpu_s.get(key, 0.0) / gb:.1f}" if gb else "-")
    both_gb = (p.bytes_moved.get("produce", 0) + p.bytes_moved.get("fetch", 0)) / 1e9
    both_cpu = p.cpu_s.get("produce", 0.0) + p.cpu_s.get("fetch", 0.0)
    cells.append(f"{both_cpu / both_gb:.1f}" if both_gb else "-")
    return cells


def print_cost(m: Measurements) -> None:
    pipelined_keys = [f"pipelined {label}" for label in m.throughput.pipelined]
    rows = [[p.name, *cost_cells(p, pipelined_keys), f"{m.peak_rss_kb[p.name] / 1024:.0f}"]
            for p in m.paths if p.pid is not None]
    print("#### Proxy process cost\n")
    print("CPU time of the proxy process (user+system, all threads, from /proc/PID/stat): per request in the "
          "pipelined phases, per GB of request+response bytes forwarded in the Produce and Fetch phases; "
          "peak RSS over the whole run. CPU time is far less sensitive to a noisy neighbour than throughput.\n")
    print(table(["proxy", *[f"CPU µs/req {k}" for k in pipelined_keys], "CPU s/GB produce", "CPU s/GB fetch",
                 "CPU s/GB produce+fetch", "peak RSS MB"], rows))
    print()


def print_idle_rss(m: Measurements) -> None:
    print(f"RSS with {m.idle_connections:,} idle client connections open (each with its upstream "
          "connection, each having answered one ApiVersions):\n")
    print(table(["proxy", "RSS before MB", "RSS with conns MB", "delta MB", "KB per connection"], m.rss_rows))
    print()


def print_targets(m: Measurements) -> None:
    print("#### Targets\n")
    print(table(["metric", "measured", "target", "status"],
                latency_target_rows(m.latency.ratios) + throughput_target_rows(m.throughput)))
    print()
    budget_rows = feature_targets(m.paths, m.latency.added_rounds, m.log.per_round)
    if budget_rows:
        print("#### Targets: the hot-path budget with features on (issue 14)\n")
        print("Each feature's cost over the same kproxy without it, and everything on against the bare pipe. "
              "Ratios are computed within each round (same noise on both sides), then the median over rounds; "
              "'over' = how much more added latency, or how much less throughput. CPU per GB is over the whole "
              "Produce + Fetch phases.\n")
        print(table(["metric", "measured", "target", "status"], budget_rows))
        print()


def print_report(m: Measurements) -> None:
    print_header(m)
    print_latency(m)
    print_throughput(m)
    print_utilisation(m)
    print_cost(m)
    print_idle_rss(m)
    print_targets(m)
    for block in m.scale:
        print(block)
        print()
