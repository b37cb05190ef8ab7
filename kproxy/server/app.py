"""``kproxy run``: load the configuration, set up logging, serve until SIGTERM/SIGINT (SIGHUP reloads rules)."""

from __future__ import annotations

import logging
import signal

import trio

from kproxy.config import Config
from kproxy.logfmt import q, setup_logging
from kproxy.memory import tune_allocator, tune_gc
from kproxy.paths import OptionFailed
from kproxy.server.proxy_server import ListenFailed, ProxyServer

log = logging.getLogger("kproxy.server")


def run(config: Config) -> int:
    """Serve with ``config`` until a signal; returns the process exit status.

    A bootstrap port that cannot be opened (in use, no permission), or a capture
    directory that cannot be made, is reported in one log line naming it (the
    listener, or the option) and exits 1; every other failure after start-up is
    contained in the connection it happened in.
    """
    setup_logging(config.log_level, config.log_format)
    tune_allocator()
    tune_gc()
    # SIGHUP must never end kproxy (it reloads the rules: ProxyServer._watch_hangups). Ignored until
    # the server's own handler is installed, and again after it is removed on the way out.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    failed: list[OSError] = []
    try:
        trio.run(ProxyServer(config, freeze_gc=True).run)
    except* OSError as group:  # trio nurseries wrap errors in groups
        failed.extend(_leaves(group))
    if failed:
        first = failed[0]
        if isinstance(first, OptionFailed):  # a path an option names (capture.dir), not a listener
            log.error("event=start_failed option=%s path=%s error=%s", first.option, q(first.path),
                      q(first.strerror or str(first)))
            return 1
        listener, address = ((first.what, first.address) if isinstance(first, ListenFailed)
                             else ("bootstrap", str(config.listen)))
        log.error("event=start_failed listener=%s address=%s error=%s", listener, address,
                  q(first.strerror or str(first)))
        return 1
    return 0


def _leaves(group: BaseExceptionGroup[OSError]) -> list[OSError]:
    out: list[OSError] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out
