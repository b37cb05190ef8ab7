"""Big Metadata answers (over the memo's size) are walked whole once per distinct body, never skipped
for a body that differs, and still rewritten every time."""

from __future__ import annotations

import struct
from typing import Any

import pytest

import kproxy.proxy.address_rewrite as rewrite
from kproxy.host_port import HostPort
from kproxy.protocol import decode_response, default_body, encode_response
from kproxy.protocol.errors import DecodeError
from kproxy.protocol.message_schemas import MessageType, message_schema
from kproxy.proxy.address_rewrite import MEMO_MAX_BODY, ResponseRewriter
from kproxy.proxy.addresses import AddressMap

METADATA = 3


def big_metadata(host: str, port: int, version: int = 1, topics: int = 40, correlation_id: int = 1) -> bytes:
    body = default_body(METADATA, version, MessageType.RESPONSE)
    body["brokers"] = [{"node_id": 1, "host": host, "port": port, "rack": None}]
    body["controller_id"] = 1
    body["topics"] = [{"error_code": 0, "name": f"topic-{t:03d}", "is_internal": False, "partitions": [
        {"error_code": 0, "partition_index": p, "leader_id": 1, "leader_epoch": 0, "replica_nodes": [1],
         "isr_nodes": [1], "offline_replicas": []} for p in range(100)]} for t in range(topics)]
    schema = message_schema(METADATA, version, MessageType.RESPONSE)
    assert schema is not None
    schema_fields = {f.name for f in schema.fields}
    body = {k: v for k, v in body.items() if k in schema_fields}
    payload = encode_response(correlation_id, METADATA, version, body)
    return struct.pack(">i", len(payload)) + payload


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the whole-body walks (kproxy.proxy.address_rewrite._check_whole), which still run: each takes the
    response's codec from kproxy.protocol.messages (interpreted, looked up by name on every call in
    both builds, where _check_whole itself is called directly by compiled code) and walks the body with
    its ``skip``."""
    seen: list[int] = []
    real = rewrite.codec

    def counting(api_key: int, api_version: int, direction: MessageType) -> Any:
        c = real(api_key, api_version, direction)
        assert c is not None

        class Walked:
            schema = c.schema

            @staticmethod
            def skip(frame: bytes, body_offset: int) -> int:
                seen.append(len(frame))
                return c.skip(frame, body_offset)  # type: ignore[no-any-return]

        return Walked

    monkeypatch.setattr(rewrite, "codec", counting)
    return seen


def test_a_repeated_big_body_is_walked_once_and_rewritten_every_time(walks: list[int]) -> None:
    addresses = AddressMap("proxy.local", 40000)
    rewriter = ResponseRewriter(addresses)
    frame = big_metadata("kafka-a", 9092)
    assert len(frame) - 8 > MEMO_MAX_BODY
    outs = [rewriter.rewrite(METADATA, 1, big_metadata("kafka-a", 9092, correlation_id=c), 8) for c in (1, 2, 3)]
    assert len(walks) == 1
    for out in outs:
        assert out is not None
        assert decode_response(out.frame[4:], METADATA, 1).body["brokers"][0]["host"] == "proxy.local"
    assert addresses.routes[1].upstream == HostPort("kafka-a", 9092)

    moved = rewriter.rewrite(METADATA, 1, big_metadata("kafka-b", 9093), 8)  # another body: walked
    assert len(walks) == 2 and moved is not None
    assert addresses.routes[1].upstream == HostPort("kafka-b", 9093)


def test_the_same_bytes_with_more_after_them_are_still_refused(walks: list[int]) -> None:
    rewriter = ResponseRewriter(AddressMap("proxy.local", 40000))
    frame = big_metadata("kafka-a", 9092)
    assert rewriter.rewrite(METADATA, 1, frame, 8) is not None
    padded = struct.pack(">i", len(frame) - 4 + 3) + frame[4:] + b"\x00\x00\x00"
    with pytest.raises(DecodeError, match="left over"):
        rewriter.rewrite(METADATA, 1, padded, 8)


def test_the_same_bytes_under_another_version_are_walked_again(walks: list[int]) -> None:
    rewriter = ResponseRewriter(AddressMap("proxy.local", 40000))
    frame = big_metadata("kafka-a", 9092, version=1)
    rewriter.rewrite(METADATA, 1, frame, 8)
    with pytest.raises(DecodeError):
        rewriter.rewrite(METADATA, 2, frame, 8)  # v2 reads cluster_id after the brokers: these bytes are no v2 body
    assert len(walks) == 2
