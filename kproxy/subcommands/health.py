"""``kproxy health``: ask a running kproxy whether it is alive, for container HEALTHCHECKs.

An image that needs no curl or wget: the kproxy command itself probes ``/healthz``
(liveness: the process serves; ``/readyz`` is the readiness probe Kubernetes uses).
The address comes from ``--url``, or from the ``metrics_listen`` of the same config
file ``kproxy run`` reads, so the probe follows the config instead of repeating it.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from kproxy.config import ConfigError, config_from_file

DEFAULT_URL = "http://127.0.0.1:9308/healthz"


def url_from_config(path: Path, endpoint: str = "/healthz") -> str:
    """The URL of ``endpoint`` on the metrics listener of kproxy config ``path``.

    Raises :class:`ConfigError` for an unreadable or invalid file, or one without
    ``metrics_listen`` (then kproxy serves no health endpoint at all). A wildcard
    listen address is probed on loopback.
    """
    config = config_from_file(path)
    if config.metrics_listen is None:
        raise ConfigError(f"{path}: metrics_listen is not set, so kproxy serves no /healthz to probe")
    host = config.metrics_listen.host
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{config.metrics_listen.port}{endpoint}"


def probe(url: str, timeout: float) -> tuple[bool, str]:
    """GET ``url``: (True, status line) on HTTP 200, else (False, what went wrong)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200, f"{url}: HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{url}: HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{url}: {reason}"
