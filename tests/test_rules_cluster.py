"""``match.cluster``: a rule for the connections of some clusters only (the config's ``clusters:``).

Here without sockets: the key as the loader, the JSON Schema, the linter and the engine read it,
and a connection's policy, which is made with its cluster. Real clients through two clusters:
tests/test_clusters_e2e.py.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import jsonschema
import pytest
import yaml

from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.live_rules import LiveRules
from kproxy.rules import RulesError
from kproxy.rules.engine import RuleEngine
from kproxy.rules.lint import covers
from kproxy.rules.load import load_text
from kproxy.rules.request_facts import StaticFacts

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "rules" / "kproxy-rules.schema.json").read_text())
PRODUCE = 0


def _rules(match: str) -> str:
    return (f"rules:\n  - id: r\n    match: {match}\n"
            "    actions: [{inject_error: {error: NOT_LEADER_OR_FOLLOWER}}]\n")


def test_a_rule_names_one_cluster_or_several() -> None:
    assert load_text(_rules("{cluster: orders}")).rules[0].match.clusters == frozenset({"orders"})
    assert load_text(_rules("{cluster: [orders, eu-west]}")).rules[0].match.clusters == frozenset(
        {"orders", "eu-west"})
    for good in ("{cluster: orders}", "{cluster: [orders, eu-west]}"):
        jsonschema.validate(yaml.safe_load(_rules(good)), SCHEMA)


@pytest.mark.parametrize("bad", ["Orders", "-x", "a_b", "[]"])
def test_a_name_no_cluster_can_have_is_refused_at_its_line(bad: str) -> None:
    with pytest.raises(RulesError, match=r":3: rules\[0\]\.match\.cluster"):
        load_text(_rules(f"{{cluster: {bad}}}"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(yaml.safe_load(_rules(f"{{cluster: {bad}}}")), SCHEMA)


def test_the_engine_matches_the_connections_cluster_only() -> None:
    engine = RuleEngine(load_text(_rules("{api: produce, cluster: orders}")))
    assert engine.reads_cluster
    assert engine.evaluate(StaticFacts(api_key=PRODUCE, cluster="orders")).matched
    assert not engine.evaluate(StaticFacts(api_key=PRODUCE, cluster="payments")).matched
    assert not engine.evaluate(StaticFacts(api_key=PRODUCE)).matched  # facts of no connection
    # The per-client gates are kept per cluster too: one client id in both clusters.
    assert engine.admits(PRODUCE, "app", None, None, None, "orders")
    assert not engine.admits(PRODUCE, "app", None, None, None, "payments")
    assert engine.client_decision(PRODUCE, "app", None, None, None, "orders") is not None
    assert engine.client_decision(PRODUCE, "app", None, None, None, "payments") is None


def test_a_rule_of_one_cluster_does_not_cover_a_rule_of_every_cluster() -> None:
    some = load_text(_rules("{api: produce, cluster: orders}")).rules[0].match
    every = load_text(_rules("{api: produce}")).rules[0].match
    assert covers(every, some) and not covers(some, every)


def test_a_connections_policy_carries_its_cluster() -> None:
    live = LiveRules(load_text(_rules("{api: produce, cluster: orders}")), counts=FaultStats())
    policy = live.policy("127.0.0.1:5000", 1, "payments")
    assert policy is not None and policy.cluster == "payments"


def test_a_rule_for_a_cluster_kproxy_does_not_serve_is_warned_of_at_start(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    from kproxy.config import build_config
    from kproxy.server.proxy_server import ProxyServer

    rules = tmp_path / "rules.yaml"
    rules.write_text(_rules("{api: produce, cluster: [orders, paymnets]}"))
    config = build_config({"clusters.orders.upstream": ("127.0.0.1:9", "test"),
                           "clusters.orders.listen": ("127.0.0.1:0", "test"),
                           "clusters.payments.upstream": ("127.0.0.1:9", "test"),
                           "clusters.payments.listen": ("127.0.0.1:0", "test"), "rules": (str(rules), "test")})
    caplog.set_level(logging.WARNING, logger="kproxy")
    ProxyServer(config, handle_signals=False)._warn_about_options()
    warned = [r.getMessage() for r in caplog.records if "rule_cluster_unknown" in r.getMessage()]
    assert warned == ["event=rule_cluster_unknown rule=r clusters=paymnets known=orders,payments"]
