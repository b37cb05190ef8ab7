"""``kproxy run`` as users run it: a real process, real flags, SIGTERM, logfmt lines."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

from kproxy.testing import Broker, free_port, wait_for_port

KPROXY = [sys.executable, "-m", "kproxy"]


def test_run_with_flags_only_then_sigterm(tansu: Broker, tmp_path: Path) -> None:
    port = free_port()
    base = free_port()
    log = tmp_path / "kproxy.log"
    with log.open("wb") as out:
        argv = [*KPROXY, "run", "--upstream", tansu.bootstrap, "--listen", f"127.0.0.1:{port}",
                "--broker-port-base", str(base - 111), "--limits-shutdown-grace", "5"]
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_port("127.0.0.1", port)
        md = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=15)
        # Deterministic port: base + node id (Tansu's node id is 111).
        assert {(b.host, b.port) for b in md.brokers.values()} == {("127.0.0.1", base)}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "event=listening listener=bootstrap" in text
    assert f"event=listening listener=broker-111 address=127.0.0.1:{base}" in text
    assert "event=connection_closed peer=127.0.0.1:" in text and "bytes_in=" in text and "duration_s=" in text
    assert "event=shutdown_started" in text and "event=stopped" in text
    assert "Traceback" not in text


def test_run_refuses_bad_config_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "kproxy.yaml"
    bad.write_text("upstream: [127.0.0.1:9092]\nlimits: {max_frame_size: -5}\n")
    result = subprocess.run([*KPROXY, "run", "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(bad) in lines[0] and "limits.max_frame_size" in lines[0]


def test_run_refuses_a_bad_rule_file_listing_every_problem(tmp_path: Path) -> None:
    rules = tmp_path / "chaos.yaml"
    rules.write_text("rules:\n  - id: x\n    match: {api: produce, probablity: 0.5}\n    actions:\n"
                     "      - delay: {ms: -1}\n")
    result = subprocess.run([*KPROXY, "run", "--upstream", "127.0.0.1:9092", "--rules", str(rules), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert f"--rules: {rules}:3: rules[0].match.probablity: unknown key (did you mean 'probability'?)" in lines[0]
    assert f"--rules: {rules}:5: rules[0].actions[0].delay" in lines[1]


def test_run_reports_a_busy_port_and_exits_1() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = subprocess.run([*KPROXY, "run", "--upstream", "127.0.0.1:9", "--listen", f"127.0.0.1:{port}"],
                                capture_output=True, text=True, timeout=60, env={**os.environ})
    assert result.returncode == 1
    assert "event=start_failed" in result.stderr and "Traceback" not in result.stderr


def test_sigterm_the_moment_the_port_accepts_drains_instead_of_killing(tmp_path: Path) -> None:
    """The signal receivers are installed before the first listener opens.

    A pod stopped right after it became ready gets a SIGTERM as soon as the port accepts; it must
    drain and exit 0, not die by the signal's default action (exit -15). The metrics and admin
    listeners start after the bootstrap one, which is the window a late receiver left open.
    """
    for attempt in range(3):
        port, metrics, admin = free_port(), free_port(), free_port()
        log = tmp_path / f"kproxy-{attempt}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([*KPROXY, "run", "--upstream", "127.0.0.1:9", "--listen", f"127.0.0.1:{port}",
                                     "--broker-port-base", "0", "--metrics-listen", f"127.0.0.1:{metrics}",
                                     "--admin-listen", f"127.0.0.1:{admin}", "--limits-shutdown-grace", "1"],
                                    stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    time.sleep(0.001)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert "event=stopped" in log.read_text()
