"""CPU per GB of big frames: Produce of 100 KB batches and ~5 MB Fetch responses, side by side.

    .venv/bin/python bench/bench_bulk.py [--rounds N] [--seconds S] [--tree LABEL=DIR ...] [--in-process]

Two measurements, each before/after in one run when ``--tree LABEL=DIR`` names another
checkout (e.g. ``git worktree add --detach DIR main``):

* ``--in-process``: a :class:`~kproxy.proxy.session.Session` fed a stream the way the pumps
  feed it (reads of ``limits.read_size``, cut at arbitrary frame offsets): 50 Produce v7
  requests of one ~100 KB batch then their answers, and 4 Fetch v11 answers of ~5 MB; CPU
  µs per MB (process time, best of 5), with no observer and with metrics (its opt-in labels
  as ``KPROXY_METRICS_TOPIC_LABEL`` / ``KPROXY_METRICS_CLIENT_ID_LABEL`` say, as for the
  processes). Each tree runs in a child process of its own.
* default: real processes. A canned broker (this file, ``--broker``: ApiVersions and
  Metadata as bench/fake_broker.py answers them, Produce v7 and Fetch v11 at once) behind
  bench/pipe.py and ``bench/run_kproxy.py`` of each tree (``--no-metrics`` and with
  metrics); the load of bench_proxy.py's Produce (2 connections x 5 in flight) and Fetch
  (2 x 2) phases, ``--seconds`` each, paths in rotated order per round. CPU s per GB of
  request+response bytes from /proc/PID/stat, and MB/s; medians over rounds, and each
  path's CPU per GB over the pipe's in every round (read those on a shared machine).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
READ_SIZE = 256 * 1024  # kproxy's limits.read_size default
PRODUCE_REQUESTS = 50
FETCH_RESPONSES = 4


def _produce_answer(correlation_id: int) -> bytes:
    from kproxy.protocol import MessageType, default_body, frame
    from kproxy.protocol.payloads import encode_response

    body = default_body(0, 7, MessageType.RESPONSE)
    body["responses"] = [{"name": "bench-produce", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 42, "log_append_time_ms": -1, "log_start_offset": 0,
         "record_errors": [], "error_message": None}]}]
    return frame(encode_response(correlation_id, 0, 7, body))


def _fetch_answer(correlation_id: int, batches: bytes) -> bytes:
    from kproxy.protocol import MessageType, default_body, frame
    from kproxy.protocol.payloads import encode_response

    body = default_body(1, 11, MessageType.RESPONSE)
    body["responses"] = [{"topic": "bench-fetch", "partitions": [{
        "partition_index": 0, "error_code": 0, "high_watermark": 100, "last_stable_offset": 100,
        "log_start_offset": 0, "aborted_transactions": [], "preferred_read_replica": -1, "records": batches}]}]
    return frame(encode_response(correlation_id, 1, 11, body))


def _fetch_batches() -> bytes:
    import _wire as wire
    return b"".join(wire.record_batch(100_000) for _ in range(50))  # ~5 MB, as bench_proxy.py fetches


def _reads(stream: bytes, first: int) -> list[bytes]:
    """``stream`` as the pump reads it: one read of ``first`` bytes, then reads of READ_SIZE."""
    out, pos = [stream[:first]], first
    while pos < len(stream):
        out.append(stream[pos : pos + READ_SIZE])
        pos += READ_SIZE
    return out


# -- in process (runs inside the tree under test: its kproxy first on sys.path) -------------------
def in_process(reps: int) -> dict[str, float]:
    import _wire as wire

    from kproxy.memory import tune_allocator
    from kproxy.metrics.stats import StatsOptions, TrafficStats
    from kproxy.metrics.traffic_observer import MetricsObserver
    from kproxy.proxy.address_rewrite import ResponseRewriter
    from kproxy.proxy.addresses import AddressMap
    from kproxy.proxy.session import Session

    tune_allocator()  # as `kproxy run` does
    batch = wire.record_batch(100_000)
    requests = b"".join(wire.produce_request("bench-produce", batch, correlation_id=c)
                        for c in range(1, PRODUCE_REQUESTS + 1))
    answers = b"".join(_produce_answer(c) for c in range(1, PRODUCE_REQUESTS + 1))
    batches = _fetch_batches()
    fetches = [wire.fetch_request("bench-fetch", 0, 50_000_000, correlation_id=c)
               for c in range(1, FETCH_RESPONSES + 1)]
    fetched = b"".join(_fetch_answer(c, batches) for c in range(1, FETCH_RESPONSES + 1))
    produce_reads, fetch_reads = _reads(requests, 100_003), _reads(fetched, 77_777)
    rewriter = ResponseRewriter(AddressMap("127.0.0.1", 40000))
    # The opt-in labels as the environment sets them for kproxy run (KPROXY_METRICS_TOPIC_LABEL=true ...).
    labels = {name: os.environ.get(f"KPROXY_METRICS_{name.upper()}", "").lower() in ("1", "true", "yes", "on")
              for name in ("topic_label", "client_id_label")}
    stats = TrafficStats(StatsOptions(**labels))

    def produce(s: Any) -> None:
        for chunk in produce_reads:
            s.receive_client(chunk)
            s.report()
        s.receive_upstream(answers)
        s.report()

    def fetch(s: Any) -> None:
        for request in fetches:
            s.receive_client(request)
            s.report()
        for chunk in fetch_reads:
            s.receive_upstream(chunk)
            s.report()

    mb = {"produce": (len(requests) + len(answers)) / 1e6, "fetch": (len(fetched) + sum(map(len, fetches))) / 1e6}
    out = {}
    for variant in ("none", "metrics"):
        for name, run in (("produce", produce), ("fetch", fetch)):
            best = float("inf")
            for _ in range(5):
                s = Session(rewriter, observer=None if variant == "none" else MetricsObserver(stats).for_broker(None))
                gc.collect()
                t0 = time.process_time()
                for _ in range(reps):
                    run(s)
                best = min(best, (time.process_time() - t0) / reps / mb[name] * 1e6)
            out[f"{name} {variant}"] = best
    return out


def run_in_process(trees: dict[str, Path], reps: int) -> None:
    results = {}
    for label, tree in trees.items():
        env = dict(os.environ, PYTHONPATH=str(tree))
        done = subprocess.run([sys.executable, str(BENCH / "bench_bulk.py"), "--in-process-worker", str(reps)],
                              env=env, cwd=tree, check=True, capture_output=True, text=True)
        results[label] = json.loads(done.stdout.strip().splitlines()[-1])
    keys = list(next(iter(results.values())))
    print("| tree | " + " | ".join(f"{k} µs/MB" for k in keys) + " |")
    print("| --- |" + " --- |" * len(keys))
    for label, res in results.items():
        print(f"| {label} | " + " | ".join(f"{res[k]:.1f}" for k in keys) + " |")


# -- the canned broker -----------------------------------------------------------------------------
def broker() -> None:
    import fake_broker

    from kproxy.protocol import frame
    from kproxy.protocol.payloads import encode_response

    canned = {0: _produce_answer(0), 1: _fetch_answer(0, _fetch_batches())}
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve(sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with sock:
            while (head := fake_broker.recv_exact(sock, 4)) is not None:
                payload = fake_broker.recv_exact(sock, struct.unpack(">i", head)[0])
                if payload is None:
                    return
                key, version, correlation_id = struct.unpack_from(">hhi", payload, 0)
                if key in (3, 18):  # kproxy's broker discovery
                    body = fake_broker.api_versions_body() if key == 18 else fake_broker.metadata_body(0, port)
                    sock.sendall(frame(encode_response(correlation_id, key, version, body)))
                    continue
                answer = canned[key]
                sock.sendall(answer[:4] + struct.pack(">i", correlation_id))
                sock.sendall(memoryview(answer)[8:])

    print(f"ready {port}", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


# -- real processes --------------------------------------------------------------------------------
def _start(cmd: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line or line[0] != "ready":
        proc.kill()
        raise RuntimeError(f"{cmd} did not start: {line}")
    return proc, int(line[1])


def run_processes(trees: dict[str, Path], rounds: int, seconds: float) -> None:
    import _wire as wire
    from _load import run_load
    from _paths import cpu_seconds

    procs: list[subprocess.Popen[str]] = []
    try:
        proc, broker_port = _start([sys.executable, str(BENCH / "bench_bulk.py"), "--broker"])
        procs.append(proc)
        upstream = f"127.0.0.1:{broker_port}"
        paths: dict[str, tuple[int, int]] = {}
        proc, port = _start([sys.executable, str(BENCH / "pipe.py"), "--upstream", upstream])
        procs.append(proc)
        paths["pipe"] = (proc.pid, port)
        for label, tree in trees.items():
            for metrics in (False, True):
                cmd = [sys.executable, str(tree / "bench" / "run_kproxy.py"), "--upstream", upstream]
                proc, port = _start(cmd + ([] if metrics else ["--no-metrics"]),
                                    dict(os.environ, PYTHONPATH=str(tree)))
                procs.append(proc)
                paths[f"{label}{'' if metrics else ' no observer'}"] = (proc.pid, port)
        phases = [("produce", wire.produce_request("bench-produce", wire.record_batch(100_000)), 5),
                  ("fetch", wire.fetch_request("bench-fetch", 0, 50_000_000), 2)]
        names = list(paths)
        cost: dict[tuple[str, str], list[tuple[float, float]]] = {(n, p): [] for n in names for p, _, _ in phases}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                pid, port = paths[name]
                for phase, request, depth in phases:
                    cpu0 = cpu_seconds(pid)
                    res = run_load(port, request, connections=2, depth=depth, duration=seconds,
                                   warmup=0.3)
                    moved = res.bytes_sent + res.bytes_received
                    cost[(name, phase)].append(((cpu_seconds(pid) - cpu0) / (moved / 1e9),
                                                moved / res.seconds / 1e6))
            print(f"  round {r + 1}/{rounds} done", file=sys.stderr)
    finally:
        for proc in procs:
            proc.kill()
    print("| path | CPU s/GB produce | MB/s produce | CPU s/GB fetch | MB/s fetch | CPU/GB over pipe, per round |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in names:
        cells = []
        for phase, _, _ in phases:
            got = cost[(name, phase)]
            cells += [f"{statistics.median(c for c, _ in got):.2f}", f"{statistics.median(m for _, m in got):.0f}"]
        over = "" if name == "pipe" else "; ".join(
            f"{phase} " + ", ".join(f"{a / b:.2f}x" for (a, _), (b, _) in zip(cost[(name, phase)],
                                                                              cost[("pipe", phase)], strict=True))
            for phase, _, _ in phases)
        print(f"| {name} | " + " | ".join(cells) + f" | {over} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="per phase and path, after 0.3 s of warm-up")
    parser.add_argument("--reps", type=int, default=20, help="in process: streams per timed slice")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                        help="another checkout to measure beside this one")
    parser.add_argument("--in-process", action="store_true")
    parser.add_argument("--in-process-worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--broker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path[:0] = [str(BENCH), os.environ.get("PYTHONPATH") or str(ROOT)]
    if args.broker:
        broker()
        return 0
    if args.in_process_worker is not None:
        print(json.dumps(in_process(args.in_process_worker)))
        return 0
    trees = {"kproxy": ROOT}
    for spec in args.tree:
        label, _, path = spec.partition("=")
        trees[f"kproxy {label}"] = Path(path).resolve()
    if args.in_process:
        run_in_process(trees, args.reps)
    else:
        run_processes(trees, args.rounds, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
