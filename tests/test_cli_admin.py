"""The admin commands as a user types them (issue 23, item 7): the real ``kproxy`` command line in
a subprocess, against a real kproxy serving its admin API in this process.

* ``--admin`` takes ``HOST:PORT`` as ``--admin-listen`` does, and defaults to ``$KPROXY_ADMIN``,
  else ``http://127.0.0.1:9901``;
* ``rules apply DIR`` merges a directory as ``run --rules DIR`` and ``rules check DIR`` do;
* ``rules check`` and ``rules apply`` report a problem at the same ``file:line``;
* ``rules faults`` prints the recent faults; ``rules add`` adds the rules of a file, one by one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kproxy.admin.api_client import AdminClient
from kproxy.testing import Broker, ProxyThread, free_port, running_proxy
from tests.support.e2e import create_topic, unique

RULE_A = """\
# the base rules
seed: 7
rules:
  - id: slow-produce
    match: {api: produce}
    actions:
      - delay: {ms: 1}
"""
RULE_B = """\
rules:
  - id: flaky-fetch
    description: the second file's rule
    match: {api: fetch, probability: 0.1}
    actions: [drop_response]
"""


def kproxy_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``kproxy ARGS`` in a subprocess, with no KPROXY_ADMIN* variable unless ``env`` sets one."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KPROXY_ADMIN")}
    return subprocess.run([sys.executable, "-m", "kproxy", *args], env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=60, check=False)


def admin_address(proxy: ProxyThread) -> str:
    """``HOST:PORT`` of ``proxy``'s admin API."""
    assert proxy.server is not None and proxy.server.admin_server is not None
    return f"127.0.0.1:{proxy.server.admin_server.port}"


def admin_url(proxy: ProxyThread) -> str:
    """The URL of ``proxy``'s admin API (the tests of other items use the form that always worked)."""
    return f"http://{admin_address(proxy)}"


@pytest.fixture
def idle_proxy() -> Iterator[ProxyThread]:
    """kproxy with its admin API on, in front of a port where nothing listens."""
    with running_proxy(f"127.0.0.1:{free_port()}", admin__listen="127.0.0.1:0") as proxy:
        yield proxy


# -- where the API is ------------------------------------------------------------------------------
def test_admin_takes_host_port_as_admin_listen_does_and_defaults_to_kproxy_admin(idle_proxy: ProxyThread) -> None:
    where = admin_address(idle_proxy)
    done = kproxy_cli("rules", "list", "--admin", where)
    assert done.returncode == 0, done.stderr
    assert "generation 0" in done.stdout
    done = kproxy_cli("rules", "list", env={"KPROXY_ADMIN": where})  # no --admin
    assert done.returncode == 0, done.stderr
    assert "generation 0" in done.stdout
    done = kproxy_cli("rules", "list", env={"KPROXY_ADMIN": f"http://{where}/"})  # a URL still works
    assert done.returncode == 0, done.stderr


def test_without_admin_or_kproxy_admin_the_local_api_on_9901_is_used() -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as kproxy binds: TIME_WAIT is no owner
        try:
            probe.bind(("127.0.0.1", 9901))
        except OSError as exc:  # taken on this machine: kproxy cannot serve there, nothing to prove
            pytest.skip(f"127.0.0.1:9901 is taken: {exc}")
    with running_proxy(f"127.0.0.1:{free_port()}", admin__listen="127.0.0.1:9901"):
        AdminClient("http://127.0.0.1:9901").add({"id": "on-9901", "match": {}, "actions": ["drop_response"]})
        done = kproxy_cli("rules", "list")
        assert done.returncode == 0, done.stderr
        assert "on-9901" in done.stdout


# -- rule files and directories ---------------------------------------------------------------------
def test_rules_apply_takes_a_directory_merged_as_run_rules_dir_merges_it(idle_proxy: ProxyThread,
                                                                         tmp_path: Path) -> None:
    rules_dir = tmp_path / "rules.d"
    rules_dir.mkdir()
    (rules_dir / "10-b.yaml").write_text(RULE_B)
    (rules_dir / "00-a.yaml").write_text(RULE_A)
    (rules_dir / ".hidden.yaml").write_text("not: [rules")  # dot entries are skipped, as a mount's ..data
    where = admin_url(idle_proxy)
    assert kproxy_cli("rules", "check", str(rules_dir)).returncode == 0
    done = kproxy_cli("rules", "apply", str(rules_dir), "--admin", where)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{rules_dir}: 2 rules in force (generation 1)"
    listing = AdminClient(where).rules()
    assert [r["id"] for r in listing["rules"]] == ["slow-produce", "flaky-fetch"]  # files in name order
    assert listing["seed"] == 7
    assert listing["rules"][1]["description"] == "the second file's rule"

    empty = tmp_path / "empty.d"
    empty.mkdir()
    done = kproxy_cli("rules", "apply", str(empty), "--admin", where)
    assert done.returncode == 2
    assert "a directory with no rule file" in done.stderr
    assert len(AdminClient(where).rules()["rules"]) == 2, "an empty directory removed the rules in force"


