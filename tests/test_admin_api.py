"""The admin API (kproxy/admin/, docs/ADMIN.md) over real HTTP, and ``kproxy rules ... --admin``.

Validation, authentication, divergence and the CLI run against a kproxy whose upstream is a closed
port (nothing needs a broker there); the mid-stream test drives real clients through the real broker.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from kproxy.admin.api_client import AdminClient, AdminRefused, AdminUnreachable
from kproxy.cli import main
from kproxy.rules.load import load_file
from kproxy.testing import Broker, ProxyThread, free_port, running_proxy
from tests.support.e2e import connections_total, consume_confluent, create_topic, unique
from tests.test_e2e_clients import same_records

DELAY_RULE = {"id": "slow-metadata", "match": {"api": "metadata"}, "actions": [{"delay": {"ms": 5}}]}
FILE_RULES = """\
seed: 7
rules:
  - id: from-file
    match: {api: produce}
    actions:
      - delay: {ms: 1}
"""


def admin_of(proxy: ProxyThread, token: str | None = None) -> AdminClient:
    assert proxy.server is not None and proxy.server.admin_server is not None
    return AdminClient(f"http://127.0.0.1:{proxy.server.admin_server.port}", token=token)


@pytest.fixture
def idle_proxy() -> Iterator[ProxyThread]:
    """kproxy with its admin API on, in front of a port where nothing listens."""
    with running_proxy(f"127.0.0.1:{free_port()}", admin__listen="127.0.0.1:0") as proxy:
        yield proxy


def raw(proxy: ProxyThread, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, Any]:
    admin = admin_of(proxy)
    request = urllib.request.Request(admin.url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


# -- validation --------------------------------------------------------------------------------
def test_an_invalid_rule_is_refused_with_400_naming_each_field_at_fault(idle_proxy: ProxyThread) -> None:
    bad = {"id": "bad", "match": {"api": "prodce", "topc": "orders"},
           "actions": [{"inject_error": {"error": "NOT_LEADER"}}]}
    status, body = raw(idle_proxy, "POST", "/rules", json.dumps(bad).encode(),
                       {"Content-Type": "application/json"})
    assert status == 400
    assert body["errors"] == [
        {"path": "match.api", "reason": "unknown api 'prodce'", "hint": "did you mean 'produce'?"},
        {"path": "match.topc", "reason": "unknown key", "hint": "did you mean 'topic'?"},
        {"path": "actions[0].inject_error.error", "reason": "unknown Kafka error 'NOT_LEADER'",
         "hint": "did you mean 'NOT_LEADER_OR_FOLLOWER'?"},
    ]
    assert admin_of(idle_proxy).rules()["rules"] == [], "nothing was put in force"


def test_a_whole_rule_file_is_refused_with_paths_of_the_file(idle_proxy: ProxyThread) -> None:
    admin = admin_of(idle_proxy)
    with pytest.raises(AdminRefused) as refused:
        admin.apply({"rules": [DELAY_RULE, {"id": "x", "match": {}, "actions": [{"delay": {"ms": -1}}]}]})
    assert refused.value.status == 400
    assert [e["path"] for e in refused.value.errors] == ["rules[1].actions[0].delay.ms"]


def test_a_duplicate_id_in_a_body_points_to_the_first_by_its_path_not_a_line(idle_proxy: ProxyThread) -> None:
    """A JSON body has no lines the caller could look up (kproxy numbers its nodes in the data's
    order): the first of a repeated id is named by its key path."""
    with pytest.raises(AdminRefused) as refused:
        admin_of(idle_proxy).apply({"rules": [DELAY_RULE, {**DELAY_RULE, "match": {}}]})
    assert refused.value.errors == [{"path": "rules[1].id",
                                     "reason": "duplicate rule id 'slow-metadata' (first at rules[0].id)"}]


def test_bodies_that_are_not_rules(idle_proxy: ProxyThread) -> None:
    assert raw(idle_proxy, "POST", "/rules", b"{not json")[0] == 400
    status, body = raw(idle_proxy, "POST", "/rules", b"[1, 2]")
    assert (status, body["errors"][0]["path"]) == (400, "(body)")
    status, body = raw(idle_proxy, "PATCH", "/rules/nope", b'{"enabled": true}')
    assert status == 404
    admin = admin_of(idle_proxy)
    admin.add(DELAY_RULE)
    with pytest.raises(AdminRefused) as refused:
        admin.add(DELAY_RULE)
    assert refused.value.status == 409
    status, body = raw(idle_proxy, "PATCH", "/rules/slow-metadata", b'{"enabled": "yes"}')
    assert (status, body["errors"][0]["path"]) == (400, "enabled")
    assert raw(idle_proxy, "DELETE", "/rules")[0] == 405
    assert raw(idle_proxy, "GET", "/nothing-here")[0] == 404


# -- editing and divergence ---------------------------------------------------------------------
def test_edits_diverge_from_the_file_until_reset_or_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(FILE_RULES)
    with running_proxy(f"127.0.0.1:{free_port()}", admin__listen="127.0.0.1:0", rules=str(path)) as proxy:
        admin = admin_of(proxy)
        start = admin.rules()
        assert (start["diverged"], start["file"], start["seed"]) == (False, str(path), 7)
        assert [r["id"] for r in start["rules"]] == ["from-file"]

        admin.add(DELAY_RULE)
        admin.disable("from-file")
        admin.set_dry_run("slow-metadata")
        edited = admin.rules()
        assert edited["diverged"] is True and edited["origin"] == "admin"
        assert [(r["id"], r["enabled"], r["dry_run"], r["source"]) for r in edited["rules"]] == [
            ("from-file", False, False, str(path)), ("slow-metadata", True, True, "admin")]
        assert edited["generation"] == start["generation"] + 3
        assert edited["seed"] == 7, "edits keep the file's seed"

        back = admin.reset()
        assert back["diverged"] is False
        assert [(r["id"], r["enabled"]) for r in back["rules"]] == [("from-file", True)]

        admin.delete("from-file")
        assert admin.rules()["diverged"] is True
        # A reload of the file (kproxy/policy/live_rules.py's writers) wins over the admin's edits.
        assert proxy.server is not None
        server = proxy.server
        proxy.call(lambda: server.rules.replace(load_file(str(path)), origin=str(path)))
        reloaded = admin.rules()
        assert reloaded["diverged"] is False and [r["id"] for r in reloaded["rules"]] == ["from-file"]


def test_put_replaces_in_place_and_every_change_is_logged(idle_proxy: ProxyThread,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    admin = admin_of(idle_proxy)
    with caplog.at_level(logging.INFO, "kproxy.admin"):
        admin.add({"id": "a", "match": {"api": "produce"}, "actions": [{"delay": {"ms": 1}}]})
        admin.add(DELAY_RULE)
        admin.put({"id": "a", "match": {"api": "fetch"}, "actions": [{"drop_response": None}]})
        admin.delete("slow-metadata")
    listing = admin.rules()["rules"]
    assert [(r["id"], r["api"], r["actions"]) for r in listing] == [("a", ["fetch"], ["drop_response"])]
    changes = [r.getMessage() for r in caplog.records if "event=admin_change" in r.getMessage()]
    assert [m.split(" action=")[1].split(" ")[0] for m in changes] == ["add", "add", "replace", "delete"]


# -- authentication -----------------------------------------------------------------------------
def test_a_non_loopback_admin_address_without_a_token_is_refused_at_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ["run", "--upstream", "127.0.0.1:9092", "--check"]
    assert main([*run, "--admin-listen", "0.0.0.0:9901"]) == 2
    err = capsys.readouterr().err
    assert "admin.listen: 0.0.0.0:9901 is not a loopback address" in err and "token" in err
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    assert main([*run, "--admin-listen", "0.0.0.0:9901", "--admin-token-file", str(token)]) == 0
    assert main([*run, "--admin-listen", "127.0.0.5:9901"]) == 0, "127/8 is loopback"


def test_kproxy_run_refuses_to_start_and_reports_a_busy_admin_port() -> None:
    kproxy = [sys.executable, "-m", "kproxy", "run", "--upstream", "127.0.0.1:9", "--listen", "127.0.0.1:0"]
    refused = subprocess.run(kproxy, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "KPROXY_ADMIN_LISTEN": "0.0.0.0:9901"})
    assert refused.returncode == 2
    assert "admin.listen: 0.0.0.0:9901 is not a loopback address" in refused.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        failed = subprocess.run(kproxy, capture_output=True, text=True, timeout=60,
                                env={**os.environ, "KPROXY_ADMIN_LISTEN": f"127.0.0.1:{port}"})
    assert failed.returncode == 1
    assert f"event=start_failed listener=admin address=127.0.0.1:{port}" in failed.stderr
    assert "Traceback" not in failed.stderr


def test_with_a_token_configured_requests_without_it_get_401(tmp_path: Path) -> None:
    with running_proxy(f"127.0.0.1:{free_port()}", admin__listen="127.0.0.1:0", admin__token="s3cret") as proxy:
        for token in (None, "wrong", "s3cret-but-longer"):
            with pytest.raises(AdminRefused) as refused:
                admin_of(proxy, token).add(DELAY_RULE)
            assert refused.value.status == 401
        assert admin_of(proxy, "s3cret").rules()["rules"] == [], "the refused adds changed nothing"
        admin_of(proxy, "s3cret").add(DELAY_RULE)


# Authorization headers against the token "s3cret", and the status each must get. The scheme is
# matched case-insensitively: RFC 6750 builds on RFC 7235 section 2.1, where an auth-scheme is a
# case-insensitive token, so "bearer" is the same scheme as "Bearer". The credentials are not.
AUTH_HEADERS = [
    ("Bearer s3cret", 200),     # the exact token
    ("bearer s3cret", 200),     # the scheme in lower case (RFC 7235: case-insensitive)
    ("BEARER s3cret", 200),
    ("Bearer ", 401),           # an empty token
    ("Bearer", 401),            # the scheme alone
    ("Bearer s", 401),          # strict prefixes of the token
    ("Bearer s3cre", 401),
    ("Bearer s3cretX", 401),    # the token plus a suffix
    ("Bearer s3cret s3cret", 401),
    ("Bearer S3CRET", 401),     # the token is case-sensitive
    ("Basic s3cret", 401),      # a wrong scheme
    ("Token s3cret", 401),
    ("Bearers3cret", 401),      # no separator
    ("s3cret", 401),            # no scheme
    ("", 401),                  # an empty header
]


def test_only_the_exact_bearer_token_is_accepted() -> None:
    """Through a real admin listener with a token: no empty, prefix, suffixed or other-scheme token
    gets in (a check comparing only a prefix let ``Authorization: Bearer `` through)."""
    with running_proxy(f"127.0.0.1:{free_port()}", admin__listen="127.0.0.1:0", admin__token="s3cret") as proxy:
        assert proxy.server is not None and proxy.server.admin_server is not None
        url = f"http://127.0.0.1:{proxy.server.admin_server.port}/rules"
        got = {}
        for header, _ in AUTH_HEADERS:
            request = urllib.request.Request(url, headers={"Authorization": header})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    got[header] = response.status
            except urllib.error.HTTPError as refused:
                got[header] = refused.code
                if refused.code == 401:
                    assert refused.headers["WWW-Authenticate"] == 'Bearer realm="kproxy-admin"'
        no_header = urllib.request.Request(url)
        with pytest.raises(urllib.error.HTTPError) as refused_bare:
            urllib.request.urlopen(no_header, timeout=10)
    assert got == dict(AUTH_HEADERS)
    assert refused_bare.value.code == 401


# -- the CLI ------------------------------------------------------------------------------------
def test_cli_apply_list_enable_disable_delete_reset(idle_proxy: ProxyThread, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    url = admin_of(idle_proxy).url
    good = tmp_path / "good.yaml"
    good.write_text(FILE_RULES)
    assert main(["rules", "apply", str(good), "--admin", url]) == 0
    assert main(["rules", "disable", "from-file", "--admin", url]) == 0
    assert main(["rules", "list", "--admin", url]) == 0
    out = capsys.readouterr().out
    assert "diverged from file: yes" in out and "from-file" in out
    assert main(["rules", "enable", "from-file", "--admin", url]) == 0
    assert admin_of(idle_proxy).rule("from-file")["enabled"] is True
    assert main(["rules", "delete", "from-file", "--admin", url]) == 0
    assert main(["rules", "reset", "--admin", url]) == 0
    assert admin_of(idle_proxy).rules()["rules"] == []


def test_cli_prints_the_problems_and_exits_2_or_1_when_unreachable(
        idle_proxy: ProxyThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = admin_of(idle_proxy).url
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - id: x\n    match: {api: prodce}\n    actions: [drop_response]\n")
    assert main(["rules", "apply", str(bad), "--admin", url]) == 2  # read as rules check reads it: file:line
    assert capsys.readouterr().err.splitlines() == [
        f"{bad}:3: rules[0].match.api: unknown api 'prodce' (did you mean 'produce'?)",
        f"kproxy rules apply: {bad}: nothing sent to kproxy"]
    assert main(["rules", "enable", "missing", "--admin", url]) == 2
    assert capsys.readouterr().err.strip() == "id: no rule 'missing'"
    assert main(["rules", "list", "--admin", f"http://127.0.0.1:{free_port()}"]) == 1
    assert "cannot reach kproxy" in capsys.readouterr().err
    with pytest.raises(AdminUnreachable):
        AdminClient(f"http://127.0.0.1:{free_port()}", timeout=2).rules()


# -- with real clients --------------------------------------------------------------------------
def test_a_rule_enabled_mid_stream_acts_within_a_second_and_stops_when_disabled(tansu: Broker) -> None:
    """An idempotent producer keeps sending while a rule, added disabled then enabled through the
    API, fails half its Produce requests: the rule acts within a second of the call, stops at once
    when disabled, no connection is replaced, and every record arrives exactly once. The client's
    connections were opened before any rule existed."""
    topic = unique("admin-live")
    with running_proxy(tansu.bootstrap, admin__listen="127.0.0.1:0") as proxy:
        admin = admin_of(proxy)
        create_topic(proxy.bootstrap, topic, 2)
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 1,
                             # One request in flight: Tansu answers a sequence gap (a later batch
                             # accepted while an earlier one is retried) with PRODUCER_FENCED.
                             "max.in.flight.requests.per.connection": 1})
        sent = [(f"k{i:05d}".encode(), f"v{i}".encode()) for i in range(900)]
        errors: list[Any] = []
        done = threading.Event()

        def produce() -> None:  # ~3 s of steady traffic, one record every 3 ms
            for key, value in sent:
                producer.produce(topic, key=key, value=value,
                                 on_delivery=lambda err, _m: errors.append(err) if err else None)
                producer.poll(0)
                time.sleep(0.003)
            done.set()

        # Connections opened (and metadata read) before any rule exists.
        producer.produce(topic, key=b"warm-up", value=b"x")
        assert producer.flush(15) == 0
        connections = connections_total(proxy)
        writer = threading.Thread(target=produce, daemon=True)
        writer.start()
        time.sleep(0.3)
        admin.add({"id": "flaky", "enabled": False,
                   "match": {"api": "produce", "topic": topic, "probability": 0.5},
                   "actions": [{"inject_error": {"error": "NOT_LEADER_OR_FOLLOWER"}}]})
        time.sleep(0.3)
        assert admin.rule("flaky")["hits"] == {}, "a disabled rule acted"
        asked = time.monotonic()
        admin.enable("flaky")
        while not admin.rule("flaky")["hits"].get("inject_error") and time.monotonic() - asked < 3:
            time.sleep(0.01)
        took = time.monotonic() - asked
        assert took < 1.0, f"the rule acted {took:.2f}s after it was added"
        time.sleep(0.5)
        admin.disable("flaky")
        hits = admin.rule("flaky")["hits"]["inject_error"]
        assert hits > 0
        assert done.wait(30), "the producer stalled"
        assert producer.flush(30) == 0
        assert not errors, f"delivery errors: {errors[:5]}"
        assert admin.rule("flaky")["hits"]["inject_error"] == hits, "a disabled rule acted"
        assert connections_total(proxy) == connections, "a client connection was replaced"
        faults = admin.faults(rule="flaky")
        assert len(faults) == min(hits, 1000)
        assert {(f["api"], f["action"], f["topics"] == [topic]) for f in faults} == {
            ("produce", "inject_error", True)}
        expected = [(b"warm-up", b"x"), *sent]
        same_records(consume_confluent(proxy.bootstrap, topic, 2, len(expected)), expected)
