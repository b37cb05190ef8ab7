"""The option table: every option of ``kproxy run`` once, named by its YAML path.

An option's flag and environment variable are derived from its YAML path and never written
by hand, so the three cannot disagree:

* ``capture.max_bytes_total`` -> ``--capture-max-bytes-total`` and ``KPROXY_CAPTURE_MAX_BYTES_TOTAL``;
* a boolean option is a pair of flags, ``--tls-upstream-verify`` / ``--no-tls-upstream-verify``.

An option may keep earlier flags as :class:`Alias` es: they still work for one release, and
using one prints a line naming the option's flag (:mod:`kproxy.config.flags`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any

from kproxy.config import values as v
from kproxy.config.sections import (
    CLUSTER_PORT_COUNT,
    AdminOptions,
    CaptureOptions,
    ClientTls,
    Config,
    Limits,
    MetricsOptions,
    SaslClient,
    SaslUpstream,
    UpstreamTls,
)

ENV_PREFIX = "KPROXY_"


def flag_name(path: str) -> str:
    """The flag of an option: ``capture.max_bytes_total`` -> ``--capture-max-bytes-total``."""
    return "--" + path.replace(".", "-").replace("_", "-")


def env_name(path: str) -> str:
    """The environment variable of an option: ``limits.max_in_flight`` -> ``KPROXY_LIMITS_MAX_IN_FLIGHT``."""
    return ENV_PREFIX + path.replace(".", "_").upper()


@dataclass(frozen=True)
class Alias:
    """A deprecated flag of an option, kept working for one release.

    ``sets`` is the value a flag that takes no argument gives its boolean option
    (``--upstream-no-verify``: False); None for a flag that takes a value.
    """

    flag: str
    sets: bool | None = None


@dataclass(frozen=True)
class Option:
    """One option: its YAML path (dotted), parser, help and deprecated flags.

    ``boolean`` options take no argument on the command line: ``--X`` sets true, ``--no-X``
    false. ``show_default`` renders the built-in default (read from :mod:`kproxy.config.sections`,
    never written twice) at the end of the help, followed by ``default_note``.
    """

    path: str
    parse: Callable[[Any], Any]
    help: str
    metavar: str | None = None
    repeatable: bool = False
    boolean: bool = False
    show_default: Callable[[Any], str] | None = None
    default_note: str = ""
    aliases: tuple[Alias, ...] = ()

    @property
    def flag(self) -> str:
        return flag_name(self.path)

    @property
    def negative_flag(self) -> str | None:
        """``--no-X`` of a boolean option; None for the others."""
        return "--no-" + self.flag[2:] if self.boolean else None

    @property
    def env(self) -> str:
        return env_name(self.path)

    @property
    def dest(self) -> str:
        """The attribute of the parsed flags that holds the option's value."""
        return self.path.replace(".", "__")

    @property
    def full_help(self) -> str:
        """The help with the built-in default (a boolean's as on or off), when it has one to show."""
        if self.boolean:
            return f"{self.help} (default {'on' if builtin_default(self.path) else 'off'})"
        if self.show_default is None:
            return self.help
        return f"{self.help} (default {self.show_default(builtin_default(self.path))}{self.default_note})"


_SECTIONS: dict[str, Any] = {"limits": Limits(), "metrics": MetricsOptions(), "tls.client": ClientTls(),
                             "tls.upstream": UpstreamTls(), "capture": CaptureOptions(), "admin": AdminOptions(),
                             "sasl.upstream": SaslUpstream(), "sasl.client": SaslClient()}


def builtin_default(path: str) -> Any:
    """The value an option has when neither the config file nor a flag sets it."""
    section, _, name = path.rpartition(".")
    if section:
        return getattr(_SECTIONS[section], name)
    found = {f.name: f for f in fields(Config)}[name]
    return found.default_factory() if found.default_factory is not MISSING else found.default


_LEVELS = f"{', '.join(v.LOG_LEVELS[:-1])} (or {', '.join(v.LOG_LEVEL_ALIASES)}) or {v.LOG_LEVELS[-1]}"

