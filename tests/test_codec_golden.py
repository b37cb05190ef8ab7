"""Golden vectors: exact frames taken from the project's protocol guides.

Each vector is a whole frame (4-byte size prefix included) written down as hex
here, as our own fixture. The test splits it with :class:`FrameSplitter`,
decodes it, checks the values the guide documents, and re-encodes it to the
very same bytes. The header-version rules the guides describe are checked
after the vectors.
"""

from __future__ import annotations

import zlib

import pytest

from kproxy.protocol import (
    FrameSplitter,
    MessageType,
    RequestHeader,
    ResponseHeader,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    frame,
    request_header_version,
    response_header_version,
)
from kproxy.protocol.headers import (
    decode_request_header,
    decode_response_header,
    encode_request_header,
    encode_response_header,
)
from kproxy.protocol.message_schemas import message_schema


def _hex(text: str) -> bytes:
    """Hex fixture to bytes; accepts spaces, newlines and ``0x`` prefixes."""
    return bytes.fromhex(text.replace("0x", "").replace("\n", " "))


def _single_payload(wire: bytes) -> bytes:
    """Split one whole frame out of ``wire`` (fed in two chunks) and check nothing is left."""
    splitter = FrameSplitter()
    cut = len(wire) // 2
    splitter.feed(wire[:cut])
    assert splitter.next_frame() is None
    splitter.feed(wire[cut:])
    payload = splitter.next_frame()
    assert payload is not None
    assert splitter.next_frame() is None
    assert splitter.buffered == 0
    assert splitter.consumed == len(wire)
    return payload


# -- Produce v0 request -------------------------------------------------------------------
# From the project's protocol guides: ../shared/seeds/000_*.txt, "Produce Request
# Example" and its "Hex Dump" (size 78, api key 0, version 0, correlation id 1, client
# id "foo", acks 1, timeout 1500, topic "test", partition 0, a 37-byte message set
# holding one v0 message: null key, value "hello world", CRC 0x73ACF77C).
PRODUCE_V0_REQUEST = _hex("""
0x00 0x00 0x00 0x4E 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x01
0x00 0x03 0x66 0x6F 0x6F 0x00 0x01 0x00 0x00 0x05 0xDC 0x00
0x00 0x00 0x01 0x00 0x04 0x74 0x65 0x73 0x74 0x00 0x00 0x00
0x01 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x25 0x00 0x00 0x00
0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x19 0x73 0xAC 0xF7
0x7C 0x00 0x00 0xFF 0xFF 0xFF 0xFF 0x00 0x00 0x00 0x0B 0x68
0x65 0x6C 0x6C 0x6F 0x20 0x77 0x6F 0x72 0x6C 0x64
""")


def test_produce_v0_request_golden() -> None:
    assert len(PRODUCE_V0_REQUEST) == 4 + 78
    payload = _single_payload(PRODUCE_V0_REQUEST)
    request = decode_request(payload)
    assert request.header == RequestHeader(0, 0, 1, "foo", 1, {}, 13)
    body = request.body
    assert body["acks"] == 1
    assert body["timeout_ms"] == 1500
    assert len(body["topic_data"]) == 1
    topic = body["topic_data"][0]
    assert topic["name"] == "test"
    assert len(topic["partition_data"]) == 1
    partition = topic["partition_data"][0]
    assert partition["index"] == 0
    records = partition["records"]
    assert isinstance(records, bytes)
    assert len(records) == 37
    # The message set, as the guide lays it out: offset 0, size 25, crc, magic 0,
    # attributes 0, null key, value "hello world".
    assert records[:8] == b"\x00" * 8
    assert int.from_bytes(records[8:12], "big") == 25
    assert records[12:16] == b"\x73\xac\xf7\x7c"
    assert zlib.crc32(records[16:]) == 0x73ACF77C  # the CRC covers magic..value
    assert records[16:18] == b"\x00\x00"
    assert records[18:22] == b"\xff\xff\xff\xff"
    assert int.from_bytes(records[22:26], "big") == 11
    assert records[26:] == b"hello world"
    # Byte-exact re-encoding, body alone and whole frame.
    assert frame(encode_request(request.header, request.body)) == PRODUCE_V0_REQUEST


