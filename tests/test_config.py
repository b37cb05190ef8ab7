"""Configuration: one option table for YAML and flags; bad input says file, key and reason."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kproxy.config import OPTIONS, ConfigError, Limits, add_run_arguments, builtin_default, config_from_args
from kproxy.host_port import HostPort


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return parser.parse_args(argv)


def test_flags_only_no_config_file() -> None:
    cfg = config_from_args(parse(["--upstream", "127.0.0.1:9092", "--listen", "127.0.0.1:19092"]))
    assert cfg.upstream == (HostPort("127.0.0.1", 9092),)
    assert cfg.listen == HostPort("127.0.0.1", 19092)
    assert cfg.first_broker_port == 19093  # broker N on 19093 + N, next to the bootstrap port
    assert cfg.advertised == "127.0.0.1"


def test_upstream_repeatable_and_comma_separated() -> None:
    cfg = config_from_args(parse(["--upstream", "a:1,b:2", "--upstream", "[::1]:3"]))
    assert cfg.upstream == (HostPort("a", 1), HostPort("b", 2), HostPort("::1", 3))


def test_wildcard_listen_advertises_localhost_unless_told() -> None:
    cfg = config_from_args(parse(["--upstream", "k:9092", "--listen", "0.0.0.0:9092"]))
    assert cfg.advertised == "localhost"
    cfg = config_from_args(parse(["--upstream", "k:9092", "--listen", "0.0.0.0:9092",
                                  "--advertised-host", "kafka-proxy.default.svc"]))
    assert cfg.advertised == "kafka-proxy.default.svc"


def test_file_then_flags_override(tmp_path: Path) -> None:
    f = tmp_path / "kproxy.yaml"
    f.write_text("upstream: [k1:9092, k2:9092]\nlisten: 127.0.0.1:29092\nlimits:\n  max_in_flight: 7\n"
                 "broker_ports: {1: 30001}\nmetrics:\n  topic_label: true\n")
    cfg = config_from_args(parse(["--config", str(f), "--limits-max-in-flight", "9"]))
    assert cfg.upstream == (HostPort("k1", 9092), HostPort("k2", 9092))
    assert cfg.limits.max_in_flight == 9
    assert cfg.broker_ports == {1: 30001}
    assert cfg.metrics.topic_label is True


@pytest.mark.parametrize(("text", "message"), [
    ("upstream: [k:1]\nlimits:\n  max_in_flite: 3\n",
     ":3: limits.max_in_flite: unknown key (did you mean 'limits.max_in_flight'?)"),
    ("upstream: [k:1]\nlimits:\n  max_in_flight: many\n",
     ":3: limits.max_in_flight: must be an integer >= 1, got 'many'"),
    ("upstream: [k:1\n", "invalid YAML"),
    ("- just\n- a list\n", "the top level must be a mapping"),
    ("listen: 127.0.0.1:1\n", "upstream: required"),
    ("upstream: [k:1]\ntls:\n  client:\n    cert: /nonexistent.pem\n",
     ":4: tls.client.cert: file '/nonexistent.pem' does not exist"),
    ("upstream: [k:1]\nbroker_ports: {1: 70000}\n", ":2: broker_ports: must be between 1 and 65535"),
    ("upstream: [k:1]\nlog_level: loud\n", ":2: log_level: must be one of"),
])
def test_invalid_file_names_file_key_and_reason(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        config_from_args(parse(["--config", str(f)]))
    assert message in str(err.value)
    if "required" not in message:
        assert str(f) in str(err.value)


def test_invalid_flag_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--limits-idle-timeout: must be > 0 seconds"):
        config_from_args(parse(["--upstream", "k:1", "--limits-idle-timeout", "0"]))


def test_tls_pairs_are_checked(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="cert and key go together"):
        config_from_args(parse(["--upstream", "k:1", "--tls-client-cert", str(cert)]))
    with pytest.raises(ConfigError, match=r"needs tls\.client\.client_ca"):
        config_from_args(parse(["--upstream", "k:1", "--tls-client-cert", str(cert), "--tls-client-key", str(cert),
                                "--tls-client-require-client-cert"]))


def test_every_option_has_a_flag_and_the_flags_the_issue_names() -> None:
    flags = {o.flag for o in OPTIONS}
    assert len(flags) == len(OPTIONS)
    for flag in ("--upstream", "--listen", "--advertised-host", "--metrics-listen", "--log-level"):
        assert flag in flags


def test_shipped_example_config_is_valid() -> None:
    example = Path(__file__).resolve().parent.parent / "deploy" / "kproxy.example.yaml"
    cfg = config_from_args(parse(["--config", str(example)]))
    assert cfg.listen == HostPort("0.0.0.0", 19092)
    assert cfg.advertised == "localhost"


def test_rules_are_loaded_at_start_and_every_problem_is_listed(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("seed: 3\nrules:\n  - id: a\n    match: {api: fetch}\n    actions: [drop_response]\n")
    cfg = config_from_args(parse(["--upstream", "k:1", "--rules", str(good)]))
    assert cfg.rules is not None and [r.id for r in cfg.rules.rules] == ["a"] and cfg.rules.seed == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - id: a\n    match: {api: fetch, topc: x}\n    actions:\n"
                   "      - inject_error: {error: NOT_LEADER_FOR_PARTITON}\n")
    with pytest.raises(ConfigError) as caught:
        config_from_args(parse(["--upstream", "k:1", "--rules", str(bad)]))
    assert list(caught.value.problems) == [
        f"--rules: {bad}:3: rules[0].match.topc: unknown key (did you mean 'topic'?)",
        f"--rules: {bad}:5: rules[0].actions[0].inject_error.error: unknown Kafka error "
        f"'NOT_LEADER_FOR_PARTITON' (did you mean 'NOT_LEADER_OR_FOLLOWER'?)"]


def test_each_boolean_option_is_a_pair_of_flags_and_each_moves_it_off_its_default(tmp_path: Path) -> None:
    """``--X`` sets true and ``--no-X`` false; the one that differs from the built-in default
    changes the setting to exactly that value."""
    booleans = [o for o in OPTIONS if o.boolean]
    assert {o.path for o in booleans if builtin_default(o.path) is True} == {"metrics.scan_responses",
                                                                             "metrics.consumer_lag",
                                                                             "metrics.client_anomalies",
                                                                             "tls.upstream.verify",
                                                                             "capture.process"}
    base = ["--upstream", "k:1"]
    pem = tmp_path / "any.pem"
    pem.write_text("unread: only its existence is checked here")
    extra = {"tls.client.require_client_cert": ["--tls-client-cert", str(pem), "--tls-client-key", str(pem),
                                                "--tls-client-client-ca", str(pem)]}
    for opt in booleans:
        assert opt.negative_flag == "--no-" + opt.flag[2:]
        default = builtin_default(opt.path)
        flag = opt.negative_flag if default else opt.flag
        cfg = config_from_args(parse([*base, *extra.get(opt.path, []), flag]), environ={})
        section, _, name = opt.path.rpartition(".")
        holder = {"metrics": cfg.metrics, "tls.client": cfg.client_tls, "tls.upstream": cfg.upstream_tls,
                  "capture": cfg.capture}[section]
        assert getattr(holder, name) is (not default), flag


def test_defaults_in_help_come_from_the_defaults_themselves() -> None:
    by_flag = {o.flag: o for o in OPTIONS}
    limits = Limits()
    assert by_flag["--limits-max-in-flight"].full_help.endswith(f"(default {limits.max_in_flight})")
    assert by_flag["--limits-idle-timeout"].full_help.endswith(f"(default {limits.idle_timeout:g})")
    assert by_flag["--limits-max-frame-size"].full_help.endswith("(default 100 MiB)")
    assert by_flag["--limits-max-connections"].full_help.endswith("(default 0: no cap)")
    assert by_flag["--listen"].full_help.endswith("(default 127.0.0.1:19092)")
    assert by_flag["--tls-upstream-verify"].full_help.endswith("(default on)")
    assert by_flag["--capture-include-payloads"].full_help.endswith("(default off)")
    for opt in OPTIONS:
        if opt.show_default is not None or opt.boolean:
            assert "default" not in opt.help, f"{opt.flag}: the default is written by hand too"


def test_capture_options_from_flags_and_file(tmp_path: Path) -> None:
    cfg = config_from_args(parse(["--upstream", "k:1"]))
    assert not cfg.capture.enabled
    conf = tmp_path / "kproxy.yaml"
    conf.write_text("upstream: k:1\ncapture:\n  dir: /tmp/cap\n  rotate_bytes: 2048\n  include_payloads: true\n")
    cfg = config_from_args(parse(["--config", str(conf), "--capture-max-bytes-total", "4096"]))
    assert cfg.capture.dir == Path("/tmp/cap") and cfg.capture.enabled
    assert (cfg.capture.rotate_bytes, cfg.capture.max_bytes_total) == (2048, 4096)
    assert cfg.capture.include_payloads and cfg.capture.payload_max_bytes == 1024
    with pytest.raises(ConfigError, match=r"capture\.rotate_bytes: must not exceed"):
        config_from_args(parse(["--config", str(conf), "--capture-max-bytes-total", "1024"]))
