"""The PLAIN hashes of terminate mode run in threads (kproxy/server/password_checks.py; its queue is
kproxy/sasl/password_queue.py): at most so many at once, one per key shared by its waiters, charged
per address and served in turn, dropped when nobody waits. The work is real work in real threads,
held by a gate the test opens."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import trio

from kproxy.server.password_checks import PasswordChecks, charged_to, client_gone, closed_already


class Gated:
    """Work that records its runs and returns only once the gate is opened (bounded: 10 s)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.ran: list[str] = []
        self._lock = threading.Lock()

    def work(self, name: str, result: bool = False) -> Callable[[], bool]:
        def run() -> bool:
            with self._lock:
                self.ran.append(name)
            assert self.gate.wait(10), "the gate was never opened"
            return result
        return run


async def _until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(10):
        while not condition():
            await trio.sleep(0.005)


async def test_one_hash_per_key_is_shared_by_every_login_that_asks() -> None:
    """100 logins of one user with one password at once: one hash, one result for all."""
    checks, gated = PasswordChecks(), Gated()
    results: list[bool | None] = []

    async def login() -> None:
        results.append(await checks.check("10.0.0.1", b"alice-key", gated.work("alice", True)))

    async with trio.open_nursery() as nursery:
        for _ in range(100):
            nursery.start_soon(login)
        await _until(lambda: checks.running == 1)
        gated.gate.set()
    assert results == [True] * 100 and gated.ran == ["alice"] and checks.runs == 1


async def test_an_address_gets_its_share_and_no_more() -> None:
    checks, gated = PasswordChecks(threads=1, per_address=3), Gated()
    results: dict[str, bool | None] = {}

    async def login(address: str, key: str) -> None:
        results[key] = await checks.check(address, key.encode(), gated.work(key))

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(login, "10.0.0.66", f"guess-{i}")
        await _until(lambda: checks.queued + checks.running == 3)
        await login("10.0.0.66", "guess-3")  # over the share: not checked, answered at once
        assert results["guess-3"] is None and checks.refused == 1
        nursery.start_soon(login, "10.0.0.1", "real")  # another address still gets a place
        await _until(lambda: checks.queued + checks.running == 4)
        gated.gate.set()
    assert results["real"] is False and sorted(gated.ran) == ["guess-0", "guess-1", "guess-2", "real"]


async def test_addresses_are_served_in_turn() -> None:
    """One address queued 10 hashes before another asked for its one: the other's runs after at most
    the one running and the next of the first address's (round robin), not eleventh."""
    checks, gated = PasswordChecks(threads=1, per_address=16), Gated()

    async def login(address: str, key: str) -> None:
        await checks.check(address, key.encode(), gated.work(key))

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(login, "10.0.0.66", f"guess-{i}")
        await _until(lambda: checks.queued + checks.running == 10)
        nursery.start_soon(login, "10.0.0.1", "real")
        await _until(lambda: checks.queued + checks.running == 11)
        gated.gate.set()
    assert gated.ran.index("real") <= 2, gated.ran


async def test_one_address_never_holds_every_thread() -> None:
    """An address flooding with distinct passwords has one hash running: the other thread stays free,
    and the next address's hash starts at once, not after one of the flood's."""
    checks, flood, real = PasswordChecks(threads=2), Gated(), Gated()
    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(checks.check, "10.0.0.66", f"guess-{i}".encode(), flood.work(f"guess-{i}"))
        await _until(lambda: checks.queued + checks.running == 8)
        await trio.sleep(0.05)
        assert checks.running == 1 and len(flood.ran) == 1
        nursery.start_soon(checks.check, "10.0.0.1", b"real", real.work("real"))
        await _until(lambda: real.ran == ["real"])
        real.gate.set()
        flood.gate.set()
    assert len(flood.ran) == 8 and checks.runs == 9


async def test_a_queued_hash_nobody_waits_for_is_dropped() -> None:
    """Clients that left (their waits cancelled) before their hash began cost no hash."""
    checks, gated = PasswordChecks(threads=1), Gated()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checks.check, "10.0.0.1", b"first", gated.work("first"))
        await _until(lambda: checks.running == 1)
        with trio.move_on_after(0.05):
            async with trio.open_nursery() as gone:
                for i in range(5):
                    gone.start_soon(checks.check, "10.0.0.66", f"gone-{i}".encode(), gated.work(f"gone-{i}"))
        assert checks.queued == 0
        gated.gate.set()
    assert gated.ran == ["first"] and checks.runs == 1 and not checks._queue._by_key and not checks._queue._charged


async def test_never_more_threads_than_allowed() -> None:
    checks, gated = PasswordChecks(threads=2), Gated()
    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(checks.check, f"10.0.0.{i}", f"k{i}".encode(), gated.work(f"k{i}"))
        await _until(lambda: checks.queued + checks.running == 6)
        await trio.sleep(0.05)
        assert checks.running == 2 and len(gated.ran) == 2
        gated.gate.set()
    assert checks.runs == 6 and checks.running == checks.queued == 0


@pytest.mark.parametrize(("host", "charged"), [
    ("127.0.0.1", "127.0.0.1"),
    ("::1", "::/64"),
])
async def test_connections_are_charged_to_their_address(host: str, charged: str) -> None:
    listener = (await trio.open_tcp_listeners(0, host=host))[0]
    port = listener.socket.getsockname()[1]
    async with listener, await trio.open_tcp_stream(host, port) as client:
        server = await listener.accept()
        async with server:
            assert charged_to(server, "fallback") == charged
            assert charged_to(client, "fallback") == charged


async def test_a_client_that_left_is_seen_before_and_while_its_hash_waits() -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    async with listener:
        client = await trio.open_tcp_stream("127.0.0.1", port)
        server = await listener.accept()
        async with server:
            assert not closed_already(server)
            await client.send_all(b"login")
            await _until(lambda: closed_already(server) is False)
            with trio.move_on_after(0.05) as waited:
                assert not await client_gone(server)  # bytes to read tell nothing
            assert not waited.cancelled_caught
            await server.receive_some(5)
            async with trio.open_nursery() as nursery:
                gone: list[bool] = []

                async def watch() -> None:
                    gone.append(await client_gone(server))

                nursery.start_soon(watch)
                await trio.sleep(0.05)
                assert not gone
                await client.aclose()
            assert gone == [True] and closed_already(server)
