"""Rules read from a file or a directory, and reloaded while kproxy runs (no broker needed here).

Real files on disk, a real :class:`LiveRules` and the real reloader task on a trio loop, and a
Kubernetes ConfigMap volume updated as kubelet does it (tests/support/rules_reload.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from prometheus_client import generate_latest

from kproxy.config import ConfigError, build_config
from kproxy.metrics.exposition import LiveGauges, make_registry
from kproxy.metrics.stats import TrafficStats
from kproxy.policy.live_rules import LiveRules
from kproxy.rules import RulesError, load_text
from kproxy.rules.sources import load_path
from kproxy.server.rules_reload import signature
from tests.support.rules_reload import FAST, ConfigMapVolume, Harness, reload_lines, rules_text, watched_file


# -- a directory of rule files ---------------------------------------------------------------------
def test_a_directory_merges_its_rule_files_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "20-late.yml").write_text(rules_text("c"))
    (tmp_path / "10-early.yaml").write_text(rules_text("a", "b", seed=7))
    (tmp_path / "notes.txt").write_text("not rules")
    (tmp_path / ".hidden.yaml").write_text("garbage: [")
    (tmp_path / "sub.yaml").mkdir()  # a directory named like a rule file is no rule file
    rules = load_path(str(tmp_path))
    assert [r.id for r in rules.rules] == ["a", "b", "c"]
    assert rules.seed == 7 and rules.source == str(tmp_path)


def test_an_empty_directory_is_an_empty_rule_set(tmp_path: Path) -> None:
    rules = load_path(str(tmp_path))
    assert rules.rules == () and rules.source == str(tmp_path)


def test_rule_ids_are_unique_across_files_and_the_repeat_is_named_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(rules_text("x", "y"))
    (tmp_path / "b.yaml").write_text(rules_text("z", "y"))
    with pytest.raises(RulesError) as err:
        load_path(str(tmp_path))
    # b.yaml: "rules:" on line 1, rule z on lines 2-5, rule y's id on line 6
    assert [str(p) for p in err.value.problems] == [
        f"{tmp_path}/b.yaml:6: rules[1].id: duplicate rule id 'y' (first in {tmp_path}/a.yaml)"]


def test_files_that_set_a_seed_must_agree(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(rules_text("a", seed=5))
    (tmp_path / "b.yaml").write_text(rules_text("b", seed=5))
    (tmp_path / "c.yaml").write_text(rules_text("c", seed=0))  # 0: the default, counts as unset
    assert load_path(str(tmp_path)).seed == 5
    (tmp_path / "d.yaml").write_text("# other seed\n" + rules_text("d", seed=6))
    with pytest.raises(RulesError) as err:
        load_path(str(tmp_path))
    assert [str(p) for p in err.value.problems] == [
        f"{tmp_path}/d.yaml:2: seed: 6 differs from seed 5 of {tmp_path}/a.yaml: files that set a seed must agree"]


def test_every_problem_of_every_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("rules:\n  - id: a\n    match: {api: produce, topc: t}\n"
                                     "    actions: [drop_response]\n")
    (tmp_path / "b.yaml").write_text("rules: [\n")
    with pytest.raises(RulesError) as err:
        load_path(str(tmp_path))
    lines = [str(p) for p in err.value.problems]
    assert lines[0] == f"{tmp_path}/a.yaml:3: rules[0].match.topc: unknown key (did you mean 'topic'?)"
    assert lines[1].startswith(f"{tmp_path}/b.yaml:2: (yaml): ")
    assert len(lines) == 2


def test_the_rules_option_takes_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(rules_text("a"))
    cfg = build_config({"upstream": ("k:1", "test"), "rules": (str(tmp_path), "--rules")})
    assert cfg.rules is not None and [r.id for r in cfg.rules.rules] == ["a"]
    (tmp_path / "b.yaml").write_text(rules_text("a"))
    with pytest.raises(ConfigError) as err:
        build_config({"upstream": ("k:1", "test"), "rules": (str(tmp_path), "--rules")})
    assert err.value.problems == (f"--rules: {tmp_path}/b.yaml:2: rules[0].id: duplicate rule id 'a' "
                                  f"(first in {tmp_path}/a.yaml)",)


def test_a_configmap_flip_changes_the_signature_without_any_file_written(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path)
    volume.publish({"rules.yaml": rules_text("a")})
    before = signature(str(tmp_path))
    assert load_path(str(tmp_path)).rules[0].id == "a"
    volume.publish({"rules.yaml": rules_text("b")})
    assert signature(str(tmp_path)) != before
    assert [r.id for r in load_path(str(tmp_path)).rules] == ["b"]
    # The same size and the same mtime second would not hide a flip: the inode is new.
    assert signature(str(tmp_path))[0][2] != before[0][2]


def test_a_write_in_place_changes_the_signature(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(rules_text("a"))
    before = signature(str(path))
    path.write_text(rules_text("bb"))
    assert signature(str(path)) != before


def test_a_missing_file_is_a_signature_not_an_error(tmp_path: Path) -> None:
    missing = signature(str(tmp_path / "gone.yaml"))
    (tmp_path / "gone.yaml").write_text(rules_text())
    assert signature(str(tmp_path / "gone.yaml")) != missing


async def test_a_rewritten_file_is_put_in_force_and_a_broken_one_keeps_the_old_rules(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = watched_file(tmp_path, caplog)
    path = h.path
    async with trio.open_nursery() as nursery:
        await nursery.start(h.reloader.run)
        path.write_text(rules_text("a", "b"))
        took = await h.until(lambda: h.ids() == ["a", "b"])
        assert took < 3 * FAST + 0.2
        assert h.live.generation == 2 and h.counts.rules_generation == 2
        assert h.counts.reloads == {"success": 1, "failure": 0}

        path.write_text(rules_text("a", "b") + "  - id: c\n    match: {api: produce, probablity: 2}\n"
                        "    actions: [drop_response]\n")
        await h.until(lambda: h.counts.reloads["failure"] == 1)
        assert h.ids() == ["a", "b"] and h.live.generation == 2  # the old rules keep running
        failed = reload_lines(caplog)[-1]
        assert failed["event"] == "rules_reload_failed" and failed["file"] == str(path)
        assert failed["problems"] == "1" and failed["trigger"] == "change"
        assert failed["detail"] == f"{path}:11: rules[2].match.probablity: unknown key (did you mean 'probability'?)"
        assert [r.levelname for r in caplog.records if "rules_reload_failed" in r.getMessage()] == ["WARNING"]

        path.write_text(rules_text())  # emptied: no rule, and no error
        # The generation is visible from inside put_in_force, which yields to the loop before the reload
        # logs: wait for the line too (cancelled in between, the reload would never write it).
        await h.until(lambda: h.live.generation == 3 and reload_lines(caplog)[-1]["event"] == "rules_reloaded")
        assert h.ids() == [] and h.counts.rules_loaded == 0
        nursery.cancel_scope.cancel()
    done = reload_lines(caplog)[-1]
    assert done == {"event": "rules_reloaded", "generation": "3", "file": str(path), "rules": "0", "dry_run_rules": "0",
                    "trigger": "change"}


async def test_the_same_rules_again_are_no_new_generation_unless_forced_or_replaced_meanwhile(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = watched_file(tmp_path, caplog)
    path = h.path
    async with trio.open_nursery() as nursery:
        await nursery.start(h.reloader.run)
        injector = h.live.injector
        path.write_text("# a comment changes nothing\n" + rules_text("a"))
        await h.until(lambda: h.counts.reloads["success"] == 1)
        assert h.live.generation == 1 and h.live.injector is injector  # schedules and buckets carry on
        assert reload_lines(caplog)[-1]["event"] == "rules_unchanged"

        h.reloader.request()  # SIGHUP: the file afresh, even unchanged
        await h.until(lambda: h.live.generation == 2 and reload_lines(caplog)[-1]["event"] == "rules_reloaded")
        assert h.live.injector is not injector and reload_lines(caplog)[-1]["trigger"] == "sighup"

        h.live.replace(load_text(rules_text("api-made")), origin="admin")  # someone else (the admin API)
        os.utime(path)  # touched, same rules: the file is put back in force
        path.write_text(rules_text("a"))
        await h.until(lambda: h.ids() == ["a"])
        assert h.live.generation == 4
        nursery.cancel_scope.cancel()


async def test_a_change_between_the_config_load_and_the_watch_is_not_missed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = watched_file(tmp_path, caplog)  # what kproxy run does first: the config loads the file
    path = h.path
    path.write_text(rules_text("a", "b"))  # ... and it changes before the server watches it
    async with trio.open_nursery() as nursery:
        await nursery.start(h.reloader.run)
        await h.until(lambda: h.ids() == ["a", "b"])
        nursery.cancel_scope.cancel()
    unchanged = tmp_path / "same.yaml"
    unchanged.write_text(rules_text("a"))
    h = Harness(unchanged)
    caplog.clear()
    async with trio.open_nursery() as nursery:
        await nursery.start(h.reloader.run)
        await trio.sleep(4 * FAST)
        nursery.cancel_scope.cancel()
    # The start-up comparison is no reload: nothing logged, counted or replaced.
    assert h.live.generation == 1 and h.counts.reloads == {"success": 0, "failure": 0}
    assert reload_lines(caplog) == []


async def test_a_configmap_flip_is_seen_and_applied(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path)
    volume.publish({"rules.yaml": rules_text("a")})
    h = Harness(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.reloader.run)
        volume.publish({"rules.yaml": rules_text("b"), "more.yaml": rules_text("c")})
        took = await h.until(lambda: h.ids() == ["c", "b"])  # more.yaml sorts first
        assert took < 3 * FAST + 0.2
        volume.publish({"rules.yaml": rules_text("b")})  # a key removed from the ConfigMap
        await h.until(lambda: h.ids() == ["b"])
        nursery.cancel_scope.cancel()


async def test_a_file_that_disappears_keeps_the_rules_and_its_return_is_loaded(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(rules_text("a"))
    h = Harness(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.reloader.run)
        path.unlink()
        await h.until(lambda: h.counts.reloads["failure"] == 1)
        assert h.ids() == ["a"]
        path.write_text(rules_text("b"))
        await h.until(lambda: h.ids() == ["b"])
        nursery.cancel_scope.cancel()


def test_reload_series_are_exported_born_at_zero() -> None:
    stats = TrafficStats()
    text = generate_latest(make_registry(stats, lambda: LiveGauges(0, 0))).decode()
    assert 'kproxy_rules_reloads_total{result="success"} 0.0' in text
    assert 'kproxy_rules_reloads_total{result="failure"} 0.0' in text
    assert "kproxy_rules_generation 0.0" in text
    LiveRules(load_text(rules_text("a")), counts=stats.faults).replace(None, origin="test")
    stats.faults.reloads["failure"] += 1
    text = generate_latest(make_registry(stats, lambda: LiveGauges(0, 0))).decode()
    assert "kproxy_rules_generation 2.0" in text
    assert 'kproxy_rules_reloads_total{result="failure"} 1.0' in text


def test_a_server_with_a_rules_file_watches_it_and_gives_every_connection_a_policy(tmp_path: Path) -> None:
    from kproxy.server.proxy_server import ProxyServer

    path = tmp_path / "rules.yaml"
    path.write_text(rules_text("a"))
    server = ProxyServer(build_config({"upstream": ("127.0.0.1:9", "test"), "rules": (str(path), "test")}),
                         handle_signals=False)
    assert server.reloader is not None and server.reloader.path == str(path)
    server.rules.replace(None, origin="test")  # e.g. every rule deleted through the admin API
    assert server.rules.policy("127.0.0.1:1") is not None  # so the next rules apply to this connection too
    plain = ProxyServer(build_config({"upstream": ("127.0.0.1:9", "test")}), handle_signals=False)
    assert plain.reloader is None and plain.rules.policy("127.0.0.1:1") is None  # no rules: no cost


async def test_a_file_reload_ends_a_divergence_made_through_the_admin_api(tmp_path: Path) -> None:
    from kproxy.admin.book import RuleBook

    path = tmp_path / "rules.yaml"
    path.write_text(rules_text("a"))
    h = Harness(path)
    book = RuleBook(h.live)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.reloader.run)
        book.add({"id": "api-made", "match": {"api": "produce"},
                  "actions": [{"inject_error": {"error": "NOT_LEADER_OR_FOLLOWER"}}]})
        assert h.ids() == ["a", "api-made"] and book.diverged
        await trio.sleep(3 * FAST)
        assert h.ids() == ["a", "api-made"]  # an unchanged file leaves the API's rules alone
        # The same file again (a ConfigMap re-applied, a touch): the file's rules are put back.
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        await h.until(lambda: h.ids() == ["a"])
        assert not book.diverged and book.listing()["file"] == str(path)
        nursery.cancel_scope.cancel()
