"""Publish latency at a fixed rate: direct (twice, the A/A pair), the bare trio pipe and kproxy variants.

    .venv/bin/python bench/bench_publish.py [--rounds N] [--seconds S] [--quick] [--variants LIST]
                                            [--rates LIST] [--sizes LIST] [--own-brokers] [--pin]
                                            [--broker-nice N] [--idle-poll] [--stalls DIR]

The measure users watch and the OpenMessaging Benchmark's Kafka driver reports: one librdkafka
producer (confluent-kafka; acks=all, linger.ms=1) sends at a fixed rate, round-robin over 10
topics, and each message's publish latency is librdkafka's own, from ``produce()`` to its
acknowledgement (``Message.latency()``, so when the delivery callback happens to run does not
count). Per path, rate and value size: avg, p50, p99, p99.9 and max, and what each adds over
direct; the proxy process's CPU per message and per Produce request (the broker's request count
from librdkafka's statistics) over the same seconds, and the broker's and the producer's CPU per
message (what else the path's messages cost the cores it shares).

Paths, measured in rounds whose path order rotates (medians of the rounds reported):

* ``direct`` and ``direct A/A``: the broker itself, twice; what the two differ by is the
  machine's noise floor in this run;
* ``pipe``: bench/pipe.py, the Python floor. A byte pipe cannot rewrite the broker address a
  Metadata answer gives, and a client sends its Produce requests to that address, so the pipe
  has a Tansu broker of its own (identical, memory storage) that advertises the pipe's port
  (``--own-brokers``: every other path a broker of its own too, so that none holds more data);
* kproxy variants (bench/_paths.py's presets, one process each): ``metrics`` (the defaults) and
  ``labels`` (everything on: topic and client id labels, 100 rules, capture in its worker process) unless
  ``--variants`` says otherwise. The last variant of the list is the one judged against the
  target (issue 37's: see ``target_rows``). A load whose A/A pair disagrees (the broker alone
  saturating the cores) is judged "void", not met or not met: against a baseline that swings by
  tens of ms, a pipe that fell further behind would make any candidate pass. So is a load at which
  the pipe itself adds more than a ms on average or 5 ms at p99: the bar is the pipe's, and a pipe
  queueing for the cores sets it by the scheduler.

``--pin``: the proxies (the pipe and every kproxy, all their threads) on the last core and
everything else (this producer, the brokers) on the others, as a sidecar with a core of its own
would be: what is left of the added latency then is the proxy's own, not its wait for a core
shared with the client and the broker.

``--broker-nice N``: every broker's threads at nice N. Unpinned, with a negative N the kernel
serves the brokers first, as a broker on a machine of its own is served: without it, a proxy's
CPU is taken from the broker behind it on these two cores, and the broker's queue for a core is
what the path adds (see the next paragraph).

``--idle-poll``: the cores poll instead of halting while idle, for the whole run (bench/_idle.py):
on a virtual machine a halted vCPU waits for its host to run it again at the next wake-up, and
at 5,000 msg/s those waits set even direct's p99.

Where a path's time went: for each kproxy variant with a capture, the capture's own timings of
its Produce requests sent in the counted seconds are summed up after the run: kproxy's time (read
-> forwarded, answer read -> released) against the broker's (forwarded -> answer read, which also
holds the loop's wait to read an answer that has come).

Prints Markdown tables for docs/PERFORMANCE.md; progress to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import _tansu  # noqa: E402
import _wire as wire  # noqa: E402
from _idle import cores_polled_when_idle  # noqa: E402
from _paths import (  # noqa: E402
    VARIANTS,
    Hop,
    children,
    cpu_seconds,
    own_cpu_seconds,
    pipe_hop,
    run_delay_seconds,
    variant_hops,
)
from _stalls import BLOCKED, LONG  # noqa: E402
from _util import machine_line, percentile, table  # noqa: E402


@dataclass(frozen=True)
class Route:
    """One path: its hop, the port of the broker behind a proxy, which no Produce request may
    bypass it to reach (None for direct), and the broker's process (its CPU is recorded)."""

    hop: Hop
    broker_port: int | None
    broker: subprocess.Popen[bytes]
    key: str | None = None  # the kproxy variant (VARIANTS), None for direct and the pipe

