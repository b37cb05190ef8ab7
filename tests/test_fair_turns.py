"""One client's rule does not cost other connections time (issue 35, defect 5).

A client pipelines megabytes of tiny Produce requests that a rule matches; another client makes
ApiVersions round trips on a connection of its own meanwhile. Each read of the first client's
holds thousands of requests, and every one of them goes through the rule engine: taken in one
turn of the loop, a read held every other connection for as long (kproxy/server/connection.py
now takes TURN_FRAMES of them per turn). What is checked, which a loaded machine's timings cannot
blur, is the longest step of a connection's pump in CPU time of the loop's thread: the work one turn
of the loop did for one connection. The other client's worst round trip is printed beside its worst
under the same load when the rule matches nobody. Last, 1-byte slicers on 20 connections and a
probe's median round trip beside them (the toxic writers' write budget, kproxy/server/toxic_writer.py).
"""

from __future__ import annotations

import gc
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio

from kproxy.protocol.codes import ApiKey
from kproxy.protocol.frame_builder import request_frame
from kproxy.protocol.records import Record, encode_batch_v2
from kproxy.server.loopwatch import RunQueueWait
from kproxy.server.toxic_writer import BUDGET_WINDOW
from kproxy.testing import Broker, running_proxy
from tests.support.e2e import create_topic, unique
from tests.test_rules_toxics import api_versions

PRODUCE = int(ApiKey.PRODUCE)
GREEDY_BYTES = 4 * 1024 * 1024
PROBE_SECONDS = 2.0
RULES = {
    "1 ms request delay": "- delay: {ms: 1}",
    "60 s wire delay upstream": "- delay: {ms: 60000, at: wire, direction: upstream}",
    "1 B/s bandwidth upstream": "- bandwidth: {bytes_per_second: 1, direction: upstream}",
}


class PumpSteps(trio.abc.Instrument):
    """The longest step of a connection pump task, in CPU seconds of the loop's thread, less the
    garbage collections run in it (this test process's heap is pytest's, unfrozen: a full
    collection of it says nothing of kproxy's turns)."""

    def __init__(self) -> None:
        self.began: dict[int, float] = {}
        self.longest = 0.0
        self.where = ""
        self.steps = 0
        self.collecting = 0.0  # CPU seconds of collections on the loop's thread so far
        self._gc_began = 0.0
        self._thread = threading.get_ident()

    def collection(self, phase: str, _info: dict[str, int]) -> None:
        if threading.get_ident() != self._thread:
            return
        if phase == "start":
            self._gc_began = time.thread_time()
        else:
            self.collecting += time.thread_time() - self._gc_began

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith(("_client_to_upstream", "_upstream_to_client")):
            self._thread = threading.get_ident()
            self.began[id(task)] = time.thread_time() - self.collecting

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        began = self.began.pop(id(task), None)
        if began is not None:
            self.steps += 1
            took = time.thread_time() - self.collecting - began
            if took > self.longest:
                self.longest, self.where = took, task.name.rsplit(".", 1)[-1]


def tiny_produces(topic: str) -> bytes:
    """About GREEDY_BYTES of one-record Produce v7 requests (acks=1), back to back."""
    records = encode_batch_v2([Record(offset=0, timestamp=0, key=None, value=b"v" * 10, headers=[])])
    frames = []
    size = cid = 0
    while size < GREEDY_BYTES:
        cid += 1
        frame = request_frame(PRODUCE, 7, cid, client_id="greedy", acks=1, timeout_ms=30_000, topic_data=[
            {"name": topic, "partition_data": [{"index": 0, "records": records}]}])
        frames.append(frame)
        size += len(frame)
    return b"".join(frames)


