"""``kproxy analyze`` as cron, systemd or a terminal runs it: the venv's command by its full path,
in a fresh process, with the environment it happens to have (no venv on PATH, no Java, Ctrl-C)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from kproxy.capture.writer import CaptureWriter
from tests.support.capture import record
from tests.support.spark import DRIVER_CONF

KPROXY = str(Path(sys.executable).with_name("kproxy"))  # the venv's command, by its full path
RULES = """\
rules:
  - id: every-produce
    match: {api: produce}
    actions:
      - inject_error: {error: NOT_LEADER_OR_FOLLOWER}
"""
# A Python for Spark's workers that has every dependency but kproxy itself (as an executor of a
# cluster where kproxy is not installed): its editable install's finder is taken out at start-up.
HIDE_KPROXY = """\
import sys
sys.meta_path[:] = [f for f in sys.meta_path if not str(getattr(f, "__module__", "")).startswith("__editable__")]
"""


def _capture(directory: Path, n: int = 30) -> Path:
    writer = CaptureWriter(directory, max_bytes_total=10**9, rotate_bytes=10**8, rotate_seconds=3600).start()
    for i in range(n):
        writer.offer(record(i))
    writer.close()
    return directory


def _env(**extra: str) -> dict[str, str]:
    """A bare environment: no venv on PATH, nothing of the test run's own Python settings."""
    env = {"HOME": os.environ.get("HOME", "/tmp"), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if "JAVA_HOME" in os.environ:
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    env.update(extra)
    return env


def _analyze(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``kproxy analyze ARGS`` on one core, its driver JVM a cheap one (tests.support.spark)."""
    return subprocess.run([KPROXY, "analyze", *args, "--master", "local[1]", "--conf", "=".join(DRIVER_CONF)],
                          capture_output=True, text=True, env=env, timeout=timeout, check=False)


def test_without_java_one_line_and_exit_2(tmp_path: Path) -> None:
    capture = _capture(tmp_path / "capture")
    empty = tmp_path / "bin"
    empty.mkdir()
    env = _env(PATH=str(empty))
    env.pop("JAVA_HOME", None)
    started = time.monotonic()
    done = _analyze(str(capture), "--out", str(tmp_path / "out"), env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["kproxy analyze: checking inputs",
                                        "kproxy analyze: Java 17+ not found (JAVA_HOME, PATH)"]
    assert time.monotonic() - started < 60  # no Spark was started


def test_inputs_are_checked_before_spark_starts(tmp_path: Path) -> None:
    """Nothing readable: the inputs' lines and exit 2, with no Java needed to say so."""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = _env(PATH=str(empty))
    env.pop("JAVA_HOME", None)
    junk = tmp_path / "capture-junk.parquet"
    junk.write_bytes(b"not parquet at all")
    done = _analyze(str(junk), str(tmp_path / "missing"), env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"kproxy analyze: {junk}: not a complete Parquet file" in done.stderr
    assert f"kproxy analyze: {tmp_path / 'missing'}: no such file or directory" in done.stderr
    assert "Java" not in done.stderr and "Traceback" not in done.stderr


def test_rules_run_by_full_path_without_the_venv_on_path_and_stderr_stays_quiet(tmp_path: Path) -> None:
    """Spark's Python workers are the command's own interpreter, not the ``python3`` on PATH
    (/usr/bin's, without kproxy). And, the run being a default one (no --verbose), its stderr holds
    only the command's own lines, its progress among them: none of the driver JVM's start-up notices
    (the incubator module's warning, Spark's "Setting default log level"), Spark's WARN and INFO log
    lines, its progress bars or the Python workers' lines reach it."""
    capture = _capture(tmp_path / "capture")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    done = _analyze(str(capture), "--rules", str(rules), "--out", str(tmp_path / "out"), env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "every-produce" in done.stdout and (tmp_path / "out" / "report.html").exists()
    assert done.stderr.splitlines()[0] == "kproxy analyze: checking inputs"
    assert [line for line in done.stderr.splitlines() if not line.startswith("kproxy analyze: ")] == []
    assert "kproxy analyze: aggregating latency_by_api" in done.stderr


def test_rules_run_on_workers_without_kproxy_installed_and_verbose_is_loud(tmp_path: Path) -> None:
    """The what-if's executors import kproxy from the zip the job ships them. The run is a --verbose
    one (this check needs no particular stderr): the driver JVM's start-up notice, which a default
    run leaves out, reaches stderr."""
    capture = _capture(tmp_path / "capture")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_KPROXY)
    worker = tmp_path / "python-without-kproxy"
    worker.write_text(f'#!/bin/sh\nPYTHONPATH="{hide}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    worker.chmod(0o755)
    check = subprocess.run([str(worker), "-c", "import kproxy"], capture_output=True, text=True, check=False,
                           cwd=tmp_path)
    assert "No module named 'kproxy'" in check.stderr  # the workers' Python has no kproxy of its own
    done = _analyze(str(capture), "--rules", str(rules), "--out", str(tmp_path / "out"), "--verbose",
                    env=_env(PYSPARK_PYTHON=str(worker)))
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("every-produce"))
    assert line.split()[1] == "30"  # every record is a Produce (tests.support.capture.record's default)
    assert "WARNING: Using incubator modules" in done.stderr


def test_ctrl_c_on_follow_stops_the_query_prints_the_last_summary_and_exits_0(tmp_path: Path) -> None:
    capture = _capture(tmp_path / "capture")
    out = tmp_path / "out"
    proc = subprocess.Popen([KPROXY, "analyze", str(capture), "--follow", "--out", str(out), "--master", "local[1]",
                             "--conf", "=".join(DRIVER_CONF)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not (out / "live_by_minute" / "_SUCCESS").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no batch written"
            time.sleep(0.5)
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "py4j" not in stderr, stderr[-3000:]
    assert "batch 0: 1 minute/api rows" in stdout
    tail = stdout[stdout.index("last update"):]
    assert tail.splitlines()[2].split()[:3] == ["produce", "30", "0"], stdout


def test_a_driver_jvm_that_does_not_start_says_why_and_exits_2(tmp_path: Path) -> None:
    capture = _capture(tmp_path / "capture")
    done = _analyze(str(capture), "--out", str(tmp_path / "out"), "--conf", "spark.driver.memory=lots", env=_env(),
                    timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert "Invalid maximum heap size: -Xmxlots" in lines  # the JVM's own line, through the filter
    assert lines[-1].startswith("kproxy analyze: Spark did not start (")
    assert "Traceback" not in done.stderr and "WARNING: Using incubator modules" not in done.stderr


def test_quiet_stderr_still_carries_spark_errors_when_a_job_fails(tmp_path: Path) -> None:
    """A what-if whose Python workers cannot start: Spark's ERROR lines and the failure reach stderr."""
    capture = _capture(tmp_path / "capture")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    done = _analyze(str(capture), "--rules", str(rules), "--out", str(tmp_path / "out"),
                    env=_env(PYSPARK_PYTHON="/bin/false"))
    assert done.returncode != 0
    assert " ERROR Executor: Exception in task" in done.stderr
    assert "pyspark.daemon" in done.stderr
