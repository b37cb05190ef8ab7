"""The sans-IO :class:`Session`: exact bytes in, exact commands out, no sockets, no clock.

Most tests read as one exchange, a frame at a time: :class:`FrameByFrame` feeds the
session's real ``receive_client`` / ``receive_upstream`` one frame per chunk and keeps
what the commands asked (a close becomes :class:`SessionError` with its reason). The
command API itself is checked as such at the end (zero copy, close kinds, the policy seam).
"""

from __future__ import annotations

import contextlib
import gc
import struct
import tracemalloc
import uuid
from typing import Any

import pytest

from kproxy.protocol import decode_response, encode_request, encode_response, frame
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.frame_builder import request_body, request_frame, response_body, response_frame
from kproxy.protocol.framing import FrameSplitter
from kproxy.protocol.headers import RequestHeader, response_body_offset
from kproxy.protocol.message_schemas import supported_versions
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap, BrokerRoute
from kproxy.proxy.commands import (
    CloseConnection,
    CloseKind,
    Command,
    ForwardUpstream,
    RejectReason,
    SendToClient,
    WakeAt,
)
from kproxy.proxy.session import Exchange, Mode, Session, SessionError, Verdict
from tests.support.clock import Clock

PRODUCE, METADATA, HEARTBEAT, SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE = 0, 3, 12, 17, 18, 36
LIST_OFFSETS = 2
ADVERTISED = "kproxy.test"
BASE = 40000
BROKERS = [{"node_id": 1, "host": "b1.internal", "port": 9092, "rack": None},
           {"node_id": 2, "host": "b2.internal", "port": 9093, "rack": "r2"}]


class Recorder:
    """A :class:`SessionObserver` that keeps what it saw (handed over by ``Session.report``)."""

    def __init__(self) -> None:
        self.requests: list[Exchange] = []
        self.done: list[Exchange] = []

    def request(self, exchange: Exchange) -> None:
        self.requests.append(exchange)

    def complete(self, exchange: Exchange) -> None:
        self.done.append(exchange)


