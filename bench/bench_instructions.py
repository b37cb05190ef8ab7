"""Instructions per request, counted by valgrind's callgrind: a figure the machine's load does not move.

    .venv/bin/python bench/bench_instructions.py [--paths pipe,all,allpure] [--requests 1000]
                                                 [--workloads ...] [--tree LABEL=DIR ...] [--top 25]
                                                 [--calls] [--keep DIR]

Why: on the shared 2-core machine, CPU time per request moves by tens of percent from run to run
(docs/PERFORMANCE.md, "Run-to-run variation"), and ``perf stat -e instructions`` is not available
(no hardware counters in this VM). callgrind runs the process on a synthetic CPU and counts every
instruction it executes in user space: the same binary fed the same bytes gives the same count
whatever else runs, to a fraction of a percent (trio's scheduler shuffles its runnable batches at
random, and the capture writer's thread wakes on a clock: the small part that varies).
What it does not count: the kernel (system calls, the TCP stack, context switches), which the pipe
pays as kproxy does (a ``perf`` profile of the everything-on process found 26-34 % of its CPU there),
and waits. The figures are instructions of the proxy process, all its threads, per request.

How: each path is a real process (bench/pipe.py, or bench/run_kproxy.py with a variant of
bench/_paths.py, or another checkout's with ``--tree``) started under callgrind with instrumentation
off (a fast start), in front of a canned broker (a thread of this process answering each request
frame with the workload's response, its correlation id patched, every frame its socket holds in one
write). Per workload one connection: warmed up, then instrumentation on (``callgrind_control -i
on``), warmed up again, the counters zeroed (``-z``), ``--requests`` requests sent, the process left
until it is quiet (the capture writer has written its rows), the counters dumped (``-d``).
Sequential workloads send one request at a time; ``pipelined`` ones a batch of ``--batch`` requests
in one write, the next batch once every answer is in (so the batch is one read on every path: the
count does not depend on timing).

Where the instructions go: each dump is split by the object they ran in (the CPython interpreter,
which runs trio and every module left interpreted; kproxy's compiled library; libc; pyarrow and
Parquet; the rest) and by thread (the event loop's, the capture writer's); ``--top N`` lists the
functions with the most instructions of their own, per request. CPython does not name the Python
function it is running to callgrind: ``--calls`` runs each path again without valgrind, with a
cProfile of the event loop's thread turned on around the same requests (bench/_toggle_profile.py),
and lists the Python calls per request by module: every interpreted function, and every built-in or
compiled one called from interpreted code (compiled code calling compiled code is not seen).

Prints Markdown tables for docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pstats
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import bench_hotpath  # noqa: E402
from _paths import VARIANTS, cpu_seconds, variant_command  # noqa: E402
from _util import machine_line  # noqa: E402

_SIZE = struct.Struct(">i")
# A consumer's steady fetch: an answer of one v2 batch for each of a few partitions (what consumer
# lag dates the partitions' offsets from, kproxy.metrics.consumer_lag).
SEQUENTIAL = ("ApiVersions v3", "Metadata v1", "Produce v7 1x100 B", "Fetch v11 4 partitions x 1 KB")
PIPELINED = ("ApiVersions v3", "Metadata v1")
WORKLOADS = [*(f"{w}" for w in SEQUENTIAL), *(f"pipelined {w}" for w in PIPELINED)]
READY_TIMEOUT = 900.0  # seconds for a process to listen: pyarrow's import alone is slow under valgrind


# -- the canned broker ------------------------------------------------------------------
def canned_broker(responses: dict[bytes, bytes]) -> int:
    """Listen on an ephemeral port; each request frame gets the response of its api key and version
    (``responses``: 4 bytes of key and version -> response frame) with the request's correlation id;
    all the answers to what one read brought go out in one write."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        with conn:
            while data := conn.recv(1 << 20):
                buf += data
                out = []
                while len(buf) >= 4 and len(buf) >= 4 + _SIZE.unpack_from(buf)[0]:
                    end = 4 + _SIZE.unpack_from(buf)[0]
                    response = responses.get(buf[4:8]) or _api_versions(buf[4:8])
                    out.append(response[:4] + buf[8:12] + response[8:])
                    buf = buf[end:]
                if out:
                    conn.sendall(b"".join(out))

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(listener.getsockname()[1])


