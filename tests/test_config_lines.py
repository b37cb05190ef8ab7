"""Every problem of a configuration in one round, each at its file and line.

Unknown keys and bad values are reported together (no second round after the keys are fixed),
each as ``file:line: key.path: reason (did you mean ...)``, the way ``kproxy rules check``
reports rule files; a mistyped flag gets a did-you-mean too.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kproxy.cli import main
from kproxy.config import ConfigError, add_run_arguments, config_from_args, read_config_file
from kproxy.subcommands.health import url_from_config

KPROXY = [sys.executable, "-m", "kproxy"]

BROKEN = """\
upstream: [127.0.0.1:9092]
limits:
  idle_timeout: ten
  max_in_flite: 3
log_level: verbose
metrcs: {label_cap: 3}
max_in_flight: 4
tls:
  client: 5
log_level: info
"""


def test_keys_and_values_are_reported_in_one_round_with_their_lines(tmp_path: Path) -> None:
    conf = tmp_path / "kproxy.yaml"
    conf.write_text(BROKEN)
    done = subprocess.run([*KPROXY, "run", "--check", "--config", str(conf)], capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items() if not k.startswith("KPROXY_")},
                          check=False)
    assert done.returncode == 2
    prefix = "kproxy run: invalid configuration: "
    assert done.stderr.splitlines() == [prefix + line for line in (
        f"{conf}:3: limits.idle_timeout: must be a number of seconds, got 'ten'",
        f"{conf}:4: limits.max_in_flite: unknown key (did you mean 'limits.max_in_flight'?)",
        f"{conf}:5: log_level: must be one of debug, info, warning, error, got 'verbose'",
        f"{conf}:6: metrcs: unknown key (did you mean 'metrics'?)",
        f"{conf}:7: max_in_flight: unknown key (did you mean 'limits.max_in_flight'?)",
        f"{conf}:9: tls.client: is a section of options (cert, key, client_ca, require_client_cert), "
        f"not an integer '5'",
        f"{conf}:10: log_level: duplicate key (first at line 5)",
    )]


def test_file_value_environment_and_flag_problems_come_together(tmp_path: Path) -> None:
    conf = tmp_path / "kproxy.yaml"
    conf.write_text("upstream: k:1\nlimits:\n  shutdown_gracee: 3\n  frame_timeout: -1\n")
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    with pytest.raises(ConfigError) as caught:
        config_from_args(parser.parse_args(["--config", str(conf), "--log-level", "loud"]),
                         environ={"KPROXY_LIMITS_MAX_IN_FLIGHT": "0"})
    assert list(caught.value.problems) == [
        f"{conf}:3: limits.shutdown_gracee: unknown key (did you mean 'limits.shutdown_grace'?)",
        f"{conf}:4: limits.frame_timeout: must be > 0 seconds, got -1.0",
        "environment KPROXY_LIMITS_MAX_IN_FLIGHT: must be >= 1, got 0",
        "--log-level: must be one of debug, info, warning, error, got 'loud'",
    ]


def test_a_list_value_is_at_its_key_line_and_a_bad_tag_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    conf = tmp_path / "kproxy.yaml"
    conf.write_text("log_format: json\nupstream:\n  - 127.0.0.1:9092\nadvertised_host: !!python/name:os.system\n")
    read = read_config_file(conf)
    assert read.values["upstream"] == (["127.0.0.1:9092"], f"{conf}:2: upstream")
    assert read.values["log_format"] == ("json", f"{conf}:1: log_format")
    (problem,) = read.problems
    assert str(problem).startswith(f"{conf}:4: advertised_host: cannot be read: ")


def test_health_reads_the_same_file_with_the_same_lines(tmp_path: Path) -> None:
    conf = tmp_path / "kproxy.yaml"
    conf.write_text("upstream: k:1\nmetrics_listen: 127.0.0.1:9308\nmetrics_lisen: 1\n")
    with pytest.raises(ConfigError) as caught:
        url_from_config(conf)
    assert str(caught.value) == f"{conf}:3: metrics_lisen: unknown key (did you mean 'metrics_listen'?)"


@pytest.mark.parametrize(("argv", "suggested"), [
    (["run", "--metric-listen", "127.0.0.1:9308"], "unrecognized argument --metric-listen (did you mean "
                                                   "--metrics-listen?)"),
    (["run", "--max-in-flite=3"], "unrecognized argument --max-in-flite=3 (did you mean --limits-max-in-flight?)"),
    (["decode", "--prety"], "unrecognized argument --prety (did you mean --pretty?)"),
    (["rules", "check", "--verbos", "x.yaml"], "unrecognized argument --verbos"),
])
def test_a_mistyped_flag_gets_a_did_you_mean(capsys: pytest.CaptureFixture[str], argv: list[str],
                                             suggested: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith(f"error: {suggested}"), err


def test_options_that_go_together_are_checked_in_the_same_round(tmp_path: Path) -> None:
    """A certificate without its key is reported with the bad values, not after they are fixed;
    a pair with a bad member is not reported again as a pair."""
    pem = tmp_path / "cert.pem"
    pem.write_text("only its existence is checked here")
    conf = tmp_path / "kproxy.yaml"
    conf.write_text(f"upstream: k:1\nlog_level: verbose\ntls:\n  client: {{cert: {pem}}}\n"
                    f"  upstream: {{cert: {tmp_path / 'missing.pem'}}}\n")
    with pytest.raises(ConfigError) as caught:
        config_from_args(argparse.Namespace(config=conf), environ={})
    assert list(caught.value.problems) == [
        f"{conf}:2: log_level: must be one of debug, info, warning, error, got 'verbose'",
        f"{conf}:5: tls.upstream.cert: file '{tmp_path / 'missing.pem'}' does not exist",
        "tls.client: cert and key go together (--tls-client-cert with --tls-client-key)",
    ]


def test_health_lists_a_files_problems_in_line_order(tmp_path: Path) -> None:
    conf = tmp_path / "kproxy.yaml"
    conf.write_text("upstream: k:1\nlog_level: loud\nmetrics_lisen: 1\nmetrics_listen: 127.0.0.1:9308\n")
    with pytest.raises(ConfigError) as caught:
        url_from_config(conf)
    assert list(caught.value.problems) == [
        f"{conf}:2: log_level: must be one of debug, info, warning, error, got 'loud'",
        f"{conf}:3: metrics_lisen: unknown key (did you mean 'metrics_listen'?)"]


def test_the_files_kproxy_loads_and_writes_are_checked_in_the_same_round(tmp_path: Path) -> None:
    """A certificate that does not load and a capture directory that cannot be made are reported
    with a bad value elsewhere, not after it is fixed; a section with a bad value of its own is
    not loaded (its problem is already said)."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    conf = tmp_path / "kproxy.yaml"
    conf.write_text(f"upstream: k:1\nlog_level: verbose\ncapture: {{dir: /proc/nope}}\n"
                    f"tls:\n  upstream: {{enabled: true, ca: {garbage}}}\n"
                    f"  client: {{cert: {garbage}, key: {garbage}, client_ca: {tmp_path / 'missing.pem'}}}\n")
    done = subprocess.run([*KPROXY, "run", "--check", "--config", str(conf)], capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items() if not k.startswith("KPROXY_")},
                          check=False)
    assert done.returncode == 2
    lines = [line.removeprefix("kproxy run: invalid configuration: ") for line in done.stderr.splitlines()]
    assert lines[:2] == [f"{conf}:2: log_level: must be one of debug, info, warning, error, got 'verbose'",
                         f"{conf}:6: tls.client.client_ca: file '{tmp_path / 'missing.pem'}' does not exist"]
    assert lines[2].startswith(f"tls.upstream.ca: cannot load {garbage}")
    assert lines[3] == "capture.dir: cannot create /proc/nope: No such file or directory"
    assert len(lines) == 4, lines
