"""Proxy benchmark: direct vs a bare trio pipe vs kproxy vs `tansu proxy`, against one Tansu broker.

    .venv/bin/python bench/bench_proxy.py [--rounds N] [--quick] [--variants LIST] [--scale]

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
bench/_rules.py, written into a temporary directory. The "Targets" table judges
the issue-14 budget: each feature's cost over the variant without it, and
everything on against the bare pipe; ratios are computed within a round, then
the median over rounds is taken.

Prints Markdown tables for docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import selectors
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

import _rules  # noqa: E402
import _tansu  # noqa: E402
import _wire as wire  # noqa: E402
from _util import machine_line, percentile, table, verdict  # noqa: E402

from kproxy.testing import stop_process  # noqa: E402

PRODUCE_TOPIC = "bench-produce"
FETCH_TOPIC = "bench-fetch"
FETCH_BATCHES = 50  # x ~100 KB: ~5 MB fetched per request
BATCH_BYTES = 100_000
FETCH_MAX_BYTES = 8 * 1024 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")
LATENCY_SLICE = 50  # sequential requests per path before moving to the next path
_HEAD = struct.Struct(">ii")
KPROXY = "kproxy"  # the path name of the default variant (metrics on): the targets of earlier runs refer to it


@dataclass(frozen=True)
class Variant:
    """A kproxy preset: its path name, run_kproxy.py flags, a rule set of bench/_rules.py, capture or not."""

    path: str
    flags: tuple[str, ...] = ()
    rules: str | None = None
    capture: bool = False


AA = "kproxy A/A copy"
VARIANTS = {
    "bare": Variant("kproxy no observer", ("--no-metrics",)),
    "metrics": Variant(KPROXY),
    "rules100": Variant("kproxy +100 rules", rules="none-match"),
    "match1": Variant("kproxy +1 matching rule", rules="one-zero-delay"),
    "capture": Variant("kproxy +capture", capture=True),
    "all": Variant("kproxy everything", rules="none-match", capture=True),
    # The noise floor: a second process identical to plain kproxy. What it comes out "over" kproxy
    # is what two identical processes differ by in this run; a feature's cost below it is not seen.
    "aa": Variant(AA),
}
DEFAULT_VARIANTS = "bare,metrics,rules100,match1,capture,all,aa"
QUICK_VARIANTS = "bare,metrics,all"
# (what, path, compared with, at most this much over it): issue 14's per-feature budgets.
FEATURE_BUDGETS = (
    ("metrics on", KPROXY, "kproxy no observer", 0.05),
    ("100 rules, none matching", "kproxy +100 rules", KPROXY, 0.05),
    ("1 matching 0 ms delay rule", "kproxy +1 matching rule", KPROXY, 0.10),
    ("capture on", "kproxy +capture", KPROXY, 0.10),
)
EVERYTHING = "kproxy everything"


def variant_command(py: str, variant: Variant, upstream: str, workdir: Path, key: str) -> list[str]:
    cmd = [py, str(BENCH / "run_kproxy.py"), "--upstream", upstream, *variant.flags]
    if variant.rules is not None:
        rules_file = workdir / f"rules-{variant.rules}.yaml"
        if not rules_file.exists():
            rules_file.write_text(_rules.PRESETS[variant.rules]())
        cmd += ["--rules", str(rules_file)]
    if variant.capture:
        capture_dir = workdir / f"capture-{key}-{upstream.rsplit(':', 1)[1]}"
        capture_dir.mkdir(exist_ok=True)
        cmd += ["--capture-dir", str(capture_dir)]
    return cmd


# -- the paths under test ------------------------------------------------------------------
@dataclass
class Hop:
    name: str
    port: int
    process: subprocess.Popen[bytes] | None = None  # None for direct
    cpu_s: dict[str, float] = field(default_factory=dict)
    bytes_moved: dict[str, int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


def _ready_port(proc: subprocess.Popen[bytes], what: str) -> int:
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().split()
    if len(line) != 2 or line[0] != "ready":
        raise RuntimeError(f"{what} did not start (said {line!r})")
    return int(line[1])


@contextlib.contextmanager
def started(cmd: list[str], what: str, log: Path, env: dict[str, str] | None = None,
            cwd: Path = ROOT) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd=cwd,
                                env={**os.environ, **env} if env else None)
    try:
        yield proc, _ready_port(proc, what)
    finally:
        stop_process(proc)


@contextlib.contextmanager
def tansu_proxy(origin_port: int, log: Path) -> Iterator[tuple[subprocess.Popen[bytes] | None, int, str]]:
    """Tansu's Rust proxy in front of the broker; yields (None, 0, reason) if it cannot run."""
    port = _tansu.free_port()
    try:
        with _tansu.proxy(port, origin_port, log) as proc:
            yield proc, port, ""
    except TimeoutError:
        yield None, 0, f"`tansu proxy` did not listen within 20 s (see {log})"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime, all threads