class FrameByFrame:
    """A real :class:`Session` driven one whole frame per chunk, keeping what its commands asked.

    ``on_client_frame`` returns the bytes forwarded upstream (None: nothing was);
    responses due to the client collect until ``take_ready``; a ``CloseConnection``
    raises :class:`SessionError` carrying its reason. Everything else is the session's own
    (read through; a wrapper, not a subclass: the compiled build's Session is final).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.session = Session(*args, **kwargs)
        self.to_client: list[bytes] = []
        self.routes: list[BrokerRoute] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    def on_client_frame(self, frame_: bytes, read_at: float | None = None) -> bytes | None:
        return self._run(self.session.receive_client(frame_, read_at))

    def on_upstream_frame(self, frame_: bytes) -> None:
        assert self._run(self.session.receive_upstream(frame_)) is None

    def _run(self, commands: list[Command]) -> bytes | None:
        forwarded = None
        for command in commands:
            if isinstance(command, CloseConnection):
                raise SessionError(command.reason)
            if isinstance(command, ForwardUpstream):
                forwarded = command.payload()
            elif isinstance(command, SendToClient):
                self.to_client += FrameSplitter().split(command.payload())[0]
                self.routes += command.routes
        return forwarded

    @property
    def has_ready(self) -> bool:
        return bool(self.to_client)

    def take_ready(self) -> tuple[list[bytes], list[BrokerRoute]]:
        frames, routes = self.to_client, self.routes
        self.to_client, self.routes = [], []
        return frames, routes


def session(clock: Clock | None = None, **kwargs: Any) -> tuple[FrameByFrame, list[Exchange]]:
    recorder = Recorder()
    s = FrameByFrame(ResponseRewriter(AddressMap(ADVERTISED, BASE)), clock=clock or Clock(), observer=recorder,
                     **kwargs)
    return s, recorder.done


def req(api_key: int, version: int, correlation_id: int, **values: Any) -> bytes:
    return request_frame(api_key, version, correlation_id, **values)


def resp(api_key: int, version: int, correlation_id: int, **values: Any) -> bytes:
    return response_frame(api_key, version, correlation_id, **values)


def future_api_versions(correlation_id: int, version: int = 99) -> bytes:
    """An ApiVersions request of a version kproxy cannot read (its body is opaque bytes)."""
    return frame(struct.pack(">hhih", API_VERSIONS, version, correlation_id, 3) + b"cli" + b"\x00future-body")


def heartbeat(correlation_id: int) -> tuple[bytes, bytes]:
    """A request/response pair that passes untouched (nothing to rewrite in Heartbeat)."""
    return (req(HEARTBEAT, 4, correlation_id, group_id="g", generation_id=1, member_id="m"),
            resp(HEARTBEAT, 4, correlation_id, error_code=0))


def forward(s: FrameByFrame, frames: list[bytes]) -> None:
    """Each request goes upstream unchanged."""
    for f in frames:
        assert s.on_client_frame(f) == f


def ready(s: FrameByFrame) -> list[bytes]:
    frames, _ = s.take_ready()
    return frames


def metadata_response(correlation_id: int, brokers: list[dict[str, Any]], version: int = 12) -> bytes:
    return resp(METADATA, version, correlation_id, brokers=brokers, cluster_id="c", controller_id=1,
                topics=[])


def rewritten_brokers(brokers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**b, "host": ADVERTISED, "port": BASE + b["node_id"]} for b in brokers]


# -- ordering -----------------------------------------------------------------------------------
def test_pipelined_requests_answered_in_order_byte_for_byte() -> None:
    s, done = session()
    pairs = [heartbeat(c) for c in (7, 8, 9)]
    forward(s, [r for r, _ in pairs])
    assert [e.correlation_id for e in s.in_flight] == [7, 8, 9]
    assert not s.has_ready
    for i, (_, answer) in enumerate(pairs):
        s.on_upstream_frame(answer)
        assert ready(s) == [answer], "each answer is due as soon as it is the oldest"
        assert len(s.in_flight) == 2 - i
    s.report()
    assert [e.correlation_id for e in done] == [7, 8, 9]
    assert (s.requests, s.responses) == (3, 3)


def test_a_bounded_turn_takes_a_chunk_s_requests_and_answers_a_turn_at_a_time() -> None:
    s, done = session()
    pairs = [heartbeat(c) for c in range(1, 301)]
    chunk = b"".join(r for r, _ in pairs)
    session_ = s.session
    forwarded: list[bytes] = []
    commands = session_.receive_client(chunk, None, 128)
    taken = [session_.requests]
    while True:
        forwarded += FrameSplitter().split(s._run(commands) or b"")[0]
        if not session_.more_client:
            break
        before = session_.requests
        commands = session_.receive_client_more(128)
        taken.append(session_.requests - before)
    assert taken == [128, 128, 44]
    assert forwarded == [r for r, _ in pairs], "every request went on, once, in order"
    answers = b"".join(a for _, a in pairs)
    turns = 1
    s._run(session_.receive_upstream(answers, 128))
    while session_.more_upstream:
        turns += 1
        s._run(session_.receive_upstream_more(128))
    assert turns == 3
    assert ready(s) == [a for _, a in pairs]
    s.report()
    assert len(done) == 300 and not session_.in_flight
    # Unbounded (turn 0, the default) the whole chunk is taken at once, and goes on as it came.
    s2, _ = session()
    assert s2.session.receive_client(chunk)[-1].payload() == chunk and not s2.session.more_client


def test_local_answer_waits_behind_in_flight_requests() -> None:
    s, done = session()
    (hb1, hb1_answer), (hb3, hb3_answer) = heartbeat(1), heartbeat(3)
    forward(s, [hb1])
    future = future_api_versions(2)
    assert s.on_client_frame(future) is None, "answered locally, not forwarded"
    assert not s.has_ready, "the local answer must not overtake request 1"
    forward(s, [hb3])
    s.on_upstream_frame(hb1_answer)
    frames = ready(s)
    assert frames[0] == hb1_answer
    assert len(frames) == 2
    local = decode_response(frames[1][4:], API_VERSIONS, 0)
    assert local.header.correlation_id == 2
    s.on_upstream_frame(hb3_answer)  # upstream's next answer matches request 3, skipping the local one
    assert ready(s) == [hb3_answer]
    s.report()
    assert [(e.correlation_id, e.local) for e in done] == [(1, False), (2, True), (3, False)]


def test_local_answer_with_nothing_in_flight_is_ready_at_once() -> None:
    s, _ = session()
    assert s.on_client_frame(future_api_versions(5)) is None
    [answer] = ready(s)
    assert decode_response(answer[4:], API_VERSIONS, 0).header.correlation_id == 5
    assert not s.in_flight


@pytest.mark.parametrize("version", [5, 99, 32767])
def test_api_versions_beyond_what_kproxy_reads_gets_the_kip511_answer(version: int) -> None:
    s, _ = session()
    assert s.on_client_frame(future_api_versions(42, version)) is None
    [answer] = ready(s)
    lo, hi = supported_versions(API_VERSIONS)  # type: ignore[misc]
    assert answer == frame(struct.pack(">ihihhh", 42, 35, 1, API_VERSIONS, lo, hi))
    body = decode_response(answer[4:], API_VERSIONS, 0).body
    assert body == {"error_code": 35,
                    "api_keys": [{"api_key": API_VERSIONS, "min_version": lo, "max_version": hi}]}


def test_api_versions_that_kproxy_reads_is_forwarded_and_capped() -> None:
    s, _ = session()
    request = req(API_VERSIONS, 3, 1, client_software_name="t", client_software_version="1")
    forward(s, [request])
    keys = [{"api_key": METADATA, "min_version": 0, "max_version": 99},
            {"api_key": LIST_OFFSETS, "min_version": 0, "max_version": 99},
            {"api_key": 30000, "min_version": 1, "max_version": 2},
            {"api_key": PRODUCE, "min_version": 20, "max_version": 30}]
    s.on_upstream_frame(resp(API_VERSIONS, 3, 1, api_keys=keys))
    [answer] = ready(s)
    expected = [{"api_key": METADATA, "min_version": 0, "max_version": supported_versions(METADATA)[1]},  # type: ignore[index]
                {"api_key": LIST_OFFSETS, "min_version": 0, "max_version": 99},
                {"api_key": 30000, "min_version": 1, "max_version": 2}]  # Produce: no common version
    assert answer == resp(API_VERSIONS, 3, 1, api_keys=expected)


def test_broker_kip511_answer_is_capped_as_a_v0_body() -> None:
    s, _ = session()
    forward(s, [req(API_VERSIONS, 4, 1, client_software_name="t", client_software_version="1")])
    # A broker that cannot read v4 answers with a v0 body (KIP-511), whatever the request's version.
    upstream = frame(encode_response(1, API_VERSIONS, 0, {"error_code": 35, "api_keys": [
        {"api_key": API_VERSIONS, "min_version": 0, "max_version": 3},
        {"api_key": METADATA, "min_version": 0, "max_version": 99}]}))
    s.on_upstream_frame(upstream)
    [answer] = ready(s)
    assert answer == frame(encode_response(1, API_VERSIONS, 0, {"error_code": 35, "api_keys": [
        {"api_key": API_VERSIONS, "min_version": 0, "max_version": 3},
        {"api_key": METADATA, "min_version": 0, "max_version": supported_versions(METADATA)[1]}]}))  # type: ignore[index]


# -- rewriting ---------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [1, 9, 12])
def test_metadata_rewritten_exactly_and_routes_reported(version: int) -> None:
    s, _ = session()
    forward(s, [req(METADATA, version, 11, topics=None)])
    s.on_upstream_frame(metadata_response(11, BROKERS, version))
    frames, routes = s.take_ready()
    assert frames == [metadata_response(11, rewritten_brokers(BROKERS), version)]
    assert [(r.node_id, r.upstream.host, r.upstream.port, r.local_port) for r in routes] == [
        (1, "b1.internal", 9092, BASE + 1), (2, "b2.internal", 9093, BASE + 2)]


def test_rewrite_finds_the_body_after_response_header_tags() -> None:
    s, _ = session()
    forward(s, [req(METADATA, 12, 3, topics=None)])
    body = response_body(METADATA, 12, brokers=BROKERS, topics=[])
    tags = {0: b"x" * 5, 7: b""}
    s.on_upstream_frame(frame(encode_response(3, METADATA, 12, body, header_tags=tags)))
    expected = response_body(METADATA, 12, brokers=rewritten_brokers(BROKERS), topics=[])
    assert ready(s) == [frame(encode_response(3, METADATA, 12, expected, header_tags=tags))]


def test_unrewritable_response_is_an_error_never_forwarded_as_is() -> None:
    s, _ = session()
    forward(s, [req(METADATA, 12, 3, topics=None)])
    good = metadata_response(3, BROKERS)
    truncated = struct.pack(">i", 20) + good[4:24]
    with pytest.raises(SessionError, match="cannot rewrite"):
        s.on_upstream_frame(truncated)
    assert not s.has_ready


# -- acks=0 ------------------------------------------------------------------------------------
def produce(version: int, correlation_id: int, acks: int, transactional_id: str | None = None,
            header_tags: dict[int, bytes] | None = None) -> bytes:
    body = request_body(PRODUCE, version, transactional_id=transactional_id, acks=acks, timeout_ms=1500,
                        topic_data=[{"name": "t", "partition_data": [{"index": 0, "records": b"\x00" * 9}]}])
    header = RequestHeader(PRODUCE, version, correlation_id, "producer-1" * 3, 2 if version >= 9 else 1,
                           header_tags or {})
    return frame(encode_request(header, body))


PRODUCE_CASES = [(v, None) for v in range(0, 14)] + [(v, "tx-1") for v in range(3, 14)] + [
    (9, "t" * 200), (13, "")]


@pytest.mark.parametrize(("version", "transactional_id"), PRODUCE_CASES)
def test_produce_acks_0_is_never_tracked(version: int, transactional_id: str | None) -> None:
    s, done = session()
    hb, hb_answer = heartbeat(2)
    request = produce(version, 1, 0, transactional_id)
    forward(s, [request, hb])
    assert [e.correlation_id for e in s.in_flight] == [2]
    s.on_upstream_frame(hb_answer)  # the broker answers only the heartbeat
    assert ready(s) == [hb_answer]
    s.report()
    assert [e.correlation_id for e in done] == [1, 2]  # acks=0 is still seen by metrics


@pytest.mark.parametrize(("version", "transactional_id"),
                         [(2, None), (5, "tx-1"), (9, "tx-1"), (13, "t" * 200)])
@pytest.mark.parametrize("acks", [1, -1])
def test_produce_with_acks_is_tracked(version: int, transactional_id: str | None, acks: int) -> None:
    s, _ = session()
    forward(s, [produce(version, 1, acks, transactional_id)])
    assert [e.correlation_id for e in s.in_flight] == [1]


def test_produce_acks_0_read_past_request_header_tags() -> None:
    s, _ = session()
    forward(s, [produce(9, 1, 0, "tx", header_tags={0: b"\x01\x02", 3: b"z" * 130})])
    assert not s.in_flight


def test_unreadable_produce_is_tracked_rather_than_dropped() -> None:
    s, _ = session()
    truncated = frame(struct.pack(">hhih", PRODUCE, 3, 1, -1) + b"\x00")
    forward(s, [truncated])
    assert [e.correlation_id for e in s.in_flight] == [1]


# -- SASL --------------------------------------------------------------------------------------
def handshake(s: FrameByFrame, mechanism: str, correlation_id: int = 1, error_code: int = 0) -> None:
    request = req(SASL_HANDSHAKE, 0, correlation_id, mechanism=mechanism)
    answer = resp(SASL_HANDSHAKE, 0, correlation_id, error_code=error_code, mechanisms=[mechanism])
    forward(s, [request])
    s.on_upstream_frame(answer)
    assert ready(s) == [answer]


def then_kafka_again(s: FrameByFrame, correlation_id: int) -> None:
    forward(s, [req(METADATA, 12, correlation_id, topics=None)])
    assert s.in_flight[-1].correlation_id == correlation_id
    s.on_upstream_frame(metadata_response(correlation_id, BROKERS))
    assert ready(s) == [metadata_response(correlation_id, rewritten_brokers(BROKERS))]


@pytest.mark.parametrize(("mechanism", "rounds"), [("PLAIN", 1), ("SCRAM-SHA-256", 2), ("scram-sha-512", 2),
                                                   ("OAUTHBEARER", 1)])
def test_sasl_v0_tokens_pass_opaquely_for_fixed_rounds(mechanism: str, rounds: int) -> None:
    s, _ = session()
    handshake(s, mechanism)
    assert s.mode is Mode.SASL_TOKENS
    for i in range(rounds):
        # Tokens have no Kafka header: these would not even parse as one.
        client_token = frame(b"\x00alice\x00secret" if i == 0 else b"c=biws,r=nonce,p=proof")
        server_token = frame(b"" if mechanism == "PLAIN" else f"r=nonce,s=salt,i={4096 + i}".encode())
        assert s.on_client_frame(client_token) == client_token
        assert not s.in_flight
        s.on_upstream_frame(server_token)
        assert ready(s) == [server_token]
        assert s.mode is (Mode.KAFKA if i == rounds - 1 else Mode.SASL_TOKENS)
    then_kafka_again(s, 2)


def test_sasl_v0_open_ended_mechanism_ends_at_the_first_kafka_request() -> None:
    s, _ = session()
    handshake(s, "GSSAPI")
    tokens = [frame(b"\x60\x82\x02\x10" + b"\xa5" * 40), frame(b"\x05\x04\x01\xff" + b"\x00" * 12),
              frame(b"")]
    for token in tokens:
        assert s.on_client_frame(token) == token
        s.on_upstream_frame(frame(b"\x05\x04" + token[4:8]))
        assert ready(s) == [frame(b"\x05\x04" + token[4:8])]
    assert s.mode is Mode.SASL_TOKENS
    then_kafka_again(s, 2)
    assert s.mode.value == "kafka"


def test_failed_sasl_handshake_stays_in_kafka_mode() -> None:
    s, _ = session()
    handshake(s, "PLAIN", error_code=33)  # UNSUPPORTED_SASL_MECHANISM
    assert s.mode is Mode.KAFKA
    then_kafka_again(s, 2)


def test_sasl_handshake_v1_then_sasl_authenticate_are_normal_kafka() -> None:
    s, _ = session()
    request = req(SASL_HANDSHAKE, 1, 1, mechanism="SCRAM-SHA-256")
    answer = resp(SASL_HANDSHAKE, 1, 1, error_code=0, mechanisms=["SCRAM-SHA-256", "PLAIN"])
    forward(s, [request])
    s.on_upstream_frame(answer)
    assert ready(s) == [answer]
    assert s.mode is Mode.KAFKA
    for correlation_id, version in ((2, 0), (3, 1), (4, 2)):
        auth = req(SASL_AUTHENTICATE, version, correlation_id, auth_bytes=b"n,,n=user,r=abc")
        auth_answer = resp(SASL_AUTHENTICATE, version, correlation_id, error_code=0, auth_bytes=b"r=abcdef",
                           session_lifetime_ms=3600_000)
        forward(s, [auth])
        s.on_upstream_frame(auth_answer)
        assert ready(s) == [auth_answer]
    then_kafka_again(s, 5)


# -- desynchronised streams and limits ------------------------------------------------------------
def test_correlation_mismatch_raises() -> None:
    s, _ = session()
    (a, _), (b, b_answer) = heartbeat(1), heartbeat(2)
    forward(s, [a, b])
    with pytest.raises(SessionError, match="does not match the oldest"):
        s.on_upstream_frame(b_answer)


def test_response_with_nothing_in_flight_raises() -> None:
    s, _ = session()
    with pytest.raises(SessionError, match="matches no request"):
        s.on_upstream_frame(heartbeat(1)[1])


def test_response_to_a_locally_answered_request_raises() -> None:
    s, _ = session()
    assert s.on_client_frame(future_api_versions(1)) is None
    with pytest.raises(SessionError):
        s.on_upstream_frame(resp(API_VERSIONS, 0, 1, error_code=0, api_keys=[]))


@pytest.mark.parametrize("payload", [b"", b"\x00\x03", b"\x00\x03\x00\x01\x00"])
def test_frames_too_short_for_a_header_raise(payload: bytes) -> None:
    s, _ = session()
    with pytest.raises(SessionError):
        s.on_client_frame(frame(payload))
    forward(s, [heartbeat(1)[0]])
    with pytest.raises(SessionError):
        s.on_upstream_frame(frame(payload[:3]))


def test_max_in_flight_and_can_accept() -> None:
    s, _ = session(max_in_flight=2)
    pairs = [heartbeat(c) for c in (1, 2, 3)]
    assert s.can_accept
    forward(s, [pairs[0][0]])
    assert s.can_accept
    forward(s, [produce(3, 99, 0)])  # acks=0 takes no slot
    assert s.can_accept
    forward(s, [pairs[1][0]])
    assert not s.can_accept
    s.on_upstream_frame(pairs[0][1])
    assert s.can_accept
    forward(s, [pairs[2][0]])
    assert not s.can_accept
    s.on_upstream_frame(pairs[1][1])
    s.on_upstream_frame(pairs[2][1])
    assert ready(s) == [p[1] for p in pairs]
    assert s.can_accept


def test_local_answers_hold_a_slot_until_delivered() -> None:
    s, _ = session(max_in_flight=2)
    hb, hb_answer = heartbeat(1)
    forward(s, [hb])
    assert s.on_client_frame(future_api_versions(2)) is None
    assert not s.can_accept
    s.on_upstream_frame(hb_answer)
    assert s.can_accept
    assert len(ready(s)) == 2


def test_exchange_timings_come_from_the_clock() -> None:
    clock = Clock()
    s, done = session(clock)
    hb, hb_answer = heartbeat(1)
    assert s.on_client_frame(hb, read_at=99.5) == hb
    clock.now += 2.5
    s.on_upstream_frame(hb_answer)
    s.report()
    [ex] = done
    assert (ex.read_at, ex.forwarded_at, ex.received_at, ex.completed_at) == (99.5, 100.0, 102.5, 102.5)
    assert (ex.broker_seconds, ex.overhead_seconds, ex.request_size) == (2.5, 0.5, len(hb))
    assert ex.api == "Heartbeat"



def raw_request(api_key: int, version: int, correlation_id: int) -> bytes:
    """A request header with an empty body, for versions the codec cannot encode."""
    payload = struct.pack(">hhih", api_key, version, correlation_id, -1)
    return struct.pack(">i", len(payload)) + payload


def test_capped_api_at_an_unreadable_version_is_refused_not_forwarded() -> None:
    """A client that ignores ApiVersions and asks Metadata at a version kproxy cannot read
    would get real broker addresses back: the session refuses instead of forwarding."""
    s, _ = session()
    top = supported_versions(3)
    assert top is not None
    with pytest.raises(SessionError, match=f"Metadata v{top[1] + 1} request"):
        s.on_client_frame(raw_request(3, top[1] + 1, 1))
    assert not s.in_flight and s.requests == 0


def test_unknown_api_key_at_any_version_is_forwarded() -> None:
    s, _ = session()
    frame_ = raw_request(30000, 7, 2)
    assert s.on_client_frame(frame_) == frame_
    assert [e.correlation_id for e in s.in_flight] == [2]


# -- acks read exactly, whatever the bytes around it ----------------------------------------------
# Field values chosen so that reading acks one byte early or late gives a different number:
# the timeout's high byte is not zero (1500 ms, 0x000005DC, would turn a late read of acks=0
# into 0x0000 = 0 again), and the byte before acks is often 0x00 (a null compact
# transactional id, or the empty header tag section), so an early read of acks=1 gives 0.
MISREAD_TIMEOUTS = (0x7F01_0203, -2)  # high bytes 0x7F and 0xFF
MISREAD_CASES = [(v, tx) for v in (3, 8, 9, 10, 13) for tx in (None, "", "tx-1", "t" * 200)]


def produce_with_timeout(version: int, correlation_id: int, acks: int, transactional_id: str | None,
                         timeout_ms: int) -> bytes:
    body = request_body(PRODUCE, version, transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms,
                        topic_data=[{"name": "t", "partition_data": [{"index": 0, "records": b"\x00" * 9}]}])
    return req(PRODUCE, version, correlation_id, body=body)


@pytest.mark.parametrize("timeout_ms", MISREAD_TIMEOUTS)
@pytest.mark.parametrize(("version", "transactional_id"), MISREAD_CASES)
def test_produce_acks_read_exactly_next_to_telling_bytes(version: int, transactional_id: str | None,
                                                               timeout_ms: int) -> None:
    for correlation_id, acks in ((1, 0), (2, 1), (3, -1)):
        s, _ = session()
        forward(s, [produce_with_timeout(version, correlation_id, acks, transactional_id, timeout_ms)])
        tracked = [e.correlation_id for e in s.in_flight]
        assert tracked == ([] if acks == 0 else [correlation_id]), (
            f"Produce v{version} acks={acks} timeout_ms={timeout_ms:#x} transactional id "
            f"{'null' if transactional_id is None else f'of {len(transactional_id)} chars'}: in flight {tracked}")


@pytest.mark.parametrize(("version", "transactional_id"), MISREAD_CASES)
def test_produce_acks_value_is_the_one_sent(version: int, transactional_id: str | None) -> None:
    """The reader behind the acks=0 decision returns the exact int16 on the wire: 0x0102
    read a byte off would be 0x01xx or 0xxx01."""
    from kproxy.protocol.headers import request_body_offset
    from kproxy.protocol.request_fields import produce_acks

    request = produce_with_timeout(version, 1, 0x0102, transactional_id, 0x7F01_0203)
    offset = request_body_offset(request, PRODUCE, version)
    assert offset is not None
    assert produce_acks(request, version, offset) == 0x0102


# -- a broker that answers acks=0 anyway (Tansu does) -------------------------------------------------
def test_broker_answer_to_acks_0_produce_is_dropped() -> None:
    """The client expects no answer to acks=0: the broker's is swallowed, whether it comes
    with nothing in flight or ahead of the answer to a later request, and exactly once."""
    s, done = session()
    produce_v9 = produce_with_timeout(9, 1, 0, "tx-1", 0x7F01_0203)
    stray = resp(PRODUCE, 9, 1, responses=[])
    forward(s, [produce_v9])
    assert not s.in_flight
    s.on_upstream_frame(stray)  # nothing in flight: dropped, not "matches no request"
    assert not s.has_ready
    hb, hb_answer = heartbeat(3)
    forward(s, [produce_with_timeout(13, 2, 0, None, 0x7F01_0203), hb])
    s.on_upstream_frame(resp(PRODUCE, 13, 2, responses=[]))  # ahead of the heartbeat's answer: dropped
    assert not s.has_ready
    assert [e.correlation_id for e in s.in_flight] == [3]
    s.on_upstream_frame(hb_answer)
    assert ready(s) == [hb_answer]
    assert (s.requests, s.responses) == (3, 1)
    s.report()
    assert [(e.correlation_id, e.response) for e in done] == [(1, None), (2, None), (3, hb_answer)]
    with pytest.raises(SessionError, match="matches no request"):
        s.on_upstream_frame(stray)  # an id is forgiven once: a second answer is a desynchronised stream


# -- KIP-951 node_endpoints rewritten, every other tag kept ------------------------------------------
@pytest.mark.parametrize(("api_key", "version"), [(PRODUCE, 10), (PRODUCE, 13), (1, 16), (1, 18)])
def test_node_endpoints_rewrite_keeps_other_tags(api_key: int, version: int) -> None:
    """A broker newer than kproxy may put tags kproxy does not know next to node_endpoints
    (top level and per partition): the rewritten response carries them unchanged."""
    s, _ = session()
    if api_key == PRODUCE:
        request = produce_with_timeout(version, 5, 1, None, 0x7F01_0203)
        responses = [{"name": "t", "partition_responses": [
            {"index": 0, "error_code": 6, "current_leader": {"leader_id": 2, "leader_epoch": 3},
             "_unknown_tags": {4: b"part"}}]}]
    else:
        request = req(1, version, 5, topics=[])
        responses = [{"topic_id": uuid.UUID(int=1), "partitions": [
            {"partition_index": 0, "error_code": 6, "records": None,
             "current_leader": {"leader_id": 2, "leader_epoch": 3}, "_unknown_tags": {4: b"part"}}]}]
    forward(s, [request])
    other_tags = {1: b"\x00\x01", 77: b"", 1000: b"n" * 200}

    def answer(brokers: list[dict[str, Any]]) -> bytes:
        body = response_body(api_key, version, responses=responses, node_endpoints=brokers)
        body["_unknown_tags"] = other_tags
        return resp(api_key, version, 5, body=body)

    s.on_upstream_frame(answer(BROKERS))
    frames, routes = s.take_ready()
    assert frames == [answer(rewritten_brokers(BROKERS))]
    assert decode_response(frames[0][4:], api_key, version).body["_unknown_tags"] == other_tags
    assert [r.node_id for r in routes] == [1, 2]

# -- correlation ids: client bytes must never choose upstream targets ------------------------------
def test_request_reusing_a_correlation_id_in_flight_is_refused() -> None:
    s, _ = session()
    hb, _ = heartbeat(1)
    forward(s, [hb])
    with pytest.raises(SessionError, match=r"correlation id 1 .*in flight"):
        s.on_client_frame(req(METADATA, 12, 1, topics=None))
    assert [e.correlation_id for e in s.in_flight] == [1]


def test_request_reusing_the_id_of_a_pending_local_answer_is_refused() -> None:
    s, _ = session()
    forward(s, [heartbeat(1)[0]])
    assert s.on_client_frame(future_api_versions(2)) is None
    with pytest.raises(SessionError, match="correlation id 2"):
        s.on_client_frame(heartbeat(2)[0])


def test_request_reusing_an_acks0_produce_id_is_refused() -> None:
    """Tansu answers acks=0 Produce: with the same id, that answer would be read as the Metadata's."""
    s, _ = session()
    forward(s, [produce(9, 5, 0)])
    with pytest.raises(SessionError, match=r"correlation id 5 .*acks=0"):
        s.on_client_frame(req(METADATA, 12, 5, topics=None))
    with pytest.raises(SessionError, match="correlation id 5"):
        s.on_client_frame(produce(9, 5, 0))
    assert not s.in_flight and not s.rewriter.addresses.routes


