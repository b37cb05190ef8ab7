"""kproxy's configuration: one table of options, read from YAML and from flags alike.

Every option is declared once in :data:`OPTIONS` with its YAML path, its flag,
its parser and its help; the YAML loader and the ``kproxy run`` argument parser
are both derived from that table, so no option exists in one and not the
other, and each option can also come from an environment variable named
after its path (``limits.max_in_flight`` -> ``KPROXY_LIMITS_MAX_IN_FLIGHT``, see
:func:`env_name`). Precedence: built-in default < config file < environment < flag.

Invalid configuration is refused before anything starts, with the file, the
key and the reason (:class:`ConfigError`), e.g.
``kproxy.yaml: limits.max_in_flight: must be an integer >= 1, got 'many'``;
every problem found is reported at once, not only the first.

Size (over ~500 lines): the option table and its parsers, kept together: one fact, one file.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kproxy.host_port import HostPort, parse_host_port
from kproxy.protocol.framing import DEFAULT_MAX_FRAME_SIZE

if TYPE_CHECKING:
    from kproxy.rules import RuleSet


class ConfigError(Exception):
    """Configuration that kproxy refuses to start with; the message names where and why.

    ``problems`` holds every problem found (one line each); the message joins them.
    """

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems: tuple[str, ...] = problems


@dataclass(frozen=True)
class ClientTls:
    """TLS towards clients (kproxy is the server)."""

    cert: Path | None = None
    key: Path | None = None
    client_ca: Path | None = None
    require_client_cert: bool = False

    @property
    def enabled(self) -> bool:
        return self.cert is not None


@dataclass(frozen=True)
class UpstreamTls:
    """TLS towards brokers (kproxy is the client). Verification is on unless turned off."""

    enabled: bool = False
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None
    verify: bool = True


@dataclass(frozen=True)
class Limits:
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_in_flight: int = 1000
    max_connections: int = 0  # 0: no cap but the process's descriptor limit
    max_http_connections: int = 64  # per HTTP listener (metrics, admin): descriptors Kafka clients keep
    idle_timeout: float = 600.0
    frame_timeout: float = 30.0
    connect_timeout: float = 10.0
    shutdown_grace: float = 30.0
    read_size: int = 256 * 1024


@dataclass(frozen=True)
class MetricsOptions:
    """Opt-in labels (bounded by ``label_cap`` values each, the rest counted as 'other')."""

    client_id_label: bool = False
    topic_label: bool = False
    label_cap: int = 100
    scan_responses: bool = True
    process_metrics: bool = False


@dataclass(frozen=True)
class CaptureOptions:
    """Traffic capture (off unless ``dir`` is set); see :mod:`kproxy.capture.writer`."""

    dir: Path | None = None
    max_bytes_total: int = 10 * 1024**3
    rotate_bytes: int = 128 * 1024**2
    rotate_seconds: float = 300.0
    queue_size: int = 10_000
    include_payloads: bool = False
    payload_max_bytes: int = 1024

    @property
    def enabled(self) -> bool:
        return self.dir is not None


@dataclass(frozen=True)
class AdminOptions:
    """The admin HTTP API (kproxy/admin/): off unless ``listen`` is set. A listener on any
    address but loopback needs a bearer token (``token`` or ``token_file``)."""

    listen: HostPort | None = None
    token: str | None = None
    token_file: Path | None = None

    def bearer_token(self) -> str | None:
        """The token requests must carry (the file's first line, read now), or None."""
        if self.token_file is not None:
            return self.token_file.read_text(encoding="utf-8").strip() or None
        return self.token


@dataclass(frozen=True)
class Config:
    upstream: tuple[HostPort, ...]
    listen: HostPort = field(default_factory=lambda: HostPort("127.0.0.1", 19092))
    advertised_host: str | None = None
    broker_port_base: int | None = None
    broker_ports: Mapping[int, int] = field(default_factory=dict)
    metrics_listen: HostPort | None = None
    upstream_check_interval: float = 10.0
    log_level: str = "info"
    log_format: str = "logfmt"
    limits: Limits = field(default_factory=Limits)
    metrics: MetricsOptions = field(default_factory=MetricsOptions)
    client_tls: ClientTls = field(default_factory=ClientTls)
    upstream_tls: UpstreamTls = field(default_factory=UpstreamTls)
    capture: CaptureOptions = field(default_factory=CaptureOptions)
    admin: AdminOptions = field(default_factory=AdminOptions)
    rules: RuleSet | None = None  # fault injection (kproxy/server/rule_policy.py); None: none
    rules_max_bytes: int = 16 * 1024**2  # kproxy.rules.reading.DEFAULT_MAX_BYTES (rules are imported lazily)

    @property
    def advertised(self) -> str:
        """What clients are told: the configured host, else the listen host (``localhost``
        when listening on a wildcard address, which no client can connect to)."""
        if self.advertised_host:
            return self.advertised_host
        return "localhost" if self.listen.host in ("0.0.0.0", "::", "") else self.listen.host

    @property
    def first_broker_port(self) -> int:
        """``broker_port_base`` or, by default, the port after the bootstrap port (0 = ephemeral)."""
        if self.broker_port_base is not None:
            return self.broker_port_base
        return 0 if self.listen.port == 0 else self.listen.port + 1


# -- value parsers: each raises ValueError with a short reason -----------------------------
def _int(lo: int, hi: int | None = None) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(f"must be an integer, got {value!r}")
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"must be an integer >= {lo}, got {value!r}") from None
        if n < lo or (hi is not None and n > hi):
            raise ValueError(f"must be between {lo} and {hi}, got {n}" if hi else f"must be >= {lo}, got {n}")
        return n
    return parse


