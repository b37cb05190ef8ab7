"""``host:port`` read in one place (kproxy.host_port) and by every reader of addresses: the config,
the rules' ``rewrite_addresses`` map, the capture's peer columns and the policy's client ip."""

from __future__ import annotations

import argparse
import ipaddress
import textwrap

import pytest

from kproxy.capture.observer import split_peer
from kproxy.config import Config, ConfigError, add_run_arguments, config_from_args
from kproxy.host_port import HostPort, parse_host_port, split_host_port


@pytest.mark.parametrize(("text", "expected"), [
    ("kafka-0:9092", HostPort("kafka-0", 9092)),
    ("  10.0.0.1:1  ", HostPort("10.0.0.1", 1)),
    ("[::1]:9092", HostPort("::1", 9092)),
    ("[fe80::1%eth0]:65535", HostPort("fe80::1%eth0", 65535)),
    ("::1:9092", HostPort("::1", 9092)),  # unbracketed IPv6: the port after the last colon
])
def test_host_port_forms(text: str, expected: HostPort) -> None:
    assert parse_host_port(text) == expected
    assert parse_host_port(str(expected)) == expected, "written back, it reads the same"


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty address: expected host:port"),
    ("kafka", "address 'kafka' has no port: expected host:port"),
    ("kafka:", "address 'kafka:' has no port: expected host:port"),
    (":9092", "address ':9092' has no host: expected host:port"),
    ("[]:9092", "address '[]:9092' has no host: expected host:port"),
    ("[::1:9092", "unclosed '[' in address '[::1:9092': expected [host]:port"),
    ("[::1]9092", "'9092' after ']' in address '[::1]9092': expected [host]:port"),
    ("kafka:0", "bad port '0' in address 'kafka:0': expected 1-65535"),
    ("kafka:65536", "bad port '65536' in address 'kafka:65536': expected 1-65535"),
    ("kafka:-1", "bad port '-1' in address 'kafka:-1': expected 1-65535"),
    ("kafka:90x", "bad port '90x' in address 'kafka:90x': expected 1-65535"),
    ("kafka:\u0663", "bad port '\u0663' in address 'kafka:\u0663': expected 1-65535"),  # a digit, not ASCII
    ("[::1]:99999", "bad port '99999' in address '[::1]:99999': expected 1-65535"),
])
def test_bad_addresses_say_what_is_wrong_in_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_host_port(text)
    assert str(caught.value) == message


def test_port_zero_and_default_port_only_when_asked() -> None:
    assert parse_host_port("127.0.0.1:0", allow_port_zero=True) == HostPort("127.0.0.1", 0)
    assert parse_host_port("[::1]:0", allow_port_zero=True) == HostPort("::1", 0)
    assert parse_host_port("kafka", default_port=9092) == HostPort("kafka", 9092)
    assert parse_host_port("[::1]", default_port=9092) == HostPort("::1", 9092)
    with pytest.raises(ValueError, match="bad port '65536'"):
        parse_host_port("kafka:65536", allow_port_zero=True)


def test_lenient_split_gives_the_text_back_when_it_is_no_address() -> None:
    assert split_host_port("[::1]:5") == ("::1", 5)
    assert split_host_port("test") == ("test", None)
    assert split_host_port("h:99999") == ("h:99999", None)


# -- the readers of addresses ----------------------------------------------------------------------
def _config(*argv: str) -> Config:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return config_from_args(parser.parse_args(argv))


def test_config_listen_takes_port_zero_and_bracketed_ipv6_the_upstream_not() -> None:
    assert _config("--upstream", "k:9092", "--listen", "[::1]:0").listen == HostPort("::1", 0)
    with pytest.raises(ConfigError, match=r"bad port '70000' in address '127\.0\.0\.1:70000'"):
        _config("--upstream", "k:9092", "--listen", "127.0.0.1:70000")
    with pytest.raises(ConfigError, match="bad port '0' in address 'k:0': expected 1-65535"):
        _config("--upstream", "k:0")


def _rewrite_rules(mapping: str) -> str:
    return textwrap.dedent(f"""\
        rules:
          - id: a
            match: {{api: metadata}}
            actions: [{{rewrite_addresses: {{map: {mapping}}}}}]
        """)


def test_peers_split_for_the_capture_and_the_policy() -> None:
    assert split_peer("[::1]:40000") == ("::1", 40000)
    assert split_peer("10.1.2.3:5") == ("10.1.2.3", 5)
    assert split_peer("test") == ("test", None)
    assert ipaddress.ip_address(split_host_port("[fe80::1]:1")[0]) == ipaddress.ip_address("fe80::1")