def _api_versions(key_version: bytes) -> bytes:
    """An ApiVersions answer of the version asked (kproxy's broker discovery asks v0), naming the
    versions the workloads use; anything else is a bug of this benchmark."""
    from kproxy.protocol import default_body, frame
    from kproxy.protocol.message_schemas import MessageType
    from kproxy.protocol.payloads import encode_response

    key, version = struct.unpack(">hh", key_version)
    if key != 18:
        raise RuntimeError(f"the canned broker has no answer for api {key} v{version}")
    body = default_body(18, version, MessageType.RESPONSE)
    body.update(error_code=0, api_keys=[{"api_key": k, "min_version": 0, "max_version": v}
                                        for k, v in ((0, 9), (1, 12), (3, 12), (12, 4), (18, 3))])
    return frame(encode_response(1, 18, version, body))


def canned_responses(workloads: list[str]) -> dict[bytes, bytes]:
    """The canned broker's answers to ``workloads``, by api key and version (kproxy's own requests
    to the broker, its Metadata, included: every workload's answer is served whichever are measured).
    Two workloads of one api key and version with different answers cannot share the list, the broker
    telling them apart by nothing else."""
    frames = bench_hotpath._frames()
    out: dict[bytes, bytes] = {}
    named: dict[bytes, str] = {}
    for name in workloads:
        request, response = frames[name.removeprefix("pipelined ")]
        key = request[4:8]
        if key in out and out[key] != response:
            raise ValueError(f"workloads {named[key]!r} and {name!r} have the same api key and version "
                             "but different answers")
        out[key], named[key] = response, name
    return out


# -- the client -----------------------------------------------------------------------
def _recv_frames(sock: socket.socket, n: int, buf: bytearray) -> None:
    """Read ``n`` whole response frames (``buf``: bytes already read past earlier frames)."""
    while n:
        while len(buf) < 4 or len(buf) < 4 + _SIZE.unpack_from(buf)[0]:
            data = sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the proxy closed the connection")
            buf += data
        del buf[:4 + _SIZE.unpack_from(buf)[0]]
        n -= 1