def _seconds(value: Any) -> float:
    try:
        n = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number of seconds, got {value!r}") from None
    if n <= 0:
        raise ValueError(f"must be > 0 seconds, got {n}")
    return n


_BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def _bool(value: Any) -> bool:
    if isinstance(value, bool) or str(value).lower() in _BOOL_WORDS:
        return value if isinstance(value, bool) else _BOOL_WORDS[str(value).lower()]
    raise ValueError(f"must be true or false, got {value!r}")


def _str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def _path(value: Any) -> Path:
    path = Path(_str(value))
    if not path.exists():
        raise ValueError(f"file {str(path)!r} does not exist")
    return path


def _directory(value: Any) -> Path:
    path = Path(_str(value))
    if path.exists() and not path.is_dir():
        raise ValueError(f"{str(path)!r} is not a directory")
    return path


def _address(value: Any) -> HostPort:
    return parse_host_port(_str(value))


def _listen_address(value: Any) -> HostPort:
    return parse_host_port(_str(value), allow_port_zero=True)  # port 0: let the OS choose (tests)


def _addresses(value: Any) -> tuple[HostPort, ...]:
    items = value if isinstance(value, list) else [value]
    out: list[HostPort] = []
    for item in items:
        out.extend(parse_host_port(part) for part in _str(item).split(",") if part.strip())
    if not out:
        raise ValueError("needs at least one host:port")
    return tuple(out)


def _broker_ports(value: Any) -> dict[int, int]:
    """YAML mapping ``{node_id: port}``, or flags ``NODE=PORT`` (repeatable)."""
    if isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        pairs = []
        for item in value if isinstance(value, list) else [value]:
            node, sep, port = str(item).partition("=")
            if not sep:
                raise ValueError(f"expected NODE_ID=PORT, got {item!r}")
            pairs.append((node, port))
    return {_int(0)(node): _int(1, 65535)(port) for node, port in pairs}


