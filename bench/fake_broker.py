"""A tiny fake Kafka broker with canned answers, for the Metadata scale phase of bench_proxy.py.

    .venv/bin/python bench/fake_broker.py --partitions 10,1000,100000

Answers ApiVersions (v0-v3: the versions kproxy reads, as kproxy's own tables give
them) and Metadata v1; a Metadata request naming the topic ``partitions-N`` gets a
canned answer of N partitions (topics of up to 100 partitions, replicas [0]),
encoded once at start with kproxy's codec; any other request closes the
connection. Node 0 is this broker, so a proxy in front of it rewrites one
broker address, as it would for a real one. Tansu would have to create 100,000
partitions first; this answers at once, so the proxy's cost per request is all
that grows with the partition count.

Prints ``ready PORT`` once listening. One thread per connection (the benchmark
opens a handful).
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kproxy.protocol import default_body, frame
from kproxy.protocol.message_schemas import MessageType, known_api_keys, supported_versions
from kproxy.protocol.payloads import decode_request, encode_response

API_VERSIONS, METADATA = 18, 3
PARTITIONS_PER_TOPIC = 100
_SIZE = struct.Struct(">i")


def topic_name(partitions: int) -> str:
    return f"partitions-{partitions}"


def metadata_body(partitions: int, port: int) -> dict[str, Any]:
    body = default_body(METADATA, 1, MessageType.RESPONSE)
    body["brokers"] = [{"node_id": 0, "host": "127.0.0.1", "port": port, "rack": None}]
    body["controller_id"] = 0
    topics = []
    left, t = partitions, 0
    while left > 0:
        n = min(PARTITIONS_PER_TOPIC, left)
        topics.append({"error_code": 0, "name": f"{topic_name(partitions)}-{t:05d}", "is_internal": False,
                       "partitions": [{"error_code": 0, "partition_index": p, "leader_id": 0, "replica_nodes": [0],
                                       "isr_nodes": [0]} for p in range(n)]})
        left -= n
        t += 1
    body["topics"] = topics
    return body


def api_versions_body() -> dict[str, Any]:
    keys = []
    for key in sorted(known_api_keys()):
        span = supported_versions(key)
        if span is not None:
            keys.append({"api_key": key, "min_version": span[0], "max_version": span[1]})
    body = default_body(API_VERSIONS, 3, MessageType.RESPONSE)
    body.update(error_code=0, api_keys=keys)
    return body


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def serve_connection(sock: socket.socket, canned: dict[str, dict[str, Any]]) -> None:
    """``canned``: topic name -> Metadata v1 body; every answer is encoded under the request's id."""
    encoded: dict[tuple[int, int, str], bytes] = {}  # (api, version, topic) -> body bytes after the id
    with sock:
        while True:
            head = recv_exact(sock, 4)
            if head is None:
                return
            payload = recv_exact(sock, _SIZE.unpack(head)[0])
            if payload is None:
                return
            req = decode_request(payload)
            h = req.header
            if h.api_key == API_VERSIONS and h.api_version <= 3:
                key = (API_VERSIONS, h.api_version, "")
                body = api_versions_body()
            elif h.api_key == METADATA and h.api_version == 1:
                names = [t["name"] for t in req.body.get("topics") or []]
                if names and (len(names) != 1 or names[0] not in canned):
                    return
                name = names[0] if names else ""  # no topics asked: kproxy's broker discovery
                key = (METADATA, 1, name)
                body = canned[name]
            else:
                return
            tail = encoded.get(key)
            if tail is None:
                tail = encoded[key] = encode_response(0, h.api_key, h.api_version, body)[4:]
            sock.sendall(frame(struct.pack(">i", h.correlation_id) + tail))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", default="10,1000,100000", help="comma-separated partition counts")
    args = parser.parse_args()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    canned = {topic_name(n): metadata_body(n, port) for n in map(int, args.partitions.split(","))}
    canned[""] = metadata_body(0, port)
    print(f"ready {port}", flush=True)
    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve_connection, args=(conn, canned), daemon=True).start()


if __name__ == "__main__":
    main()