def test_check_and_apply_report_a_duplicate_id_at_the_same_line(idle_proxy: ProxyThread, tmp_path: Path) -> None:
    """Both commands load the file with the same loader: apply used to send the parsed data, and
    kproxy numbered the lines of that data (no comments, no blank lines), one off here."""
    dup = tmp_path / "dup.yaml"
    dup.write_text(RULE_A + "  - id: slow-produce\n    match: {api: fetch}\n    actions: [drop_response]\n")
    checked = kproxy_cli("rules", "check", str(dup))
    applied = kproxy_cli("rules", "apply", str(dup), "--admin", admin_url(idle_proxy))
    assert checked.returncode == applied.returncode == 2
    expected = f"{dup}:8: rules[1].id: duplicate rule id 'slow-produce' (first at line 4)"
    assert checked.stderr.splitlines() == [expected]
    assert applied.stderr.splitlines()[0] == expected
    assert AdminClient(admin_url(idle_proxy)).rules()["generation"] == 0, "a refused file changed the rules"


def test_what_rules_check_accepts_rules_apply_sends_as_meant(idle_proxy: ProxyThread, tmp_path: Path) -> None:
    """An unquoted window time is read as its text by the rules loader; YAML 1.1 data would make
    10:30 the number 630, which kproxy then refused though rules check had passed the file."""
    windowed = tmp_path / "windowed.yaml"
    windowed.write_text("rules:\n  - id: nightly\n    match:\n      schedule:\n"
                        "        window: {start: 22:00, end: 02:30}\n    actions: [drop_response]\n")
    assert kproxy_cli("rules", "check", str(windowed)).returncode == 0
    done = kproxy_cli("rules", "apply", str(windowed), "--admin", admin_url(idle_proxy))
    assert done.returncode == 0, done.stderr
    spec = AdminClient(admin_url(idle_proxy)).rule("nightly")
    assert spec["spec"]["match"]["schedule"]["window"] == {"start": "22:00", "end": "02:30"}


# -- faults ---------------------------------------------------------------------------------------
def test_rules_faults_prints_the_recent_faults_of_a_rule(tansu: Broker) -> None:
    with running_proxy(tansu.bootstrap, admin__listen="127.0.0.1:0") as proxy:
        where = admin_url(proxy)
        admin = AdminClient(where)
        # Dry runs are recorded as faults without touching the traffic: the topic is still created.
        admin.add({"id": "watch-metadata", "dry_run": True, "match": {"api": "metadata"},
                   "actions": [{"inject_error": {"error": "NOT_LEADER_OR_FOLLOWER"}}]})
        admin.add({"id": "other", "dry_run": True, "match": {"api": "api_versions"},
                   "actions": [{"delay": {"ms": 1}}]})
        create_topic(proxy.bootstrap, unique("faults"), 1)
        assert len(admin.faults(rule="watch-metadata")) >= 2
        done = kproxy_cli("rules", "faults", "--rule", "watch-metadata", "--limit", "2", "--admin", where)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert len(lines) == 2
        for line in lines:
            assert " rule=watch-metadata action=inject_error api=metadata " in line
            assert line.endswith(' dry_run=true detail="dry run: nothing done"')
        done = kproxy_cli("rules", "faults", "--json", "--limit", "1", "--admin", where)
        assert done.returncode == 0, done.stderr
        assert '"faults"' in done.stdout
        assert kproxy_cli("rules", "faults", "--limit", "0", "--admin", where).returncode == 2


# -- add ------------------------------------------------------------------------------------------
def test_rules_add_adds_each_rule_of_a_file_after_those_in_force(idle_proxy: ProxyThread, tmp_path: Path) -> None:
    where = admin_url(idle_proxy)
    admin = AdminClient(where)
    admin.add({"id": "first", "match": {}, "actions": ["drop_response"]})
    more = tmp_path / "more.yaml"
    more.write_text(RULE_A + RULE_B.removeprefix("rules:\n"))
    done = kproxy_cli("rules", "add", str(more), "--admin", where)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["slow-produce: added (generation 2)", "flaky-fetch: added (generation 3)"]
    assert [r["id"] for r in admin.rules()["rules"]] == ["first", "slow-produce", "flaky-fetch"]

    # Again: the ids exist, so POST /rules refuses the first; nothing more is sent.
    done = kproxy_cli("rules", "add", str(more), "--admin", where)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == "kproxy rules add: stopped at rule 'slow-produce'; added before it: none"
    # --replace puts each in place (PUT /rules/ID): same order, same count.
    changed = tmp_path / "changed.yaml"
    changed.write_text(RULE_A.replace("ms: 1", "ms: 9"))
    done = kproxy_cli("rules", "add", "--replace", str(changed), "--admin", where)
    assert done.returncode == 0, done.stderr
    rules = admin.rules()["rules"]
    assert [r["id"] for r in rules] == ["first", "slow-produce", "flaky-fetch"]
    assert rules[1]["spec"]["actions"] == [{"delay": {"ms": 9}}]
