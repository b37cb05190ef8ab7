"""``match.principal``: who a rule is for, from the SASL login kproxy relays (or a TLS certificate).

Here without sockets: the SASL messages read (PLAIN, SCRAM), the login as the session follows it
in either SASL form (SaslAuthenticate requests, raw tokens after SaslHandshake v0), the rule key
as the loader, the JSON Schema and the engine read it, and the what-if's facts. Real clients:
tests/test_rules_principal_e2e.py (SASL PLAIN with librdkafka) and tests/test_tls.py (a client
certificate).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kproxy.cli import main as cli_main
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.commands import ForwardUpstream, SendToClient
from kproxy.proxy.exchange import Exchange
from kproxy.proxy.session import Session
from kproxy.proxy.verdict import Verdict
from kproxy.rules import RulesError
from kproxy.rules.engine import RuleEngine
from kproxy.rules.load import load_text
from kproxy.rules.request_facts import StaticFacts
from kproxy.sasl.relay import USER_NAME_MAX, SaslLogin, plain_user, scram_user

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "rules" / "kproxy-rules.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
PRODUCE, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE = 0, 3, 17, 36
SASL_AUTHENTICATION_FAILED = 58


# -- what a client's first SASL message names --------------------------------------------------
def test_plain_names_the_authorization_id_when_given_else_the_authentication_id() -> None:
    assert plain_user(b"\x00alice\x00s3cret") == "alice"
    assert plain_user(b"admin\x00alice\x00s3cret") == "admin"  # RFC 4616: authzid, then authcid
    assert plain_user(b"\x00al\xc3\xafce\x00pw") == "alïce"
    assert plain_user(b"\x00alice\x00") == "alice"  # an empty password: still a name (the broker judges)


@pytest.mark.parametrize("message", [
    b"", b"alice", b"\x00alice", b"\x00\x00pw",  # no separators, one, an empty authcid
    b"\x00\xff\xfe\x00pw",  # not UTF-8
    b"\x00" + b"a" * (USER_NAME_MAX + 1) + b"\x00pw",  # a name over the bound
    b"a" * (USER_NAME_MAX + 1) + b"\x00alice\x00pw",  # an authzid over the bound
])
def test_plain_messages_that_name_no_one(message: bytes) -> None:
    assert plain_user(message) is None


def test_plain_reads_no_further_than_a_name_needs() -> None:
    # A megabyte with no separator early: refused from its first USER_NAME_MAX + 1 bytes.
    assert plain_user(b"a" * 1_000_000 + b"\x00alice\x00pw") is None
    # The password is what follows the second NUL: whatever it holds, the name is the same.
    assert plain_user(b"\x00alice\x00" + b"\x00\xff" * 100_000) == "alice"


def test_scram_client_first_names_its_user_with_escapes_decoded() -> None:
    assert scram_user(b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL") == "alice"
    assert scram_user(b"n,,n=bob=2Cjr=3D,r=abc") == "bob,jr="
    assert scram_user(b"n,,n==3D=2C=3D,r=abc") == "=,="
    # An authzid (a=) is not the user: Kafka's principal is the user name (and a broker refuses the two differing).
    assert scram_user(b"n,a=admin,n=alice,r=abc") == "alice"
    # Channel binding flags, and extensions after the nonce.
    assert scram_user(b"y,,n=alice,r=abc") == "alice"
    assert scram_user(b"p=tls-unique,,n=alice,r=abc") == "alice"
    assert scram_user(b"n,,n=alice,r=abc,ext=1") == "alice"


@pytest.mark.parametrize("message", [
    b"",
    b"n,,n=alice",  # no nonce
    b"n,,r=abc,n=alice",  # the user must come first
    b"x,,n=alice,r=abc",  # not a gs2 channel-binding flag
    b"n,admin,n=alice,r=abc",  # an authzid without a=
    b"n,,m=ext,n=alice,r=abc",  # a mandatory extension
    b"n,,n=,r=abc",  # an empty name
    b"n,,n=al=2ice,r=abc", b"n,,n=alice=,r=abc", b"n,,n=a=3d,r=abc",  # '=' not starting =2C or =3D
    b"n,,n=\xff,r=abc",  # not UTF-8
    b"n,,n=token-id,r=abc,tokenauth=true",  # a delegation token: the principal is its owner
    b"n,,n=" + b"a" * (USER_NAME_MAX + 1) + b",r=abc",
    b"n,,n=alice,r=" + b"x" * 100_000,  # bounded: a client-first message is small
])
def test_scram_messages_that_name_no_one(message: bytes) -> None:
    assert scram_user(message) is None


# -- the login: kept only once the broker accepted it --------------------------------------------
def test_plain_login_is_the_principal_once_the_broker_accepts_it() -> None:
    login = SaslLogin()
    login.handshake("plain")
    login.client_token(b"\x00alice\x00pw")
    assert login.principal is None  # claimed, not accepted yet
    assert login.broker_token(b"", True) == "User:alice"
    assert login.principal == "User:alice"


def test_a_refused_login_leaves_no_principal_and_a_retry_is_read_afresh() -> None:
    login = SaslLogin()
    login.handshake("PLAIN")
    login.client_token(b"\x00mallory\x00guess")
    assert login.broker_token(b"", False) is None
    assert login.principal is None
    login.client_token(b"\x00alice\x00pw")
    assert login.broker_token(b"", True) == "User:alice"


def test_scram_login_ends_with_the_servers_verifier() -> None:
    login = SaslLogin()
    login.handshake("SCRAM-SHA-512")
    login.client_token(b"n,,n=bob,r=abc")
    assert login.broker_token(b"r=abcdef,s=c2FsdA==,i=4096", True) is None  # server-first: not over
    login.client_token(b"c=biws,r=abcdef,p=cHJvb2Y=")  # the proof: never read
    assert login.broker_token(b"v=dmVyaWZpZXI=", True) == "User:bob"


def test_scram_server_final_error_is_a_refusal() -> None:
    login = SaslLogin()
    login.handshake("SCRAM-SHA-256")
    login.client_token(b"n,,n=bob,r=abc")
    login.broker_token(b"r=abcdef,s=c2FsdA==,i=4096", True)
    login.client_token(b"c=biws,r=abcdef,p=d3Jvbmc=")
    assert login.broker_token(b"e=invalid-proof", True) is None
    assert login.principal is None


@pytest.mark.parametrize("mechanism", ["OAUTHBEARER", "GSSAPI", None])
def test_other_mechanisms_leave_the_principal_unknown(mechanism: str | None) -> None:
    login = SaslLogin()
    login.handshake(mechanism)
    login.client_token(b"n,,\x01auth=Bearer eyJ\x01\x01")
    assert login.broker_token(b"", True) is None
    assert login.principal is None


# -- the session follows the login, in either SASL form ------------------------------------------
class Recorder:
    """A policy that decides nothing and notes the principal the session tells it."""

    def __init__(self) -> None:
        self.principal: str | None = None
        self.seen: list[str | None] = []

    def decide(self, exchange: Exchange) -> Verdict | None:
        self.seen.append(self.principal)
        return None


def _session() -> tuple[Session, Recorder]:
    policy = Recorder()
    return Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), policy=policy), policy


def _exchange(session: Session, request: bytes, response: bytes | None) -> None:
    assert session.receive_client(request) == [ForwardUpstream(request)]
    if response is not None:
        [sent] = session.receive_upstream(response)
        assert isinstance(sent, SendToClient)


def _metadata(session: Session, correlation_id: int) -> None:
    _exchange(session, request_frame(METADATA, 12, correlation_id, topics=None),
              response_frame(METADATA, 12, correlation_id, brokers=[], cluster_id="c", controller_id=0, topics=[]))


def _authenticate(session: Session, correlation_id: int, token: bytes, answer: bytes = b"", error: int = 0) -> None:
    _exchange(session, request_frame(SASL_AUTHENTICATE, 2, correlation_id, auth_bytes=token),
              response_frame(SASL_AUTHENTICATE, 2, correlation_id, error_code=error, auth_bytes=answer))


def test_sasl_authenticate_plain_login_becomes_the_sessions_and_the_policys_principal() -> None:
    session, policy = _session()
    _exchange(session, request_frame(SASL_HANDSHAKE, 1, 1, mechanism="PLAIN"),
              response_frame(SASL_HANDSHAKE, 1, 1, error_code=0, mechanisms=["PLAIN"]))
    _authenticate(session, 2, b"\x00mallory\x00guess", error=SASL_AUTHENTICATION_FAILED)
    assert session.principal is None and policy.principal is None
    _authenticate(session, 3, b"\x00alice\x00s3cret")
    assert session.principal == policy.principal == "User:alice"
    _metadata(session, 4)
    # The requests of the login met no principal; the first after it did.
    assert policy.seen == [None, None, None, "User:alice"]


def test_sasl_authenticate_scram_login_is_kept_only_after_the_final_round() -> None:
    session, _ = _session()
    _exchange(session, request_frame(SASL_HANDSHAKE, 1, 1, mechanism="SCRAM-SHA-512"),
              response_frame(SASL_HANDSHAKE, 1, 1, error_code=0, mechanisms=["SCRAM-SHA-512"]))
    _authenticate(session, 2, b"n,,n=bob=2Cjr,r=abc", b"r=abcdef,s=c2FsdA==,i=4096")
    assert session.principal is None
    _authenticate(session, 3, b"c=biws,r=abcdef,p=cHJvb2Y=", b"v=dmVyaWZpZXI=")
    assert session.principal == "User:bob,jr"


def test_a_refused_sasl_handshake_starts_no_login() -> None:
    session, _ = _session()
    _exchange(session, request_frame(SASL_HANDSHAKE, 1, 1, mechanism="PLAIN"),
              response_frame(SASL_HANDSHAKE, 1, 1, error_code=33, mechanisms=["SCRAM-SHA-256"]))
    _authenticate(session, 2, b"\x00alice\x00pw")
    assert session.principal is None


def _token(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


@pytest.mark.parametrize(("mechanism", "client", "broker", "principal"), [
    ("PLAIN", [b"\x00alice\x00pw"], [b""], "User:alice"),
    ("SCRAM-SHA-256", [b"n,,n=carol,r=abc", b"c=biws,r=abcdef,p=cHJvb2Y="],
     [b"r=abcdef,s=c2FsdA==,i=4096", b"v=dmVyaWZpZXI="], "User:carol"),
    ("SCRAM-SHA-256", [b"n,,n=carol,r=abc", b"c=biws,r=abcdef,p=d3Jvbmc="],
     [b"r=abcdef,s=c2FsdA==,i=4096", b"e=invalid-proof"], None),
])
def test_raw_tokens_after_sasl_handshake_v0(mechanism: str, client: list[bytes], broker: list[bytes],
                                            principal: str | None) -> None:
    session, _ = _session()
    _exchange(session, request_frame(SASL_HANDSHAKE, 0, 1, mechanism=mechanism),
              response_frame(SASL_HANDSHAKE, 0, 1, error_code=0, mechanisms=[mechanism]))
    for mine, theirs in zip(client, broker, strict=True):
        assert session.receive_client(_token(mine)) == [ForwardUpstream(_token(mine))]
        assert session.principal is None
        [sent] = session.receive_upstream(_token(theirs))
        assert isinstance(sent, SendToClient)
    assert session.principal == principal
    _metadata(session, 9)  # Kafka mode again


def test_a_tls_principal_given_by_the_server_reaches_the_policy() -> None:
    session, policy = _session()
    session.principal = "User:CN=app,O=acme"
    _metadata(session, 1)
    assert policy.seen == ["User:CN=app,O=acme"]


# -- the rule key --------------------------------------------------------------------------------
def _rules(match: str) -> str:
    return (f"rules:\n  - id: r\n    match: {match}\n    actions:\n"
            "      - inject_error: {error: NOT_LEADER_OR_FOLLOWER}\n")


def _hits(engine: RuleEngine, principal: str | None, client_id: str = "shared-app") -> bool:
    return engine.evaluate(StaticFacts(api_key=PRODUCE, client_id=client_id, principal=principal)).matched


@pytest.mark.parametrize(("pattern", "alice", "bob", "certificate"), [
    ("alice", True, False, False),  # the name after User:
    ('"User:alice"', True, False, False),  # as an ACL writes it
    ('"al.*"', True, False, False),
    ('".*"', True, True, True),  # every known principal
    ('"CN=app,.*"', False, False, True),
    ('"User:CN=.*,O=acme"', False, False, True),
    ('"User"', False, False, False),
])
def test_principal_patterns(pattern: str, alice: bool, bob: bool, certificate: bool) -> None:
    engine = RuleEngine(load_text(_rules(f"{{api: produce, principal: {pattern}}}")))
    assert _hits(engine, "User:alice") is alice
    assert _hits(engine, "User:bob") is bob
    assert _hits(engine, "User:CN=app,OU=pay,O=acme") is certificate
    assert _hits(engine, None) is False  # unknown: no principal pattern matches


def test_one_client_id_two_principals() -> None:
    """Clients in staging often share a client id and differ by user: the cache of a client's fixed
    keys keeps them apart."""
    engine = RuleEngine(load_text(_rules("{principal: alice}")))
    for _ in range(3):
        assert _hits(engine, "User:alice")
        assert not _hits(engine, "User:bob")
        assert not _hits(engine, None)
    assert engine.admits(PRODUCE, "shared-app", None, None, "User:alice")
    assert not engine.admits(PRODUCE, "shared-app", None, None, "User:bob")
    assert engine.client_decision(PRODUCE, "shared-app", None, None, "User:alice") is not None
    assert engine.client_decision(PRODUCE, "shared-app", None, None, "User:bob") is None


class _NoPrincipal:
    """Facts whose principal must not be read."""

    api_key, api_version, correlation_id, client_id = PRODUCE, 9, 1, "c"
    client_ip, broker_id, stream_ordinal, now, wall_time = None, None, 0, 0.0, 0.0

    @property
    def principal(self) -> str | None:
        raise AssertionError("the principal was read with no rule naming one")

    def topics(self) -> dict[str, frozenset[int]]:
        return {}

    def acks(self) -> int | None:
        return None

    def group_id(self) -> str | None:
        return None

    def transactional_id(self) -> str | None:
        return None


def test_no_rule_naming_a_principal_never_reads_it() -> None:
    engine = RuleEngine(load_text(_rules("{client_id: c}")))
    assert not engine.reads_principal
    assert engine.evaluate(_NoPrincipal()).matched
    assert RuleEngine(load_text(_rules("{principal: alice}"))).reads_principal


@pytest.mark.parametrize(("match", "message"), [
    ("{principal: [alice, bob]}", "rules[0].match.principal"),
    ('{principal: "(alice"}', "bad regex"),
    ('{principal: "(?=alice)"}', "bad regex"),
    ("{principals: alice}", "did you mean 'principal'"),
])
def test_bad_principal_keys_are_refused_with_where_and_why(match: str, message: str) -> None:
    with pytest.raises(RulesError) as err:
        load_text(_rules(match), "p.yaml")
    assert message in str(err.value) and "p.yaml:3" in str(err.value)


def test_kproxy_rules_check_knows_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(_rules('{principal: "User:CN=.*,O=acme"}'))
    bad.write_text(_rules('{principal: "a)"}'))
    assert cli_main(["rules", "check", str(good)]) == 0
    assert cli_main(["rules", "check", str(bad)]) != 0
    out = capsys.readouterr()
    assert "bad.yaml:3: rules[0].match.principal: bad regex" in out.out + out.err


def _schema_errors(rule_file: dict[str, Any]) -> list[str]:
    return [e.message for e in VALIDATOR.iter_errors(rule_file)]


def test_the_json_schema_knows_the_key() -> None:
    def doc(principal: Any) -> dict[str, Any]:
        return {"rules": [{"id": "r", "match": {"principal": principal}, "actions": [{"close_connection": {}}]}]}

    assert _schema_errors(doc("User:alice")) == []
    assert _schema_errors(doc(".*")) == []
    assert _schema_errors(doc(7)) != []
    assert _schema_errors(doc(["alice"])) != []
    assert _schema_errors(doc("a" * 4097)) != []


def test_what_if_facts_carry_the_captured_principal() -> None:
    pytest.importorskip("pyspark")
    from kproxy.analysis.whatif import facts_of

    row = {"api_key": PRODUCE, "api_version": 9, "correlation_id": 1, "client_id": "shared-app",
           "principal": "User:alice", "client_host": "127.0.0.1", "node_id": 0, "request_us": 1_000_000,
           "topics": [], "request_bytes": 80, "acks": -1, "group_id": None, "transactional_id": None}
    facts = facts_of(row, start_us=0, stream_ordinal=0)
    assert facts.principal == "User:alice"
    engine = RuleEngine(load_text(_rules("{principal: alice}")))
    assert engine.evaluate(facts).matched
    assert not engine.evaluate(facts_of({**row, "principal": None}, start_us=0, stream_ordinal=0)).matched