TOPICS = [f"publish-{i}" for i in range(10)]
DIRECT, DIRECT_AA = "direct", "direct A/A"
STATS = ("avg", "p50", "p99", "p99.9", "max")


@dataclass
class Sample:
    """One path's measurement at one rate and size in one round."""

    latencies: list[float]  # seconds, one per acknowledged message
    failed: int
    seconds: float
    cpu_s: float | None  # the proxy process's CPU over the measurement (None for direct)
    produce_requests: int
    broker_cpu_s: float  # the broker's CPU over the measurement
    client_cpu_s: float  # this process's (the producer's: librdkafka's threads and the pacing loop)
    waits_s: float  # the path's processes' (proxy, broker, producer) time runnable but waiting for a core
    window: tuple[float, float] = (0.0, 0.0)  # wall clock (time.time()) of the counted messages' sending

    def stats(self) -> dict[str, float]:
        lat = self.latencies
        return {"avg": statistics.fmean(lat), "p50": percentile(lat, 50), "p99": percentile(lat, 99),
                "p99.9": percentile(lat, 99.9), "max": max(lat)}


@dataclass
class Load:
    rate: int
    size: int

    @property
    def label(self) -> str:
        return f"{self.rate:,} msg/s x {self.size:,} B"


@dataclass
class Results:
    """Per load label and path: one Sample per round."""

    samples: dict[str, dict[str, list[Sample]]] = field(default_factory=dict)

    def add(self, load: Load, path: str, sample: Sample) -> None:
        self.samples.setdefault(load.label, {}).setdefault(path, []).append(sample)


def create_topics(port: int) -> None:
    with contextlib.closing(wire.connect(port)) as s:
        for topic in TOPICS:
            res = wire.call(s, wire.CREATE_TOPICS, wire.create_topic_request(topic))
            assert res["topics"][0]["error_code"] == 0, res


def produce_requests_of(stats_json: str, hop: Hop, broker_port: int | None) -> int:
    """Produce requests sent, from one librdkafka statistics document; raises when a proxy's
    client sent any straight to ``broker_port``, the broker's own address (a path the messages
    did not take measures nothing)."""
    doc = json.loads(stats_json)
    brokers = [b for b in doc.get("brokers", {}).values() if b.get("nodeid", -1) >= 0]
    bypassed = [b["name"] for b in brokers if b.get("req", {}).get("Produce", 0) and broker_port is not None
                and b["name"].split("/")[0].endswith(f":{broker_port}")]
    if bypassed:
        raise RuntimeError(f"{hop.name}: Produce requests went to the broker itself ({bypassed}), not through "
                           f"the path (its port {hop.port})")
    return sum(b.get("req", {}).get("Produce", 0) for b in brokers)


def publish(route: Route, load: Load, seconds: float, warmup: float) -> Sample:
    """Send ``load.rate`` messages a second, round-robin over TOPICS, through ``route`` for ``warmup``
    seconds and then ``seconds`` more; the latencies of the messages sent after the warm-up."""
    hop, broker_port = route.hop, route.broker_port
    from confluent_kafka import Producer

    latencies: list[float] = []
    failed = [0]
    stats: list[str] = []

    def warm(err: object, _msg: object) -> None:
        if err is not None:
            failed[0] += 1

    def counted(err: object, msg: Any) -> None:
        if err is not None:
            failed[0] += 1
        else:
            latencies.append(msg.latency())

    producer = Producer({
        "bootstrap.servers": f"127.0.0.1:{hop.port}", "acks": "all", "linger.ms": 1,
        "client.id": "bench-publish", "enable.idempotence": False, "statistics.interval.ms": 100,
        "stats_cb": stats.append,
    })
    value = b"x" * load.size
    try:
        # Connections up and metadata in before the clock starts.
        for topic in TOPICS:
            producer.produce(topic, value, on_delivery=warm)
        if producer.flush(10):
            raise RuntimeError(f"{hop.name}: the first messages were not acknowledged within 10 s")
        paced(producer, load, warmup, warm)
        req0 = produce_requests_of(fresh_stats(producer, stats), hop, broker_port)
        cpu0 = cpu_seconds(hop.pid) if hop.pid else 0.0
        broker0, client0 = cpu_seconds(route.broker.pid), own_cpu_seconds()
        pids = [pid for pid in (hop.pid, route.broker.pid, os.getpid()) if pid]
        waits0 = sum(map(run_delay_seconds, pids))
        began = time.time()
        measured = paced(producer, load, seconds, counted)
        window = (began, time.time())
        if producer.flush(30):
            raise RuntimeError(f"{hop.name}: messages still unacknowledged 30 s after the last was sent")
        cpu = cpu_seconds(hop.pid) - cpu0 if hop.pid else None
        broker_cpu, client_cpu = cpu_seconds(route.broker.pid) - broker0, own_cpu_seconds() - client0
        waits = sum(map(run_delay_seconds, pids)) - waits0
        reqs = produce_requests_of(fresh_stats(producer, stats), hop, broker_port) - req0
    finally:
        producer.flush(5)
    if not latencies:
        raise RuntimeError(f"{hop.name}: no message was acknowledged ({failed[0]} failed)")
    return Sample(latencies, failed[0], measured, cpu, reqs, broker_cpu, client_cpu, waits, window)