def greedy(port: int, payload: bytes, stop: threading.Event) -> None:
    """Send ``payload`` as fast as kproxy takes it, reading (and dropping) what comes back."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        def drain() -> None:
            sock.settimeout(0.2)
            while not stop.is_set():
                try:
                    if not sock.recv(1 << 20):
                        return
                except TimeoutError:
                    continue
                except OSError:
                    return

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        view = memoryview(payload)
        sock.settimeout(0.2)
        while view and not stop.is_set():
            try:
                sent = sock.send(view[:65536])
            except TimeoutError:
                continue
            view = view[sent:]
        stop.wait(PROBE_SECONDS + 5)
        reader.join(5)


def worst_round_trip(tansu: Broker, tmp_path: Path, rule_client: str, action: str) -> tuple[float, PumpSteps]:
    """The other client's worst ApiVersions round trip while the greedy client sends, with the rule
    matching the client id ``rule_client``, and the pumps' steps meanwhile."""
    topic = unique("fair")
    create_topic(tansu.bootstrap, topic)
    path = tmp_path / f"rules-{rule_client}.yaml"
    path.write_text(f"rules:\n  - id: greedy\n    match: {{client_id: {rule_client}}}\n    actions:\n      {action}\n")
    payload = tiny_produces(topic)
    with running_proxy(tansu.bootstrap, rules=str(path)) as proxy, \
            socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as probe:
        api_versions(probe, 1)
        steps = PumpSteps()
        proxy.call(trio.lowlevel.add_instrument, steps)
        gc.callbacks.append(steps.collection)
        stop = threading.Event()
        sender = threading.Thread(target=greedy, args=(proxy.port, payload, stop), daemon=True)
        sender.start()
        time.sleep(0.1)
        trips = []
        end = time.monotonic() + PROBE_SECONDS
        cid = 2
        while time.monotonic() < end:
            started = time.monotonic()
            api_versions(probe, cid)
            trips.append(time.monotonic() - started)
            cid += 1
        stop.set()
        sender.join(15)
        proxy.call(trio.lowlevel.remove_instrument, steps)
        gc.callbacks.remove(steps.collection)
    return max(trips), steps


@pytest.mark.parametrize("what", list(RULES))
def test_another_client_keeps_its_round_trip_under_a_greedy_client_s_rule(tansu: Broker, tmp_path: Path,
                                                                          what: str) -> None:
    baseline, _ = worst_round_trip(tansu, tmp_path, "nobody", RULES[what])
    worst, steps = worst_round_trip(tansu, tmp_path, "greedy", RULES[what])
    print(f"{what}: the other client's worst round trip {1e3 * worst:.1f} ms, {1e3 * baseline:.1f} ms with the "
          f"rule matching nobody; longest pump step {1e3 * steps.longest:.1f} ms CPU ({steps.where}) of {steps.steps}")
    assert steps.steps > 100, "the greedy client's requests went through the pumps"
    if steps.longest >= 0.006:
        # Once more, keeping the shorter: a single step can be inflated once on a loaded machine (CI
        # failed on one), while a whole read of tiny requests per step is long in every run.
        _, again = worst_round_trip(tansu, tmp_path, "greedy", RULES[what])
        steps = min(steps, again, key=lambda s: s.longest)
    # A turn of TURN_FRAMES requests takes about a millisecond of CPU interpreted; a whole read of
    # tiny requests took ten to twenty. The round trips are printed, not asserted: on a machine
    # shared with other work the no-rule figure alone moves by hundreds of ms from run to run.
    assert steps.longest < 0.006, (what, steps.longest)



class WriterShare(trio.abc.Instrument):
    """The loop's task steps while installed: CPU seconds of its thread in all of them and in the toxic
    writers' (kproxy/server/toxic_writer.py), and the writers' steps in seconds of the loop's clock,
    the time their budget is kept in."""

    def __init__(self) -> None:
        self.began: dict[int, tuple[float, float]] = {}
        self.all = 0.0
        self.writers = 0.0
        self.writers_wall = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.began[id(task)] = (time.thread_time(), trio.current_time())

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        began = self.began.pop(id(task), None)
        if began is not None:
            took = time.thread_time() - began[0]
            self.all += took
            if "ToxicWriter" in task.name:
                self.writers += took
                self.writers_wall += trio.current_time() - began[1]