def test_ids_are_free_again_once_answered_as_after_a_wrap_around() -> None:
    s, _ = session()
    for _ in range(3):
        hb, hb_answer = heartbeat(1)
        forward(s, [hb])
        s.on_upstream_frame(hb_answer)
        assert ready(s) == [hb_answer]


def test_acks0_id_is_free_once_the_broker_answers_it() -> None:
    s, _ = session()
    forward(s, [produce(9, 5, 0)])
    s.on_upstream_frame(resp(PRODUCE, 9, 5, responses=[]))  # Tansu's answer: dropped
    assert not s.has_ready
    then_kafka_again(s, 5)


def test_acks0_id_is_free_once_a_later_request_is_answered() -> None:
    """Brokers answer in order: once request 6 is answered, acks=0 Produce 5 never will be."""
    s, _ = session()
    hb, hb_answer = heartbeat(6)
    forward(s, [produce(9, 5, 0), hb])
    s.on_upstream_frame(hb_answer)
    assert ready(s) == [hb_answer]
    then_kafka_again(s, 5)
    with pytest.raises(SessionError, match="matches no request"):
        s.on_upstream_frame(resp(PRODUCE, 9, 5, responses=[]))  # too late: a desynchronised stream


def test_acks0_memory_is_bounded_and_forgotten_ids_stay_refused() -> None:
    s, _ = session()
    count = 1024 + 10
    forward(s, [produce(9, c, 0) for c in range(100, 100 + count)])
    assert len(s._ids.acks0) <= 1024
    for forgotten in (100, 109):  # pushed out of the memory, yet the broker may still answer them
        with pytest.raises(SessionError, match=f"correlation id {forgotten}"):
            s.on_client_frame(heartbeat(forgotten)[0])
    s.on_upstream_frame(resp(PRODUCE, 9, 100, responses=[]))  # a late answer to a forgotten one: dropped
    assert not s.has_ready
    hb, hb_answer = heartbeat(5000)
    forward(s, [hb])
    s.on_upstream_frame(hb_answer)  # a later request answered: none of them can be answered any more
    assert ready(s) == [hb_answer]
    assert not s._ids.acks0 and s._ids.forgotten is None
    forward(s, [heartbeat(100)[0]])


