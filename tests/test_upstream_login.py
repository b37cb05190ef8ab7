"""kproxy's own upstream SASL login, sans-IO: the login machine against a scripted broker whose
mechanisms are tests/sasl_front.py's (scramp's SCRAM: a wrong client proof or server signature
fails), and a Session with a login (client requests held, in order, across logins).

The end-to-end tests, with real clients through kproxy to the front, are tests/test_sasl_upstream.py.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.framing import FrameSplitter
from kproxy.protocol.payloads import decode_request, decode_response
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.commands import CloseConnection, Command, ForwardUpstream, SendToClient, WakeAt
from kproxy.proxy.session import Session
from kproxy.sasl.client import Credentials, ScramKeys
from kproxy.sasl.login_gate import REFUSAL_LINGER_S
from kproxy.sasl.upstream_login import (
    ERROR,
    FAILURE,
    SUCCESS,
    LoginResult,
    UpstreamLogin,
    refusal_answer,
)
from tests.sasl_front import MECHANISMS, Refused, mechanism_server, unsecured_jws
from tests.sasl_front import Credentials as FrontCredentials
from tests.support.clock import Clock

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE, METADATA, HEARTBEAT, FIND_COORDINATOR = 18, 17, 36, 3, 12, 10


class ScriptedBroker:
    """A broker's SASL answers, frame by frame: ApiVersions (v0 body), SaslHandshake, SaslAuthenticate
    checked by the front's mechanism servers; ``lifetime_ms`` as KIP-368's session lifetime."""

    def __init__(self, *, password: str = "s3cret", lifetime_ms: int = 0, auth_max: int = 2,
                 mechanisms: tuple[str, ...] = MECHANISMS) -> None:
        self.credentials = FrontCredentials()
        self.credentials.set_password("alice", password)
        self.credentials.set_oauth(subject="alice")
        self.lifetime_ms = lifetime_ms
        self.auth_max = auth_max
        self.mechanisms = mechanisms
        self.server: Any = None
        self.principals: list[str] = []

    def answer(self, frame: bytes) -> bytes:
        request = decode_request(frame[4:])
        h = request.header
        if h.api_key == API_VERSIONS:
            keys = [{"api_key": SASL_HANDSHAKE, "min_version": 0, "max_version": 1},
                    {"api_key": SASL_AUTHENTICATE, "min_version": 0, "max_version": self.auth_max}]
            return response_frame(API_VERSIONS, 0, h.correlation_id, error_code=0, api_keys=keys)
        if h.api_key == SASL_HANDSHAKE:
            mechanism = request.body["mechanism"]
            if mechanism not in self.mechanisms:
                return response_frame(SASL_HANDSHAKE, h.api_version, h.correlation_id, error_code=33,
                                      mechanisms=list(self.mechanisms))
            self.server = mechanism_server(mechanism, self.credentials)
            return response_frame(SASL_HANDSHAKE, h.api_version, h.correlation_id, error_code=0,
                                  mechanisms=list(self.mechanisms))
        assert h.api_key == SASL_AUTHENTICATE
        try:
            reply, principal = self.server.step(bytes(request.body["auth_bytes"]))
        except Refused as exc:
            return response_frame(SASL_AUTHENTICATE, h.api_version, h.correlation_id, error_code=58,
                                  error_message=str(exc))
        if principal is not None:
            self.principals.append(principal)
        return response_frame(SASL_AUTHENTICATE, h.api_version, h.correlation_id, error_code=0, auth_bytes=reply,
                              session_lifetime_ms=self.lifetime_ms if principal is not None else 0)


def credentials(mechanism: str, secret: str = "s3cret") -> Credentials:
    if mechanism == "OAUTHBEARER":
        return Credentials(mechanism, None, unsecured_jws("alice") if secret == "s3cret" else secret)
    return Credentials(mechanism, "alice", secret)


def run_login(login: UpstreamLogin, broker: ScriptedBroker, refuses: Any = lambda _: False) -> tuple[
        LoginResult, list[bytes]]:
    """Drive ``login`` to its end against ``broker``; the requests it sent, in order."""
    sent: list[bytes] = []
    pending = FrameSplitter().split(login.begin(refuses))[0]
    while True:
        assert pending, "the login stalled"
        frame = pending.pop(0)
        sent.append(frame)
        correlation_id = int.from_bytes(frame[8:12], "big", signed=True)
        assert login.awaits(correlation_id)
        out, result = login.answer(correlation_id, broker.answer(frame), refuses)
        if out:
            pending += FrameSplitter().split(out)[0]
        if result is not None:
            assert not pending
            return result, sent


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_each_mechanism_logs_in_against_an_independent_server(mechanism: str) -> None:
    results: list[LoginResult] = []
    broker = ScriptedBroker(lifetime_ms=10_000)
    clock = Clock()
    login = UpstreamLogin(lambda: credentials(mechanism), clock=clock, report=results.append)
    result, sent = run_login(login, broker)
    assert result == LoginResult(mechanism, False, SUCCESS, 0, "", 10_000) and results == [result]
    assert broker.principals == ["User:alice"]
    # ApiVersions and SaslHandshake v1 first, then SaslAuthenticate v2 (what the broker reads at most).
    kinds = [(int.from_bytes(f[4:6], "big"), int.from_bytes(f[6:8], "big")) for f in sent]
    rounds = 2 if mechanism.startswith("SCRAM") else 1
    assert kinds == [(API_VERSIONS, 0), (SASL_HANDSHAKE, 1), *[(SASL_AUTHENTICATE, 2)] * rounds]
    assert all(decode_request(f[4:]).header.client_id == "kproxy" for f in sent)
    # Re-authentication due at 85-95 % of the lifetime.
    assert login.reauth_at is not None and clock.now + 8.5 <= login.reauth_at <= clock.now + 9.5
    assert not login.in_progress


def test_a_reauthentication_is_a_handshake_and_reads_the_credentials_afresh() -> None:
    secret = ["s3cret"]
    broker = ScriptedBroker(lifetime_ms=2000)
    login = UpstreamLogin(lambda: credentials("SCRAM-SHA-256", secret[0]), clock=Clock())
    assert run_login(login, broker)[0].result == SUCCESS
    broker.credentials.set_password("alice", "n3w")
    secret[0] = "n3w"
    result, sent = run_login(login, broker)
    assert result.result == SUCCESS and result.reauthentication
    assert [int.from_bytes(f[4:6], "big") for f in sent] == [SASL_HANDSHAKE, SASL_AUTHENTICATE, SASL_AUTHENTICATE]


def test_the_next_login_waits_a_second_at_least_after_the_last_began() -> None:
    clock = Clock()
    login = UpstreamLogin(lambda: credentials("PLAIN"), clock=clock)
    run_login(login, ScriptedBroker(lifetime_ms=200))
    assert login.reauth_at == pytest.approx(clock.now + 1.0)  # a broker refuses a second one sooner
    assert not login.due(clock.now + 0.5) and login.due(clock.now + 1.0)


def test_sasl_authenticate_v1_where_the_broker_has_no_v2() -> None:
    _, sent = run_login(UpstreamLogin(lambda: credentials("PLAIN")), ScriptedBroker(auth_max=1))
    assert int.from_bytes(sent[-1][6:8], "big") == 1


@pytest.mark.parametrize(("mechanism", "message"), [
    ("PLAIN", "Authentication failed: Invalid username or password"),
    ("SCRAM-SHA-512", "Authentication failed during authentication due to invalid credentials with SASL mechanism "
                      "SCRAM-SHA-512"),
    ("OAUTHBEARER", '{"status": "invalid_token"}'),
])
def test_a_refusal_carries_the_brokers_code_and_words_never_the_secret(mechanism: str, message: str) -> None:
    secret = "wrong-" + mechanism if mechanism != "OAUTHBEARER" else unsecured_jws("mallory")
    result, _ = run_login(UpstreamLogin(lambda: credentials(mechanism, secret)), ScriptedBroker())
    assert (result.result, result.error_code, result.message) == (FAILURE, 58, message)
    assert result.reason == (f"upstream SASL authentication ({mechanism}) failure: SASL_AUTHENTICATION_FAILED: "
                             f"{message}")
    assert secret not in repr(result) and secret not in repr(credentials(mechanism, secret))


def test_a_broker_that_cannot_prove_it_holds_the_scram_credential_is_refused() -> None:
    broker = ScriptedBroker()
    login = UpstreamLogin(lambda: credentials("SCRAM-SHA-256"))
    pending = FrameSplitter().split(login.begin(lambda _: False))[0]
    for frame in pending:  # ApiVersions, SaslHandshake
        out, _ = login.answer(int.from_bytes(frame[8:12], "big", signed=True), broker.answer(frame), lambda _: False)
    first = FrameSplitter().split(out)[0][0]
    out, _ = login.answer(int.from_bytes(first[8:12], "big", signed=True), broker.answer(first), lambda _: False)
    final = FrameSplitter().split(out)[0][0]
    real = decode_response(broker.answer(final)[4:], SASL_AUTHENTICATE, 2).body
    forged = response_frame(SASL_AUTHENTICATE, 2, int.from_bytes(final[8:12], "big", signed=True), error_code=0,
                            auth_bytes=b"v=" + b"A" * (len(real["auth_bytes"]) - 2))
    _, result = login.answer(int.from_bytes(final[8:12], "big", signed=True), forged, lambda _: False)
    assert result is not None and result.result == ERROR
    assert "signature does not verify" in result.message


@pytest.mark.parametrize(("server_first", "reason"), [
    ("r=someone-elses-nonce,s=c2FsdA==,i=4096", "nonce does not extend"),
    ("r={nonce}x,s=c2FsdA==,i=1000", "1000 iterations"),
    ("r={nonce}x,s=c2FsdA==,i=99999", "99999 iterations"),
    ("e=unknown-user", "the broker refused"),
    ("garbage", "malformed"),
])
def test_a_wrong_scram_server_first_message_ends_the_login(server_first: str, reason: str) -> None:
    login = UpstreamLogin(lambda: credentials("SCRAM-SHA-256"))
    broker = ScriptedBroker()
    for frame in FrameSplitter().split(login.begin(lambda _: False))[0]:
        out, _ = login.answer(int.from_bytes(frame[8:12], "big", signed=True), broker.answer(frame), lambda _: False)
    first = FrameSplitter().split(out)[0][0]
    nonce = decode_request(first[4:]).body["auth_bytes"].decode().split("r=")[1]
    answer = response_frame(SASL_AUTHENTICATE, 2, int.from_bytes(first[8:12], "big", signed=True), error_code=0,
                            auth_bytes=server_first.format(nonce=nonce).encode())
    _, result = login.answer(int.from_bytes(first[8:12], "big", signed=True), answer, lambda _: False)
    assert result is not None and result.result == ERROR and reason in result.message


def test_a_mechanism_the_broker_does_not_offer_names_what_it_offers() -> None:
    result, _ = run_login(UpstreamLogin(lambda: credentials("SCRAM-SHA-512")), ScriptedBroker(mechanisms=("PLAIN",)))
    assert (result.result, result.error_code) == (FAILURE, 33)
    assert result.message == "the broker does not offer SCRAM-SHA-512 (it offers: PLAIN)"


def test_an_unreadable_answer_is_an_error_not_a_crash() -> None:
    login = UpstreamLogin(lambda: credentials("PLAIN"))
    frames = FrameSplitter().split(login.begin(lambda _: False))[0]
    correlation_id = int.from_bytes(frames[0][8:12], "big", signed=True)
    _, result = login.answer(correlation_id, b"\x00\x00\x00\x06" + frames[0][8:12] + b"\xff\xff", lambda _: False)
    assert result is not None and result.result == ERROR and result.message.startswith("unreadable answer")


def test_correlation_ids_are_kproxys_own_and_never_one_the_client_may_be_answered_under() -> None:
    taken = {-1, -2, -5}
    login = UpstreamLogin(lambda: credentials("PLAIN"))
    _, sent = run_login(login, ScriptedBroker(), refuses=taken.__contains__)
    ids = [int.from_bytes(f[8:12], "big", signed=True) for f in sent]
    assert ids == [-3, -4, -6] and not taken.intersection(ids)


def test_scram_keys_are_computed_once_per_password_salt_and_iterations() -> None:
    keys = ScramKeys(size=2)
    broker = ScriptedBroker()
    for _ in range(3):
        assert run_login(UpstreamLogin(lambda: credentials("SCRAM-SHA-256"), keys=keys), broker)[0].result == SUCCESS
    assert len(keys._keys) == 1  # the broker keeps one salt per user: one PBKDF2 for three logins


def test_refusal_answers() -> None:
    # ApiVersions, at any version: a v0 body with the error (what clients read at an error).
    answer = refusal_answer(request_frame(API_VERSIONS, 4, 7, client_software_name="x", client_software_version="1"),
                            58, "no")
    assert answer is not None
    assert decode_response(answer[4:], API_VERSIONS, 0).body == {"error_code": 58, "api_keys": []}
    # A response with its own error code at the top says it, with the message where it has one.
    answer = refusal_answer(request_frame(FIND_COORDINATOR, 3, 8, key="g"), 58, "broker's words")
    assert answer is not None
    body = decode_response(answer[4:], FIND_COORDINATOR, 3).body
    assert (body["error_code"], body["error_message"]) == (58, "broker's words")
    # None where the answer would read as a success (Metadata has no error code at the top).
    assert refusal_answer(request_frame(METADATA, 12, 9, topics=[]), 58, "no") is None
    assert refusal_answer(b"\x00\x00\x00\x02\xff\xff", 58, "no") is None


# -- a Session with a login --------------------------------------------------------------------
class LoggedSession:
    """A Session with an upstream login, wired to a scripted broker; collects what goes where."""

    def __init__(self, broker: ScriptedBroker, mechanism: str = "SCRAM-SHA-256", secret: str = "s3cret") -> None:
        self.clock = Clock()
        self.broker = broker
        self.results: list[LoginResult] = []
        self.login = UpstreamLogin(lambda: credentials(mechanism, secret), clock=self.clock, timeout=5,
                                   report=self.results.append, rng=random.Random(1))
        self.session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), clock=self.clock, login=self.login)
        self.upstream: list[bytes] = []  # every frame written to the broker, in order
        self.client: list[bytes] = []  # every frame written to the client, in order
        self.closed: CloseConnection | None = None
        self.wakes: list[float] = []

    def run(self, commands: list[Command]) -> None:
        for command in commands:
            if isinstance(command, ForwardUpstream):
                self.upstream += FrameSplitter().split(command.payload())[0]
            elif isinstance(command, SendToClient):
                self.client += FrameSplitter().split(command.payload())[0]
            elif isinstance(command, WakeAt):
                self.wakes.append(command.when)
            else:
                assert isinstance(command, CloseConnection)
                self.closed = command

    def from_client(self, *frames: bytes) -> None:
        self.run(self.session.receive_client(b"".join(frames)))

    def broker_answers(self, count: int | None = None, answers: dict[int, bytes] | None = None) -> None:
        """The broker answers the frames sent and not answered yet, in order (``count`` of them at most,
        every one by default, those sent meanwhile included): its own SASL answers, or ``answers`` by
        correlation id for the client's requests (it stops at a request without one)."""
        answers = answers or {}
        done = 0
        while self.answered < len(self.upstream) and (count is None or done < count):
            frame = self.upstream[self.answered]
            correlation_id = int.from_bytes(frame[8:12], "big", signed=True)
            if correlation_id >= 0 and correlation_id not in answers:
                return
            self.answered += 1
            done += 1
            out = answers[correlation_id] if correlation_id >= 0 else self.broker.answer(frame)
            self.run(self.session.receive_upstream(out))

    answered = 0


