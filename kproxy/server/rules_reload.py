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

A change is read, parsed and built into its injector in a worker thread (:meth:`LiveRules.prepare`:
parsing and building 100,000 rules takes seconds, which must not stall every connection), then put
in force on the trio thread with :meth:`LiveRules.install` (milliseconds), the only place sessions
read rules from: every open connection applies the new set from its next request, and a request
already decided keeps its rules. The signature is taken *before* the files are read, so a write
that lands during the read is seen at the next poll.

What is read is bounded (kproxy/rules/reading.py): only regular files, at most ``max_bytes``
(``rules_max_bytes``), so a FIFO, a device or a runaway file in the rules' place is a failed reload
at once, never a reader stuck for good. A directory with no rule file, in a file's place or
emptied, is a failed reload too while rules are in force (it never silently removes them: a file
with ``rules: []`` does). A reload still in its worker thread when the server shuts down is
abandoned: the thread's result is dropped and nothing is put in force once shutdown has begun.

A file that does not load (bad YAML, a bad rule, a duplicate id across a directory's files) is
rejected: the rules in force stay, and one warning line lists every problem as
``file:line: key: reason``. One line per reload either way::

    event=rules_reloaded generation=N file=PATH rules=N dry_run_rules=N trigger=change|sighup
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

import functools
import logging
import os
import threading
import weakref

import trio

from kproxy.files import stat_signature
from kproxy.logfmt import q
from kproxy.metrics.fault_stats import FaultStats
from kproxy.offloop import freeze_if_many, hold_parts, off_loop_build, release_parts
from kproxy.policy.injector import FaultInjector
from kproxy.policy.live_rules import LiveRules
from kproxy.rules import RulesError, RuleSet
from kproxy.rules.reading import DEFAULT_MAX_BYTES
from kproxy.rules.sources import load_path, rule_files

log = logging.getLogger("kproxy.rules")

# Half a second: a change applies within a second of being written, for one stat per file per
# interval. Kubelet itself only refreshes ConfigMap volumes every minute or so (its sync period).
POLL_INTERVAL = 0.5

# A replaced rule set of more rules than this is freed a part at a time (see RulesReloader._release):
# freeing tens of thousands of rules at once holds the GIL in one cascade; a thousand is short.
RELEASE_ABOVE = 1000
RELEASE_POLL = 1.0  # how often a replaced rule set still in use by some connection is looked at again

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
    return tuple((name, *stat_signature(name)) for name in files)


class RulesReloader:
    """Watches ``path`` (a rule file or a directory of them) and reloads ``live`` from it.

    ``await reloader.run()`` in the server's nursery polls until cancelled; :meth:`request`
    (SIGHUP) asks for a reload now, even of unchanged rules. Every reload is made by that one
    task, so two never overlap.
    """

    def __init__(self, live: LiveRules, path: str, *, counts: FaultStats,
                 interval: float = POLL_INTERVAL, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.live = live
        self.path = path
        self.counts = counts
        self.interval = interval
        self.max_bytes = max_bytes
        self._seen: Signature | None = None  # taken before the last load: a write after it is a change
        self._in_force: RuleSet | None = live.rules  # what this reloader (or the start-up config) loaded
        self._generation = live.generation  # the generation it had; another one means someone else replaced
        self._requested = False
        self._wake = trio.Event()
        self._releases: trio.Nursery | None = None  # run()'s: where replaced big rule sets are freed

    def request(self) -> None:
        """Reload at once, even if nothing changed (SIGHUP). Callable from the trio thread only."""
        self._requested = True
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # The rules in force were read by the config loader, before any signature: a write in
        # between would never be a change. So the files are loaded once more before the watch
        # starts, and put in force only if they differ (silently otherwise: no reload happened).
        async with trio.open_nursery() as self._releases:
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
        in_force, generation = self._in_force, self._generation
        # An empty source never removes rules in force (a directory emptied or put in a file's place).
        allow_empty = self.live.rules is None or not self.live.rules.rules
        try:
            # abandon_on_cancel: at shutdown the await ends at once and the build's result is dropped.
            rules, same, injector = await trio.to_thread.run_sync(
                self._build, in_force, generation, force, allow_empty, abandon_on_cancel=True,
                thread_name="kproxy-rules-reload")
        except RulesError as exc:
            self.counts.reloads["failure"] = self.counts.reloads.get("failure", 0) + 1
            detail = "; ".join(str(p) for p in exc.problems)
            log.warning("event=rules_reload_failed file=%s trigger=%s problems=%d generation=%d detail=%s",
                        q(self.path), trigger, len(exc.problems), self.live.generation, q(detail))
            return False
        if quiet and same:
            return True
        if not force and same and self.live.generation == self._generation:
            self.counts.reloads["success"] = self.counts.reloads.get("success", 0) + 1
            log.info("event=rules_unchanged generation=%d file=%s trigger=%s", self._generation, q(self.path),
                     trigger)
            return True
        if injector is None:  # someone else replaced the rules while these were read: built now
            injector = await trio.to_thread.run_sync(self._prepare, rules, abandon_on_cancel=True,
                                                     thread_name="kproxy-rules-reload")
        self.counts.reloads["success"] = self.counts.reloads.get("success", 0) + 1
        replaced = [self.live.injector]
        self._generation = await self.live.put_in_force(injector, origin=self.path, turn=trio.lowlevel.checkpoint)
        if self._releases is not None and replaced[0] is not None and len(replaced[0].plans) > RELEASE_ABOVE:
            self._releases.start_soon(self._release, replaced)
        self._in_force = rules
        enabled = [r for r in rules.rules if r.enabled]
        log.info("event=rules_reloaded generation=%d file=%s rules=%d dry_run_rules=%d trigger=%s", self._generation,
                 q(self.path), len(enabled), sum(1 for r in enabled if r.dry_run), trigger)
        return True

    async def _release(self, replaced: list[FaultInjector | None]) -> None:
        """Free a replaced big rule set without one long deallocation on the loop: its parts are held
        (kproxy/offloop.py) until the injector itself is gone (a connection lets it go at its
        next request), then dropped one at a time by a thread of their own (also at shutdown)."""
        parts: list[object] = []
        try:
            keep_out = (self.counts, self.live.clock, replaced[0].topic_names if replaced[0] else None)
            parts = await trio.to_thread.run_sync(functools.partial(hold_parts, replaced[0], keep_out=keep_out))
            gone = weakref.ref(replaced.pop())
            while gone() is not None:
                await trio.sleep(RELEASE_POLL)
        finally:
            replaced.clear()
            threading.Thread(target=release_parts, args=(parts,), name="kproxy-rules-release", daemon=True).start()

    def _prepare(self, rules: RuleSet) -> FaultInjector | None:
        with off_loop_build():
            injector = self.live.prepare(rules)
            freeze_if_many()
            return injector

    def _build(self, in_force: RuleSet | None, generation: int, force: bool,
               allow_empty: bool) -> tuple[RuleSet, bool, FaultInjector | None]:
        """In a worker thread: the rules read now, whether they equal ``in_force``, and their
        injector unless they would be no new generation (the same rules, no SIGHUP, nobody else
        replaced them since ``generation``). Touches nothing shared."""
        with off_loop_build():  # kproxy/offloop.py: no multi-second collections meanwhile
            rules = load_path(self.path, self.max_bytes, allow_empty=allow_empty)
            same = rules == in_force
            if same and not force and self.live.generation == generation:
                return rules, same, None
            injector = self.live.prepare(rules)
            freeze_if_many()
            return rules, same, injector


__all__ = ["POLL_INTERVAL", "RulesReloader", "signature"]
