"""Run kproxy's ProxyServer in its own process, for the proxy benchmark.

    .venv/bin/python bench/run_kproxy.py --upstream HOST:PORT [--listen-port PORT] [--log-level LEVEL]
                                         [--no-metrics] [--rules FILE] [--capture-dir DIR]

Prints ``ready PORT`` on stdout once the bootstrap listener accepts. ``--no-metrics``: the
sessions get no metrics observer (the metrics-overhead comparison); ``--rules FILE``: the
fault-injection rules of FILE are loaded, as ``kproxy run --rules`` does; ``--capture-dir DIR``:
traffic is captured to DIR. bench_proxy.py's ``--variants`` start one such process per preset.
The environment variables ``KPROXY_BENCH_NO_METRICS=1`` and ``KPROXY_BENCH_CAPTURE_DIR=DIR`` do
the same as the flags (``--kproxy-env``, and checkouts measured with ``--kproxy-tree`` whose
runner predates the flags). ``KPROXY_METRICS_*`` variables set the metrics options as they do for
``kproxy run`` (``KPROXY_METRICS_TOPIC_LABEL=true KPROXY_METRICS_CLIENT_ID_LABEL=true``: the traffic
labels on), in every kproxy process of a benchmark run they are set for.
Broker listeners are ephemeral ports (``broker_port_base: 0``).
Logging defaults to ``warning`` so that per-connection log lines (and the fault log's info
lines) do not count as proxy cost. ``KPROXY_BENCH_PROFILE=DIR``: a cProfile of the run is written to
DIR/kproxy-PID.prof when the process gets SIGTERM (bench_conns.py stops it so).
``KPROXY_BENCH_STALLS=DIR``: the loop's long task steps and garbage collections are written to
DIR/stalls-PID.json at the end (bench/_stalls.py).
``KPROXY_BENCH_CAPTURE_ROW_GROUP=N``: the capture writes a row group every N records and never on
its clock (bench_instructions.py: under valgrind, time runs ~50x slower, and the writer's one-second
flush would make row groups of a few dozen records where the real process makes thousands).
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
from pathlib import Path

import trio

from kproxy.config import build_config
from kproxy.config.layering import read_environment
from kproxy.memory import tune_allocator, tune_gc
from kproxy.server.proxy_server import ProxyServer


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(config_raw: dict[str, tuple[object, str]], no_metrics: bool) -> None:
    server = ProxyServer(build_config(config_raw), freeze_gc=True)
    if no_metrics:
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
    parser.add_argument("--no-metrics", action="store_true", help="no metrics observer on the sessions")
    parser.add_argument("--rules", metavar="FILE", help="fault-injection rules to load")
    parser.add_argument("--capture-dir", metavar="DIR", help="capture traffic to DIR")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    raise_fd_limit()
    tune_allocator()  # as `kproxy run` does
    tune_gc()
    raw: dict[str, tuple[object, str]] = {
        "upstream": (args.upstream, "--upstream"),
        "listen": (f"127.0.0.1:{args.listen_port}", "--listen-port"),
        "broker_port_base": (0, "bench"),
        "log_level": (args.log_level, "--log-level"),
        "limits.shutdown_grace": (2, "bench"),
    }
    # The metrics options and capture.process from the environment, as `kproxy run` reads them
    # (KPROXY_BENCH_* are not options).
    options, problems = read_environment({k: v for k, v in os.environ.items()
                                          if k.startswith("KPROXY_METRICS_") or k == "KPROXY_CAPTURE_PROCESS"})
    if problems:
        parser.error("; ".join(problems))
    raw.update(options)
    capture = args.capture_dir or os.environ.get("KPROXY_BENCH_CAPTURE_DIR")
    if capture:
        raw["capture.dir"] = (capture, "--capture-dir")
    if args.rules:
        raw["rules"] = (args.rules, "--rules")
    no_metrics = args.no_metrics or os.environ.get("KPROXY_BENCH_NO_METRICS") == "1"
    row_group = os.environ.get("KPROXY_BENCH_CAPTURE_ROW_GROUP")
    if row_group:
        from kproxy.capture.writer import CaptureWriter

        defaults = CaptureWriter.__init__.__kwdefaults__
        assert defaults is not None
        defaults.update(row_group_rows=int(row_group), flush_seconds=3600.0)
    stalls_dir = os.environ.get("KPROXY_BENCH_STALLS")
    if stalls_dir:
        from _stalls import StallWatch

        watch = StallWatch()
        try:
            trio.run(serve, raw, no_metrics, instruments=[watch])
        finally:
            watch.dump(Path(stalls_dir) / f"stalls-{os.getpid()}.json")
        return
    profile_dir = os.environ.get("KPROXY_BENCH_PROFILE")
    if not profile_dir:
        trio.run(serve, raw, no_metrics)
        return
    # A cProfile of the whole run, written when the benchmark stops the process (SIGTERM: the
    # server drains and trio.run returns).
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        trio.run(serve, raw, no_metrics)
    finally:
        profiler.disable()
        profiler.dump_stats(os.path.join(profile_dir, f"kproxy-{os.getpid()}.prof"))


if __name__ == "__main__":
    main()
