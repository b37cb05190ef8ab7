"""A blocking Kafka client on a plain socket, built on kproxy's own codec: one request at a time,
for tests that need exact requests (a version no real client sends) or a look at the broker
behind kproxy's back (what it stores: :func:`stored_batches`)."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any

from kproxy.protocol import MessageType, RequestHeader, decode_response, default_body, encode_request, frame
from kproxy.protocol.headers import request_header_version
from kproxy.protocol.records import iter_batches

FETCH, METADATA = 1, 3


class RawKafka:
    def __init__(self, address: str, client_id: str = "kproxy-test") -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.client_id = client_id
        self.correlation = 0

    def request(self, api_key: int, api_version: int, body: dict[str, Any]) -> dict[str, Any]:
        self.correlation += 1
        header = RequestHeader(api_key, api_version, self.correlation, self.client_id,
                               request_header_version(api_key, api_version))
        self.sock.sendall(frame(encode_request(header, body)))
        (size,) = struct.unpack(">i", self._read(4))
        response = decode_response(self._read(size), api_key, api_version)
        assert response.header.correlation_id == self.correlation
        return response.body

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("connection closed")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class StoredBatch:
    """One record batch as the broker stores it: its topic and partition, size, codec and records."""

    topic: str
    partition: int
    size: int
    codec: int
    records: int
    producer_id: int


def stored_batches(broker: str, topics: dict[str, int], max_bytes: int = 64 * 1024 * 1024) -> list[StoredBatch]:
    """Every batch of ``topics`` (name -> partitions) on ``broker``, read from offset 0 up to each
    partition's high watermark with Fetch v12 (names, not ids) straight from the broker, in as many
    rounds as the broker needs (bounded: one batch at least per partition and round). A partial
    batch at the end of an answer is fetched again in the next round, never counted twice."""
    out: list[StoredBatch] = []
    offsets = {(t, p): 0 for t, n in topics.items() for p in range(n)}
    done: set[tuple[str, int]] = set()
    with RawKafka(broker, "stored-batches") as raw:
        for _ in range(10_000):
            wanted = [key for key in offsets if key not in done]
            if not wanted:
                return out
            body = default_body(FETCH, 12, MessageType.REQUEST)
            # min_bytes 1: Tansu answers a min_bytes 0 Fetch with no topics at all.
            body.update(replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=max_bytes, isolation_level=0,
                        topics=[{"topic": t, "partitions": [
                            {"partition": p, "fetch_offset": offsets[(t, p)], "partition_max_bytes": max_bytes,
                             "log_start_offset": -1, "current_leader_epoch": -1, "last_fetched_epoch": -1}
                            for (t2, p) in wanted if t2 == t]} for t in topics if any(w[0] == t for w in wanted)])
            answer = raw.request(FETCH, 12, body)
            assert answer["error_code"] == 0, answer["error_code"]
            for topic in answer["responses"]:
                for partition in topic["partitions"]:
                    key = (topic["topic"], partition["partition_index"])
                    assert partition["error_code"] == 0, (key, partition)
                    for batch in iter_batches(partition["records"] or b""):
                        assert batch.record_count is not None, "a legacy compressed wrapper: not expected here"
                        if batch.last_offset < offsets[key]:
                            continue  # (a broker may start an answer at the batch holding the offset)
                        out.append(StoredBatch(key[0], key[1], batch.length, batch.codec, batch.record_count,
                                               batch.producer_id))
                        offsets[key] = batch.next_offset
                    if offsets[key] >= partition["high_watermark"]:
                        done.add(key)
    raise AssertionError(f"batches of {sorted(offsets.keys() - done)} not all read after 10,000 Fetches")
