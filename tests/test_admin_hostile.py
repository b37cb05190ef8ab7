"""The admin API against hostile and hurried callers (issue 19, defects 2, 3 and 4).

A real kproxy (in process, so that its event-loop watchdog can be read) in front of the real Tansu
broker, a well-behaved client (confluent-kafka, acks=all) producing throughout. Whatever an admin
client sends: kproxy lives on, its loop is never held over 100 ms (tests/support/loopwatch.py), the
well-behaved client is not disturbed, and every answer says what happened. The descriptor scenario,
which needs a lowered RLIMIT_NOFILE, runs kproxy as its own process: test_admin_descriptors.py.
"""

from __future__ import annotations

import contextlib
import gc
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kproxy.testing import Broker, ProxyThread, free_port, running_proxy
from tests.support.e2e import create_topic, unique
from tests.support.loopwatch import BLOCKED, loop_held_max, reset_loop_lag
from tests.support.resilience import assert_unaffected, closed_by_peer, steady_producer, vm_rss_kb, wait_for

RULE_COUNT = 10_000


@pytest.fixture
def topic(tansu: Broker) -> str:
    name = unique("admin-hostile")
    create_topic(tansu.bootstrap, name, partitions=1)
    return name


def admin_port(proxy: ProxyThread) -> int:
    assert proxy.server is not None and proxy.server.admin_server is not None
    return proxy.server.admin_server.port


