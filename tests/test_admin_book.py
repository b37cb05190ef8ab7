"""The admin API's rule-editing logic (kproxy/admin/book.py) driving a real Session, sans-IO.

A :class:`RuleBook` over a :class:`LiveRules`, and a real :class:`~kproxy.proxy.session.Session`
whose policy reads it: what the API changes is what the next request meets.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from kproxy.admin.book import RECENT_FAULTS, AdminError, RuleBook
from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.live_rules import LiveRules
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.commands import ForwardUpstream, SendToClient
from kproxy.proxy.session import Session
from kproxy.rules import load_text
from tests.test_rules_session import produce, produce_answer

FAIL_PRODUCE = {"id": "fail", "match": {"api": "produce"},
                "actions": [{"inject_error": {"error": "NOT_LEADER_OR_FOLLOWER"}}]}


class Client:
    """One client connection's session; ``send`` says whether the request reached the broker."""

    def __init__(self, live: LiveRules) -> None:
        self.session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)),
                               policy=live.policy("127.0.0.1:5555"))
        self.next_id = 0

    def send(self) -> bool:
        self.next_id += 1
        forwarded = False
        for command in self.session.receive_client(produce(self.next_id, acks=1), 0.0):
            if isinstance(command, ForwardUpstream):
                forwarded = True
            else:
                assert isinstance(command, SendToClient)
        if forwarded:
            self.session.receive_upstream(produce_answer(self.next_id))
        return forwarded


def test_a_connection_opened_with_no_rules_meets_the_rules_added_later() -> None:
    live = LiveRules(None, counts=FaultStats())
    book = RuleBook(live)
    client = Client(live)  # opened before any rule exists
    assert client.send()
    book.add(FAIL_PRODUCE)
    assert not client.send(), "answered by the rule"
    book.set_state("fail", enabled=False)
    assert client.send()
    book.set_state("fail", enabled=True, dry_run=True)
    assert client.send(), "a dry run does nothing"
    assert live.counts.hits == {("fail", "inject_error", "false"): 1, ("fail", "inject_error", "true"): 1}
    book.delete("fail")
    assert client.send()
    assert live.counts.hits == {}, "a rule deleted takes its series with it"


def test_recent_faults_are_newest_first_and_bounded() -> None:
    live = LiveRules(None, counts=FaultStats())
    book = RuleBook(live)
    book.add(FAIL_PRODUCE)
    client = Client(live)
    for _ in range(RECENT_FAULTS + 5):
        assert not client.send()
    faults = book.faults(limit=5 * RECENT_FAULTS)
    assert len(faults) == RECENT_FAULTS == 1000
    assert [f["correlation_id"] for f in faults[:2]] == [RECENT_FAULTS + 5, RECENT_FAULTS + 4]
    assert faults[-1]["correlation_id"] == 6, "the oldest fell out"
    assert faults[0] | {"time": 0} == {
        "time": 0, "rule": "fail", "action": "inject_error", "connection": "127.0.0.1:5555",
        "correlation_id": RECENT_FAULTS + 5, "api": "produce", "topics": ("orders",), "partitions": (0,),
        "detail": "inject_error NOT_LEADER_OR_FOLLOWER respond", "dry_run": False}
    assert book.faults(limit=3, rule="other") == []


def test_the_ring_is_filled_with_fault_logging_off(caplog: pytest.LogCaptureFixture) -> None:
    live = LiveRules(None, counts=FaultStats())
    book = RuleBook(live)
    book.add(FAIL_PRODUCE)
    with caplog.at_level(logging.WARNING, "kproxy.faults"):
        Client(live).send()
    assert len(book.faults()) == 1


def test_put_keeps_the_position_and_apply_and_reset() -> None:
    live = LiveRules(load_text("seed: 3\nrules:\n  - {id: a, match: {api: fetch}, actions: [drop_response]}\n",
                               "rules.yaml"), counts=FaultStats())
    book = RuleBook(live)
    book.add({"id": "b", "match": {}, "actions": [{"delay": {"ms": 1}}]})
    book.put("a", {"match": {"api": "produce"}, "actions": [{"delay": {"ms": 2}}]})
    assert [(r["id"], r["api"], r["source"]) for r in book.listing()["rules"]] == [
        ("a", ["produce"], "admin"), ("b", None, "admin")]
    with pytest.raises(AdminError) as refused:
        book.put("a", {"id": "c", "match": {}, "actions": [{"delay": {"ms": 2}}]})
    assert refused.value.status == 400
    book.apply({"rules": [FAIL_PRODUCE]})
    assert [r["id"] for r in book.listing()["rules"]] == ["fail"]
    assert book.listing()["seed"] == 0, "a whole rule file brings its own seed"
    book.reset()
    listing = book.listing()
    assert (listing["diverged"], listing["seed"], [r["id"] for r in listing["rules"]]) == (False, 3, ["a"])
    assert live.origin == "rules.yaml"


def test_an_edit_built_while_the_file_is_reloaded_is_planned_again_from_the_reloaded_rules() -> None:
    """RuleBook.edit plans in a worker thread; a reload put in force meanwhile is not undone: the edit
    is planned again from it, and what goes in force is the reloaded rules plus the edit."""
    import threading

    import trio

    from kproxy.admin.book import Draft, plan_add

    live = LiveRules(load_text("rules:\n  - {id: a, match: {api: fetch}, actions: [drop_response]}\n", "rules.yaml"),
                     counts=FaultStats())
    book = RuleBook(live)
    reloaded = load_text("rules:\n  - {id: b, match: {api: fetch}, actions: [drop_response]}\n", "rules.yaml")
    planning = threading.Event()
    go_on = threading.Event()
    drafts: list[list[str]] = []

    def planner(draft: Draft) -> Any:
        drafts.append([r.id for r in draft.rules])
        if len(drafts) == 1:
            planning.set()
            assert go_on.wait(10)
        return plan_add(draft, FAIL_PRODUCE)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(book.edit, planner)
            with trio.fail_after(10):
                while not planning.is_set():
                    await trio.sleep(0.01)
            live.replace(reloaded, origin="rules.yaml")  # the file reloaded while the edit is being built
            go_on.set()

    trio.run(main)
    assert drafts == [["a"], ["b"]], "planned again from the reloaded rules"
    assert [r.id for r in live.rules.rules] == ["b", "fail"]  # type: ignore[union-attr]
    assert book.listing()["diverged"] is True