def fresh_stats(producer: Any, stats: list[str]) -> str:
    """The next statistics document librdkafka emits (every 100 ms)."""
    stats.clear()
    deadline = time.monotonic() + 5
    while not stats:
        if time.monotonic() > deadline:
            raise RuntimeError("librdkafka sent no statistics within 5 s")
        producer.poll(0.05)
    return stats[-1]


def paced(producer: Any, load: Load, seconds: float, on_delivery: Any) -> float:
    """Produce at ``load.rate`` messages a second for ``seconds``: each message at its slot of a
    fixed schedule (a late tick sends what fell due, as a fixed-rate driver does). Returns the
    seconds it took."""
    value = b"x" * load.size
    total = max(1, round(seconds * load.rate))
    interval = 1.0 / load.rate
    clock = time.perf_counter
    start = clock()
    sent = 0
    while sent < total:
        due = min(total, int((clock() - start) * load.rate) + 1)
        while sent < due:
            producer.produce(TOPICS[sent % len(TOPICS)], value, on_delivery=on_delivery)
            sent += 1
        producer.poll(0)
        wait = start + sent * interval - clock()
        if wait > 0:
            time.sleep(wait)
    return clock() - start


# -- paths --------------------------------------------------------------------------------------
@contextlib.contextmanager
def open_paths(keys: list[str], workdir: Path, logs: Path, skip: set[str], own_brokers: bool
               ) -> Iterator[list[Route]]:
    """The brokers with their topics, and every path but those named in ``skip``, until the block
    ends. The pipe always has a broker of its own (it advertises the pipe's port); ``own_brokers``
    gives every other path one too, so that no broker holds more data or serves more connections
    than another path's."""
    started_brokers: dict[int, subprocess.Popen[bytes]] = {}

    def new_broker(stack: contextlib.ExitStack, name: str) -> int:
        port = _tansu.free_port()
        proc = stack.enter_context(_tansu.broker(port, logs / f"bench-publish-broker-{name}.log"))
        create_topics(port)
        started_brokers[port] = proc
        return port

    with contextlib.ExitStack() as stack:
        shared = new_broker(stack, "shared")
        pipe_broker = _tansu.free_port()
        pipe = pipe_hop(stack, sys.executable, f"127.0.0.1:{pipe_broker}", logs, log_suffix="-publish")
        started_brokers[pipe_broker] = stack.enter_context(
            _tansu.broker(pipe_broker, logs / "bench-publish-broker-pipe.log", advertised_port=pipe.port))
        create_topics(pipe_broker)
        routes = [Route(Hop(DIRECT, shared), None, started_brokers[shared])]
        aa = new_broker(stack, "aa") if own_brokers else shared
        routes.append(Route(Hop(DIRECT_AA, aa), None, started_brokers[aa]))
        routes.append(Route(pipe, pipe_broker, started_brokers[pipe_broker]))
        for key in keys:
            port = new_broker(stack, key) if own_brokers else shared
            [hop] = variant_hops(stack, sys.executable, f"127.0.0.1:{port}", [key], workdir, logs, "-publish")
            routes.append(Route(hop, port, started_brokers[port], key))
        yield [r for r in routes if r.hop.name == DIRECT or r.hop.name not in skip]


