"""The login gate (kproxy/sasl/login_gate.py) driven directly: client chunks and the broker's
answers in, frames for the broker and each login's end out. The broker is tests/test_upstream_login.py's
scripted one, whose mechanisms are tests/sasl_front.py's (a wrong password is refused).

How a session uses the gate (requests held across logins, read in order after them) is tested
through the session in tests/test_upstream_login.py.
"""

from __future__ import annotations

from kproxy.protocol.frame_builder import request_frame
from kproxy.protocol.framing import FrameSplitter
from kproxy.protocol.payloads import decode_response
from kproxy.sasl.client import Credentials
from kproxy.sasl.login_gate import LoginEnd, LoginGate
from kproxy.sasl.upstream_login import UpstreamLogin
from tests.support.clock import Clock
from tests.test_upstream_login import API_VERSIONS, HEARTBEAT, SASL_HANDSHAKE, ScriptedBroker

TIMEOUT = 5.0


def gate(clock: Clock, *, secret: str = "s3cret", hold_first: bool = True) -> LoginGate:
    login = UpstreamLogin(lambda: Credentials("PLAIN", "alice", secret), timeout=TIMEOUT, clock=clock)
    return LoginGate(login, lambda _: False, FrameSplitter(), hold_first=hold_first)


def drive(g: LoginGate, broker: ScriptedBroker, out: bytes) -> LoginEnd:
    """The broker answers ``out`` and every frame the login sends after it, until the login ends."""
    pending = FrameSplitter().split(out)[0]
    while pending:
        frame = pending.pop(0)
        correlation_id = int.from_bytes(frame[8:12], "big", signed=True)
        assert g.awaits(correlation_id)
        more, end = g.answer(correlation_id, broker.answer(frame))
        if end is not None:
            assert not more and not pending
            return end
        pending += FrameSplitter().split(more)[0]
    raise AssertionError("the login stalled")


def heartbeat(correlation_id: int) -> bytes:
    return request_frame(HEARTBEAT, 4, correlation_id, group_id="g", generation_id=1, member_id="m")


def api_key(frame: bytes) -> int:
    return int.from_bytes(frame[4:6], "big")


def test_the_first_chunk_begins_the_login_and_later_chunks_are_only_held() -> None:
    clock = Clock()
    g = gate(clock)
    assert g.held == [] and g.deadline is None  # shut from the start, no login yet
    out = g.hold(heartbeat(1), 1.0)
    assert [api_key(f) for f in FrameSplitter().split(out)[0]] == [API_VERSIONS, SASL_HANDSHAKE]
    assert g.deadline == clock.now + TIMEOUT
    assert g.hold(heartbeat(2), 2.0) == b""  # the login is under way: nothing more goes up
    end = drive(g, ScriptedBroker(), out)
    assert end.close is None and end.answer is None
    assert end.held == [(heartbeat(1), 1.0), (heartbeat(2), 2.0)]  # the chunks, in order, with their times
    assert g.held is None and g.deadline is None  # open: the client is read again


def test_a_refused_first_login_answers_the_first_request_and_stays_shut() -> None:
    g = gate(Clock(), secret="wrong")
    first = request_frame(API_VERSIONS, 3, 7, client_software_name="x", client_software_version="1")
    out = g.hold(first + heartbeat(8), None)
    end = drive(g, ScriptedBroker(), out)
    assert end.close is not None and "SASL_AUTHENTICATION_FAILED" in end.close and "wrong" not in end.close
    assert end.answer is not None and int.from_bytes(end.answer[4:8], "big") == 7
    assert decode_response(end.answer[4:], API_VERSIONS, 0).body == {"error_code": 58, "api_keys": []}
    assert end.held == []  # nothing of the client is read
    assert g.held  # shut for good
    assert g.hold(heartbeat(9), None) == b""  # and no login begins again