def _rules(value: Any, max_bytes: int = Config.rules_max_bytes) -> RuleSet:
    """A rule file, or a directory of them (a mounted ConfigMap; kproxy/rules/sources.py) of at most
    ``max_bytes``, loaded now: a bad one is a start-up error listing every problem as ``file:line: key:
    reason``, as ``kproxy rules check`` prints them. The server watches the set's ``source`` (the path)."""
    from kproxy.rules import RulesError
    from kproxy.rules.sources import load_path

    try:
        return load_path(_str(value), max_bytes)
    except RulesError as exc:
        raise ValueError(*(str(p) for p in exc.problems)) from None


_LOG_LEVELS = ("debug", "info", "warning", "error")
_LOG_LEVEL_ALIASES = {"warn": "warning"}  # what Go and Java tools call it
LOG_FORMATS = ("logfmt", "json")


def _log_level(value: Any) -> str:
    level = _str(value).lower()
    level = _LOG_LEVEL_ALIASES.get(level, level)
    if level not in _LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(_LOG_LEVELS)}, got {value!r}")
    return level


def _as_is(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _bytes(value: Any) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2)):
        if value and value % size == 0:
            return f"{value // size} {unit}"
    return str(value)


def _log_format(value: Any) -> str:
    fmt = _str(value).lower()
    if fmt not in LOG_FORMATS:
        raise ValueError(f"must be one of {', '.join(LOG_FORMATS)}, got {value!r}")
    return fmt


@dataclass(frozen=True)
class Option:
    """One option: its YAML path (dotted), flag, parser, and help.

    ``switch`` is the value a flag that takes no argument sets (``--upstream-tls``:
    True, ``--upstream-no-verify``: False); None for a flag that takes a value.
    ``show_default`` renders the built-in default (read from the dataclasses above,
    never written twice) at the end of the help, followed by ``default_note``.
    """

    path: str
    flag: str
    parse: Callable[[Any], Any]
    help: str
    metavar: str | None = None
    repeatable: bool = False
    switch: bool | None = None
    show_default: Callable[[Any], str] | None = None
    default_note: str = ""

    @property
    def full_help(self) -> str:
        if self.show_default is None:
            return self.help
        return f"{self.help} (default {self.show_default(builtin_default(self.path))}{self.default_note})"


_SECTIONS: dict[str, Any] = {"limits": Limits(), "metrics": MetricsOptions(), "tls.client": ClientTls(),
                             "tls.upstream": UpstreamTls(), "capture": CaptureOptions(), "admin": AdminOptions()}


def builtin_default(path: str) -> Any:
    """The value an option has when neither the config file nor a flag sets it."""
    section, _, name = path.rpartition(".")
    if section:
        return getattr(_SECTIONS[section], name)
    found = {f.name: f for f in fields(Config)}[name]
    return found.default_factory() if found.default_factory is not MISSING else found.default


