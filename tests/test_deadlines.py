"""One task keeps every connection's deadlines (kproxy/server/timers.py): each object is woken at its
latest time asked, a forgotten one never, the heap stays bounded, and a served connection costs the
server its two pumps, no watchdog task of its own."""

from __future__ import annotations

import math
from collections.abc import Callable

import trio
import trio.testing

from kproxy.server.timers import COMPACT_SLACK, Deadlines
from kproxy.testing.proxy_thread import proxy_config, running_server
from tests.support.fakecluster import fake_cluster
from tests.support.kafkaclient import KafkaClient
from tests.test_connection_failures import opaque, wait_until


class Woken:
    """A timed object noting when it was woken; ``then`` (if set) runs in ``on_deadline``."""

    def __init__(self) -> None:
        self.timer_due = math.inf
        self.at: list[float] = []
        self.then: Callable[[float], None] | None = None

    def on_deadline(self, now: float) -> None:
        self.at.append(now)
        if self.then is not None:
            self.then(now)


async def test_each_object_is_woken_at_the_time_it_asked_last(autojump_clock: trio.testing.MockClock) -> None:
    deadlines = Deadlines()
    a, b, c = Woken(), Woken(), Woken()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deadlines.run)
        start = trio.current_time()
        deadlines.schedule(a, start + 10)
        deadlines.schedule(b, start + 5)
        deadlines.schedule(c, start + 30)
        deadlines.schedule(c, start + 2)  # moved earlier: the task, asleep until +5, wakes at +2
        deadlines.schedule(b, start + 20)  # moved later: not woken at +5
        # Asks again once, from its first wake-up.
        b.then = lambda now: deadlines.schedule(b, now + 1) if len(b.at) == 1 else None
        await trio.sleep(15)
        assert [t - start for t in a.at] == [10] and [t - start for t in c.at] == [2] and b.at == []
        await trio.sleep(10)
        assert [t - start for t in b.at] == [20, 21]
        nursery.cancel_scope.cancel()
    assert (a.timer_due, b.timer_due, c.timer_due) == (math.inf, math.inf, math.inf)


async def test_a_forgotten_object_is_never_woken_and_leaves_the_heap(autojump_clock: trio.testing.MockClock
                                                                    ) -> None:
    deadlines = Deadlines()
    gone, kept = Woken(), Woken()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deadlines.run)
        start = trio.current_time()
        deadlines.schedule(gone, start + 1)
        deadlines.schedule(kept, start + 2)
        deadlines.forget(gone)
        await trio.sleep(3)
        assert gone.at == [] and [t - start for t in kept.at] == [2]
        # A thousand objects ending, each with its entry far ahead (a closed connection's idle timeout):
        # none of them is held by the heap until then.
        for _ in range(1000):
            ended = Woken()
            deadlines.schedule(ended, trio.current_time() + 600)
            deadlines.forget(ended)
        assert len(deadlines) <= COMPACT_SLACK + 1
        nursery.cancel_scope.cancel()


def test_moving_one_deadline_again_and_again_keeps_the_heap_bounded() -> None:
    deadlines = Deadlines()
    live = [Woken() for _ in range(10)]
    for i in range(10_000):  # each move leaves an entry behind, which the heap drops in time
        deadlines.schedule(live[i % 10], float(10_000 - i))
    assert len(deadlines) <= 2 * len(live) + COMPACT_SLACK + 1


def _tasks() -> int:
    """Every task of this trio run."""
    count = 0
    todo = [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        count += 1
        todo.extend(child for nursery in task.child_nurseries for child in nursery.child_tasks)
    return count


async def test_a_served_connection_costs_its_two_pumps_and_no_watchdog_task() -> None:
    async with fake_cluster((0,)) as cluster, running_server(proxy_config(cluster.bootstrap)) as server:
        await trio.testing.wait_all_tasks_blocked()
        before = _tasks()
        clients = [await KafkaClient.connect(server.bootstrap_port) for _ in range(20)]
        try:
            for n, client in enumerate(clients):
                await client.send_raw(opaque(n + 1))
            await wait_until(lambda: len(server.connections) == 20)
            await trio.testing.wait_all_tasks_blocked()
            per_connection = (_tasks() - before) / 20
        finally:
            for client in clients:
                await client.aclose()
    # Its handler task and its two pumps, and the fake broker's task of its upstream connection: 4 (there
    # was a fifth, its watchdog).
    assert per_connection <= 4, per_connection
