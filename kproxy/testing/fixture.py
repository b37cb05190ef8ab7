"""What the pytest plugin's ``kproxy`` fixture gives a test: a kproxy, its address, per-test rules.

:class:`KproxyProcess` is one kproxy (in a background thread of the test process, its admin API on
an ephemeral loopback port) in front of a broker, for a whole session. :class:`Kproxy` is one
test's view of it: the rules that test adds go through the admin API (:mod:`kproxy.admin.api_client`,
the same code ``kproxy rules ... --admin`` uses) and are all removed when the test ends.

Nothing here needs pytest: a ``unittest`` suite can build a :class:`KproxyProcess` in
``setUpClass`` and a :class:`Kproxy` per test, and call :meth:`Kproxy.close` in ``tearDown``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from kproxy.admin.api_client import AdminClient, AdminRefused


class KproxyProcess:
    """kproxy in front of ``upstream`` (or of an embedded Tansu broker when ``upstream`` is None),
    with its admin API on; :meth:`close` stops both."""

    def __init__(self, upstream: str | None = None, **options: Any) -> None:
        from kproxy.testing.proxy_thread import running_proxy
        from kproxy.testing.tansu import run_tansu

        self._stack = contextlib.ExitStack()
        try:
            if upstream is None:
                upstream = self._stack.enter_context(run_tansu()).bootstrap
            self.upstream = upstream
            self.proxy = self._stack.enter_context(
                running_proxy(upstream, admin__listen="127.0.0.1:0", **options))
        except BaseException:
            self._stack.close()
            raise
        server = self.proxy.server
        assert server is not None and server.admin_server is not None
        self.admin_url = f"http://127.0.0.1:{server.admin_server.port}"
        self._ids = itertools.count(1)

    @property
    def bootstrap(self) -> str:
        """What clients connect to (``bootstrap.servers``): kproxy's bootstrap listener."""
        return self.proxy.bootstrap

    def close(self) -> None:
        self._stack.close()


class Kproxy:
    """One test's kproxy: ``bootstrap``, ``add_rule({...})``, ``rule({...})`` (a context manager),
    ``enable``/``disable``/``dry_run``, ``hits``, ``faults``; :meth:`close` removes every rule
    (the kproxy of the plugin starts with none: each test starts from no rules).

    ``hits`` of a rule this test removed (by :meth:`remove_rule` or the end of a ``with
    kproxy.rule(...)`` block) answer its counts at removal: asserting what a rule did after its
    block is the natural order, and the rule's count cannot change once it is gone."""

    def __init__(self, process: KproxyProcess, *, test_name: str = "test") -> None:
        self.process = process
        self.admin = AdminClient(process.admin_url)
        self._prefix = "".join(c if c.isalnum() or c in "_.:-" else "-" for c in test_name)[:60].strip("-_.:")
        self._hits_before: dict[tuple[str, str], int] = {}  # (rule id, "hits" or "dry_run_hits") -> count
        self._hits_removed: dict[tuple[str, str], int] = {}  # same keys: this test's counts at removal

    @property
    def bootstrap(self) -> str:
        return self.process.bootstrap

    @property
    def upstream(self) -> str:
        """The broker behind kproxy (to compare with, or to set up topics without faults)."""
        return self.process.upstream

    # -- rules ---------------------------------------------------------------------------
    def add_rule(self, rule: Mapping[str, Any]) -> str:
        """Put a rule in force now (a rule of a rule file, as a mapping; rules/README.md) and return its
        id, made up when ``rule`` has none. Open connections get it at their next request. Raises
        :class:`~kproxy.admin.api_client.AdminRefused` listing every problem of an invalid rule."""
        body = dict(rule)
        if "id" not in body:
            body["id"] = f"{self._prefix or 'rule'}-{next(self.process._ids)}"
        done = self.admin.add(body)
        rule_id = str(done["rule"]["id"])
        for key in ("hits", "dry_run_hits"):  # counters live as long as kproxy: this test counts from here
            self._hits_before[rule_id, key] = _total(done["rule"][key])
            self._hits_removed.pop((rule_id, key), None)  # added again: counting live again
        return rule_id

    @contextlib.contextmanager
    def rule(self, rule: Mapping[str, Any]) -> Iterator[str]:
        """``with kproxy.rule({...}) as rule_id:`` the rule is in force inside the block only."""
        rule_id = self.add_rule(rule)
        try:
            yield rule_id
        finally:
            self.remove_rule(rule_id)

    def remove_rule(self, rule_id: str) -> None:
        """Take the rule out of force; :meth:`hits` keeps answering its counts at removal."""
        try:
            # Disabled first: from the change on no request is decided by the rule (hits are
            # counted when a request is decided), so the counts the answer carries are final;
            # reading then deleting would miss requests decided in between.
            final = self.admin.disable(rule_id)["rule"]
            self.admin.delete(rule_id)
        except AdminRefused:  # already gone
            return
        for key in ("hits", "dry_run_hits"):
            self._hits_removed[rule_id, key] = _total(final[key]) - self._hits_before.get((rule_id, key), 0)

    def enable(self, rule_id: str) -> None:
        self.admin.enable(rule_id)

    def disable(self, rule_id: str) -> None:
        self.admin.disable(rule_id)

    def dry_run(self, rule_id: str, on: bool = True) -> None:
        """Shadow mode: the rule matches, counts and logs, and does nothing."""
        self.admin.set_dry_run(rule_id, on)

    def hits(self, rule_id: str, *, dry_run: bool = False) -> int:
        """Actions done by the rule since this test added it (``dry_run``: matched in shadow mode),
        up to its removal when this test removed it. Raises
        :class:`~kproxy.admin.api_client.AdminRefused` (404) for a rule kproxy never had in force."""
        key = "dry_run_hits" if dry_run else "hits"
        removed = self._hits_removed.get((rule_id, key))
        if removed is not None:
            return removed
        described = self.admin.rule(rule_id)
        return _total(described[key]) - self._hits_before.get((rule_id, key), 0)

    def faults(self, rule: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """The most recent faults done (newest first), of one rule or all."""
        return self.admin.faults(limit, rule)

    def close(self) -> None:
        """Remove every rule: the next test starts from none."""
        self.admin.reset()
        self._hits_before.clear()
        self._hits_removed.clear()


def _total(hits: Mapping[str, Any]) -> int:
    return sum(int(n) for n in hits.values())


__all__ = ["Kproxy", "KproxyProcess"]
