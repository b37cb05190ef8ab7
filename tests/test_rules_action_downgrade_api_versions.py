"""The ``downgrade_api_versions`` action (kproxy/rules/actions/downgrade_api_versions.py) through
its interface: its edit of a real ApiVersions answer. The edit itself: tests/test_protocol_mutations.py."""

from __future__ import annotations

from kproxy.rules.apply import apply_to_response
from tests.test_protocol_mutations import api_versions_frame
from tests.test_rules_apply import API_VERSIONS, actions, response_body


def test_downgrade_and_throttle_on_api_versions() -> None:
    acts = actions("- downgrade_api_versions: {produce: 7, fetch: 11}", "{api: api_versions}")
    frame = api_versions_frame(3)
    out = apply_to_response(acts, frame, API_VERSIONS, 3, throttle_time_ms=250)
    body = response_body(API_VERSIONS, 3, out.frame)
    assert [e["max_version"] for e in body["api_keys"]] == [7, 11, 12]
    assert body["throttle_time_ms"] == 250
    assert out.notes == ("downgrade_api_versions: 2 changed", "throttle throttle_time_ms=250: 1 changed")
