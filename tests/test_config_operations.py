"""Config the way platform teams run it: every error at once, KPROXY_* overrides, JSON logs, exit codes."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trustme
from confluent_kafka.admin import AdminClient

from kproxy.config import OPTIONS, ConfigError, add_run_arguments, config_from_args, env_name
from kproxy.host_port import HostPort
from kproxy.logfmt import JsonFormatter, LogfmtFormatter, parse_logfmt, q
from kproxy.testing import Broker, free_port, wait_for_port

KPROXY = [sys.executable, "-m", "kproxy"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return parser.parse_args(argv)


def run_kproxy(*argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KPROXY_")}
    return subprocess.run([*KPROXY, *argv], capture_output=True, text=True, timeout=timeout,
                          env={**clean, **(env or {})}, check=False)


# -- every problem at once ------------------------------------------------------------------
def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    bad = tmp_path / "kproxy.yaml"
    bad.write_text("upstream: [127.0.0.1:9092]\nlimits: 5\nmetrcs: {label_cap: 3}\nlog_level: loud\n")
    with pytest.raises(ConfigError) as caught:
        config_from_args(parse(["--config", str(bad)]), environ={})
    problems = caught.value.problems
    assert len(problems) == 3, problems  # keys and values alike, in the file's order
    assert problems[0].startswith(f"{bad}:2: limits: is a section of options (max_frame_size, ")
    assert problems[0].endswith("not an integer '5'")
    assert problems[1] == f"{bad}:3: metrcs: unknown key (did you mean 'metrics'?)"
    assert problems[2].startswith(f"{bad}:4: log_level: must be one of debug, info, warning, error, got 'loud'")


def test_every_bad_value_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_args(parse(["--limits-max-in-flight", "many", "--limits-idle-timeout", "-1", "--log-level",
                                "loud"]), environ={})
    text = "\n".join(caught.value.problems)
    assert len(caught.value.problems) == 4, text
    for part in ("--limits-max-in-flight: must be an integer", "--limits-idle-timeout: must be > 0",
                 "--log-level: must be one of",
                 "upstream: required"):
        assert part in text


def test_run_prints_every_problem_one_per_line_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "kproxy.yaml"
    bad.write_text("upstream: [127.0.0.1:9092]\nlimits: {max_frame_size: -5, idle_timeout: soon}\n")
    done = run_kproxy("run", "--config", str(bad))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, done.stderr
    assert all(line.startswith("kproxy run: invalid configuration: ") for line in lines)
    assert f"{bad}:2: limits.max_frame_size: must be >= 1024" in lines[0]
    assert f"{bad}:2: limits.idle_timeout: must be a number of seconds, got 'soon'" in lines[1]


def test_check_flag_validates_without_serving(tmp_path: Path) -> None:
    good = run_kproxy("run", "--check", "--upstream", "127.0.0.1:9092", "--listen", "127.0.0.1:1")
    assert good.returncode == 0 and "configuration ok" in good.stdout
    bad = run_kproxy("run", "--check", "--upstream", "127.0.0.1:9092", "--tls-client-cert", str(tmp_path / "nope.pem"))
    assert bad.returncode == 2 and "nope.pem" in bad.stderr


def test_tls_load_errors_name_the_file(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = tmp_path / "cert.pem"
    key = tmp_path / "key.pem"
    ca.issue_cert("localhost").cert_chain_pems[0].write_to_path(str(cert))
    ca.issue_cert("localhost").private_key_pem.write_to_path(str(key))  # a key of another certificate
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    done = run_kproxy("run", "--check", "--upstream", "127.0.0.1:9092", "--tls-client-cert", str(cert),
                      "--tls-client-key", str(key), "--tls-upstream-enabled", "--tls-upstream-ca", str(garbage))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, done.stderr
    assert f"tls.client.cert/key: cannot load {cert} and {key}" in lines[0]
    assert f"tls.upstream.ca: cannot load {garbage}" in lines[1]


# -- KPROXY_* environment ---------------------------------------------------------------------
def test_every_option_has_an_environment_variable() -> None:
    names = [env_name(o.path) for o in OPTIONS]
    assert len(set(names)) == len(names)
    assert env_name("limits.max_in_flight") == "KPROXY_LIMITS_MAX_IN_FLIGHT"


def test_precedence_is_flag_then_environment_then_file(tmp_path: Path) -> None:
    file = tmp_path / "kproxy.yaml"
    file.write_text("upstream: [file:1]\nlimits: {max_in_flight: 7, idle_timeout: 70}\nlog_level: error\n")
    environ = {"KPROXY_LIMITS_MAX_IN_FLIGHT": "8", "KPROXY_LOG_LEVEL": "warn", "KPROXY_UPSTREAM": "env:1, env:2",
               "KPROXY_TLS_UPSTREAM_VERIFY": "false", "KPROXY_BROKER_PORTS": "1=20001,2=20002",
               "KPROXY_ADMIN": "127.0.0.1:9901", "NOT_KPROXY": "x"}  # not options, and known or not kproxy's
    cfg = config_from_args(parse(["--config", str(file), "--limits-max-in-flight", "9"]), environ=environ)
    assert cfg.limits.max_in_flight == 9          # flag over environment over file
    assert cfg.limits.idle_timeout == 70          # file only
    assert cfg.log_level == "warning"             # environment over file; "warn" is an alias
    assert cfg.upstream == (HostPort("env", 1), HostPort("env", 2))
    assert cfg.upstream_tls.verify is False
    assert dict(cfg.broker_ports) == {1: 20001, 2: 20002}


def test_a_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="environment KPROXY_LIMITS_MAX_IN_FLIGHT: must be an integer"):
        config_from_args(parse(["--upstream", "k:1"]), environ={"KPROXY_LIMITS_MAX_IN_FLIGHT": "lots"})


# -- logs -----------------------------------------------------------------------------------------
def test_json_lines_carry_the_same_fields_as_logfmt() -> None:
    reason = q('bad request: x="y"')
    message = f"event=connection_closed peer=127.0.0.1:5 reason={reason} bytes_in=42"
    record = logging.LogRecord("kproxy.connection", logging.INFO, __file__, 1, message, None, None)
    entry = json.loads(JsonFormatter().format(record))
    assert entry == {"ts": entry["ts"], "level": "info", "logger": "kproxy.connection", "event": "connection_closed",
                     "peer": "127.0.0.1:5", "reason": 'bad request: x="y"', "bytes_in": 42}
    assert parse_logfmt(LogfmtFormatter().format(record))["reason"] == 'bad request: x="y"'


def test_run_logs_json_line_by_line(tansu: Broker, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "kproxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*KPROXY, "run", "--upstream", tansu.bootstrap, "--listen", f"127.0.0.1:{port}",
                                 "--broker-port-base", str(free_port()), "--limits-shutdown-grace", "2"],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "KPROXY_LOG_FORMAT": "json"})
    try:
        wait_for_port("127.0.0.1", port)
        # A client id that looks like a number: it is a name, and stays a string.
        AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "client.id": "12345"}).list_topics(timeout=15)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0  # exit code 0 after a drain
    finally:
        if proc.poll() is None:
            proc.kill()
    entries = [json.loads(line) for line in log.read_text().splitlines()]  # every line is one JSON object
    events = [e["event"] for e in entries]
    assert {"listening", "connection_opened", "connection_closed", "shutdown_started", "stopped"} <= set(events)
    assert all({"ts", "level", "logger", "event"} <= e.keys() for e in entries)
    # Numbers are JSON numbers (Loki, Elasticsearch and Datadog compare and sum them), names strings.
    closed = [e for e in entries if e["event"] == "connection_closed" and e.get("client_id") == "12345"]
    assert closed, entries
    for entry in closed:
        assert type(entry["bytes_in"]) is int and entry["bytes_in"] > 0, entry
        assert type(entry["bytes_out"]) is int and type(entry["requests"]) is int, entry
        assert type(entry["duration_s"]) is float, entry
        assert isinstance(entry["peer"], str) and isinstance(entry["listener"], str), entry
    (started,) = [e for e in entries if e["event"] == "shutdown_started"]
    assert type(started["connections"]) is int and type(started["grace_s"]) is float, started


def test_json_values_are_typed_and_names_stay_strings() -> None:
    message = ("event=fault rule=42 action=delay connection=127.0.0.1:5 correlation_id=7 api=produce "
               "topic=7 partition=0 detail=\"delay 5.0ms\" dry_run=true node_id=1 seed=-3 ratio=0.25 code=007")
    record = logging.LogRecord("kproxy.rules", logging.INFO, __file__, 1, message, None, None)
    entry = json.loads(JsonFormatter().format(record))
    assert {k: entry[k] for k in ("rule", "topic", "partition", "node_id", "connection")} == {
        "rule": "42", "topic": "7", "partition": "0", "node_id": "1", "connection": "127.0.0.1:5"}
    assert (entry["correlation_id"], entry["dry_run"], entry["seed"], entry["ratio"]) == (7, True, -3, 0.25)
    assert entry["code"] == "007" and entry["detail"] == "delay 5.0ms"
    assert LogfmtFormatter().format(record).endswith(message), "logfmt lines are the message as it is"


def test_a_log_key_has_one_json_type_in_every_line_kproxy_writes() -> None:
    """A pipeline types a JSON field from the first value it sees and refuses lines that disagree:
    a key logged as a number in one line (``%d``) is never a boolean (``true``) in another."""
    kinds: dict[str, dict[str, set[str]]] = {}
    root = Path(__file__).resolve().parent.parent / "kproxy"
    for path in root.rglob("*.py"):
        for match in re.finditer(r"\b([a-z_]+)=(%d|%\.\d+f|%f|%g|true|false)\b", path.read_text(encoding="utf-8")):
            kind = "boolean" if match.group(2) in ("true", "false") else "number"
            kinds.setdefault(match.group(1), {}).setdefault(kind, set()).add(str(path.relative_to(root)))
    assert {key: found for key, found in kinds.items() if len(found) > 1} == {}
    assert {"dry_run", "dry_run_rules", "bytes_in"} <= kinds.keys()


# -- exit codes -------------------------------------------------------------------------------------
def test_a_busy_metrics_port_names_the_metrics_address_and_exits_1() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        metrics = busy.getsockname()[1]
        done = run_kproxy("run", "--upstream", "127.0.0.1:9", "--listen", f"127.0.0.1:{free_port()}",
                          "--metrics-listen", f"127.0.0.1:{metrics}")
    assert done.returncode == 1
    (line,) = [ln for ln in done.stderr.splitlines() if "event=start_failed" in ln]
    assert f"listener=metrics address=127.0.0.1:{metrics}" in line and "Traceback" not in done.stderr
