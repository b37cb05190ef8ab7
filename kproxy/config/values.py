"""The parsers of option values, and how ``--help`` renders their defaults.

Each parser takes a value as it comes from any layer (a YAML scalar, list or mapping; an
environment variable's text; a flag's text) and returns the typed value, or raises ValueError
whose arguments are each one short reason (``must be an integer >= 1, got 'many'``); the caller
prefixes where the value came from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kproxy.config.sections import SASL_MECHANISMS, Config
from kproxy.host_port import CLUSTER_NAME_RULE, DNS_LABEL, HostPort, parse_host_port
from kproxy.logfmt import excerpt

if TYPE_CHECKING:
    from kproxy.rules import RuleSet


def integer(lo: int, hi: int | None = None) -> Callable[[Any], int]:
    """A parser of integers from ``lo`` to ``hi`` (no upper bound when None)."""
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(f"must be an integer, got {excerpt(value)}")
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"must be an integer >= {lo}, got {excerpt(value)}") from None
        if n < lo or (hi is not None and n > hi):
            shown = excerpt(n)
            raise ValueError(f"must be between {lo} and {hi}, got {shown}" if hi else f"must be >= {lo}, got {shown}")
        return n
    return parse


def seconds(value: Any) -> float:
    try:
        n = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number of seconds, got {excerpt(value)}") from None
    if n <= 0:
        raise ValueError(f"must be > 0 seconds, got {n}")
    return n


_BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def boolean(value: Any) -> bool:
    if isinstance(value, bool) or (isinstance(value, str | int) and str(value).lower() in _BOOL_WORDS):
        return value if isinstance(value, bool) else _BOOL_WORDS[str(value).lower()]
    raise ValueError(f"must be true or false, got {excerpt(value)}")


def string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string, got {excerpt(value)}")
    return value


def sasl_mechanism(value: Any) -> str:
    """One of :data:`~kproxy.config.sections.SASL_MECHANISMS`, in any case (``scram-sha-256``)."""
    mechanism = string(value).upper()
    if mechanism not in SASL_MECHANISMS:
        raise ValueError(f"must be one of {', '.join(SASL_MECHANISMS)}, got {excerpt(value)}")
    return mechanism


def existing_file(value: Any) -> Path:
    path = Path(string(value))
    if not path.exists():
        raise ValueError(f"file {excerpt(str(path))} does not exist")
    return path


def directory(value: Any) -> Path:
    path = Path(string(value))
    if path.exists() and not path.is_dir():
        raise ValueError(f"{excerpt(str(path))} is not a directory")
    return path


def address(value: Any) -> HostPort:
    return parse_host_port(string(value))


def listen_address(value: Any) -> HostPort:
    return parse_host_port(string(value), allow_port_zero=True)  # port 0: let the OS choose (tests)


def addresses(value: Any) -> tuple[HostPort, ...]:
    items = value if isinstance(value, list) else [value]
    out: list[HostPort] = []
    for item in items:
        out.extend(parse_host_port(part) for part in string(item).split(",") if part.strip())
    if not out:
        raise ValueError("needs at least one host:port")
    return tuple(out)


def broker_ports(value: Any) -> dict[int, int]:
    """YAML mapping ``{node_id: port}``, or flags ``NODE=PORT`` (repeatable)."""
    if isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        pairs = []
        for item in value if isinstance(value, list) else [value]:
            node, sep, port = str(item).partition("=")
            if not sep:
                raise ValueError(f"expected NODE_ID=PORT, got {excerpt(item)}")
            pairs.append((node, port))
    return {integer(0)(node): integer(1, 65535)(port) for node, port in pairs}


def cluster_name(value: Any) -> str:
    """A cluster's name: a DNS label in lower case (:data:`kproxy.host_port.DNS_LABEL`)."""
    if not isinstance(value, str) or DNS_LABEL.fullmatch(value) is None:
        raise ValueError(f"a cluster's name must be {CLUSTER_NAME_RULE}, got {excerpt(value)}")
    return value


def rules(value: Any, max_bytes: int = Config.rules_max_bytes) -> RuleSet:
    """A rule file, or a directory of them (a mounted ConfigMap; kproxy/rules/sources.py) of at most
    ``max_bytes``, loaded now: a bad one is a start-up error listing every problem as ``file:line: key:
    reason``, as ``kproxy rules check`` prints them. The server watches the set's ``source`` (the path)."""
    from kproxy.rules import RulesError
    from kproxy.rules.sources import load_path

    try:
        return load_path(string(value), max_bytes)
    except RulesError as exc:
        raise ValueError(*(str(p) for p in exc.problems)) from None


def seconds_or_zero(value: Any) -> float:
    """A number of seconds, where 0 means "never" (``sasl.client.session_lifetime``)."""
    try:
        n = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number of seconds (0: never), got {excerpt(value)}") from None
    if not 0 <= n <= 365 * 86400:
        raise ValueError(f"must be from 0 to a year of seconds, got {n}")
    return n


SASL_CLIENT_MODES = ("relay", "terminate")


def sasl_client_mode(value: Any) -> str:
    mode = string(value).lower()
    if mode not in SASL_CLIENT_MODES:
        raise ValueError(f"must be relay or terminate, got {excerpt(value)}")
    return mode


def sasl_client_mechanisms(value: Any) -> tuple[str, ...]:
    """Mechanisms terminate mode offers, each once: a list, or names separated by commas."""
    from kproxy.config.sections import CLIENT_MECHANISMS

    items = value if isinstance(value, list) else [value]
    names = [part.strip().upper() for item in items for part in string(item).split(",") if part.strip()]
    problems = []
    for name in names:
        if name == "OAUTHBEARER":
            problems.append("OAUTHBEARER is not offered in terminate mode (kproxy would have to validate the "
                            "tokens' issuer and signature): relay it to the broker (sasl.client.mode relay)")
        elif name not in CLIENT_MECHANISMS:
            problems.append(f"{excerpt(name)} is not a mechanism kproxy checks ({', '.join(CLIENT_MECHANISMS)})")
    if problems:
        raise ValueError(*problems)
    if not names:
        raise ValueError(f"needs at least one of {', '.join(CLIENT_MECHANISMS)}")
    return tuple(dict.fromkeys(names))


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_LEVEL_ALIASES = {"warn": "warning"}  # what Go and Java tools call it
LOG_FORMATS = ("logfmt", "json")


def log_level(value: Any) -> str:
    level = string(value).lower()
    level = LOG_LEVEL_ALIASES.get(level, level)
    if level not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}, got {excerpt(value)}")
    return level


def log_format(value: Any) -> str:
    fmt = string(value).lower()
    if fmt not in LOG_FORMATS:
        raise ValueError(f"must be one of {', '.join(LOG_FORMATS)}, got {excerpt(value)}")
    return fmt


READY_CLUSTERS = ("all", "any")


def ready_clusters(value: Any) -> str:
    """When /readyz says ready with several clusters: ``all`` their upstreams reachable, or ``any``."""
    word = string(value).lower()
    if word not in READY_CLUSTERS:
        raise ValueError(f"must be one of {', '.join(READY_CLUSTERS)}, got {excerpt(value)}")
    return word


# -- how --help shows a default --------------------------------------------------------------
def as_is(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def as_bytes(value: Any) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2)):
        if value and value % size == 0:
            return f"{value // size} {unit}"
    return str(value)
