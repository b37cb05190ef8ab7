"""The server under hostile clients and exhausted resources.

Each test plays what a hostile client or a pressed operator does, through a
real kproxy: a raw socket or a real broker (Tansu) where that is how it
happens, a scripted fake broker (tests/support/fakebroker.py) where the test
needs answers Tansu does not give, a virtual clock where it needs exact time.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys

import trio

from kproxy.metrics.stats import MAX_LABEL_LENGTH
from tests.support.fakebroker import KafkaClient, fake_cluster, running_server
from tests.support.proxy import proxy_config
from tests.support.tansu import free_port, wait_for_port

KPROXY = [sys.executable, "-m", "kproxy"]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def scrape(port: int) -> str:
    """``GET /metrics`` over a plain socket; the body as text."""
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nhost: kproxy\r\nconnection: close\r\n\r\n")
            data = bytearray()
            while chunk := await stream.receive_some(65536):
                data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return body.decode()


def series(body: str, name: str) -> list[str]:
    return [line for line in body.splitlines() if line.startswith(name + "{")]


# -- defect: every (api key, version) pair a client sends became metric series ---------------------------
def raw_request(api_key: int, api_version: int, correlation_id: int, client_id: bytes = b"raw") -> bytes:
    """A request frame with header v1 and an empty body: all kproxy needs to count it."""
    payload = (api_key.to_bytes(2, "big", signed=True) + api_version.to_bytes(2, "big", signed=True)
               + correlation_id.to_bytes(4, "big", signed=True) + len(client_id).to_bytes(2, "big") + client_id)
    return len(payload).to_bytes(4, "big") + payload


async def test_metric_series_stay_bounded_whatever_api_keys_and_versions_clients_send() -> None:
    async with fake_cluster((0,)) as cluster:
        config = proxy_config(cluster.bootstrap, metrics_listen=f"127.0.0.1:{free_port()}",
                              metrics__client_id_label=True)
        async with running_server(config) as server:
            assert server.metrics_server is not None
            port = server.metrics_server.port
            before = await scrape(port)
            # 1,500 pairs nobody knows (the fake broker echoes them), 500 known APIs at versions no
            # Kafka has; and 50 client ids of 4 KB each (the label is opt-in and capped in count).
            pairs = [(key, version) for key in range(1000, 1030) for version in range(50)]
            pairs += [(key, version) for key in (8, 9, 11, 19) for version in range(200, 325)]
            async with await KafkaClient.connect(server.bootstrap_port, timeout=30) as client:
                sent = b"".join(raw_request(k, v, c, client_id=b"c%04d" % (c % 50) + b"x" * 4096)
                                for c, (k, v) in enumerate(pairs))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(client.send_raw, sent)  # while reading: the echoes are as big
                    for _ in pairs:
                        await client.receive_frame()
            after = await scrape(port)
    requests = series(after, "kproxy_requests_total")
    assert len(requests) - len(series(before, "kproxy_requests_total")) <= 5, requests
    assert 'api="unknown",version="other"' in after
    assert 'api="join_group",version="other"' in after
    client_ids = {m for line in series(after, "kproxy_client_requests_total")
                  for m in re.findall(r'client_id="([^"]*)"', line)}
    assert 0 < len(client_ids) <= 100  # --metrics-label-cap
    assert max(map(len, client_ids)) <= MAX_LABEL_LENGTH
    assert len(after) < len(before) + 64 * 1024, f"/metrics grew from {len(before)} to {len(after)} bytes"


# -- defect: --upstream-no-verify was accepted silently ---------------------------------------------------
def run_briefly(*flags: str) -> str:
    """``kproxy run`` with ``flags`` until it listens, then SIGTERM; its log."""
    port = free_port()
    argv = [*KPROXY, "run", "--upstream", f"127.0.0.1:{closed_port()}", "--listen", f"127.0.0.1:{port}",
            "--broker-port-base", "0", "--shutdown-grace", "1", *flags]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port("127.0.0.1", port)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    return err


def test_upstream_no_verify_logs_one_warning_at_start() -> None:
    log = run_briefly("--upstream-tls", "--upstream-no-verify")
    warned = [line for line in log.splitlines() if "event=upstream_tls_unverified" in line]
    assert len(warned) == 1, log
    assert " level=warning " in warned[0] and "\n" not in warned[0]
    # Verification on (the default): nothing to warn about.
    assert "upstream_tls_unverified" not in run_briefly("--upstream-tls")
