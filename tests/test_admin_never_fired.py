"""Rules that never fired since they were loaded, as the admin API, ``kproxy rules list`` and
``kproxy rules faults`` show them: the live half of issue 34's "rules that can never act" (a
literal ``topic: order`` where the traffic says ``orders`` loads fine and never fires).

The count since load is a rule's hits less those it had when the rules went in force: the same
rule kept over an edit starts again from none, while its Prometheus counter goes on."""

from __future__ import annotations

import re

import pytest
from confluent_kafka import Producer

from kproxy.admin.book import RuleBook
from kproxy.cli import main
from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.live_rules import LiveRules
from kproxy.rules import load_text
from kproxy.subcommands.rules_admin import duration
from kproxy.testing import Broker, running_proxy
from tests.support.e2e import create_topic, unique
from tests.test_admin_api import admin_of

RULES = """\
rules:
  - id: meant-for-orders
    match: {api: produce, topic: order}
    actions: [{delay: {ms: 1}}]
  - id: orders
    match: {api: produce, topic: "orders-*"}
    actions: [{delay: {ms: 1}}]
  - id: switched-off
    enabled: false
    match: {api: fetch}
    actions: [{delay: {ms: 1}}]
"""


def test_a_rule_that_never_fired_is_shown_beside_its_age(tansu: Broker, capsys: pytest.CaptureFixture[str]) -> None:
    topic = unique("orders-")
    create_topic(tansu.bootstrap, topic, 1)
    with running_proxy(tansu.bootstrap, admin__listen="127.0.0.1:0") as proxy:
        admin = admin_of(proxy)
        admin.apply({"rules": [
            {"id": "meant-for-orders", "match": {"api": "produce", "topic": "order"},
             "actions": [{"delay": {"ms": 1}}]},
            {"id": "orders", "match": {"api": "produce", "topic": "orders-*"}, "actions": [{"delay": {"ms": 1}}]},
            {"id": "switched-off", "enabled": False, "match": {"api": "fetch"}, "actions": [{"delay": {"ms": 1}}]},
        ]})
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "linger.ms": 0})
        for i in range(5):
            producer.produce(topic, value=b"%d" % i)
            producer.flush(15)  # one Produce request each
        listing = admin.rules()
        by_id = {r["id"]: r for r in listing["rules"]}
        assert by_id["meant-for-orders"]["hits_since_load"] == 0
        assert by_id["orders"]["hits_since_load"] == sum(by_id["orders"]["hits"].values()) >= 5
        assert by_id["switched-off"]["hits_since_load"] is None  # cannot fire: not "never fired"
        assert listing["age_seconds"] >= 0 and listing["loaded_at"] is not None

        report = admin.faults_report()
        assert [entry["id"] for entry in report["never_fired"]] == ["meant-for-orders"]
        assert report["never_fired"][0]["age_seconds"] >= 0
        assert {f["rule"] for f in report["faults"]} == {"orders"}
        assert admin.faults_report(rule="orders")["never_fired"] == []

        assert main(["rules", "list", "--admin", admin.url]) == 0
        table = capsys.readouterr().out.splitlines()
        assert re.search(r"  loaded \d+s ago$", table[0]), table[0]
        assert table[1].split() == ["ID", "ENABLED", "DRY_RUN", "HITS", "DRY_RUN_HITS", "SINCE_LOAD", "ACTIONS",
                                    "STATE"]
        rows = {line.split()[0]: line for line in table[2:]}
        assert re.search(r" never fired in \d+s  delay$", rows["meant-for-orders"]), rows
        assert re.search(r" yes +no +\d+ +0 +\d+ +delay$", rows["orders"]), rows
        assert re.search(r" no +no +0 +0 +- +delay$", rows["switched-off"]), rows

        assert main(["rules", "faults", "--admin", admin.url]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert re.fullmatch(r"never fired: rule=meant-for-orders since load \d+s ago", lines[-1]), lines
        assert all("rule=orders" in line for line in lines[:-1]) and len(lines) >= 6

        # An edit of another rule leaves this one running: its hits since load go on.
        before = sum(by_id["orders"]["hits"].values())
        admin.disable("switched-off")
        again = {r["id"]: r for r in admin.rules()["rules"]}
        assert again["orders"]["hits_since_load"] == sum(again["orders"]["hits"].values()) == before
        assert [e["id"] for e in admin.faults_report()["never_fired"]] == ["meant-for-orders"]
        # An edit of the rule itself starts it afresh: since load from 0, the total goes on.
        admin.put({"id": "orders", "match": {"api": "produce", "topic": "orders-*"}, "actions": [{"delay": {"ms": 2}}]})
        again = {r["id"]: r for r in admin.rules()["rules"]}
        assert again["orders"]["hits_since_load"] == 0 and sum(again["orders"]["hits"].values()) == before
        assert [e["id"] for e in admin.faults_report()["never_fired"]] == ["meant-for-orders", "orders"]
        producer.produce(topic, value=b"late")
        assert producer.flush(15) == 0
        assert admin.rule("orders")["hits_since_load"] >= 1


def test_the_age_is_the_wall_clock_since_the_rules_went_in_force() -> None:
    now = [1_000.0]
    live = LiveRules(load_text(RULES), counts=FaultStats(), wall_clock=lambda: now[0])
    book = RuleBook(live)
    now[0] += 252.5
    listing = book.listing()
    assert listing["loaded_at"] == 1_000.0 and listing["age_seconds"] == 252.5
    assert [r["age_seconds"] for r in listing["rules"]] == [252.5] * 3
    book.add({"id": "later", "match": {"api": "metadata"}, "actions": [{"delay": {"ms": 1}}]})
    now[0] += 3
    assert book.listing()["age_seconds"] == 3


def test_a_big_rule_set_notes_its_counts_over_turns_of_the_loop() -> None:
    """Past SERIES_CHUNK series the counts at load are noted in steps after the swap (put_in_force);
    once done, every rule's count since load is its hits less those."""
    import trio

    from kproxy.policy.live_rules import SERIES_CHUNK

    rules = "rules:\n" + "".join(f"  - id: r{i}\n    match: {{api: produce}}\n    continue: true\n"
                                 f"    actions: [{{delay: {{ms: 1}}}}]\n" for i in range(SERIES_CHUNK + 10))
    counts = FaultStats()
    live = LiveRules(load_text(rules), counts=counts)
    counts.hits[("r3", "delay", "false")] = 7  # counted under the first load
    turns = []

    async def put() -> None:
        async def turn() -> None:
            turns.append(live.injector.load_noted if live.injector is not None else None)
            await trio.lowlevel.checkpoint()
        await live.put_in_force(live.prepare(load_text(rules)), origin="test", turn=turn)

    trio.run(put)
    assert turns[0] is False and live.injector is not None and live.injector.load_noted
    counts.hits[("r3", "delay", "false")] += 1
    by_id = {r["id"]: r for r in RuleBook(live).listing()["rules"]}
    assert by_id["r3"]["hits_since_load"] == 1 and by_id["r4"]["hits_since_load"] == 0


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.9, "59s"), (252, "4m12s"), (3600, "1h00m"),
                                               (7500, "2h05m"), (273600, "3d04h")])
def test_durations_read_to_the_unit_that_matters(seconds: float, text: str) -> None:
    assert duration(seconds) == text
