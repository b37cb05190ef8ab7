"""Fuzz target of a whole sans-IO session, and the input format other session-driven targets share.

An input is a sequence of frames, each ``side`` (one byte: bit 0 is 0 for the client, 1 for
the broker), a 2-byte payload length, then the frame's payload (its size prefix is added).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from tests.fuzz.targets.codec import sample_values
from tests.fuzz.targets.registry import target

_OP = struct.Struct(">BH")  # side (bit 0: 0 client, 1 broker), payload length; then the frame payload


def session_input(ops: list[tuple[int, bytes]]) -> bytes:
    """Encode a sequence of (side, frame payload without size prefix) as a session target input."""
    return b"".join(_OP.pack(side, len(payload)) + payload for side, payload in ops)


def session_ops(data: bytes) -> Iterator[tuple[int, bytes]]:
    pos = 0
    while len(data) - pos >= _OP.size:
        side, n = _OP.unpack_from(data, pos)
        pos += _OP.size
        yield side & 1, data[pos : pos + n]
        pos += n


def _session_seeds() -> Iterator[bytes]:
    from kproxy.protocol.frame_builder import request_frame, response_frame

    values = sample_values()
    broker = {"brokers": values["brokers"], "topics": [{"name": "orders", "partitions": [
        {"partition_index": 0, "leader_id": 1, "replica_nodes": [1], "isr_nodes": [1]}]}]}
    pairs = [(3, 12, broker), (3, 1, broker), (10, 4, {"coordinators": values["coordinators"]}),
             (10, 1, {"node_id": 1, "host": "b1.internal", "port": 9092}), (18, 3, {"api_keys": values["api_keys"]}),
             (12, 4, {}), (0, 9, {"responses": values["responses"]}), (1, 12, {"responses": values["responses"]}),
             (60, 0, {"brokers": values["brokers"]}), (17, 0, {"mechanisms": ["PLAIN"]})]
    ops = []
    for cid, (key, version, body) in enumerate(pairs):
        ops.append((0, request_frame(key, version, cid, **values)[4:]))
        ops.append((1, response_frame(key, version, cid, **body)[4:]))
    yield session_input(ops)
    # Pipelined: every request first, then every response.
    yield session_input([op for op in ops if op[0] == 0] + [op for op in ops if op[0] == 1])
    # acks=0 produce (no answer), then a Metadata reusing its correlation id: the id is free again.
    yield session_input([(0, request_frame(0, 9, 5, **{**values, "acks": 0})[4:]),
                         (0, request_frame(3, 12, 5)[4:]),
                         (1, response_frame(0, 9, 5, responses=values["responses"])[4:]),
                         (1, response_frame(3, 12, 5, **broker)[4:])])
    # SASL PLAIN in v0 token mode.
    yield session_input([(0, request_frame(17, 0, 1, mechanism="PLAIN")[4:]),
                         (1, response_frame(17, 0, 1, mechanisms=["PLAIN"])[4:]),
                         (0, b"\x00user\x00pass"), (1, b""), (0, request_frame(3, 12, 2)[4:]),
                         (1, response_frame(3, 12, 2, **broker)[4:])])


@target(_session_seeds)
def fuzz_session(data: bytes) -> None:
    """A whole sans-IO Session fed frames from both sides: never an exception (a protocol error is a
    CloseConnection command); responses in request order."""
    from kproxy.protocol.framing import FrameSplitter, frame
    from kproxy.proxy.address_rewrite import ResponseRewriter
    from kproxy.proxy.addresses import AddressMap
    from kproxy.proxy.commands import CloseConnection, SendToClient
    from kproxy.proxy.session import Mode, Session

    session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), max_in_flight=64, clock=lambda: 0.0)
    asked: list[int] = []  # correlation ids of requests read in Kafka mode, in order
    for side, payload in session_ops(data):
        whole = frame(payload)
        kafka_mode = session.mode is Mode.KAFKA
        commands = session.receive_client(whole) if side == 0 else session.receive_upstream(whole)
        if any(isinstance(c, CloseConnection) for c in commands):
            return  # the server closes the connection: nothing more is read
        if side == 0 and session.mode is Mode.KAFKA and len(payload) >= 8:
            asked.append(struct.unpack_from(">i", payload, 4)[0])
        released = [f for c in commands if isinstance(c, SendToClient) for f in FrameSplitter().split(c.payload())[0]]
        if kafka_mode:
            for out in released:
                (cid,) = struct.unpack_from(">i", out, 4)
                assert cid in asked, f"a response with correlation id {cid} answers no request"
                # In order: it answers the oldest request still waiting with that id.
                asked = asked[asked.index(cid) + 1 :]