# The 20 sliced clients, in a process of their own: as threads of this one they would take the
# interpreter's lock from kproxy's loop thread, and the probe would measure that.
SLICED_CLIENTS = """
import socket, struct, sys, threading
from kproxy.protocol.codes import ApiKey
from kproxy.protocol.frame_builder import request_frame
from tests.support.e2e import _recv_exactly as exactly

port, stop, trips = int(sys.argv[1]), threading.Event(), [0]

def client():
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        cid = 0
        while not stop.is_set():
            cid += 1
            sock.sendall(request_frame(int(ApiKey.API_VERSIONS), 3, cid, client_id="sliced",
                                       client_software_name="raw", client_software_version="1"))
            (size,) = struct.unpack(">i", exactly(sock, 4))
            exactly(sock, size)
            trips[0] += 1

threads = [threading.Thread(target=client, daemon=True) for _ in range(20)]
for t in threads:
    t.start()
print("started", flush=True)
sys.stdin.read()  # until the test closes it
stop.set()
for t in threads:
    t.join(30)
print(trips[0], flush=True)
"""


def test_one_byte_slicers_on_20_connections_leave_the_loop_s_turns_short(tansu: Broker, tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  - id: crumbs\n    match: {client_id: sliced}\n    actions:\n"
                    "      - slicer: {average_bytes: 1, direction: both}\n")
    with running_proxy(tansu.bootstrap, rules=str(path)) as proxy, \
            socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as probe:
        api_versions(probe, 1)
        sliced = subprocess.Popen([sys.executable, "-c", SLICED_CLIENTS, str(proxy.port)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
        assert sliced.stdin is not None and sliced.stdout is not None
        loop_waits = proxy.call(lambda: RunQueueWait(threading.get_native_id()))
        probe_waits = RunQueueWait(threading.get_native_id())
        try:
            assert sliced.stdout.readline().strip() == "started"
            time.sleep(0.3)
            share = WriterShare()
            proxy.call(trio.lowlevel.add_instrument, share)
            watch_began = time.monotonic()
            probe_trips = []
            end = time.monotonic() + PROBE_SECONDS
            cid = 2
            while time.monotonic() < end:
                waited = loop_waits() + probe_waits()
                started = time.monotonic()
                api_versions(probe, cid)
                took = time.monotonic() - started
                # Less the time the trip's two threads waited for a CPU: the machine's other work,
                # not the loop's turns (over-subtracted when both waited at once: lenient, but the
                # loop's own work for the writers is no wait, and stays counted).
                probe_trips.append(max(0.0, took - (loop_waits() + probe_waits() - waited)))
                cid += 1
            proxy.call(trio.lowlevel.remove_instrument, share)
            watched = time.monotonic() - watch_began
            out, _ = sliced.communicate("", timeout=60)
        finally:
            sliced.kill()
            sliced.wait()
            loop_waits.close()
            probe_waits.close()
        trips = int(out.strip() or 0)
    probe_trips.sort()
    print(f"20 connections through a 1-byte slicer: {trips} of their round trips, the probe's median "
          f"{1e3 * probe_trips[len(probe_trips) // 2]:.1f} ms, worst {1e3 * probe_trips[-1]:.1f} ms (less the waits "
          f"for a CPU); the slicers' writers stepped {share.writers_wall:.2f} s of {watched:.2f} s and took "
          f"{100 * share.writers / share.all:.0f} % of the loop's {share.all:.2f} s of CPU in task steps")
    assert trips, "the sliced clients got answers"
    # The toxic writers together write for at most WRITE_BUDGET of every BUDGET_WINDOW of the loop
    # (kproxy/server/toxic_writer.py), so the probe's round trip waits for a window at most: with no
    # bound it waited behind 40 writers' 64 writes each, turn after turn.
    assert probe_trips[len(probe_trips) // 2] < 2 * BUDGET_WINDOW, probe_trips[len(probe_trips) // 2]
