"""Rule sources that would hang, exhaust or stall kproxy: each refused at once or loaded off the loop.

Real files, FIFOs, devices and directories on disk; the real reloader on a trio loop; kproxy run and
kproxy rules check as subprocesses (under an address-space limit, so that a regression reading
``/dev/zero`` ends in MemoryError instead of eating the machine); a kproxy in front of the real
broker with a well-behaved producer for the big reload. Every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from kproxy.config import ConfigError, build_config
from kproxy.logfmt import parse_logfmt
from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.live_rules import LiveRules
from kproxy.rules import load_text
from kproxy.rules.sources import load_path
from kproxy.testing import Broker, ProxyThread, free_port, running_proxy, wait_for_port
from tests.support.loopwatch import loop_held_max, reset_loop_lag
from tests.support.resilience import assert_unaffected, steady_producer, vm_rss_kb, wait_for
from tests.support.rules_reload import Harness, reload_lines, rules_text, watched_file

KPROXY = [sys.executable, "-m", "kproxy"]
ADDRESS_SPACE = 2 * 1024**3  # for kproxy subprocesses: a reader of /dev/zero dies of MemoryError within it


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def many_rules(n: int, prefix: str = "r") -> str:
    return "rules:\n" + "".join(f"  - id: {prefix}{i}\n    match: {{api: produce, client_id: 'c{i}'}}\n"
                                f"    actions:\n      - delay: {{ms: 5}}\n" for i in range(n))


@pytest.fixture(scope="module")
def big_rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file of 100,000 rules (9.8 MB): what took 84 s to reload and stalled every connection."""
    path = tmp_path_factory.mktemp("big") / "big.yaml"
    path.write_text(many_rules(100_000))
    return path


