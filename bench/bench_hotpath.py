"""In-process micro-benchmark of the per-exchange cost of kproxy's features, side by side.

    .venv/bin/python bench/bench_hotpath.py [--rounds N] [--pairs N] [--tree LABEL=DIR ...] [--quick]

One request/response pair through a :class:`~kproxy.proxy.session.Session` is
``receive_client`` + ``receive_upstream`` + ``report`` (what the server does per
exchange, minus the sockets). Each workload is timed under each *variant* of the
session, in turn and in rotated order within a round; the figure is µs per pair,
the median of the rounds, and '/ none' is the ratio to the variant with no
observer and no rules *in the same round* (the ratios are what to read on a
shared machine):

* ``none``: no observer, no rules;
* ``metrics``: the metrics observer as ``kproxy run`` makes it by default (its ``ProxyServer``'s:
  consumer lag tracked, where the tree has it);
* ``metrics+100 rules``: and 100 loaded rules of which none match (bench/_rules.py:
  other apis, other client ids, other topics);
* ``metrics+100 client-id rules``: and 100 rules on the same api failing on the client id;
* ``metrics+1 matching rule``: and one rule matching every request with a 0 ms delay
  (the whole decide path; the verdict is empty, nothing is held).

``--evict BYTES`` times each pair alone after copying BYTES of other data (16 MiB: more than the
caches of the cores a VM is given hold): what an exchange costs when the broker, the client and
other pods ran on the core since the connection's last one, as they do in a sidecar, where the
figures of hot loops flatter code that is big more than code that is slow.

``--pure`` runs this tree's pure-Python build too (``KPROXY_PURE=1``: kproxy/native.py), beside
the compiled one, alternating round by round. ``--tree LABEL=DIR`` runs the same measurement on
another checkout (e.g. the commit before a change, made with ``git archive COMMIT | tar -x -C DIR``) in a
child process, alternating with this tree round by round: before and after in
one run. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent

WORKLOADS = ("Heartbeat v4", "Produce v7 1x100 B", "Produce v10 1x1 KB", "ApiVersions v3", "Metadata v1",
             "Produce v7 1x100 KB",
             "Fetch v11 1 partition 1 KB", "Fetch v11 100 partitions x 1 KB", "Fetch v13 1 partition 1 KB",
             "Fetch v16 4 partitions x 1 KB")
VARIANTS = ("none", "metrics", "metrics+100 rules", "metrics+100 client-id rules", "metrics+1 matching rule")


# -- worker: runs inside the tree under test (its kproxy first on sys.path) ----------------------
def _frames() -> dict[str, tuple[bytes, bytes]]:
    """(request frame, response frame) per workload, correlation id 1, encoded with the codec under test."""
    from kproxy.protocol import default_body, encode_request, frame
    from kproxy.protocol.frame_builder import request_body, response_body
    from kproxy.protocol.headers import RequestHeader, request_header_version
    from kproxy.protocol.message_schemas import MessageType
    from kproxy.protocol.payloads import encode_response
    from kproxy.protocol.records import Record, encode_batch_v2

    def req(key: int, version: int, **fields: Any) -> bytes:
        body = default_body(key, version, MessageType.REQUEST)
        body.update(fields)
        header = RequestHeader(key, version, 1, "kproxy-bench", request_header_version(key, version), {})
        return frame(encode_request(header, body))

    def resp(key: int, version: int, **fields: Any) -> bytes:
        body = default_body(key, version, MessageType.RESPONSE)
        body.update(fields)
        return frame(encode_response(1, key, version, body))

    now = int(time.time() * 1000)
    batch = encode_batch_v2([Record(offset=0, timestamp=now, key=None, value=b"v" * 100, headers=[])])
    # The proxy benchmark's big Produce (bench/_wire.py record_batch): one batch of 97 records of 1 KiB.
    big = encode_batch_v2([Record(offset=i, timestamp=now, key=None, value=b"v" * 1024, headers=[])
                           for i in range(97)])

    def fetch(version: int, partitions: int) -> tuple[bytes, bytes]:
        """A consumer's Fetch of one topic and its answer: ``partitions`` partitions of one 1 KiB record."""
        one = encode_batch_v2([Record(offset=0, timestamp=now, key=None, value=b"v" * 1024, headers=[])])
        topic = {"topic": "bench-fetch", "topic_id": uuid.UUID(int=0xBE4C)}
        return (req(1, version, **request_body(1, version, max_wait_ms=500, min_bytes=1, max_bytes=52428800, topics=[
                    {**topic, "partitions": [{"partition": p, "fetch_offset": 41, "partition_max_bytes": 1048576}
                                             for p in range(partitions)]}])),
                resp(1, version, **response_body(1, version, responses=[{**topic, "partitions": [
                    {"partition_index": p, "error_code": 0, "high_watermark": 42 + p, "last_stable_offset": 42 + p,
                     "log_start_offset": 0, "preferred_read_replica": -1, "records": one}
                    for p in range(partitions)]}])))

    def produce(records: bytes) -> tuple[bytes, bytes]:
        return (req(0, 7, acks=1, timeout_ms=30_000, topic_data=[
                    {"name": "bench-produce", "partition_data": [{"index": 0, "records": records}]}]),
                resp(0, 7, responses=[{"name": "bench-produce", "partition_responses": [
                    {"index": 0, "error_code": 0, "base_offset": 42, "log_append_time_ms": -1,
                     "log_start_offset": 0}]}]))

    def produce_v10(records: bytes) -> tuple[bytes, bytes]:
        return (req(0, 10, **request_body(0, 10, acks=-1, timeout_ms=30_000, topic_data=[
                    {"name": "bench-produce", "partition_data": [{"index": 0, "records": records}]}])),
                resp(0, 10, **response_body(0, 10, responses=[{"name": "bench-produce", "partition_responses": [
                    {"index": 0, "error_code": 0, "base_offset": 42, "log_append_time_ms": -1,
                     "log_start_offset": 0}]}])))

    # What librdkafka sends since KIP-951 (Produce v10, acks=all), of the publish benchmark's 1 KB message.
    kilobyte = encode_batch_v2([Record(offset=0, timestamp=now, key=None, value=b"x" * 1024, headers=[])])

    return {
        "Heartbeat v4": (req(12, 4, group_id="bench-group", generation_id=1, member_id="m-1"),
                         resp(12, 4, error_code=0)),
        "Produce v7 1x100 B": produce(batch),
        "Produce v10 1x1 KB": produce_v10(kilobyte),
        "ApiVersions v3": (req(18, 3, client_software_name="kproxy-bench", client_software_version="1.0"),
                           resp(18, 3, error_code=0, api_keys=[
                               {"api_key": k, "min_version": 0, "max_version": v}
                               for k, v in ((0, 9), (1, 12), (3, 12), (12, 4), (18, 3))])),
        "Metadata v1": (req(3, 1, topics=None),
                        resp(3, 1, brokers=[{"node_id": 0, "host": "127.0.0.1", "port": 9092, "rack": None}],
                             controller_id=0, topics=[
                                 {"error_code": 0, "name": t, "is_internal": False, "partitions": [
                                     {"error_code": 0, "partition_index": 0, "leader_id": 0,
                                      "replica_nodes": [0], "isr_nodes": [0]}]}
                                 for t in ("bench-produce", "bench-fetch")])),
        "Produce v7 1x100 KB": produce(big),
        "Fetch v11 1 partition 1 KB": fetch(11, 1),
        "Fetch v11 100 partitions x 1 KB": fetch(11, 100),
        "Fetch v11 4 partitions x 1 KB": fetch(11, 4),
        "Fetch v13 1 partition 1 KB": fetch(13, 1),
        # What librdkafka fetches with since KIP-951.
        "Fetch v16 4 partitions x 1 KB": fetch(16, 4),
    }