def rss_kb(pid: int, key: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} for pid {pid}")


# -- load generation --------------------------------------------------------------------------
class FrameCounter:
    """Counts response frames in a byte stream by their size prefix, checking that correlation
    ids come back in the order ``expected`` cycles through them."""

    __slots__ = ("expected", "frames", "head", "next", "skip")

    def __init__(self, expected: list[int]) -> None:
        self.expected = expected
        self.next = 0
        self.head = b""
        self.skip = 0
        self.frames = 0

    def feed(self, data: bytes) -> int:
        pos, n, done = 0, len(data), 0
        while pos < n:
            if self.skip:
                take = min(self.skip, n - pos)
                self.skip -= take
                pos += take
                if not self.skip:
                    done += 1
                continue
            need = 8 - len(self.head)
            self.head += data[pos:pos + need]
            pos += need
            if len(self.head) < 8:
                break
            size, cid = _HEAD.unpack(self.head)
            if cid != self.expected[self.next]:
                raise RuntimeError(f"correlation id {cid}, expected {self.expected[self.next]}: stream out of sync")
            self.next = (self.next + 1) % len(self.expected)
            self.head = b""
            self.skip = size - 4
            if not self.skip:
                done += 1
        self.frames += done
        return done


@dataclass
class LoadResult:
    responses: int
    seconds: float
    bytes_sent: int
    bytes_received: int
    all_responses: int  # warm-up and drain included


