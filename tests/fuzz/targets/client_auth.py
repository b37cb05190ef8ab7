"""Fuzz target of terminate mode: a sans-IO session answering the client's SASL itself.

Inputs are the session target's (tests/fuzz/targets/session.py: side, length, frame payload). The
session has no upstream connection until it asks for one (ConnectUpstream), after a login.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

from tests.fuzz.targets.registry import target
from tests.fuzz.targets.session import session_input, session_ops

_API_VERSIONS = 18


@functools.cache
def _store() -> object:
    from kproxy.sasl.credentials import PLAIN_MIN_ITERATIONS, CredentialStore, user_credentials

    return CredentialStore({"alice": user_credentials("pw", ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
                                                      plain_iterations=PLAIN_MIN_ITERATIONS)})


def _seeds() -> Iterator[bytes]:
    import scramp

    from kproxy.protocol.frame_builder import request_frame, response_frame

    versions = (0, request_frame(_API_VERSIONS, 3, 1, client_software_name="f", client_software_version="1")[4:])
    yield session_input([versions, (0, request_frame(_API_VERSIONS, 0, 2)[4:]), (0, request_frame(3, 12, 3)[4:])])
    for mechanism, version in (("SCRAM-SHA-256", 2), ("SCRAM-SHA-512", 1)):
        client = scramp.ScramClient([mechanism], "alice", "pw")
        first = client.get_client_first()
        # The client's final message depends on kproxy's nonce, random at each run: a seed carries one
        # computed against a nonce of its own, which kproxy refuses (a wrong proof: the refusal path).
        client.set_server_first("r=" + first.split("r=")[1] + "x,s=AAAA,i=4096")
        yield session_input([
            versions, (0, request_frame(17, 1, 2, mechanism=mechanism)[4:]),
            (0, request_frame(36, version, 3, auth_bytes=first.encode())[4:]),
            (0, request_frame(36, version, 4, auth_bytes=client.get_client_final().encode())[4:]),
            (0, request_frame(3, 12, 5)[4:])])
    yield session_input([(0, request_frame(17, 1, 1, mechanism="PLAIN")[4:]),
                         (0, request_frame(36, 2, 2, auth_bytes=b"\x00alice\x00pw")[4:]),
                         (0, request_frame(3, 12, 3)[4:]), (1, response_frame(3, 12, 3)[4:])])
    yield session_input([(0, request_frame(17, 0, 1, mechanism="PLAIN")[4:]), (0, b"\x00alice\x00pw"),
                         (0, request_frame(17, 1, 2, mechanism="PLAIN")[4:])])
    yield session_input([(0, request_frame(3, 12, 1)[4:])])  # before any login: closed


@target(_seeds)
def fuzz_client_auth(data: bytes) -> None:
    """A terminate-mode Session fed frames from both sides: never an exception; no upstream
    connection asked for before a login kproxy accepted, once at most, and nothing written upstream
    before it; a principal only after a login."""
    from kproxy.protocol.frame_builder import response_frame
    from kproxy.protocol.framing import frame
    from kproxy.proxy.address_rewrite import ResponseRewriter
    from kproxy.proxy.addresses import AddressMap
    from kproxy.proxy.commands import CloseConnection, Command, ConnectUpstream, ForwardUpstream, VerifyCredentials
    from kproxy.proxy.session import Session
    from kproxy.sasl.authenticator import ANSWERED_VERSIONS, ClientAuth, Outcome
    from kproxy.sasl.server import CredentialChecker

    checker = CredentialChecker(_store(), ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"))  # type: ignore[arg-type]
    outcomes: list[Outcome] = []

    def cluster(correlation_id: int, version: int) -> bytes | None:
        return response_frame(_API_VERSIONS, version, correlation_id, api_keys=[]) if version <= 4 else None

    auth = ClientAuth(checker, session_lifetime=1.0, on_outcome=outcomes.append, api_versions=cluster)
    session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000), answered=ANSWERED_VERSIONS),
                      max_in_flight=64, clock=lambda: 0.0, auth=auth)
    connected = False

    def run(commands: list[Command]) -> bool:
        nonlocal connected
        for command in commands:
            if isinstance(command, CloseConnection):
                return False
            if isinstance(command, ForwardUpstream):
                assert connected, "a write upstream before the upstream connection"
            if isinstance(command, ConnectUpstream):
                assert not connected and any(o.success for o in outcomes), "a connection before a login, or twice"
                connected = True
                if not run(session.upstream_connected()):
                    return False
            if isinstance(command, VerifyCredentials) and not run(session.verified(command.work())):
                return False
        return True

    for side, payload in session_ops(data):
        whole = frame(payload)
        if side == 1 and not connected:
            continue  # no upstream connection: nothing comes from the broker
        if not run(session.receive_client(whole) if side == 0 else session.receive_upstream(whole)):
            break
        assert session.principal is None or any(o.success for o in outcomes), "a principal without a login"