OPTIONS: tuple[Option, ...] = (
    Option("upstream", "--upstream", _addresses,
           "upstream bootstrap broker(s), HOST:PORT; repeatable or comma-separated", "HOST:PORT", repeatable=True),
    Option("listen", "--listen", _listen_address, "bootstrap listener address", "HOST:PORT",
           show_default=_as_is),
    Option("advertised_host", "--advertised-host", _str,
           "host name clients are told to connect to (default: the listen host, or localhost)", "HOST"),
    Option("broker_port_base", "--broker-port-base", _int(0, 65535),
           "port of broker node 0; broker N listens on BASE+N (default: listen port + 1; 0 = ephemeral)", "PORT"),
    Option("broker_ports", "--broker-port", _broker_ports,
           "pin a broker's local port, NODE_ID=PORT; repeatable", "NODE=PORT", repeatable=True),
    Option("metrics_listen", "--metrics-listen", _address,
           "HTTP address of /metrics, /healthz and /readyz", "HOST:PORT"),
    Option("rules", "--rules", _rules,
           "YAML fault-injection rules (format: rules/README.md): a file, or a directory whose *.yaml/*.yml "
           "files are merged in name order; reloaded when they change and on SIGHUP", "PATH"),
    Option("rules_max_bytes", "--rules-max-bytes", _int(1), "largest rules source read (a file, or a directory's "
           "files together); a bigger one is refused (reloads keep the rules in force)", "BYTES", show_default=_bytes),
    Option("admin.listen", "--admin-listen", _listen_address,
           "HTTP address of the admin API (rules changed while kproxy runs: docs/ADMIN.md); off by default. "
           "Any address but loopback needs --admin-token-file", "HOST:PORT"),
    Option("admin.token_file", "--admin-token-file", _path,
           "file holding the bearer token admin API requests must carry", "FILE"),
    Option("admin.token", "--admin-token", _str,
           "the bearer token itself (visible in ps: prefer --admin-token-file or KPROXY_ADMIN_TOKEN)", "TOKEN"),
    Option("capture.dir", "--capture-dir", _directory,
           "capture every request/response pair to Parquet files here (needs the 'capture' extra)", "DIR"),
    Option("capture.max_bytes_total", "--capture-max-bytes", _int(1024),
           "disk cap of all capture files; the oldest are deleted first", "BYTES", show_default=_bytes),
    Option("capture.rotate_bytes", "--capture-rotate-bytes", _int(1024),
           "start a new capture file at this size", "BYTES", show_default=_bytes),
    Option("capture.rotate_seconds", "--capture-rotate-seconds", _seconds,
           "start a new capture file after this long", "SECONDS", show_default=_as_is),
    Option("capture.queue_size", "--capture-queue-size", _int(1),
           "records waiting for the writer before new ones are dropped (and counted)", "N", show_default=_as_is),
    Option("capture.include_payloads", "--capture-payloads", _bool,
           "also capture record keys and values (off by default: privacy)", switch=True),
    Option("capture.payload_max_bytes", "--capture-payload-max-bytes", _int(0),
           "bytes kept of each captured key and value", "BYTES", show_default=_as_is),
    Option("metrics.client_id_label", "--metrics-client-id-label", _bool,
           "label request counts by client id (capped by --metrics-label-cap)", switch=True),
    Option("metrics.topic_label", "--metrics-topic-label", _bool,
           "label response errors by topic (capped by --metrics-label-cap)", switch=True),
    Option("metrics.label_cap", "--metrics-label-cap", _int(1, 100_000),
           "distinct client ids / topics per label before the rest count as 'other'", "N", show_default=_as_is),
    Option("metrics.scan_responses", "--metrics-no-error-scan", _bool,
           "do NOT scan response bodies for error codes (saves CPU on huge Metadata responses)", switch=False),
    Option("upstream_check_interval", "--upstream-check-interval", _seconds,
           "how often every upstream (bootstrap servers and known brokers) is checked with one connect, for "
           "/readyz and kproxy_upstream_up", "SECONDS", show_default=_as_is),
    Option("metrics.process_metrics", "--metrics-process", _bool,
           "also export the process's CPU, memory, open fds and the Python GC (process_*, python_gc_*)",
           switch=True),
    Option("log_level", "--log-level", _log_level,
           f"{', '.join(_LOG_LEVELS[:-1])} (or {', '.join(_LOG_LEVEL_ALIASES)}) or {_LOG_LEVELS[-1]}", "LEVEL",
           show_default=_as_is),
    Option("log_format", "--log-format", _log_format,
           "logfmt (key=value) or json (one object per line)", "FORMAT", show_default=_as_is),
    Option("limits.max_frame_size", "--max-frame-size", _int(1024),
           "largest frame accepted in either direction, bytes", "BYTES", show_default=_bytes),
    Option("limits.max_in_flight", "--max-in-flight", _int(1),
           "requests in flight per client connection before kproxy stops reading it", "N", show_default=_as_is),
    Option("limits.max_connections", "--max-connections", _int(0),
           "client connections open at once, all listeners together; more are closed as soon as accepted",
           "N", show_default=_as_is, default_note=": no cap"),
    Option("limits.max_http_connections", "--max-http-connections", _int(1), "connections open at once on "
           "each HTTP listener (metrics, admin API); more are closed as soon as accepted", "N", show_default=_as_is),
    Option("limits.idle_timeout", "--idle-timeout", _seconds,
           "close a connection idle this long in both directions", "SECONDS", show_default=_as_is),
    Option("limits.frame_timeout", "--frame-timeout", _seconds,
           "a request frame must arrive whole within this long of its first byte, or the connection "
           "closes", "SECONDS", show_default=_as_is),
    Option("limits.connect_timeout", "--connect-timeout", _seconds,
           "upstream connect (and TLS handshake) timeout", "SECONDS", show_default=_as_is),
    Option("limits.shutdown_grace", "--shutdown-grace", _seconds,
           "on SIGTERM, how long in-flight requests may take to finish", "SECONDS", show_default=_as_is),
    Option("tls.client.cert", "--tls-cert", _path, "serve TLS to clients with this certificate (PEM)", "FILE"),
    Option("tls.client.key", "--tls-key", _path, "private key of --tls-cert (PEM)", "FILE"),
    Option("tls.client.client_ca", "--tls-client-ca", _path,
           "verify client certificates against this CA (PEM)", "FILE"),
    Option("tls.client.require_client_cert", "--tls-require-client-cert", _bool,
           "refuse clients without a certificate signed by --tls-client-ca", switch=True),
    Option("tls.upstream.enabled", "--upstream-tls", _bool, "connect to brokers with TLS", switch=True),
    Option("tls.upstream.ca", "--upstream-ca", _path, "CA bundle that signs the brokers' certificates", "FILE"),
    Option("tls.upstream.cert", "--upstream-cert", _path, "client certificate for brokers (mTLS)", "FILE"),
    Option("tls.upstream.key", "--upstream-key", _path, "private key of --upstream-cert", "FILE"),
    Option("tls.upstream.server_name", "--upstream-server-name", _str,
           "SNI and verified name for brokers (default: each broker's host)", "NAME"),
    Option("tls.upstream.verify", "--upstream-no-verify", _bool,
           "do NOT verify broker certificates (staging only)", switch=False),
)
_BY_PATH = {o.path: o for o in OPTIONS}