def test_malformed_endpoint_response_never_reaches_the_address_map() -> None:
    """Brokers that decode but a body that does not: nothing learned, nothing re-pointed."""
    s, _ = session()
    forward(s, [req(METADATA, 12, 1, topics=None)])
    s.on_upstream_frame(metadata_response(1, BROKERS))
    ready(s)
    before = {n: (r.upstream, r.local_port) for n, r in s.rewriter.addresses.routes.items()}
    evil = [{"node_id": 1, "host": "evil.test", "port": 6666, "rack": None},
            {"node_id": 9, "host": "evil.test", "port": 6666, "rack": None}]
    good = metadata_response(2, evil)
    for bad in (good + b"\x00\x01",  # bytes left over after the body
                struct.pack(">i", len(good) - 6) + good[4:-2]):  # topics cut short
        s2 = FrameByFrame(s.rewriter, clock=Clock())
        forward(s2, [req(METADATA, 12, 2, topics=None)])
        with pytest.raises(SessionError, match="cannot rewrite"):
            s2.on_upstream_frame(struct.pack(">i", len(bad) - 4) + bad[4:])
        assert {n: (r.upstream, r.local_port) for n, r in s.rewriter.addresses.routes.items()} == before


# -- SASL token mode: Kafka requests get the same checks whatever mode they arrive in ----------------
def gssapi_session() -> FrameByFrame:
    s, _ = session()
    handshake(s, "GSSAPI")
    token = frame(b"\x60\x82\x02\x10" + b"\xa5" * 40)
    assert s.on_client_frame(token) == token
    s.on_upstream_frame(frame(b"\x05\x04\x01\xff"))
    ready(s)
    assert s.mode is Mode.SASL_TOKENS
    return s