def call(proxy: ProxyThread, method: str, path: str, body: bytes | None = None, timeout: float = 300,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One admin request; (status, body). http.client raises if the answer is empty or cut."""
    conn = http.client.HTTPConnection("127.0.0.1", admin_port(proxy), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"content-type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def rule_file(n: int) -> bytes:
    """A rule file of ``n`` rules, as JSON, that no client of these tests meets (~1 MiB for 10,000)."""
    rules = [{"id": f"r{i:05}", "match": {"api": "metadata", "client_id": f"nobody-{i}"},
              "actions": [{"delay": {"ms": 1}}]} for i in range(n)]
    return json.dumps({"seed": 1, "rules": rules}, separators=(",", ":")).encode()


# -- defect 2: one request ended the process ---------------------------------------------------
HOSTILE_BODIES = {
    "100,000 nested arrays": ("PUT", "/rules", b"[" * 100_000 + b"]" * 100_000),
    "a 5,001-digit number": ("PUT", "/rules", b'{"seed": ' + b"7" * 5001 + b', "rules": []}'),
    "900 levels deep": ("POST", "/rules", b'{"id": "deep", "match": {}, "actions": [{"delay": {"ms": '
                        + b"[" * 900 + b"1" + b"]" * 900 + b"}}]}"),
    "a 5,001-digit float": ("PATCH", "/rules/x", b'{"enabled": 1.' + b"5" * 5000 + b"}"),
    "NaN": ("PUT", "/rules", b'{"seed": NaN, "rules": []}'),
    "250,000 empty arrays": ("PUT", "/rules", b"[" + b"[]," * 250_000 + b"[]]"),
    "a string never closed": ("POST", "/rules", b'{"id": "' + b'\\"' * 400_000),
}


def test_hostile_json_gets_400_and_kproxy_lives_on(tansu: Broker, topic: str) -> None:
    with running_proxy(tansu.bootstrap, admin__listen="127.0.0.1:0") as proxy, \
            steady_producer(proxy.bootstrap, topic) as steady:
        wait_for(lambda: steady.delivered > 0, 15, "the steady producer's first delivery")
        reset_loop_lag(proxy)
        rss_before = vm_rss_kb(os.getpid())
        answers: dict[str, tuple[int, Any]] = {}
        for name, (method, path, body) in HOSTILE_BODIES.items():
            try:
                status, data = call(proxy, method, path, body, timeout=30)
            except (OSError, http.client.HTTPException) as exc:
                raise AssertionError(f"{name}: no answer ({exc!r}); kproxy alive: {proxy.server is not None}") from exc
            answers[name] = (status, json.loads(data))
        lag = loop_held_max(proxy)
        rss_grown = vm_rss_kb(os.getpid()) - rss_before
        assert call(proxy, "GET", "/healthz") == (200, b'{\n "status": "ok"\n}\n')
        status, data = call(proxy, "GET", "/rules")
        assert status == 200 and json.loads(data)["rules"] == [], "nothing was put in force"
        time.sleep(0.5)
    for name, (status, payload) in answers.items():
        assert status == 400, f"{name}: {status} {payload}"
        assert payload["errors"][0]["path"] == "(body)", f"{name}: {payload}"
    reasons = {name: payload["errors"][0]["reason"] for name, (_, payload) in answers.items()}
    assert reasons["100,000 nested arrays"] == reasons["900 levels deep"] == "nested deeper than 32 levels"
    assert reasons["a 5,001-digit number"].startswith("a number of 5001 characters")
    assert reasons["NaN"].startswith("NaN is not JSON")
    assert reasons["250,000 empty arrays"] == "more than 100000 arrays and objects"
    assert reasons["a string never closed"].startswith("not JSON: Unterminated string")
    assert_unaffected(steady)
    print(f"hostile JSON: {len(answers)} bodies refused with 400, worst loop lag {lag * 1000:.0f} ms, "
          f"test process RSS {rss_grown:+d} KiB")
    assert lag < BLOCKED, f"the loop was held {lag * 1000:.0f} ms"
    assert rss_grown < 200 * 1024


# -- defect 3: big edits and listings stalled every connection ---------------------------------
def test_a_put_of_10000_rules_and_their_listing_never_hold_the_loop(tansu: Broker, topic: str) -> None:
    """The PUT is answered with what went in force (never an empty 200), however long it takes; the
    listing is linear in rules + hit series; neither holds the loop over 100 ms."""
    body = rule_file(RULE_COUNT)
    assert len(body) <= 1024 * 1024
    with running_proxy(tansu.bootstrap, admin__listen="127.0.0.1:0") as proxy, \
            steady_producer(proxy.bootstrap, topic) as steady:
        wait_for(lambda: steady.delivered > 0, 15, "the steady producer's first delivery")
        generation = json.loads(call(proxy, "GET", "/rules")[1])["generation"]
        rss_before = vm_rss_kb(os.getpid())
        # As `kproxy run` does once started (kproxy.memory.freeze_start_up): the heap of this
        # process (pytest, the clients, earlier tests) is not kproxy's, and a full collection walking
        # it on the loop thread would be measured as the PUT's.
        gc.collect()  # (holds the loop thread too: its late heartbeat must land before the reset)
        gc.freeze()
        time.sleep(0.3)
        reset_loop_lag(proxy)
        started = time.monotonic()
        status, data = call(proxy, "PUT", "/rules", body)
        put_took = time.monotonic() - started
        put_lag = loop_held_max(proxy)
        assert status == 200, data[:300]
        listing = json.loads(data)
        assert listing["generation"] == generation + 1 and listing["diverged"] is True
        assert [r["id"] for r in listing["rules"]] == [f"r{i:05}" for i in range(RULE_COUNT)]
        reset_loop_lag(proxy)
        started = time.monotonic()
        status, data = call(proxy, "GET", "/rules")
        get_took = time.monotonic() - started
        get_lag = loop_held_max(proxy)
        assert status == 200 and len(json.loads(data)["rules"]) == RULE_COUNT
        assert proxy.call(lambda: len(proxy.server.stats.faults.hits)) >= RULE_COUNT  # type: ignore[union-attr]
        rss_grown = vm_rss_kb(os.getpid()) - rss_before
        gc.unfreeze()
        time.sleep(0.5)
    assert_unaffected(steady)
    print(f"PUT of {RULE_COUNT} rules ({len(body)} bytes): answered in {put_took:.1f} s, worst loop lag "
          f"{put_lag * 1000:.0f} ms; GET of them: {get_took:.1f} s, worst loop lag {get_lag * 1000:.0f} ms; "
          f"test process RSS {rss_grown:+d} KiB")
    assert rss_grown < 512 * 1024, "10,000 rules, their listing and its JSON in this process"
    assert put_lag < BLOCKED, f"the PUT held the loop {put_lag * 1000:.0f} ms"
    assert get_lag < BLOCKED, f"the listing held the loop {get_lag * 1000:.0f} ms"


def test_concurrent_edits_are_all_kept_each_in_a_generation_of_its_own() -> None:
    """Edits sent at once queue on one lock: none is lost, each goes in force as its own generation."""
    with running_proxy(f"127.0.0.1:{free_port()}", admin__listen="127.0.0.1:0") as proxy:
        answers: list[tuple[int, Any]] = []
        lock = threading.Lock()

        def post(i: int) -> None:
            rule = {"id": f"c{i}", "match": {"api": "metadata", "client_id": f"nobody-{i}"},
                    "actions": [{"delay": {"ms": 1}}]}
            status, data = call(proxy, "POST", "/rules", json.dumps(rule).encode(), timeout=60)
            with lock:
                answers.append((status, json.loads(data)))

        threads = [threading.Thread(target=post, args=(i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        listing = json.loads(call(proxy, "GET", "/rules")[1])
    assert sorted(status for status, _ in answers) == [201] * 16
    generations = sorted(payload["generation"] for _, payload in answers)
    assert generations == list(range(generations[0], generations[0] + 16)), "two edits shared a generation"
    assert sorted(r["id"] for r in listing["rules"]) == sorted(f"c{i}" for i in range(16)), "an edit was lost"


# -- defect 4: the token is checked as soon as the head is in ----------------------------------
@contextlib.contextmanager
def admin_socket(proxy: ProxyThread) -> Iterator[socket.socket]:
    sock = socket.create_connection(("127.0.0.1", admin_port(proxy)), timeout=10)
    try:
        yield sock
    finally:
        sock.close()


def test_without_the_token_the_answer_is_401_before_any_body_is_read() -> None:
    with running_proxy(f"127.0.0.1:{free_port()}", admin__listen="127.0.0.1:0", admin__token="s3cret") as proxy, \
            admin_socket(proxy) as sock:
        started = time.monotonic()
        sock.sendall(b"PUT /rules HTTP/1.1\r\nHost: kproxy\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000\r\n\r\n{\"rules\": [")  # the rest of the body never comes
        closed, got = closed_by_peer(sock, timeout=5)
        took = time.monotonic() - started
    assert got.startswith(b"HTTP/1.1 401 "), got[:200]
    assert b"missing or wrong bearer token" in got
    assert closed and took < 3, f"answered after {took:.1f} s: the body was waited for"


def test_a_request_head_that_never_ends_is_closed_at_the_head_deadline(tansu: Broker, topic: str) -> None:
    with running_proxy(tansu.bootstrap, admin__listen="127.0.0.1:0",
                       metrics_listen=f"127.0.0.1:{free_port()}") as proxy, \
            steady_producer(proxy.bootstrap, topic) as steady:
        wait_for(lambda: steady.delivered > 0, 15, "the steady producer's first delivery")
        assert proxy.server is not None and proxy.server.metrics_server is not None
        ports = {"admin": admin_port(proxy), "metrics": proxy.server.metrics_server.port}
        reset_loop_lag(proxy)
        socks = {}
        for name, port in ports.items():
            socks[name] = socket.create_connection(("127.0.0.1", port), timeout=10)
            socks[name].sendall(b"GET /healthz HTTP/1.1\r\nHost: kproxy\r\nX-Slow: ")  # and never the rest
        started = time.monotonic()
        took: dict[str, float] = {}
        for name, sock in socks.items():
            closed, got = closed_by_peer(sock, timeout=15)
            took[name] = time.monotonic() - started
            sock.close()
            assert closed and got == b"", f"{name}: {closed} {got[:100]!r}"
        lag = loop_held_max(proxy)
    assert_unaffected(steady)
    print(f"request head never finished: closed after {took['admin']:.1f} s (admin), {took['metrics']:.1f} s "
          f"(metrics); worst loop lag {lag * 1000:.0f} ms")
    assert max(took.values()) < 8, f"held {max(took.values()):.1f} s: no head deadline"
    assert lag < BLOCKED
