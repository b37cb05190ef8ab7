"""Run kproxy's ProxyServer in its own process, for the proxy benchmark.

    .venv/bin/python bench/run_kproxy.py --upstream HOST:PORT [--listen-port PORT] [--log-level LEVEL]

Prints ``ready PORT`` on stdout once the bootstrap listener accepts. With
``KPROXY_BENCH_NO_METRICS=1`` in the environment the sessions get no metrics
observer (for the metrics-overhead comparison); with ``KPROXY_BENCH_CAPTURE_DIR=DIR`` it
captures to DIR (the capture-overhead comparison: ``bench_proxy.py --kproxy-env
KPROXY_BENCH_CAPTURE_DIR=/tmp/kproxy-bench-capture`` puts it beside capture off). Broker
listeners are ephemeral ports (``broker_port_base: 0``). Logging defaults to
``warning`` so that per-connection log lines do not count as proxy cost.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource

import trio

from kproxy.config import build_config
from kproxy.server.memory import tune_allocator
from kproxy.server.proxy import ProxyServer


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(config_raw: dict[str, tuple[object, str]]) -> None:
    server = ProxyServer(build_config(config_raw))
    if os.environ.get("KPROXY_BENCH_NO_METRICS") == "1":
        # The metrics-overhead comparison: the same proxy with no observer on its sessions.
        server.observer = None
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        print(f"ready {server.bootstrap_port}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", required=True, help="HOST:PORT")
    parser.add_argument("--listen-port", type=int, default=0)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    raise_fd_limit()
    tune_allocator()  # as `kproxy run` does
    raw: dict[str, tuple[object, str]] = {
        "upstream": (args.upstream, "--upstream"),
        "listen": (f"127.0.0.1:{args.listen_port}", "--listen-port"),
        "broker_port_base": (0, "bench"),
        "log_level": (args.log_level, "--log-level"),
        "limits.shutdown_grace": (2, "bench"),
    }
    capture = os.environ.get("KPROXY_BENCH_CAPTURE_DIR")
    if capture:
        raw["capture.dir"] = (capture, "KPROXY_BENCH_CAPTURE_DIR")
    trio.run(serve, raw)


if __name__ == "__main__":
    main()