@dataclass
class Client:
    """One connection through the path under test, sending one workload."""

    sock: socket.socket
    frames: list[bytes]  # a sequential workload: one frame; a pipelined one: its batch, one correlation id each
    buf: bytearray = field(default_factory=bytearray)

    def run(self, requests: int) -> None:
        batch = len(self.frames)
        payload = b"".join(self.frames)
        for _ in range(max(1, requests // batch)):
            self.sock.sendall(payload)
            _recv_frames(self.sock, batch, self.buf)


def _with_cid(frame: bytes, cid: int) -> bytes:
    return frame[:8] + struct.pack(">i", cid) + frame[12:]


def clients(port: int, workloads: list[str], batch: int) -> dict[str, Client]:
    frames = bench_hotpath._frames()
    out = {}
    for name in workloads:
        pipelined = name.startswith("pipelined ")
        request = frames[name.removeprefix("pipelined ")][0]
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        out[name] = Client(sock, [_with_cid(request, 1 + i) for i in range(batch)] if pipelined else [request])
    return out


def requests_of(name: str, requests: int, batch: int) -> int:
    """Requests actually sent for ``requests`` asked (a whole number of batches)."""
    return max(1, requests // batch) * batch if name.startswith("pipelined ") else requests


# -- the processes ----------------------------------------------------------------------
@dataclass(frozen=True)
class PathSpec:
    label: str
    command: list[str]
    env: dict[str, str]
    cwd: Path


def path_specs(keys: list[str], trees: list[tuple[str, Path]], upstream: str, workdir: Path, row_group: int
               ) -> list[PathSpec]:
    """The processes to measure. Another checkout runs under this tree's bench/run_kproxy.py (its
    ``KPROXY_BENCH_CAPTURE_ROW_GROUP``), its own kproxy imported (PYTHONPATH)."""
    py = sys.executable
    # The same dict and set orders every run; the capture's row groups as big as the real process's
    # (a row group every ``row_group`` records, not every second: see bench/run_kproxy.py).
    base_env = {"PYTHONHASHSEED": "0", "KPROXY_BENCH_CAPTURE_ROW_GROUP": str(row_group)}
    specs = []
    for key in keys:
        if key == "pipe":
            specs.append(PathSpec("pipe", [py, str(BENCH / "pipe.py"), "--upstream", upstream], base_env, BENCH.parent))
            continue
        variant = VARIANTS[key]
        cmd = variant_command(py, variant, upstream, workdir, key)
        specs.append(PathSpec(variant.path, cmd, {**base_env, **dict(variant.env)}, BENCH.parent))
        for label, tree in trees:
            specs.append(PathSpec(f"{variant.path} ({label})", cmd,
                                  {**base_env, **dict(variant.env), "PYTHONPATH": str(tree)}, tree))
    return specs


@contextlib.contextmanager
def running(spec: PathSpec, prefix: list[str], log: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``spec``'s process, its command run by ``prefix`` (valgrind's, or the profiler's: it takes the
    script without the interpreter), until the block ends; and the port it listens on."""
    command = [*prefix, *spec.command] if prefix[0] == "valgrind" else [*prefix, *spec.command[1:]]
    with log.open("wb") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, cwd=spec.cwd,
                                env={**os.environ, **spec.env})
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT
        line: list[str] = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline().decode().split()
            if len(line) == 2 and line[0] == "ready":
                break
            if proc.poll() is not None:
                break
        if len(line) != 2 or line[0] != "ready":
            raise RuntimeError(f"{spec.label} did not start (said {line!r}; see {log})")
        yield proc, int(line[1])
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def quiet(pid: int, since: float, settle: float = 1.5) -> None:
    """Wait until ``pid`` has used no CPU to speak of for a while, and ``settle`` seconds have passed
    since ``since`` (the capture writer writes its rows every flush_seconds, 1 s)."""
    last = cpu_seconds(pid)
    still = 0
    while True:
        time.sleep(0.25)
        now = cpu_seconds(pid)
        still = still + 1 if now - last < 0.02 else 0
        last = now
        if still >= 3 and time.monotonic() - since >= settle:
            return


# -- callgrind ------------------------------------------------------------------------
def callgrind_control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


_NAME = re.compile(r"\((\d+)\)(?: (.*))?")
_ANNOTATED = re.compile(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+\S*?:?(CPy\w+) \[(.*)\]")


def _name(table: dict[str, str], text: str) -> str:
    """callgrind's name compression: ``(id) name`` defines, ``(id)`` refers."""
    m = _NAME.match(text)
    if m is None:
        return text
    if m.group(2) is not None:
        table[m.group(1)] = m.group(2)
        return m.group(2)
    return table.get(m.group(1), text)


def self_costs(path: Path) -> dict[tuple[str, str], int]:
    """Instructions of each (object, function) itself (calls excluded) in one callgrind output file."""
    obs: dict[str, str] = {}
    fns: dict[str, str] = {}
    out: dict[tuple[str, str], int] = defaultdict(int)
    ob = fn = ""
    skip = False
    with path.open() as f:
        for line in f:
            c = line[:1]
            if c.isdigit() or c in "+-*":
                if skip:
                    skip = False
                    continue
                out[(ob, fn)] += int(line.split()[-1])
            elif line.startswith("ob="):
                ob = _name(obs, line[3:].rstrip("\n"))
            elif line.startswith("fn="):
                fn = _name(fns, line[3:].rstrip("\n"))
            elif line.startswith("cob="):
                _name(obs, line[4:].rstrip("\n"))
            elif line.startswith("cfn="):
                _name(fns, line[4:].rstrip("\n"))
            elif line.startswith("calls="):
                skip = True  # the next cost line is the call's inclusive cost, not this function's
    return out


def kind_of(obj: str) -> str:
    """Which part of the process an object file is."""
    name = os.path.basename(obj)
    if "mypyc" in name or "kproxy_native" in name:
        return "kproxy compiled"
    if name.startswith(("python3", "libpython")):
        return "interpreter"
    if name.startswith(("libc.", "libc-", "libm.", "libpthread", "ld-linux")):
        return "libc"
    if "arrow" in name or "parquet" in name or "pyarrow" in obj or "zstd" in name:
        return "pyarrow"
    if "lib-dynload" in obj or name.startswith("_"):
        return "CPython modules"
    return "other"


KINDS = ("interpreter", "kproxy compiled", "CPython modules", "libc", "pyarrow", "other")


@dataclass
class Dump:
    """One workload's counts on one path: per thread, per (object, function)."""

    requests: int
    threads: dict[str, dict[tuple[str, str], int]]
    files: dict[str, Path] = field(default_factory=dict)

    def inclusive(self, thread: str) -> list[tuple[str, int]]:
        """kproxy's compiled functions by instructions spent in them and what they call (callgrind_annotate
        --inclusive), on ``thread``: where the compiled code's share goes, and what it calls out to."""
        path = self.files.get(thread)
        if path is None:
            return []
        text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(path)],
                              capture_output=True, text=True, check=True).stdout
        out = []
        for line in text.splitlines():
            m = _ANNOTATED.match(line)
            if m is not None and "mypyc" in m.group(3) and m.group(2).startswith("CPyDef_"):
                out.append((m.group(2), int(m.group(1).replace(",", ""))))
        return out

    def total(self) -> int:
        return sum(sum(c.values()) for c in self.threads.values())

    def thread_total(self, thread: str) -> int:
        return sum(self.threads.get(thread, {}).values())

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for costs in self.threads.values():
            for (obj, _), n in costs.items():
                out[kind_of(obj)] += n
        return out

    def functions(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = defaultdict(int)
        for costs in self.threads.values():
            for (obj, fn), n in costs.items():
                out[(kind_of(obj), fn)] += n
        return out


def measure_callgrind(spec: PathSpec, port_upstream: int, workloads: list[str], args: argparse.Namespace,
                      work: Path) -> dict[str, Dump]:
    out_dir = work / re.sub(r"\W+", "_", spec.label)
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
              f"--callgrind-out-file={out_dir}/cg.%p"]
    results: dict[str, Dump] = {}
    print(f"# {spec.label}: starting under callgrind", file=sys.stderr, flush=True)
    with running(spec, prefix, out_dir / "stderr.log") as (proc, port):
        pid = proc.pid
        conns = clients(port, workloads, args.batch)
        for c in conns.values():
            c.run(args.warmup)
        callgrind_control(pid, "-i", "on")
        for c in conns.values():
            c.run(args.warmup)
        quiet(pid, time.monotonic())
        for name, c in conns.items():
            before = set(out_dir.glob("cg.*"))
            callgrind_control(pid, "-z")
            started_at = time.monotonic()
            c.run(args.requests)
            quiet(pid, started_at)
            callgrind_control(pid, "-d")
            deadline = time.monotonic() + 60
            files: list[Path] = []
            while time.monotonic() < deadline:  # the dump's files, one per thread
                files = sorted(set(out_dir.glob("cg.*")) - before)
                if files and all(f.stat().st_size for f in files):
                    break
                time.sleep(0.2)
            time.sleep(0.5)
            threads = {}
            paths = {}
            for f in files:
                tid = f.name.rsplit("-", 1)[-1] if "-" in f.name else "01"
                thread = "loop" if tid == "01" else f"thread {tid}"
                threads[thread] = self_costs(f)
                paths[thread] = f
            results[name] = Dump(requests_of(name, args.requests, args.batch), threads, paths)
            print(f"#   {name}: {results[name].total() / results[name].requests:,.0f} instructions per request",
                  file=sys.stderr, flush=True)
        for c in conns.values():
            c.sock.close()
    return results


# -- --calls: cProfile call counts ----------------------------------------------------------
def measure_calls(spec: PathSpec, workloads: list[str], args: argparse.Namespace, work: Path
                  ) -> dict[str, tuple[int, pstats.Stats]]:
    out_dir = work / ("calls-" + re.sub(r"\W+", "_", spec.label))
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix_path = out_dir / "prof"
    results = {}
    with running(spec, [sys.executable, str(BENCH / "_toggle_profile.py"), str(prefix_path)],
                 out_dir / "stderr.log") as (proc, port):
        conns = clients(port, workloads, args.batch)
        for c in conns.values():
            c.run(args.warmup)
        for i, (name, c) in enumerate(conns.items(), 1):
            proc.send_signal(signal.SIGUSR1)
            time.sleep(0.3)
            c.run(args.requests)
            time.sleep(0.3)
            proc.send_signal(signal.SIGUSR2)
            done = Path(f"{prefix_path}.{i}.done")
            deadline = time.monotonic() + 30
            while not done.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            results[name] = (requests_of(name, args.requests, args.batch), pstats.Stats(f"{prefix_path}.{i}"))
        for c in conns.values():
            c.sock.close()
    return results


def module_of(filename: str) -> str:
    """A short name for where a profiled function lives."""
    if filename == "~":
        return "built-in / compiled"
    parts = Path(filename).parts
    for anchor in ("kproxy", "trio", "outcome", "sniffio"):
        if anchor in parts:
            i = len(parts) - 1 - parts[::-1].index(anchor)
            return ".".join(parts[i:]).removesuffix(".py")
    return Path(filename).name


def print_calls(label: str, results: dict[str, tuple[int, pstats.Stats]], top: int) -> None:
    print(f"\n#### Python calls per request, event loop thread: {label}\n")
    print("| workload | calls / request | interpreted functions | built-in or compiled called from them | "
          "top modules (interpreted calls / request) |")
    print("| --- | --- | --- | --- | --- |")
    for name, (n, st) in results.items():
        per_mod: dict[str, float] = defaultdict(float)
        interpreted = builtin = 0.0
        for (filename, _, _), (_, ncalls, _, _, _) in st.stats.items():  # type: ignore[attr-defined]
            if filename == "~":
                builtin += ncalls / n
            else:
                interpreted += ncalls / n
                per_mod[module_of(filename)] += ncalls / n
        mods = ", ".join(f"{m} {c:.1f}" for m, c in sorted(per_mod.items(), key=lambda kv: -kv[1])[:6])
        print(f"| {name} | {interpreted + builtin:.1f} | {interpreted:.1f} | {builtin:.1f} | {mods} |")
    if top:
        for name, (n, st) in results.items():
            rows = sorted(st.stats.items(), key=lambda kv: -kv[1][1])[:top]  # type: ignore[attr-defined]
            print(f"\n{label}, {name}: the functions called most (cProfile; calls per request, share of "
                  "the profile's own time)\n")
            print("| function | where | calls / request | own share |")
            print("| --- | --- | --- | --- |")
            total = sum(v[2] for v in st.stats.values()) or 1.0  # type: ignore[attr-defined]
            for (filename, line, fn), (_, ncalls, tt, _, _) in rows:
                print(f"| `{fn}` | {module_of(filename)}:{line} | {ncalls / n:.2f} | {tt / total:.1%} |")


# -- the report ---------------------------------------------------------------------------
def print_inclusive(all_results: dict[str, dict[str, Dump]], top: int) -> None:
    for label, dumps in all_results.items():
        for name, d in dumps.items():
            for thread in d.files:
                rows = d.inclusive(thread)[:top]
                if not rows:
                    continue
                print(f"\n{label}, {name}, {thread}: kproxy's compiled functions, instructions per request "
                      f"with what they call\n")
                print("| function | instructions / request |")
                print("| --- | --- |")
                for fn, n in rows:
                    print(f"| `{fn.removeprefix('CPyDef_')}` | {n / d.requests:,.0f} |")


def print_report(all_results: dict[str, dict[str, Dump]], workloads: list[str], top: int) -> None:
    labels = list(all_results)
    base = "pipe" if "pipe" in all_results else None
    print("\n#### Instructions per request (callgrind; user space of the proxy process, all threads)\n")
    head = " | ".join(labels)
    print(f"| workload | {head} |")
    print("| --- |" + " --- |" * len(labels))
    for name in workloads:
        cells = []
        for label in labels:
            d = all_results[label].get(name)
            if d is None:
                cells.append("-")
                continue
            per = d.total() / d.requests
            ratio = ""
            if base is not None and label != base and name in all_results[base]:
                b = all_results[base][name]
                ratio = f" ({per / (b.total() / b.requests):.2f}x)"
            cells.append(f"{per:,.0f}{ratio}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\n#### Where they go: instructions per request by part of the process\n")
    print("| path | workload | event loop thread | other threads | " + " | ".join(KINDS) + " |")
    print("| --- | --- | --- | --- |" + " --- |" * len(KINDS))
    for label in labels:
        for name, d in all_results[label].items():
            kinds = d.by_kind()
            loop = d.thread_total("loop") / d.requests
            other = (d.total() - d.thread_total("loop")) / d.requests
            cells = " | ".join(f"{kinds.get(k, 0) / d.requests:,.0f}" for k in KINDS)
            print(f"| {label} | {name} | {loop:,.0f} | {other:,.0f} | {cells} |")
    if top:
        for label in labels:
            for name, d in all_results[label].items():
                print(f"\n{label}, {name}: the {top} functions with the most instructions of their own, per request\n")
                print("| function | part | instructions / request | share |")
                print("| --- | --- | --- | --- |")
                total = d.total()
                for (kind, fn), n in sorted(d.functions().items(), key=lambda kv: -kv[1])[:top]:
                    print(f"| `{fn[:80]}` | {kind} | {n / d.requests:,.0f} | {n / total:.1%} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", default="pipe,all,allpure",
                        help="pipe and variants of bench/_paths.py (metrics, all, allpure, pure, ...)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, of: " + ", ".join(WORKLOADS))
    parser.add_argument("--requests", type=int, default=2000, help="requests per workload counted")
    parser.add_argument("--row-group", type=int, default=0,
                        help="capture records per row group (default: --requests; the real process writes one "
                             "a second, or every 10,000 records)")
    parser.add_argument("--warmup", type=int, default=200, help="requests per workload before counting")
    parser.add_argument("--batch", type=int, default=16, help="requests per write of the pipelined workloads")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                        help="also run DIR's kproxy for every kproxy variant (PYTHONPATH=DIR)")
    parser.add_argument("--top", type=int, default=0, help="list the N functions with the most instructions")
    parser.add_argument("--inclusive", type=int, default=0,
                        help="list the N compiled kproxy functions with the most instructions, callees included")
    parser.add_argument("--calls", action="store_true", help="also count Python calls per request (cProfile)")
    parser.add_argument("--no-callgrind", action="store_true", help="only --calls")
    parser.add_argument("--keep", metavar="DIR", help="keep the callgrind files in DIR (callgrind_annotate reads them)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None and not args.no_callgrind:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}")
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree]
    port = canned_broker(canned_responses(WORKLOADS))
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kproxy-instructions-"))
    work.mkdir(parents=True, exist_ok=True)
    specs = path_specs([k.strip() for k in args.paths.split(",") if k.strip()], trees, f"127.0.0.1:{port}", work,
                       args.row_group or args.requests)
    results: dict[str, dict[str, Dump]] = {}
    calls: dict[str, dict[str, tuple[int, pstats.Stats]]] = {}
    try:
        for spec in specs:
            if not args.no_callgrind:
                results[spec.label] = measure_callgrind(spec, port, workloads, args, work)
            if args.calls:
                calls[spec.label] = measure_calls(spec, workloads, args, work)
        print(f"### Instructions per request ({machine_line()}; {args.requests} requests per workload, "
              f"pipelined in batches of {args.batch})")
        if results:
            print_report(results, workloads, args.top)
            if args.inclusive:
                print_inclusive(results, args.inclusive)
        for label, r in calls.items():
            print_calls(label, r, args.top)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
