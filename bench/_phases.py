"""bench_proxy.py's phases against the Tansu broker: topics, sanity, latency, throughput, idle RSS.

Every phase measures all paths in the same rounds, the path order rotated per round, so a
burst of noise from elsewhere on the machine lands on every path alike.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from dataclasses import dataclass, field

import _wire as wire
from _load import round_trips, run_load
from _paths import KPROXY, Hop, cpu_seconds, own_cpu_seconds, rss_kb
from _util import percentile

PRODUCE_TOPIC = "bench-produce"
FETCH_TOPIC = "bench-fetch"
FETCH_BATCHES = 50  # x ~100 KB: ~5 MB fetched per request
BATCH_BYTES = 100_000
FETCH_MAX_BYTES = 8 * 1024 * 1024
LATENCY_SLICE = 50  # sequential requests per path before moving to the next path


def rotated(paths: list[Hop], r: int) -> list[Hop]:
    """``paths`` starting at the ``r``-th (modulo their count): round ``r``'s order."""
    k = r % len(paths)
    return paths[k:] + paths[:k]


def setup_topics(broker_port: int) -> None:
    """The Produce topic, and the Fetch topic holding FETCH_BATCHES batches of BATCH_BYTES."""
    batch = wire.record_batch(BATCH_BYTES)
    with contextlib.closing(wire.connect(broker_port)) as s:
        for topic in (PRODUCE_TOPIC, FETCH_TOPIC):
            res = wire.call(s, wire.CREATE_TOPICS, wire.create_topic_request(topic))
            assert res["topics"][0]["error_code"] == 0, res
        for _ in range(FETCH_BATCHES):
            res = wire.call(s, wire.PRODUCE, wire.produce_request(FETCH_TOPIC, batch))
            assert res["responses"][0]["partition_responses"][0]["error_code"] == 0, res


def sanity(paths: list[Hop]) -> None:
    """Each path answers each request kind correctly before anything is timed."""
    batch = wire.record_batch(BATCH_BYTES)
    for p in paths:
        with contextlib.closing(wire.connect(p.port)) as s:
            assert wire.call(s, wire.API_VERSIONS, wire.api_versions_request())["error_code"] == 0
            md = wire.call(s, wire.METADATA, wire.metadata_request(None))
            assert {t["name"] for t in md["topics"]} >= {PRODUCE_TOPIC, FETCH_TOPIC}, md
            produced = wire.call(s, wire.PRODUCE, wire.produce_request(PRODUCE_TOPIC, batch))
            assert produced["responses"][0]["partition_responses"][0]["error_code"] == 0, produced
            fetched = wire.call(s, wire.FETCH, wire.fetch_request(FETCH_TOPIC, 0, FETCH_MAX_BYTES))
            part = fetched["responses"][0]["partitions"][0]
            assert part["error_code"] == 0 and len(part["records"] or b"") > FETCH_BATCHES * BATCH_BYTES * 0.9, \
                (p.name, part["error_code"], len(part["records"] or b""))


# -- latency ------------------------------------------------------------------------------------
LATENCY_REQUESTS = (  # (label, frame builder) of the sequential phase
    ("ApiVersions v3", wire.api_versions_request),
    ("Metadata v1 (all topics)", lambda: wire.metadata_request(None)),
    ("Produce v7, 1 record of 100 B, acks=1",
     lambda: wire.produce_request(PRODUCE_TOPIC, wire.record_batch(100, record_size=100))),
)


@dataclass
class Latency:
    """One request kind's sequential round trips: per path, p50 and p99 of each round (seconds),
    and the proxy's CPU seconds over all rounds."""

    p50: dict[str, list[float]]
    p99: dict[str, list[float]]
    cpu: dict[str, float]
    requests: int  # per path, over all rounds

    def added(self, percentiles: dict[str, list[float]]) -> dict[str, list[float]]:
        """Per path, its percentile minus direct's in the same round (same round, same noise)."""
        direct = percentiles["direct"]
        return {k: [a - d for a, d in zip(v, direct, strict=True)] for k, v in percentiles.items()}


@dataclass
class LatencyPhase:
    """The sequential phase: the table's rows, the kproxy/pipe and kproxy/tansu ratios, and per
    request kind each path's added p50 in every round (seconds), for the targets' ratios."""

    rows: list[list[str]] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    added_rounds: dict[str, dict[str, list[float]]] = field(default_factory=dict)


