"""Which PLAIN hash runs next (kproxy/sasl/password_queue.py), driven directly: logins ask, the
queue says what starts, the test says what finished. The same bounds with real threads are
tests/test_password_checks.py's."""

from __future__ import annotations

from kproxy.sasl.password_queue import PasswordCheck, PasswordQueue


def never() -> bool:
    raise AssertionError("the queue never runs work itself")


def started(queue: PasswordQueue) -> list[bytes]:
    """Every check the queue starts now, by key."""
    out: list[bytes] = []
    while (job := queue.next()) is not None:
        out.append(job.key)
    return out


def test_one_check_per_key_shared_by_its_waiters() -> None:
    queue = PasswordQueue()
    jobs = [queue.ask("10.0.0.1", b"alice", never) for _ in range(100)]
    assert all(job is jobs[0] for job in jobs) and jobs[0] is not None and jobs[0].waiters == 100
    assert started(queue) == [b"alice"] and queue.runs == 1
    queue.finished(jobs[0], True)
    assert jobs[0].result is True and queue.running == 0
    again = queue.ask("10.0.0.1", b"alice", never)  # finished: the next login asks afresh
    assert again is not None and again is not jobs[0]


def test_an_address_gets_its_share_and_the_queue_its_bound() -> None:
    queue = PasswordQueue(per_address=3, queued_max=5)
    assert all(queue.ask("10.0.0.66", b"guess-%d" % i, never) is not None for i in range(3))
    assert queue.ask("10.0.0.66", b"guess-3", never) is None and queue.refused == 1
    assert queue.ask("10.0.0.66", b"guess-0", never) is not None  # a key under way is shared, not charged again
    assert queue.ask("10.0.0.1", b"a", never) is not None and queue.ask("10.0.0.2", b"b", never) is not None
    assert queue.ask("10.0.0.3", b"c", never) is None and queue.refused == 2  # five wait: the bound


def test_addresses_are_served_in_turn_one_running_each() -> None:
    queue = PasswordQueue(threads=2)
    for i in range(10):
        queue.ask("10.0.0.66", b"flood-%d" % i, never)
    queue.ask("10.0.0.1", b"real", never)
    first = started(queue)
    assert first == [b"flood-0", b"real"]  # one of the flood's at a time: the other thread is the next address's


def test_one_address_alone_never_holds_every_thread() -> None:
    queue = PasswordQueue(threads=2)
    for i in range(3):
        queue.ask("10.0.0.66", b"flood-%d" % i, never)
    assert started(queue) == [b"flood-0"]  # a thread stays free for the next address that asks
    queue.ask("10.0.0.1", b"real", never)
    assert started(queue) == [b"real"]


def test_round_robin_puts_an_address_back_of_the_line() -> None:
    queue = PasswordQueue(threads=1)
    for address, key in (("a", b"a1"), ("a", b"a2"), ("b", b"b1"), ("b", b"b2"), ("c", b"c1")):
        queue.ask(address, key, never)
    order: list[bytes] = []
    while (job := queue.next()) is not None:
        order.append(job.key)
        queue.finished(job, False)
    assert order == [b"a1", b"b1", b"c1", b"a2", b"b2"]


def test_a_queued_check_nobody_waits_for_is_dropped_a_running_one_finishes() -> None:
    queue = PasswordQueue(threads=1)
    running = queue.ask("10.0.0.1", b"running", never)
    queued = queue.ask("10.0.0.2", b"queued", never)
    assert running is not None and queued is not None and started(queue) == [b"running"]
    queue.left(queued)
    queue.left(running)
    assert queue.queued == 0 and started(queue) == []  # dropped: never runs
    assert queue.running == 1  # still charged until it ends
    queue.finished(running, False)
    assert queue.running == 0 and queue.ask("10.0.0.2", b"queued", never) is not None  # uncharged


def test_a_check_still_awaited_by_another_login_is_kept() -> None:
    queue = PasswordQueue(threads=1)
    queue.ask("10.0.0.1", b"busy", never)
    first = queue.ask("10.0.0.2", b"shared", never)
    second = queue.ask("10.0.0.2", b"shared", never)
    assert isinstance(first, PasswordCheck) and first is second
    queue.left(first)
    assert queue.queued == 2  # one login still waits for it
