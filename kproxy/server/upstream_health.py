"""Upstream health: one cheap periodic check shared by ``/readyz`` and the metrics.

Every ``interval`` seconds each target gets one connect (and the TLS handshake when upstream
TLS is on), within ``connect_timeout``: the configured bootstrap servers, and every broker kproxy
knows a route to. In terminate mode the probe also asks ApiVersions (the answers clients get
before their login, when kproxy has no upstream connection for them yet: kproxy/server/discovery.py).
The result is kept, exported as ``kproxy_upstream_up{upstream, node_id}`` and
read by ``/readyz``, so a readiness probe never opens a connection of its own (a kubelet probing
every few seconds per pod would otherwise add one broker connection per probe), and a broker that
cannot be reached is counted in ``kproxy_upstream_connect_failures_total`` before any client
tries it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import trio

from kproxy.host_port import HostPort
from kproxy.logfmt import q
from kproxy.metrics.stats import BOOTSTRAP_NODE

log = logging.getLogger("kproxy.health")

BOOTSTRAP = BOOTSTRAP_NODE  # the node_id label of a configured bootstrap server, as on every broker-scoped series


@dataclass(frozen=True, slots=True)
class Target:
    address: HostPort
    node_id: str  # a broker's node id, or "bootstrap"


@dataclass(frozen=True, slots=True)
class Result:
    up: bool
    reason: str  # "" when up


Probe = Callable[[Target], Awaitable[None]]  # connects (and closes); raises on failure


class UpstreamHealth:
    """The last check of every target, and the loop that refreshes it.

    ``targets`` is called before every round (brokers come and go). ``probe`` raises on failure;
    its message is the reason kept and shown. ``on_result`` sees every result (the metrics).
    """

    def __init__(self, targets: Callable[[], Iterable[Target]], probe: Probe, *, interval: float,
                 on_result: Callable[[Target, Result], None] | None = None) -> None:
        self.targets = targets
        self.probe = probe
        self.interval = interval
        self.on_result = on_result
        self.results: dict[Target, Result] = {}
        self.checked = trio.Event()  # set after the first round

    async def run(self) -> None:
        """Check every target now, then every ``interval`` seconds, until cancelled."""
        while True:
            await self.check_all()
            await trio.sleep(self.interval)

    async def check_all(self) -> None:
        targets = list(dict.fromkeys(self.targets()))
        async with trio.open_nursery() as nursery:
            for target in targets:
                nursery.start_soon(self._check, target)
        for gone in set(self.results) - set(targets):
            del self.results[gone]
        self.checked.set()

    async def _check(self, target: Target) -> None:
        try:
            await self.probe(target)
            result = Result(True, "")
        except Exception as exc:  # whatever the connect raised is the reason, never a crash of the loop
            result = Result(False, str(exc) or type(exc).__name__)
        before = self.results.get(target)
        self.results[target] = result
        if before is not None and before.up != result.up:
            log.warning("event=upstream_%s upstream=%s node_id=%s%s", "up" if result.up else "down",
                        target.address, target.node_id, "" if result.up else f" reason={q(result.reason)}")
        if self.on_result is not None:
            self.on_result(target, result)

    def not_ready(self) -> str | None:
        """None when a bootstrap server answered the last check; else why not (for ``/readyz``)."""
        if not self.checked.is_set():
            return "upstream not checked yet"
        bootstrap = {t: r for t, r in self.results.items() if t.node_id == BOOTSTRAP}
        if any(r.up for r in bootstrap.values()):
            return None
        return "upstream unavailable: " + "; ".join(f"{t.address}: {r.reason}" for t, r in bootstrap.items())