def heartbeat(correlation_id: int) -> tuple[bytes, bytes]:
    return (request_frame(HEARTBEAT, 4, correlation_id, group_id="g", generation_id=1, member_id="m"),
            response_frame(HEARTBEAT, 4, correlation_id, error_code=0))


def test_the_client_first_requests_wait_for_the_login_then_go_up_in_order() -> None:
    s = LoggedSession(ScriptedBroker())
    pairs = [heartbeat(i) for i in range(1, 4)]
    assert s.session.can_accept
    s.from_client(*(q for q, _ in pairs))
    assert not s.session.can_accept  # one chunk held: the client is read no further meanwhile
    assert [int.from_bytes(f[4:6], "big") for f in s.upstream] == [API_VERSIONS, SASL_HANDSHAKE]
    assert s.wakes == [s.clock.now + 5]  # the login's deadline
    s.broker_answers(2)  # ApiVersions, SaslHandshake: client-first goes up
    s.broker_answers(1)  # server-first: client-final goes up
    assert not any(int.from_bytes(f[8:12], "big", signed=True) > 0 for f in s.upstream)
    s.broker_answers(1)  # server-final: the login succeeded, the held requests go up, in order
    assert s.results[-1].result == SUCCESS and s.session.can_accept
    assert s.upstream[-3:] == [q for q, _ in pairs]
    s.broker_answers(answers={i: a for i, (_, a) in enumerate(pairs, 1)})
    assert s.client == [a for _, a in pairs]  # never a SASL answer: those were kproxy's
    assert s.closed is None


