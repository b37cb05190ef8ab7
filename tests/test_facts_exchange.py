"""FrameFacts read from the session's Exchange (the proxy's path) say what they say from a decoded header."""

from __future__ import annotations

import ipaddress

import pytest

from kproxy.protocol.builders import request_frame
from kproxy.protocol.frame_edit import request_header
from kproxy.protocol.tables import ApiKey
from kproxy.proxy.session import Exchange
from kproxy.rules.facts import FrameFacts

PRODUCE, FIND_COORDINATOR = int(ApiKey.PRODUCE), int(ApiKey.FIND_COORDINATOR)


def exchange_of(frame: bytes, api_key: int, version: int, correlation_id: int) -> Exchange:
    return Exchange(correlation_id, api_key, version, len(frame), 0.0, 0.0, frame)


@pytest.mark.parametrize("version", [3, 7, 9, 11])
def test_produce_facts_from_exchange_equal_header_facts(version: int) -> None:
    frame = request_frame(PRODUCE, version, 5, client_id="batch-1", transactional_id="tx-1", acks=0,
                          timeout_ms=100, topic_data=[{"name": "orders", "partition_data": [
                              {"index": 2, "records": None}, {"index": 4, "records": None}]}])
    from_exchange = FrameFacts(frame, exchange_of(frame, PRODUCE, version, 5))
    from_header = FrameFacts(frame, request_header(frame))
    for facts in (from_exchange, from_header):
        assert (facts.api_key, facts.api_version, facts.correlation_id, facts.client_id) == \
            (PRODUCE, version, 5, "batch-1")
        assert facts.topics() == {"orders": frozenset({2, 4})}
        assert facts.acks() == 0 and facts.transactional_id() == "tx-1"


def test_group_from_exchange() -> None:
    frame = request_frame(FIND_COORDINATOR, 3, 9, client_id="c", key="payments", key_type=0)
    facts = FrameFacts(frame, exchange_of(frame, FIND_COORDINATOR, 3, 9))
    assert facts.group_id() == "payments" and facts.client_id == "c"


def test_unreadable_header_gives_no_body_facts() -> None:
    """A client id length running past the frame: no body offset, so no topics and no acks (the
    rule does not match), never an exception."""
    good = request_frame(PRODUCE, 7, 3, client_id="x", acks=1, timeout_ms=100, topic_data=[])
    frame = good[:12] + b"\x7f\xff" + good[14:]
    facts = FrameFacts(frame, exchange_of(frame, PRODUCE, 7, 3))
    assert facts.topics() == {} and facts.acks() is None and facts.client_id is None


@pytest.mark.parametrize("peer", ["127.0.0.1:5000", "[::1]:5000", "[fe80::1%eth0]:9092", "10.1.2.3:1"])
def test_policy_client_address_is_the_plain_address(peer: str) -> None:
    """The policy's client address (its hash kept) equals, hashes and matches like ipaddress's own."""
    from kproxy.server.rule_policy import _client_ip

    ip = _client_ip(peer)
    plain = ipaddress.ip_address(peer.rpartition(":")[0].strip("[]"))
    assert ip is not None and ip == plain and hash(ip) == hash(plain) and {ip: 1}[plain] == 1
    net = ipaddress.ip_network("10.0.0.0/8" if plain.version == 4 else "::/0")
    assert (ip in net) == (plain in net)


def test_policy_client_address_of_a_name_is_none() -> None:
    from kproxy.server.rule_policy import _client_ip

    assert _client_ip("broker.example:9092") is None
