"""Terminate mode's client login (kproxy/sasl/client_login.py) driven directly: the client's requests
in (as exchanges), kproxy's SASL server's answers and the login's decisions out: what to answer,
the verification to run, the close, when the upstream connection is due and what waits for it.

The SASL server is the real one (kproxy/sasl/authenticator.py over kproxy/sasl/server.py, with a
credentials store); how a session puts these answers in order with the others is tested through
the session in tests/test_client_auth_session.py.
"""

from __future__ import annotations

import pytest

from kproxy.protocol.frame_builder import request_frame
from kproxy.protocol.framing import DEFAULT_MAX_FRAME_SIZE, FrameSplitter
from kproxy.protocol.payloads import decode_response
from kproxy.proxy.exchange import Exchange
from kproxy.sasl.authenticator import MAX_RECEIVE_SIZE, AuthAnswer, ClientAuth
from kproxy.sasl.client_login import ClientLogin, TerminateError
from kproxy.sasl.credentials import PLAIN_MIN_ITERATIONS, CredentialStore, user_credentials
from kproxy.sasl.server import CredentialChecker

METADATA, SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE = 3, 17, 18, 36
NOW = 100.0


@pytest.fixture(scope="module")
def store() -> CredentialStore:
    return CredentialStore({"alice": user_credentials("alice-secret", ("PLAIN",),
                                                      plain_iterations=PLAIN_MIN_ITERATIONS)})


def login(store: CredentialStore, lifetime: float = 0.0) -> tuple[ClientLogin[Exchange], FrameSplitter]:
    frames = FrameSplitter(DEFAULT_MAX_FRAME_SIZE)
    auth = ClientAuth(CredentialChecker(store, ("PLAIN",)), session_lifetime=lifetime,
                      api_versions=lambda cid, version: b"cluster:%d:%d" % (cid, version))
    return ClientLogin(auth, frames, DEFAULT_MAX_FRAME_SIZE), frames


def exchange(frame: bytes) -> Exchange:
    _, api_key, api_version, correlation_id = (int.from_bytes(frame[0:4], "big"), int.from_bytes(frame[4:6], "big"),
                                               int.from_bytes(frame[6:8], "big"),
                                               int.from_bytes(frame[8:12], "big", signed=True))
    return Exchange(correlation_id, api_key, api_version, len(frame), NOW, NOW, frame)


def sasl(c: ClientLogin[Exchange], frame: bytes) -> tuple[AuthAnswer, Exchange]:
    ex = exchange(frame)
    answer = c.gate(ex, NOW)
    assert answer is not None
    return answer, ex


def logged_in(c: ClientLogin[Exchange]) -> AuthAnswer:
    """A PLAIN login of alice, its verification run as the server would: the answer that says so."""
    answer, ex = sasl(c, request_frame(SASL_HANDSHAKE, 1, 1, mechanism="PLAIN"))
    assert c.answered(answer, ex)
    answer, ex = sasl(c, request_frame(SASL_AUTHENTICATE, 2, 2, auth_bytes=b"\0alice\0alice-secret"))
    assert not c.answered(answer, ex)  # the slow hash first
    assert c.pending and not c.attach_due
    verification = c.take_verification()
    assert verification is not None and verification.verify is not None and verification.verify_key
    assert c.take_verification() is None and not c.pending  # taken once
    answer, answered = c.verified(verification.verify(), NOW)
    assert answered is ex  # the answer goes to the SaslAuthenticate that asked
    assert c.answered(answer, answered)
    return answer


def test_before_the_login_frames_are_bounded_and_only_api_versions_goes_on(store: CredentialStore) -> None:
    c, frames = login(store)
    assert c.gating and c.logging_in and c.detached and not c.pending
    assert frames.max_frame_size == MAX_RECEIVE_SIZE  # a broker's SASL receive size, until logged in
    api_versions = exchange(request_frame(API_VERSIONS, 3, 1, client_software_name="x", client_software_version="1"))
    assert c.gate(api_versions, NOW) is None  # goes on: the session answers it from the cluster's answers
    assert c.cluster_api_versions(api_versions) == b"cluster:1:3"
    refused = c.gate(exchange(request_frame(METADATA, 12, 2, topics=None)), NOW)
    assert refused is not None and refused.frame is None and refused.reject
    assert refused.close == "Unexpected Kafka request of type METADATA during SASL handshake"