# -- Metadata v0 request and response ----------------------------------------------------
# From the project's protocol guides: ../shared/seeds/001_*.txt, "Minimal Request
# (Metadata v0)": size 18, api key 3, version 0, correlation id 1, client id "test",
# topics null (all topics).
METADATA_V0_REQUEST = _hex("""
00 00 00 12
00 03
00 00
00 00 00 01
00 04
74 65 73 74
FF FF FF FF
""")

# From the project's protocol guides: ../shared/seeds/001_*.txt, "Minimal Response
# (Metadata v0)": size 12, correlation id 1, no brokers, no topics.
METADATA_V0_RESPONSE = _hex("""
00 00 00 0C
00 00 00 01
00 00 00 00
00 00 00 00
""")


def test_metadata_v0_request_golden() -> None:
    payload = _single_payload(METADATA_V0_REQUEST)
    request = decode_request(payload)
    assert request.header.api_key == 3
    assert request.header.api_version == 0
    assert request.header.correlation_id == 1
    assert request.header.client_id == "test"
    assert request.header.header_version == 1
    assert request.header.size == 14
    # Null topic list on v0, where the spec says non-nullable: kept as null.
    assert request.body == {"topics": None}
    assert frame(encode_request(request.header, request.body)) == METADATA_V0_REQUEST


def test_metadata_v0_response_golden() -> None:
    payload = _single_payload(METADATA_V0_RESPONSE)
    response = decode_response(payload, 3, 0)
    assert response.header == ResponseHeader(1, 0, {}, 4)
    assert response.body == {"brokers": [], "topics": []}
    assert frame(encode_response(1, 3, 0, response.body)) == METADATA_V0_RESPONSE


# -- ApiVersions v3 request --------------------------------------------------------------
# From the project's protocol guides: ../shared/seeds/004_*.txt, "Worked Example: a
# Minimal ApiVersionsRequest on the Wire": api key 18, version 3 (flexible), request
# header v2 whose client id "c1" keeps a 2-byte length, correlation id 7, then the
# body's compact strings: software name "apache-kafka-java" (length+1 = 18) and a
# software version of our choosing ("3.7.0", length+1 = 6), then empty tag sections.
API_VERSIONS_V3_REQUEST = _hex("""
00 00 00 26
00 12
00 03
00 00 00 07
00 02 63 31
00
12 61 70 61 63 68 65 2d 6b 61 66 6b 61 2d 6a 61 76 61
06 33 2e 37 2e 30
00
""")


def test_api_versions_v3_request_golden() -> None:
    payload = _single_payload(API_VERSIONS_V3_REQUEST)
    # The byte offsets the guide gives (relative to the frame, size prefix included).
    assert API_VERSIONS_V3_REQUEST[12:14] == b"\x00\x02"  # client id length, not compact
    assert API_VERSIONS_V3_REQUEST[14:16] == b"c1"
    assert API_VERSIONS_V3_REQUEST[16] == 0  # header tags
    assert API_VERSIONS_V3_REQUEST[17] == 18  # software name length + 1
    assert API_VERSIONS_V3_REQUEST[18:35] == b"apache-kafka-java"
    request = decode_request(payload)
    assert request.header == RequestHeader(18, 3, 7, "c1", 2, {}, 13)
    assert request.body == {"client_software_name": "apache-kafka-java", "client_software_version": "3.7.0"}
    assert frame(encode_request(request.header, request.body)) == API_VERSIONS_V3_REQUEST


# -- Produce v9 request header -----------------------------------------------------------
# From the project's protocol guides: ../shared/seeds/001_*.txt, "Flexible Request
# (Produce v9)": the header alone (the guide elides the body): api key 0, version 9,
# correlation id 42, client id "prod1" with a 2-byte length, then an empty tag section.
PRODUCE_V9_REQUEST_HEADER = _hex("00 00 00 09 00 00 00 2A 00 05 70 72 6F 64 31 00")


