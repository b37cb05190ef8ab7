"""The configuration's values: :class:`Config` and its sections, frozen, with their built-in defaults.

A :class:`Config` is only ever built by :func:`kproxy.config.layering.build_config` from values
already parsed and checked; the defaults written here are the single source of the defaults shown
in ``kproxy run --help`` (:func:`kproxy.config.options.builtin_default`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kproxy.host_port import HostPort
from kproxy.protocol.framing import DEFAULT_MAX_FRAME_SIZE

if TYPE_CHECKING:
    from kproxy.rules import RuleSet
    from kproxy.sasl.credentials import CredentialStore

# The mechanisms terminate mode checks (kproxy/sasl/server.py), in the order SaslHandshake lists them.
CLIENT_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class ConfigError(Exception):
    """Configuration that kproxy refuses to start with; the message names where and why.

    ``problems`` holds every problem found (one line each); the message joins them. ``files``,
    when the values were parsed, holds the sections whose files kproxy reads or writes at start
    as far as they are valid, so that those files are checked in the same round.
    """

    def __init__(self, *problems: str, files: FileSections | None = None) -> None:
        super().__init__("\n".join(problems))
        self.problems: tuple[str, ...] = problems
        self.files = files


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
    # Consumer lag from OffsetCommit / OffsetFetch / Fetch / ListOffsets traffic (kproxy.metrics.consumer_lag).
    consumer_lag: bool = True
    consumer_lag_partitions: bool = False
    consumer_lag_stale_after: float = 300.0
    # Client anomalies read off the wire (kproxy.metrics.client_anomalies): kproxy_client_anomalies_total.
    client_anomalies: bool = True
    client_anomalies_churn_per_minute: int = 60
    client_anomalies_forbid_acks0: bool = False
    client_anomalies_require_compression: bool = False
    client_anomalies_rebalance_joins: int = 50
    client_anomalies_rebalance_window: float = 300.0
    client_anomalies_retries_per_minute: int = 30


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
    # Read and write in a worker process (kproxy.capture.worker), not a thread sharing the proxy's GIL:
    # the capture's work then never holds the event loop (docs/PERFORMANCE.md, open finding 1).
    process: bool = True

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


# The mechanisms kproxy logs in to brokers with (Kafka's names: KIP-43, KIP-84, KIP-255).
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


@dataclass(frozen=True)
class SaslUpstream:
    """kproxy's own SASL login to the brokers, for clients that do not log in themselves (off unless
    ``mechanism`` is set; docs/SASL.md). The secret comes from a file only, never a flag or a variable:
    ``password_file`` for PLAIN and SCRAM (with ``username``), ``token_file`` for OAUTHBEARER. Both
    are re-read when they change (kproxy/sasl/secret_file.py)."""

    mechanism: str | None = None
    username: str | None = None
    password_file: Path | None = None
    token_file: Path | None = None

    @property
    def enabled(self) -> bool:
        return self.mechanism is not None

    @property
    def secret_file(self) -> Path | None:
        """The file the mechanism's secret is read from (the token's for OAUTHBEARER)."""
        return self.token_file if self.mechanism == "OAUTHBEARER" else self.password_file


@dataclass(frozen=True)
class SaslClient:
    """The SASL of clients (kproxy/sasl/authenticator.py). ``relay``: a client's own exchange goes to
    the broker, as every other request. ``terminate``: kproxy answers it, checking the users of
    ``credentials_file`` for ``mechanisms``; ``session_lifetime`` (seconds, 0: none) makes clients
    re-authenticate that often (KIP-368). ``credentials`` is the file's store as read at start (not
    an option: the config loader reads the file, so that a bad one is refused before serving)."""

    mode: str = "relay"
    mechanisms: tuple[str, ...] = CLIENT_MECHANISMS
    credentials_file: Path | None = None
    session_lifetime: float = 0.0
    credentials: CredentialStore | None = None

    @property
    def terminate(self) -> bool:
        return self.mode == "terminate"


@dataclass(frozen=True)
class FileSections:
    """The sections naming files kproxy loads (TLS) or writes (capture) before it serves; of a
    configuration refused, each as far as its values are valid (a section with a bad value, or
    a certificate without its key, is its default: nothing to load)."""

    client_tls: ClientTls
    upstream_tls: UpstreamTls
    capture: CaptureOptions


# The name of the one cluster of a configuration without ``clusters:``.
DEFAULT_CLUSTER = "default"
# The broker ports a cluster of ``clusters:`` has when ``broker_port_count`` is not given.
CLUSTER_PORT_COUNT = 100


def advertised_for(advertised_host: str | None, listen: HostPort) -> str:
    """What clients are told: the configured host, else the listen host (``localhost`` when
    listening on a wildcard address, which no client can connect to)."""
    if advertised_host:
        return advertised_host
    return "localhost" if listen.host in ("0.0.0.0", "::", "") else listen.host


def first_port_for(broker_port_base: int | None, listen: HostPort) -> int:
    """``broker_port_base`` or, by default, the port after the bootstrap port (0 = ephemeral)."""
    if broker_port_base is not None:
        return broker_port_base
    return 0 if listen.port == 0 else listen.port + 1


@dataclass(frozen=True)
class Cluster:
    """One upstream cluster and the listeners kproxy serves it on (one entry of ``clusters:``).

    Its brokers get the local ports ``first_broker_port`` .. ``last_broker_port`` (node N on the
    first plus N, as one cluster's always have); ``last_broker_port`` is 65535 for the single
    cluster of a configuration without ``clusters:``, as before there were several.
    """

    name: str
    upstream: tuple[HostPort, ...]
    listen: HostPort
    advertised_host: str | None = None
    broker_port_base: int | None = None
    broker_port_count: int | None = None
    broker_ports: Mapping[int, int] = field(default_factory=dict)
    upstream_tls: UpstreamTls = field(default_factory=UpstreamTls)
    sasl_upstream: SaslUpstream = field(default_factory=SaslUpstream)

    @property
    def advertised(self) -> str:
        return advertised_for(self.advertised_host, self.listen)

    @property
    def first_broker_port(self) -> int:
        return first_port_for(self.broker_port_base, self.listen)

    @property
    def last_broker_port(self) -> int:
        """The highest local port a broker of this cluster may get (65535 without a count)."""
        if self.broker_port_count is None or self.first_broker_port == 0:
            return 65535
        return min(65535, self.first_broker_port + self.broker_port_count - 1)


@dataclass(frozen=True)
class Config:
    upstream: tuple[HostPort, ...]
    listen: HostPort = field(default_factory=lambda: HostPort("127.0.0.1", 19092))
    advertised_host: str | None = None
    broker_port_base: int | None = None
    broker_port_count: int | None = None
    broker_ports: Mapping[int, int] = field(default_factory=dict)
    metrics_listen: HostPort | None = None
    upstream_check_interval: float = 10.0
    ready_clusters: str = "all"  # several clusters: /readyz ready when all (or any) of their upstreams are
    log_level: str = "info"
    log_format: str = "logfmt"
    limits: Limits = field(default_factory=Limits)
    metrics: MetricsOptions = field(default_factory=MetricsOptions)
    client_tls: ClientTls = field(default_factory=ClientTls)
    upstream_tls: UpstreamTls = field(default_factory=UpstreamTls)
    capture: CaptureOptions = field(default_factory=CaptureOptions)
    admin: AdminOptions = field(default_factory=AdminOptions)
    sasl_upstream: SaslUpstream = field(default_factory=SaslUpstream)
    sasl_client: SaslClient = field(default_factory=SaslClient)
    rules: RuleSet | None = None  # fault injection (kproxy/policy/policy.py); None: none
    rules_max_bytes: int = 16 * 1024**2  # kproxy.rules.reading.DEFAULT_MAX_BYTES (rules are imported lazily)
    # The clusters of ``clusters:``; empty: the one cluster ``default`` of the top-level options.
    clusters: tuple[Cluster, ...] = ()
    cluster: str = DEFAULT_CLUSTER  # the cluster the top-level options describe (cluster_config)

    @property
    def advertised(self) -> str:
        """What clients are told: the configured host, else the listen host (``localhost``
        when listening on a wildcard address, which no client can connect to)."""
        return advertised_for(self.advertised_host, self.listen)

    @property
    def first_broker_port(self) -> int:
        """``broker_port_base`` or, by default, the port after the bootstrap port (0 = ephemeral)."""
        return first_port_for(self.broker_port_base, self.listen)

    @property
    def last_broker_port(self) -> int:
        """The highest local port a broker may get (65535 without ``broker_port_count``)."""
        return self.every_cluster[0].last_broker_port if not self.clusters else 65535

    @property
    def every_cluster(self) -> tuple[Cluster, ...]:
        """The clusters served: those of ``clusters:``, else one, ``default``, of the top-level options."""
        if self.clusters:
            return self.clusters
        return (Cluster(self.cluster, self.upstream, self.listen, self.advertised_host, self.broker_port_base,
                        self.broker_port_count, self.broker_ports, self.upstream_tls, self.sasl_upstream),)

    def cluster_config(self, cluster: Cluster) -> Config:
        """This configuration with ``cluster``'s upstream, listeners, upstream TLS and login as its
        top-level options: what the server of that one cluster runs with."""
        return dataclasses.replace(
            self, upstream=cluster.upstream, listen=cluster.listen, advertised_host=cluster.advertised_host,
            broker_port_base=cluster.broker_port_base, broker_port_count=cluster.broker_port_count,
            broker_ports=cluster.broker_ports, upstream_tls=cluster.upstream_tls,
            sasl_upstream=cluster.sasl_upstream, clusters=(), cluster=cluster.name)
