"""Terminate mode in the sans-IO session: kproxy answers a client's SASL as a Kafka broker does.

Exact frames in, exact commands out (no sockets). The client side of SCRAM is scramp's, which
checks kproxy's server signature; the answers are decoded with kproxy's codec and compared with
what Kafka's SaslServerAuthenticator sends in each state. No upstream connection exists before the
client logged in: ApiVersions is answered from the cluster's answers kproxy keeps, and the session
asks for the connection (ConnectUpstream) only after the answer that tells the client it is in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import scramp

from kproxy.protocol import decode_response
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.framing import FrameSplitter
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.commands import (
    CloseConnection,
    CloseKind,
    Command,
    ConnectUpstream,
    ForwardUpstream,
    RejectReason,
    SendToClient,
    VerifyCredentials,
    WakeAt,
)
from kproxy.proxy.session import Exchange, RequestPolicy, Session, Verdict
from kproxy.sasl.authenticator import ANSWERED_VERSIONS, MAX_RECEIVE_SIZE, ClientAuth, Outcome
from kproxy.sasl.client import Credentials
from kproxy.sasl.credentials import PLAIN_MIN_ITERATIONS, CredentialStore, user_credentials
from kproxy.sasl.server import CredentialChecker
from kproxy.sasl.upstream_login import UpstreamLogin
from tests.support.clock import Clock
from tests.test_upstream_login import ScriptedBroker

METADATA, SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE = 3, 17, 18, 36
NONE, UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 0, 33, 34, 58
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# The cluster's ApiVersions answer, as kproxy's upstream check got it (correlation id 0), at v0-v4: its own
# SASL versions (which clients must not see: kproxy answers SASL) and a finalized feature (v3+).
CLUSTER_KEYS = [{"api_key": 0, "min_version": 0, "max_version": 11}, {"api_key": METADATA, "min_version": 0,
                "max_version": 12}, {"api_key": API_VERSIONS, "min_version": 0, "max_version": 4},
                {"api_key": SASL_HANDSHAKE, "min_version": 1, "max_version": 1}]
CLUSTER_ANSWERS = {v: response_frame(API_VERSIONS, v, 0, api_keys=CLUSTER_KEYS, finalized_features_epoch=7,
                                     finalized_features=[{"name": "metadata.version", "min_version_level": 14,
                                                          "max_version_level": 14}]) for v in range(5)}


def cluster_versions(correlation_id: int, version: int) -> bytes | None:
    frame = CLUSTER_ANSWERS.get(version)
    return None if frame is None else frame[:4] + correlation_id.to_bytes(4, "big", signed=True) + frame[8:]


@pytest.fixture(scope="module")
def store() -> CredentialStore:
    return CredentialStore({
        "alice": user_credentials("alice-secret", MECHANISMS, plain_iterations=PLAIN_MIN_ITERATIONS),
        "bob": user_credentials("bob-secret", MECHANISMS, plain_iterations=PLAIN_MIN_ITERATIONS),
    })


@pytest.fixture
def checker(store: CredentialStore) -> CredentialChecker:
    """A fresh checker each test: nothing verified yet."""
    return CredentialChecker(store, MECHANISMS)


@dataclass
class Client:
    """One terminate-mode session and what its commands did: frames to the client, bytes upstream,
    the close, and the verifications run (synchronously here: the server runs them in a thread)."""

    session: Session
    clock: Clock
    outcomes: list[Outcome]
    to_client: list[bytes] = field(default_factory=list)
    upstream: list[bytes] = field(default_factory=list)
    closed: CloseConnection | None = None
    verifications: int = 0
    connects: int = 0  # ConnectUpstream executed (the upstream connection opened)
    log: list[str] = field(default_factory=list)  # the commands' kinds, in order

    def send(self, *frames: bytes) -> None:
        self._run(self.session.receive_client(b"".join(frames)))

    def broker(self, frame: bytes) -> None:
        self._run(self.session.receive_upstream(frame))

    def _run(self, commands: list[Command]) -> None:
        for command in commands:
            assert self.closed is None, "a command after the close"
            self.log.append(type(command).__name__)
            if isinstance(command, ForwardUpstream):
                assert self.connects == 1, "a write upstream before the upstream connection"
            if isinstance(command, SendToClient):
                self.to_client += FrameSplitter().split(command.payload())[0]
            elif isinstance(command, ForwardUpstream):
                self.upstream.append(command.payload())
            elif isinstance(command, VerifyCredentials):
                assert command is commands[-1], "a verification comes last in its list"
                self.verifications += 1
                self._run(self.session.verified(command.work()))
            elif isinstance(command, CloseConnection):
                self.closed = command
            elif isinstance(command, ConnectUpstream):
                assert self.connects == 0 and self.session.principal is not None, "connected twice, or before a login"
                self.connects += 1
                self._run(self.session.upstream_connected())
            else:
                assert isinstance(command, WakeAt)

    def answer(self, api_key: int, version: int) -> dict[str, Any]:
        """The one answer sent since the last call, decoded as a response to (api_key, version)."""
        assert len(self.to_client) == 1, self.to_client
        frame = self.to_client.pop()
        return decode_response(frame[4:], api_key, version).body

    def raw(self) -> bytes:
        assert len(self.to_client) == 1, self.to_client
        return self.to_client.pop()[4:]


def client(checker: CredentialChecker, lifetime: float = 0.0, login: UpstreamLogin | None = None,
           versions: Any = cluster_versions, policy: RequestPolicy | None = None) -> Client:
    outcomes: list[Outcome] = []
    clock = Clock()
    auth = ClientAuth(checker, session_lifetime=lifetime, on_outcome=outcomes.append, api_versions=versions)
    rewriter = ResponseRewriter(AddressMap("kproxy.test", 40000), answered=ANSWERED_VERSIONS)
    return Client(Session(rewriter, clock=clock, auth=auth, login=login, policy=policy), clock, outcomes)


class ApiVersionsRule:
    """A policy with one rule on ApiVersions: its answer held ``hold_s``, and edited (``on_response``
    records the frame it saw)."""

    principal: str | None = None

    def __init__(self, hold_s: float = 0.0) -> None:
        self.hold_s = hold_s
        self.edited: list[bytes] = []

    def decide(self, exchange: Exchange) -> Verdict | None:
        if exchange.api_key != API_VERSIONS:
            return None
        return Verdict(hold_s=self.hold_s, on_response=self._edit)

    def _edit(self, frame: bytes) -> bytes:
        self.edited.append(frame)
        return frame


def handshake(c: Client, mechanism: str, version: int = 1, cid: int = 1) -> dict[str, Any]:
    c.send(request_frame(SASL_HANDSHAKE, version, cid, mechanism=mechanism))
    return c.answer(SASL_HANDSHAKE, version)


def authenticate(c: Client, token: bytes, version: int = 2, cid: int = 2) -> dict[str, Any]:
    c.send(request_frame(SASL_AUTHENTICATE, version, cid, auth_bytes=token))
    return c.answer(SASL_AUTHENTICATE, version)


def scram_login(c: Client, mechanism: str, user: str, password: str, version: int = 2,
                handshake_version: int = 1) -> tuple[dict[str, Any], scramp.ScramClient]:
    assert handshake(c, mechanism, handshake_version)["error_code"] == NONE
    sc = scramp.ScramClient([mechanism], user, password)
    first = authenticate(c, sc.get_client_first().encode(), version, cid=2)
    assert first["error_code"] == NONE
    sc.set_server_first(bytes(first["auth_bytes"]).decode())
    return authenticate(c, sc.get_client_final().encode(), version, cid=3), sc


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_before_the_login_there_is_no_upstream_and_api_versions_is_the_clusters_with_kproxys_sasl(
        checker: CredentialChecker, version: int) -> None:
    c = client(checker)
    assert c.session.partial_request_at == 0 and c.session.logging_in  # the login is under the frame deadline
    c.send(request_frame(API_VERSIONS, version, 9, client_software_name="t", client_software_version="1"))
    assert c.upstream == [] and c.connects == 0
    frame = c.to_client[0]
    assert decode_response(frame[4:], API_VERSIONS, version).header.correlation_id == 9
    answer = c.answer(API_VERSIONS, version)
    keys = {k["api_key"]: (k["min_version"], k["max_version"]) for k in answer["api_keys"]}
    # The cluster's versions capped by what kproxy reads (as a broker's answer is), and kproxy's SASL
    # versions rather than the cluster's: kproxy answers SASL.
    assert keys[SASL_HANDSHAKE] == (0, 1) and keys[SASL_AUTHENTICATE] == (0, 2)
    assert keys[METADATA] == (0, 12) and keys[API_VERSIONS] == (0, 4) and 0 in keys
    if version >= 3:  # the rest of the cluster's answer as it gave it: its features
        assert answer["finalized_features_epoch"] == 7
        assert [f["name"] for f in answer["finalized_features"]] == ["metadata.version"]
    c.send(request_frame(METADATA, 12, 2))
    assert c.closed is not None and c.closed.reject is RejectReason.REQUEST_SESSION
    assert c.closed.reason == "Unexpected Kafka request of type METADATA during SASL handshake"
    assert c.to_client == [] and c.upstream == [] and c.connects == 0  # no answer, as a broker closes


def test_with_no_answer_of_the_cluster_known_api_versions_closes(checker: CredentialChecker) -> None:
    c = client(checker, versions=None)
    c.send(request_frame(API_VERSIONS, 3, 1, client_software_name="t", client_software_version="1"))
    assert c.closed is not None and "no ApiVersions answer of the cluster known" in c.closed.reason
    assert c.to_client == [] and c.upstream == [] and c.connects == 0


@pytest.mark.parametrize("version", [0, 1, 2])
def test_plain_login_is_verified_off_the_loop_then_traffic_flows(checker: CredentialChecker, version: int) -> None:
    c = client(checker)
    answer = handshake(c, "PLAIN")
    assert answer == {"error_code": NONE, "mechanisms": list(MECHANISMS)}
    assert authenticate(c, b"\x00alice\x00alice-secret", version)["error_code"] == NONE
    assert c.verifications == 1 and c.session.principal == "User:alice" and not c.session.logging_in
    assert c.session.partial_request_at is None
    assert c.outcomes == [Outcome("PLAIN", True, "alice", None, False)]
    # The upstream connection is asked for after the answer that tells the client it logged in.
    assert c.log[-3:] == ["VerifyCredentials", "SendToClient", "ConnectUpstream"] and c.connects == 1
    metadata = request_frame(METADATA, 12, 3)
    c.send(metadata)
    assert c.upstream == [metadata] and c.closed is None
    # A second connection of alice: the same password again skips the slow hash.
    d = client(checker)
    handshake(d, "PLAIN")
    assert authenticate(d, b"\x00alice\x00alice-secret", version)["error_code"] == NONE and d.verifications == 0


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("version", [0, 1, 2])
def test_scram_login_proves_kproxy_to_the_client(checker: CredentialChecker, mechanism: str, version: int) -> None:
    c = client(checker, lifetime=60.0)
    final, sc = scram_login(c, mechanism, "bob", "bob-secret", version)
    assert final["error_code"] == NONE and final["error_message"] is None
    sc.set_server_final(bytes(final["auth_bytes"]).decode())  # scramp checks kproxy's signature
    assert c.session.principal == "User:bob" and c.verifications == 0
    assert c.log[-2:] == ["SendToClient", "ConnectUpstream"] and c.connects == 1
    if version >= 1:  # KIP-368: the session's lifetime is told from v1
        assert final["session_lifetime_ms"] == 60_000


def test_a_mechanism_not_offered_is_refused_with_the_list_then_closed(checker: CredentialChecker) -> None:
    c = client(checker)
    answer = handshake(c, "GSSAPI")
    assert answer == {"error_code": UNSUPPORTED_SASL_MECHANISM, "mechanisms": list(MECHANISMS)}
    # The answer first; the close 100 ms after it is written (Kafka's connection.failed.authentication.delay.ms).
    assert c.closed is not None and c.closed.kind is CloseKind.END and c.closed.linger == pytest.approx(0.1)
    assert c.outcomes == [Outcome("unsupported", False, None, "mechanism 'GSSAPI' not offered "
                                  "(PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)", False)]


@pytest.mark.parametrize(("mechanism", "message"), [
    ("PLAIN", "Authentication failed: Invalid username or password"),
    ("SCRAM-SHA-256", "Authentication failed during authentication due to invalid credentials with SASL "
                      "mechanism SCRAM-SHA-256"),
])
def test_a_wrong_password_gets_the_brokers_error_then_the_connection_closes(
        checker: CredentialChecker, mechanism: str, message: str) -> None:
    c = client(checker)
    if mechanism == "PLAIN":
        handshake(c, mechanism)
        final = authenticate(c, b"\x00alice\x00guess")
    else:
        final, _ = scram_login(c, mechanism, "alice", "guess")
    assert final["error_code"] == SASL_AUTHENTICATION_FAILED and final["error_message"] == message
    # Kafka's connection.failed.authentication.delay.ms: a client reads the answer before the end.
    assert c.closed is not None and c.closed.reason == f"SASL authentication failed: {message}"
    assert c.closed.linger == pytest.approx(0.1)
    assert c.session.principal is None and c.connects == 0 and c.upstream == []  # the cluster never saw it
    assert [(o.success, o.user, o.reason) for o in c.outcomes] == [(False, "alice", "wrong password")]


def test_another_request_during_the_exchange_is_answered_illegal_sasl_state_then_closed(
        checker: CredentialChecker) -> None:
    c = client(checker)
    handshake(c, "SCRAM-SHA-256")
    c.send(request_frame(METADATA, 12, 2, topics=None))
    answer = c.answer(METADATA, 12)
    assert {b["error_code"] for b in answer["topics"]} <= {ILLEGAL_SASL_STATE}
    assert c.closed is not None and c.closed.reason == ("Unexpected Kafka request of type METADATA during SASL "
                                                        "authentication")
    assert c.upstream == []


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_raw_tokens_after_handshake_v0(checker: CredentialChecker, mechanism: str) -> None:
    """KIP-43's first form: after SaslHandshake v0 the client's frames are bare tokens, answered with
    bare tokens (PLAIN's answer is an empty one, as Kafka's)."""
    c = client(checker)
    handshake(c, mechanism, version=0)
    if mechanism == "PLAIN":
        token = b"\x00bob\x00bob-secret"
        c.send(len(token).to_bytes(4, "big") + token)
        assert c.raw() == b"" and c.verifications == 1
    else:
        sc = scramp.ScramClient([mechanism], "bob", "bob-secret")
        token = sc.get_client_first().encode()
        c.send(len(token).to_bytes(4, "big") + token)
        sc.set_server_first(c.raw().decode())
        token = sc.get_client_final().encode()
        c.send(len(token).to_bytes(4, "big") + token)
        sc.set_server_final(c.raw().decode())
    assert c.session.principal == "User:bob" and c.closed is None
    c.send(request_frame(METADATA, 12, 5))
    assert len(c.upstream) == 1


def test_a_wrong_raw_token_closes_without_an_answer(checker: CredentialChecker) -> None:
    c = client(checker)
    handshake(c, "PLAIN", version=0)
    token = b"\x00bob\x00nope"
    c.send(len(token).to_bytes(4, "big") + token)
    assert c.to_client == [] and c.closed is not None and c.session.principal is None


def test_sasl_again_after_a_login_for_good_is_illegal_but_harmless(checker: CredentialChecker) -> None:
    c = client(checker)
    scram_login(c, "SCRAM-SHA-256", "alice", "alice-secret")
    assert handshake(c, "SCRAM-SHA-256", cid=7)["error_code"] == ILLEGAL_SASL_STATE
    answer = authenticate(c, b"n,,n=alice,r=x", cid=8)
    assert answer["error_code"] == ILLEGAL_SASL_STATE
    assert answer["error_message"] == "SaslAuthenticate request received after successful authentication"
    assert c.closed is None and c.session.principal == "User:alice"


def test_reauthentication_within_the_lifetime_keeps_the_connection(checker: CredentialChecker) -> None:
    c = client(checker, lifetime=10.0)
    scram_login(c, "SCRAM-SHA-256", "alice", "alice-secret")
    c.clock.now += 8
    final, sc = scram_login(c, "SCRAM-SHA-256", "alice", "alice-secret")
    sc.set_server_final(bytes(final["auth_bytes"]).decode())
    assert [o.reauthentication for o in c.outcomes] == [False, True]
    c.clock.now += 8  # 16 s after the first login, 8 after the second: within the new lifetime
    c.send(request_frame(METADATA, 12, 9))
    assert c.closed is None and len(c.upstream) == 1
    c.clock.now += 3
    c.send(request_frame(METADATA, 12, 10))
    assert c.closed is not None and "SASL session expired" in c.closed.reason and len(c.upstream) == 1


def test_reauthentication_as_another_user_or_mechanism_is_refused(checker: CredentialChecker) -> None:
    c = client(checker, lifetime=10.0)
    scram_login(c, "SCRAM-SHA-256", "alice", "alice-secret")
    final, _ = scram_login(c, "SCRAM-SHA-256", "bob", "bob-secret")
    assert final["error_code"] == SASL_AUTHENTICATION_FAILED
    assert final["error_message"] == "Cannot change principals during re-authentication from User:alice: User:bob"
    assert c.closed is not None and c.session.principal == "User:alice"
    d = client(checker, lifetime=10.0)
    scram_login(d, "SCRAM-SHA-256", "alice", "alice-secret")
    assert handshake(d, "SCRAM-SHA-512", cid=4)["error_code"] == NONE
    refused = authenticate(d, b"n,,n=alice,r=abc", cid=5)
    assert refused["error_message"] == ("SASL mechanism 'SCRAM-SHA-512' requested by client is not supported for "
                                        "re-authentication of mechanism 'SCRAM-SHA-256'")


def test_frames_before_the_login_are_bounded_as_a_brokers_sasl_receive(checker: CredentialChecker) -> None:
    c = client(checker)
    c.send((MAX_RECEIVE_SIZE + 1).to_bytes(4, "big") + b"\x00\x24")
    assert c.closed is not None and c.closed.reject is RejectReason.REQUEST_OVERSIZE
    d = client(checker)
    scram_login(d, "SCRAM-SHA-256", "alice", "alice-secret")
    d.send((MAX_RECEIVE_SIZE + 1).to_bytes(4, "big") + b"\x00\x00")  # after the login: the usual limit
    assert d.closed is None


def test_answers_keep_request_order_api_versions_and_handshake_pipelined(checker: CredentialChecker) -> None:
    c = client(checker)
    c.send(request_frame(API_VERSIONS, 3, 1, client_software_name="t", client_software_version="1"),
           request_frame(SASL_HANDSHAKE, 1, 2, mechanism="PLAIN"))
    assert [decode_response(f[4:], k, v).header.correlation_id
            for f, k, v in zip(c.to_client, (API_VERSIONS, SASL_HANDSHAKE), (3, 1), strict=True)] == [1, 2]
    assert c.upstream == [] and c.connects == 0


@pytest.mark.parametrize("upstream_login", [False, True])
def test_requests_pipelined_behind_the_login_go_up_once_the_connection_is_open(
        checker: CredentialChecker, upstream_login: bool) -> None:
    """Metadata sent with the SCRAM client-final message, in one chunk: the login's answer first, then
    the connection; the Metadata goes up on it (with kproxy's own login, once that login succeeded)."""
    broker = ScriptedBroker()
    login = UpstreamLogin(lambda: Credentials("PLAIN", "alice", "s3cret")) if upstream_login else None
    c = client(checker, login=login)
    assert handshake(c, "SCRAM-SHA-256")["error_code"] == NONE
    sc = scramp.ScramClient(["SCRAM-SHA-256"], "bob", "bob-secret")
    first = authenticate(c, sc.get_client_first().encode())
    sc.set_server_first(bytes(first["auth_bytes"]).decode())
    metadata = request_frame(METADATA, 12, 4)
    c.send(request_frame(SASL_AUTHENTICATE, 2, 3, auth_bytes=sc.get_client_final().encode()), metadata)
    sc.set_server_final(bytes(c.answer(SASL_AUTHENTICATE, 2)["auth_bytes"]).decode())
    assert c.connects == 1 and c.log.index("SendToClient") < c.log.index("ConnectUpstream")
    if upstream_login:
        # kproxy's login to the cluster goes first, the client's requests wait for its end.
        later = request_frame(METADATA, 12, 5)
        c.send(later)
        clients: list[bytes] = []
        while c.upstream:
            for frame in FrameSplitter().split(c.upstream.pop(0))[0]:
                if int.from_bytes(frame[8:12], "big", signed=True) < 0:  # kproxy's own ids: its login's
                    assert not clients, "a login request after a client's"
                    c.broker(broker.answer(frame))
                else:
                    clients.append(frame)
        assert broker.principals == ["User:alice"]
        assert clients == [metadata, later] and c.closed is None
    else:
        assert c.upstream == [metadata] and c.closed is None
    c.broker(response_frame(METADATA, 12, 4))
    assert decode_response(c.to_client.pop(0)[4:], METADATA, 12).header.correlation_id == 4


def test_pipelining_during_a_verification_closes(checker: CredentialChecker) -> None:
    c = client(checker)
    handshake(c, "PLAIN")
    # Metadata behind a SaslAuthenticate whose hash runs (a right password): nothing logs in.
    c.send(request_frame(SASL_AUTHENTICATE, 2, 2, auth_bytes=b"\x00alice\x00alice-secret"),
           request_frame(METADATA, 12, 3))
    assert c.closed is not None and c.closed.reject is RejectReason.REQUEST_SESSION
    assert c.upstream == [] and c.to_client == [] and c.session.principal is None and c.outcomes == []
    rule = ApiVersionsRule(hold_s=5.0)  # ApiVersions' answer held: it is still due when the token comes
    d = client(checker, policy=rule)
    d.send(request_frame(API_VERSIONS, 3, 1, client_software_name="t", client_software_version="1"),
           request_frame(SASL_HANDSHAKE, 0, 2, mechanism="PLAIN"))
    assert len(rule.edited) == 1  # the cluster's answer, edited by the rule as a broker's would be
    token = b"\x00alice\x00alice-secret"
    d.send(len(token).to_bytes(4, "big") + token)  # a raw token while the answers are still due
    assert d.closed is not None and "before the answers to earlier requests" in d.closed.reason
