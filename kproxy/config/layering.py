"""The layers of a configuration, merged and checked: built-in default < config file <
``KPROXY_*`` environment < flag.

Every problem of every layer is collected before anything is refused, so one
:class:`~kproxy.config.model.ConfigError` lists them all, each naming where: the file and line
(``kproxy.yaml:4: limits.idle_timeout: ...``), the variable (``environment KPROXY_LOG_LEVEL:
...``) or the flag (``--limits-max-in-flight: ...``).

A ``KPROXY_*`` variable that is no option and none of :data:`KNOWN_VARIABLES` is a problem
too (with a did-you-mean): a misspelt variable would otherwise leave its option at the default
without a word.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import os
from collections.abc import Mapping
from typing import Any

from kproxy.config import values
from kproxy.config.model import (
    AdminOptions,
    CaptureOptions,
    ClientTls,
    Config,
    ConfigError,
    Limits,
    MetricsOptions,
    UpstreamTls,
)
from kproxy.config.options import BY_ENV, BY_PATH, ENV_PREFIX, OPTIONS, env_name
from kproxy.config.yaml_file import read_config_file

# KPROXY_* variables that kproxy or its tooling reads and that are not options of ``kproxy run``:
# a shell or a test run may set them in the environment ``kproxy run`` inherits.
KNOWN_VARIABLES: Mapping[str, str] = {
    "KPROXY_ADMIN": "the admin API `kproxy rules` talks to",
    "KPROXY_ADMIN_URL": "the admin API `kproxy rules` talks to (the older name of KPROXY_ADMIN)",
    "KPROXY_TEST_UPSTREAM": "the broker of the pytest plugin's kproxy fixture",
    "KPROXY_BENCH_CAPTURE_DIR": "bench/run_kproxy.py: capture during a benchmark",
    "KPROXY_BENCH_NO_METRICS": "bench/run_kproxy.py: a benchmark without metrics",
    "KPROXY_BENCH_PROFILE": "bench/: a cProfile of a benchmark run",
    "KPROXY_SOAK_ARGS": "tests/test_soak.py: extra flags of the soak's kproxy",
    "KPROXY_SOAK_DIRECT": "tests/test_soak.py: soak the broker without kproxy",
    "KPROXY_SOAK_SECONDS": "tests/test_soak.py: length of the soak",
    "KPROXY_FUZZ_SECONDS": "tests/fuzz: length of each fuzz run",
    "KPROXY_CODEC_EXAMPLES": "tests/test_codec_roundtrip.py: examples per kind",
    "KPROXY_CODEC_FUZZ_EXAMPLES": "tests/test_codec_malformed.py: examples of the malformed-frame run",
    "KPROXY_IDLE_CONNECTIONS": "tests/test_resilience_clients.py: idle connections held",
}

# A variable spelt after a deprecated flag (as --max-in-flight would give) means that option.
_BY_ALIAS_ENV = {ENV_PREFIX + a.flag[2:].replace("-", "_").upper(): o for o in OPTIONS for a in o.aliases}


def read_environment(environ: Mapping[str, str]) -> tuple[dict[str, tuple[Any, str]], list[str]]:
    """Option values set by ``KPROXY_*`` variables, with where each came from, and the problems:
    one per ``KPROXY_*`` variable that is neither an option nor one of :data:`KNOWN_VARIABLES`.

    Values are read as the YAML file's would be (``KPROXY_TLS_UPSTREAM_VERIFY=false``);
    options that take several values take them comma-separated.
    """
    out: dict[str, tuple[Any, str]] = {}
    problems: list[str] = []
    for name, text in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in KNOWN_VARIABLES:
            continue
        opt = BY_ENV.get(name)
        if opt is None:
            problems.append(f"environment {name}: not a kproxy option{_env_hint(name)}")
            continue
        value: Any = [part.strip() for part in text.split(",") if part.strip()] if opt.repeatable else text
        out[opt.path] = (value, f"environment {name}")
    return out, problems


def _env_hint(name: str) -> str:
    meant = _BY_ALIAS_ENV.get(name)
    if meant is not None:
        return f" (did you mean {meant.env}?)"
    close = difflib.get_close_matches(name, [*BY_ENV, *KNOWN_VARIABLES], n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Config:
    """Merge defaults, ``--config``, ``KPROXY_*`` variables (``environ``, default the process's)
    and flags, in that order of precedence; raises :class:`ConfigError` with every problem of
    every layer, the file's in line order first."""
    raw: dict[str, tuple[Any, str]] = {}
    problems: list[str] = []
    config_path = getattr(args, "config", None)
    if config_path is not None:
        file = read_config_file(config_path)
        raw.update(file.values)
        problems.extend(str(p) for p in file.problems)
    from_env, env_problems = read_environment(os.environ if environ is None else environ)
    raw.update(from_env)
    problems.extend(env_problems)
    for opt in OPTIONS:
        value = getattr(args, opt.dest, None)
        if value is not None:
            raw[opt.path] = (value, opt.flag)
    return build_config(raw, problems)


def build_config(raw: Mapping[str, tuple[Any, str]], problems: list[str] | None = None) -> Config:
    """Parse raw values (with where each came from) into a validated :class:`Config`; raises
    :class:`ConfigError` with ``problems`` (found before, in the layers) and every problem of
    the values."""
    problems = list(problems or [])
    value_problems: list[tuple[int, str]] = []
    parsed: dict[str, Any] = {}
    # Rules last: they are read under rules_max_bytes.
    for order, (path, (value, where)) in enumerate(sorted(raw.items(), key=lambda item: item[0] == "rules")):
        try:
            parsed[path] = (BY_PATH[path].parse(value) if path != "rules" else
                            values.rules(value, parsed.get("rules_max_bytes", Config.rules_max_bytes)))
        except ValueError as exc:
            value_problems.extend((order, f"{where}: {arg}") for arg in exc.args or (exc,))
    problems = _in_file_order(problems, [text for _, text in value_problems])
    if "upstream" not in raw:
        problems.append(f"upstream: required (--upstream HOST:PORT, 'upstream:' in the config file, or "
                        f"{env_name('upstream')})")
    if problems:
        raise ConfigError(*problems)

    def section(prefix: str) -> dict[str, Any]:
        return {p[len(prefix):]: v for p, v in parsed.items() if p.startswith(prefix)}

    client_tls = ClientTls(**section("tls.client."))
    if (client_tls.cert is None) != (client_tls.key is None):
        problems.append("tls.client: cert and key go together (--tls-client-cert with --tls-client-key)")
    if client_tls.require_client_cert and client_tls.client_ca is None:
        problems.append("tls.client.require_client_cert: needs tls.client.client_ca (--tls-client-client-ca)")
    upstream_tls = UpstreamTls(**section("tls.upstream."))
    if (upstream_tls.cert is None) != (upstream_tls.key is None):
        problems.append("tls.upstream: cert and key go together (--tls-upstream-cert with --tls-upstream-key)")
    capture = CaptureOptions(**section("capture."))
    if capture.rotate_bytes > capture.max_bytes_total:
        problems.append("capture.rotate_bytes: must not exceed capture.max_bytes_total")
    admin = AdminOptions(**section("admin."))
    problems.extend(_admin_problems(admin))
    if problems:
        raise ConfigError(*problems)
    top = {p: v for p, v in parsed.items() if "." not in p}
    return Config(limits=Limits(**section("limits.")), metrics=MetricsOptions(**section("metrics.")),
                  client_tls=client_tls, upstream_tls=upstream_tls, capture=capture, admin=admin, **top)


def _in_file_order(layer_problems: list[str], value_problems: list[str]) -> list[str]:
    """Every problem, those with a ``file:line:`` in line order (a file's key and value problems
    interleaved as they are written), then the rest as they came."""
    def line(problem: str) -> int | None:
        head = problem.split(": ", 1)[0]
        file_and_line = head.rsplit(":", 1)
        return int(file_and_line[1]) if len(file_and_line) == 2 and file_and_line[1].isdigit() else None

    everything = layer_problems + value_problems
    located = sorted((p for p in everything if line(p) is not None), key=lambda p: line(p) or 0)
    return located + [p for p in everything if line(p) is None]


def is_loopback(host: str) -> bool:
    """``localhost`` or an address in 127.0.0.0/8 or ::1; any other name or address is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere: not trusted as loopback


def _admin_problems(admin: AdminOptions) -> list[str]:
    problems: list[str] = []
    if admin.token is not None and admin.token_file is not None:
        problems.append("admin: give admin.token or admin.token_file, not both")
    try:
        token = admin.bearer_token()
    except (OSError, UnicodeDecodeError) as exc:
        return [f"admin.token_file: cannot read {admin.token_file}: {exc}"]
    if admin.token_file is not None and token is None:
        problems.append(f"admin.token_file: {admin.token_file} is empty")
    # Whoever reaches the admin port can make kproxy fail every request: beyond this host, only
    # with a secret.
    if admin.listen is not None and not is_loopback(admin.listen.host) and token is None:
        problems.append(f"admin.listen: {admin.listen} is not a loopback address: the admin API changes what "
                        f"kproxy does to traffic, so beyond loopback it needs a bearer token "
                        f"(admin.token_file, --admin-token-file or KPROXY_ADMIN_TOKEN)")
    return problems