def run_load(port: int, frame: bytes, *, connections: int, depth: int, count: int | None = None,
             duration: float | None = None, warmup: float = 0.0, on_ready: Callable[[], object] | None = None,
             on_drained: Callable[[], object] | None = None) -> LoadResult:
    """Keep ``depth`` requests in flight on each of ``connections`` connections.

    Stops after ``count`` requests per connection, or ``duration`` seconds after
    ``warmup``; in-flight requests are always drained before returning. Only
    responses (and bytes) after the warm-up are counted.

    With ``on_ready``, every connection first makes one round trip of its own (so the proxy has
    accepted it and connected upstream), then ``on_ready`` is called and the load starts; those
    round trips are not counted. ``on_drained`` is called once every response is in, before the
    connections close: CPU read between the two is the load's alone, not opening and closing.
    """
    # Every request in flight on a connection carries its own correlation id (Kafka clients number
    # them; kproxy refuses a connection that reuses one in flight): a cycle of twice the depth.
    (cid,) = struct.unpack_from(">i", frame, 8)
    cids = [(cid + i) % 2**31 for i in range(2 * depth)]
    variants = [frame[:8] + struct.pack(">i", c) + frame[12:] for c in cids]

    def frames(start: int, n: int) -> bytes:
        return b"".join(variants[(start + i) % len(variants)] for i in range(n))

    sel = selectors.DefaultSelector()
    socks = [wire.connect(port) for _ in range(connections)]
    if on_ready is not None:
        for s in socks:
            s.sendall(variants[0])
            wire.recv_frame(s)
        on_ready()
    state = {}
    for s in socks:
        s.setblocking(False)
        first = min(depth, count) if count is not None else depth
        state[s] = {"out": bytearray(frames(0, first)), "sent": first, "inflight": first,
                    "counter": FrameCounter(cids)}
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
    start = time.perf_counter()
    counting_from = start + warmup
    stop_at = counting_from + duration if duration is not None else None
    counted = 0
    sent_bytes = received_bytes = 0
    counting = warmup == 0
    t_count = start
    stopping = False
    try:
        while any(st["inflight"] or st["out"] for st in state.values()):
            now = time.perf_counter()
            if not counting and now >= counting_from:
                counting, t_count = True, now
            if stop_at is not None and now >= stop_at and not stopping:
                stopping, t_end = True, now
            for key, events in sel.select(timeout=1.0):
                s = key.fileobj
                st = state[s]  # type: ignore[index]
                if events & selectors.EVENT_WRITE and st["out"]:
                    k = s.send(st["out"])  # type: ignore[union-attr]
                    del st["out"][:k]
                    if counting:
                        sent_bytes += k
                    if not st["out"]:
                        sel.modify(s, selectors.EVENT_READ)
                if events & selectors.EVENT_READ:
                    data = s.recv(1 << 20)  # type: ignore[union-attr]
                    if not data:
                        raise ConnectionError("server closed the connection")
                    done = st["counter"].feed(data)
                    if counting:
                        received_bytes += len(data)
                    if done:
                        st["inflight"] -= done
                        if counting and not stopping:
                            counted += done
                        more = done
                        if stopping:
                            more = 0
                        elif count is not None:
                            more = min(done, count - st["sent"])
                        if more:
                            was_empty = not st["out"]
                            st["out"] += frames(st["sent"], more)
                            st["sent"] += more
                            st["inflight"] += more
                            if was_empty:
                                sel.modify(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
        if not stopping:
            t_end = time.perf_counter()
            counted = sum(st["counter"].frames for st in state.values()) if count is not None else counted
        if on_drained is not None:
            on_drained()
    finally:
        sel.close()
        for s in socks:
            s.close()
    total = sum(st["counter"].frames for st in state.values())
    return LoadResult(counted, t_end - t_count, sent_bytes, received_bytes, total)


def round_trips(sock: socket.socket, frame: bytes, n: int) -> list[float]:
    """Seconds for each of ``n`` sequential request/response round trips."""
    out = []
    clock = time.perf_counter
    for _ in range(n):
        t0 = clock()
        sock.sendall(frame)
        wire.recv_frame(sock)
        out.append(clock() - t0)
    return out


# -- phases ------------------------------------------------------------------------------------
def rotated(paths: list[Hop], r: int) -> list[Hop]:
    k = r % len(paths)
    return paths[k:] + paths[:k]


def phase_latency(paths: list[Hop], rounds: int, n: int
                  ) -> tuple[list[list[str]], dict[str, float], dict[str, dict[str, list[float]]]]:
    """Rows of the latency table, the kproxy/pipe and kproxy/tansu ratios, and per request kind
    each path's added p50 in every round (seconds), for the targets' ratios within a round."""
    rows: list[list[str]] = []
    ratios: dict[str, float] = {}
    added_rounds: dict[str, dict[str, list[float]]] = {}
    small = wire.produce_request(PRODUCE_TOPIC, wire.record_batch(100, record_size=100))
    for label, frame in (("ApiVersions v3", wire.api_versions_request()),
                         ("Metadata v1 (all topics)", wire.metadata_request(None)),
                         ("Produce v7, 1 record of 100 B, acks=1", small)):
        socks = {p.name: wire.connect(p.port) for p in paths}
        for p in paths:
            round_trips(socks[p.name], frame, 200)  # warm up: caches, listeners, codec compilation
        p50: dict[str, list[float]] = {p.name: [] for p in paths}
        p99: dict[str, list[float]] = {p.name: [] for p in paths}
        cpu: dict[str, float] = {p.name: 0.0 for p in paths}
        for r in range(rounds):
            # Interleave in slices of LATENCY_SLICE requests so that a burst of noise from
            # elsewhere on the machine lands on every path alike, not on one path's whole round.
            samples: dict[str, list[float]] = {p.name: [] for p in paths}
            for k in range(max(1, n // LATENCY_SLICE)):
                for p in rotated(paths, r + k):
                    cpu0 = cpu_seconds(p.pid) if p.pid else 0.0
                    samples[p.name].extend(round_trips(socks[p.name], frame, LATENCY_SLICE))
                    if p.pid:
                        cpu[p.name] += cpu_seconds(p.pid) - cpu0
            for name, values in samples.items():
                p50[name].append(percentile(values, 50))
                p99[name].append(percentile(values, 99))
        for s in socks.values():
            s.close()
        m50 = {k: statistics.median(v) for k, v in p50.items()}
        m99 = {k: statistics.median(v) for k, v in p99.items()}
        # Added latency per round (same round, same noise), then the median.
        add50 = {k: statistics.median(a - d for a, d in zip(p50[k], p50["direct"], strict=True)) for k in p50}
        add99 = {k: statistics.median(a - d for a, d in zip(p99[k], p99["direct"], strict=True)) for k in p99}
        added_rounds[label] = {k: [a - d for a, d in zip(p50[k], p50["direct"], strict=True)] for k in p50}
        for p in paths:
            per_request = cpu[p.name] / (rounds * max(1, n // LATENCY_SLICE) * LATENCY_SLICE)
            rows.append([label, p.name, f"{m50[p.name] * 1e6:.0f}", f"{m99[p.name] * 1e6:.0f}",
                         "-" if p.name == "direct" else f"{add50[p.name] * 1e6:+.0f}",
                         "-" if p.name == "direct" else f"{add99[p.name] * 1e6:+.0f}",
                         "-" if p.pid is None else f"{per_request * 1e6:.0f}"])
        if "pipe" in add50 and "kproxy" in add50:
            ratios[f"{label}: kproxy added p50 / pipe added p50"] = add50["kproxy"] / add50["pipe"]
        if "tansu proxy" in add50 and "kproxy" in add50:
            ratios[f"{label}: kproxy added p50 / tansu proxy added p50"] = add50["kproxy"] / add50["tansu proxy"]
    return rows, ratios, added_rounds


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def phase_throughput(paths: list[Hop], rounds: int, label: str, frame: bytes, unit: str, *,
                     connections: int, depth: int, count: int | None = None, duration: float | None = None,
                     warmup: float = 0.0, broker_pid: int,
                     utilisation: dict[tuple[str, str], list[tuple[float, float, float]]],
                     per_round: dict[str, dict[str, list[float]]] | None = None) -> dict[str, float]:
    """Median rate per path: requests/s (unit 'req/s') or MB/s of request+response bytes ('MB/s').

    Also notes, per run, the CPU use (% of one core) of the client, the proxy and the broker,
    and in ``per_round[label]`` each path's rate in every round.
    """
    rates: dict[str, list[float]] = {p.name: [] for p in paths}
    for r in range(rounds):
        for p in rotated(paths, r):
            cpu0 = cpu_seconds(p.pid) if p.pid else 0.0
            own0, broker0, wall0 = own_cpu_seconds(), cpu_seconds(broker_pid), time.perf_counter()
            res = run_load(p.port, frame, connections=connections, depth=depth, count=count,
                           duration=duration, warmup=warmup)
            wall = time.perf_counter() - wall0
            utilisation.setdefault((label, p.name), []).append((
                100 * (own_cpu_seconds() - own0) / wall,
                100 * (cpu_seconds(p.pid) - cpu0) / wall if p.pid else float("nan"),
                100 * (cpu_seconds(broker_pid) - broker0) / wall))
            if p.pid:
                p.cpu_s[label] = p.cpu_s.get(label, 0.0) + cpu_seconds(p.pid) - cpu0
                p.bytes_moved[label] = p.bytes_moved.get(label, 0) + res.bytes_sent + res.bytes_received
                p.requests[label] = p.requests.get(label, 0) + res.all_responses
            if unit == "req/s":
                rates[p.name].append(res.responses / res.seconds)
            else:
                rates[p.name].append((res.bytes_sent + res.bytes_received) / res.seconds / 1e6)
        print(f"  {label}: round {r + 1}/{rounds} done", file=sys.stderr)
    if per_round is not None:
        per_round[label] = rates
    return {k: statistics.median(v) for k, v in rates.items()}


def idle_connections_rss(p: Hop, n: int) -> tuple[int, int]:
    """(RSS before, RSS with ``n`` connections open, each having answered one ApiVersions), in KB."""
    assert p.pid is not None
    time.sleep(0.5)
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
        time.sleep(1.0)
        after = rss_kb(p.pid)
    finally:
        for s in socks:
            s.close()
    time.sleep(1.0)
    return before, after


# -- main ----------------------------------------------------------------------------------------
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


def setup_topics(broker_port: int) -> None:
    batch = wire.record_batch(BATCH_BYTES)
    with contextlib.closing(wire.connect(broker_port)) as s:
        for topic in (PRODUCE_TOPIC, FETCH_TOPIC):
            res = wire.call(s, wire.CREATE_TOPICS, wire.create_topic_request(topic))
            assert res["topics"][0]["error_code"] == 0, res
        for _ in range(FETCH_BATCHES):
            res = wire.call(s, wire.PRODUCE, wire.produce_request(FETCH_TOPIC, batch))
            assert res["responses"][0]["partition_responses"][0]["error_code"] == 0, res


def pct(a: float, b: float) -> str:
    return f"{100 * a / b:.0f}%"


def _median_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a[r] / b[r] (inf where b[r] is not positive)."""
    return statistics.median(x / y if y > 0 else float("inf") for x, y in zip(a, b, strict=True))


def _cpu_per_gb(p: Hop) -> float | None:
    gb = (p.bytes_moved.get("produce", 0) + p.bytes_moved.get("fetch", 0)) / 1e9
    return (p.cpu_s.get("produce", 0.0) + p.cpu_s.get("fetch", 0.0)) / gb if gb else None


def feature_targets(paths: list[Hop], lat_rounds: dict[str, dict[str, list[float]]],
                    tp_rounds: dict[str, dict[str, list[float]]]) -> list[list[str]]:
    """The issue-14 rows: per feature, its added p50 and throughput over the variant without it;
    everything on against the pipe (added p50, throughput, CPU per GB)."""
    names = {p.name for p in paths}
    rows: list[list[str]] = []
    for what, path, base, budget in FEATURE_BUDGETS:
        if path not in names or base not in names:
            continue
        for label, added in lat_rounds.items():
            over = _median_ratio(added[path], added[base]) - 1
            rows.append([f"{what}: {label}, added p50 over {base}", f"{100 * over:+.1f}%",
                         f"<= +{100 * budget:.0f}%", verdict(over <= budget)])
        for label, rates in tp_rounds.items():
            over = _median_ratio(rates[base], rates[path]) - 1  # how much more time per unit of work
            rows.append([f"{what}: {label} throughput, over {base}", f"{100 * over:+.1f}%",
                         f"<= +{100 * budget:.0f}%", verdict(over <= budget)])
    if AA in names:
        for label, added in lat_rounds.items():
            over = _median_ratio(added[AA], added[KPROXY]) - 1
            rows.append([f"noise floor, an identical second kproxy: {label}, added p50 over {KPROXY}",
                         f"{100 * over:+.1f}%", "-", "(no target)"])
        for label, rates in tp_rounds.items():
            over = _median_ratio(rates[KPROXY], rates[AA]) - 1
            rows.append([f"noise floor, an identical second kproxy: {label} throughput, over {KPROXY}",
                         f"{100 * over:+.1f}%", "-", "(no target)"])
    if EVERYTHING in names and "pipe" in names:
        for label, added in lat_rounds.items():
            ratio = _median_ratio(added[EVERYTHING], added["pipe"])
            rows.append([f"everything on: {label}, added p50 / pipe's", f"{ratio:.2f}x", "<= 1.1x",
                         verdict(ratio <= 1.1)])
        for label, rates in tp_rounds.items():
            share = _median_ratio(rates[EVERYTHING], rates["pipe"])
            rows.append([f"everything on: {label} throughput / pipe's", f"{100 * share:.1f}%", ">= 90%",
                         verdict(share >= 0.9)])
        by_name = {p.name: p for p in paths}
        ours, pipe = _cpu_per_gb(by_name[EVERYTHING]), _cpu_per_gb(by_name["pipe"])
        if ours is not None and pipe is not None:
            rows.append(["everything on: CPU s per GB forwarded (Produce + Fetch), vs pipe's",
                         f"{ours:.2f} (pipe {pipe:.2f}, {100 * (ours / pipe - 1):+.0f}%)", "<= pipe +10%",
                         verdict(ours <= pipe * 1.1)])
    return rows


# -- scale ---------------------------------------------------------------------------------------
CONNECTION_COUNTS = (1, 10, 100, 1000)
PARTITION_COUNTS = (10, 1_000, 100_000)


def phase_connections(proxies: list[Hop], broker_pid: int, quick: bool, rounds: int = 3) -> list[str]:
    """Proxy CPU per pipelined ApiVersions from 1 to 1,000 connections (at least 100 in flight in
    all: depth 100/n per connection), every proxy in each of ``rounds`` rounds, the order rotated
    per round; medians. One connection with 100 in flight settles into large or small batches per
    read from run to run (its CPU per request moved 25-105 µs between single runs), hence rounds."""
    frame = wire.api_versions_request()
    per_conn_total = 2000 if quick else 12000
    samples: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for n in CONNECTION_COUNTS:
        depth = max(1, 100 // n)
        count = max(2 * depth, per_conn_total // n)
        for r in range(rounds):
            for p in rotated(proxies, r):
                pid = p.pid
                assert pid is not None
                marks: list[tuple[float, float]] = []  # (proxy CPU s, wall s) when the load starts and ends

                def mark(pid: int = pid, marks: list[tuple[float, float]] = marks) -> None:
                    marks.append((cpu_seconds(pid), time.perf_counter()))

                # Connections are opened, and closed, outside the measured span: at 1,000 connections
                # of a few requests each, accept and close would otherwise be most of the figure.
                res = run_load(p.port, frame, connections=n, depth=depth, count=count, on_ready=mark,
                               on_drained=mark)
                (cpu0, wall0), (cpu1, wall1) = marks
                done = max(1, res.all_responses)
                samples.setdefault((n, p.name), []).append(((cpu1 - cpu0) / done, done / (wall1 - wall0)))
        print(f"  scale: {n} connections done", file=sys.stderr)
    cpu = {k: statistics.median(c for c, _ in v) for k, v in samples.items()}
    rate = {k: statistics.median(r for _, r in v) for k, v in samples.items()}
    rows = [[f"{n:,}", f"{max(n, 100):,}", *[f"{1e6 * cpu[(n, p.name)]:.0f} ({rate[(n, p.name)]:,.0f}/s)"
                                             for p in proxies]] for n in CONNECTION_COUNTS]
    out = [f"#### Scale: connections\n\nProxy CPU µs per pipelined ApiVersions v3 request (requests/s in "
           f"parentheses; medians of {rounds} rounds), the load spread over N connections (100 in flight in all, "
           "N when N > 100; "
           "connections opened, and one round trip made on each, before the CPU and the time are read; "
           "closed after).\n",
           table(["connections", "in flight", *[p.name for p in proxies]], rows)]
    # The pipe's own cost per request grows with the connection count (fewer requests per wake-up),
    # so "flat" is judged on kproxy's cost relative to the pipe's at the same count.
    target_rows = []
    pipe = "pipe" if any(q.name == "pipe" for q in proxies) else None
    first, last = CONNECTION_COUNTS[0], CONNECTION_COUNTS[-1]
    for p in proxies:
        if not p.name.startswith("kproxy") or pipe is None:
            continue
        at_first = cpu[(first, p.name)] / cpu[(first, pipe)]
        at_last = cpu[(last, p.name)] / cpu[(last, pipe)]
        target_rows.append([f"{p.name}: CPU per request / pipe's, at {last:,} connections vs at {first}",
                            f"{at_last:.2f}x vs {at_first:.2f}x ({at_last / at_first:.2f})", "<= 1.2 (flat)",
                            verdict(at_last / at_first <= 1.2)])
    out += ["", table(["metric", "measured", "target", "status"], target_rows)]
    return ["\n".join(out)]


def phase_partitions(py: str, keys: list[str], workdir: Path, logs: Path, quick: bool) -> list[str]:
    """Sequential Metadata v1 round trips of 10 to 100,000 partitions through the pipe and each
    kproxy variant, against bench/fake_broker.py: p50, added p50 and proxy CPU per request."""
    counts = (10, 1_000, 10_000) if quick else PARTITION_COUNTS
    with contextlib.ExitStack() as stack:
        _fb_proc, fb_port = stack.enter_context(started(
            [py, str(BENCH / "fake_broker.py"), "--partitions", ",".join(map(str, counts))], "fake broker",
            logs / "bench-fake-broker.log"))
        upstream = f"127.0.0.1:{fb_port}"
        pipe_proc, pipe_port = stack.enter_context(started(
            [py, str(BENCH / "pipe.py"), "--upstream", upstream], "pipe (fake broker)", logs / "bench-pipe-fake.log"))
        paths = [Hop("direct", fb_port), Hop("pipe", pipe_port, pipe_proc)]
        for key in keys:
            variant = VARIANTS[key]
            proc, port = stack.enter_context(started(
                variant_command(py, variant, upstream, workdir, key), variant.path,
                logs / f"bench-kproxy-{key}-fake.log"))
            paths.append(Hop(variant.path, port, proc))
        time.sleep(3.0)  # kproxy compiles its likely codecs in the background at start: not a request's cost
        rows = []
        for n in counts:
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
            direct50 = percentile(samples["direct"], 50)
            for p in paths:
                p50 = percentile(samples[p.name], 50)
                per_req = cpu[p.name] / (5 * per_slice)
                rows.append([f"{n:,}", p.name, f"{p50 * 1e3:.2f}",
                             "-" if p.pid is None else f"{(p50 - direct50) * 1e3:+.2f}",
                             "-" if p.pid is None else f"{per_req * 1e6:,.0f}",
                             "-" if p.pid is None else f"{per_req * 1e9 / n:,.0f}"])
            print(f"  scale: Metadata of {n:,} partitions done", file=sys.stderr)
    return ["#### Scale: Metadata partitions\n\nSequential Metadata v1 round trips (one topic asked, its "
            "answer canned by bench/fake_broker.py: topics of 100 partitions, 1 replica), medians over the "
            "requests; proxy CPU per request from /proc. The bytes to move grow with the partition count for "
            "every path: compare each kproxy row with the pipe's at the same count.\n\n"
            + table(["partitions", "path", "p50 ms", "added p50 ms", "proxy CPU µs/req", "proxy CPU ns/partition"],
                    rows)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds per phase (medians reported)")
    parser.add_argument("--quick", action="store_true", help="2 rounds, shorter phases (a smoke run)")
    parser.add_argument("--idle-connections", type=int, default=1000)
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
    rounds = 2 if args.quick else args.rounds
    keys = [k.strip() for k in (args.variants or (QUICK_VARIANTS if args.quick else DEFAULT_VARIANTS)).split(",")
            if k.strip()]
    unknown = [k for k in keys if k not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    if "metrics" not in keys:
        keys.insert(0, "metrics")
    workdir = Path(tempfile.mkdtemp(prefix="kproxy-bench-"))
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    py = sys.executable

    broker_port = _tansu.free_port()
    upstream = f"127.0.0.1:{broker_port}"
    with _tansu.broker(broker_port, logs / "bench-tansu-broker.log") as broker_proc, \
            started([py, str(BENCH / "pipe.py"), "--upstream", upstream], "pipe",
                    logs / "bench-pipe.log") as (pipe_proc, pipe_port), \
            tansu_proxy(broker_port, logs / "bench-tansu-proxy.log") as (tp_proc, tp_port, tp_problem), \
            contextlib.ExitStack() as extra:
        paths = [Hop("direct", broker_port), Hop("pipe", pipe_port, pipe_proc)]
        for key in keys:
            variant = VARIANTS[key]
            vp_proc, vp_port = extra.enter_context(started(
                variant_command(py, variant, upstream, workdir, key), variant.path, logs / f"bench-kproxy-{key}.log"))
            paths.append(Hop(variant.path, vp_port, vp_proc))
        if args.kproxy_env:
            env = dict(item.split("=", 1) for item in args.kproxy_env)
            kp2_proc, kp2_port = extra.enter_context(started(
                [py, str(BENCH / "run_kproxy.py"), "--upstream", upstream], "kproxy (env)",
                logs / "bench-kproxy-env.log", env))
            paths.append(Hop("kproxy " + " ".join(args.kproxy_env), kp2_port, kp2_proc))
        for item in args.kproxy_tree:
            label, _, tree = item.partition("=")
            root = Path(tree).resolve()
            kp3_proc, kp3_port = extra.enter_context(started(
                [py, str(root / "bench" / "run_kproxy.py"), "--upstream", upstream], f"kproxy {label}",
                logs / f"bench-kproxy-{label}.log", {"PYTHONPATH": str(root)}, cwd=root))
            paths.append(Hop(f"kproxy {label}", kp3_port, kp3_proc))
        if tp_proc is not None:
            paths.append(Hop("tansu proxy", tp_port, tp_proc))
        setup_topics(broker_port)
        try:
            sanity(paths)
        except Exception as exc:
            bad = [p for p in paths if p.name == "tansu proxy"]
            if not bad:
                raise
            tp_problem = f"`tansu proxy` failed the sanity check: {exc!r}"
            paths.remove(bad[0])
            sanity(paths)

        print(f"### Proxy benchmark ({machine_line()})\n")
        print(f"Broker: Tansu ({Path(_tansu.tansu_binary()).name}, memory storage). Paths: "
              + ", ".join(p.name for p in paths) + f". Median of {rounds} rounds, path order rotated per round.\n")
        if tp_problem:
            print(f"**tansu proxy not measured**: {tp_problem}\n")

        # RSS first, while every proxy is fresh.
        rss_rows = []
        for p in paths:
            if p.pid is None:
                continue
            before, after = idle_connections_rss(p, args.idle_connections)
            rss_rows.append([p.name, f"{before / 1024:.1f}", f"{after / 1024:.1f}", f"{(after - before) / 1024:.1f}",
                             f"{(after - before) / args.idle_connections:.1f}"])
        print("  idle connections done", file=sys.stderr)

        n_seq = 300 if args.quick else 1000
        lat_rows, lat_ratios, lat_rounds = phase_latency(paths, rounds, n_seq)
        print("  latency done", file=sys.stderr)
        print("#### Sequential round trips (one connection per path, one request at a time)\n")
        print(f"{n_seq} requests per path per round, interleaved across paths {LATENCY_SLICE} at a time; "
              f"p50 and p99 of each round, median of {rounds} rounds. 'added' = path minus direct in the "
              "same round (p99 differences are noisy on a shared machine and can come out negative). "
              "'proxy CPU' is the proxy process's CPU time per request (from /proc/PID/stat).\n")
        print(table(["request", "path", "p50 µs", "p99 µs", "added p50 µs", "added p99 µs", "proxy CPU µs/req"],
                    lat_rows))
        print()

        tp_rounds = rounds
        duration = 1.0 if args.quick else 1.5
        pipelined = {}
        util: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        tp_per_round: dict[str, dict[str, list[float]]] = {}
        common = {"broker_pid": broker_proc.pid, "utilisation": util, "per_round": tp_per_round}
        for label, frame in (("ApiVersions v3", wire.api_versions_request()),
                             ("Metadata v1", wire.metadata_request(None))):
            pipelined[label] = phase_throughput(paths, tp_rounds, f"pipelined {label}", frame, "req/s",
                                                connections=4, depth=100, duration=duration, warmup=0.3, **common)
        batch = wire.record_batch(BATCH_BYTES)
        produce_frame = wire.produce_request(PRODUCE_TOPIC, batch)
        produce = phase_throughput(paths, tp_rounds, "produce", produce_frame, "MB/s", connections=2, depth=5,
                                   count=30 if args.quick else 60, **common)
        fetch_frame = wire.fetch_request(FETCH_TOPIC, 0, FETCH_MAX_BYTES)
        fetch = phase_throughput(paths, tp_rounds, "fetch", fetch_frame, "MB/s", connections=2, depth=2,
                                 count=6 if args.quick else 10, **common)
        peak = {p.name: rss_kb(p.pid, "VmHWM") for p in paths if p.pid}
        scale_out: list[str] = []
        if args.scale:
            # The A/A copy measures noise, not cost: the scale phases leave it out.
            proxies = [p for p in paths if p.pid is not None and p.name != AA]
            scale_out += phase_connections(proxies, broker_proc.pid, args.quick, rounds)
            scale_out += phase_partitions(py, [k for k in keys if k != "aa"], workdir, logs, args.quick)

    names = [p.name for p in paths]
    rows = []
    for label, rates in pipelined.items():
        rows.append([f"pipelined {label}, 4 conns x 100 in flight", "req/s",
                     *[f"{rates[n]:,.0f} ({pct(rates[n], rates['direct'])})" for n in names]])
    rows.append([f"Produce v7 ~{BATCH_BYTES // 1000} KB batches, acks=1, 2 conns x 5 in flight", "MB/s",
                 *[f"{produce[n]:.1f} ({pct(produce[n], produce['direct'])})" for n in names]])
    rows.append([f"Fetch v11 ~{FETCH_BATCHES * BATCH_BYTES // 1_000_000} MB responses, 2 conns x 2 in flight", "MB/s",
                 *[f"{fetch[n]:.1f} ({pct(fetch[n], fetch['direct'])})" for n in names]])
    print(f"#### Throughput (median of {tp_rounds} rounds; % of direct in parentheses)\n")
    print("MB/s counts request plus response bytes through the path.\n")
    print(table(["load", "unit", *names], rows))
    print()

    util_rows = []
    for (label, name), runs in util.items():
        client, proxy, broker = (statistics.median(x[i] for x in runs) for i in range(3))
        util_rows.append([label, name, f"{client:.0f}", "-" if name == "direct" else f"{proxy:.0f}", f"{broker:.0f}"])
    print("CPU use during those runs (% of one core, median of the rounds; the machine has "
          f"{os.cpu_count()} cores in all). A proxy near 100% is the bottleneck of its path.\n")
    print(table(["load", "path", "client %", "proxy %", "broker %"], util_rows))
    print()

    cpu_rows = []
    pipelined_keys = [f"pipelined {label}" for label in pipelined]
    for p in paths:
        if p.pid is None:
            continue
        cells = [f"{1e6 * p.cpu_s[k] / p.requests[k]:.0f}" if p.requests.get(k) else "-" for k in pipelined_keys]
        for key in ("produce", "fetch"):
            gb = p.bytes_moved.get(key, 0) / 1e9
            cells.append(f"{p.cpu_s.get(key, 0.0) / gb:.1f}" if gb else "-")
        both_gb = (p.bytes_moved.get("produce", 0) + p.bytes_moved.get("fetch", 0)) / 1e9
        both_cpu = p.cpu_s.get("produce", 0.0) + p.cpu_s.get("fetch", 0.0)
        cells.append(f"{both_cpu / both_gb:.1f}" if both_gb else "-")
        cpu_rows.append([p.name, *cells, f"{peak[p.name] / 1024:.0f}"])
    print("#### Proxy process cost\n")
    print("CPU time of the proxy process (user+system, all threads, from /proc/PID/stat): per request in the "
          "pipelined phases, per GB of request+response bytes forwarded in the Produce and Fetch phases; "
          "peak RSS over the whole run. CPU time is far less sensitive to a noisy neighbour than throughput.\n")
    print(table(["proxy", *[f"CPU µs/req {k}" for k in pipelined_keys], "CPU s/GB produce", "CPU s/GB fetch",
                 "CPU s/GB produce+fetch", "peak RSS MB"], cpu_rows))
    print()
    print(f"RSS with {args.idle_connections:,} idle client connections open (each with its upstream "
          "connection, each having answered one ApiVersions):\n")
    print(table(["proxy", "RSS before MB", "RSS with conns MB", "delta MB", "KB per connection"], rss_rows))
    print()

    target_rows = []
    for what, ratio in lat_ratios.items():
        target = 1.2 if what.endswith("pipe added p50") else 0.6
        target_rows.append([what, f"{ratio:.2f}x", f"<= {target}x", verdict(ratio <= target)])
    for label, rates in [*(("pipelined " + k, v) for k, v in pipelined.items()), ("Produce", produce),
                         ("Fetch", fetch)]:
        share = rates["kproxy"] / rates["direct"]
        floor = f" (pipe: {100 * rates['pipe'] / rates['direct']:.1f}%)"
        target_rows.append([f"{label}: kproxy % of direct", f"{100 * share:.1f}%{floor}", ">= 90%",
                            verdict(share >= 0.9)])
        if "tansu proxy" in rates:
            vs = rates["kproxy"] / rates["tansu proxy"]
            target_rows.append([f"{label}: kproxy / tansu proxy", f"{vs:.2f}x", ">= 2x", verdict(vs >= 2)])
    print("#### Targets\n")
    print(table(["metric", "measured", "target", "status"], target_rows))
    print()
    budget_rows = feature_targets(paths, lat_rounds, tp_per_round)
    if budget_rows:
        print("#### Targets: the hot-path budget with features on (issue 14)\n")
        print("Each feature's cost over the same kproxy without it, and everything on against the bare pipe. "
              "Ratios are computed within each round (same noise on both sides), then the median over rounds; "
              "'over' = how much more added latency, or how much less throughput. CPU per GB is over the whole "
              "Produce + Fetch phases.\n")
        print(table(["metric", "measured", "target", "status"], budget_rows))
        print()
    for block in scale_out:
        print(block)
        print()
    shutil.rmtree(workdir, ignore_errors=True)  # rule files and captures
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