def test_a_refused_first_login_whose_first_request_is_unreadable_closes_for_that() -> None:
    g = gate(Clock(), secret="wrong")
    out = g.hold((1 << 30).to_bytes(4, "big") + b"\x00" * 8, None)  # a frame far over the limit
    end = drive(g, ScriptedBroker(), out)
    assert end.close is not None and end.answer is None and end.error is not None


def test_a_login_without_an_answer_in_time_ends_at_its_deadline() -> None:
    clock = Clock()
    g = gate(clock)
    g.hold(heartbeat(1), None)
    clock.now += TIMEOUT - 0.001
    assert g.on_timer(clock.now) == (b"", None)
    clock.now += 0.001
    out, end = g.on_timer(clock.now)
    assert out == b"" and end is not None and end.close is not None and "no answer within 5 s" in end.close
    # A first login's end answers the client's first request with the error, here a Heartbeat's.
    assert end.answer is not None and int.from_bytes(end.answer[4:8], "big") == 1
    assert decode_response(end.answer[4:], HEARTBEAT, 4).body["error_code"] == 58


def test_a_reauthentication_begins_from_the_timer_and_holds_the_client() -> None:
    clock = Clock()
    g = gate(clock)
    broker = ScriptedBroker(lifetime_ms=10_000)
    assert drive(g, broker, g.hold(heartbeat(1), None)).close is None
    reauth_at = g.login.reauth_at
    assert reauth_at is not None and g.held is None
    assert g.wake() == reauth_at  # asked once ...
    assert g.wake() is None  # ... not again while it stays the same
    assert g.wake(again=True) == reauth_at  # unless the server forgot it
    clock.now = reauth_at - 0.001
    assert g.on_timer(clock.now) == (b"", None)
    clock.now = reauth_at
    out, end = g.on_timer(clock.now)
    assert end is None and [api_key(f) for f in FrameSplitter().split(out)[0]] == [SASL_HANDSHAKE]
    assert g.held == [] and g.wake() == clock.now + TIMEOUT  # held; the wake-up is the login's deadline
    assert g.hold(heartbeat(2), None) == b""  # a re-authentication is begun by the timer, not by a chunk
    end = drive(g, broker, out)
    assert end.close is None and end.held == [(heartbeat(2), None)]


def test_a_refused_reauthentication_closes_without_answering_a_request() -> None:
    clock = Clock()
    g = gate(clock)
    broker = ScriptedBroker(lifetime_ms=10_000)
    drive(g, broker, g.hold(heartbeat(1), None))
    assert g.login.reauth_at is not None
    clock.now = g.login.reauth_at
    out, _ = g.on_timer(clock.now)
    g.hold(heartbeat(2), None)
    broker.credentials.set_password("alice", "rotated")  # the broker no longer takes kproxy's password
    end = drive(g, broker, out)
    assert end.close is not None and end.answer is None  # only a first login's refusal answers a request


def test_in_terminate_mode_the_client_is_held_from_its_own_login_on() -> None:
    g = gate(Clock(), hold_first=False)
    assert g.held is None  # the client's own login runs first, read as any request
    g.hold_from_now()
    assert g.held == [] and g.login.logins == 0  # held, no login before the connection is open
    assert g.hold(heartbeat(3), None) != b""  # as on a fresh connection, a chunk would begin it
    g2 = gate(Clock(), hold_first=False)
    g2.hold_from_now()
    out = g2.begin()  # the upstream connection is open
    assert [api_key(f) for f in FrameSplitter().split(out)[0]] == [API_VERSIONS, SASL_HANDSHAKE]
    assert g2.hold(heartbeat(4), None) == b""
    assert drive(g2, ScriptedBroker(), out).held == [(heartbeat(4), None)]


def test_the_clients_own_sasl_is_refused_not_relayed() -> None:
    g = gate(Clock())
    answer = g.refuse_client_sasl(request_frame(SASL_HANDSHAKE, 1, 5, mechanism="PLAIN"))
    assert answer is not None
    assert decode_response(answer[4:], SASL_HANDSHAKE, 1).body["error_code"] == 34  # ILLEGAL_SASL_STATE