OPTIONS: tuple[Option, ...] = (
    Option("upstream", v.addresses,
           "upstream bootstrap broker(s), HOST:PORT; repeatable or comma-separated", "HOST:PORT", repeatable=True),
    Option("listen", v.listen_address, "bootstrap listener address", "HOST:PORT", show_default=v.as_is),
    Option("advertised_host", v.string,
           "host name clients are told to connect to (default: the listen host, or localhost)", "HOST"),
    Option("broker_port_base", v.integer(0, 65535),
           "port of broker node 0; broker N listens on BASE+N (default: listen port + 1; 0 = ephemeral)", "PORT"),
    Option("broker_port_count", v.integer(1, 65535),
           "local ports kept for brokers from the first (BASE..BASE+COUNT-1): node ids past them, and "
           "brokers past a node id's own port, take the first free port of the range (default: up to 65535; "
           f"{CLUSTER_PORT_COUNT} for each cluster of clusters:)", "COUNT"),
    Option("broker_ports", v.broker_ports, "pin a broker's local port, NODE_ID=PORT; repeatable", "NODE=PORT",
           repeatable=True, aliases=(Alias("--broker-port"),)),
    Option("metrics_listen", v.address, "HTTP address of /metrics, /healthz and /readyz", "HOST:PORT"),
    Option("rules", v.rules,
           "YAML fault-injection rules (`kproxy rules check PATH` validates them): a file, or a directory whose "
           "*.yaml/*.yml files are merged in name order; reloaded when they change and on SIGHUP", "PATH"),
    Option("rules_max_bytes", v.integer(1), "largest rules source read (a file, or a directory's files "
           "together); a bigger one is refused (reloads keep the rules in force)", "BYTES", show_default=v.as_bytes),
    Option("admin.listen", v.listen_address,
           "HTTP address of the admin API (rules changed while kproxy runs: `kproxy rules --help`); off by "
           "default. Any address but loopback needs --admin-token-file", "HOST:PORT"),
    Option("admin.token_file", v.existing_file, "file holding the bearer token admin API requests must carry",
           "FILE"),
    Option("admin.token", v.string,
           "the bearer token itself (visible in ps: prefer --admin-token-file or KPROXY_ADMIN_TOKEN)", "TOKEN"),
    Option("capture.dir", v.directory,
           "capture every request/response pair to Parquet files here (needs the 'capture' extra)", "DIR"),
    Option("capture.max_bytes_total", v.integer(1024), "disk cap of all capture files; the oldest are deleted "
           "first", "BYTES", show_default=v.as_bytes, aliases=(Alias("--capture-max-bytes"),)),
    Option("capture.rotate_bytes", v.integer(1024),
           "start a new capture file at this size", "BYTES", show_default=v.as_bytes),
    Option("capture.rotate_seconds", v.seconds,
           "start a new capture file after this long", "SECONDS", show_default=v.as_is),
    Option("capture.queue_size", v.integer(1),
           "records waiting for the writer before new ones are dropped (and counted)", "N", show_default=v.as_is),
    Option("capture.include_payloads", v.boolean, "also capture record keys and values (private data: "
           "mind who reads the files)", boolean=True, aliases=(Alias("--capture-payloads", sets=True),)),
    Option("capture.payload_max_bytes", v.integer(0),
           "bytes kept of each captured key and value", "BYTES", show_default=v.as_is),
    Option("capture.process", v.boolean, "read and write the capture in a process of its own at a lower "
           "priority; --no-capture-process: in a thread sharing the proxy's GIL (less memory, more latency "
           "under load)", boolean=True),
    Option("metrics.client_id_label", v.boolean,
           "label request counts, traffic, producer batches and client software by client id (capped by "
           "--metrics-label-cap)", boolean=True),
    Option("metrics.topic_label", v.boolean,
           "label response errors and traffic by topic (capped by --metrics-label-cap)", boolean=True),
    Option("metrics.label_cap", v.integer(1, 100_000),
           "distinct client ids / topics per label before the rest count as 'other'", "N", show_default=v.as_is),
    Option("metrics.scan_responses", v.boolean, "scan response bodies for error codes (off saves CPU on "
           "huge Metadata responses)", boolean=True,
           aliases=(Alias("--metrics-no-error-scan", sets=False),)),
    Option("metrics.consumer_lag", v.boolean,
           "export consumer lag (kproxy_consumergroup_*, kproxy_partition_high_watermark) from the offsets "
           "groups commit and the partitions' ends Fetch and Produce answers carry (needs "
           "--metrics-scan-responses)",
           boolean=True),
    Option("metrics.consumer_lag_partitions", v.boolean,
           "also export kproxy_consumergroup_lag per partition (groups and topics capped by "
           "--metrics-label-cap)", boolean=True),
    Option("metrics.consumer_lag_stale_after", v.seconds,
           "consumer-lag series disappear when kproxy has not seen their watermark again, or their group "
           "(a commit, or a member the broker accepted), for this long", "SECONDS", show_default=v.as_is),
    Option("metrics.client_anomalies", v.boolean,
           "detect client bugs and misconfigurations on the wire and count them in "
           "kproxy_client_anomalies_total{kind,client_id} (client ids capped by --metrics-label-cap; the "
           "error-code kinds need --metrics-scan-responses)", boolean=True),
    Option("metrics.client_anomalies_churn_per_minute", v.integer(1),
           "connections of one client id closed within a minute that count as connection churn", "N",
           show_default=v.as_is),
    Option("metrics.client_anomalies_forbid_acks0", v.boolean,
           "count a connection's Produce requests with acks=0 as a client anomaly (acks0_producer)", boolean=True),
    Option("metrics.client_anomalies_require_compression", v.boolean,
           "count a connection's Produce batches without compression as a client anomaly "
           "(uncompressed_producer)", boolean=True),
    Option("metrics.client_anomalies_rebalance_joins", v.integer(2),
           "JoinGroups of one group answered within --metrics-client-anomalies-rebalance-window that count as a "
           "rebalance storm (one per member per rebalance)", "N", show_default=v.as_is),
    Option("metrics.client_anomalies_rebalance_window", v.seconds,
           "the window of --metrics-client-anomalies-rebalance-joins", "SECONDS", show_default=v.as_is),
    Option("metrics.client_anomalies_retries_per_minute", v.integer(1),
           "idempotent batches of one client id sent again (same producer id, sequence and CRC) within a "
           "minute that count as a retry storm", "N", show_default=v.as_is),
    Option("upstream_check_interval", v.seconds,
           "how often every upstream (bootstrap servers and known brokers) is checked with one connect, for "
           "/readyz and kproxy_upstream_up (in terminate mode also one ApiVersions, which clients are answered "
           "before their login)", "SECONDS", show_default=v.as_is),
    Option("ready_clusters", v.ready_clusters,
           "with several clusters (clusters:), /readyz is ready when the upstream of all of them is reachable "
           "(all), or of at least one (any)", "all|any", show_default=v.as_is),
    Option("metrics.process_metrics", v.boolean,
           "also export the process's CPU, memory, open fds and the Python GC (process_*, python_gc_*)",
           boolean=True, aliases=(Alias("--metrics-process", sets=True),)),
    Option("log_level", v.log_level, _LEVELS, "LEVEL", show_default=v.as_is),
    Option("log_format", v.log_format,
           "logfmt (key=value) or json (one object per line)", "FORMAT", show_default=v.as_is),
    Option("limits.max_frame_size", v.integer(1024), "largest frame accepted in either direction, bytes",
           "BYTES", show_default=v.as_bytes, aliases=(Alias("--max-frame-size"),)),
    Option("limits.max_in_flight", v.integer(1),
           "requests in flight per client connection before kproxy stops reading it", "N", show_default=v.as_is,
           aliases=(Alias("--max-in-flight"),)),
    Option("limits.max_connections", v.integer(0),
           "client connections open at once, all listeners together; more are closed as soon as accepted",
           "N", show_default=v.as_is, default_note=": no cap", aliases=(Alias("--max-connections"),)),
    Option("limits.max_http_connections", v.integer(1), "connections open at once on each HTTP listener "
           "(metrics, admin API); more are closed as soon as accepted", "N", show_default=v.as_is,
           aliases=(Alias("--max-http-connections"),)),
    Option("limits.idle_timeout", v.seconds, "close a connection idle this long in both directions", "SECONDS",
           show_default=v.as_is, aliases=(Alias("--idle-timeout"),)),
    Option("limits.frame_timeout", v.seconds, "a request frame must arrive whole within this long of its "
           "first byte, or the connection closes", "SECONDS", show_default=v.as_is,
           aliases=(Alias("--frame-timeout"),)),
    Option("limits.connect_timeout", v.seconds, "upstream connect (and TLS handshake) timeout", "SECONDS",
           show_default=v.as_is, aliases=(Alias("--connect-timeout"),)),
    Option("limits.shutdown_grace", v.seconds, "on SIGTERM, how long in-flight requests may take to finish",
           "SECONDS", show_default=v.as_is, aliases=(Alias("--shutdown-grace"),)),
    Option("tls.client.cert", v.existing_file, "serve TLS to clients with this certificate (PEM)", "FILE",
           aliases=(Alias("--tls-cert"),)),
    Option("tls.client.key", v.existing_file, "private key of --tls-client-cert (PEM)", "FILE",
           aliases=(Alias("--tls-key"),)),
    Option("tls.client.client_ca", v.existing_file, "verify client certificates against this CA (PEM)", "FILE",
           aliases=(Alias("--tls-client-ca"),)),
    Option("tls.client.require_client_cert", v.boolean,
           "refuse clients without a certificate signed by --tls-client-client-ca", boolean=True,
           aliases=(Alias("--tls-require-client-cert", sets=True),)),
    Option("tls.upstream.enabled", v.boolean, "connect to brokers with TLS", boolean=True,
           aliases=(Alias("--upstream-tls", sets=True),)),
    Option("tls.upstream.ca", v.existing_file, "CA bundle that signs the brokers' certificates", "FILE",
           aliases=(Alias("--upstream-ca"),)),
    Option("tls.upstream.cert", v.existing_file, "client certificate for brokers (mTLS)", "FILE",
           aliases=(Alias("--upstream-cert"),)),
    Option("tls.upstream.key", v.existing_file, "private key of --tls-upstream-cert", "FILE",
           aliases=(Alias("--upstream-key"),)),
    Option("tls.upstream.server_name", v.string,
           "SNI and verified name for brokers (default: each broker's host)", "NAME",
           aliases=(Alias("--upstream-server-name"),)),
    Option("tls.upstream.verify", v.boolean, "verify broker certificates (off: for staging only)", boolean=True,
           aliases=(Alias("--upstream-no-verify", sets=False),)),
    Option("sasl.upstream.mechanism", v.sasl_mechanism,
           "log in to the brokers for clients that do not do SASL themselves: PLAIN, SCRAM-SHA-256, "
           "SCRAM-SHA-512 or OAUTHBEARER; off by default", "MECHANISM"),
    Option("sasl.upstream.username", v.string, "the user kproxy logs in as (PLAIN, SCRAM)", "USER"),
    Option("sasl.upstream.password_file", v.existing_file,
           "file holding the password (PLAIN, SCRAM); re-read when it changes (a rotated Kubernetes Secret)",
           "FILE"),
    Option("sasl.upstream.token_file", v.existing_file,
           "file holding the OAUTHBEARER token (a JWT); re-read when it changes", "FILE"),
    Option("sasl.client.mode", v.sasl_client_mode,
           "relay: clients' own SASL goes to the brokers; terminate: kproxy authenticates clients itself "
           "against --sasl-client-credentials-file", "MODE", show_default=v.as_is),
    Option("sasl.client.mechanisms", v.sasl_client_mechanisms,
           "mechanisms terminate mode offers; repeatable or comma-separated", "MECHANISM", repeatable=True,
           show_default=lambda names: ",".join(names)),
    Option("sasl.client.credentials_file", v.existing_file,
           "users terminate mode checks (`kproxy credentials add USER --file FILE` writes it); re-read when it "
           "changes", "FILE"),
    Option("sasl.client.session_lifetime", v.seconds_or_zero,
           "seconds after which a client authenticated by kproxy must re-authenticate (KIP-368); 0: never",
           "SECONDS", show_default=v.as_is),
)
BY_PATH = {o.path: o for o in OPTIONS}
BY_ENV = {o.env: o for o in OPTIONS}

