"""FrameFacts read from the session's Exchange (the proxy's path) say what they say from a decoded header."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kproxy.protocol.codes import ApiKey
from kproxy.protocol.frame_builder import request_frame
from kproxy.protocol.headers import request_body_offset
from kproxy.protocol.mutation import request_header
from kproxy.protocol.request_fields import RequestHeaderMemo, request_client_id
from kproxy.proxy.session import Exchange
from kproxy.rules.frame_facts import FrameFacts

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
    from kproxy.policy.peer import client_ip

    ip = client_ip(peer)
    plain = ipaddress.ip_address(peer.rpartition(":")[0].strip("[]"))
    assert ip is not None and ip == plain and hash(ip) == hash(plain) and {ip: 1}[plain] == 1
    net = ipaddress.ip_network("10.0.0.0/8" if plain.version == 4 else "::/0")
    assert (ip in net) == (plain in net)


def test_policy_client_address_of_a_name_is_none() -> None:
    from kproxy.policy.peer import client_ip

    assert client_ip("broker.example:9092") is None


# The client id field of a request header as a hostile or a sloppy client may send it: int16 length
# (-1 null; other negatives; longer than what follows) and bytes (UTF-8 or not); then what follows it
# (in header v2 the tagged fields: none, one, unreadable). Header versions: v2 (Heartbeat v4,
# Produce v9), v1 (Heartbeat v3, ControlledShutdown v1), v0 (ControlledShutdown v0: no client id,
# whatever the bytes at its place say).
CLIENT_ID_FIELDS = [struct.pack(">h", len(b)) + b for b in (b"app-1", b"app-2", b"", "b\u00e9".encode(), b"\xff\xfe")]
CLIENT_ID_FIELDS += [b"\xff\xff", b"\xff\xf9", struct.pack(">h", 50) + b"app-1", b"\x00"]
AFTER_CLIENT_ID = [b"", b"\x00", b"app-1", b"\x00\x00\x00\x01", b"-" * 60, b"\x01\x00\x02hi\x00\x00", b"\x01\x00\x09hi"]
HEADERS = [(12, 4), (12, 3), (7, 0), (7, 1), (0, 9)]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(HEADERS), st.sampled_from(CLIENT_ID_FIELDS),
                          st.sampled_from(AFTER_CLIENT_ID)), min_size=1, max_size=12))
@example([((12, 4), CLIENT_ID_FIELDS[7], b""), ((12, 4), CLIENT_ID_FIELDS[7], b"-" * 60)])  # past the end, then not
@example([((7, 1), CLIENT_ID_FIELDS[0], b""), ((7, 0), CLIENT_ID_FIELDS[0], b"")])  # the same bytes, no client id
@example([((12, 3), CLIENT_ID_FIELDS[0], AFTER_CLIENT_ID[5]), ((12, 4), CLIENT_ID_FIELDS[0], AFTER_CLIENT_ID[5])])
def test_header_memo_answers_what_reading_each_header_answers(requests: list[tuple[tuple[int, int], bytes, bytes]]
                                                              ) -> None:
    """A connection's requests in any order, hostile headers among them: the memo (which compares
    bytes in place with the last header read) answers exactly what reading each one answers."""
    memo = RequestHeaderMemo()
    for (api_key, version), field, rest in requests:
        frame = struct.pack(">ihhi", 0, api_key, version, 1) + field + rest
        frame = struct.pack(">i", len(frame) - 4) + frame[4:]
        expected = request_client_id(frame, api_key, version), request_body_offset(frame, api_key, version)
        assert memo.read(frame, api_key, version) == expected, frame