def _flatten(data: Mapping[str, Any], prefix: str, source: str, problems: list[str]) -> dict[str, Any]:
    """Option values keyed by dotted path; every unknown key or misplaced value goes to ``problems``."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        section = [p[len(path) + 1:] for p in _BY_PATH if p.startswith(path + ".")]
        if path in _BY_PATH:
            out[path] = value
        elif section and isinstance(value, Mapping):
            out.update(_flatten(value, path + ".", source, problems))
        elif section:
            problems.append(f"{source}: {path}: is a section of options ({', '.join(section)}), "
                            f"not a {type(value).__name__} ({value!r})")
        else:
            # Sections are candidates too: "metrcs" means the metrics section, not metrics_listen.
            sections = {p.rsplit(".", i)[0] for p in _BY_PATH for i in range(1, p.count(".") + 1)}
            known = [p for p in (*_BY_PATH, *sections) if p.startswith(prefix)] or list(_BY_PATH)
            hint = difflib.get_close_matches(path, known, n=1)
            suggestion = f" (did you mean {hint[0]}?)" if hint else ""
            problems.append(f"{source}: {path}: unknown key{suggestion}")
    return out


def env_name(path: str) -> str:
    """The environment variable of an option: ``limits.max_in_flight`` -> ``KPROXY_LIMITS_MAX_IN_FLIGHT``."""
    return "KPROXY_" + path.replace(".", "_").upper()


_BY_ENV = {env_name(o.path): o for o in OPTIONS}


def read_environment(environ: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    """Option values set by ``KPROXY_*`` variables, with where each came from.

    Values are read as the YAML file's would be (``KPROXY_TLS_UPSTREAM_VERIFY=false``);
    options that take several values take them comma-separated. Other ``KPROXY_*``
    variables are not options and are left alone.
    """
    out: dict[str, tuple[Any, str]] = {}
    for name, text in environ.items():
        opt = _BY_ENV.get(name)
        if opt is None:
            continue
        value: Any = [part.strip() for part in text.split(",") if part.strip()] if opt.repeatable else text
        out[opt.path] = (value, f"environment {name}")
    return out


def read_config_file(path: Path) -> dict[str, Any]:
    """Raw values from a YAML file, keyed by dotted option path (not parsed yet)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{where}: invalid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: the top level must be a mapping of options, got {type(data).__name__}")
    problems: list[str] = []
    values = _flatten(data, "", str(path), problems)
    if problems:
        raise ConfigError(*problems)
    return values


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config`` and one flag per option to ``kproxy run``'s parser."""
    parser.add_argument("--config", type=Path, metavar="FILE", help="YAML configuration file")
    for opt in OPTIONS:
        dest = opt.path.replace(".", "__")
        if opt.switch is not None:
            parser.add_argument(opt.flag, dest=dest, action="store_const", const=opt.switch, default=None,
                                help=opt.full_help)
        elif opt.repeatable:
            parser.add_argument(opt.flag, dest=dest, action="append", metavar=opt.metavar, help=opt.full_help)
        else:
            parser.add_argument(opt.flag, dest=dest, metavar=opt.metavar, help=opt.full_help)


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Config:
    """Merge defaults, ``--config``, ``KPROXY_*`` variables (``environ``, default the process's)
    and flags, in that order of precedence; raises :class:`ConfigError` with every problem."""
    raw: dict[str, tuple[Any, str]] = {}
    if args.config is not None:
        for path, value in read_config_file(args.config).items():
            raw[path] = (value, f"{args.config}: {path}")
    raw.update(read_environment(os.environ if environ is None else environ))
    for opt in OPTIONS:
        value = getattr(args, opt.path.replace(".", "__"), None)
        if value is not None:
            raw[opt.path] = (value, opt.flag)
    return build_config(raw)


