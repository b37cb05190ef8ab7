"""Capture micro-benchmark: what the capture costs per exchange, on the event loop and on the writer thread.

    .venv/bin/python bench/bench_capture.py [--exchanges N] [--rounds R] [--tree NAME=DIR ...]

For each kind of exchange (the proxy benchmark's: ApiVersions v3, Metadata v1
of 10 topics x 3 partitions, Produce v7 of one 100 B record, Fetch v11 of one
batch; every Produce and Fetch different, as a client's are), and big Metadata
v1 answers (bench/fake_broker.py's, of 1,000 / 10,000 / 100,000 partitions:
the same bytes every time as a broker answers a client refreshing, and at
100,000 a new answer every time too; ~2,000,000 partitions' worth of exchanges
of each, at least 5), N exchanges go
through a sans-IO session whose observer is the capture's, offering to a real
CaptureWriter's queue (its thread not started: nothing competes). Timed
separately, in CPU time of the process:

* loop: ``Session.report()`` handing the N exchanges to the capture observer
  (what the proxy's event loop pays per exchange, the offer included);
* writer: what the writer thread pays for them, split in three: reading the
  queued exchanges into rows (``rows``), turning the rows into one Arrow table
  (``arrow``), and writing that table as a Parquet file (``parquet``: encoding,
  compression, the footer; the file's bytes per record are reported too).

Then (``--stalls N``, 0 to skip) the event loop's side of the GIL: N exchanges
are queued, the writer thread started to write them, and a stand-in for the
event loop (waits of 100 µs for I/O, ~20 µs of Python between them) notes how
late each wait ends: the time it waited for the writer to give the GIL back,
over what it waits with the writer idle. That lateness is at the mercy of the
machine's other processes; the writer's GIL holds (its CPU time between two
hand-backs of the GIL) are not, and bound what the loop waits. The forced
hand-overs of the interpreter's switch interval are not counted as hand-backs
(a first read of a huge Metadata answer relies on them: see its lateness).

Each tree is measured ``--rounds`` times, the trees' processes interleaved, and
the least CPU time of each figure is kept: the machine is shared, and the
least is the one least disturbed.

``--tree NAME=DIR`` measures another checkout too (e.g. main before a change),
each tree in its own process, so before and after come from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("ApiVersions v3", "Metadata v1 (10 topics x 3)", "Produce v7 (1 x 100 B)", "Fetch v11 (1 batch)",
         "Metadata v1 (1,000 p.)", "Metadata v1 (10,000 p.)", "Metadata v1 (100,000 p.)",
         "Metadata v1 (100,000 p., each new)")
# The big Metadata kinds (bench/fake_broker.py's answers, as the proxy benchmark's partition phase gets
# them): partitions per answer, and whether every answer differs (else the same bytes, as a broker
# answers a client that refreshes); fewer exchanges of them (see _count).
_BIG = {4: (1_000, False), 5: (10_000, False), 6: (100_000, False), 7: (100_000, True)}
_MARK = 0x7EADBEEF  # the controller id of the answer built once; patched per exchange for "each new"


def _count(kind: int, n: int) -> int:
    """Exchanges of a kind: n, or for the big Metadata kinds about 2,000,000 partitions' worth (at
    least 5), so that each kind takes the writer a second or so."""
    if kind not in _BIG:
        return n
    return max(5, min(n, 2_000_000 // _BIG[kind][0]))


def _big_pairs(kind: int, n: int) -> list[tuple[bytes, bytes]]:
    """Metadata v1 exchanges of :data:`_BIG`'s answers, built once and copied with each exchange's
    correlation id (and, "each new", controller id) patched in."""
    import struct

    from kproxy.protocol.frame_builder import request_frame, response_frame

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fake_broker import metadata_body

    partitions, fresh = _BIG[kind]
    body = metadata_body(partitions, 9092)
    body["controller_id"] = _MARK
    template = response_frame(3, 1, 0, body)
    mark = template.index(struct.pack(">i", _MARK))
    out = []
    for cid in range(n):
        resp = bytearray(template)
        resp[4:8] = struct.pack(">i", cid)
        resp[mark:mark + 4] = struct.pack(">i", (cid if fresh else 1))
        out.append((request_frame(3, 1, cid, topics=[{"name": f"partitions-{partitions}"}]), bytes(resp)))
    return out


def _pairs(kind: int, n: int) -> list[tuple[bytes, bytes]]:
    if kind in _BIG:
        return _big_pairs(kind, _count(kind, n))
    from kproxy.protocol.frame_builder import request_frame, response_frame
    from kproxy.protocol.records import Record, encode_batch_v2

    def batch(i: int) -> bytes:  # every batch differs (timestamp, offset), as a client's do
        return encode_batch_v2([Record(offset=i, timestamp=1_790_000_000_000 + i, key=None, value=b"x" * 100)],
                               base_offset=i)

    topics = [{"name": f"topic-{i}", "partitions": [{"partition_index": p, "leader_id": 1, "replica_nodes": [1],
                                                     "isr_nodes": [1]} for p in range(3)]} for i in range(10)]
    out = []
    for cid in range(n):
        if kind == 0:
            req = request_frame(18, 3, cid, client_software_name="bench", client_software_version="1")
            resp = response_frame(18, 3, cid, api_keys=[{"api_key": k, "min_version": 0, "max_version": 9}
                                                        for k in range(20)])
        elif kind == 1:
            req = request_frame(3, 1, cid, topics=None)
            resp = response_frame(3, 1, cid, brokers=[{"node_id": 1, "host": "b", "port": 9092}], controller_id=1,
                                  topics=topics)
        elif kind == 2:
            req = request_frame(0, 7, cid, acks=1, timeout_ms=1000,
                                topic_data=[{"name": "bench", "partition_data": [{"index": 0, "records": batch(cid)}]}])
            resp = response_frame(0, 7, cid, responses=[{"name": "bench", "partition_responses": [
                {"index": 0, "error_code": 0}]}])
        else:
            req = request_frame(1, 11, cid, topics=[{"topic": "bench", "partitions": [{"partition": 0}]}])
            resp = response_frame(1, 11, cid, responses=[{"topic": "bench", "partitions": [
                {"partition_index": 0, "high_watermark": cid + 1, "records": batch(cid)}]}])
        out.append((req, resp))
    return out


def _session(tmp: Path, pairs: list[tuple[bytes, bytes]], **options: Any) -> tuple[Any, Any]:
    """A CaptureWriter (not started) and a session whose exchanges ``pairs`` went through, not yet
    reported to the capture observer."""
    from kproxy.capture import observer as obs_mod
    from kproxy.capture.writer import CaptureWriter
    from kproxy.protocol.topic_ids import TopicIdNames
    from kproxy.proxy.address_rewrite import ResponseRewriter
    from kproxy.proxy.addresses import AddressMap
    from kproxy.proxy.session import Session

    conn = obs_mod.ConnectionInfo(connection_id="c-1", client_host="127.0.0.1", client_port=50000,
                                  listener="broker-1", upstream="127.0.0.1:9092")
    n = len(pairs)
    if hasattr(obs_mod, "Captured"):
        from kproxy.capture.record_builder import RecordBuilder

        builder = RecordBuilder()
        writer = CaptureWriter(tmp, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=60,
                               queue_size=n, rows=builder.rows, **options)
        observer = obs_mod.CaptureObserver(conn, writer.offer)
    else:
        writer = CaptureWriter(tmp, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=60,
                               queue_size=n, **options)
        observer = obs_mod.CaptureObserver(conn, writer.offer, TopicIdNames(), obs_mod.PayloadOptions())
    session = Session(ResponseRewriter(AddressMap("kproxy.bench", 40000)), observer=observer)
    for req, resp in pairs:
        session.receive_client(req)
        session.receive_upstream(resp)
    return writer, session


def _late(done: Callable[[], bool], limit: float = 30.0) -> list[float]:
    """A stand-in for the proxy's event loop: wait for I/O (a sleep of 100 µs: the GIL is let go,
    as trio's epoll wait lets it go), then ~20 µs of Python; until ``done()``. Returns, per wait,
    how late it ended in µs: on top of the kernel's timer slack, the time the loop waited to get
    the GIL back."""
    late = []
    sleep, clock = time.sleep, time.perf_counter
    deadline = clock() + limit
    while not done() and clock() < deadline:
        t0 = clock()
        sleep(0.0001)
        late.append((clock() - t0 - 0.0001) * 1e6)
        sum(range(300))
    return late


class _Holds:
    """The writer thread's GIL holds: CPU time of the thread between two of its hand-backs
    (``time.sleep(0)`` in kproxy.capture.writer), the Parquet writer's calls (which let go of the
    GIL) counted as hand-backs. CPU time, not wall time: what the other processes of a shared
    machine take from the thread is not counted."""

    def __init__(self) -> None:
        self.holds: list[float] = []
        self._since: float | None = None

    def __getattr__(self, name: str) -> Any:  # stands in for the time module in the writer's module
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        self.hand_back()
        time.sleep(seconds)
        self._since = time.thread_time()

    def hand_back(self) -> None:
        now = time.thread_time()
        if self._since is not None:
            self.holds.append((now - self._since) * 1e6)
        self._since = None

    def around(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.hand_back()
            try:
                return method(*args)
            finally:
                self._since = time.thread_time()
        return call


def stalls(n: int) -> dict[str, list[float]]:
    """Per kind, while the writer thread writes ``n`` queued exchanges: the loop's lateness
    (p50, p99, max µs), the same while the writer is idle, the writer's wall time (ms), and its
    GIL holds (p50, p99, max µs of CPU)."""
    import kproxy.capture.writer as writer_mod

    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, name in enumerate(KINDS):
            writer, session = _session(Path(tmp) / str(kind), _pairs(kind, n))
            session.report()
            stop = time.perf_counter() + 0.3
            idle = _late(lambda: time.perf_counter() > stop)  # noqa: B023 (called before the loop moves on)
            holds = _Holds()
            file_class = writer_mod._OpenFile
            saved = writer_mod.time, file_class.write, file_class.finish
            writer_mod.time = holds  # type: ignore[assignment]
            file_class.write, file_class.finish = holds.around(file_class.write), holds.around(file_class.finish)
            try:
                t0 = time.perf_counter()
                writer.start()
                writer._stop.set()  # as close(): write what is queued, complete the file, end
                writer._wake.set()
                busy = _late(lambda w=writer: not w._thread.is_alive())
                wall = time.perf_counter() - t0
                writer.close()
            finally:
                writer_mod.time, file_class.write, file_class.finish = saved
            assert writer.written == _count(kind, n), (writer.written, _count(kind, n))
            out[name] = [*_quantiles(busy), *_quantiles(idle), wall * 1000, *_count_and_quantiles(holds.holds)]
    return out


def _quantiles(values: list[float]) -> list[float]:
    values = sorted(values)
    return [values[len(values) // 2], values[len(values) * 99 // 100], values[-1]]


def _count_and_quantiles(values: list[float]) -> list[float]:
    return [len(values), *_quantiles(values)]


def measure(n: int) -> dict[str, list[float]]:
    """Per kind: [loop, rows, arrow, parquet µs per exchange, file bytes per record] with the
    kproxy on sys.path."""
    from kproxy.capture import observer as obs_mod

    new_api = hasattr(obs_mod, "Captured")
    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        warm_up = [(kind, "warm-up") for kind in range(4)]  # the first pa.array call loads pyarrow...
        for kind, name in warm_up + list(enumerate(KINDS)):
            pairs = _pairs(kind, n if name != "warm-up" else 100)
            writer, session = _session(Path(tmp), pairs)
            t0 = time.process_time()
            session.report()
            loop = time.process_time() - t0
            t0 = time.process_time()
            if new_api:
                # kproxy.capture.queue's take; trees before it: the writer's own _take.
                take = writer.queue.take if hasattr(writer, "queue") else writer._take
                rows = writer.rows(take(len(pairs)))
            else:
                rows = [writer._queue.get_nowait() for _ in range(writer._queue.qsize())]
            t1 = time.process_time()
            table = writer._to_table(rows)
            t2 = time.process_time()
            file = writer._new_file(0)
            file.write(table)
            size = file.finish()
            t3 = time.process_time()
            assert table.num_rows == len(pairs), (table.num_rows, len(pairs))
            out[name] = [x / len(pairs) * 1e6 for x in (loop, t1 - t0, t2 - t1, t3 - t2)] + [size / len(pairs)]
    del out["warm-up"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exchanges", type=int, default=10_000)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                        help="another checkout to measure too, e.g. before=/tmp/main")
    parser.add_argument("--rounds", type=int, default=3, help="processes per tree; the least of each figure is kept")
    parser.add_argument("--stalls", type=int, default=20_000, metavar="N",
                        help="exchanges per kind for the event loop's lateness while the writer works (0: skip)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one tree, for the parent
    args = parser.parse_args()
    if args.json:
        print(json.dumps({"cpu": measure(args.exchanges), "stalls": stalls(args.stalls) if args.stalls else {}}))
        return
    trees = [("this tree", str(ROOT))] + [tuple(t.split("=", 1)) for t in args.tree]
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    for _ in range(args.rounds):
        for name, directory in trees:
            env = dict(os.environ, PYTHONPATH=directory)
            run = subprocess.run([sys.executable, __file__, "--json", "--exchanges", str(args.exchanges),
                                  "--stalls", str(args.stalls)],
                                 env=env, cwd=directory, capture_output=True, text=True, check=True)
            got = json.loads(run.stdout)
            best = results.setdefault(name, got)
            for table, kinds in got.items():
                for kind, figures in kinds.items():
                    best[table][kind] = [min(a, b) for a, b in zip(best[table][kind], figures, strict=True)]
    print(f"{args.exchanges} exchanges per kind; µs per exchange (CPU time of the process, least of {args.rounds} "
          "processes per tree); B/rec: Parquet file bytes per record\n")
    print("| exchange | tree | loop µs | rows µs | arrow µs | parquet µs | writer µs | B/rec |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind in KINDS:
        for name, _ in trees:
            loop, rows, arrow, parquet, size = results[name]["cpu"][kind]
            print(f"| {kind} | {name} | {loop:.2f} | {rows:.2f} | {arrow:.2f} | {parquet:.2f} | "
                  f"{rows + arrow + parquet:.2f} | {size:.1f} |")
    if not args.stalls:
        return
    print(f"\nThe event loop's lateness (µs) after a 100 µs wait for I/O, while the writer thread writes "
          f"{args.stalls} queued exchanges (busy) and while it is idle; least of {args.rounds} processes\n")
    print("| exchange | tree | busy p50 | busy p99 | busy max | idle p50 | idle p99 | idle max | writer ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind in KINDS:
        for name, _ in trees:
            figures = results[name]["stalls"][kind][:7]
            print(f"| {kind} | {name} | " + " | ".join(f"{x:.0f}" for x in figures) + " |")
    print(f"\nThe writer thread's GIL holds meanwhile: µs of its CPU time between two hand-backs; least of "
          f"{args.rounds} processes\n")
    print("| exchange | tree | holds | p50 | p99 | max |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind in KINDS:
        for name, _ in trees:
            figures = results[name]["stalls"][kind][7:]
            print(f"| {kind} | {name} | " + " | ".join(f"{x:.0f}" for x in figures) + " |")


if __name__ == "__main__":
    main()
