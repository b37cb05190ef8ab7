"""The ``blackhole`` action (kproxy/rules/actions/blackhole.py) through its interface: its reader,
and its verdict in a real Session, sans-IO (requests swallowed or forwarded with their answers
lost, while its rule is in force). With real clients: tests/test_rules_blackhole_e2e.py."""

from __future__ import annotations

import struct

import pytest

from kproxy.proxy.commands import CloseKind
from kproxy.rules import RulesError, load_text
from tests.test_rules_session import (
    HOLE_FOR_2S,
    Driver,
    heartbeat,
    heartbeat_answer,
    produce,
    produce_answer,
    rules,
    upstream_ids,
)


def test_slow_close_sends_nothing_upstream_answers_nothing_and_ends_later() -> None:
    d = Driver(rules("blackhole: {close_after_ms: 500}"))
    d.client(heartbeat(1))
    d.client(produce(2, -1), produce(3, 0))
    assert d.upstream == [], "a black hole lets no request through to the broker"
    assert d.to_client == [] and d.closed is None
    assert d.session.in_flight_count == 0, "nothing waits for an answer that will never come"
    d.tick(0.6)
    assert d.closed is not None and d.closed.kind is CloseKind.DELIBERATE


@pytest.mark.parametrize("action", ["blackhole", "blackhole: {close_after_ms: 60000}"])
def test_a_black_hole_begins_at_the_request_hit_and_earlier_answers_still_flow(action: str) -> None:
    d = Driver(rules(action, "{api: produce, schedule: {after_requests: 1}}"))
    d.client(produce(1, -1), heartbeat(2), produce(3, -1), heartbeat(4), produce(5, 0))
    assert [struct.unpack_from(">i", f, 8)[0] for f in d.upstream] == [1, 2]
    d.broker(produce_answer(1), heartbeat_answer(2))
    assert d.answered() == [1, 2]
    for i in range(6, 2006):  # read and discarded: nothing piles up, ids are free again
        d.client(heartbeat(i % 7 + 6))
    assert len(d.upstream) == 2 and d.answered() == [1, 2] and d.closed is None
    assert d.session.in_flight_count == 0
    # Produce 3 and 5 met the rule (the policy is still asked, so its counts say what it met).
    assert d.injector.counts.connection_faults == {("r1", action.split(":")[0]): 2}


def test_the_observer_sees_each_swallowed_request_complete_with_no_response() -> None:
    from kproxy.proxy.exchange import Exchange

    class Seen:
        def __init__(self) -> None:
            self.requests: list[int] = []
            self.completed: list[tuple[int, bytes | None, tuple[str, ...]]] = []

        def request(self, ex: Exchange) -> None:
            self.requests.append(ex.correlation_id)

        def complete(self, ex: Exchange) -> None:
            self.completed.append((ex.correlation_id, ex.response, tuple(d[1] for d in ex.rule_decisions)))

    d = Driver(rules("blackhole"))
    seen = Seen()
    d.session.observer = seen
    d.client(heartbeat(1), produce(2, -1))
    d.session.report()
    assert seen.requests == [1, 2]
    assert seen.completed == [(1, None, ("blackhole",)), (2, None, ())]


@pytest.mark.parametrize("action", ["blackhole: {forward: true}", "blackhole: {close_after_ms: 500, forward: true}"])
def test_forward_true_sends_requests_on_and_swallows_their_answers(action: str) -> None:
    d = Driver(rules(action))
    d.client(heartbeat(1))
    d.client(produce(2, -1), heartbeat(3))
    assert [struct.unpack_from(">i", f, 8)[0] for f in d.upstream] == [1, 2, 3]
    assert d.session.in_flight_count == 3, "the broker's answers are awaited, then swallowed"
    d.broker(heartbeat_answer(1), produce_answer(2), heartbeat_answer(3))
    assert d.to_client == [] and d.closed is None and d.session.in_flight_count == 0


@pytest.mark.parametrize("action", ["blackhole", "blackhole: {forward: true}"])
def test_a_black_hole_ends_with_its_time_window_and_later_requests_flow_in_order(action: str) -> None:
    d = Driver(rules(action, HOLE_FOR_2S))
    d.client(heartbeat(1), produce(2, -1), heartbeat(3))  # 1 before the hole, 2 meets it, 3 in it
    forwarded = action != "blackhole"
    assert upstream_ids(d) == ([1, 2, 3] if forwarded else [1])
    d.clock.now += 2.5  # the rule's window is over: the connection heals
    d.client(produce(4, -1), heartbeat(5))
    assert upstream_ids(d) == ([1, 2, 3, 4, 5] if forwarded else [1, 4, 5])
    d.broker(heartbeat_answer(1))
    if forwarded:
        d.broker(produce_answer(2), heartbeat_answer(3))  # answered by the broker, swallowed by the hole
    d.broker(produce_answer(4), heartbeat_answer(5))
    # The swallowed requests stay unanswered and hold nothing back: the later answers leave in order.
    assert d.answered() == [1, 4, 5] and d.closed is None and d.session.in_flight_count == 0