def measure_latency(paths: list[Hop], rounds: int, n: int, frame: bytes) -> Latency:
    """``n`` sequential round trips of ``frame`` per path in each of ``rounds`` rounds, one
    connection per path, interleaved LATENCY_SLICE requests at a time."""
    socks = {p.name: wire.connect(p.port) for p in paths}
    try:
        for p in paths:
            round_trips(socks[p.name], frame, 200)  # warm up: caches, listeners, codec compilation
        p50: dict[str, list[float]] = {p.name: [] for p in paths}
        p99: dict[str, list[float]] = {p.name: [] for p in paths}
        cpu: dict[str, float] = {p.name: 0.0 for p in paths}
        slices = max(1, n // LATENCY_SLICE)
        for r in range(rounds):
            # Interleave in slices of LATENCY_SLICE requests so that a burst of noise from
            # elsewhere on the machine lands on every path alike, not on one path's whole round.
            samples: dict[str, list[float]] = {p.name: [] for p in paths}
            for k in range(slices):
                for p in rotated(paths, r + k):
                    cpu0 = cpu_seconds(p.pid) if p.pid else 0.0
                    samples[p.name].extend(round_trips(socks[p.name], frame, LATENCY_SLICE))
                    if p.pid:
                        cpu[p.name] += cpu_seconds(p.pid) - cpu0
            for name, values in samples.items():
                p50[name].append(percentile(values, 50))
                p99[name].append(percentile(values, 99))
    finally:
        for s in socks.values():
            s.close()
    return Latency(p50, p99, cpu, rounds * slices * LATENCY_SLICE)


def phase_latency(paths: list[Hop], rounds: int, n: int) -> LatencyPhase:
    """Sequential round trips of each of LATENCY_REQUESTS through every path."""
    out = LatencyPhase()
    for label, build in LATENCY_REQUESTS:
        lat = measure_latency(paths, rounds, n, build())
        m50 = {k: statistics.median(v) for k, v in lat.p50.items()}
        m99 = {k: statistics.median(v) for k, v in lat.p99.items()}
        added50, added99 = lat.added(lat.p50), lat.added(lat.p99)
        add50 = {k: statistics.median(v) for k, v in added50.items()}
        add99 = {k: statistics.median(v) for k, v in added99.items()}
        out.added_rounds[label] = added50
        for p in paths:
            per_request = lat.cpu[p.name] / lat.requests
            out.rows.append([label, p.name, f"{m50[p.name] * 1e6:.0f}", f"{m99[p.name] * 1e6:.0f}",
                             "-" if p.name == "direct" else f"{add50[p.name] * 1e6:+.0f}",
                             "-" if p.name == "direct" else f"{add99[p.name] * 1e6:+.0f}",
                             "-" if p.pid is None else f"{per_request * 1e6:.0f}"])
        if "pipe" in add50 and KPROXY in add50:
            out.ratios[f"{label}: kproxy added p50 / pipe added p50"] = add50[KPROXY] / add50["pipe"]
        if "tansu proxy" in add50 and KPROXY in add50:
            out.ratios[f"{label}: kproxy added p50 / tansu proxy added p50"] = add50[KPROXY] / add50["tansu proxy"]
    return out


# -- throughput ---------------------------------------------------------------------------------
@dataclass
class ThroughputLog:
    """What the throughput phases noted across phases: per (phase label, path) the CPU use of the
    client, the proxy and the broker in each run (% of one core), and per phase label each path's
    rate in every round."""

    broker_pid: int
    utilisation: dict[tuple[str, str], list[tuple[float, float, float]]] = field(default_factory=dict)
    per_round: dict[str, dict[str, list[float]]] = field(default_factory=dict)


def phase_throughput(paths: list[Hop], rounds: int, label: str, frame: bytes, unit: str, log: ThroughputLog, *,
                     connections: int, depth: int, count: int | None = None, duration: float | None = None,
                     warmup: float = 0.0) -> dict[str, float]:
    """Median rate per path: requests/s (unit 'req/s') or MB/s of request+response bytes ('MB/s').

    Also notes in ``log`` the CPU use of each run and each path's rate in every round, and on
    each proxy's :class:`Hop` its CPU seconds, bytes and requests under ``label``.
    """
    rates: dict[str, list[float]] = {p.name: [] for p in paths}
    for r in range(rounds):
        for p in rotated(paths, r):
            cpu0 = cpu_seconds(p.pid) if p.pid else 0.0
            own0, broker0, wall0 = own_cpu_seconds(), cpu_seconds(log.broker_pid), time.perf_counter()
            res = run_load(p.port, frame, connections=connections, depth=depth, count=count,
                           duration=duration, warmup=warmup)
            wall = time.perf_counter() - wall0
            log.utilisation.setdefault((label, p.name), []).append((
                100 * (own_cpu_seconds() - own0) / wall,
                100 * (cpu_seconds(p.pid) - cpu0) / wall if p.pid else float("nan"),
                100 * (cpu_seconds(log.broker_pid) - broker0) / wall))
            if p.pid:
                p.cpu_s[label] = p.cpu_s.get(label, 0.0) + cpu_seconds(p.pid) - cpu0
                p.bytes_moved[label] = p.bytes_moved.get(label, 0) + res.bytes_sent + res.bytes_received
                p.requests[label] = p.requests.get(label, 0) + res.all_responses
            if unit == "req/s":
                rates[p.name].append(res.responses / res.seconds)
            else:
                rates[p.name].append((res.bytes_sent + res.bytes_received) / res.seconds / 1e6)
        print(f"  {label}: round {r + 1}/{rounds} done", file=sys.stderr)
    log.per_round[label] = rates
    return {k: statistics.median(v) for k, v in rates.items()}


@dataclass
class Throughput:
    """The throughput phases' medians per path: pipelined req/s per request kind, Produce and Fetch MB/s."""

    pipelined: dict[str, dict[str, float]]
    produce: dict[str, float]
    fetch: dict[str, float]


def throughput_phases(paths: list[Hop], rounds: int, quick: bool, log: ThroughputLog,
                      duration: float) -> Throughput:
    """Pipelined ApiVersions and Metadata (4 connections x 100 in flight, each run ``duration`` seconds
    after a warm-up), Produce of ~100 KB batches (2 x 5), Fetch of ~5 MB responses (2 x 2)."""
    warmup = min(0.3, duration / 2)  # a smoke run's short runs keep their warm-up in proportion
    pipelined = {}
    for label, frame in (("ApiVersions v3", wire.api_versions_request()),
                         ("Metadata v1", wire.metadata_request(None))):
        pipelined[label] = phase_throughput(paths, rounds, f"pipelined {label}", frame, "req/s", log,
                                            connections=4, depth=100, duration=duration, warmup=warmup)
    produce_frame = wire.produce_request(PRODUCE_TOPIC, wire.record_batch(BATCH_BYTES))
    produce = phase_throughput(paths, rounds, "produce", produce_frame, "MB/s", log, connections=2, depth=5,
                               count=30 if quick else 60)
    fetch_frame = wire.fetch_request(FETCH_TOPIC, 0, FETCH_MAX_BYTES)
    fetch = phase_throughput(paths, rounds, "fetch", fetch_frame, "MB/s", log, connections=2, depth=2,
                             count=6 if quick else 10)
    return Throughput(pipelined, produce, fetch)


# -- memory -------------------------------------------------------------------------------------
def idle_connections_rss(p: Hop, n: int, settle: float = 1.0) -> tuple[int, int]:
    """(RSS before, RSS with ``n`` connections open, each having answered one ApiVersions), in KB.

    The proxy is left ``settle`` seconds after the connections open and after they close (half that
    before the first reading), so that its memory reflects them rather than their passing."""
    assert p.pid is not None
    time.sleep(settle / 2)
    before = rss_kb(p.pid)
    frame = wire.api_versions_request()
    socks = []
    try:
        for _ in range(n):
            s = wire.connect(p.port)
            s.sendall(frame)
            socks.append(s)
        for s in socks:
            wire.recv_frame(s)  # answered: the upstream connection exists
        time.sleep(settle)
        after = rss_kb(p.pid)
    finally:
        for s in socks:
            s.close()
    time.sleep(settle)
    return before, after


def idle_rss_rows(paths: list[Hop], n: int, settle: float = 1.0) -> list[list[str]]:
    """The idle-connections table's rows: each proxy's RSS before and with ``n`` idle connections."""
    rows = []
    for p in paths:
        if p.pid is None:
            continue
        before, after = idle_connections_rss(p, n, settle)
        rows.append([p.name, f"{before / 1024:.1f}", f"{after / 1024:.1f}", f"{(after - before) / 1024:.1f}",
                     f"{(after - before) / n:.1f}"])
    print("  idle connections done", file=sys.stderr)
    return rows
