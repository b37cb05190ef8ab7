"""The proxy server: a bootstrap listener, one listener per upstream broker, and shutdown.

Listener model: the bootstrap port forwards to the configured upstream
bootstrap servers (the first that accepts). Every broker seen in a response
gets its own port (see :class:`~kproxy.proxy.addresses.AddressMap`), opened
*before* the response naming it reaches the client, so a client never races a
listener that is not there yet. Each client connection gets its own upstream
connection.

Failure containment: a connection's errors end that connection only (logged,
never raised into the server's nursery). Running out of descriptors or kernel
memory makes ``accept()`` fail: the listener logs it (one line per interval,
with a count), backs off and retries while open connections carry on; clients
wait in the listen backlog meanwhile. ``limits.max_connections`` caps client
connections below that point: one more is closed as soon as accepted. On SIGTERM/SIGINT the server stops
accepting, lets connections finish their in-flight requests for
``limits.shutdown_grace`` seconds, then cancels what is left. SIGHUP never stops it: it reloads
the rules file (kproxy/server/rules_reload.py), which is also reloaded whenever it changes.

Why one module: one class, :class:`ProxyServer`, whose
lifecycle (start, signals, drain), listeners and per-connection set-up share its state (the
listener table, the connection set, the draining flag, the upstream health). The jobs that stand
alone are their own modules already: connection.py, upstream.py, discovery.py, upstream_health.py,
rules_reload.py, kproxy/policy/ (the rules in force), kproxy/admin/.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from kproxy.config import AdminOptions, CaptureOptions, Config
from kproxy.config.sections import Cluster
from kproxy.host_port import HostPort
from kproxy.logfmt import LOG_CLUSTER
from kproxy.logfmt import q as _q
from kproxy.memory import freeze_start_up
from kproxy.metrics.client_anomalies import AnomalyOptions
from kproxy.metrics.consumer_lag import ConsumerLag
from kproxy.metrics.exposition import ClusterSeries, LiveGauges, MetricsServer, make_registry
from kproxy.metrics.lag_exposition import ConsumerLagCollector
from kproxy.metrics.stats import ACCEPT_CAPACITY_ERRORS, BOOTSTRAP_NODE, StatsOptions, TrafficStats, node_label
from kproxy.metrics.traffic_observer import MetricsObserver
from kproxy.policy.live_rules import LiveRules
from kproxy.protocol.errors import ProtocolError
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap, BrokerRoute, PortsExhausted
from kproxy.proxy.session import Session, SessionObserver
from kproxy.ratelimit import LogRateLimit
from kproxy.sasl.authenticator import ANSWERED_VERSIONS
from kproxy.sasl.upstream_login import UpstreamLogin
from kproxy.server.client_auth import ClientAuthService
from kproxy.server.connection import Connection
from kproxy.server.discovery import ClusterVersions, fetch_api_versions, fetch_api_versions_answers, fetch_brokers
from kproxy.server.loopwatch import LoopWatch
from kproxy.server.rules_reload import RulesReloader
from kproxy.server.sockets import peer_name
from kproxy.server.timers import Deadlines
from kproxy.server.tls_reload import LiveTls, TlsReloader
from kproxy.server.upstream import UpstreamConnector, UpstreamUnavailable
from kproxy.server.upstream_auth import UpstreamLoginFailed, UpstreamLogins, authenticate
from kproxy.server.upstream_health import BOOTSTRAP, Result, Target, UpstreamHealth
from kproxy.server.warmup import warm_up

if TYPE_CHECKING:
    from kproxy.admin.api_server import AdminServer
    from kproxy.capture.service import CaptureService

log = logging.getLogger("kproxy.server")

# errno -> name for accept() failures that mean "no descriptors or memory left right now" (accept(2)):
# retried after _ACCEPT_BACKOFF, as trio's own serve_listeners does; any other error ends the listener.
_CAPACITY_ERRNOS = {getattr(errno, name): name for name in ACCEPT_CAPACITY_ERRORS}
_ACCEPT_BACKOFF = 0.1
# A broker listener whose port could not be bound (another process holds it) binds it again after
# _LISTEN_RETRY_FIRST seconds, then twice as long each time up to _LISTEN_RETRY_MAX: the port a
# Metadata answer names heals once it is free, without a restart; the bootstrap listener's failure
# ends `run` instead (nothing could reach kproxy).
_LISTEN_RETRY_FIRST = 1.0
_LISTEN_RETRY_MAX = 30.0


class ListenFailed(OSError):
    """A port kproxy must listen on could not be opened; says which (``what``, ``address``)."""

    def __init__(self, what: str, address: str, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.what = what
        self.address = address


@dataclass
class _Listener:
    name: str
    port: int
    resolve: Callable[[], list[HostPort]]
    ready: trio.Event = field(default_factory=trio.Event)
    failed: str | None = None
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    node_id: int | None = None  # the broker behind it (None: the bootstrap listener)


class ProxyServer:
    """Owns listeners and connections for one :class:`Config`.

    ``await server.run(task_status=...)`` serves until cancelled or signalled;
    with ``nursery.start`` it returns once the bootstrap listener accepts, and
    ``bootstrap_port`` is the bound port (useful with ``--listen HOST:0``).
    """

    def __init__(self, config: Config, *, handle_signals: bool = True, freeze_gc: bool = False,
                 primary: ProxyServer | None = None) -> None:
        # With several clusters (config.clusters) this server serves the first, and one server per
        # other cluster (its ``siblings``, made here with ``primary`` = this one) the others: they share
        # this one's rules, capture, metrics and admin endpoints, signals and event loop watch.
        self.primary = primary
        every = config.every_cluster
        if config.clusters:
            config = config.cluster_config(every[0])
        self.config = config
        self.cluster = config.cluster
        # Logs name the cluster only when there are several (LOG_CLUSTER, set in this server's tasks).
        self.log_cluster = config.cluster if len(every) > 1 or primary is not None else None
        self.handle_signals = handle_signals
        self.freeze_gc = freeze_gc  # the process is kproxy's own: freeze_start_up() after the warm-up
        self.addresses = AddressMap(config.advertised, config.first_broker_port, dict(config.broker_ports),
                                    max_port=config.last_broker_port)
        # Terminate mode: kproxy answers SASL itself, and ApiVersions answers say which versions it speaks.
        terminate = config.sasl_client.terminate
        self.rewriter = ResponseRewriter(self.addresses, answered=ANSWERED_VERSIONS if terminate else None)
        m = config.metrics
        lag = m.consumer_lag and m.scan_responses  # (the lag reads the answers' scans)
        anomalies = AnomalyOptions(m.client_anomalies_churn_per_minute, m.client_anomalies_forbid_acks0,
                                   m.client_anomalies_require_compression, m.client_anomalies_rebalance_joins,
                                   m.client_anomalies_rebalance_window,
                                   m.client_anomalies_retries_per_minute) if m.client_anomalies else None
        self.stats = TrafficStats(StatsOptions(m.client_id_label, m.topic_label, m.label_cap, m.scan_responses,
                                               consumer_lag=lag, anomalies=anomalies))
        self.lag = ConsumerLag(stale_after=m.consumer_lag_stale_after) if lag else None
        self.observer: MetricsObserver | None = MetricsObserver(self.stats, self.lag)
        self.loop_watch = LoopWatch(self.stats.event_loop_lag, self.stats.event_loop_held)
        self.deadlines = Deadlines()  # every connection's timeouts and wake-ups, kept by one task
        self.metrics_server: MetricsServer | None = None
        # Each side's TLS in force (None: plaintext), replaced when its files are rotated.
        self.client_tls = LiveTls.listener(config.client_tls)
        self.connector = UpstreamConnector(config, self.stats)
        tls_sides = [side for side in (self.client_tls, self.connector.tls) if side is not None]
        self.tls_reloader = TlsReloader(tls_sides) if tls_sides else None
        # kproxy's own login to the brokers (sasl.upstream), on every upstream connection it opens.
        self.logins = UpstreamLogins(config, self.stats) if config.sasl_upstream.enabled else None
        self.listeners: dict[int, _Listener] = {}
        # The ports of listeners that are ready (open, or failed and binding again): what ensure_listeners
        # waits for, which connections check first (a set lookup per route, not an await).
        self.listening: set[int] = set()
        self.connections: set[Connection] = set()
        self.bootstrap_port = 0
        self._nursery: trio.Nursery | None = None
        self._connections_nursery: trio.Nursery | None = None
        self._listener_lock = trio.Lock()
        self.draining = False
        self.warmed = trio.Event()  # brokers discovered and the likely codecs compiled
        self.connections_total = 0
        self.open_clients = 0  # accepted and not closed yet, handshaking ones included (limits.max_connections)
        self._accept_failures = LogRateLimit()
        self._cap_refusals = LogRateLimit()
        # One throttle per (listener, reason): a client retrying against a dead broker in a tight loop
        # makes one line per 10 s with a count, not one per attempt; a new reason is logged at once.
        self._upstream_refusals: dict[tuple[str, str], LogRateLimit] = {}
        for addr in config.upstream:
            # Born at zero, so that the first failure is an increase alerts can see.
            self.stats.upstream_connect_failures.setdefault((str(addr), BOOTSTRAP_NODE), 0)
        self.health = UpstreamHealth(self._health_targets, self._probe_upstream,
                                     interval=config.upstream_check_interval, on_result=self._health_result)
        if self.addresses.broker_port_base == 0:
            self.addresses.port_allocator = self._bind_ephemeral
        self._prebound: dict[int, socket.socket] = {}
        # One engine for every connection: schedule counters and throttle buckets are global. The
        # rules in force can be replaced while connections run (kproxy/policy/live_rules.py).
        self.rules: LiveRules = (primary.rules if primary is not None
                                 else LiveRules(config.rules, counts=self.stats.faults))
        self.reloader: RulesReloader | None = None
        source = config.rules.source if config.rules is not None else None
        if primary is None and source is not None and os.path.exists(source):
            # Rules read from a file can change while connections run: every connection gets a policy,
            # so a file empty at its start applies to it once it is filled.
            self.rules.mutable = True
            self.reloader = RulesReloader(self.rules, source, counts=self.stats.faults,
                                          max_bytes=config.rules_max_bytes)
        self.client_auth = ClientAuthService(config.sasl_client, self.stats) if terminate else None
        # Terminate mode: the cluster's ApiVersions answers, which a client's before its login gets (its
        # upstream connection opens after the login: kproxy/sasl/client_login.py), from the upstream checks.
        self.cluster_versions = ClusterVersions(BOOTSTRAP) if terminate else None
        self.admin_server: AdminServer | None = None
        self.capture: CaptureService | None = primary.capture if primary is not None else None
        if config.capture.enabled and primary is None:
            from kproxy.capture.service import CaptureService  # needs pyarrow: only when capture is on

            # (the run's detector settings go in the capture's metadata: kproxy analyze counts with them)
            self.capture = CaptureService(config.capture, None if anomalies is None else dataclasses.asdict(anomalies),
                                          log_settings=(config.log_level, config.log_format))
        self.siblings: list[ProxyServer] = [] if primary is not None else [
            ProxyServer(_sibling_config(config, cluster), handle_signals=False, primary=self) for cluster in every[1:]]

    # -- lifecycle -----------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self.primary is not None:  # a sibling's every task is its cluster's (the first's: _as_cluster)
            LOG_CLUSTER.set(self.log_cluster)  # (this task's context, which the tasks it starts inherit)
        self._warn_about_options()
        if self.capture is None or self.primary is not None:
            await self._run(task_status=task_status)
            return
        self.capture.start()
        try:
            await self._run(task_status=task_status)
        finally:
            # Complete (rename) the open capture file, also when cancelled: never a half-written file.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.capture.close)

    async def _run(self, *, task_status: trio.TaskStatus[None]) -> None:
        started = False
        async with trio.open_nursery() as connections:
            self._connections_nursery = connections
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.handle_signals:
                    # Before the first listener opens: from the moment a client (or a readiness probe)
                    # can connect, a SIGTERM must drain, never kill with the default action.
                    await nursery.start(self._watch_signals)
                    # In the outer nursery: SIGHUP is handled (not fatal) while connections drain too.
                    await connections.start(self._watch_hangups)
                if self.draining:  # shutdown() came before run(): start nothing, stop cleanly
                    nursery.cancel_scope.cancel()
                boot = _Listener("bootstrap", self.config.listen.port, lambda: list(self.config.upstream))
                await nursery.start(self._serve, boot)
                self.bootstrap_port = boot.port
                self.addresses.reserved_ports.add(boot.port)
                for sibling in self.siblings:  # (beside the connections: its own drain is not cancelled with ours)
                    await connections.start(sibling.run)
                if self.config.metrics_listen is not None:
                    self.metrics_server = MetricsServer(
                        make_registry(self.stats, self._live_gauges, process=self.config.metrics.process_metrics,
                                      lag=self._lag_collector(), clusters=[
                                          ClusterSeries(server.cluster, server.stats, server._live_gauges,
                                                        server._lag_collector())
                                          for server in (self, *self.siblings)] if self.siblings else ()),
                        self.readiness, max_connections=self.config.limits.max_http_connections)
                    try:
                        await nursery.start(self.metrics_server.serve, self.config.metrics_listen.host,
                                            self.config.metrics_listen.port)
                    except OSError as exc:
                        raise ListenFailed("metrics", str(self.config.metrics_listen), exc) from exc
                if self.config.admin.listen is not None:
                    await self._start_admin(nursery, self.config.admin.listen)
                if self.reloader is not None:
                    await nursery.start(self.reloader.run)
                if self.client_auth is not None:
                    await nursery.start(self.client_auth.run)
                if self.tls_reloader is not None:
                    await nursery.start(self.tls_reloader.run)
                nursery.start_soon(self._as_cluster, self._discover_brokers)
                nursery.start_soon(self._as_cluster, self.health.run)
                # In the outer nursery: the loop is watched, and connections' deadlines kept, while they drain too.
                if self.primary is None:
                    await connections.start(self.loop_watch.run)
                connections.start_soon(self.deadlines.run)
                said = LOG_CLUSTER.set(self.log_cluster)
                log.info("event=listening listener=bootstrap address=%s:%d upstream=%s advertised_host=%s",
                         self.config.listen.host, boot.port, ",".join(map(str, self.config.upstream)),
                         self.config.advertised)
                LOG_CLUSTER.reset(said)
                task_status.started()
                started = True
            if not started:
                # A shutdown during start-up cancelled it: whoever waits for the start is told, and
                # the drain below ends at once (nothing was accepted).
                task_status.started()
            # Listeners are closed (shutdown); connections drain within the grace period.
            with trio.move_on_after(self.config.limits.shutdown_grace) as grace:
                while self.connections or any(sibling.connections for sibling in self.siblings):
                    await trio.sleep(0.05)
            if grace.cancelled_caught:
                log.warning("event=shutdown_grace_expired connections=%d", len(self.connections))
            connections.cancel_scope.cancel()
        log.info("event=stopped")

    async def _start_admin(self, nursery: trio.Nursery, address: HostPort) -> None:
        """The admin API (kproxy/admin/), imported only when it is on."""
        from kproxy.admin.api_server import AdminServer
        from kproxy.admin.book import RuleBook

        self.admin_server = AdminServer(RuleBook(self.rules), token=self.config.admin.bearer_token(),
                                        max_connections=self.config.limits.max_http_connections)
        try:
            await nursery.start(self.admin_server.serve, address.host, address.port)
        except OSError as exc:
            raise ListenFailed("admin", str(address), exc) from exc

    def _warn_about_options(self) -> None:
        """One warning line per risky setting, at start: an operator reading the log must see them."""
        tls = self.config.upstream_tls
        if not tls.verify and tls.enabled:
            log.warning("event=upstream_tls_unverified option=tls.upstream.verify detail=%s",
                        _q("broker certificates and names are not checked: whoever answers on the "
                           "broker's address is trusted (--no-tls-upstream-verify)"))
        elif not tls.verify:
            log.warning("event=option_unused option=tls.upstream.verify detail=%s",
                        _q("--no-tls-upstream-verify has no effect without --tls-upstream-enabled"))
        rules = self.config.rules
        if rules is not None:
            # A warning: kproxy misbehaves on purpose from now on (kproxy_rules_loaded says so too).
            enabled = [r for r in rules.rules if r.enabled]
            log.warning("event=fault_injection_enabled file=%s rules=%d dry_run_rules=%d seed=%d",
                        _q(rules.source or "-"), len(enabled), sum(1 for r in enabled if r.dry_run), rules.seed)
            # A rule for a cluster no server here has (a misspelt name) would never match: said at start.
            known = {server.cluster for server in (self, *self.siblings)}
            for rule in enabled:
                unknown = sorted((rule.match.clusters or frozenset()) - known)
                if unknown:
                    log.warning("event=rule_cluster_unknown rule=%s clusters=%s known=%s", _q(rule.id),
                                ",".join(unknown), ",".join(sorted(known)))

    def shutdown(self) -> None:
        """Stop accepting; drain connections; ``run`` returns when they are done or the grace ends."""
        if self.draining:
            return
        self.draining = True
        said = LOG_CLUSTER.set(self.log_cluster)  # (its connections: with several clusters, this cluster's)
        log.info("event=shutdown_started connections=%d grace_s=%.1f", len(self.connections),
                 self.config.limits.shutdown_grace)
        LOG_CLUSTER.reset(said)
        for listener in self.listeners.values():
            listener.scope.cancel()
        for conn in list(self.connections):
            conn.drain()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        for sibling in self.siblings:
            sibling.shutdown()

    async def _watch_signals(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Started once the receiver is installed; returns after the first SIGTERM/SIGINT.

        A second one during the drain kills at once (the default action again), the way out of a
        drain an operator does not want to wait for.
        """
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async for signum in signals:
                log.info("event=signal signal=%s", signal.Signals(signum).name)
                self.shutdown()
                return

    async def _watch_hangups(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """SIGHUP reloads the rules and never ends the process (its default action would, exit 129).

        A receiver of its own, separate from SIGTERM/SIGINT's, so that it outlives their first
        signal and covers the drain.
        """
        with trio.open_signal_receiver(signal.SIGHUP) as signals:
            task_status.started()
            async for _ in signals:
                if self.reloader is None or self.draining:
                    why = "shutting down" if self.draining else "no rules file configured (--rules)"
                    log.info("event=signal signal=SIGHUP action=none reason=%s", _q(why))
                else:
                    log.info("event=signal signal=SIGHUP action=reload_rules file=%s", _q(self.reloader.path))
                    self.reloader.request()

    async def _discover_brokers(self) -> None:
        """Open every broker's port at start-up (see :mod:`kproxy.server.discovery`).

        Retries with backoff until it succeeds once; clients' own Metadata keeps
        the map current after that.
        """
        delay = 0.5
        while True:
            try:
                stream, addr = await self.connector.connect(list(self.config.upstream), BOOTSTRAP_NODE, probe=True)
                try:
                    with trio.fail_after(self.config.limits.connect_timeout):
                        login = self.upstream_login()
                        if login is not None:
                            await authenticate(stream, login, self.config.limits.max_frame_size)
                        versions = await fetch_api_versions(stream, self.config.limits.max_frame_size)
                        brokers = await fetch_brokers(stream, self.config.limits.max_frame_size)
                finally:
                    await trio.aclose_forcefully(stream)
                routes = [self.addresses.learn(node, host, port) for node, host, port in brokers if node >= 0]
                await self.ensure_listeners(routes)
                log.info("event=brokers_discovered upstream=%s brokers=%d", addr, len(routes))
                await warm_up(versions, self.rewriter)
                if self.freeze_gc:
                    freeze_start_up()
                self.warmed.set()
                return
            except (UpstreamUnavailable, ProtocolError, PortsExhausted, trio.BrokenResourceError, trio.TooSlowError,
                    OSError, ssl.SSLError, UpstreamLoginFailed) as exc:
                log.warning("event=broker_discovery_failed retry_in_s=%.1f reason=%s", delay,
                            _q(str(exc) or type(exc).__name__))
            await trio.sleep(delay)
            delay = min(delay * 2, 30.0)

    # -- health and metrics ----------------------------------------------------------
    def _lag_collector(self) -> ConsumerLagCollector | None:
        """The consumer-lag series' collector (None: lag not tracked)."""
        if self.lag is None:
            return None
        m = self.config.metrics
        return ConsumerLagCollector(self.lag, label_cap=m.label_cap, partitions=m.consumer_lag_partitions)

    def _live_gauges(self) -> LiveGauges:
        # Read from a worker thread at scrape time (metrics/exposition.py): list() copies are atomic.
        return LiveGauges(in_flight=sum(c.session.in_flight_count for c in list(self.connections)),
                          listeners=sum(1 for lst in list(self.listeners.values()) if lst.failed is None),
                          capture=self.capture.counts() if self.capture is not None else None,
                          capture_over_budget=self.capture.over_budget if self.capture is not None else 0,
                          certificates={(side.side, subject): validity for side in self.tls_reloader.sides
                                        for subject, validity in side.validity().items()}
                          if self.tls_reloader is not None else {})

    async def readiness(self) -> str | None:
        """None when ready to serve; else why not (for ``/readyz``)."""
        if self.draining:
            return "shutting down"
        if self.bootstrap_port == 0:
            why: str | None = "bootstrap listener not open"
        else:
            why = self.health.not_ready()  # the periodic check's last word: a probe opens no connection
        # A broker's port that could not be bound is still the one Metadata answers give clients.
        failed = [f"listener {lst.name} cannot listen on port {lst.port}: {lst.failed}"
                  for lst in list(self.listeners.values()) if lst.failed is not None]
        if failed:
            why = "; ".join([*failed, *([why] if why is not None else [])])
        if not self.siblings:
            return why
        # Several clusters: ready when every one is (ready_clusters: all) or one is (any), else each
        # one's reason, named.
        servers = (self, *self.siblings)
        reasons = [f"cluster {server.cluster}: {reason}" for server in servers
                   if (reason := why if server is self else await server.readiness()) is not None]
        if self.config.ready_clusters == "any" and len(reasons) < len(servers):
            return None
        return "; ".join(reasons) or None

    def _health_targets(self) -> list[Target]:
        targets = [Target(addr, BOOTSTRAP) for addr in self.config.upstream]
        targets += [Target(route.upstream, str(node)) for node, route in sorted(self.addresses.routes.items())]
        return targets

    async def _probe_upstream(self, target: Target) -> None:
        # Not a probe in UpstreamConnector.connect's sense: a failure here is counted per broker, like a client's.
        try:
            stream, _ = await self.connector.connect([target.address], target.node_id)
        except UpstreamUnavailable as exc:
            # The reason alone: /readyz and the upstream_down line name the address themselves.
            raise ConnectionError("; ".join(exc.reasons)) from None
        try:
            if self.cluster_versions is not None:  # terminate mode: the answers clients get before their login
                with trio.fail_after(self.config.limits.connect_timeout):
                    answers = await fetch_api_versions_answers(stream, self.config.limits.max_frame_size)
                self.cluster_versions.learn(target.node_id, answers)
        except (ProtocolError, trio.BrokenResourceError, trio.TooSlowError, OSError, ssl.SSLError) as exc:
            raise ConnectionError(f"ApiVersions: {exc or type(exc).__name__}") from None
        finally:
            await trio.aclose_forcefully(stream)

    def _health_result(self, target: Target, result: Result) -> None:
        self.stats.upstream_up[(str(target.address), target.node_id)] = int(result.up)

    # -- listeners -----------------------------------------------------------------
    def _bind_ephemeral(self, node_id: int) -> int:
        """Port allocator for ``broker_port_base: 0``: bind now, so the port is known synchronously."""
        sock = socket.socket(socket.AF_INET6 if ":" in self.config.listen.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.config.listen.host, 0))
        port: int = sock.getsockname()[1]
        self._prebound[port] = sock
        return port

    async def ensure_listeners(self, routes: Sequence[BrokerRoute]) -> None:
        """Make sure every route has a listening port; waits for ones being opened."""
        for route in routes:
            listener = self.listeners.get(route.local_port)
            if listener is None:
                async with self._listener_lock:
                    listener = self.listeners.get(route.local_port)
                    if listener is None and self._nursery is not None and not self.draining:
                        listener = _Listener(f"broker-{route.node_id}", route.local_port,
                                             _route_resolver(route), node_id=route.node_id)
                        await self._nursery.start(self._serve, listener)
            if listener is not None and not listener.ready.is_set():
                await listener.ready.wait()  # (Event.wait yields even when set: skip it on the hot path)

    async def _as_cluster(self, work: Callable[[], Awaitable[None]]) -> None:
        """``work`` as this server's cluster's: its log lines name the cluster (when there are several).
        The first cluster's server runs the process's tasks too (metrics, rules, signals): only its
        cluster's own are started through here, so theirs do not name it."""
        LOG_CLUSTER.set(self.log_cluster)
        await work()

    async def _serve(self, listener: _Listener, *, task_status: trio.TaskStatus[None]) -> None:
        """Open ``listener``'s port and accept on it until its scope is cancelled. Started once the port
        is open, or once a broker listener's port failed to open: that listener is then marked failed
        (readiness names it) and binds its port again until it is free (``_listen_again``)."""
        LOG_CLUSTER.set(self.log_cluster)  # (its connections' tasks inherit it)
        sock: trio.socket.SocketType | None = None
        try:
            sock = await self._open_socket(listener.port)
        except OSError as exc:
            self._listen_failed(listener, exc, attempts=1)
            if listener.name == "bootstrap":
                raise ListenFailed("bootstrap", f"{self.config.listen.host}:{listener.port}", exc) from exc
            task_status.started()
        assert self._connections_nursery is not None
        with listener.scope:
            retried = sock is None
            attempts = 1
            if sock is None:
                sock, attempts = await self._listen_again(listener)
            listener.port = sock.getsockname()[1]
            listener.failed = None
            self.listeners[listener.port] = listener
            self.stats.listener_opened(listener.name, node_label(listener.node_id))
            tcp = trio.SocketListener(sock)
            listener.ready.set()
            self.listening.add(listener.port)
            if listener.name != "bootstrap":
                log.info("event=listening listener=%s address=%s:%d%s", listener.name, self.config.listen.host,
                         listener.port, f" attempts={attempts}" if retried else "")
            if not retried:
                task_status.started()
            async with tcp:
                cap = self.config.limits.max_connections
                while True:
                    try:
                        stream = await tcp.accept()
                    except OSError as exc:
                        error = _CAPACITY_ERRNOS.get(exc.errno or 0)
                        if error is None:
                            raise
                        self._accept_failed(listener, error, exc)
                        await trio.sleep(_ACCEPT_BACKOFF)
                        continue
                    if cap and self.open_clients >= cap:
                        await self._refuse(stream, listener, cap)
                        continue
                    self.connections_total += 1
                    self.open_clients += 1
                    self._connections_nursery.start_soon(self._handle, stream, listener)

    def _listen_failed(self, listener: _Listener, exc: OSError, *, attempts: int,
                       retry_in: float = _LISTEN_RETRY_FIRST) -> None:
        """Mark ``listener`` failed (ready: nobody waits for it; readiness names it) and say so."""
        listener.failed = f"{exc.strerror or exc}"
        listener.ready.set()
        self.listeners[listener.port] = listener
        self.listening.add(listener.port)
        retry = "" if listener.name == "bootstrap" else f" retry_in_s={retry_in:.0f}"  # (the bootstrap's ends run)
        log.error("event=listen_failed listener=%s port=%d error=%s attempts=%d%s", listener.name, listener.port,
                  _q(listener.failed), attempts, retry)

    async def _listen_again(self, listener: _Listener) -> tuple[trio.socket.SocketType, int]:
        """Bind a failed broker listener's port again, backing off, until it opens (returned, with the
        attempts it took, the first failed one included) or the listener's scope is cancelled. A failure
        is logged at the 2nd, 4th, 8th... attempt: a port held for hours leaves a line every few
        minutes, not one a retry."""
        delay, attempts = _LISTEN_RETRY_FIRST, 1
        while True:
            await trio.sleep(delay)
            attempts += 1
            try:
                return await self._open_socket(listener.port), attempts
            except OSError as exc:
                delay = min(delay * 2, _LISTEN_RETRY_MAX)
                if attempts & (attempts - 1) == 0:
                    self._listen_failed(listener, exc, attempts=attempts, retry_in=delay)
                else:
                    listener.failed = f"{exc.strerror or exc}"

    def _accept_failed(self, listener: _Listener, error: str, exc: OSError) -> None:
        self.stats.accept_failed(error)
        count = self._accept_failures.due()
        if count is not None:
            log.warning("event=accept_failed listener=%s error=%s detail=%s occurrences=%d retry_in_s=%.1f "
                        "open_connections=%d", listener.name, error, _q(exc.strerror or str(exc)), count,
                        _ACCEPT_BACKOFF, self.open_clients)

    async def _refuse(self, stream: trio.SocketStream, listener: _Listener, cap: int) -> None:
        """Close a connection accepted over ``limits.max_connections`` at once (the client sees
        the connection closed and retries later, as after a broker restart)."""
        self.stats.client_refused(listener.name, node_label(listener.node_id))
        count = self._cap_refusals.due()
        if count is not None:
            log.warning("event=connection_refused listener=%s peer=%s reason=max_connections max_connections=%d "
                        "occurrences=%d", listener.name, peer_name(stream), cap, count)
        await trio.aclose_forcefully(stream)

    async def _open_socket(self, port: int) -> trio.socket.SocketType:
        pre = self._prebound.pop(port, None)
        if pre is not None:
            sock = trio.socket.from_stdlib_socket(pre)
        else:
            host = self.config.listen.host
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = trio.socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                await sock.bind((host, port))
            except OSError:
                sock.close()
                raise
        sock.listen(512)
        return sock

    # -- connections -----------------------------------------------------------------
    async def _handle(self, stream: trio.SocketStream, listener: _Listener) -> None:
        try:
            await self._bridge(stream, listener)
        finally:
            self.open_clients -= 1

    async def _bridge(self, stream: trio.SocketStream, listener: _Listener) -> None:
        peer = peer_name(stream)
        node = node_label(listener.node_id)
        try:
            client: trio.abc.Stream = stream  # TCP_NODELAY: trio.SocketStream sets it on every stream
            if self.client_tls is not None:
                client = trio.SSLStream(stream, self.client_tls.context, server_side=True)
                with trio.fail_after(self.config.limits.connect_timeout):
                    await client.do_handshake()
            upstream: trio.abc.Stream | None = None
            addr: HostPort | None = None
            if self.cluster_versions is None:
                upstream, addr = await self.connector.connect(listener.resolve(), node)
            else:  # terminate mode: the upstream connection opens after the client's login (ConnectUpstream)
                await self._versions_known()
        except (UpstreamUnavailable, OSError, trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError) as exc:
            reason = str(exc) or type(exc).__name__
            if len(self._upstream_refusals) > 1000:  # bounded, whatever the reasons' variety
                self._upstream_refusals.clear()
            throttle = self._upstream_refusals.setdefault((listener.name, reason), LogRateLimit())
            count = throttle.due()
            if count is not None:
                log.warning("event=connection_refused peer=%s listener=%s reason=%s occurrences=%d", peer,
                            listener.name, _q(reason), count)
            await trio.aclose_forcefully(stream)
            return
        limits = self.config.limits
        policy = self.rules.policy(peer, listener.node_id, self.cluster)
        auth = None
        if self.client_auth is not None and self.cluster_versions is not None:
            auth = self.client_auth.for_connection(peer, self.cluster_versions.source(node))
        session = Session(self.rewriter, max_in_flight=limits.max_in_flight, max_frame_size=limits.max_frame_size,
                          policy=policy, login=self.upstream_login(peer), auth=auth)
        observer: SessionObserver | None = None
        metrics = None
        if self.observer is not None:
            observer = metrics = self.observer.for_broker(listener.node_id)
        if self.capture is not None:
            # Records carry the session's principal (TLS or SASL), the one the rules see.
            # (terminate mode: the upstream it will try first, once the client logged in)
            observer = self.capture.observer(observer, peer=peer, listener=listener.name,
                                             upstream=str(addr or listener.resolve()[0]), client=client,
                                             identity=session, cluster=self.cluster)
        session.observer = observer

        async def connect() -> tuple[trio.abc.Stream, HostPort]:  # terminate mode: ConnectUpstream
            opened = await self.connector.connect(listener.resolve(), node)
            self.stats.upstream_connected(str(opened[1]), node)
            return opened

        conn = Connection(client, upstream, session, limits=self.config.limits,
                          ensure_listeners=self.ensure_listeners, peer=peer, listener=listener.name,
                          upstream_addr=addr, on_reject=self.stats.frame_rejected, deadlines=self.deadlines,
                          listening=self.listening, connect=connect,
                          password_checks=self.client_auth.password_checks if self.client_auth is not None else None)
        self.connections.add(conn)
        self.stats.client_connected(listener.name, node)
        if addr is not None:
            self.stats.upstream_connected(str(addr), node)
        log.info("event=connection_opened peer=%s listener=%s upstream=%s", peer, listener.name, addr or "-")
        try:
            if self.draining:
                conn.drain()
            await conn.run()
        except Exception:
            # A bug in one connection must not take the server down: log it loudly, keep serving.
            log.exception("event=connection_crashed peer=%s listener=%s%s", peer, listener.name, conn.identity())
        finally:
            self.connections.discard(conn)
            if self.capture is not None:
                session.report()  # what the connection read before it ended
                self.capture.connection_closed(observer, conn.close_reason)
            if metrics is not None:
                metrics.close()  # what it counted while open (kproxy_client_info)
            self.stats.client_disconnected(listener.name, node)
            if conn.upstream_addr is not None:
                self.stats.upstream_disconnected(str(conn.upstream_addr), node)

    async def _versions_known(self) -> None:
        """Terminate mode, at accept: the cluster's ApiVersions answers are known (the first upstream
        check may still be under way: it is waited for, within the connect timeout), else
        :class:`UpstreamUnavailable` refuses the client as a dead upstream does."""
        versions = self.cluster_versions
        assert versions is not None
        if not versions.known and not self.health.checked.is_set():
            with trio.move_on_after(self.config.limits.connect_timeout):
                await self.health.checked.wait()
        if not versions.known:
            down = [(t.address, r.reason) for t, r in self.health.results.items() if t.node_id == BOOTSTRAP]
            raise UpstreamUnavailable(down or [(addr, "not checked yet") for addr in self.config.upstream])

    def upstream_login(self, peer: str | None = None) -> UpstreamLogin | None:
        """kproxy's own login for one upstream connection (None without ``sasl.upstream``)."""
        return self.logins.login(peer) if self.logins is not None else None


def _route_resolver(route: BrokerRoute) -> Callable[[], list[HostPort]]:
    # Read at every accept: a broker that moved is followed by new connections.
    return lambda: [route.upstream]


def _sibling_config(config: Config, cluster: Cluster) -> Config:
    """The configuration of the server of one cluster beside the first's: the first's endpoints
    (metrics, admin) and rules and capture are the first server's, shared."""
    return dataclasses.replace(config.cluster_config(cluster), metrics_listen=None, admin=AdminOptions(),
                               rules=None, capture=CaptureOptions())
