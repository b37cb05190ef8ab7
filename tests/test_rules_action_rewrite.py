"""The ``rewrite`` action (kproxy/rules/actions/rewrite.py) through its interface: its reader
(paths resolved in the schemas) and its edits of real request and response frames."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from kproxy.protocol import decode_request
from kproxy.protocol.frame_builder import request_frame
from kproxy.rules import RulesError, load_text
from kproxy.rules.actions.rewrite import Rewrite, RewriteDirection
from kproxy.rules.apply import apply_to_request, apply_to_response
from tests.test_protocol_mutations import metadata_frame, produce_request
from tests.test_rules_apply import METADATA, actions, response_body
from tests.test_rules_load import VALIDATOR


def test_rewrite_request_fields_and_topic_prefixes() -> None:
    acts = actions("- rewrite: {set: {acks: 1, client_id: other}, topic_prefix: {'orders': 'staging-orders'}}",
                   "{api: produce}")
    out = apply_to_request(acts, produce_request(9))
    got = decode_request(out.frame[4:])
    assert got.header.client_id == "other" and got.body["acks"] == 1
    assert got.body["topic_data"][0]["name"] == "staging-orders"


def test_rewrite_response_direction_leaves_requests_alone() -> None:
    acts = actions("- rewrite: {direction: response, set: {throttle_time_ms: 9}}", "{api: metadata}")
    request = request_frame(METADATA, 12, 1)
    assert apply_to_request(acts, request).frame is request
    out = apply_to_response(acts, metadata_frame(12), METADATA, 12)
    assert response_body(METADATA, 12, out.frame)["throttle_time_ms"] == 9


def test_rewrite_maps_scalar_values_by_a_table() -> None:
    text = """
        - rewrite:
            map: {acks: {-1: 1}, "topic_data[].partition_data[].index": {1: 5, 7: 8}}
        """
    acts = actions(text, "{api: produce}")
    document = yaml.safe_load("rules:\n  - id: r\n    match: {api: produce}\n    actions:\n"
                              + textwrap.indent(textwrap.dedent(text).strip(), "      "))
    assert not list(VALIDATOR.iter_errors(document))  # the JSON Schema agrees with the loader
    got = decode_request(apply_to_request(acts, produce_request(9, acks=-1)).frame[4:]).body
    assert got["acks"] == 1 and [p["index"] for p in got["topic_data"][0]["partition_data"]] == [0, 5]
    assert decode_request(apply_to_request(acts, produce_request(9, acks=0)).frame[4:]).body["acks"] == 0


def test_rewrite_map_paths_are_checked_like_set_paths() -> None:
    with pytest.raises(RulesError, match="no field 'ack'"):
        actions("- rewrite: {map: {ack: {0: 1}}}", "{api: produce}")


def test_rewrite_paths_resolve_in_the_schemas() -> None:
    rules = load_text(textwrap.dedent("""\
        rules:
          - id: a
            match: {api: produce}
            actions:
              - rewrite: {set: {acks: 1, "topic_data[].name": renamed}, topic_prefix: {"old-": "new-"}}
          - id: b
            match: {api: [fetch, produce]}
            actions:
              - rewrite: {direction: response, set: {throttle_time_ms: 5}}
        """))
    a, b = (r.actions[0] for r in rules.rules)
    assert isinstance(a, Rewrite) and a.set_fields == (("acks", 1), ("topic_data[].name", "renamed"))
    assert a.topic_prefix == (("old-", "new-"),)
    assert isinstance(b, Rewrite) and b.direction is RewriteDirection.RESPONSE