def test_pipelined_requests_across_a_reauthentication_keep_their_order() -> None:
    s = LoggedSession(ScriptedBroker(lifetime_ms=2000), mechanism="PLAIN")
    pairs = [heartbeat(i) for i in range(1, 9)]
    s.from_client(pairs[0][0])
    s.broker_answers()  # the login, then request 1
    s.broker_answers(answers={1: pairs[0][1]})
    reauth_at = s.login.reauth_at
    assert reauth_at is not None and reauth_at in s.wakes
    # Requests 2-4 in flight when the re-authentication is due.
    s.from_client(*(q for q, _ in pairs[1:4]))
    s.clock.now = reauth_at
    s.run(s.session.on_timer(s.clock.now))
    assert int.from_bytes(s.upstream[-1][4:6], "big") == SASL_HANDSHAKE
    # Requests 5-8 arrive during it: held, not sent.
    s.from_client(*(q for q, _ in pairs[4:]))
    assert [int.from_bytes(f[8:12], "big", signed=True) for f in s.upstream if f[4:6] == b"\x00\x0c"] == [1, 2, 3, 4]
    # The broker answers in order: 2-4 first (released to the client), then the re-authentication.
    s.broker_answers(answers={i: a for i, (_, a) in enumerate(pairs, 1)})
    assert s.results[-1].reauthentication and s.results[-1].result == SUCCESS
    s.broker_answers(answers={i: a for i, (_, a) in enumerate(pairs, 1)})
    assert s.client == [a for _, a in pairs]
    heartbeats = [f for f in s.upstream if f[4:6] == b"\x00\x0c"]
    assert heartbeats == [q for q, _ in pairs]
    assert s.closed is None