def _session_factories() -> dict[str, Callable[[], Any]]:
    sys.path.insert(0, str(BENCH))
    import _rules

    from kproxy.metrics.fault_stats import FaultStats
    from kproxy.policy.live_rules import LiveRules
    from kproxy.proxy.address_rewrite import ResponseRewriter
    from kproxy.proxy.addresses import AddressMap
    from kproxy.proxy.session import Session
    from kproxy.rules.load import load_text
    from kproxy.server.proxy_server import ProxyServer
    from kproxy.testing.proxy_thread import proxy_config

    rewriter = ResponseRewriter(AddressMap("127.0.0.1", 40000))
    server = ProxyServer(proxy_config("127.0.0.1:9"))  # the metrics as kproxy run makes them by default
    default = server.observer
    assert default is not None
    rule_sets = {"metrics+100 rules": load_text(_rules.none_match(100)),
                 "metrics+100 client-id rules": load_text(_rules.same_api_client_ids(100)),
                 "metrics+1 matching rule": load_text(_rules.one_zero_delay())}

    def make(variant: str) -> Callable[[], Any]:
        def build() -> Any:
            observer = None if variant == "none" else default.for_broker(None)
            policy = None
            if variant in rule_sets:
                live = LiveRules(rule_sets[variant], counts=FaultStats())
                policy = live.policy("127.0.0.1:50000", None)
            return Session(rewriter, observer=observer, policy=policy)
        return build

    return {v: make(v) for v in VARIANTS}


def _time_pairs(session: Any, request: bytes, response: bytes, pairs: int) -> float:
    """Seconds per request/response pair (one id in flight at a time: ids are free once answered)."""
    receive_client, receive_upstream, report = session.receive_client, session.receive_upstream, session.report
    gc.collect()
    evict = int(os.environ.get("KPROXY_BENCH_EVICT", "0"))
    if evict:
        return _time_cold_pairs(session, request, response, pairs, evict)
    clock = time.thread_time if os.environ.get("KPROXY_BENCH_CPU_TIME") else time.perf_counter
    t0 = clock()
    for _ in range(pairs):
        receive_client(request)
        receive_upstream(response)
        report()
    return (clock() - t0) / pairs