# The options each cluster of ``clusters:`` has of its own (``clusters.NAME.PATH``: flag
# ``--clusters-NAME-PATH``, variable ``KPROXY_CLUSTERS_<NAME>_<PATH>``, a '-' of the name spelt '_').
CLUSTERS = "clusters"
CLUSTER_PATHS: tuple[str, ...] = tuple(
    o.path for o in OPTIONS
    if o.path in ("upstream", "listen", "advertised_host", "broker_port_base", "broker_port_count", "broker_ports")
    or o.path.startswith(("tls.upstream.", "sasl.upstream.")))
# Of those, the ones a configuration with ``clusters:`` may give at the top level too: every
# cluster's default (a CA or a login the clusters share). The others must differ per cluster.
CLUSTER_SHARED_PATHS: tuple[str, ...] = tuple(p for p in CLUSTER_PATHS if p.startswith(("tls.", "sasl.")))


def cluster_path(name: str, path: str) -> str:
    """The path of a cluster's option: ``orders``, ``upstream`` -> ``clusters.orders.upstream``."""
    return f"{CLUSTERS}.{name}.{path}"


def cluster_env_name(name: str, path: str) -> str:
    """The variable of a cluster's option: ``eu-west``, ``upstream`` -> ``KPROXY_CLUSTERS_EU_WEST_UPSTREAM``."""
    return env_name(cluster_path(name.replace("-", "_"), path))


def split_cluster_path(path: str) -> tuple[str, str] | None:
    """``clusters.orders.tls.upstream.ca`` -> (``orders``, ``tls.upstream.ca``); None for other paths."""
    head, _, rest = path.partition(".")
    name, _, inner = rest.partition(".")
    return (name, inner) if head == CLUSTERS and name and inner else None