def test_a_refused_first_login_answers_the_clients_first_request_then_closes() -> None:
    s = LoggedSession(ScriptedBroker(), mechanism="PLAIN", secret="wrong")
    s.from_client(request_frame(API_VERSIONS, 3, 1, client_software_name="x", client_software_version="1"),
                  heartbeat(2)[0])
    s.broker_answers()
    assert s.results[-1].result == FAILURE
    assert len(s.client) == 1
    assert decode_response(s.client[0][4:], API_VERSIONS, 0).body == {"error_code": 58, "api_keys": []}
    assert s.closed is not None and s.closed.linger == REFUSAL_LINGER_S
    assert s.closed.reason == ("upstream SASL authentication (PLAIN) failure: SASL_AUTHENTICATION_FAILED: "
                               "Authentication failed: Invalid username or password")
    assert "wrong" not in s.closed.reason
    assert not s.session.can_accept  # nothing more is read
    assert not any(f[4:6] == b"\x00\x0c" for f in s.upstream)  # nor sent


def test_a_login_with_no_answer_in_time_closes() -> None:
    s = LoggedSession(ScriptedBroker())
    s.from_client(heartbeat(1)[0])
    s.clock.now += 5
    s.run(s.session.on_timer(s.clock.now))
    assert s.closed is not None and "no answer within 5 s" in s.closed.reason
    assert s.results[-1].result == ERROR


