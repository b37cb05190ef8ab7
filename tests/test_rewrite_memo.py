"""The rewriter's memo of repeated bodies must never serve a stale address map."""

from __future__ import annotations

import struct

from kproxy.host_port import HostPort
from kproxy.protocol import decode_response, default_body, encode_response
from kproxy.protocol.message_schemas import MessageType
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap

METADATA = 3


def metadata_frame(host: str, port: int, correlation_id: int = 1) -> bytes:
    body = default_body(METADATA, 1, MessageType.RESPONSE)
    body["brokers"] = [{"node_id": 1, "host": host, "port": port, "rack": None}]
    payload = encode_response(correlation_id, METADATA, 1, body)
    return struct.pack(">i", len(payload)) + payload


def advertised(frame: bytes) -> tuple[str, int]:
    broker = decode_response(frame[4:], METADATA, 1).body["brokers"][0]
    return broker["host"], broker["port"]


def test_broker_moving_away_and_back_is_followed_through_the_memo() -> None:
    addresses = AddressMap("proxy.local", 40000)
    rewriter = ResponseRewriter(addresses)
    first = rewriter.rewrite(METADATA, 1, metadata_frame("kafka-a", 9092), 8)
    assert first is not None and advertised(first.frame) == ("proxy.local", 40001)
    assert addresses.routes[1].upstream == HostPort("kafka-a", 9092)

    moved = rewriter.rewrite(METADATA, 1, metadata_frame("kafka-b", 9093), 8)
    assert moved is not None and advertised(moved.frame) == ("proxy.local", 40001)
    assert addresses.routes[1].upstream == HostPort("kafka-b", 9093)

    back = rewriter.rewrite(METADATA, 1, metadata_frame("kafka-a", 9092), 8)  # same bytes as the first: a memo hit
    assert back is not None and back.frame == first.frame
    assert addresses.routes[1].upstream == HostPort("kafka-a", 9092), "the memo hit must re-teach the map"
    assert [r.node_id for r in back.routes] == [1]


def test_memo_is_bounded() -> None:
    rewriter = ResponseRewriter(AddressMap("proxy.local", 40000))
    for port in range(1, 3000):
        rewriter.rewrite(METADATA, 1, metadata_frame("k" * 5000, port), 8)
    assert rewriter._memo_bytes <= 16 * 1024 * 1024