def build_config(raw: Mapping[str, tuple[Any, str]]) -> Config:
    """Parse raw values (with where each came from) into a validated :class:`Config`."""
    parsed: dict[str, Any] = {}
    problems: list[str] = []
    for path, (value, where) in sorted(raw.items(), key=lambda item: item[0] == "rules"):  # rules last:
        try:  # they are read under rules_max_bytes
            parsed[path] = (_BY_PATH[path].parse(value) if path != "rules" else
                            _rules(value, parsed.get("rules_max_bytes", Config.rules_max_bytes)))
        except ValueError as exc:
            problems.extend(f"{where}: {arg}" for arg in exc.args or (exc,))
    if "upstream" not in raw:
        problems.append(f"upstream: required (--upstream HOST:PORT, 'upstream:' in the config file, or "
                        f"{env_name('upstream')})")
    if problems:
        raise ConfigError(*problems)

    def section(prefix: str) -> dict[str, Any]:
        return {p[len(prefix):]: v for p, v in parsed.items() if p.startswith(prefix)}

    client_tls = ClientTls(**section("tls.client."))
    if (client_tls.cert is None) != (client_tls.key is None):
        problems.append("tls.client: cert and key go together (--tls-cert with --tls-key)")
    if client_tls.require_client_cert and client_tls.client_ca is None:
        problems.append("tls.client.require_client_cert: needs tls.client.client_ca (--tls-client-ca)")
    upstream_tls = UpstreamTls(**section("tls.upstream."))
    if (upstream_tls.cert is None) != (upstream_tls.key is None):
        problems.append("tls.upstream: cert and key go together (--upstream-cert with --upstream-key)")
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
