"""The capture worker's CPU per exchange: what ``capture.process`` costs the sidecar's cores.

    .venv/bin/python bench/bench_capture_worker.py [--exchanges N] [--rounds R] [--tree NAME=DIR ...]

Each round, per tree (in its own process, the trees alternating): N Produce v9 exchanges of one
1 KB record over 10 topics (the publish benchmark's messages) go through a sans-IO session whose
observer is the capture's, offering to a real :class:`kproxy.capture.shipper.CaptureShipper`,
which pickles them to a real worker process (``python -m kproxy.capture.worker``) that reads
them into rows and writes its Parquet file; a steady stream (a pause every 50 exchanges), not
one burst. Reported per exchange, in CPU time (what other processes take is not counted):

* loop: the session and the capture observer's offer (this process's main thread);
* shipper: the shipper thread's pickling and writing to the pipe (the process's CPU minus the loop's);
* worker: the worker process, all its threads, from when it was ready to when it ended (its
  start-up, imports included, is left out: a proxy pays it once).

The median of the rounds per tree. ``--tree NAME=DIR`` measures another checkout too (its own
build, e.g. main before a change), so before and after come from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from _util import machine_line, table  # noqa: E402

_CHILD = r'''
import json, os, resource, sys, tempfile, time
from pathlib import Path
from kproxy.capture import observer as obs_mod
from kproxy.capture.shipper import CaptureShipper
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.records import Record, encode_batch_v2
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.session import Session

n = int(sys.argv[1])
pairs = []
for cid in range(n):
    topic = f"publish-{cid % 10}"
    batch = encode_batch_v2([Record(offset=0, timestamp=1_790_000_000_000 + cid, key=None, value=b"x" * 1024)],
                            base_offset=0)
    pairs.append((request_frame(0, 9, cid, acks=-1, timeout_ms=30000, transactional_id=None,
                                topic_data=[{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]),
                  response_frame(0, 9, cid, responses=[{"name": topic, "partition_responses": [
                      {"index": 0, "error_code": 0, "base_offset": cid}]}])))
with tempfile.TemporaryDirectory() as tmp:
    shipper = CaptureShipper(Path(tmp), max_bytes_total=10**10, rotate_bytes=10**9, rotate_seconds=3600).start()
    conn = obs_mod.ConnectionInfo(connection_id="c-1", client_host="127.0.0.1", client_port=50000,
                                  listener="broker-1", upstream="127.0.0.1:9092")
    session = Session(ResponseRewriter(AddressMap("kproxy.bench", 40000)),
                      observer=obs_mod.CaptureObserver(conn, shipper.queue.offer))
    worker = shipper._state[1].process.pid
    # Ready: it has loaded its modules and started its writer (its CPU settles).
    last, deadline = -1.0, time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.5)
        with open(f"/proc/{worker}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        now = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        if now == last:
            break
        last = now
    loop0, proc0 = time.thread_time(), time.process_time()
    for i, (req, resp) in enumerate(pairs):
        session.receive_client(req)
        session.receive_upstream(resp)
        session.report()
        if i % 50 == 49:
            time.sleep(0.001)
    loop = time.thread_time() - loop0
    shipper.close(600)
    proc = time.process_time() - proc0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"loop": loop / n, "shipper": (proc - loop) / n,
                      "worker": (children.ru_utime + children.ru_stime - last) / n,
                      "written": shipper.written, "dropped": shipper.dropped}))
'''


def run(tree: Path, n: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(n)], cwd=tree, env=env, capture_output=True,
                         text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{tree}: the measurement failed:\n{out.stderr[-3000:]}")
    doc: dict[str, float] = json.loads(out.stdout.splitlines()[-1])
    if doc["written"] != n or doc["dropped"]:
        raise SystemExit(f"{tree}: {doc['written']:.0f} of {n} written, {doc['dropped']:.0f} dropped: "
                         "a worker that drops measures less than the work")
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exchanges", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                        help="another checkout, measured in alternate rounds")
    args = parser.parse_args()
    trees = {"this tree": ROOT}
    for spec in args.tree:
        name, _, path = spec.partition("=")
        trees[name] = Path(path).resolve()
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name, tree in (list(trees.items()) if r % 2 == 0 else reversed(list(trees.items()))):
            samples[name].append(run(tree, args.exchanges))
            s = samples[name][-1]
            print(f"  round {r + 1}/{args.rounds} {name}: worker {1e6 * s['worker']:.1f} µs", file=sys.stderr)
    print(f"### Capture worker CPU per exchange ({machine_line()})\n")
    print(f"{args.exchanges:,} Produce v9 exchanges of one 1 KB record, 10 topics; µs of CPU per exchange, "
          f"median of {args.rounds} rounds (least and most in brackets).\n")
    rows = []
    for name, runs in samples.items():
        cells = [name]
        for key in ("loop", "shipper", "worker"):
            values = sorted(1e6 * s[key] for s in runs)
            cells.append(f"{statistics.median(values):.1f} ({values[0]:.1f}-{values[-1]:.1f})")
        rows.append(cells)
    print(table(["tree", "loop µs", "shipper µs", "worker µs"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
