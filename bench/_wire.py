"""A minimal blocking Kafka client for the benchmarks: raw sockets and kproxy's own codec.

No Kafka client library: the requests are encoded once with
:mod:`kproxy.protocol`, so every path under test (direct, byte pipe, kproxy,
tansu proxy) pays exactly the same client-side cost.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from kproxy.protocol import MessageType, decode_response, default_body, encode_request, frame
from kproxy.protocol.headers import RequestHeader, request_header_version
from kproxy.protocol.records import Record, encode_batch_v2

CLIENT_ID = "kproxy-bench"
API_VERSIONS = (18, 3)
METADATA = (3, 1)
PRODUCE = (0, 7)
FETCH = (1, 11)
CREATE_TOPICS = (19, 4)
_SIZE = struct.Struct(">i")


def request(api: tuple[int, int], body: dict[str, Any], correlation_id: int = 1) -> bytes:
    """A whole request frame (size prefix included)."""
    key, version = api
    header = RequestHeader(key, version, correlation_id, CLIENT_ID, request_header_version(key, version), {})
    return frame(encode_request(header, body))


def body_of(api: tuple[int, int], **fields: Any) -> dict[str, Any]:
    body = default_body(api[0], api[1], MessageType.REQUEST)
    body.update(fields)
    return body


def api_versions_request(correlation_id: int = 1) -> bytes:
    return request(API_VERSIONS, body_of(API_VERSIONS, client_software_name="kproxy-bench",
                                         client_software_version="1.0"), correlation_id)


def metadata_request(topics: list[str] | None, correlation_id: int = 1) -> bytes:
    entries = None if topics is None else [{"name": t} for t in topics]
    return request(METADATA, body_of(METADATA, topics=entries), correlation_id)


def create_topic_request(topic: str, partitions: int = 1) -> bytes:
    return request(CREATE_TOPICS, body_of(CREATE_TOPICS, timeout_ms=10_000, topics=[
        {"name": topic, "num_partitions": partitions, "replication_factor": 1, "assignments": [], "configs": []}]))


def record_batch(total_bytes: int, record_size: int = 1024) -> bytes:
    """One uncompressed RecordBatch v2 of about ``total_bytes``."""
    n = max(1, total_bytes // record_size)
    now = int(time.time() * 1000)
    value = bytes(range(256)) * (record_size // 256) + b"x" * (record_size % 256)
    return encode_batch_v2([Record(offset=i, timestamp=now, key=None, value=value, headers=[]) for i in range(n)])


def produce_request(topic: str, batch: bytes, correlation_id: int = 1, acks: int = 1) -> bytes:
    return request(PRODUCE, body_of(PRODUCE, acks=acks, timeout_ms=30_000, topic_data=[
        {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]), correlation_id)


def fetch_request(topic: str, offset: int, max_bytes: int, correlation_id: int = 1) -> bytes:
    return request(FETCH, body_of(FETCH, replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=max_bytes,
                                  isolation_level=0, session_id=0, session_epoch=-1, topics=[
        {"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                                         "log_start_offset": -1, "partition_max_bytes": max_bytes}]}],
        forgotten_topics_data=[], rack_id=""), correlation_id)


def connect(port: int, host: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection((host, port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise ConnectionError("connection closed mid-frame")
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket) -> bytes:
    """One response payload (no size prefix)."""
    (size,) = _SIZE.unpack(recv_exact(sock, 4))
    return recv_exact(sock, size)


def call(sock: socket.socket, api: tuple[int, int], frame_bytes: bytes) -> dict[str, Any]:
    """Send one request frame and decode its response body."""
    sock.sendall(frame_bytes)
    return decode_response(recv_frame(sock), api[0], api[1]).body