def pin_threads(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` and of the processes it started (a capture worker: the sidecar's CPU is
    its CPU too), and the threads they start later, which inherit it, on ``cpus``."""
    for process in (pid, *children(pid)):
        for task in os.listdir(f"/proc/{process}/task"):
            os.sched_setaffinity(int(task), cpus)


def renice_threads(pid: int, nice: int) -> None:
    """Every thread of ``pid`` at scheduling priority ``nice`` (threads it starts later inherit it)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.setpriority(os.PRIO_PROCESS, int(task), nice)


def rotated(hops: list[Route], r: int) -> list[Route]:
    k = r % len(hops)
    return hops[k:] + hops[:k]


def measure(hops: list[Route], loads: list[Load], rounds: int, seconds: float, warmup: float) -> Results:
    results = Results()
    for r in range(rounds):
        for load in loads:
            for route in rotated(hops, r):
                hop = route.hop
                sample = publish(route, load, seconds, warmup)
                results.add(load, hop.name, sample)
                s = sample.stats()
                print(f"  round {r + 1}/{rounds} {load.label} {hop.name}: avg {1e3 * s['avg']:.2f} ms, "
                      f"p99 {1e3 * s['p99']:.2f} ms, max {1e3 * s['max']:.1f} ms", file=sys.stderr)
    return results


# -- report -------------------------------------------------------------------------------------
def added(samples: dict[str, list[Sample]], path: str, stat: str) -> float:
    """Median over rounds of ``path``'s ``stat`` minus direct's in the same round (seconds)."""
    return statistics.median(a.stats()[stat] - d.stats()[stat]
                             for a, d in zip(samples[path], samples[DIRECT], strict=True))


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:+.2f}" if seconds < 0 else f"{1e3 * seconds:.2f}"


def load_table(samples: dict[str, list[Sample]]) -> str:
    rows = []
    for path, runs in samples.items():
        med = {k: statistics.median(s.stats()[k] for s in runs) for k in STATS}
        cpu = [s.cpu_s for s in runs if s.cpu_s is not None]
        per_msg = statistics.median(c / len(s.latencies) for c, s in zip(cpu, runs, strict=False)) if cpu else None
        per_req = (statistics.median(s.cpu_s / s.produce_requests for s in runs
                                     if s.cpu_s is not None and s.produce_requests) if cpu else None)
        extra = ["-", "-"] if path == DIRECT else [ms(added(samples, path, "avg")), ms(added(samples, path, "p99"))]
        reqs = statistics.median(s.produce_requests / s.seconds for s in runs)
        rows.append([path, *(ms(med[k]) for k in STATS), *extra, f"{reqs:,.0f}",
                     f"{1e6 * per_msg:.0f}" if per_msg is not None else "-",
                     f"{1e6 * per_req:.0f}" if per_req is not None else "-",
                     f"{1e6 * statistics.median(s.broker_cpu_s / len(s.latencies) for s in runs):.0f}",
                     f"{1e6 * statistics.median(s.client_cpu_s / len(s.latencies) for s in runs):.0f}",
                     f"{1e6 * statistics.median(s.waits_s / len(s.latencies) for s in runs):.0f}"])
    return table(["path", "avg ms", "p50", "p99", "p99.9", "max", "added avg", "added p99", "Produce req/s",
                  "proxy CPU µs/msg", "µs/request", "broker µs/msg", "producer µs/msg", "core wait µs/msg"], rows)


# A run's baseline is quiet when direct, measured twice per round (the A/A pair), agrees with itself
# within these (seconds): the bar allows the candidate 1 ms of p99 over the pipe's, and a verdict
# on that margin means nothing when the broker alone swings by more than several times it. Past
# them the load is "void": the two cores were saturated by the broker and the producer, whatever
# any proxy did, and the run says so instead of judging.
QUIET_AVG = 5e-4
QUIET_P99 = 5e-3
# The bar is set by the pipe, so the pipe must have had the cores too: a byte pipe does a few tens
# of µs of work a message, and one that adds more than these over direct (seconds) was queueing
# for a core at that rate. Against its queue any candidate's margin is the scheduler's, not the
# proxy's: the load is "void" as well.
PIPE_QUIET_AVG = 1e-3
PIPE_QUIET_P99 = 5e-3


def baseline_noise(samples: dict[str, list[Sample]]) -> tuple[float, float] | None:
    """The direct A/A pair's added avg and p99 (seconds), None when the run has no A/A pair."""
    if DIRECT_AA not in samples:
        return None
    return added(samples, DIRECT_AA, "avg"), added(samples, DIRECT_AA, "p99")


def target_rows(results: Results, candidate: str) -> list[list[str]]:
    """Issue 37's bar: ``candidate``'s added avg at most 1.5x the pipe's + 0.1 ms, its added p99
    at most the pipe's + 1 ms; "void" where the baseline was not quiet (:data:`QUIET_AVG`,
    :data:`QUIET_P99`) or the pipe itself queued for the cores (:data:`PIPE_QUIET_AVG`,
    :data:`PIPE_QUIET_P99`), "unchecked" where the run has no A/A pair to tell."""
    rows = []
    for label, samples in results.samples.items():
        if candidate not in samples or "pipe" not in samples:
            continue
        a, pa = added(samples, candidate, "avg"), added(samples, "pipe", "avg")
        p, pp = added(samples, candidate, "p99"), added(samples, "pipe", "p99")
        bar_a, bar_p = 1.5 * max(pa, 0.0) + 1e-4, max(pp, 0.0) + 1e-3
        noise = baseline_noise(samples)
        void = None
        if noise is not None and (abs(noise[0]) > QUIET_AVG or abs(noise[1]) > QUIET_P99):
            void = (f"void: direct's A/A pair apart by {ms(noise[0])} / {ms(noise[1])} ms (avg / p99), past "
                    f"{ms(QUIET_AVG)} / {ms(QUIET_P99)}: the baseline was not quiet")
        elif pa > PIPE_QUIET_AVG or pp > PIPE_QUIET_P99:
            void = (f"void: the pipe itself added {ms(pa)} / {ms(pp)} ms (avg / p99), past {ms(PIPE_QUIET_AVG)} / "
                    f"{ms(PIPE_QUIET_P99)}: a proxy hop waited for the cores at this rate")
        for metric, value, bar in (("added avg", a, bar_a), ("added p99", p, bar_p)):
            status = "met" if value <= bar else "**not met**"
            if void is not None:
                status = void
            elif noise is None:
                status += " (unchecked: no A/A pair)"
            rows.append([f"{label}: {metric}", ms(value), f"<= {ms(bar)}", status])
    return rows


def print_report(results: Results, machine: str, args: argparse.Namespace, candidate: str) -> None:
    print(f"### Publish latency at a fixed rate ({machine})\n")
    print(f"One librdkafka producer (acks=all, linger.ms=1), 10 topics round-robin, {args.seconds:g} s per path "
          f"after {args.warmup:g} s of warm-up; median of {args.rounds} rounds, path order rotated per round. "
          "Latency is librdkafka's per message, produce() to acknowledgement; 'added' is over direct within a "
          "round. `direct A/A` is the broker again: the run's noise floor. "
          + ("Every path has a Tansu broker of its own (the pipe's advertises the pipe). " if args.own_brokers else
             "The pipe's broker is a second Tansu advertising the pipe; the others share one. ")
          + "Proxy, broker and producer CPU are each process's (all threads) over the counted seconds; core "
          "wait is the time their threads were runnable but waiting for a core (schedstat's run delay), summed.\n")
    for label, samples in results.samples.items():
        print(f"#### {label}\n")
        print(load_table(samples) + "\n")
    rows = target_rows(results, candidate)
    if rows:
        print(f"#### Target: {candidate} against the pipe\n")
        print(table(["metric", "measured ms", "target ms", "status"], rows) + "\n")


def print_split(captures: dict[str, Path], results: Results) -> None:
    """Per kproxy path with a capture: where its counted Produce requests (those sent in the measured
    seconds of every round, warm-ups left out) spent their time, from the capture's
    own timings: kproxy's (read -> forwarded, plus answer read -> released) and the broker's
    (forwarded -> answer read: the broker's work, its queue for a core, and the loop's wait to read
    an answer that has come). A path whose added latency is in the second column while kproxy's
    own time stays small was held behind the proxy's handling, not in it."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    rows = []
    for name, where in captures.items():
        files = list(where.glob("hour=*/*.parquet"))
        if not files:
            rows.append([name, "(no capture file)", "", "", "", "", "", ""])
            continue
        windows = [sample.window for samples in results.samples.values() for sample in samples.get(name, [])]
        counted = pc.field("api_name") == "Produce"
        within = None
        for began, ended in windows:
            one = ((pc.field("request_time") >= pa.scalar(int(began * 1e6), pa.timestamp("us", tz="UTC")))
                   & (pc.field("request_time") <= pa.scalar(int(ended * 1e6), pa.timestamp("us", tz="UTC"))))
            within = one if within is None else within | one
        t = ds.dataset(where, format="parquet", partitioning="hive").to_table(
            columns=["kproxy_latency_ms", "broker_latency_ms"], filter=counted if within is None else counted & within)
        own = [v for v in t.column("kproxy_latency_ms").to_pylist() if v is not None]
        broker = [v for v in t.column("broker_latency_ms").to_pylist() if v is not None]
        rows.append([name, f"{len(own):,}", *(f"{percentile(own, q):.3f}" for q in (50, 99, 99.9)),
                     *(f"{percentile(broker, q):.2f}" for q in (50, 99, 99.9))])
    print("#### Inside the proxy and behind it (the capture's timings of the Produce requests sent in the "
          "counted seconds)\n")
    print("kproxy's own time: request read -> forwarded, plus answer read -> released; the broker's: "
          "forwarded -> answer read (the broker's work, its waits for a core, and the proxy loop's wait to "
          "read an answer that has come).\n")
    print(table(["path", "Produce requests", "kproxy p50 ms", "p99", "p99.9", "broker p50 ms", "p99", "p99.9"],
                rows) + "\n")


def print_stalls(where: Path, pids: dict[int, str]) -> None:
    """Per kproxy process: its task steps and collections of at least _stalls.LONG, and the longest;
    the loop's time in steps split into CPU, waiting for a core and blocked (the GIL)."""
    rows = []
    for pid, name in pids.items():
        path = where / f"stalls-{pid}.json"
        if not path.exists():
            rows.append([name, "(no file: the process did not end cleanly)", "", "", "", "", "", ""])
            continue
        doc = json.loads(path.read_text())
        gcs, cpu_steps = doc["long_collections"], doc["long_cpu_steps"]
        steps = doc["steps"].values()
        split = "/".join(f"{sum(s[k] for s in steps):,.0f}" for k in ("cpu_ms", "run_queue_ms", "blocked_ms"))
        blocked = doc["blocked_histogram"]
        rows.append([name, str(doc["long_steps_count"]), str(doc["long_cpu_steps_count"]),
                     ", ".join(f"{s[1]} ms CPU ({s[0]} wall) {s[2]}" for s in cpu_steps[:3]) or "-",
                     split, ", ".join(f"{blocked[k]} {k}" for k in sorted(blocked)) or "-",
                     str(len(gcs)), str(sum(1 for g in gcs if g[1] >= 1e3 * LONG)),
                     ", ".join(f"{cpu} ms CPU ({wall} wall) gen {gen}" for wall, cpu, gen in
                               sorted(gcs, key=lambda g: -g[1])[:3]) or "-"])
    print(f"#### Loop stalls (task steps and collections of at least {1e3 * LONG:g} ms, steady state)\n")
    print("Steps' ms: the loop thread's time in task steps, as CPU / waiting for a core (run queue) / "
          f"blocked (the GIL); blocked steps: those blocked {1e3 * BLOCKED:g} ms or more, by how long.\n")
    print(table(["path", "long steps (wall)", "of them long in CPU", "longest in CPU", "steps' ms CPU/queue/blocked",
                 "blocked steps", "long collections (wall)", "long in CPU", "longest in CPU"], rows) + "\n")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0, help="counted seconds per path, rate and size")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rates", default="1000,5000", help="messages per second, comma-separated")
    parser.add_argument("--sizes", default="1024,100", help="value bytes, comma-separated")
    parser.add_argument("--variants", default="metrics,labels", metavar="LIST",
                        help=f"kproxy presets, comma-separated, from {', '.join(VARIANTS)}; the last is "
                             "judged against the target")
    parser.add_argument("--skip", default="", metavar="LIST",
                        help=f"paths left out, comma-separated: '{DIRECT_AA}', pipe (direct always runs)")
    parser.add_argument("--stalls", metavar="DIR",
                        help="each kproxy process writes its long task steps and collections to DIR "
                             "(bench/_stalls.py); a summary is printed after the tables")
    parser.add_argument("--own-brokers", action="store_true",
                        help="every path a broker of its own (by default direct, direct A/A and the kproxy "
                             "variants share one; the pipe always has its own)")
    parser.add_argument("--pin", action="store_true",
                        help="the proxies on the last core, the producer and the brokers on the others")
    parser.add_argument("--broker-nice", type=int, default=0, metavar="N",
                        help="every broker's threads at nice N (negative favours the brokers over the "
                             "producer and the proxies, as a broker on a machine of its own would be; "
                             "below 0 needs root)")
    parser.add_argument("--idle-poll", action="store_true",
                        help="hold the PM QoS CPU latency request at 0 for the run: idle cores poll instead "
                             "of halting (needs root; see bench/_idle.py)")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 s, 1 KB values only (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.sizes = 2, 3.0, "1024"
    args.skip = {k.strip() for k in args.skip.split(",") if k.strip()}
    args.keys = [k.strip() for k in args.variants.split(",") if k.strip()]
    unknown = [k for k in args.keys if k not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    args.loads = [Load(int(r), int(s)) for s in args.sizes.split(",") for r in args.rates.split(",")]
    return args


def main() -> int:
    args = parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kproxy-bench-publish-"))
    if args.stalls:
        Path(args.stalls).mkdir(parents=True, exist_ok=True)  # each kproxy writes its file there as it ends
        os.environ["KPROXY_BENCH_STALLS"] = str(Path(args.stalls).resolve())  # inherited by run_kproxy.py
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin:
        if len(cpus) < 2:
            raise SystemExit("--pin needs two cores or more")
        pin_threads(os.getpid(), set(cpus[:-1]))  # (the brokers and proxies started below inherit it)
    try:
        with contextlib.ExitStack() as stack:
            idle = stack.enter_context(cores_polled_when_idle()) if args.idle_poll else ""
            hops = stack.enter_context(
                open_paths(args.keys, workdir, Path(tempfile.gettempdir()), args.skip, args.own_brokers))
            machine = machine_line() + (f"; {idle}" if idle else "")
            if args.pin:
                for route in hops:
                    if route.hop.pid:
                        pin_threads(route.hop.pid, {cpus[-1]})
                machine += f"; proxies pinned to core {cpus[-1]}, producer and brokers to {cpus[:-1]}"
            if args.broker_nice:
                for route in hops:
                    renice_threads(route.broker.pid, args.broker_nice)
                machine += f"; brokers at nice {args.broker_nice}"
            pids = {r.hop.pid: r.hop.name for r in hops if r.hop.pid and r.hop.name != "pipe"}
            for route in hops:  # every path warm (connections, codecs, kproxy's start-up work) first
                publish(route, Load(min(load.rate for load in args.loads), 1024), 1.0, 0.0)
            if args.stalls:
                for pid in pids:
                    os.kill(pid, signal.SIGUSR1)  # start-up is over: the stall watch starts afresh
            results = measure(hops, args.loads, args.rounds, args.seconds, args.warmup)
        candidate = VARIANTS[args.keys[-1]].path if args.keys else "pipe"
        print_report(results, machine, args, candidate)
        captures = {VARIANTS[route.key].path: workdir / f"capture-{route.key}-{route.broker_port}"
                    for route in hops if route.key and VARIANTS[route.key].capture}
        if captures:
            print_split(captures, results)
        if args.stalls:
            print_stalls(Path(args.stalls), pids)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # rule files and captures
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
