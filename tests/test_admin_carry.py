"""An admin edit of one rule leaves the other rules running (kproxy/admin/book.py, policy/live_rules.py).

A :class:`RuleBook` over a :class:`LiveRules` on a hand-set clock, and a real
:class:`~kproxy.proxy.session.Session` whose policy reads it, sans-IO: the rules an edit leaves
unchanged keep their counters, the start of their time conditions, their throttle buckets and their
seeded draws; the rule edited, and every rule after a whole replacement or a reset, start afresh.
"""

from __future__ import annotations

import struct
from typing import Any

from kproxy.admin.book import RuleBook
from kproxy.admin.listing import listing
from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.live_rules import LiveRules
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.commands import ForwardUpstream, SendToClient
from kproxy.proxy.session import Session
from kproxy.rules import load_text
from tests.support.clock import Clock
from tests.test_rules_session import Driver, heartbeat, heartbeat_answer, produce, produce_answer

OTHER = {"id": "other", "match": {"api": "metadata"}, "actions": [{"delay": {"ms": 5}}]}


class Client:
    """One connection; :meth:`send` says what became of one Produce: ``"forwarded"`` (answered by
    the broker at once), ``"held"`` (forwarded, its answer held) or ``"answered"`` (by a rule)."""

    def __init__(self, live: LiveRules, clock: Clock) -> None:
        self.clock = clock
        self.session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), clock=clock,
                               policy=live.policy("127.0.0.1:5555"))
        self.next_id = 0

    def send(self, api: str = "produce") -> str:
        self.next_id += 1
        request, answer = ((produce(self.next_id, acks=1), produce_answer(self.next_id)) if api == "produce"
                           else (heartbeat(self.next_id), heartbeat_answer(self.next_id)))
        commands = self.session.receive_client(request, self.clock.now)
        if not any(isinstance(c, ForwardUpstream) for c in commands):
            assert any(isinstance(c, SendToClient) for c in commands)
            return "answered"
        after = self.session.receive_upstream(answer)
        return "forwarded" if any(isinstance(c, SendToClient) for c in after) else "held"


def setup(text: str) -> tuple[LiveRules, RuleBook, Client, Clock]:
    clock = Clock()
    live = LiveRules(load_text(text), counts=FaultStats(), clock=clock, wall_clock=clock)
    return live, RuleBook(live), Client(live, clock), clock


FIRST_3 = """
rules:
  - id: first3
    match: {api: produce, schedule: {first: 3}}
    actions: [{inject_error: {error: NOT_LEADER_OR_FOLLOWER}}]
"""


def test_a_first_3_rule_fires_3_times_in_all_across_an_unrelated_add() -> None:
    _, book, client, _ = setup(FIRST_3)
    assert [client.send() for _ in range(2)] == ["answered"] * 2
    book.add(OTHER)
    assert [client.send() for _ in range(3)] == ["answered", "forwarded", "forwarded"], \
        "the rule's counter went on: one hit left, not three"


def test_the_rule_an_edit_changes_or_enables_again_starts_afresh() -> None:
    _, book, client, _ = setup(FIRST_3)
    assert [client.send() for _ in range(3)] == ["answered"] * 3
    book.put("first3", {"match": {"api": "produce", "schedule": {"first": 2}},
                        "actions": [{"inject_error": {"error": "NOT_LEADER_OR_FOLLOWER"}}]})
    assert [client.send() for _ in range(3)] == ["answered", "answered", "forwarded"]
    book.set_state("first3", enabled=False)
    assert client.send() == "forwarded"
    book.set_state("first3", enabled=True)
    assert [client.send() for _ in range(3)] == ["answered", "answered", "forwarded"]


def test_replacing_every_rule_or_a_reset_starts_every_rule_afresh() -> None:
    _, book, client, _ = setup(FIRST_3)
    assert [client.send() for _ in range(3)] == ["answered"] * 3
    book.reset()
    assert client.send() == "answered", "a reset to the file's rules is a fresh load"
    book.apply({"rules": [{"id": "first3", "match": {"api": "produce", "schedule": {"first": 3}},
                           "actions": [{"inject_error": {"error": "NOT_LEADER_OR_FOLLOWER"}}]}]})
    assert [client.send() for _ in range(4)] == ["answered"] * 3 + ["forwarded"]


def test_a_time_window_keeps_its_start_across_a_delete_of_another_rule() -> None:
    _, book, client, clock = setup("""
rules:
  - id: ten-seconds
    match: {api: produce, schedule: {after_seconds: 2, for_seconds: 10}}
    actions: [{inject_error: {error: NOT_LEADER_OR_FOLLOWER}}]
  - id: other
    match: {api: metadata}
    actions: [{delay: {ms: 5}}]
""")
    clock.now += 9
    book.delete("other")
    assert client.send() == "answered"
    clock.now += 3.5  # 12.5 s after the load: the window (2 s to 12 s) is over
    assert client.send() == "forwarded", "the window counted from the load, not from the delete"
    assert listing(book.view())["rules"][0]["age_seconds"] == 12.5


def test_a_throttle_bucket_stays_in_debt_across_an_unrelated_add() -> None:
    live, book, client, clock = setup("""
rules:
  - id: one-a-second
    match: {api: produce}
    actions: [{throttle: {requests_per_second: 1, burst_seconds: 1}}]
""")
    assert client.send() == "forwarded"  # the bucket's one token
    assert client.send() == "held"
    book.add(OTHER)
    # Another connection: its answer waits behind no held answer of the first one.
    assert Client(live, clock).send() == "held", "the bucket was handed over, still in debt"


def test_seeded_draws_go_on_where_they_were_across_an_add() -> None:
    text = """
seed: 7
rules:
  - id: half
    match: {api: produce, probability: 0.5}
    actions: [{inject_error: {error: NOT_LEADER_OR_FOLLOWER}}]
"""
    _, _, plain, _ = setup(text)
    expected = [plain.send() for _ in range(40)]
    _, book, client, _ = setup(text)
    seen = [client.send() for _ in range(20)]
    book.add(OTHER)
    seen += [client.send() for _ in range(20)]
    assert seen == expected
    assert "answered" in seen and "forwarded" in seen


def test_the_listing_counts_a_carried_rules_hits_from_its_own_load() -> None:
    _, book, client, clock = setup(FIRST_3)
    client.send()
    clock.now += 4
    book.add(OTHER)
    clock.now += 1
    client.send()
    rules: list[dict[str, Any]] = listing(book.view())["rules"]
    assert [(r["id"], r["hits_since_load"], r["age_seconds"]) for r in rules] == [
        ("first3", 2, 5.0), ("other", 0, 1.0)]


def test_a_black_hole_heals_at_its_rules_own_end_across_an_unrelated_add() -> None:
    d = Driver("""
rules:
  - id: hole
    match: {api: produce, schedule: {for_seconds: 10}}
    actions: [blackhole]
""")
    book = RuleBook(d.live)
    d.client(produce(1, -1))  # the hole opens
    d.clock.now += 8
    book.add(OTHER)
    d.client(heartbeat(2))  # still in it
    d.clock.now += 3  # 11 s after the load: the rule's window is over, whatever was added at 8 s
    d.client(heartbeat(3))
    assert [struct.unpack_from(">i", f, 8)[0] for f in d.upstream] == [3]