def test_sasl_open_ended_mechanism_unreadable_capped_request_is_refused() -> None:
    """A Metadata request at a version kproxy cannot read, sent while GSSAPI tokens may still
    flow, is a Kafka request all the same: refused, never forwarded as a token whose answer
    would go back unrewritten."""
    s = gssapi_session()
    top = supported_versions(METADATA)
    assert top is not None
    with pytest.raises(SessionError, match=f"Metadata v{top[1] + 1} request"):
        s.on_client_frame(raw_request(METADATA, top[1] + 1, 7))


def test_sasl_open_ended_mechanism_request_at_an_unknown_version_is_tracked() -> None:
    s = gssapi_session()
    request = raw_request(HEARTBEAT, 99, 7)
    assert s.on_client_frame(request) == request
    assert s.mode is Mode.KAFKA
    assert [e.correlation_id for e in s.in_flight] == [7]
    answer = frame(struct.pack(">ih", 7, 0))
    s.on_upstream_frame(answer)
    assert ready(s) == [answer]


# -- malformed answers: only the project's own errors -------------------------------------------------
API_VERSIONS_KEYS = [{"api_key": METADATA, "min_version": 0, "max_version": 12}]
ANSWER_KINDS = [
    (req(API_VERSIONS, 3, 1, client_software_name="t", client_software_version="1"),
     resp(API_VERSIONS, 3, 1, api_keys=API_VERSIONS_KEYS)),
    (req(API_VERSIONS, 0, 1), resp(API_VERSIONS, 0, 1, api_keys=API_VERSIONS_KEYS)),
    (req(SASL_HANDSHAKE, 0, 1, mechanism="PLAIN"), resp(SASL_HANDSHAKE, 0, 1, error_code=0, mechanisms=["PLAIN"])),
    (req(METADATA, 12, 1, topics=None),
     frame(encode_response(1, METADATA, 12, response_body(METADATA, 12, brokers=BROKERS, topics=[]),
                           header_tags={3: b"abc"}))),
    (req(METADATA, 1, 1, topics=None), metadata_response(1, BROKERS, 1)),
    heartbeat(1),
]


