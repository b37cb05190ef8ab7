"""Terminate mode under floods of unauthenticated PLAIN logins (issue 35, item 1), through a real
``kproxy run`` process on loopback, with the slow hash at its real cost (210,000 iterations).

The flood comes from 127.0.0.2, the real client from 127.0.0.1: two hosts, as kproxy charges its
hash work per peer address (kproxy/server/password_checks.py). Each real login is a user's first,
so kproxy has to hash it (a remembered password would be answered at once). Every loop is bounded;
the figures these tests print are the ones docs/RELIABILITY.md records.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kproxy.logfmt import parse_logfmt
from kproxy.protocol import decode_response
from kproxy.protocol.frame_builder import request_frame
from kproxy.sasl.credentials import CredentialStore, user_credentials, with_user
from kproxy.sasl.credentials_file import save_credentials
from kproxy.testing import Broker, free_port, wait_for_port

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
FLOOD_FROM = "127.0.0.2"
FLOOD_INTERVAL_S = 6.3 / 2000  # the fire-and-forget flood's pace, as issue 35 measured it
FRAME_TIMEOUT = 10  # the login deadline (limits.frame_timeout) of these runs
USERS = [f"user-{i}" for i in range(16)]
# The bound for a real login during a flood, on an idle machine. The machines these tests run
# on are shared: each test also measures a login before its flood (what one login costs there and
# then) and allows four of those when that is more, to the median of three real logins (a moment of
# the machine's own load can hold one of them; before the fix none was answered in 10 s).
LOGIN_BOUND_S = 1.0
QUIET_LOGINS = 4


def _bound(quiet: float) -> float:
    return max(LOGIN_BOUND_S, QUIET_LOGINS * quiet)


def _password(user: str) -> str:
    return f"{user}-Secret-5e1f"


@dataclass
class Kproxy:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    next_user: Iterator[str] = field(default_factory=lambda: iter(USERS))

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def closed_lines(self) -> list[dict[str, str]]:
        return [parse_logfmt(line) for line in self.log.read_text().splitlines() if "event=connection_closed" in line]


@pytest.fixture(scope="module")
def kproxy(tansu: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kproxy]:
    root = tmp_path_factory.mktemp("hostile-sasl")
    store = CredentialStore()
    for user in USERS:
        store = with_user(store, user, user_credentials(_password(user), ["PLAIN"]))  # 210,000 iterations
    save_credentials(root / "credentials.yaml", store)
    port = free_port()
    argv = [sys.executable, "-m", "kproxy", "run", "--upstream", tansu.bootstrap, "--listen", f"127.0.0.1:{port}",
            "--broker-port-base", "0", "--shutdown-grace", "1", "--sasl-client-mode", "terminate",
            "--sasl-client-credentials-file", str(root / "credentials.yaml"),
            "--limits-frame-timeout", str(FRAME_TIMEOUT)]
    log = root / "kproxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out)
    try:
        wait_for_port("127.0.0.1", port)
        yield Kproxy(port, proc, log)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _login_frames(user: str, password: str) -> bytes:
    """SaslHandshake v1 (PLAIN) and SaslAuthenticate v2, in one write (about 70 bytes)."""
    return (request_frame(SASL_HANDSHAKE, 1, 1, mechanism="PLAIN")
            + request_frame(SASL_AUTHENTICATE, 2, 2, auth_bytes=f"\x00{user}\x00{password}".encode()))


def _receive_frame(sock: socket.socket) -> bytes:
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by kproxy")
        data += chunk
    return data[4:4 + int.from_bytes(data[:4], "big")]


def _login(port: int, user: str, password: str, source: str, timeout: float) -> tuple[int, float]:
    """One PLAIN login, its two requests in one write: (SaslAuthenticate's error code, seconds from
    the connect to its answer)."""
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0)) as sock:
        sock.sendall(_login_frames(user, password))
        handshake = _receive_frame(sock)
        assert decode_response(handshake, SASL_HANDSHAKE, 1).body["error_code"] == 0
        answer = _receive_frame(sock)
        code = decode_response(answer, SASL_AUTHENTICATE, 2).body["error_code"]
    return code, time.monotonic() - began


def _real_login(kproxy: Kproxy) -> float:
    """A real client's first login of a user (hashed: never verified before): seconds to its answer."""
    user = next(kproxy.next_user)
    try:
        code, seconds = _login(kproxy.port, user, _password(user), "127.0.0.1", timeout=10)
    except (TimeoutError, ConnectionError) as exc:
        raise AssertionError(f"a real login got no answer in 10 s: {exc!r}") from None
    assert code == 0
    return seconds


def _quiet_login(kproxy: Kproxy) -> float:
    """Real logins with no flood: what one login costs on this machine now (the slower of two)."""
    return max(_real_login(kproxy), _real_login(kproxy))


def _back_to(kproxy: Kproxy, baseline: int, within: float) -> float:
    """Seconds until kproxy holds no more descriptors than ``baseline`` (fails after ``within``)."""
    began = time.monotonic()
    while kproxy.descriptors() > baseline:
        assert time.monotonic() - began < within, f"{kproxy.descriptors()} descriptors, {baseline} before the flood"
        time.sleep(0.05)
    return time.monotonic() - began


