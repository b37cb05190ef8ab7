"""Terminate mode, server side: the users every connection checks, their file re-read when it
changes, and what each login leaves in the log and the metrics.

:class:`ClientAuthService` is one per server (only with ``sasl.client.mode: terminate``). It holds
the :class:`~kproxy.sasl.server.CredentialChecker` every connection's
:class:`~kproxy.sasl.authenticator.ClientAuth` uses, the
:class:`~kproxy.server.password_checks.PasswordChecks` that runs their PLAIN hashes, and polls
the credentials file as the rules file is polled (kproxy/server/rules_reload.py says why a stat
poll: a Kubernetes Secret is updated by a symlink flip that inotify does not see). A change is
read and parsed in a worker thread and put in force for the logins that begin after it (a login
under way keeps the users it began with). A file that does not load keeps the users in force and
says so in one warning line, once per distinct problem::

    event=credentials_reloaded file=PATH users=N
    event=credentials_reload_failed file=PATH detail="PATH: users.alice.PLAIN.hash: not base64"

Logins: ``kproxy_sasl_authentications_total{side="client",mechanism,result}`` counts every one
that ends (``mechanism`` is one offered, or ``unsupported``). A refused one is also a warning line,
at most one per 10 s with the count of those it stands for, naming the peer, the mechanism, the
user the client claimed and kproxy's reason (``wrong password``, ``unknown user``: never the
password, nor anything of a proof); an accepted one a debug line (the connection's lines carry its
principal from then on).
"""

from __future__ import annotations

import functools
import logging

import trio

from kproxy.config.sections import SaslClient
from kproxy.files import stat_signature
from kproxy.logfmt import clip, q
from kproxy.metrics.stats import TrafficStats
from kproxy.ratelimit import LogRateLimit
from kproxy.sasl.authenticator import ApiVersionsSource, ClientAuth, Outcome
from kproxy.sasl.credentials import CredentialsError, CredentialStore
from kproxy.sasl.credentials_file import load_credentials
from kproxy.sasl.server import CredentialChecker
from kproxy.server.password_checks import PasswordChecks

log = logging.getLogger("kproxy.sasl")

POLL_INTERVAL = 0.5  # as the rules file's: a change applies within a second of being written


class ClientAuthService:
    """Terminate mode for one server: :meth:`for_connection` makes each connection's SASL server,
    :meth:`run` (in the server's nursery) keeps the users in step with the credentials file."""

    def __init__(self, options: SaslClient, stats: TrafficStats, *, interval: float = POLL_INTERVAL) -> None:
        assert options.credentials_file is not None, "terminate mode without a credentials file"
        self.options = options
        self.path = str(options.credentials_file)
        self.stats = stats
        self.interval = interval
        self.checker = CredentialChecker(options.credentials or CredentialStore(), options.mechanisms)
        self.password_checks = PasswordChecks()  # every connection's PLAIN hashes, shared fairly
        self._refusals = LogRateLimit()
        self._failed: str | None = None  # the last reload failure logged (each distinct one once)
        for mechanism in options.mechanisms:
            stats.sasl_mechanism_used("client", mechanism)

    def for_connection(self, peer: str, api_versions: ApiVersionsSource | None = None) -> ClientAuth:
        """The SASL server of the connection of ``peer``; ``api_versions``: the cluster's answers its
        ApiVersions before the login gets (kproxy/server/discovery.py)."""
        return ClientAuth(self.checker, session_lifetime=self.options.session_lifetime,
                          on_outcome=functools.partial(self._outcome, peer), api_versions=api_versions)

    def _outcome(self, peer: str, outcome: Outcome) -> None:
        self.stats.sasl_authenticated("client", outcome.mechanism, "success" if outcome.success else "failure",
                                      outcome.reauthentication)
        user = q(clip(outcome.user)) if outcome.user is not None else "-"
        if outcome.success:
            log.debug("event=sasl_authenticated side=client peer=%s mechanism=%s principal=%s reauthentication=%s",
                      peer, outcome.mechanism, q(clip("User:" + outcome.user if outcome.user else "-")),
                      outcome.reauthentication)
            return
        count = self._refusals.due()
        if count is not None:
            log.warning("event=sasl_authentication_failed side=client peer=%s mechanism=%s user=%s reason=%s "
                        "reauthentication=%s occurrences=%d", peer, outcome.mechanism, user, q(outcome.reason or "-"),
                        outcome.reauthentication, count)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # The users in force were read by the config loader, before any signature: read once more
        # before the watch starts, so that a write in between is not missed.
        seen = stat_signature(self.path)
        await self.reload(quiet=True)
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            now = stat_signature(self.path)
            if now != seen:
                seen = now
                await self.reload()

    async def reload(self, *, quiet: bool = False) -> bool:
        """Read the file now and put its users in force; False (the users in force kept) when it
        does not load. ``quiet``: no line for a successful read (the check at start)."""
        try:
            store = await trio.to_thread.run_sync(load_credentials, self.path, abandon_on_cancel=True,
                                                  thread_name="kproxy-credentials-reload")
        except CredentialsError as exc:
            detail = "; ".join(exc.problems)
            if detail != self._failed:
                self._failed = detail
                log.warning("event=credentials_reload_failed file=%s users_in_force=%d detail=%s", q(self.path),
                            len(self.checker.store.users), q(detail))
            return False
        self._failed = None
        changed = store != self.checker.store
        self.checker.store = store
        if changed and not quiet:
            log.info("event=credentials_reloaded file=%s users=%d", q(self.path), len(store.users))
        return True