@pytest.mark.parametrize(("request_", "answer"), ANSWER_KINDS)
def test_answers_cut_at_any_length_raise_only_protocol_errors(request_: bytes, answer: bytes) -> None:
    api_key, version = struct.unpack_from(">hh", request_, 4)
    for cut in range(4, len(answer)):
        cut_short = struct.pack(">i", cut - 4) + answer[4:cut]
        s, _ = session()
        forward(s, [request_])
        with contextlib.suppress(ProtocolError):
            s.on_upstream_frame(cut_short)
        with contextlib.suppress(ProtocolError):
            response_body_offset(cut_short, api_key, version)  # what metrics call on every answer


def test_pushed_out_acks0_ids_are_free_once_a_newer_acks0_is_answered() -> None:
    s, _ = session()
    forward(s, [produce(9, c, 0) for c in range(1, 1024 + 3)])  # ids 1 and 2 pushed out
    s.on_upstream_frame(resp(PRODUCE, 9, 500, responses=[]))  # answers come in order: 1 and 2 never will
    forward(s, [heartbeat(1)[0]])
    assert len(s._ids.acks0) == 1024 + 2 - 500 and s._ids.forgotten is None


# -- the command API itself ---------------------------------------------------------------------------
def plain_session(**kwargs: Any) -> Session:
    return Session(ResponseRewriter(AddressMap(ADVERTISED, BASE)), clock=Clock(), **kwargs)


def test_a_chunk_of_whole_untouched_frames_is_forwarded_as_the_same_object() -> None:
    s = plain_session()
    pairs = [heartbeat(c) for c in (1, 2, 3)]
    one = pairs[0][0]
    [command] = s.receive_client(one)
    assert type(command) is ForwardUpstream and command.data is one
    chunk = pairs[1][0] + pairs[2][0]
    [command] = s.receive_client(chunk)
    assert type(command) is ForwardUpstream and command.data is chunk
    answers = b"".join(answer for _, answer in pairs)
    [command] = s.receive_upstream(answers)
    assert type(command) is SendToClient and command.data is answers and not command.routes


def test_frames_split_across_chunks_go_out_whole() -> None:
    s = plain_session()
    (hb1, hb1_answer), (hb2, _) = heartbeat(1), heartbeat(2)
    stream = hb1 + hb2
    assert s.receive_client(stream[:5]) == [] and s.partial_request_at == 0
    assert s.receive_client(stream[5 : len(hb1) + 3]) == [ForwardUpstream(hb1)]
    assert s.partial_request_at == len(hb1), "the second frame begins where the first ended"
    assert s.receive_client(stream[len(hb1) + 3 :]) == [ForwardUpstream(hb2)]
    assert s.partial_request_at is None
    assert s.receive_upstream(hb1_answer[:6]) == []
    assert s.receive_upstream(hb1_answer[6:]) == [SendToClient(hb1_answer)]
    assert s.in_flight_count == 1


FETCH = 1


def produce_answer(correlation_id: int) -> bytes:
    return response_frame(PRODUCE, 7, correlation_id)


def fetch_answer(correlation_id: int, records: bytes) -> bytes:
    partition = {"partition_index": 0, "error_code": 0, "high_watermark": 1, "last_stable_offset": 1,
                 "log_start_offset": 0, "aborted_transactions": [], "preferred_read_replica": -1, "records": records}
    return response_frame(FETCH, 11, correlation_id, responses=[{"topic": "t", "partitions": [partition]}])


def big_produce(correlation_id: int) -> bytes:
    body = request_body(PRODUCE, 7, acks=1, timeout_ms=1500,
                        topic_data=[{"name": "t", "partition_data": [{"index": 0, "records": b"\x00" * 100_000}]}])
    return frame(encode_request(RequestHeader(PRODUCE, 7, correlation_id, "producer-1", 1, {}), body))


def test_big_frames_that_are_not_the_chunk_go_out_as_they_are_not_joined() -> None:
    """A chunk that completes a frame begun earlier is not forwarded as itself: its big frames go in
    one vectored write of the frames the session holds (``more``), not a join copying each of them."""
    s = plain_session()
    frames = [big_produce(c) for c in (1, 2, 3)]
    stream = b"".join(frames)
    assert s.receive_client(stream[:1000]) == []
    [command] = s.receive_client(stream[1000:])
    assert type(command) is ForwardUpstream
    assert [command.data, *command.more] == frames
    assert command.payload() == stream
    answers = [produce_answer(c) for c in (1, 2, 3)]
    s.receive_upstream(answers[0][:5])
    [command] = s.receive_upstream(answers[0][5:] + answers[1] + answers[2])
    assert type(command) is SendToClient and not command.more, "small answers are joined: one plain write"
    assert command.data == b"".join(answers)