def test_a_clients_own_sasl_is_answered_illegal_sasl_state_and_never_relayed() -> None:
    notices: list[str] = []
    s = LoggedSession(ScriptedBroker(), mechanism="PLAIN")
    s.login.on_client_sasl = lambda: notices.append("refused")
    s.from_client(heartbeat(1)[0])
    s.broker_answers()
    sent = len(s.upstream)
    s.from_client(request_frame(SASL_HANDSHAKE, 1, 2, mechanism="PLAIN"),
                  request_frame(SASL_AUTHENTICATE, 2, 3, auth_bytes=b"\0bob\0pw"))
    assert len(s.upstream) == sent  # neither reached the broker
    s.broker_answers(answers={1: heartbeat(1)[1]})
    handshake = decode_response(s.client[-2][4:], SASL_HANDSHAKE, 1).body
    authenticate = decode_response(s.client[-1][4:], SASL_AUTHENTICATE, 2).body
    assert (handshake["error_code"], handshake["mechanisms"]) == (34, [])
    assert authenticate["error_code"] == 34 and "sasl.upstream" in authenticate["error_message"]
    assert notices == ["refused"] and s.closed is None


# -- bounded -----------------------------------------------------------------------------------------
def test_a_brokers_error_message_is_kept_short_whatever_its_size() -> None:
    login = UpstreamLogin(lambda: credentials("PLAIN"))
    broker = ScriptedBroker()
    frames = FrameSplitter().split(login.begin(lambda _: False))[0]
    for frame in frames:
        out, _ = login.answer(int.from_bytes(frame[8:12], "big", signed=True), broker.answer(frame), lambda _: False)
    authenticate = FrameSplitter().split(out)[0][0]
    correlation_id = int.from_bytes(authenticate[8:12], "big", signed=True)
    huge = response_frame(SASL_AUTHENTICATE, 2, correlation_id, error_code=58, error_message="x" * 1_000_000)
    _, result = login.answer(correlation_id, huge, lambda _: False)
    assert result is not None and len(result.message) == 300


