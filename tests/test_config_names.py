"""One name per option: the flag and the ``KPROXY_*`` variable are derived from the YAML path.

Earlier flags keep working for one release, each saying which flag replaces it; ``kproxy run
--help`` shows each option's YAML key and variable; a ``KPROXY_*`` variable that is not an option
(nor one kproxy's tooling reads) is refused with a did-you-mean instead of being ignored.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kproxy.cli import main
from kproxy.config import (
    KNOWN_VARIABLES,
    OPTIONS,
    ConfigError,
    add_run_arguments,
    config_from_args,
    deprecation_notes,
    env_name,
    flag_name,
    read_environment,
)
from kproxy.testing import free_port, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
KPROXY = [sys.executable, "-m", "kproxy"]

# The 22 deprecated flags, spelt otherwise than their option's YAML path, with a value each takes
# (None: the flag takes none) and the option it sets.
OLD_FLAGS = {
    "--broker-port": ("1=20001", "broker_ports"),
    "--capture-max-bytes": ("4096", "capture.max_bytes_total"),
    "--capture-payloads": (None, "capture.include_payloads"),
    "--metrics-no-error-scan": (None, "metrics.scan_responses"),
    "--metrics-process": (None, "metrics.process_metrics"),
    "--max-frame-size": ("2048", "limits.max_frame_size"),
    "--max-in-flight": ("7", "limits.max_in_flight"),
    "--max-connections": ("5", "limits.max_connections"),
    "--max-http-connections": ("6", "limits.max_http_connections"),
    "--idle-timeout": ("11", "limits.idle_timeout"),
    "--frame-timeout": ("12", "limits.frame_timeout"),
    "--connect-timeout": ("13", "limits.connect_timeout"),
    "--shutdown-grace": ("14", "limits.shutdown_grace"),
    "--tls-cert": ("PEM", "tls.client.cert"),
    "--tls-key": ("PEM", "tls.client.key"),
    "--tls-client-ca": ("PEM", "tls.client.client_ca"),
    "--tls-require-client-cert": (None, "tls.client.require_client_cert"),
    "--upstream-tls": (None, "tls.upstream.enabled"),
    "--upstream-ca": ("PEM", "tls.upstream.ca"),
    "--upstream-cert": ("PEM", "tls.upstream.cert"),
    "--upstream-key": ("PEM", "tls.upstream.key"),
    "--upstream-server-name": ("kafka.example", "tls.upstream.server_name"),
}
OFF_SWITCHES = {"--metrics-no-error-scan", "--upstream-no-verify"}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return parser.parse_args(argv)


def test_every_flag_and_variable_is_spelt_after_the_yaml_path() -> None:
    for opt in OPTIONS:
        words = re.split(r"[._]", opt.path)
        assert opt.flag == flag_name(opt.path) == "--" + "-".join(words), opt.path
        assert opt.env == env_name(opt.path) == "KPROXY_" + "_".join(words).upper(), opt.path
    flags = {o.flag for o in OPTIONS} | {o.negative_flag for o in OPTIONS if o.boolean}
    for named in ("--capture-max-bytes-total", "--no-metrics-scan-responses", "--tls-upstream-enabled",
                  "--limits-max-in-flight", "--no-tls-upstream-verify", "--tls-client-client-ca"):
        assert named in flags


def test_flag_variable_and_yaml_key_set_the_same_thing(tmp_path: Path) -> None:
    """Three options whose flags were spelt otherwise, set each of the three ways: the same configuration."""
    file = tmp_path / "kproxy.yaml"
    file.write_text("upstream: k:1\ncapture: {max_bytes_total: 4096, rotate_bytes: 4096}\n"
                    "metrics: {scan_responses: false}\ntls: {upstream: {enabled: true}}\n")
    from_file = config_from_args(parse(["--config", str(file)]), environ={})
    from_env = config_from_args(parse([]), environ={
        "KPROXY_UPSTREAM": "k:1", "KPROXY_CAPTURE_MAX_BYTES_TOTAL": "4096", "KPROXY_CAPTURE_ROTATE_BYTES": "4096",
        "KPROXY_METRICS_SCAN_RESPONSES": "false",
        "KPROXY_TLS_UPSTREAM_ENABLED": "true"})
    from_flags = config_from_args(parse(["--upstream", "k:1", "--capture-max-bytes-total", "4096",
                                         "--capture-rotate-bytes", "4096",
                                         "--no-metrics-scan-responses", "--tls-upstream-enabled"]), environ={})
    assert from_file == from_env == from_flags
    assert (from_file.capture.max_bytes_total, from_file.metrics.scan_responses, from_file.upstream_tls.enabled) == \
        (4096, False, True)


@pytest.mark.parametrize("old", [*OLD_FLAGS, "--upstream-no-verify"])
def test_each_old_flag_still_works_and_names_the_flag_that_replaces_it(tmp_path: Path, old: str) -> None:
    value, path = OLD_FLAGS.get(old, (None, "tls.upstream.verify"))
    pem = tmp_path / "x.pem"
    pem.write_text("only its existence is checked here")
    value = str(pem) if value == "PEM" else value
    opt = next(o for o in OPTIONS if o.path == path)
    new = opt.negative_flag if old in OFF_SWITCHES else opt.flag
    assert new is not None
    # Options that need a partner to be valid get it, under its own new name.
    partners = {"tls.client.cert": ["--tls-client-key", str(pem)], "tls.client.key": ["--tls-client-cert", str(pem)],
                "tls.client.require_client_cert": ["--tls-client-cert", str(pem), "--tls-client-key", str(pem),
                                                   "--tls-client-client-ca", str(pem)],
                "tls.upstream.cert": ["--tls-upstream-key", str(pem)],
                "tls.upstream.key": ["--tls-upstream-cert", str(pem)],
                "capture.max_bytes_total": ["--capture-rotate-bytes", "1024"]}
    base = ["--upstream", "k:1", *partners.get(path, [])]
    with_old = parse([*base, old, *([value] if value else [])])
    with_new = parse([*base, new, *([value] if value else [])])
    assert config_from_args(with_old, environ={}) == config_from_args(with_new, environ={})
    assert deprecation_notes(with_new) == []
    (note,) = deprecation_notes(with_old)
    assert (note.flag, note.use, note.option) == (old, new, opt)
    assert str(note).startswith(f"{old} is deprecated") and f"use {new} ({path} in YAML, {opt.env})" in str(note)


def test_run_prints_one_deprecation_line_per_old_flag_and_still_runs() -> None:
    done = subprocess.run([*KPROXY, "run", "--check", "--upstream", "k:1", "--shutdown-grace", "3",
                           "--upstream-no-verify", "--shutdown-grace", "4"],
                          capture_output=True, text=True, timeout=60, env=_clean_env(), check=False)
    assert done.returncode == 0, done.stderr
    assert "configuration ok" in done.stdout
    assert done.stderr.splitlines() == [
        "kproxy run: warning: --shutdown-grace is deprecated and goes in the next release: use "
        "--limits-shutdown-grace (limits.shutdown_grace in YAML, KPROXY_LIMITS_SHUTDOWN_GRACE)",
        "kproxy run: warning: --upstream-no-verify is deprecated and goes in the next release: use "
        "--no-tls-upstream-verify (tls.upstream.verify in YAML, KPROXY_TLS_UPSTREAM_VERIFY)"]


def test_a_serving_kproxy_logs_the_deprecation_in_its_log_format(tmp_path: Path) -> None:
    """A JSON log stays JSON: the deprecation is one log line of the configured format."""
    port = free_port()
    log = tmp_path / "kproxy.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*KPROXY, "run", "--upstream", "127.0.0.1:9", "--listen", f"127.0.0.1:{port}",
                                 "--broker-port-base", "0", "--log-format", "json", "--shutdown-grace", "1"],
                                stdout=out, stderr=subprocess.STDOUT, env=_clean_env())
    try:
        wait_for_port("127.0.0.1", port)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    deprecated = [e for e in entries if e["event"] == "flag_deprecated"]
    assert len(deprecated) == 1, entries
    assert deprecated[0]["level"] == "warning"
    assert (deprecated[0]["flag"], deprecated[0]["use"], deprecated[0]["option"]) == (
        "--shutdown-grace", "--limits-shutdown-grace", "limits.shutdown_grace")


def test_run_help_shows_each_options_yaml_key_and_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for opt in OPTIONS:
        assert (f"{opt.flag}, {opt.negative_flag} " if opt.boolean else f"{opt.flag} {opt.metavar} ") in text
        assert f"[YAML {opt.path}; env {opt.env}" in text, opt.path
    assert "deprecated: --max-in-flight]" in text  # a deprecated flag is named in its option's help
    assert "--max-in-flight MAX" not in text  # the aliases themselves are not listed as options


# -- KPROXY_* variables that are not options ------------------------------------------------------
def test_an_unknown_kproxy_variable_is_refused_with_a_did_you_mean() -> None:
    env = {**_clean_env(), "KPROXY_MAX_IN_FLIGHT": "abc", "KPROXY_LIMITS_IDLE_TIMOUT": "5"}
    done = subprocess.run([*KPROXY, "run", "--check", "--upstream", "k:1"], capture_output=True, text=True,
                          timeout=60, env=env, check=False)
    assert done.returncode == 2, done
    assert done.stderr.splitlines() == [
        "kproxy run: invalid configuration: environment KPROXY_LIMITS_IDLE_TIMOUT: not a kproxy option "
        "(did you mean KPROXY_LIMITS_IDLE_TIMEOUT?)",
        "kproxy run: invalid configuration: environment KPROXY_MAX_IN_FLIGHT: not a kproxy option "
        "(did you mean KPROXY_LIMITS_MAX_IN_FLIGHT?)"]


def test_variables_kproxy_reads_for_other_jobs_are_not_refused() -> None:
    environ = {name: "1" for name in KNOWN_VARIABLES}
    cfg = config_from_args(parse(["--upstream", "k:1"]), environ={**environ, "PATH": "/bin"})
    assert cfg.upstream[0].host == "k"
    with pytest.raises(ConfigError, match="KPROXY_ADMINN: not a kproxy option"):
        config_from_args(parse(["--upstream", "k:1"]), environ={"KPROXY_ADMINN": "x"})
    with pytest.raises(ConfigError, match=r"KPROXY_UPSTREAM_NO_VERIFY: not a kproxy option \(did you mean "
                                          r"KPROXY_TLS_UPSTREAM_VERIFY=false\?\)"):
        config_from_args(parse(["--upstream", "k:1"]), environ={"KPROXY_UPSTREAM_NO_VERIFY": "1"})


def test_every_kproxy_variable_the_project_mentions_is_an_option_or_known() -> None:
    """A variable added to a script, a test, a chart or the docs without a place here would make
    every ``kproxy run`` started with it in the environment refuse to start."""
    names: dict[str, str] = {}
    places = ["kproxy", "scripts", "deploy", "helm", "tests", "bench", "docs", "rules", "examples", ".ci", "Dockerfile",
              "README.md"]
    for place in places:
        root = ROOT / place
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for file in files:
            if file == Path(__file__).resolve() or file.suffix in (".pyc", ".parquet", ".png"):
                continue
            try:
                text = file.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for name in re.findall(r"\bKPROXY_[A-Z0-9_]*[A-Z0-9]\b", text):
                names.setdefault(name, str(file.relative_to(ROOT)))
    refused_in_the_docs = {"KPROXY_MAX_IN_FLIGHT", "KPROXY_LIMITS_IDLE_TIMOUT"}  # examples of variables refused
    # (an option's, or a cluster's option's: KPROXY_CLUSTERS_ORDERS_UPSTREAM)
    unknown = {n: where for n, where in names.items()
               if read_environment({n: "x"})[1] and n not in refused_in_the_docs}
    assert unknown == {}, "add these to kproxy.config.layering.KNOWN_VARIABLES (or make them options)"


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KPROXY_")}


def test_the_configuration_reference_lists_every_option_as_the_table_declares_it() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_config_doc.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    doc = (ROOT / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    for opt in OPTIONS:
        assert f"| `{opt.path}` | `{opt.flag}" in doc and f"`{opt.env}`" in doc