def test_big_responses_that_are_not_the_chunk_go_out_as_they_are_not_joined() -> None:
    recorder = Recorder()  # an observer reads each response whole: spanning ones are joined for it
    s = Session(ResponseRewriter(AddressMap(ADVERTISED, BASE)), clock=Clock(), observer=recorder)
    requests = [req(FETCH, 11, c) for c in (1, 2)]
    s.receive_client(b"".join(requests))
    answers = [fetch_answer(c, b"\x00" * 200_000) for c in (1, 2)]
    stream = b"".join(answers)
    assert s.receive_upstream(stream[:70_000]) == []
    [command] = s.receive_upstream(stream[70_000:])
    assert type(command) is SendToClient and [command.data, *command.more] == answers
    s.report()
    assert [ex.response for ex in recorder.done] == answers


def test_with_no_observer_a_response_spanning_reads_goes_out_as_the_reads_themselves() -> None:
    """Nothing reads it whole (no observer, no rewrite): the chunks as read are written, no copy
    but the first piece's (a view of the read that began the frame, at most one read)."""
    s = plain_session()
    s.receive_client(b"".join(req(FETCH, 11, c) for c in (1, 2)))
    first, second = fetch_answer(1, b"\x01" * 600_000), fetch_answer(2, b"\x02" * 1000)
    stream = first + second
    reads = [stream[i : i + 256 * 1024] for i in range(0, len(stream), 256 * 1024)]
    assert reads[-1].endswith(second) and len(reads) == 3
    assert s.receive_upstream(reads[0]) == [] and s.receive_upstream(reads[1]) == []
    [command] = s.receive_upstream(reads[2])
    assert type(command) is SendToClient and command.payload() == stream
    assert command.data == reads[0] and command.more[0] is reads[1], "the reads themselves, not copies"
    assert s.in_flight_count == 0


def test_with_no_observer_a_spanning_response_that_is_rewritten_is_joined_first() -> None:
    s = plain_session()
    s.receive_client(req(METADATA, 12, 1, topics=None))
    big = {"cluster_id": "c" * 100_000, "controller_id": 1, "topics": []}  # big enough to stay in pieces
    answer = resp(METADATA, 12, 1, brokers=BROKERS, **big)
    reads = [answer[:3], answer[3:11], answer[11:70_000], answer[70_000:]]  # the prefix and header cut too
    for read in reads[:-1]:
        assert s.receive_upstream(read) == []
    [command] = s.receive_upstream(reads[-1])
    assert type(command) is SendToClient and not command.more
    assert command.data == resp(METADATA, 12, 1, brokers=rewritten_brokers(BROKERS), **big)


def test_with_no_observer_a_spanning_response_a_policy_edits_is_joined_first() -> None:
    seen: list[bytes] = []

    def edit(response: bytes) -> bytes:
        seen.append(response)
        return response

    class EditFetch:
        def decide(self, exchange: Exchange) -> Verdict | None:
            return Verdict(on_response=edit)

    s = Session(ResponseRewriter(AddressMap(ADVERTISED, BASE)), clock=Clock(), policy=EditFetch())
    s.receive_client(req(FETCH, 11, 1))
    answer = fetch_answer(1, b"\x00" * 300_000)
    assert s.receive_upstream(answer[:100_000]) == []
    [command] = s.receive_upstream(answer[100_000:])
    assert seen == [answer] and type(seen[0]) is bytes, "the edit gets the whole frame"
    assert type(command) is SendToClient and command.data == answer and not command.more


def test_with_no_observer_a_spanning_response_out_of_order_still_closes() -> None:
    s = plain_session()
    s.receive_client(req(FETCH, 11, 1))
    answer = fetch_answer(2, b"\x00" * 100)
    assert s.receive_upstream(answer[:6]) == []
    [command] = s.receive_upstream(answer[6:])
    assert type(command) is CloseConnection and "correlation id 2" in command.reason


def test_a_rewritten_response_is_not_the_chunk_read() -> None:
    s = plain_session()
    s.receive_client(req(METADATA, 12, 1, topics=None))
    [command] = s.receive_upstream(metadata_response(1, BROKERS))
    assert type(command) is SendToClient
    assert command.data == metadata_response(1, rewritten_brokers(BROKERS))
    assert [r.node_id for r in command.routes] == [1, 2]


def test_due_local_answers_come_before_the_forward_of_the_same_chunk() -> None:
    """The server claims the client side for a SendToClient before it awaits anything else: an
    answer to the request forwarded next cannot overtake the local one."""
    s = plain_session()
    hb = heartbeat(2)[0]
    commands = s.receive_client(future_api_versions(1) + hb)
    assert [type(c) for c in commands] == [SendToClient, ForwardUpstream]
    assert commands[1] == ForwardUpstream(hb)
    assert decode_response(commands[0].data[4:], API_VERSIONS, 0).header.correlation_id == 1  # type: ignore[union-attr]


@pytest.mark.parametrize(("side", "data", "reject", "text"), [
    ("client", struct.pack(">i", 2**31 - 1), "request_oversize", "bad request from client: frame size"),
    ("client", frame(b"\x00\x03"), "request_session", "bad request from client: request frame of 6 bytes"),
    ("upstream", struct.pack(">i", -1), "response_oversize", "bad response from upstream: negative frame size"),
    ("upstream", heartbeat(9)[1], "response_session", "bad response from upstream: response with correlation id 9"),
])
def test_protocol_errors_close_as_rejects_with_their_reason(side: str, data: bytes, reject: str, text: str) -> None:
    s = plain_session(max_frame_size=1000)
    hb = heartbeat(1)[0]
    receive = s.receive_client if side == "client" else s.receive_upstream
    [command] = receive(hb + data) if side == "client" else receive(data)
    assert isinstance(command, CloseConnection)
    assert command.kind is CloseKind.REJECT and command.reject == reject
    assert command.reason.startswith(text), command.reason


def test_reject_reasons_are_exactly_the_dashboard_label_values() -> None:
    from kproxy.metrics.stats import KNOWN_REJECT_REASONS

    assert KNOWN_REJECT_REASONS == ("request_oversize", "request_session", "request_timeout", "response_oversize",
                                    "response_session")
    assert [str(r) for r in RejectReason] == list(KNOWN_REJECT_REASONS)


