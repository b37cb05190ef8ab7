"""``kproxy analyze --master spark://...`` on a real standalone Spark cluster: a master and two
workers, each its own JVM started from the pyspark wheel's ``spark-class``, on loopback. The
tables (what-if included: executors run kproxy's rule engine) are local mode's: the same job run by
this process's local-mode session (the ``spark`` fixture) while the cluster's JVMs start."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pq = pytest.importorskip("pyarrow.parquet")

from kproxy.capture.writer import CaptureWriter  # noqa: E402
from kproxy.testing import free_port  # noqa: E402
from tests.support.capture import record  # noqa: E402
from tests.support.spark import DRIVER_CONF, EXECUTOR_CONF, QUICK_JVM  # noqa: E402

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


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], stopping: threading.Event,
              timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while text not in (log.read_text(errors="replace") if log.exists() else ""):
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, f"no {text!r} in {log}"
        assert not stopping.is_set(), "the cluster was stopped while it started"
        time.sleep(0.5)


@contextlib.contextmanager
def standalone_cluster(tmp: Path, workers: int = 2) -> Iterator[Future[str]]:
    """A standalone master and ``workers`` workers (one core, 1 GiB each) on 127.0.0.1, started by a
    background thread (the caller works meanwhile); the future's result is the master's URL once
    every worker has registered. Every JVM is stopped on exit, a start-up still under way first."""
    port = free_port()
    env = dict(os.environ, SPARK_WORKER_DIR=str(tmp / "work"), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_NO_DAEMONIZE="1", PYSPARK_PYTHON=sys.executable, SPARK_DAEMON_JAVA_OPTS=QUICK_JVM)
    procs: list[subprocess.Popen[bytes]] = []
    stopping = threading.Event()

    def spawn(name: str, args: list[str]) -> tuple[Path, subprocess.Popen[bytes]]:
        assert not stopping.is_set(), "the cluster was stopped while it started"
        log = tmp / f"{name}.log"
        with open(log, "wb") as out:
            procs.append(subprocess.Popen([_spark_class(), *args], stdout=out, stderr=subprocess.STDOUT, env=env))
        return log, procs[-1]

    def start() -> str:
        log, master = spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                                       str(port), "--webui-port", str(free_port())])
        _wait_for(log, "I have been elected leader", master, stopping)
        url = f"spark://127.0.0.1:{port}"
        # The workers start side by side: each registers on its own.
        started = [spawn(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                                        "--cores", "1", "--memory", "1g", "--webui-port", str(free_port())])
                   for i in range(workers)]
        for log, worker in started:
            _wait_for(log, "Successfully registered with master", worker, stopping)
        return url

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="standalone-cluster") as pool:
        ready = pool.submit(start)
        try:
            yield ready
        finally:
            stopping.set()
            concurrent.futures.wait([ready])  # no JVM is spawned after this
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


def test_a_standalone_cluster_gives_local_modes_tables(spark: Any, tmp_path: Path) -> None:
    from kproxy.analysis.job import run_analysis
    from kproxy.analysis.whatif import WhatIfRules

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
    with standalone_cluster(tmp_path) as cluster:
        run_analysis([str(capture)], tmp_path / "local", spark, rules=WhatIfRules.from_file(str(rules)))
        done = subprocess.run([KPROXY, "analyze", str(capture), "--rules", str(rules), "--out",
                               str(tmp_path / "cluster"), "--master", cluster.result(timeout=900), "--conf",
                               "spark.executor.memory=512m", "--conf", "spark.driver.host=127.0.0.1",
                               "--conf", "=".join(DRIVER_CONF), "--conf", "=".join(EXECUTOR_CONF)],
                              capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    for table in TABLES:
        assert _rows(tmp_path / "cluster", table) == _rows(tmp_path / "local", table), table
    assert _rows(tmp_path / "cluster", "whatif_rules")  # the executors ran the rule engine
