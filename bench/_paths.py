"""The paths bench_proxy.py measures: kproxy's variants, the processes under test, /proc readings.

Every path but ``direct`` is a process of its own that prints ``ready PORT`` once it listens
(bench/pipe.py, bench/run_kproxy.py, bench/fake_broker.py); ``tansu proxy`` is Tansu's own.
A :class:`Hop` is one path as the phases see it: its port, its process, and what the phases
noted of it (CPU seconds, bytes and requests per phase).
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import _rules
import _tansu

from kproxy.testing import stop_process

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
KPROXY = "kproxy"  # the path name of the default variant (metrics on), which the targets compare


@dataclass(frozen=True)
class Variant:
    """A kproxy preset: its path name, run_kproxy.py flags, a rule set of bench/_rules.py, capture or not,
    and environment variables of its process (``KPROXY_PURE=1``: the pure-Python build, kproxy/native.py)."""

    path: str
    flags: tuple[str, ...] = ()
    rules: str | None = None
    capture: bool = False
    env: tuple[tuple[str, str], ...] = ()


AA = "kproxy A/A copy"
EVERYTHING = "kproxy everything"
EVERYTHING_PURE = "kproxy everything, pure"
EVERYTHING_LABELS = "kproxy everything, labels"
_PURE = (("KPROXY_PURE", "1"),)
_LABELS = (("KPROXY_METRICS_TOPIC_LABEL", "true"), ("KPROXY_METRICS_CLIENT_ID_LABEL", "true"))
# The capture's thread, not its worker process (the default): the presets that compare instructions
# (callgrind follows one process) or trees from before the worker keep the capture's work in the
# proxy's process, where both see it.
_THREAD = (("KPROXY_CAPTURE_PROCESS", "false"),)
VARIANTS = {
    "bare": Variant("kproxy no observer", ("--no-metrics",)),
    "metrics": Variant(KPROXY),
    "rules100": Variant("kproxy +100 rules", rules="none-match"),
    "match1": Variant("kproxy +1 matching rule", rules="one-zero-delay"),
    "capture": Variant("kproxy +capture", capture=True, env=_THREAD),
    "all": Variant(EVERYTHING, rules="none-match", capture=True, env=_THREAD),
    # The noise floor: a second process identical to plain kproxy. What it comes out "over" kproxy
    # is what two identical processes differ by in this run; a feature's cost below it is not seen.
    "aa": Variant(AA),
    # Everything on as a user turns it on, the traffic labels too (topic and client id), the capture
    # in its worker process: bench_publish.py's candidate.
    "labels": Variant(EVERYTHING_LABELS, rules="none-match", capture=True, env=_LABELS),
    # The same with the capture's thread (capture.process: false).
    "labelsthread": Variant("kproxy everything, labels, capture thread", rules="none-match", capture=True,
                            env=(*_LABELS, *_THREAD)),
    # Everything on but the capture: what the capture adds to a path, beside `labels` (its worker's
    # CPU, the shipping thread) and `labelsthread` (the writer thread's CPU and turns with the GIL).
    "nocapture": Variant("kproxy labels and rules, no capture", rules="none-match", env=_LABELS),
    # The same code interpreted: the build kproxy runs without a C compiler (or with KPROXY_PURE=1), beside
    # the compiled one (the default wherever scripts/setup could build it: `kproxy --version` says which).
    "pure": Variant("kproxy pure", env=_PURE),
    "allpure": Variant(EVERYTHING_PURE, rules="none-match", capture=True, env=(*_PURE, *_THREAD)),
}
DEFAULT_VARIANTS = "bare,metrics,rules100,match1,capture,all,aa"
QUICK_VARIANTS = "bare,metrics,all"


def variant_command(py: str, variant: Variant, upstream: str, workdir: Path, key: str) -> list[str]:
    """The command line of bench/run_kproxy.py for ``variant`` in front of ``upstream``; its rule
    file and capture directory are made under ``workdir``."""
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


@dataclass
class Hop:
    """One path: its name in the tables, the port a client connects to, its process (None for
    direct), and per phase label the CPU seconds, bytes and requests the phases noted of it."""

    name: str
    port: int
    process: subprocess.Popen[bytes] | None = None  # None for direct
    tree: bool = False  # another checkout's kproxy (bench_proxy.py --kproxy-tree)
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
    """``cmd`` running (stderr to ``log``) until the block ends, and the port it said it is ready on."""
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


def children(pid: int) -> list[int]:
    """The processes ``pid`` started and that still run, and theirs (a capture worker: its CPU is the proxy's)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            out += [kid, *children(kid)]
    return out


def cpu_seconds(pid: int) -> float:
    """CPU seconds of process ``pid`` and the processes it started, so far, user plus system, all
    threads (/proc/PID/stat)."""
    total = 0
    for one in (pid, *children(pid)):
        try:
            with open(f"/proc/{one}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        total += int(fields[11]) + int(fields[12])  # utime + stime, all threads
    return total / CLK_TCK


def run_delay_seconds(pid: int) -> float:
    """Seconds the threads of process ``pid`` (and of the processes it started) have spent runnable
    but waiting for a core, so far (the run delay of /proc/PID/task/*/schedstat; threads that ended
    are not counted)."""
    total = 0
    for one in (pid, *children(pid)):
        try:
            tasks = os.listdir(f"/proc/{one}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{one}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                continue  # a thread ended meanwhile
    return total / 1e9


def rss_kb(pid: int, key: str = "VmRSS") -> int:
    """``key`` of /proc/PID/status in KB: VmRSS, or VmHWM for the peak."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} for pid {pid}")


def own_cpu_seconds() -> float:
    """CPU seconds of this process (the load generator), user plus system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pipe_hop(stack: contextlib.ExitStack, py: str, upstream: str, logs: Path, what: str = "",
             log_suffix: str = "") -> Hop:
    """The bare trio pipe (bench/pipe.py) in front of ``upstream``, until ``stack`` closes."""
    proc, port = stack.enter_context(started([py, str(BENCH / "pipe.py"), "--upstream", upstream], f"pipe{what}",
                                             logs / f"bench-pipe{log_suffix}.log"))
    return Hop("pipe", port, proc)


def variant_hops(stack: contextlib.ExitStack, py: str, upstream: str, keys: list[str], workdir: Path, logs: Path,
                 log_suffix: str = "") -> list[Hop]:
    """One kproxy process per variant of ``keys`` in front of ``upstream``, until ``stack`` closes."""
    hops = []
    for key in keys:
        variant = VARIANTS[key]
        proc, port = stack.enter_context(started(variant_command(py, variant, upstream, workdir, key), variant.path,
                                                 logs / f"bench-kproxy-{key}{log_suffix}.log", dict(variant.env)))
        hops.append(Hop(variant.path, port, proc))
    return hops
