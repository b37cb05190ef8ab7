"""One client connection: two pumps around a sans-IO :class:`Session`, executing its commands.

``client -> upstream``: read a chunk, hand it to the session, do what it says
(:mod:`kproxy.proxy.commands`: forward upstream, answer the client, close).
``upstream -> client``: read, hand it over, make sure the brokers the responses
advertise have listeners, write them to the client in order. The session splits
frames and says itself when a chunk passes untouched: the pumps only move bytes.

Resource rules: the connection owns both streams and closes both in one place
(``run``'s ``finally``); either side closing or failing ends the connection,
and in-flight requests get no invented answers (the client retries).

In terminate mode (kproxy answers the client's SASL itself) the connection starts with no upstream
stream: the session asks for one once the client logged in (:class:`~kproxy.proxy.commands.ConnectUpstream`),
and the client pump opens it then (``connect``, the server's), before it reads the client again,
and starts the upstream pump. No address accepting ends the connection, its reason the connect's.
Backpressure is trio's: a slow client blocks the upstream pump's write, which
stops reading the broker. The client pump stops reading once
``max_in_flight`` requests await answers.

Log lines name the client by peer address and, once known, by identity: ``client_id`` (the
first request's header; cut to 256 characters and escaped by :func:`~kproxy.logfmt.q`,
a client chooses it) and ``principal`` (``User:`` and the subject of a verified TLS client
certificate, as Kafka names it: :mod:`kproxy.proxy.principal`, or ``User:`` and the user of a
PLAIN or SCRAM login the broker accepted: :mod:`kproxy.sasl.relay`); each is left out while
unknown. The session keeps the principal (``Session.principal``), which its rule policy reads.

Deadlines: a connection ends after ``idle_timeout`` without traffic either way, or when a
request frame begun ``frame_timeout`` ago is still incomplete while kproxy waits for its bytes
(a client trickling a byte at a time, slowloris, would otherwise never be idle). The pumps only
record times; one task of the server keeps every connection's nearest deadline
(:class:`~kproxy.server.timers.Deadlines`, a connection made alone runs one of its own) and calls
:meth:`Connection.on_deadline` then, which also calls the session back at the times it asks for
(:class:`~kproxy.proxy.commands.WakeAt`: in a task of the connection's, started for that wake-up).

Upstream writes keep the order the session returned them in (its ordering contract,
:mod:`kproxy.proxy.commands`): with kproxy's own upstream login, the session also sends from the
upstream pump and the watchdog (the login's requests, the client's requests it held), so each
command list that writes upstream takes a turn, in the order the lists were returned, before any
await; without a login only the client pump writes upstream and no turn is taken.

Byte-level toxics (:mod:`kproxy.toxics`: a rule's bandwidth, slicer, limit_data, delay at
wire) are taken from the session after each client chunk, before its commands run, and installed
on their direction: that direction's writers become a :class:`~kproxy.server.toxic_writer.ToxicWriter`'s
until no toxic of it is in force. A connection with none pays one attribute check per client chunk.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Final, assert_never

import trio

from kproxy.config import Limits
from kproxy.host_port import HostPort
from kproxy.logfmt import clip
from kproxy.logfmt import q as _q
from kproxy.proxy.addresses import BrokerRoute
from kproxy.proxy.commands import (
    CloseConnection,
    Command,
    ConnectUpstream,
    ForwardUpstream,
    RejectReason,
    SendToClient,
    VerifyCredentials,
    WakeAt,
)
from kproxy.proxy.principal import tls_principal
from kproxy.proxy.session import Session
from kproxy.server.fastio import Reader, VectorWriter, Writer, reader, vector_writer, writer
from kproxy.server.password_checks import PasswordChecks, charged_to, client_gone, closed_already
from kproxy.server.timers import Deadlines
from kproxy.server.toxic_writer import ToxicWriter
from kproxy.server.upstream import UpstreamUnavailable
from kproxy.toxics import Direction, Installed, WireOrder, WireShaper

log = logging.getLogger("kproxy.connection")

EnsureListeners = Callable[[Sequence[BrokerRoute]], Awaitable[None]]
# Opens the upstream connection on the session's ConnectUpstream (raises UpstreamUnavailable).
UpstreamOpener = Callable[[], Awaitable[tuple[trio.abc.Stream, HostPort]]]
# Request frames of one client chunk taken in one turn of the loop (Connection._forward): a turn
# spent on a client pipelining tiny requests stays short for every other connection.
TURN_FRAMES: Final = 128
_NO_FRAME: Final = math.inf  # _frame_due when no partial request frame is buffered
# How long a login kproxy did not check (its address over its share of password hashes) waits for its
# refusal: about what a check under load takes, so a flood's refused connections cannot churn.
UNCHECKED_REFUSAL_DELAY: Final = 1.0
# The pumps' task names, given explicitly: trio names a task after its function's __qualname__,
# which a function compiled by mypyc does not have (its tasks would all be "None.None" in the
# compiled build, in the loop watchdog's lines and to anyone instrumenting the loop).
CLIENT_PUMP: Final = "kproxy.server.connection.Connection._client_to_upstream"
UPSTREAM_PUMP: Final = "kproxy.server.connection.Connection._upstream_to_client"


@dataclass
class ConnectionStats:
    bytes_from_client: int = 0
    bytes_to_client: int = 0


class Connection:
    """A client connection bridged to one upstream broker connection (``upstream`` None: none
    yet, ``connect`` opens it when the session asks: module docstring)."""

    def __init__(self, client: trio.abc.Stream, upstream: trio.abc.Stream | None, session: Session, *,
                 limits: Limits, ensure_listeners: EnsureListeners, peer: str, listener: str,
                 upstream_addr: HostPort | None, on_reject: Callable[[str], None] | None = None,
                 deadlines: Deadlines | None = None, connect: UpstreamOpener | None = None,
                 listening: AbstractSet[int] = frozenset(), password_checks: PasswordChecks | None = None) -> None:
        self.client = client
        self.upstream = upstream
        self.connect = connect
        self.session = session
        self.limits = limits
        self.ensure_listeners = ensure_listeners
        # Local ports whose listeners are open (or failed for good): ensure_listeners would return at
        # once for routes to them, so they are checked here, without awaiting that interpreted coroutine.
        self.listening = listening
        self.peer = peer
        self.listener = listener
        self.upstream_addr = upstream_addr
        self.on_reject = on_reject
        # The server's hashes of PLAIN passwords (terminate mode), shared by its connections.
        self.password_checks = password_checks
        self._verifying = False  # a password's hash is awaited: the login's deadline runs meanwhile
        principal = tls_principal(_peer_certificate(client))  # the handshake is done: known now or never
        if principal is not None:
            session.principal = principal
        self._client_writer = writer(client)
        self._client_writev = vector_writer(client)  # commands with ``more``: several big frames
        self._client_reader = reader(client)
        self._upstream_writer: Writer = _not_connected
        self._upstream_writev: VectorWriter = _not_connected
        self._upstream_reader: Reader = _not_connected
        if upstream is not None:
            self._use_upstream(upstream)
        self.stats = ConnectionStats()
        self._client_lock = trio.Lock()
        self._room = trio.Event()  # set when in-flight room frees up
        self._reading_client = trio.CancelScope()
        self._waiting_for_client = False  # True only while the client pump may be cancelled harmlessly
        self._idle = trio.CancelScope()
        self._last_activity = 0.0
        # The run's clock, bound once: trio.current_time() is three interpreted calls deep, per chunk.
        self._now = trio.lowlevel.current_clock().current_time
        self._frame_due = _NO_FRAME  # when the client's partial request frame must be whole
        self._frame_at = -1  # where in the client's stream that frame begins
        self._wake_due = math.inf  # when the session asked to be called back (trio clock)
        # The server's one task for every connection's deadlines, or one of this connection's own.
        self._own_deadlines = deadlines is None
        self._deadlines = Deadlines() if deadlines is None else deadlines
        self.timer_due = math.inf  # when the deadlines' task calls on_deadline next (kproxy.server.timers)
        self.draining = False
        self.close_reason = "client closed"
        self._nursery: trio.Nursery | None = None
        self._toxic_writers: dict[Direction, ToxicWriter] = {}  # made on a direction's first toxic
        self._toxics: dict[tuple[object, Direction], Installed] = {}  # by order key and direction
        self._toxics_later: list[WireOrder] = []  # asked for upstream before there was an upstream
        # Upstream write turns (module docstring): the next to hand out, the one whose turn it is.
        self._ordered = session.login is not None
        self._turns = 0
        self._turn = 0
        self._turn_passed = trio.Event()

    def drain(self) -> None:
        """Stop reading new requests; the connection closes once in-flight ones are answered."""
        self.draining = True
        if self._waiting_for_client:
            # Parked in receive or waiting for room: nothing half done, cancel the wait. Otherwise
            # the pump is forwarding a chunk it read, finishes it, and sees `draining` after.
            self._reading_client.cancel()
        if not self.session.in_flight_count:
            if self.close_reason == "client closed":  # (not one the session gave, a refused login's)
                self.close_reason = "shutdown"
            self._idle.cancel()

    async def run(self) -> None:
        started = time.monotonic()
        try:
            with self._idle:
                self._touch()
                first_due = self._last_activity + self.limits.idle_timeout
                if self.session.partial_request_at is not None:
                    # Terminate mode: the client's login has one frame's deadline from the start, so a
                    # client that never sends a byte is closed by it too, not only by the idle timeout.
                    self._frame_at, self._frame_due = 0, self._last_activity + self.limits.frame_timeout
                    first_due = min(first_due, self._frame_due)
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._client_to_upstream, nursery.cancel_scope, name=CLIENT_PUMP)
                    if self.upstream is not None:
                        nursery.start_soon(self._upstream_to_client, nursery.cancel_scope, name=UPSTREAM_PUMP)
                    if self._own_deadlines:
                        nursery.start_soon(self._deadlines.run)
                    self._deadlines.schedule(self, first_due)
            if self._idle.cancelled_caught and not self.draining and self.close_reason == "client closed":
                self.close_reason = "idle timeout"
        finally:
            self._deadlines.forget(self)
            try:
                delay = self.session.close_delay_s()
                if delay:  # a rule's slow close: both ends learn of the close that much late
                    await trio.sleep(delay)
            finally:
                with trio.CancelScope(shield=True):  # closed even when a shutdown cancels the delay
                    await _close(self.client)
                    if self.upstream is not None:
                        await _close(self.upstream)
            log.info(
                "event=connection_closed peer=%s listener=%s upstream=%s%s bytes_in=%d bytes_out=%d "
                "requests=%d responses=%d in_flight=%d duration_s=%.3f reason=%s",
                self.peer, self.listener, self.upstream_addr or "-", self.identity(), self.stats.bytes_from_client,
                self.stats.bytes_to_client, self.session.requests, self.session.responses,
                self.session.in_flight_count, time.monotonic() - started, _q(self.close_reason))

    @property
    def principal(self) -> str | None:
        """The connection's principal (``User:...``; None while unknown): the session's."""
        return self.session.principal

    def identity(self) -> str:
        """`` client_id=... principal=...`` for a log line about this connection: each pair only
        once known (the client id after the first request), "" while neither is."""
        out = ""
        client_id = self.session.client_id
        if client_id is not None:
            out = " client_id=" + _q(clip(client_id))
        principal = self.session.principal
        if principal is not None:
            out += " principal=" + _q(clip(principal))
        return out

    def _touch(self) -> None:
        # One float per chunk; moving a cancel scope's deadline on every chunk costs far more.
        self._last_activity = self._now()

    def on_deadline(self, now: float) -> None:
        """The deadlines' task, at the time this connection asked (:class:`~kproxy.server.timers.Deadlines`):
        ends the connection once neither side moved for ``idle_timeout`` seconds, or once a
        request frame is not whole ``frame_timeout`` seconds after its first byte; calls the
        session back when it asked to be (in a task of its own: that may write to the client);
        then asks for the next of these times. Never blocks.

        The frame deadline runs only while kproxy waits on the client: when kproxy itself held
        off reading (``max_in_flight`` reached, a slow broker, draining), the client gets a
        fresh ``frame_timeout`` from the moment this notices.
        """
        limits = self.limits
        idle_due = self._last_activity + limits.idle_timeout
        if now >= idle_due:
            self._idle.cancel()
            return
        frame_due = self._frame_due
        if now >= frame_due:
            # A login's password waiting for its hash is the client's time too: the deadline holds
            # while it waits (a flood of logins must not keep connections past it).
            if self._verifying or (self._waiting_for_client and self.session.can_accept and not self.draining):
                what = "SASL login" if self.session.logging_in else "request frame"
                self.close_reason = f"{what} not complete within frame_timeout {limits.frame_timeout:g} s"
                if self.on_reject is not None:
                    self.on_reject(RejectReason.REQUEST_TIMEOUT.value)
                self._idle.cancel()
                return
            frame_due = self._frame_due = now + limits.frame_timeout
        if now >= self._wake_due and self._nursery is not None:
            self._wake_due = math.inf
            try:
                self._nursery.start_soon(self._on_wake)
            except RuntimeError:
                # The connection's tasks have all ended (trio closes the nursery when its last task
                # exits, then resumes run(), whose finally forgets this connection: the deadlines'
                # task can run in between). Nothing is left to wake; raising here would end that
                # task, the server's, and every connection with it.
                return
        self._deadlines.schedule(self, min(idle_due, frame_due, self._wake_due))

    async def _on_wake(self) -> None:
        """The time the session asked for has come: do what ``on_timer`` says (held responses released)."""
        session = self.session
        if not await self._execute(session.on_timer(session.clock()), self._idle):
            return
        session.report()
        if session.can_accept:
            self._room.set()  # held responses released: room for the client pump

    def _frame_begun(self) -> None:
        """A chunk left part of a new request frame buffered: its deadline starts now. Moves the
        connection's next deadline only when it is later (once per frame at most, and not at
        all while frames keep arriving within ``frame_timeout`` of each other)."""
        due = self._frame_due = self._last_activity + self.limits.frame_timeout
        if due < self.timer_due:
            self._deadlines.schedule(self, due)

    def _end(self, scope: trio.CancelScope, reason: str) -> None:
        if self.close_reason == "client closed" or reason != "client closed":
            self.close_reason = reason
        scope.cancel()

    async def _client_to_upstream(self, scope: trio.CancelScope) -> None:
        session = self.session
        late: bytes | bytearray = b""
        try:
            with self._reading_client:
                while not self.draining:
                    # drain() cancels only these waits: a chunk once read is forwarded whole (a request
                    # tracked but never sent would hold the connection open until the grace ran out).
                    self._waiting_for_client = True
                    while not session.can_accept:
                        self._room = trio.Event()
                        await self._room.wait()
                    data = await self._client_reader(self.limits.read_size)
                    self._waiting_for_client = False
                    if not data:
                        self._end(scope, "client closed")
                        return
                    if self._reading_client.cancel_called:
                        late = data  # drain() landed after this read: forward it outside the cancelled scope
                        break
                    if not await self._forward(data, scope):
                        return
            if late and not await self._forward(late, scope):
                return
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._end(scope, f"stream error: {exc!r}")
            return
        # Draining: no new requests. Wait for answers, then close.
        if self.draining and not session.in_flight_count:
            self._end(scope, "shutdown")

    async def _forward(self, data: bytes | bytearray, scope: trio.CancelScope) -> bool:
        """Take one chunk from the client and do what the session says; False once it closed.

        The session takes at most TURN_FRAMES of the chunk's requests at a time; the others are
        taken after a pass through the scheduler (a client pipelining thousands of tiny requests,
        and their rules' work, does not hold every other connection for a whole read's worth)."""
        session = self.session
        read_at = session.clock()
        self._touch()
        self.stats.bytes_from_client += len(data)
        commands = session.receive_client(data, read_at, TURN_FRAMES)
        while True:
            if session.wire_orders:
                self._install(session.wire_orders)
            begun = session.partial_request_at
            if begun is None:
                if self._frame_due != _NO_FRAME:
                    self._frame_due = _NO_FRAME
            elif begun != self._frame_at or self._frame_due == _NO_FRAME:
                self._frame_at = begun
                self._frame_begun()
            if commands and not await self._execute(commands, scope):
                return False
            session.report()  # metrics, once the bytes are on their way
            if not session.more_client:
                return True
            await trio.lowlevel.checkpoint()
            commands = session.receive_client_more(TURN_FRAMES)

    async def _upstream_to_client(self, scope: trio.CancelScope) -> None:
        session = self.session
        try:
            while True:
                data = await self._upstream_reader(self.limits.read_size)
                if not data:
                    self._end(scope, "upstream closed" + (" with requests in flight" if session.in_flight_count
                                                          else ""))
                    return
                self._touch()
                commands = session.receive_upstream(data, TURN_FRAMES)  # as the client's chunks (_forward)
                while True:
                    if session.wire_orders:  # verdicts on client requests a login held, taken now
                        self._install(session.wire_orders)
                    if commands and not await self._execute(commands, scope):
                        return
                    session.report()
                    if not session.more_upstream:
                        break
                    await trio.lowlevel.checkpoint()
                    commands = session.receive_upstream_more(TURN_FRAMES)
                if session.can_accept:
                    self._room.set()
                if self.draining and not session.in_flight_count:
                    self._end(scope, "shutdown")
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._end(scope, f"stream error: {exc!r}")

    async def _execute(self, commands: list[Command], scope: trio.CancelScope) -> bool:
        """Do what the session asked, in order; False when it asked to close (``scope`` is cancelled)."""
        turn = self._take_turn(commands) if self._ordered else -1  # before any await: the session's order
        last = commands[-1] if commands else None
        if isinstance(last, CloseConnection) and last.linger:
            # Its reason is the connection's from now on: the client may close while what comes first is
            # written (a refused login's answer), and that close must not hide why.
            self.close_reason = last.reason
        try:
            for command in commands:
                # The one dispatch of commands: a class pattern per kind, which mypy narrows (and checks
                # for exhaustiveness below) and mypyc compiles to a type check.
                match command:
                    case SendToClient():
                        await self._send(command)
                    case ForwardUpstream():
                        if turn != self._turn and turn >= 0:
                            await self._wait_turn(turn)
                        if command.more:
                            await self._upstream_writev((command.data, *command.more))
                        else:
                            await self._upstream_writer(command.data)
                    case WakeAt():
                        self._wake_at(command.when)
                    case VerifyCredentials():
                        gone, checked = await self._verify(command)
                        if gone:
                            self._end(scope, "client closed")
                            return False
                        if not await self._execute(self.session.verified(checked), scope):
                            return False
                    case ConnectUpstream():
                        if not await self._open_upstream(scope):
                            return False
                    case CloseConnection():
                        if command.reject is not None and self.on_reject is not None:
                            self.on_reject(command.reject.value)
                        if command.abort:
                            _linger_zero(self.client)
                        if command.linger:
                            await trio.sleep(command.linger)
                        self._end(scope, command.reason)
                        return False
                    case _:
                        assert_never(command)
            return True
        finally:
            if turn >= 0:
                self._pass_turn(turn)

    async def _verify(self, command: VerifyCredentials) -> tuple[bool, bool | None]:
        """The session's VerifyCredentials: the password's hash, queued with every connection's
        (kproxy/server/password_checks.py). Whether the client closed meanwhile (its queued hash
        is dropped then), and the result (None: not checked, too many under way from the client's
        address; given :data:`UNCHECKED_REFUSAL_DELAY` later). The login's deadline holds meanwhile
        (:meth:`on_deadline`)."""
        if closed_already(self.client):
            return True, None  # sent its login and left: no hash for it
        checks = self.password_checks
        if checks is None:
            checks = self.password_checks = PasswordChecks()
        result: list[bool | None] = []  # the check's, once it came
        self._verifying = True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._check, checks, command, result, nursery.cancel_scope)
                nursery.start_soon(self._watch_close, nursery.cancel_scope)
        finally:
            self._verifying = False
        return not result, result[0] if result else None

    async def _check(self, checks: PasswordChecks, command: VerifyCredentials, result: list[bool | None],
                     scope: trio.CancelScope) -> None:
        """:meth:`_verify`'s wait for the hash: its result into ``result``, then ``scope`` ends."""
        checked = await checks.check(charged_to(self.client, self.peer), command.key, command.work)
        if checked is None:
            # Not checked (over the address's share): answered no sooner than a hash would be, so
            # that a flood's refused connections do not come back at once.
            await trio.sleep(UNCHECKED_REFUSAL_DELAY)
        result.append(checked)
        scope.cancel()

    async def _watch_close(self, scope: trio.CancelScope) -> None:
        """:meth:`_verify`'s watch on the client: ``scope`` ends when it closed."""
        if await client_gone(self.client):
            scope.cancel()

    async def _open_upstream(self, scope: trio.CancelScope) -> bool:
        """The session's ConnectUpstream: open the upstream connection, start its pump, then execute
        what the session sends first; False when no address accepted (the connection ends)."""
        assert self.connect is not None and self.upstream is None and self._nursery is not None
        try:
            upstream, self.upstream_addr = await self.connect()
        except UpstreamUnavailable as exc:
            self._end(scope, str(exc))
            return False
        self._use_upstream(upstream)
        self._nursery.start_soon(self._upstream_to_client, scope, name=UPSTREAM_PUMP)
        if self._toxics_later:
            self._install(self._toxics_later)
        log.debug("event=upstream_connected peer=%s listener=%s upstream=%s%s", self.peer, self.listener,
                  self.upstream_addr, self.identity())
        return await self._execute(self.session.upstream_connected(), scope)

    def _use_upstream(self, upstream: trio.abc.Stream) -> None:
        self.upstream = upstream
        self._upstream_writer, self._upstream_writev = writer(upstream), vector_writer(upstream)
        self._upstream_reader = reader(upstream)

    def _take_turn(self, commands: list[Command]) -> int:
        """The upstream turn of a command list that writes upstream (-1: it writes nothing)."""
        for command in commands:
            if isinstance(command, ForwardUpstream):
                self._turns += 1
                return self._turns - 1
        return -1

    async def _wait_turn(self, turn: int) -> None:
        while self._turn != turn:
            await self._turn_passed.wait()

    def _pass_turn(self, turn: int) -> None:
        self._turn = turn + 1
        passed, self._turn_passed = self._turn_passed, trio.Event()
        passed.set()

    async def _send(self, command: SendToClient) -> None:
        """Write responses to the client once the brokers they name have listeners."""
        # Both pumps (and the timer) may have answers to send, and order is the contract: the session
        # puts a SendToClient first in its list, so the lock is claimed in the order the session let
        # answers go. Uncontended (the usual case), it is taken without a trip through the scheduler.
        try:
            self._client_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._client_lock.acquire()
        try:
            routes = command.routes
            if routes:
                listening = self.listening
                for route in routes:
                    if route.local_port not in listening:
                        await self.ensure_listeners(routes)
                        break
            if command.more:
                await self._client_writev((command.data, *command.more))
                self.stats.bytes_to_client += sum(map(len, command.more))
            else:
                await self._client_writer(command.data)
            self.stats.bytes_to_client += len(command.data)
        finally:
            self._client_lock.release()

    def _install(self, orders: list[WireOrder]) -> None:
        """Install the byte-level toxics the session's verdicts asked for (each once: an order
        already installed and in force is skipped), then empty ``orders``."""
        assert self._nursery is not None
        for order in orders:
            for direction in (Direction.UPSTREAM, Direction.DOWNSTREAM):
                if not (order.direction.upstream if direction is Direction.UPSTREAM else order.direction.downstream):
                    continue
                if direction is Direction.UPSTREAM and self.upstream is None:
                    self._toxics_later.append(order)  # installed once the upstream connection is open
                    continue
                name = (order.key, direction)
                installed = self._toxics.get(name)
                if installed is not None and not installed.ended:
                    continue
                if not order.owner.in_force():  # asked by a request decided under rules since replaced
                    continue
                toxic_writer = self._toxic_writers.get(direction)
                if toxic_writer is None:
                    toxic_writer = self._toxic_writers[direction] = self._toxic_writer(direction)
                rng = random.Random(f"{order.seed}\x1f{self.session.client_id}\x1f{direction.value}")
                self._toxics[name] = toxic_writer.install(order.owner, order.toxic, rng, self._nursery)
                if direction is Direction.UPSTREAM:
                    self._upstream_writer = toxic_writer.write
                    self._upstream_writev = toxic_writer.writev
                else:
                    self._client_writer = toxic_writer.write
                    self._client_writev = toxic_writer.writev
        orders.clear()

    def _toxic_writer(self, direction: Direction) -> ToxicWriter:
        """The writer of ``direction`` through its toxics, which gives it back its plain writers once
        none is in force, and ends the connection when a limit is reached."""
        stream = self.upstream if direction is Direction.UPSTREAM else self.client
        assert stream is not None

        def restore() -> None:
            if direction is Direction.UPSTREAM:
                self._upstream_writer, self._upstream_writev = writer(stream), vector_writer(stream)
            else:
                self._client_writer, self._client_writev = writer(stream), vector_writer(stream)

        def end(reason: str) -> None:
            assert self._nursery is not None
            _half_close(stream)
            self._end(self._nursery.cancel_scope, reason)

        return ToxicWriter(WireShaper(direction), writer(stream), restore, end, self._touch)

    def _wake_at(self, when: float) -> None:
        """Arrange the session's ``on_timer`` near ``when`` (on the session's clock)."""
        due = trio.current_time() + (when - self.session.clock())
        if due < self._wake_due:
            self._wake_due = due
            if due < self.timer_due:
                self._deadlines.schedule(self, due)


