"""The rules file (or directory) reloaded while kproxy serves: on change and on request (SIGHUP).

How a change is seen: a **stat poll**, every :data:`POLL_INTERVAL` seconds, of each rule file
with symlinks followed: ``(st_dev, st_ino, st_mtime_ns, st_size)``, plus, for a directory, the
list of its rule files (kproxy/rules/sources.py). Why a poll and not inotify (watchdog, watchfiles):

* Kubernetes updates a mounted ConfigMap without writing to the file: it writes a new timestamped
  directory and flips the ``..data`` symlink with one rename (``rules.yaml -> ..data/rules.yaml``,
  ``..data -> ..2026_11_23_21_00_00.123``). An inotify watch on ``rules.yaml`` sees nothing; one must
  watch the directory and interpret symlink renames, and a watch on a symlink target is lost when
  the target is deleted. A ``stat`` through the symlink lands on the new file: a new inode, which
  the signature holds, so an in-place write (mtime, size) and a flip (inode) are both seen.
* It costs one ``stat`` per file per interval on the trio thread (microseconds on the tmpfs a
  ConfigMap is, or a local disk), no extra dependency and no watcher thread.
* Its limit: two in-place writes of the same size within one tick of the file system's clock
  (a few milliseconds) look alike; SIGHUP reloads whatever is on disk.

A change is loaded in a worker thread (YAML parsing of a large file must not stall every
connection) and then put in force on the trio thread with :meth:`LiveRules.replace`, which is the
only place sessions read rules from: every open connection applies the new set from its next
request, and a request already decided keeps its rules. The signature is taken *before* the files
are read, so a write that lands during the read is seen at the next poll.

A file that does not load (bad YAML, a bad rule, a duplicate id across a directory's files) is
rejected: the rules in force stay, and one warning line lists every problem as
``file:line: key: reason``. One line per reload either way::

    event=rules_reloaded generation=N file=PATH rules=N dry_run=N trigger=change|sighup
    event=rules_reload_failed file=PATH trigger=change|sighup problems=N detail="f.yaml:3: key: reason; ..."

and ``kproxy_rules_reloads_total{result="success|failure"}`` counts them
(``kproxy_rules_generation`` follows :attr:`LiveRules.generation`).

The same rules again: a change whose rules are equal to the ones this reloader last put in
force (a ``touch``, a comment edited, a ConfigMap re-flipped with the same data) is **not** a new
generation: the running schedules, throttle buckets and seeded draws carry on; the reload counts
as a success and logs ``event=rules_unchanged generation=N file=PATH trigger=change``. Two
exceptions make it a new generation: someone else replaced the rules since (the admin API:
reloading the file is how its changes are reverted), and SIGHUP, which always puts the file in
force afresh, the operator's way to restart the rules' clocks.
"""

from __future__ import annotations

import logging
import os

import trio

from kproxy.metrics.stats import FaultStats
from kproxy.rules import RulesError, RuleSet
from kproxy.rules.sources import load_path, rule_files
from kproxy.server.live_rules import LiveRules
from kproxy.server.logfmt import q

log = logging.getLogger("kproxy.rules")

# Half a second: a change applies within a second of being written, for one stat per file per
# interval. Kubelet itself only refreshes ConfigMap volumes every minute or so (its sync period).
POLL_INTERVAL = 0.5

# One entry per file: (path, dev, ino, mtime_ns, size), or (path, error) when it cannot be stat'ed.
Signature = tuple[tuple[object, ...], ...]


def signature(path: str) -> Signature:
    """What the poll compares: the rule files' identities and stat data, symlinks followed.

    Never raises: a missing file or directory is part of the signature (its error), so that its
    return is a change too.
    """
    try:
        files = rule_files(path) if os.path.isdir(path) else [path]
    except OSError as exc:
        return ((path, exc.errno),)
    out: list[tuple[object, ...]] = []
    for name in files:
        try:
            st = os.stat(name)
        except OSError as exc:
            out.append((name, exc.errno))
            continue
        out.append((name, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


class RulesReloader:
    """Watches ``path`` (a rule file or a directory of them) and reloads ``live`` from it.

    ``await reloader.run()`` in the server's nursery polls until cancelled; :meth:`request`
    (SIGHUP) asks for a reload now, even of unchanged rules. Every reload is made by that one
    task, so two never overlap.
    """

    def __init__(self, live: LiveRules, path: str, *, counts: FaultStats,
                 interval: float = POLL_INTERVAL) -> None:
        self.live = live
        self.path = path
        self.counts = counts
        self.interval = interval
        self._seen: Signature | None = None  # taken before the last load: a write after it is a change
        self._in_force: RuleSet | None = live.rules  # what this reloader (or the start-up config) loaded
        self._generation = live.generation  # the generation it had; another one means someone else replaced
        self._requested = False
        self._wake = trio.Event()

    def request(self) -> None:
        """Reload at once, even if nothing changed (SIGHUP). Callable from the trio thread only."""
        self._requested = True
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # The rules in force were read by the config loader, before any signature: a write in
        # between would never be a change. So the files are loaded once more before the watch
        # starts, and put in force only if they differ (silently otherwise: no reload happened).
        self._seen = signature(self.path)
        await self.reload(trigger="change", force=False, quiet=True)
        task_status.started()
        while True:
            with trio.move_on_after(self.interval):
                await self._wake.wait()
            forced, self._requested = self._requested, False
            if forced:
                self._wake = trio.Event()
            now = signature(self.path)
            if forced or now != self._seen:
                self._seen = now
                await self.reload(trigger="sighup" if forced else "change", force=forced)

    async def reload(self, *, trigger: str, force: bool, quiet: bool = False) -> bool:
        """Load the files now and put them in force; False (logged, counted) when they do not load.

        ``quiet`` (the check at start): the same rules as the config loaded are no reload at all,
        not logged, not counted, whatever replaced them since (an admin API change made in the
        meantime stays).
        """
        try:
            rules = await trio.to_thread.run_sync(load_path, self.path)
        except RulesError as exc:
            self.counts.reloads["failure"] = self.counts.reloads.get("failure", 0) + 1
            detail = "; ".join(str(p) for p in exc.problems)
            log.warning("event=rules_reload_failed file=%s trigger=%s problems=%d generation=%d detail=%s",
                        q(self.path), trigger, len(exc.problems), self.live.generation, q(detail))
            return False
        if quiet and rules == self._in_force:
            return True
        if not force and rules == self._in_force and self.live.generation == self._generation:
            self.counts.reloads["success"] = self.counts.reloads.get("success", 0) + 1
            log.info("event=rules_unchanged generation=%d file=%s trigger=%s", self._generation, q(self.path),
                     trigger)
            return True
        self.counts.reloads["success"] = self.counts.reloads.get("success", 0) + 1
        self._generation = self.live.replace(rules, origin=self.path)
        self._in_force = rules
        enabled = [r for r in rules.rules if r.enabled]
        log.info("event=rules_reloaded generation=%d file=%s rules=%d dry_run=%d trigger=%s", self._generation,
                 q(self.path), len(enabled), sum(1 for r in enabled if r.dry_run), trigger)
        return True


__all__ = ["POLL_INTERVAL", "RulesReloader", "signature"]
