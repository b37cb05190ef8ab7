"""Sequential round trips through real kproxy processes, against a canned broker: CPU per request,
the event loop's thread apart from the others (the capture writer), and the p50.

    .venv/bin/python bench/bench_roundtrip.py [--workload "Produce v7 1x100 B"] [--procs 3]
                                              [--requests 4000] [--rounds 5] [--tree LABEL=DIR ...]

One request at a time, as bench_proxy.py's latency phase sends them (bench/_load.py's round_trips). The broker
is a thread of this process answering every frame with bench_hotpath.py's canned response of the
workload (its correlation id patched), so only kproxy's work differs between variants: no
observer (``--no-metrics``), metrics, metrics + capture, and everything (capture and the 100
non-matching rules of bench/_rules.py none_match). ``--tree LABEL=DIR`` also runs DIR's kproxy
(PYTHONPATH=DIR), its rounds interleaved with this tree's.

Why several processes per variant (``--procs``): on a shared 2-core machine, identical kproxy
processes were seen to differ by ~20 µs of CPU per small Produce from one another, for the life
of the process (A/A; not the hash seed), more than the metrics' share. The figure per variant
is the median over processes of each process's median over rounds. CPU comes from
/proc/PID/task/*/stat (clock ticks: ``--requests`` of a few thousand keep a tick a few µs).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import _rules  # noqa: E402
import bench_hotpath  # noqa: E402
from _load import round_trips  # noqa: E402
from _paths import CLK_TCK  # noqa: E402

_SIZE = struct.Struct(">i")


def canned_broker(response: bytes) -> int:
    """Listen on an ephemeral port; every request frame gets ``response`` with its correlation id."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        while data := conn.recv(65536):
            buf += data
            while len(buf) >= 4 and len(buf) >= 4 + _SIZE.unpack_from(buf)[0]:
                end = 4 + _SIZE.unpack_from(buf)[0]
                conn.sendall(response[:8] + buf[8:12] + response[12:])
                buf = buf[end:]

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(listener.getsockname()[1])


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid``'s main thread and of its other threads."""
    main = others = 0.0
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        fields = stat.read_text().rsplit(")", 1)[1].split()
        seconds = (int(fields[11]) + int(fields[12])) / CLK_TCK
        if stat.parent.name == str(pid):
            main += seconds
        else:
            others += seconds
    return main, others


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="Produce v7 1x100 B", help="a workload of bench_hotpath.py")
    parser.add_argument("--procs", type=int, default=3, help="kproxy processes per variant")
    parser.add_argument("--requests", type=int, default=4000, help="round trips per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR")
    args = parser.parse_args()
    request, response = bench_hotpath._frames()[args.workload]
    port = canned_broker(response)
    work = Path(tempfile.mkdtemp(prefix="kproxy-roundtrip-"))
    rules = work / "rules.yaml"
    rules.write_text(_rules.none_match(100))
    variants = {"no observer": ["--no-metrics"], "metrics": [],
                "+capture": ["--capture-dir", str(work / "capture")],
                "everything": ["--capture-dir", str(work / "capture"), "--rules", str(rules)]}
    trees = [("this tree", BENCH.parent)] + [(t.split("=", 1)[0], Path(t.split("=", 1)[1])) for t in args.tree]
    runs: dict[tuple[str, str, int], tuple[subprocess.Popen[bytes], socket.socket]] = {}
    try:
        for label, tree in trees:
            for variant, flags in variants.items():
                for i in range(args.procs):
                    proc = subprocess.Popen(
                        [sys.executable, str(tree / "bench" / "run_kproxy.py"), "--upstream", f"127.0.0.1:{port}",
                         *flags], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tree,
                        env={**os.environ, "PYTHONPATH": str(tree)})
                    assert proc.stdout is not None
                    sock = socket.create_connection(("127.0.0.1", int(proc.stdout.readline().split()[1])))
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    round_trips(sock, request, 300)  # warm up
                    runs[(label, variant, i)] = (proc, sock)
        samples: dict[tuple[str, str, int], list[tuple[float, float, float]]] = {key: [] for key in runs}
        keys = list(runs)
        for r in range(args.rounds):  # rotated: a burst elsewhere lands on every process alike
            for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                proc, sock = runs[key]
                main0, others0 = thread_cpu(proc.pid)
                p50 = statistics.median(round_trips(sock, request, args.requests))
                main1, others1 = thread_cpu(proc.pid)
                samples[key].append((p50, (main1 - main0) / args.requests, (others1 - others0) / args.requests))
    finally:
        for proc, sock in runs.values():
            sock.close()
            proc.terminate()
            proc.wait()
    print(f"{args.workload}: {args.procs} processes per variant, {args.rounds} rounds of {args.requests} "
          f"sequential round trips (µs: median over processes of each one's median over rounds)")
    for label, _ in trees:
        for variant in variants:
            per_proc = [[statistics.median(s[j] for s in samples[(label, variant, i)]) * 1e6 for j in range(3)]
                        for i in range(args.procs)]
            p50, main_cpu, others = (statistics.median(p[j] for p in per_proc) for j in range(3))
            spread = max(p[1] for p in per_proc) - min(p[1] for p in per_proc)
            print(f"{label:12s} {variant:12s} p50 {p50:7.1f}  CPU/request: loop {main_cpu:6.1f} "
                  f"(spread over processes {spread:5.1f})  other threads {others:5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
