"""Helpers of the rules-reload tests: rule files, a ConfigMap volume, the reloader on a trio loop.

Real files on disk, a real :class:`LiveRules` and the real :class:`RulesReloader`; the
Kubernetes ConfigMap update is made the way kubelet makes it (kubernetes' atomic_writer.go): a
new timestamped directory, and ``..data`` flipped to it with one rename of a symlink.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from kproxy.logfmt import parse_logfmt
from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.live_rules import LiveRules
from kproxy.rules.sources import load_path
from kproxy.server.rules_reload import RulesReloader

FAST = 0.05  # poll interval of these tests: the production one (0.5 s) would only make them slower


def rule(rule_id: str, error: str = "NOT_LEADER_OR_FOLLOWER", topic: str = "t") -> str:
    return (f"  - id: {rule_id}\n    match: {{api: produce, topic: {topic}}}\n"
            f"    actions:\n      - inject_error: {{error: {error}}}\n")


def rules_text(*ids: str, seed: int | None = None) -> str:
    head = f"seed: {seed}\n" if seed is not None else ""
    return head + ("rules:\n" + "".join(rule(i) for i in ids) if ids else "rules: []\n")


class ConfigMapVolume:
    """What kubelet makes of a ConfigMap volume: ``KEY -> ..data/KEY``, ``..data -> ..<timestamp>``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0

    def publish(self, files: dict[str, str]) -> None:
        """A new version: written to a fresh directory, then ``..data`` flipped to it atomically."""
        self.version += 1
        stamp = f"..2026_11_23_21_00_{self.version:02d}.{os.getpid()}"
        (self.root / stamp).mkdir()
        for name, text in files.items():
            (self.root / stamp / name).write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(stamp)
        old = os.readlink(self.root / "..data") if (self.root / "..data").is_symlink() else None
        os.replace(tmp, self.root / "..data")  # rename(2) over the old symlink: the one atomic step
        for name in files:
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(f"..data/{name}")
        for entry in self.root.iterdir():  # keys no longer in the ConfigMap
            if entry.is_symlink() and not entry.name.startswith(".") and entry.name not in files:
                entry.unlink()
        if old is not None:  # kubelet removes the previous version after the flip
            for f in (self.root / old).iterdir():
                f.unlink()
            (self.root / old).rmdir()


class Harness:
    """A LiveRules loaded from ``path`` and its reloader polling every FAST seconds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.counts = FaultStats()
        self.live = LiveRules(load_path(str(path)), counts=self.counts, mutable=True)
        self.reloader = RulesReloader(self.live, str(path), counts=self.counts, interval=FAST)

    def ids(self) -> list[str]:
        rules = self.live.rules
        return [r.id for r in rules.rules] if rules is not None else []

    async def until(self, condition: Callable[[], bool], within: float = 2.0) -> float:
        """Seconds until ``condition`` held (polled every 10 ms); fails after ``within``."""
        started = time.monotonic()
        with trio.move_on_after(within):
            while not condition():
                await trio.sleep(0.01)
            return time.monotonic() - started
        raise AssertionError(f"not within {within} s")


def reload_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    return [parse_logfmt(r.getMessage()) for r in caplog.records if r.name == "kproxy.rules"]


def watched_file(tmp_path: Path, caplog: pytest.LogCaptureFixture, *ids: str) -> Harness:
    """``tmp_path/rules.yaml`` holding the rules ``ids`` (default: one, ``a``), loaded into a
    :class:`Harness` whose ``path`` it is; the reload log lines (``kproxy.rules`` at INFO) are
    captured for :func:`reload_lines`."""
    caplog.set_level(logging.INFO, "kproxy.rules")
    path = tmp_path / "rules.yaml"
    path.write_text(rules_text(*(ids or ("a",))))
    return Harness(path)
