"""``capture.process``: the capture read and written by a worker process, from a real run
(librdkafka through kproxy to Tansu), its files read back with pyarrow; a worker killed and
replaced; the worker's own input and priority."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pq = pytest.importorskip("pyarrow.parquet")

from kproxy.capture.connection_info import ConnectionInfo  # noqa: E402
from kproxy.capture.handoff import connection_key  # noqa: E402
from kproxy.capture.record_schema import check_version  # noqa: E402
from kproxy.capture.shipper import WORKER_NICE, CaptureShipper  # noqa: E402
from kproxy.testing import running_proxy  # noqa: E402
from tests.support.e2e import consume_confluent, create_topic, produce_confluent, unique  # noqa: E402


def _rows(directory: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(directory.glob("hour=*/capture-*.parquet")):
        check_version(pq.read_metadata(path).metadata, str(path))
        rows.extend(pq.ParquetFile(path).read().to_pylist())
    return rows


def _produced(rows: list[dict[str, Any]], topic: str) -> int:
    return sum(p["record_count"] for r in rows if r["api_name"] == "Produce" for p in r["partitions"]
               if p["topic"] == topic)


def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])  # field 19: nice


def _worker_pid(server: Any) -> int:
    shipper = server.capture.writer
    assert isinstance(shipper, CaptureShipper), type(shipper)
    worker = shipper._state[1]
    assert worker is not None, "no worker running"
    return int(worker.process.pid)


def _wait(predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {seconds} s")
        time.sleep(0.05)


def test_a_real_run_is_captured_by_a_worker_at_a_lower_priority(tansu: Any, tmp_path: Path) -> None:
    topic = unique("process-capture")
    create_topic(tansu.bootstrap, topic, partitions=2)
    capture = tmp_path / "capture"
    messages = [(b"k%d" % i, b"v" * (10 + i % 30)) for i in range(300)]
    with running_proxy(tansu.bootstrap, capture__dir=str(capture), capture__process=True) as proxy:
        server: Any = proxy.server
        pid = _worker_pid(server)
        # The worker's priority is below the proxy's (the thread running the proxy is this process').
        assert _nice(pid) == os.nice(0) + WORKER_NICE
        producer = produce_confluent(proxy.bootstrap, topic, messages, **{"linger.ms": 5})
        del producer
        got = consume_confluent(proxy.bootstrap, topic, 2, len(messages))
        assert len(got) == len(messages)
    shipper = server.capture.writer
    rows = _rows(capture)
    assert not list(capture.rglob(".*")), "a temporary file was left behind"
    # Every exchange the proxy offered is in a file: the counters come from the worker's last report.
    assert shipper.written == len(rows) == shipper.offered, (shipper.written, len(rows), shipper.offered)
    assert shipper.dropped == 0 and shipper.abandoned == 0
    # Each connection's key went with its close: nothing is kept per connection once it is gone.
    assert shipper._connections == {}
    assert _produced(rows, topic) == len(messages)
    fetched = sum(p["record_count"] for r in rows if r["api_name"] == "Fetch" for p in r["partitions"]
                  if p["topic"] == topic)
    assert fetched >= len(messages)
    # The records carry the connection as the proxy saw it (the worker rebuilt it from its key).
    listeners = {r["listener"] for r in rows}
    assert "bootstrap" in listeners and any(name.startswith("broker-") for name in listeners), listeners
    assert all(r["connection_id"] and r["client_host"] == "127.0.0.1" for r in rows)


def test_a_killed_worker_is_replaced_and_its_losses_counted(tansu: Any, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    topic = unique("worker-killed")
    create_topic(tansu.bootstrap, topic, partitions=1)
    capture = tmp_path / "capture"
    caplog.set_level(logging.INFO, logger="kproxy.capture")
    with running_proxy(tansu.bootstrap, capture__dir=str(capture), capture__process=True) as proxy:
        server: Any = proxy.server
        shipper = server.capture.writer
        first = _worker_pid(server)
        produce_confluent(proxy.bootstrap, topic, [(b"a", b"before %d" % i) for i in range(50)])
        os.kill(first, signal.SIGKILL)
        # Traffic goes on while no worker runs: the proxy serves it, the capture drops it (counted).
        produce_confluent(proxy.bootstrap, topic, [(b"b", b"meanwhile %d" % i) for i in range(20)])
        _wait(lambda: shipper.restarts == 1, 15, "a new worker started")
        second = _worker_pid(server)
        assert second != first
        produce_confluent(proxy.bootstrap, topic, [(b"c", b"after %d" % i) for i in range(30)])
    assert any("event=capture_worker_exited" in r.getMessage() and "code=-9 signal=SIGKILL" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    rows = _rows(capture)
    assert not list(capture.rglob(".*")), "the killed worker's file was not cleared"
    produced = _produced(rows, topic)
    assert 30 <= produced <= 100, produced  # the last 30 for sure; what the first worker held is gone
    # Nothing disappears from the counts: each exchange offered was written to a file that is
    # there, or counted dropped or abandoned.
    assert shipper.written - shipper.abandoned == len(rows), (shipper.written, shipper.abandoned, len(rows))
    assert shipper.written + shipper.dropped == shipper.offered, (shipper.written, shipper.dropped, shipper.offered)
    assert shipper.dropped + shipper.abandoned > 0


def test_the_worker_reads_its_input_to_the_end_and_completes_its_file(tmp_path: Path) -> None:
    """The worker alone, fed a pickled batch by hand: a connection close (the smallest item) is
    written; SIGTERM does not stop it, the end of its input does, with a last report."""
    conn = ConnectionInfo(connection_id="c-1", client_host="127.0.0.1", client_port=5000, listener="broker-7",
                          upstream="127.0.0.1:9092")
    closes = [(connection_key(conn), 1_790_000_000.0, None, 10.0 + i, "client closed") for i in range(5)]
    settings = {"dir": str(tmp_path / "capture"), "max_bytes_total": 10**9, "rotate_bytes": 10**8,
                "rotate_seconds": 300, "queue_size": 100, "include_payloads": False, "payload_max_bytes": 0,
                "metadata": None, "log_level": "info", "log_format": "json"}
    proc = subprocess.Popen([sys.executable, "-m", "kproxy.capture.worker", json.dumps(settings)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()  # its first report: started, the signals ignored
    assert proc.stdin is not None and proc.stdout is not None
    data = pickle.dumps(closes)
    proc.stdin.write(len(data).to_bytes(4, "big") + data)
    proc.stdin.flush()
    proc.send_signal(signal.SIGTERM)  # ignored: the input decides
    time.sleep(0.3)
    assert proc.poll() is None
    proc.stdin.close()
    assert proc.wait(30) == 0
    assert proc.stderr is not None
    # Its lines as the proxy writes its own (the run's format and level, given in SETTINGS).
    lines = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith(b"{")]
    assert any(doc.get("event") == "capture_worker_serving" for doc in lines), lines
    last = json.loads(proc.stdout.read().splitlines()[-1])
    assert last["written"] == 5 and last["dropped"] == 0 and last["open_records"] == 0, last
    rows = _rows(tmp_path / "capture")
    assert [r["listener"] for r in rows] == ["broker-7"] * 5
    assert {r["node_id"] for r in rows} == {7}


def test_the_worker_tunes_its_collector_as_the_proxy_does(tmp_path: Path) -> None:
    """Its entry point, before it serves: generation 0 collected as rarely as in the proxy
    (kproxy.memory), and what its imports loaded (pyarrow) frozen out of every collection."""
    from kproxy.memory import GEN0_THRESHOLD

    probe = ("import gc, json, sys\n"
             "import kproxy.capture.worker as worker\n"
             "worker.serve = lambda *a: print(json.dumps([gc.get_threshold()[0], gc.get_freeze_count(),\n"
             "                                            'pyarrow' in sys.modules]))\n"
             "worker.main([sys.argv[1]])\n")
    settings = {"dir": str(tmp_path), "log_level": "info", "log_format": "json"}
    out = subprocess.run([sys.executable, "-c", probe, json.dumps(settings)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    threshold, frozen, pyarrow_loaded = json.loads(out)
    assert threshold == GEN0_THRESHOLD and pyarrow_loaded
    assert frozen > 10_000, frozen  # the interpreter's and pyarrow's modules, not a handful


def test_ctrl_c_to_the_process_group_still_completes_the_file(tansu: Any, tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches ``kproxy run`` and its worker alike: the proxy shuts down and ends
    the worker's input; the worker, ignoring the signal, writes what it has and completes its file."""
    from kproxy.testing import free_port, wait_for_port

    port = free_port()
    capture = tmp_path / "capture"
    topic = unique("ctrl-c")
    create_topic(tansu.bootstrap, topic, partitions=1)
    argv = [sys.executable, "-m", "kproxy", "run", "--upstream", tansu.bootstrap, "--listen", f"127.0.0.1:{port}",
            "--broker-port-base", "0", "--limits-shutdown-grace", "5", "--capture-dir", str(capture),
            "--capture-process"]
    log = tmp_path / "kproxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    producer = None
    try:
        wait_for_port("127.0.0.1", port)
        producer = produce_confluent(f"127.0.0.1:{port}", topic, [(b"k", b"v%d" % i) for i in range(50)])
        _wait(lambda: list(capture.rglob(".capture-*.tmp")), 10, "the worker opened a file")
        # The proxy itself never loads pyarrow: the worker reads and writes.
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "libarrow" not in maps and "pyarrow" not in maps
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        del producer  # (a client left retrying a stopped proxy would keep the test process alive)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert list(capture.rglob(".*")) == [], log.read_text()
    assert _produced(_rows(capture), topic) == 50
    text = log.read_text()
    assert "Traceback" not in text and "capture_worker_exited" not in text, text