def test_a_slow_close_whose_rule_ends_first_does_not_close() -> None:
    d = Driver(rules("blackhole: {close_after_ms: 5000}", HOLE_FOR_2S))
    d.client(produce(1, -1))
    assert d.wake is not None
    d.tick(2.5)
    d.client(heartbeat(2))
    d.tick(3.0)  # past the close's time
    assert d.closed is None and upstream_ids(d) == [2]


@pytest.mark.parametrize("how", ["reload", "delete", "disable"])
def test_a_black_hole_ends_when_its_rule_is_reloaded_away_deleted_or_disabled(how: str) -> None:
    d = Driver(rules("blackhole", "{api: produce}") + """  - id: other
    match: {api: metadata}
    actions: [drop_response]
""")
    d.client(produce(1, -1), heartbeat(2))
    assert d.upstream == []
    if how == "reload":
        d.live.replace(load_text(rules("blackhole", "{api: produce}", rule_id="renamed")), origin="test")
    elif how == "delete":
        d.live.replace(load_text(rules("drop_response", "{api: metadata}", rule_id="other")), origin="test")
    else:
        d.live.replace(load_text(rules("blackhole", "{api: produce}").replace("    match:", "    enabled: false\n"
                                                                              "    match:")), origin="test")
    d.client(heartbeat(3))
    d.broker(heartbeat_answer(3))
    assert upstream_ids(d) == [3] and d.answered() == [3]


def test_a_black_hole_lasts_while_its_rule_does_though_it_matches_one_request() -> None:
    d = Driver(rules("blackhole", "{api: produce, schedule: {first: 1}}"))
    d.client(produce(1, -1))
    d.clock.now += 3600
    d.client(heartbeat(2), produce(3, -1))
    assert d.upstream == [] and d.to_client == []


def test_a_later_rule_does_not_answer_out_of_a_black_hole() -> None:
    text = rules("blackhole", "{api: produce}") + """  - id: r2
    match: {api: heartbeat}
    actions:
      - delay: {ms: 10}
"""
    d = Driver(text)
    d.client(produce(1, -1), heartbeat(2))
    d.tick(0.05)
    assert d.upstream == [] and d.to_client == [] and d.session.in_flight_count == 0


def test_blackhole_reads_forward_and_close_after_ms_and_defaults_to_forwarding_nothing() -> None:
    from kproxy.rules.actions.blackhole import Blackhole
    from kproxy.rules.actions.slow_close import SlowClose

    assert load_text(rules("blackhole")).rules[0].actions == (Blackhole(forward=False),)
    assert load_text(rules("blackhole: {forward: true}")).rules[0].actions == (Blackhole(forward=True),)
    assert load_text(rules("blackhole: {close_after_ms: 5, forward: true}")).rules[0].actions == (
        Blackhole(True, 5.0),)
    assert load_text(rules("slow_close: {delay_ms: 5}")).rules[0].actions == (SlowClose(5.0),)
    with pytest.raises(RulesError) as bad:
        load_text(rules("blackhole: {forward: 1}"), "r.yaml")
    assert [str(p) for p in bad.value.problems] == [
        "r.yaml:7: rules[0].actions[0].blackhole.forward: expected true or false, got an integer '1'"]


def test_a_black_hole_of_a_flapping_rule_heals_at_the_end_of_each_window() -> None:
    d = Driver("""
rules:
  - id: hole
    match: {api: produce, schedule: {for_seconds: 2, period_seconds: 10}}
    actions: [blackhole]
""")
    d.client(produce(1, -1))  # 0 s: in the first window: the hole opens
    d.clock.now += 1
    d.client(heartbeat(2))  # swallowed
    d.clock.now += 2  # 3 s: the window closed: healed
    d.client(heartbeat(3))
    d.clock.now += 8  # 11 s: the second window
    d.client(produce(4, -1), heartbeat(5))
    d.clock.now += 2  # 13 s: closed again
    d.client(heartbeat(6))
    assert [struct.unpack_from(">i", f, 8)[0] for f in d.upstream] == [3, 6]