def test_a_fire_and_forget_flood_does_not_stop_real_logins(kproxy: Kproxy) -> None:
    """2,000 wrong logins, each sent in one write and the connection closed at once (about 320 a
    second): real logins meanwhile are answered within a second (or four quiet logins' time on a
    loaded machine: LOGIN_BOUND_S), and kproxy's descriptors are back within the login deadline."""
    quiet = _quiet_login(kproxy)
    baseline = kproxy.descriptors()
    cpu_before = kproxy.cpu_seconds()
    sent, peak = [0], [baseline]

    def flood() -> None:  # at the pace: 2,000 in 6.3 s
        began = time.monotonic()
        for i in range(2000):
            ahead = began + i * FLOOD_INTERVAL_S - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            with socket.socket() as sock:
                sock.bind((FLOOD_FROM, 0))
                sock.connect(("127.0.0.1", kproxy.port))
                sock.sendall(_login_frames("user-0", f"guess-{i}"))
            sent[0] = i + 1
            if i % 50 == 0:
                peak[0] = max(peak[0], kproxy.descriptors())

    flooding = threading.Thread(target=flood, daemon=True)
    began = time.monotonic()
    flooding.start()
    logins = []
    for at in (300, 900, 1500):
        while sent[0] < at and flooding.is_alive():
            time.sleep(0.01)
        logins.append(_real_login(kproxy))
    flooding.join(120)
    assert not flooding.is_alive()
    flood_s = time.monotonic() - began
    settled = _back_to(kproxy, baseline, FRAME_TIMEOUT + 1)
    cpu = kproxy.cpu_seconds() - cpu_before
    longest = max(float(line["duration_s"]) for line in kproxy.closed_lines())
    print(f"\nfire-and-forget: 2000 sent in {flood_s:.1f} s; real logins {', '.join(f'{s:.3f}' for s in logins)} s "
          f"({quiet:.3f} s without the flood); "
          f"descriptors {baseline} before, {peak[0]} at most, back {settled:.2f} s after; kproxy CPU {cpu:.1f} s; "
          f"longest connection {longest:.2f} s")
    assert statistics.median(logins) < _bound(quiet), (logins, quiet)
    assert longest <= FRAME_TIMEOUT + 1


def test_a_flood_of_wrong_logins_on_64_connections_does_not_stop_real_logins(kproxy: Kproxy) -> None:
    """64 connections, each logging in wrongly, waiting for its refusal, and again: real logins
    meanwhile are answered within a second (or four quiet logins' time: LOGIN_BOUND_S)."""
    quiet = _quiet_login(kproxy)
    baseline = kproxy.descriptors()
    stop = threading.Event()
    answered = [0]
    lock = threading.Lock()

    def attacker(n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            with contextlib.suppress(OSError):
                _login(kproxy.port, "user-0", f"guess-{n}-{i}", FLOOD_FROM, timeout=10)
                with lock:
                    answered[0] += 1

    attackers = [threading.Thread(target=attacker, args=(n,), daemon=True) for n in range(64)]
    began = time.monotonic()
    for thread in attackers:
        thread.start()
    logins = []
    try:
        for _ in range(3):
            time.sleep(1.5)
            logins.append(_real_login(kproxy))
    finally:
        stop.set()
        for thread in attackers:
            thread.join(15)
    flood_s = time.monotonic() - began
    settled = _back_to(kproxy, baseline, FRAME_TIMEOUT + 1)
    print(f"\n64 connections: {answered[0]} wrong logins answered in {flood_s:.1f} s; real logins "
          f"{', '.join(f'{s:.3f}' for s in logins)} s ({quiet:.3f} s without the flood); descriptors back "
          f"{settled:.2f} s after")
    assert not any(thread.is_alive() for thread in attackers)
    assert statistics.median(logins) < _bound(quiet), (logins, quiet)


def test_a_hundred_logins_of_one_user_at_once_share_one_hash(kproxy: Kproxy) -> None:
    """100 clients of one user log in at once, before any of them was verified: one hash answers
    them all (each waited for the hash of the one before)."""
    quiet = _quiet_login(kproxy)
    user = next(kproxy.next_user)
    start = threading.Barrier(100, timeout=20)
    times: list[float] = []
    codes: list[int] = []

    def client() -> None:
        start.wait()
        code, seconds = _login(kproxy.port, user, _password(user), "127.0.0.1", timeout=20)
        codes.append(code)
        times.append(seconds)

    clients = [threading.Thread(target=client, daemon=True) for _ in range(100)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join(30)
    assert codes == [0] * 100, f"{len(codes)} of 100 answered"
    print(f"\n100 logins of one user at once: the slowest answered in {max(times):.3f} s ({quiet:.3f} s for one "
          "login alone)")
    # Before the fix: 100 hashes, two at a time.
    assert max(times) < 2 * _bound(quiet), (sorted(times)[-5:], quiet)