def _time_cold_pairs(session: Any, request: bytes, response: bytes, pairs: int, evict: int) -> float:
    """As :func:`_time_pairs`, each pair timed alone after ``evict`` bytes were copied (the caches
    filled with other data, as a core shared with the broker and the client leaves them between
    two exchanges of one connection): mean seconds per pair, the copies not counted."""
    receive_client, receive_upstream, report = session.receive_client, session.receive_upstream, session.report
    junk, source = bytearray(evict), bytes(evict)
    clock = time.perf_counter
    total = 0.0
    for _ in range(pairs):
        junk[:] = source
        t0 = clock()
        receive_client(request)
        receive_upstream(response)
        report()
        total += clock() - t0
    return total / pairs


def worker(pairs: int, offset: int, warmup: int) -> dict[str, dict[str, float]]:
    """µs per pair for every workload x variant, variants rotated by ``offset``, after ``warmup`` untimed
    pairs through each session."""
    frames = _frames()
    factories = _session_factories()
    out: dict[str, dict[str, float]] = {}
    for w_i, workload in enumerate(WORKLOADS):
        request, response = frames[workload]
        sessions = {v: f() for v, f in factories.items()}
        for s in sessions.values():  # warm up: caches, memo, scanners
            _time_pairs(s, request, response, warmup)
        order = list(VARIANTS)
        k = (offset + w_i) % len(order)
        order = order[k:] + order[:k]
        best: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(3):  # three slices each, interleaved: a burst elsewhere lands on all alike
            for v in order:
                best[v].append(_time_pairs(sessions[v], request, response, pairs))
        out[workload] = {v: 1e6 * min(ts) for v, ts in best.items()}
    return out


# -- driver -------------------------------------------------------------------------------------
def run_tree(root: Path, pairs: int, offset: int, extra_env: dict[str, str],
             warmup: int) -> dict[str, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(root), **extra_env}
    done = subprocess.run([sys.executable, str(BENCH / "bench_hotpath.py"), "--worker", "--pairs", str(pairs),
                           "--offset", str(offset), "--warmup", str(warmup)], env=env, cwd=root, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=3000, help="pairs per timed slice")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1,000 pairs")
    parser.add_argument("--warmup", type=int, default=300,
                        help="untimed pairs through each session first: caches, memos, scanners (default 300)")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                        help="also measure the kproxy of another checkout, alternating round by round")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the thread's CPU (time.thread_time), not the wall clock: what a loaded machine's "
                             "other processes take is not counted (the clock is coarser: use big slices)")
    parser.add_argument("--evict", type=int, default=0, metavar="BYTES",
                        help="copy BYTES between two pairs and time each pair alone: the cost with the CPU's "
                             "caches cold, as on a core shared with other processes (use small --pairs)")
    parser.add_argument("--pure", action="store_true",
                        help="also measure this tree's pure-Python build (KPROXY_PURE=1) beside its compiled one")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.pairs, args.offset, args.warmup)))
        return 0
    rounds, pairs = (2, 1000) if args.quick else (args.rounds, args.pairs)
    if args.cpu_time:
        os.environ["KPROXY_BENCH_CPU_TIME"] = "1"  # read by each tree's worker process
    if args.evict:
        os.environ["KPROXY_BENCH_EVICT"] = str(args.evict)
    trees: list[tuple[str, Path, dict[str, str]]] = [("this tree", BENCH.parent, {})]
    if args.pure:
        trees.append(("this tree, pure", BENCH.parent, {"KPROXY_PURE": "1"}))
    trees += [(label, Path(d).resolve(), {}) for label, _, d in (t.partition("=") for t in args.tree)]
    results: dict[str, list[dict[str, dict[str, float]]]] = {label: [] for label, _, _ in trees}
    for r in range(rounds):
        for label, root, extra_env in trees[r % len(trees):] + trees[:r % len(trees)]:
            results[label].append(run_tree(root, pairs, r, extra_env, args.warmup))
        print(f"  round {r + 1}/{rounds} done", file=sys.stderr)

    sys.path[:0] = [str(BENCH), str(BENCH.parent)]
    from _util import machine_line, table

    print(f"### Per-exchange cost, in process ({machine_line()})\n")
    timed = "CPU µs of the thread" if args.cpu_time else "µs"
    cold = f", each pair after {args.evict:,} bytes copied (caches cold)" if args.evict else ""
    print(f"{timed} per request/response pair through a Session (receive_client + receive_upstream + report){cold}, "
          f"best of 3 slices of {pairs:,} pairs, median of {rounds} rounds; '/ none' = ratio to no observer and no "
          "rules in the same round and tree.\n")
    rows = []
    for workload in WORKLOADS:
        for variant in VARIANTS:
            row = [workload, variant]
            for label, _, _ in trees:
                runs = results[label]
                us = statistics.median(run[workload][variant] for run in runs)
                ratio = statistics.median(run[workload][variant] / run[workload]["none"] for run in runs)
                row += [f"{us:.2f}", f"{ratio:.2f}x"]
            rows.append(row)
    print(table(["workload", "variant", *[h for label, _, _ in trees for h in (f"µs {label}", f"/ none {label}")]],
                rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