class Decider:
    """A :class:`RequestPolicy` that lets everything go on, noting what it was shown."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str | None, dict[str, Any] | None]] = []

    def decide(self, exchange: Exchange) -> None:
        try:
            body = exchange.request_body()
        except ProtocolError:
            body = None  # a version kproxy cannot read: the body is opaque
        self.seen.append((exchange.correlation_id, exchange.client_id, body))


def test_a_policy_returning_none_changes_nothing() -> None:
    requests = [req(METADATA, 12, 1, topics=[{"topic_id": uuid.UUID(int=0), "name": "orders"}]),
                produce(9, 2, 0), future_api_versions(3, 5), heartbeat(4)[0]]
    answers = [metadata_response(1, BROKERS), heartbeat(4)[1]]
    policy = Decider()
    outputs = []
    for s in (plain_session(), plain_session(policy=policy)):
        out: list[Command] = []
        for r in requests:
            out += s.receive_client(r)
        for a in answers:
            out += s.receive_upstream(a)
        outputs.append(out)
    assert outputs[0] == outputs[1]
    assert [(c, cid, body is None) for c, cid, body in policy.seen] == [
        (1, "kproxy-test", False), (2, "producer-1" * 3, False), (3, "cli", True), (4, "kproxy-test", False)], (
        "every request, the acks=0 Produce and the KIP-511 one included, each with its header read")
    assert policy.seen[0][2] is not None
    assert policy.seen[0][2]["topics"][0]["name"] == "orders", "a request's topics, before it is forwarded"


def test_the_header_is_read_for_the_observer_and_the_frame_let_go_after() -> None:
    recorder = Recorder()
    s = Session(ResponseRewriter(AddressMap(ADVERTISED, BASE)), clock=Clock(), observer=recorder)
    request = req(METADATA, 12, 7, topics=None)
    s.receive_client(request)
    s.report()
    [ex] = recorder.requests
    assert (ex.api_key, ex.api_version, ex.correlation_id, ex.request_size) == (METADATA, 12, 7, len(request))
    assert ex.request == b"", "not held for the broker's round trip once seen"
    assert s.in_flight_count == 1


# -- one path for a request, whatever the verdict ------------------------------------------------
class Always:
    """A :class:`RequestPolicy` giving every request the same verdict."""

    def __init__(self, verdict: Verdict | None) -> None:
        self.verdict = verdict

    def decide(self, exchange: Exchange) -> Verdict | None:
        return self.verdict


@pytest.mark.parametrize(("verdict", "held_s"), [(Verdict(hold_s=0.5, held_by=("r1", "delay")), 0.5),
                                                (Verdict(response_delay_s=0.5), 0.5),
                                                (Verdict(on_response=lambda f: f[:4]), 0.0)])
def test_api_versions_beyond_what_kproxy_reads_gets_the_kip511_answer_whatever_the_verdict(
        verdict: Verdict, held_s: float) -> None:
    """A rule on every request does not send an ApiVersions kproxy cannot read to the broker (whose
    answer it could not read either: the connection would close); it gets the KIP-511 answer, held
    as the verdict says (an edit of the broker's answer has none to edit)."""
    clock = Clock()
    s, done = session(clock, policy=Always(verdict))
    assert s.on_client_frame(future_api_versions(42)) is None, "answered locally, not forwarded"
    if held_s:
        assert not s.has_ready, "held as the verdict says"
        clock.now += held_s
        s._run(s.on_timer(clock.now))
    [answer] = ready(s)
    lo, hi = supported_versions(API_VERSIONS)  # type: ignore[misc]
    assert answer == frame(struct.pack(">ihihhh", 42, 35, 1, API_VERSIONS, lo, hi))
    s.report()
    assert [(e.correlation_id, e.local) for e in done] == [(42, True)]


def test_a_local_answer_keeps_the_verdicts_response_delay_and_charges_it() -> None:
    """An injected answer with a delay at the response side leaves that long after it was made,
    like a broker's answer, and its wait is charged to the verdict's ``held_by``; a later request
    reusing the id with a hold charged to no one is not charged to the first one's rule."""
    clock = Clock()
    hb, _ = heartbeat(1)
    injected = resp(HEARTBEAT, 4, 1, error_code=27)
    policy = Always(Verdict(forward=False, answer=injected, response_delay_s=0.25, held_by=("r1", "delay")))
    s, done = session(clock, policy=policy)
    commands = s.receive_client(hb)
    assert commands == [WakeAt(clock.now + 0.25)], "nothing sent yet: a wake-up asked for"
    clock.now += 0.25
    s._run(s.on_timer(clock.now))
    assert ready(s) == [injected]
    policy.verdict = Verdict(hold_s=0.1)
    assert s.on_client_frame(hb) == hb
    s.on_upstream_frame(heartbeat(1)[1])
    clock.now += 0.1
    s._run(s.on_timer(clock.now))
    assert ready(s) == [heartbeat(1)[1]]
    s.report()
    assert [e.held for e in done] == [(0.25, ("r1", "delay")), (pytest.approx(0.1), None)]


def test_a_request_with_no_verdict_carries_no_ruling_and_no_memo() -> None:
    """The policy's and the observers' parts of an exchange cost a request nothing when unused."""
    s, done = session(policy=Always(None))
    hb, hb_answer = heartbeat(1)
    forward(s, [hb])
    s.on_upstream_frame(hb_answer)
    s.report()
    [ex] = done
    assert (ex.ruling, ex.memo, ex.rule_decisions, ex.held, ex.response_body_offset) == (None, None, (), None, 0)


def test_what_a_policy_writes_lands_on_the_exchanges_parts() -> None:
    """A policy reads and writes the exchange by the names it always had (client_id,
    request_body_offset, rule_decisions); the rule decisions live on the exchange's Ruling, made
    at the first write, and reach the observer at ``complete``."""
    decision = ("r1", "delay", "0.0ms at request", True)

    class Records:
        def decide(self, exchange: Exchange) -> None:
            assert exchange.ruling is None and exchange.rule_decisions == ()
            exchange.client_id, exchange.request_body_offset = "known", exchange.request_body_offset
            exchange.rule_decisions = (*exchange.rule_decisions, decision)

    s, done = session(policy=Records())
    hb, hb_answer = heartbeat(1)
    forward(s, [hb])
    s.on_upstream_frame(hb_answer)
    assert ready(s) == [hb_answer]
    s.report()
    [ex] = done
    assert ex.client_id == "known"
    assert ex.ruling is not None and ex.rule_decisions == (decision,) and ex.held is None


def test_an_idle_session_holds_no_queue_buffers() -> None:
    # Thousands of connections sit idle between requests: what a session keeps once its requests are
    # answered is per connection. Its queues are lists (and the acks=0 one is made at the first acks=0
    # Produce), not deques, each of which keeps a block of 64 slots once made (~1.9 KB for the three: a
    # session was 3.7 KB before, 2.9 KB now as pure Python, 1.5 KB compiled).
    rewriter = ResponseRewriter(AddressMap(ADVERTISED, BASE))
    request, answer = heartbeat(1)
    kept = []
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(200):
            s = Session(rewriter)
            s.receive_client(request)
            s.receive_upstream(answer)
            kept.append(s)
        gc.collect()
        per_session = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    assert all(s.in_flight_count == 0 for s in kept)
    assert per_session < 3500, per_session