def test_a_plain_login_asks_for_its_verification_then_for_the_upstream_connection(store: CredentialStore) -> None:
    c, frames = login(store)
    answer = logged_in(c)
    assert answer.frame is not None and answer.close is None
    assert decode_response(answer.frame[4:], SASL_AUTHENTICATE, 2).body["error_code"] == 0
    assert c.auth.principal == "User:alice" and not c.logging_in and not c.gating
    assert frames.max_frame_size == DEFAULT_MAX_FRAME_SIZE  # the session's own bound again
    assert c.pending and c.attach_due and c.detached
    # Requests pipelined behind the login wait for the connection.
    c.attached(b"behind-the-login")
    assert not c.pending and not c.attach_due and not c.detached
    assert c.pipelined() == [b"behind-the-login"]
    assert c.pipelined() == []  # taken once
    c.answered(AuthAnswer(), None)  # logged in already: no second connection
    assert not c.attach_due


def test_a_wrong_password_is_answered_then_closed_after_the_brokers_delay(store: CredentialStore) -> None:
    c, _ = login(store)
    c.answered(*sasl(c, request_frame(SASL_HANDSHAKE, 1, 1, mechanism="PLAIN")))
    answer, ex = sasl(c, request_frame(SASL_AUTHENTICATE, 2, 2, auth_bytes=b"\0alice\0wrong"))
    assert not c.answered(answer, ex)
    verification = c.take_verification()
    assert verification is not None and verification.verify is not None
    answer, ex = c.verified(verification.verify(), NOW)
    assert c.answered(answer, ex) and answer.close is not None and answer.frame is not None and not answer.reject
    assert decode_response(answer.frame[4:], SASL_AUTHENTICATE, 2).body["error_code"] == 58
    assert c.logging_in and c.detached and not c.pending  # no upstream connection for a refused client


def test_a_request_before_the_handshake_closes_without_an_answer_as_a_reject(store: CredentialStore) -> None:
    c, _ = login(store)
    refused = c.gate(exchange(request_frame(METADATA, 12, 2, topics=None)), NOW)
    assert refused is not None and refused.frame is None and refused.reject
    assert c.answered(refused, None) and not c.pending


def test_a_server_that_did_not_run_the_verification_refuses_the_login(store: CredentialStore) -> None:
    c, _ = login(store)
    c.answered(*sasl(c, request_frame(SASL_HANDSHAKE, 1, 1, mechanism="PLAIN")))
    answer, ex = sasl(c, request_frame(SASL_AUTHENTICATE, 2, 2, auth_bytes=b"\0alice\0alice-secret"))
    c.answered(answer, ex)
    c.take_verification()
    answer, answered = c.verified(None, NOW)  # too many hashes under way for the client's address
    assert answered is ex and answer.close is not None and c.auth.principal is None


def test_a_raw_token_cannot_wait_behind_earlier_answers(store: CredentialStore) -> None:
    c, _ = login(store)
    answer, ex = sasl(c, request_frame(SASL_HANDSHAKE, 0, 1, mechanism="PLAIN"))
    assert c.answered(answer, ex) and c.auth.raw
    token = len(b"\0alice\0alice-secret").to_bytes(4, "big") + b"\0alice\0alice-secret"
    with pytest.raises(TerminateError, match="SASL token sent before the answers to earlier requests"):
        c.token(token, NOW, answers_due=True)
    answer = c.token(token, NOW, answers_due=False)
    assert answer.verify is not None  # the raw token's password is checked as a SaslAuthenticate's is
    assert not c.answered(answer, None)
    verification = c.take_verification()
    assert verification is not None and verification.verify is not None
    answer, answered = c.verified(verification.verify(), NOW)
    assert answered is None and c.answered(answer, None)
    assert answer.frame == b"\x00\x00\x00\x00"  # an empty raw token: logged in
    assert c.auth.principal == "User:alice" and c.pending


def test_with_a_session_lifetime_every_request_stays_gated(store: CredentialStore) -> None:
    c, _ = login(store, lifetime=60.0)
    logged_in(c)
    assert c.gating and not c.logging_in  # still shown every request: the login ends
    expired = c.gate(exchange(request_frame(METADATA, 12, 9, topics=None)), NOW + 61)
    assert expired is not None and expired.close is not None and "session expired" in expired.close