def test_an_oauthbearer_error_status_is_kept_short() -> None:
    from kproxy.sasl.client import OAuthBearerClient

    client = OAuthBearerClient(credentials("OAUTHBEARER"))
    assert client.respond(b"{" + b"x" * 100_000 + b"}") == b"\x01"
    assert client.error is not None and len(client.error) == 1024


def test_a_broker_frame_over_the_limit_during_a_login_closes_as_a_reject() -> None:
    s = LoggedSession(ScriptedBroker())
    s.session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), clock=s.clock, login=s.login,
                        max_frame_size=4096)
    s.from_client(heartbeat(1)[0])
    s.run(s.session.receive_upstream((1 << 20).to_bytes(4, "big") + b"\x00" * 16))
    assert s.closed is not None and s.closed.reject is not None and s.closed.reject.value == "response_oversize"


def test_a_client_is_read_no_further_than_one_chunk_during_a_login() -> None:
    s = LoggedSession(ScriptedBroker())
    assert s.session.can_accept
    s.from_client(heartbeat(1)[0][:7])  # even part of a frame
    assert not s.session.can_accept
    s.broker_answers()
    assert s.session.can_accept and s.session.partial_request_at == 0


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_mutated_broker_answers_end_the_login_without_an_exception(mechanism: str) -> None:
    """Each answer of a real exchange, with bytes flipped, cut or appended (800 seeded cases per
    mechanism): the login takes it or ends as an error; nothing else escapes."""
    rng = random.Random(25)
    broker = ScriptedBroker()
    for case in range(800):
        login = UpstreamLogin(lambda: credentials(mechanism), keys=ScramKeys())
        pending = FrameSplitter().split(login.begin(lambda _: False))[0]
        target = case % 4
        step = 0
        while pending:
            frame = pending.pop(0)
            correlation_id = int.from_bytes(frame[8:12], "big", signed=True)
            answer = bytearray(broker.answer(frame))
            if step == target:
                how = rng.randrange(3)
                if how == 0 and len(answer) > 8:
                    for _ in range(rng.randint(1, 4)):
                        answer[rng.randrange(8, len(answer))] = rng.randrange(256)
                elif how == 1:
                    answer = answer[:rng.randrange(8, len(answer) + 1)]
                else:
                    answer += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
                answer[:4] = (len(answer) - 4).to_bytes(4, "big")
            step += 1
            out, result = login.answer(correlation_id, bytes(answer), lambda _: False)
            if result is not None:
                assert result.result in (SUCCESS, FAILURE, ERROR)
                break
            pending += FrameSplitter().split(out)[0] if out else []


def test_a_broker_without_sasl_authenticate_is_an_error_and_the_handshakes_answer_is_dropped() -> None:
    login = UpstreamLogin(lambda: credentials("PLAIN"))
    api_versions, handshake = FrameSplitter().split(login.begin(lambda _: False))[0]
    old = response_frame(API_VERSIONS, 0, int.from_bytes(api_versions[8:12], "big", signed=True), error_code=0,
                         api_keys=[{"api_key": SASL_HANDSHAKE, "min_version": 0, "max_version": 0}])
    _, result = login.answer(int.from_bytes(api_versions[8:12], "big", signed=True), old, lambda _: False)
    assert result is not None and result.result == ERROR and "no SaslHandshake v1" in result.message
    handshake_id = int.from_bytes(handshake[8:12], "big", signed=True)
    assert login.awaits(handshake_id)  # its answer still comes: taken and dropped, not a desync
    answer = response_frame(SASL_HANDSHAKE, 1, handshake_id, error_code=0, mechanisms=["PLAIN"])
    assert login.answer(handshake_id, answer, lambda _: False) == (b"", None)
    assert not login.awaits(handshake_id)
