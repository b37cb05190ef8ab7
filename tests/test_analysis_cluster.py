"""``kproxy analyze --master spark://...`` on a real standalone Spark cluster: a master and two
workers, each its own JVM started from the pyspark wheel's ``spark-class``, on loopback. The
tables (what-if included: executors run kproxy's rule engine) are local mode's."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pq = pytest.importorskip("pyarrow.parquet")

from kproxy.capture.writer import CaptureWriter  # noqa: E402
from kproxy.testing import free_port  # noqa: E402
from tests.support.capture import record  # noqa: E402

KPROXY = str(Path(sys.executable).with_name("kproxy"))
RULES = """\
seed: 3
rules:
  - id: some-produce
    match: {api: produce, probability: 0.4}
    actions:
      - inject_error: {error: NOT_LEADER_OR_FOLLOWER}
  - id: slow-fetch
    match: {api: fetch}
    actions:
      - delay: {ms: 5, jitter_ms: 5}
"""
TABLES = ("latency_by_api", "errors", "top_clients", "top_topics", "throughput", "hot_partitions", "faults",
          "whatif_rules", "whatif_by_api", "whatif_by_client", "whatif_errors")


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while text not in (log.read_text(errors="replace") if log.exists() else ""):
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, f"no {text!r} in {log}"
        time.sleep(0.5)


@contextlib.contextmanager
def standalone_cluster(tmp: Path, workers: int = 2) -> Iterator[str]:
    """A standalone master and ``workers`` workers (one core, 1 GiB each) on 127.0.0.1; its URL."""
    port = free_port()
    env = dict(os.environ, SPARK_WORKER_DIR=str(tmp / "work"), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_NO_DAEMONIZE="1", PYSPARK_PYTHON=sys.executable)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        log = tmp / "master.log"
        with open(log, "wb") as out:
            procs.append(subprocess.Popen([_spark_class(), "org.apache.spark.deploy.master.Master", "--host",
                                           "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())],
                                          stdout=out, stderr=subprocess.STDOUT, env=env))
        _wait_for(log, "I have been elected leader", procs[0])
        url = f"spark://127.0.0.1:{port}"
        for i in range(workers):
            log = tmp / f"worker{i}.log"
            with open(log, "wb") as out:
                procs.append(subprocess.Popen([_spark_class(), "org.apache.spark.deploy.worker.Worker", url,
                                               "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                                               "--webui-port", str(free_port())],
                                              stdout=out, stderr=subprocess.STDOUT, env=env))
            _wait_for(log, "Successfully registered with master", procs[-1])
        yield url
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _rows(out: Path, table: str) -> list[tuple[Any, ...]]:
    """A table's rows, order-free, floats rounded (sums of doubles may add up in another order)."""
    rows = pq.read_table(out / table).to_pylist()
    return sorted(tuple((k, round(v, 6) if isinstance(v, float) else v) for k, v in sorted(r.items()))
                  for r in rows)


def test_a_standalone_cluster_gives_local_modes_tables(tmp_path: Path) -> None:
    capture = tmp_path / "capture"
    writer = CaptureWriter(capture, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600).start()
    for i in range(120):  # three connections, Produce and Fetch
        fetch = i % 2 == 1
        writer.offer(record(i, api_key=1 if fetch else 0, api_name="Fetch" if fetch else "Produce",
                            client_id=f"client-{i % 4}",
                            partitions=[{"topic": f"t{i % 3}", "partition": i % 2, "error_code": 0,
                                         "record_count": 2, "record_bytes": 20}]))
    writer.close()
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    local = subprocess.run([KPROXY, "analyze", str(capture), "--rules", str(rules), "--out", str(tmp_path / "local"),
                            "--master", "local[1]"], capture_output=True, text=True, env=env, timeout=900,
                           check=False)
    assert local.returncode == 0, local.stderr[-3000:]
    with standalone_cluster(tmp_path) as url:
        done = subprocess.run([KPROXY, "analyze", str(capture), "--rules", str(rules), "--out",
                               str(tmp_path / "cluster"), "--master", url, "--conf", "spark.executor.memory=512m",
                               "--conf", "spark.driver.host=127.0.0.1"],
                              capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    for table in TABLES:
        assert _rows(tmp_path / "cluster", table) == _rows(tmp_path / "local", table), table
    assert _rows(tmp_path / "cluster", "whatif_rules")  # the executors ran the rule engine