def test_big_frames_reach_the_worker_whole(tansu: Any, tmp_path: Path) -> None:
    """Frames of INLINE_BYTES and more go to the worker after the batch's pickle, not in it: a big
    Produce request and the Fetch answer carrying it back are read as the thread would read them."""
    from kproxy.capture.shipper import INLINE_BYTES

    topic = unique("process-big")
    create_topic(tansu.bootstrap, topic, partitions=1)
    capture = tmp_path / "capture"
    big = b"b" * (40 * INLINE_BYTES)
    messages = [(b"small", b"s"), (b"big", big), (b"small", b"t")]
    with running_proxy(tansu.bootstrap, capture__dir=str(capture), capture__process=True) as proxy:
        produce_confluent(proxy.bootstrap, topic, messages, **{"linger.ms": 0, "batch.size": 1})
        got = consume_confluent(proxy.bootstrap, topic, 1, len(messages))
        assert sorted(len(v) for _k, v in got) == [1, 1, len(big)]
    rows = _rows(capture)
    produces = [r for r in rows if r["api_name"] == "Produce" and any(p["topic"] == topic for p in r["partitions"])]
    assert sum(p["record_count"] for r in produces for p in r["partitions"]) == 3
    assert max(r["request_bytes"] for r in produces) > len(big)
    fetched = [p for r in rows if r["api_name"] == "Fetch" for p in r["partitions"] if p["topic"] == topic]
    assert sum(p["record_count"] for p in fetched) >= 3
    assert max(r["response_bytes"] or 0 for r in rows if r["api_name"] == "Fetch") > len(big)


def test_process_capture_without_pyarrow_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # The proxy does not import pyarrow with capture.process (its worker does): the check at start
    # looks for it all the same, so that a missing extra is said at once, not by a dying worker.
    from kproxy.cli import main

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    assert main(["run", "--upstream", "127.0.0.1:1", "--capture-dir", str(tmp_path), "--capture-process"]) == 2
    err = capsys.readouterr().err
    assert "capture.dir: traffic capture needs pyarrow" in err and "pip install 'kproxy-kafka[capture]'" in err
