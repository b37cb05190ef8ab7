"""A client that reconnects draws afresh (kproxy/rules/engine.py's reproducibility contract).

Probability draws are keyed on the request's ordinal among its client id's requests of that api
key to that broker, over all its connections. Keyed per connection, the first Fetch of every new
connection drew the same number: a ``reset_connection`` drawn there reset every reconnect, and a
librdkafka consumer under rules/examples/broken-broker.yaml read nothing for as long as it ran.
"""

from __future__ import annotations

from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.live_rules import LiveRules
from kproxy.protocol.frame_builder import request_frame
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.commands import CloseConnection
from kproxy.proxy.session import Session
from kproxy.rules import load_text
from tests.support.clock import Clock

FETCH = 1
RULES = """\
seed: 11
rules:
  - id: resets
    match: {api: fetch, probability: 0.5}
    actions: [reset_connection]
"""


def first_fetch_resets(live: LiveRules, clock: Clock, client_id: str) -> bool:
    """Whether a new connection's first Fetch (of ``client_id``) is reset."""
    session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), clock=clock,
                      policy=live.policy("127.0.0.1:5555"))
    commands = session.receive_client(request_frame(FETCH, 12, 1, client_id=client_id), clock.now)
    return any(isinstance(c, CloseConnection) for c in commands)


def test_each_new_connection_of_a_client_draws_afresh() -> None:
    clock = Clock()
    live = LiveRules(load_text(RULES), counts=FaultStats(), clock=clock)
    outcomes = [first_fetch_resets(live, clock, "rdkafka") for _ in range(40)]
    assert any(outcomes) and not all(outcomes), outcomes
    assert 8 <= sum(outcomes) <= 32, "a fair coin over 40 reconnects"


def test_the_draws_replay_with_the_same_seed_and_restart_with_a_new_rule_set() -> None:
    runs = []
    for _ in range(2):
        clock = Clock()
        live = LiveRules(load_text(RULES), counts=FaultStats(), clock=clock)
        runs.append([first_fetch_resets(live, clock, c) for c in ("a", "b", "a", "a", "b") * 4])
    assert runs[0] == runs[1]
    clock = Clock()
    live = LiveRules(load_text(RULES), counts=FaultStats(), clock=clock)
    first = [first_fetch_resets(live, clock, "a") for _ in range(10)]
    live.replace(load_text(RULES), origin="test")
    assert [first_fetch_resets(live, clock, "a") for _ in range(10)] == first, "a new rule set counts afresh"
