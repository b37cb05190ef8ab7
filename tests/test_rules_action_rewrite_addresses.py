"""The ``rewrite_addresses`` action (kproxy/rules/actions/rewrite_addresses.py) through its
interface: its reader (a map of host:port, a pattern with named groups) and its edits of real
broker addresses."""

from __future__ import annotations

import pytest

from kproxy.rules import RulesError, load_text
from kproxy.rules.actions.rewrite_addresses import RewriteAddresses, address_map
from kproxy.rules.apply import apply_to_response
from tests.test_host_port import _rewrite_rules
from tests.test_protocol_mutations import metadata_frame
from tests.test_rules_apply import METADATA, actions, response_body


def test_rewrite_addresses_by_map_and_by_pattern() -> None:
    by_map = actions("- rewrite_addresses: {map: {'b1:9091': 'proxy-a:1'}}")
    by_pattern = actions("- rewrite_addresses: {pattern: '^b(\\d):90', replacement: 'node-\\1.example:80'}")
    first = response_body(METADATA, 12, apply_to_response(by_map, metadata_frame(12), METADATA, 12).frame)
    assert [(b["host"], b["port"]) for b in first["brokers"]] == [("proxy-a", 1), ("b2", 9092), ("b3", 9093)]
    second = response_body(METADATA, 12, apply_to_response(by_pattern, metadata_frame(12), METADATA, 12).frame)
    assert [(b["host"], b["port"]) for b in second["brokers"]] == [
        ("node-1.example", 8091), ("node-2.example", 8092), ("node-3.example", 8093)]
    mapping = address_map(RewriteAddresses(mapping=(("[::1]:9092", "h:1"),)))
    assert mapping("::1", 9092) == ("h", 1) and mapping("::1", 9093) is None


def test_a_rewrite_addresses_pattern_rewrites_with_named_groups() -> None:
    rules = load_text("""\
rules:
  - id: a
    match: {api: metadata}
    actions:
      - rewrite_addresses: {pattern: '(?P<name>broker-\\d+)\\.internal:9092', replacement: '\\g<name>.example:19092'}
""")
    action = rules.rules[0].actions[0]
    from kproxy.rules.actions.rewrite_addresses import address_map
    assert address_map(action)("broker-3.internal", 9092) == ("broker-3.example", 19092)  # type: ignore[arg-type]
    assert address_map(action)("other", 9092) is None  # type: ignore[arg-type]


def test_rewrite_addresses_map_reads_ipv6_and_names_a_bad_port_where_it_is() -> None:
    rules = load_text(_rewrite_rules('{"[::1]:9092": "proxy:19092", "kafka-0:9092": "[::2]:9093"}'), "r.yaml")
    action = rules.rules[0].actions[0]
    assert isinstance(action, RewriteAddresses)
    rewrite = address_map(action)
    assert rewrite("::1", 9092) == ("proxy", 19092)
    assert rewrite("kafka-0", 9092) == ("::2", 9093)
    assert rewrite("kafka-0", 9093) is None
    with pytest.raises(RulesError) as caught:
        load_text(_rewrite_rules('{"kafka-0:9092": "proxy:99999"}'), "r.yaml")
    assert [str(p) for p in caught.value.problems] == [
        "r.yaml:4: rules[0].actions[0].rewrite_addresses.map.kafka-0:9092: bad port '99999' in address "
        "'proxy:99999': expected 1-65535"]