async def _not_connected(_: object) -> Any:
    """The upstream stream's reader and writers before it is open (terminate mode): never called, as
    the session writes nothing upstream before its ConnectUpstream."""
    raise trio.ClosedResourceError("no upstream connection yet")


def _peer_certificate(stream: trio.abc.Stream) -> dict[str, Any] | None:
    """The verified certificate a TLS client presented (:meth:`ssl.SSLSocket.getpeercert`), else None."""
    if not isinstance(stream, trio.SSLStream):
        return None
    try:
        cert: dict[str, Any] | None = stream.getpeercert()
    except (ValueError, AttributeError):  # no handshake done
        return None
    return cert


def _half_close(stream: trio.abc.Stream) -> None:
    """A limit's cut: a FIN after the last byte let through, and what the peer sent and kproxy will
    not read taken off the socket, so that the close that follows does not turn into a RST (the
    kernel resets a connection closed with unread bytes, and a reset can cost the peer the bytes it
    had not read yet). TLS streams are left to the close."""
    if type(stream) is not trio.SocketStream:
        return
    try:
        stream.socket.shutdown(socket.SHUT_WR)
        # trio's socket reads are awaited: a duplicate of the descriptor reads without blocking.
        with socket.socket(fileno=os.dup(stream.socket.fileno())) as raw:
            for _ in range(64):  # bounded: at most 4 MiB discarded
                if not raw.recv(65536, socket.MSG_DONTWAIT):
                    break
    except OSError:  # BlockingIOError: nothing (more) unread
        pass


def _linger_zero(stream: trio.abc.Stream) -> None:
    """Make closing ``stream`` send a TCP RST (SO_LINGER on, timeout 0): a reset_connection rule."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if isinstance(stream, trio.SocketStream):
        try:
            stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            log.debug("event=linger_failed", exc_info=True)


async def _close(stream: trio.abc.Stream) -> None:
    """Close ``stream`` whatever the connection's cancellation state; never raises.

    A plain socket closes at once: ``SocketStream.aclose`` is ``socket.close()`` and a checkpoint,
    and ``aclose_forcefully`` adds a cancel scope and a Cancelled raised through it, for every
    stream of every connection. TLS streams go through ``aclose_forcefully`` (no close_notify
    exchange to wait on), shielded from the connection's own cancellation.
    """
    if type(stream) is trio.SocketStream:
        try:
            stream.socket.close()
        except OSError:
            log.debug("event=close_failed", exc_info=True)
        return
    with trio.CancelScope(shield=True):
        try:
            await trio.aclose_forcefully(stream)
        except Exception:
            log.debug("event=close_failed", exc_info=True)