@contextlib.contextmanager
def fifo_at(path: Path, let_go_after: float = 8.0) -> Iterator[None]:
    """A FIFO in place of ``path``. A reader stuck opening or reading it (the defect) is let go after
    ``let_go_after`` seconds, and on the way out: a writer opens it and closes at once, so the reader
    sees the end of the file (and the test fails on what it read, instead of hanging)."""
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    done = threading.Event()

    def let_go() -> None:
        while not done.wait(let_go_after):
            with contextlib.suppress(OSError):  # ENXIO: nobody is reading it, nothing to let go
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    thread = threading.Thread(target=let_go, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
        path.unlink(missing_ok=True)


def replace_with(path: Path, text: str) -> None:
    """Put a regular file with ``text`` at ``path`` whatever is there now (a FIFO, a symlink, a directory)."""
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    else:
        path.unlink(missing_ok=True)
    path.write_text(text)


# -- the reloader ------------------------------------------------------------------------------------
async def refused_then_recovered(h: Harness, path: Path, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    """The reload of what is at ``path`` now fails at once, naming it, with the old rules kept; a
    regular file written afterwards is loaded (later edits are not ignored)."""
    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        await nursery.start(h.reloader.run)  # its first look at the file is a reload (quiet only if unchanged)
        await h.until(lambda: h.counts.reloads["failure"] >= 1, within=5.0)
        assert time.monotonic() - started < 5.0, "refused at once"
        assert h.ids() == ["a"] and h.live.generation == 1, "the rules in force are kept"
        failed = reload_lines(caplog)[-1]
        assert failed["event"] == "rules_reload_failed"
        assert failed["detail"].startswith(f"{path}:0: ") and reason in failed["detail"], failed["detail"]
        replace_with(path, rules_text("b"))
        await h.until(lambda: h.ids() == ["b"], within=5.0)
        nursery.cancel_scope.cancel()


async def test_a_fifo_in_place_of_the_rules_file_is_refused_at_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = watched_file(tmp_path, caplog)
    path = h.path
    with fifo_at(path):
        await refused_then_recovered(h, path, "not a regular file (a FIFO): only regular files are read", caplog)


async def test_dev_zero_through_a_symlink_is_refused_without_reading_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = watched_file(tmp_path, caplog)
    path = h.path
    rss = vm_rss_kb(os.getpid())
    path.unlink()
    path.symlink_to("/dev/zero")
    await refused_then_recovered(h, path, "not a regular file (a character device)", caplog)
    assert vm_rss_kb(os.getpid()) - rss < 50 * 1024, "nothing was read from /dev/zero"


async def test_a_file_over_the_size_limit_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = watched_file(tmp_path, caplog)
    path = h.path
    h.reloader.max_bytes = 10_000
    text = many_rules(200)
    assert len(text) > 10_000
    path.write_text(text)
    await refused_then_recovered(h, path, f"{len(text)} bytes, over the limit of 10000 bytes", caplog)


async def test_an_empty_directory_in_place_of_the_file_is_refused_not_taken_as_no_rules(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = watched_file(tmp_path, caplog)
    path = h.path
    path.unlink()
    path.mkdir()
    await refused_then_recovered(h, path, "a directory with no rule file", caplog)


async def test_an_emptied_directory_keeps_its_rules(tmp_path: Path) -> None:
    (tmp_path / "10.yaml").write_text(rules_text("a"))
    h = Harness(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.reloader.run)
        (tmp_path / "10.yaml").unlink()
        await h.until(lambda: h.counts.reloads["failure"] >= 1)
        assert h.ids() == ["a"]
        (tmp_path / "20.yaml").write_text(rules_text())  # 'rules: []' is how every rule is removed
        await h.until(lambda: h.ids() == [])
        nursery.cancel_scope.cancel()


def test_the_size_limit_is_an_option_applied_at_start(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(many_rules(50))
    config = build_config({"upstream": ("127.0.0.1:9092", "test"), "rules": (str(path), "test")})
    assert config.rules is not None and len(config.rules.rules) == 50
    assert config.rules_max_bytes == 16 * 1024 * 1024
    with pytest.raises(ConfigError) as raised:
        build_config({"upstream": ("127.0.0.1:9092", "test"), "rules": (str(path), "--rules"),
                      "rules_max_bytes": ("1000", "environment KPROXY_RULES_MAX_BYTES")})
    assert str(raised.value) == (f"--rules: {path}:0: (file): {path.stat().st_size} bytes, over the limit of 1000 "
                                 f"bytes (rules_max_bytes, --rules-max-bytes)")


# -- the command line: rules check, run --check -------------------------------------------------------
def cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KPROXY, *args], capture_output=True, text=True, timeout=timeout, preexec_fn=limited)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "too-big", "directory-of-nothing"])
def test_rules_check_and_run_check_refuse_what_cannot_be_read_at_once(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "rules.yaml"
    expected = {"fifo": "not a regular file (a FIFO)", "dev-zero": "not a regular file (a character device)",
                "too-big": "over the limit of 16777216 bytes", "directory-of-nothing": None}[kind]
    with contextlib.ExitStack() as stack:
        if kind == "fifo":
            stack.enter_context(fifo_at(path))
        elif kind == "dev-zero":
            path.symlink_to("/dev/zero")
        elif kind == "too-big":
            with path.open("w") as f:
                f.write("rules: []\n")
                f.truncate(16 * 1024 * 1024 + 1)
        else:
            path.mkdir()
        started = time.monotonic()
        check = cli("rules", "check", str(path), timeout=30)
        run = cli("run", "--check", "--upstream", "127.0.0.1:9092", "--rules", str(path), timeout=30)
        took = time.monotonic() - started
    if expected is None:  # at start, an empty directory is an empty rule set: rules may be mounted later
        assert check.returncode == 0 and run.returncode == 0, (check.stderr, run.stderr)
        return
    assert check.returncode == 2 and expected in check.stderr, check.stderr
    assert check.stderr.startswith(f"{path}:0: (file): ") and "Traceback" not in check.stderr
    assert run.returncode == 2 and expected in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert took < 30


def test_rules_apply_of_a_fifo_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    with fifo_at(path):
        done = cli("rules", "apply", str(path), "--admin", "http://127.0.0.1:9", timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"{path}:0: (file): not a regular file (a FIFO): only regular files are read\n"  # as check
                           f"kproxy rules apply: {path}: nothing sent to kproxy\n")


# -- shutdown during a long reload ----------------------------------------------------------------------
def test_sigterm_during_a_long_reload_exits_within_the_grace_and_installs_nothing(
        tansu: Broker, tmp_path: Path, big_rules: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_text("a"))
    log = tmp_path / "kproxy.log"
    port, grace = free_port(), 2.0
    with log.open("w") as out:
        proc = subprocess.Popen([*KPROXY, "run", "--upstream", tansu.bootstrap, "--listen", f"127.0.0.1:{port}",
                                 "--broker-port-base", "0", "--rules", str(rules), "--shutdown-grace", str(grace)],
                                stdout=out, stderr=subprocess.STDOUT, preexec_fn=limited)
    try:
        wait_for_port("127.0.0.1", port, timeout=30)
        staged = tmp_path / "staged.yaml"
        staged.write_bytes(big_rules.read_bytes())
        staged.rename(rules)  # the 100,000 rules: a reload of many seconds starts within a poll (0.5 s)
        time.sleep(1.5)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        try:
            proc.wait(timeout=120)
        finally:
            took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = [parse_logfmt(line).get("event") for line in log.read_text().splitlines()]
    assert "shutdown_started" in events, events
    after = events[events.index("shutdown_started"):]
    assert "rules_reloaded" not in after, "new rules were put in force after shutdown began"
    print(f"\nSIGTERM during a 100,000-rule reload: exited {took:.1f} s after (grace {grace} s)")
    assert proc.returncode == 0
    assert took < grace, f"exited {took:.1f} s after SIGTERM (grace {grace} s)"


# -- a big rule set, reloaded under traffic --------------------------------------------------------------
def test_reloading_100000_rules_keeps_a_client_answered_and_the_loop_free(
        tansu: Broker, tmp_path: Path, big_rules: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_text("a"))
    with running_proxy(tansu.bootstrap, rules=str(rules)) as proxy:
        server = proxy.server
        assert server is not None and server.reloader is not None
        with steady_producer(proxy.bootstrap, "reload-100k") as record:
            wait_for(lambda: record.delivered >= 5, 30, "the steady producer's first deliveries")
            reset_loop_lag(proxy)
            floor = loop_lag_with_python_busy_beside(proxy, seconds=8.0)
            reset_loop_lag(proxy)
            rss = vm_rss_kb(os.getpid())
            started = time.monotonic()
            staged = tmp_path / "staged.yaml"
            staged.write_bytes(big_rules.read_bytes())
            staged.rename(rules)
            wait_for(lambda: proxy.call(lambda: server.rules.generation) == 2, 300, "the 100,000 rules in force")
            took = time.monotonic() - started
            lag = loop_held_max(proxy)
            assert proxy.call(lambda: server.stats.faults.rules_loaded) == 100_000
            grown_mb = (vm_rss_kb(os.getpid()) - rss) / 1024
            delivered = record.delivered
            time.sleep(1.0)
            assert record.delivered > delivered, "the producer is still answered with the rules in force"
            # ... and replaced again: the 100,000 rules freed must not stall the loop either.
            reset_loop_lag(proxy)
            replace_with(rules, rules_text("c"))
            wait_for(lambda: proxy.call(lambda: server.rules.generation) == 3, 60, "the small rules in force again")
            time.sleep(3.0)  # the old set is freed meanwhile, a part at a time
            lag_back = loop_held_max(proxy)
            if max(lag, lag_back) >= floor_bound(floor):
                # The worst lag of a longer window is longer on a loaded machine (other processes take
                # the cores for longer at times): the floor again, over as long as the reload took.
                reset_loop_lag(proxy)
                floor = max(floor, loop_lag_with_python_busy_beside(proxy, seconds=min(took, 30.0)))
    print(f"\n100,000-rule reload: {took:.1f} s, loop held at most {lag * 1000:.0f} ms, RSS +{grown_mb:.0f} MB; "
          f"replaced again: held at most {lag_back * 1000:.0f} ms; floor (plain Python thread beside the "
          f"loop) {floor * 1000:.0f} ms")
    assert_unaffected(record, worst_latency=2.0)
    bound = floor_bound(floor)
    assert lag < bound, f"the event loop was blocked {lag * 1000:.0f} ms (bound {bound * 1000:.0f} ms)"
    assert lag_back < bound, f"the event loop was blocked {lag_back * 1000:.0f} ms freeing the old rules"
    assert grown_mb < 1500


# This scenario's bound, above BLOCKED: on a loaded machine the build holds the interpreter lock in
# one C call (the loop's sentinel cannot sample it) past BLOCKED at times; docs/RELIABILITY.md has
# the figures. What that call is, is not known yet.
RELOAD_BLOCKED = 0.15


def floor_bound(floor: float) -> float:
    """The bound on the loop's worst hold: RELOAD_BLOCKED, unless this machine cannot keep it even for
    a thread doing plain Python work beside the loop (the GIL handed over under CPU contention):
    then that ``floor``, with a margin."""
    return max(RELOAD_BLOCKED, 1.5 * floor + 0.05)


def loop_lag_with_python_busy_beside(proxy: ProxyThread, seconds: float) -> float:
    """The worst loop lag while a thread of this process does plain Python work (small allocations,
    no long call into C) for ``seconds``: what any work off the loop costs the loop on this machine."""
    def busy() -> None:
        end, junk = time.monotonic() + seconds, list[str]()
        while time.monotonic() < end:
            junk.append(str(len(junk)))
            if len(junk) > 10_000:
                junk = []

    thread = threading.Thread(target=busy, name="busy-control")
    thread.start()
    thread.join(seconds + 30)
    return loop_held_max(proxy)


def test_what_a_rule_set_build_makes_holds_no_reference_cycles() -> None:
    # kproxy/offloop.py freezes big builds: sound only if replaced rule sets are freed by
    # reference counting alone, which a cycle would prevent.
    examples = sorted(Path(__file__).parent.parent.joinpath("rules", "examples").glob("*.yaml"))
    assert examples
    gc.collect()
    gc.disable()
    try:
        live = LiveRules(None, counts=FaultStats(), mutable=True)
        for path in [*examples, None]:
            rules = load_path(str(path)) if path is not None else load_text(many_rules(300))
            live.install(live.prepare(rules), origin="test")
        live.install(None, origin="test")
        del rules
        assert gc.collect() == 0
    finally:
        gc.enable()


# -- rule-hit series ----------------------------------------------------------------------------------------
def test_series_of_rules_no_longer_loaded_are_removed_at_the_next_replacement() -> None:
    counts = FaultStats()
    live = LiveRules(None, counts=counts, mutable=True)
    kept = "  - id: kept\n    match: {api: produce}\n    actions:\n      - throttle: {bytes_per_second: 1000}\n"
    for n in range(30):
        text = many_rules(1000, prefix=f"gen{n}-") + kept + ("  - id: closer\n    match: {api: fetch}\n"
                                                             "    actions: [close_connection]\n" if n % 2 else "")
        live.install(live.prepare(load_text(text)), origin="test")
        counts.hits[("kept", "throttle", "false")] += 1
        counts.throttle_seconds["kept"] += 0.5
        if n % 2:
            counts.connection_faults[("closer", "close_connection")] += 1
        assert len(counts.hits) <= 1000 + 2 and len(counts.throttle_seconds) == 1
    assert {r for r, _, _ in counts.hits} == {f"gen29-{i}" for i in range(1000)} | {"kept", "closer"}
    assert counts.hits[("kept", "throttle", "false")] == 30, "a rule still loaded keeps counting"
    assert counts.throttle_seconds == {"kept": 15.0}
    live.install(live.prepare(load_text(many_rules(10) + kept)), origin="test")  # closer goes
    assert counts.connection_faults == {}
    live.install(live.prepare(load_text(many_rules(10) + kept + "  - id: closer\n    match: {api: fetch}\n"
                                        "    actions: [close_connection]\n")), origin="test")
    assert counts.connection_faults == {("closer", "close_connection"): 0}, "a rule back starts from 0"
    live.replace(None, origin="test")
    assert counts.hits == {} and counts.throttle_seconds == {} and counts.connection_faults == {}


def test_metrics_stay_bounded_however_often_rules_are_replaced_through_the_admin_api(tansu: Broker) -> None:
    from kproxy.admin.api_client import AdminClient

    metrics_port, admin_port = free_port(), free_port()
    with running_proxy(tansu.bootstrap, metrics_listen=f"127.0.0.1:{metrics_port}",
                       admin__listen=f"127.0.0.1:{admin_port}") as proxy:
        admin = AdminClient(f"http://127.0.0.1:{admin_port}", timeout=60)
        sizes = []
        for n in range(10):
            rules = [{"id": f"gen{n}-r{i}", "match": {"api": "produce", "client_id": f"c{i}"},
                      "actions": [{"delay": {"ms": 5}}]} for i in range(1000)]
            admin.apply({"rules": rules})
            page = scrape(metrics_port)
            series = [line for line in page.splitlines() if line.startswith("kproxy_rule_hits_total{")]
            sizes.append(len(page))
            assert len(series) == 1000, f"after {n + 1} replacements: {len(series)} rule-hit series"
        print(f"\n/metrics after 10 replacements of 1,000 new rule ids: {sizes[-1] / 1e6:.2f} MB")
        assert max(sizes) < 2 * min(sizes), sizes
        assert proxy.call(lambda: len(proxy.server.stats.faults.hits)) == 1000  # type: ignore[union-attr]


def scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        return str(answer.read().decode())


# -- a reader of kproxy's output that goes away -----------------------------------------------------------
def first_line_then_close(args: list[str]) -> tuple[int, str]:
    """Run ``kproxy ARGS`` into a real pipe, read one line, close the pipe (``| head -1``)."""
    proc = subprocess.Popen([*KPROXY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=limited)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()
    proc.stdout.close()
    try:
        err = proc.stderr.read().decode()
        return proc.wait(timeout=60), err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_rules_check_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(rules_text("a"))
    status, err = first_line_then_close(["rules", "check", *[str(path)] * 5000])  # ~100 KB: over a pipe's buffer
    assert (status, err) == (0, "")


def test_decode_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    from tests.support.resilience import api_versions_request

    frames = tmp_path / "frames.bin"
    frames.write_bytes(api_versions_request(7) * 5000)
    status, err = first_line_then_close(["decode", "--direction", "request", "--pretty", str(frames)])
    assert (status, err) == (0, "")


def test_rules_list_into_a_closed_pipe_ends_quietly(tansu: Broker) -> None:
    from kproxy.admin.api_client import AdminClient

    admin_port = free_port()
    with running_proxy(tansu.bootstrap, admin__listen=f"127.0.0.1:{admin_port}") as proxy:
        url = f"http://127.0.0.1:{admin_port}"
        AdminClient(url, timeout=60).apply({"rules": [
            {"id": f"a-rule-with-a-rather-long-identifier-{i:05}", "match": {"api": "produce"},
             "actions": [{"delay": {"ms": 1}}]} for i in range(1000)]})  # listed in ~100 KB: over a pipe's buffer
        status, err = first_line_then_close(["rules", "list", "--admin", url])
        assert (status, err) == (0, "")
        assert proxy.call(lambda: proxy.server.rules.generation) == 1  # type: ignore[union-attr]