def test_produce_v9_request_header_golden() -> None:
    header = decode_request_header(PRODUCE_V9_REQUEST_HEADER)
    assert header == RequestHeader(0, 9, 42, "prod1", 2, {}, 16)
    assert encode_request_header(header) == PRODUCE_V9_REQUEST_HEADER


# -- header version rules ----------------------------------------------------------------


def test_controlled_shutdown_v0_uses_request_header_v0() -> None:
    assert request_header_version(7, 0) == 0
    assert request_header_version(7, 1) == 1
    # Header v0 has no client id: api key, version, correlation id, then the body.
    payload = _hex("00 07 00 00 00 00 00 05 00 00 00 03")
    request = decode_request(payload)
    assert request.header == RequestHeader(7, 0, 5, None, 0, {}, 8)
    assert request.body == {"broker_id": 3}
    assert encode_request(request.header, request.body) == payload


@pytest.mark.parametrize(("api_key", "version"), [(3, 9), (3, 12), (18, 3), (18, 4), (0, 9), (1, 12)])
def test_flexible_requests_use_header_v2_with_non_compact_client_id(api_key: int, version: int) -> None:
    schema = message_schema(api_key, version, MessageType.REQUEST)
    assert schema is not None and schema.flexible
    assert request_header_version(api_key, version) == 2
    header = RequestHeader(api_key, version, 99, "client-ü", 2, {})
    raw = encode_request_header(header)
    client = "client-ü".encode()
    assert raw == (api_key.to_bytes(2, "big") + version.to_bytes(2, "big") + (99).to_bytes(4, "big")
                   + len(client).to_bytes(2, "big") + client + b"\x00")
    decoded = decode_request_header(raw)
    assert decoded.client_id == "client-ü"
    assert decoded.header_version == 2
    assert decoded.size == len(raw)
    # A null client id is still a 2-byte -1, never a compact 0.
    raw_null = encode_request_header(RequestHeader(api_key, version, 99, None, 2, {}))
    assert raw_null[8:] == b"\xff\xff\x00"
    assert decode_request_header(raw_null).client_id is None


@pytest.mark.parametrize(("api_key", "version"), [(3, 8), (0, 8), (1, 11), (18, 2), (11, 5)])
def test_non_flexible_requests_use_header_v1(api_key: int, version: int) -> None:
    schema = message_schema(api_key, version, MessageType.REQUEST)
    assert schema is not None and not schema.flexible
    assert request_header_version(api_key, version) == 1
    assert response_header_version(api_key, version) == 0


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_api_versions_responses_always_use_header_v0(version: int) -> None:
    assert response_header_version(18, version) == 0
    body = {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 4}]}
    if version >= 1:
        body["throttle_time_ms"] = 0
    payload = encode_response(7, 18, version, body)
    # No tag section after the correlation id, even for the flexible v3/v4 bodies.
    assert payload[:4] == b"\x00\x00\x00\x07"
    assert payload[4:6] == b"\x00\x00"  # error code follows the correlation id directly
    response = decode_response(payload, 18, version)
    assert response.header == ResponseHeader(7, 0, {}, 4)
    assert response.body == body


@pytest.mark.parametrize(("api_key", "version"), [(3, 9), (3, 12), (0, 9), (1, 12), (60, 0), (10, 4)])
def test_other_flexible_responses_use_header_v1(api_key: int, version: int) -> None:
    assert response_header_version(api_key, version) == 1
    header = ResponseHeader(5, 1, {})
    assert encode_response_header(header) == b"\x00\x00\x00\x05\x00"
    tagged = ResponseHeader(5, 1, {3: b"xy"})
    raw = encode_response_header(tagged)
    assert raw == b"\x00\x00\x00\x05\x01\x03\x02xy"
    assert decode_response_header(raw, api_key, version) == ResponseHeader(5, 1, {3: b"xy"}, len(raw))
