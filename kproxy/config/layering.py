"""The layers of a configuration, merged and checked: built-in default < config file <
``KPROXY_*`` environment < flag.

Every problem of every layer is collected before anything is refused, so one
:class:`~kproxy.config.sections.ConfigError` lists them all, each naming where: the file and line
(``kproxy.yaml:4: limits.idle_timeout: ...``), the variable (``environment KPROXY_LOG_LEVEL:
...``) or the flag (``--limits-max-in-flight: ...``).

A ``KPROXY_*`` variable that is no option and none of :data:`KNOWN_VARIABLES` is a problem
too (with a did-you-mean): a misspelt variable would otherwise leave its option at the default
without a word.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import ipaddress
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kproxy.config import values
from kproxy.config.flags import CLUSTER_FLAGS
from kproxy.config.options import (
    BY_ENV,
    BY_PATH,
    CLUSTER_PATHS,
    CLUSTER_SHARED_PATHS,
    CLUSTERS,
    ENV_PREFIX,
    OPTIONS,
    Option,
    cluster_env_name,
    cluster_path,
    env_name,
    flag_name,
    split_cluster_path,
)
from kproxy.config.sections import (
    CLUSTER_PORT_COUNT,
    AdminOptions,
    CaptureOptions,
    ClientTls,
    Cluster,
    Config,
    ConfigError,
    FileSections,
    Limits,
    MetricsOptions,
    SaslClient,
    SaslUpstream,
    UpstreamTls,
)
from kproxy.config.yaml_file import read_config_file
from kproxy.sasl.secret_file import read_secret

# KPROXY_* variables that kproxy or its tooling reads and that are not options of ``kproxy run``:
# a shell or a test run may set them in the environment ``kproxy run`` inherits.
KNOWN_VARIABLES: Mapping[str, str] = {
    "KPROXY_ADMIN": "the admin API `kproxy rules` talks to",
    "KPROXY_ADMIN_URL": "the admin API `kproxy rules` talks to (the older name of KPROXY_ADMIN)",
    "KPROXY_TEST_UPSTREAM": "the broker of the pytest plugin's kproxy fixture",
    "KPROXY_PURE": "run the pure-Python build even when the compiled hot path is built (kproxy/native.py)",
    "KPROXY_TEST_BUILD": "scripts/test: the build (compiled or pure) a pytest pass must run on (tests/test_native.py)",
    "KPROXY_BENCH_CAPTURE_DIR": "bench/run_kproxy.py: capture during a benchmark",
    "KPROXY_BENCH_NO_METRICS": "bench/run_kproxy.py: a benchmark without metrics",
    "KPROXY_BENCH_PROFILE": "bench/: a cProfile of a benchmark run",
    "KPROXY_BENCH_CPU_TIME": "bench/bench_hotpath.py --cpu-time: its workers time CPU, not the wall clock",
    "KPROXY_BENCH_EVICT": "bench/bench_hotpath.py --evict: its workers time each exchange with the caches cold",
    "KPROXY_BENCH_CAPTURE_ROW_GROUP": "bench/run_kproxy.py: capture row groups of N records (bench_instructions.py)",
    "KPROXY_BENCH_STALLS": "bench/run_kproxy.py: record the loop's long steps and collections (bench_publish.py)",
    "KPROXY_TEST_NODE_CACHE": "tests/support/kafkajs.py: where the tests' kafkajs is installed from npm",
    "KPROXY_SOAK_ARGS": "tests/test_soak.py: extra flags of the soak's kproxy",
    "KPROXY_SOAK_DIRECT": "tests/test_soak.py: soak the broker without kproxy",
    "KPROXY_SOAK_SECONDS": "tests/test_soak.py: length of the soak",
    "KPROXY_FUZZ_SECONDS": "tests/fuzz: length of each fuzz run",
    "KPROXY_CODEC_EXAMPLES": "tests/test_codec_roundtrip.py: examples per kind",
    "KPROXY_CODEC_FUZZ_EXAMPLES": "tests/test_codec_malformed.py: examples of the malformed-frame run",
    "KPROXY_IDLE_CONNECTIONS": "tests/test_resilience_clients.py: idle connections held",
}

# A variable spelt after a deprecated flag (as --max-in-flight would give) means that option; one
# after a flag that turned an option off (--upstream-no-verify) means that option set to false.
_BY_ALIAS_ENV = {ENV_PREFIX + a.flag[2:].replace("-", "_").upper(): o.env + ("=false" if a.sets is False else "")
                 for o in OPTIONS for a in o.aliases}


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
        path = opt.path if opt is not None else None
        if opt is None and name.startswith(_CLUSTERS_ENV):
            found = _cluster_env(name)
            if isinstance(found, str):
                problems.append(f"environment {name}: {found}")
                continue
            opt, path = found
        if opt is None or path is None:
            problems.append(f"environment {name}: not a kproxy option{_env_hint(name)}")
            continue
        value: Any = [part.strip() for part in text.split(",") if part.strip()] if opt.repeatable else text
        out[path] = (value, f"environment {name}")
    return out, problems


_CLUSTERS_ENV = env_name(CLUSTERS) + "_"
# A cluster option's variable after the cluster's name (``UPSTREAM``, ``TLS_UPSTREAM_CA``), longest first:
# a name may end in what is also the start of a longer one.
_CLUSTER_ENV_SUFFIXES = sorted(((env_name(p)[len(ENV_PREFIX):], p) for p in CLUSTER_PATHS),
                               key=lambda item: -len(item[0]))


def _cluster_env(name: str) -> tuple[Option, str] | str:
    """``KPROXY_CLUSTERS_ORDERS_TLS_UPSTREAM_CA`` -> (its option, ``clusters.orders.tls.upstream.ca``);
    else why not (a cluster's name is spelt in capitals there, each '-' as '_')."""
    rest = name[len(_CLUSTERS_ENV):]
    for suffix, path in _CLUSTER_ENV_SUFFIXES:
        if rest.endswith("_" + suffix) and len(rest) > len(suffix) + 1:
            cluster = rest[:-len(suffix) - 1].lower().replace("_", "-")
            try:
                values.cluster_name(cluster)
            except ValueError as exc:
                return str(exc)
            return BY_PATH[path], cluster_path(cluster, path)
    return (f"not an option of a cluster: {_CLUSTERS_ENV}NAME_ then one of "
            f"{', '.join(sorted(s for s, _ in _CLUSTER_ENV_SUFFIXES))}")


def _env_hint(name: str) -> str:
    meant = _BY_ALIAS_ENV.get(name)
    if meant is not None:
        return f" (did you mean {meant}?)"
    close = difflib.get_close_matches(name, [*BY_ENV, *KNOWN_VARIABLES], n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Config:
    """Merge defaults, ``--config``, ``KPROXY_*`` variables (``environ``, default the process's)
    and flags, in that order of precedence; raises :class:`ConfigError` with every problem of
    every layer, the config file's first, in line order."""
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
    for path, (value, flag) in (getattr(args, CLUSTER_FLAGS, None) or {}).items():
        raw[path] = (value, flag)
    try:
        return build_config(raw, problems, file.clusters if config_path is not None else {})
    except ConfigError as exc:
        if config_path is None:
            raise
        raise ConfigError(*_in_line_order(exc.problems, str(config_path)), files=exc.files) from None


def config_from_file(path: Path) -> Config:
    """The configuration of one YAML file alone (no environment, no flags), as ``kproxy health
    --config`` reads it; raises :class:`ConfigError` with every problem, in line order."""
    file = read_config_file(path)
    try:
        return build_config(file.values, [str(p) for p in file.problems], file.clusters)
    except ConfigError as exc:
        raise ConfigError(*_in_line_order(exc.problems, str(path)), files=exc.files) from None


def build_config(raw: Mapping[str, tuple[Any, str]], problems: Sequence[str] = (),
                 clusters: Mapping[str, str] | None = None) -> Config:
    """Parse raw values (option path -> value and where it came from) into a validated
    :class:`Config`. Raises :class:`ConfigError` with ``problems`` (found before, reading the
    layers), then every value's problems, then those of options that go together (checked on
    the values that parsed, so a bad value is not reported twice).

    A cluster's options are at ``clusters.NAME.PATH``; ``clusters`` names those declared with no
    option of their own (the config file's ``clusters:``), each with where.
    """
    found = list(problems)
    parsed: dict[str, Any] = {}
    bad: set[str] = set()
    declared: dict[str, str] = dict(clusters or {})
    of_clusters: dict[str, dict[str, tuple[Any, str]]] = {name: {} for name in declared}
    top_raw: dict[str, tuple[Any, str]] = {}
    for path, entry in raw.items():
        split = split_cluster_path(path)
        if split is None:
            top_raw[path] = entry
        else:
            of_clusters.setdefault(split[0], {})[split[1]] = entry
            declared.setdefault(split[0], entry[1])
    raw = top_raw
    for path, (value, where) in sorted(raw.items(), key=lambda item: item[0] == "rules"):  # rules last: they
        try:  # are read under rules_max_bytes
            parsed[path] = (BY_PATH[path].parse(value) if path != "rules" else
                            values.rules(value, parsed.get("rules_max_bytes", Config.rules_max_bytes)))
        except ValueError as exc:
            bad.add(path)
            found.extend(f"{where}: {arg}" for arg in exc.args or (exc,))
    if "upstream" not in raw and not of_clusters:
        found.append(f"upstream: required (--upstream HOST:PORT, 'upstream:' in the config file, or "
                     f"{env_name('upstream')})")
    for path in CLUSTER_PATHS:
        if of_clusters and path in raw and path not in CLUSTER_SHARED_PATHS:
            found.append(f"{raw[path][1]}: with clusters, each cluster has its own "
                         f"({cluster_path('NAME', path)}); not at the top level")

    def section(prefix: str) -> dict[str, Any]:
        return {p[len(prefix):]: v for p, v in parsed.items() if p.startswith(prefix)}

    def together(*paths: str) -> bool:
        """Whether a check of these options means anything: none of them had a bad value."""
        return not bad.intersection(paths)

    before = len(found)
    client_tls = ClientTls(**section("tls.client."))
    if (client_tls.cert is None) != (client_tls.key is None) and together("tls.client.cert", "tls.client.key"):
        found.append("tls.client: cert and key go together (--tls-client-cert with --tls-client-key)")
    if client_tls.require_client_cert and client_tls.client_ca is None and together("tls.client.client_ca"):
        found.append("tls.client.require_client_cert: needs tls.client.client_ca (--tls-client-client-ca)")
    client_ok = len(found) == before and together("tls.client.cert", "tls.client.key", "tls.client.client_ca")
    before = len(found)
    upstream_tls = UpstreamTls(**section("tls.upstream."))
    if (upstream_tls.cert is None) != (upstream_tls.key is None) and together("tls.upstream.cert",
                                                                              "tls.upstream.key"):
        found.append("tls.upstream: cert and key go together (--tls-upstream-cert with --tls-upstream-key)")
    upstream_ok = len(found) == before and together("tls.upstream.ca", "tls.upstream.cert", "tls.upstream.key")
    capture = CaptureOptions(**section("capture."))
    if capture.rotate_bytes > capture.max_bytes_total and together("capture.rotate_bytes",
                                                                   "capture.max_bytes_total"):
        found.append("capture.rotate_bytes: must not exceed capture.max_bytes_total")
    admin = AdminOptions(**section("admin."))
    if together("admin.listen", "admin.token", "admin.token_file"):
        found.extend(_admin_problems(admin))
    sasl_upstream = SaslUpstream(**section("sasl.upstream."))
    if together(*(f"sasl.upstream.{name}" for name in ("mechanism", "username", "password_file", "token_file"))):
        found.extend(sasl_upstream_problems(sasl_upstream))
    sasl_client = SaslClient(**section("sasl.client."))
    if together("sasl.client.mode", "sasl.client.credentials_file"):
        sasl_client = _sasl_client(sasl_client, found)
    every = tuple(cluster for name, options in of_clusters.items()
                  if (cluster := _cluster(name, options, parsed, found)) is not None)
    found.extend(cluster_overlaps(every, declared))  # (of the clusters that are valid)
    if found:
        raise ConfigError(*found, files=FileSections(client_tls if client_ok else ClientTls(),
                                                     upstream_tls if upstream_ok else UpstreamTls(),
                                                     capture if together("capture.dir") else CaptureOptions()))
    top = {p: v for p, v in parsed.items() if "." not in p}
    if every:
        top["upstream"] = ()
    return Config(limits=Limits(**section("limits.")), metrics=MetricsOptions(**section("metrics.")),
                  client_tls=client_tls, upstream_tls=upstream_tls, capture=capture, admin=admin,
                  sasl_upstream=sasl_upstream, sasl_client=sasl_client, clusters=every, **top)


def _cluster(name: str, options: Mapping[str, tuple[Any, str]], top: Mapping[str, Any],
             found: list[str]) -> Cluster | None:
    """One cluster of ``clusters:`` from its options (``options``: path in the cluster -> raw value
    and where), its upstream TLS and login defaulting to the top level's (``top``: parsed values);
    None, with its problems in ``found``, when it is not valid."""
    before = len(found)
    parsed: dict[str, Any] = {p: v for p, v in top.items() if p in CLUSTER_SHARED_PATHS}
    for path, (value, where) in options.items():
        try:
            parsed[path] = BY_PATH[path].parse(value)
        except ValueError as exc:
            found.extend(f"{where}: {arg}" for arg in exc.args or (exc,))
    if len(found) > before:
        return None
    for needed in ("upstream", "listen"):
        if needed not in parsed:
            found.append(f"{cluster_path(name, needed)}: required ({flag_name(cluster_path(name, needed))}, "
                         f"'{needed}:' in the cluster's section of the config file, or "
                         f"{cluster_env_name(name, needed)})")

    def section(prefix: str) -> dict[str, Any]:
        return {p[len(prefix):]: v for p, v in parsed.items() if p.startswith(prefix)}

    upstream_tls = UpstreamTls(**section("tls.upstream."))
    if (upstream_tls.cert is None) != (upstream_tls.key is None):
        found.append(f"{cluster_path(name, 'tls.upstream')}: cert and key go together")
    sasl_upstream = SaslUpstream(**section("sasl.upstream."))
    found.extend(f"{CLUSTERS}.{name}.{problem}" for problem in sasl_upstream_problems(sasl_upstream))
    if len(found) > before:
        return None
    top_level = {p: v for p, v in parsed.items() if "." not in p}
    return Cluster(name, upstream_tls=upstream_tls, sasl_upstream=sasl_upstream,
                   broker_port_count=top_level.pop("broker_port_count", CLUSTER_PORT_COUNT), **top_level)


def cluster_overlaps(clusters: Sequence[Cluster], where: Mapping[str, str]) -> list[str]:
    """Clusters whose local ports meet: a bootstrap port, or a broker port of one cluster's range
    (or pinned), that another cluster listens on or keeps for its brokers, on the same host (or
    either on every address). Ephemeral ports (0) never meet. ``where`` names each cluster's place."""
    problems: list[str] = []

    def ports(cluster: Cluster) -> list[tuple[int, int, str]]:
        out = [(cluster.listen.port, cluster.listen.port, "bootstrap port")] if cluster.listen.port else []
        if cluster.first_broker_port:
            out.append((cluster.first_broker_port, cluster.last_broker_port, "broker ports"))
        out += [(port, port, f"broker {node}'s port") for node, port in sorted(cluster.broker_ports.items()) if port]
        return out

    for i, a in enumerate(clusters):
        for b in clusters[:i]:
            wildcard = ("0.0.0.0", "::", "")
            if a.listen.host != b.listen.host and a.listen.host not in wildcard and b.listen.host not in wildcard:
                continue
            for lo, hi, what in ports(a):
                for other_lo, other_hi, other_what in ports(b):
                    if lo <= other_hi and other_lo <= hi:
                        problems.append(f"{where.get(a.name, cluster_path(a.name, 'listen'))}: its {what} "
                                        f"{_span(lo, hi)} and the {other_what} {_span(other_lo, other_hi)} of "
                                        f"cluster {b.name!r} overlap")
    return problems


def _span(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _in_line_order(problems: Sequence[str], source: str) -> list[str]:
    """``problems`` with those of the config file ``source`` (``source:LINE: ...``) first, in
    line order (its key and value problems interleaved as they are written), the rest after,
    as they came."""
    def line(problem: str) -> float:
        head, sep, rest = problem.partition(f"{source}:")
        number = rest.split(":", 1)[0]
        return int(number) if not head and sep and number.isdigit() else float("inf")

    return sorted(problems, key=line)


def is_loopback(host: str) -> bool:
    """``localhost`` or an address in 127.0.0.0/8 or ::1; any other name or address is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere: not trusted as loopback


def _sasl_client(sasl: SaslClient, problems: list[str]) -> SaslClient:
    """Terminate mode needs its credentials file, read now (a bad one is a start-up problem)."""
    if not sasl.terminate:
        return sasl
    if sasl.credentials_file is None:
        problems.append("sasl.client.mode: terminate needs sasl.client.credentials_file "
                        "(--sasl-client-credentials-file; `kproxy credentials add USER --file FILE` writes one)")
        return sasl
    from kproxy.sasl.credentials import CredentialsError
    from kproxy.sasl.credentials_file import load_credentials

    try:
        store = load_credentials(sasl.credentials_file)
    except CredentialsError as exc:
        problems.extend(f"sasl.client.credentials_file: {p}" for p in exc.problems)
        return sasl
    return dataclasses.replace(sasl, credentials=store)


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


def sasl_upstream_problems(sasl: SaslUpstream) -> list[str]:
    """What is wrong with kproxy's own login (options that do not go together, a secret file that
    cannot be read or holds none), one line each; the file is read now."""
    given = [name for name in ("username", "password_file", "token_file") if getattr(sasl, name) is not None]
    if sasl.mechanism is None:
        return [f"sasl.upstream.{name}: needs sasl.upstream.mechanism (--sasl-upstream-mechanism)"
                for name in given]
    problems: list[str] = []
    needed: tuple[str, ...]
    if sasl.mechanism == "OAUTHBEARER":
        needed, refused = ("token_file",), {"username": "the token names the principal",
                                            "password_file": "OAUTHBEARER logs in with sasl.upstream.token_file"}
    else:
        needed, refused = ("username", "password_file"), {
            "token_file": f"{sasl.mechanism} logs in with sasl.upstream.password_file"}
    problems += [f"sasl.upstream.{name}: required with mechanism {sasl.mechanism} "
                 f"({flag_name('sasl.upstream.' + name)})" for name in needed if getattr(sasl, name) is None]
    problems += [f"sasl.upstream.{name}: not used with mechanism {sasl.mechanism}: {why}"
                 for name, why in refused.items() if getattr(sasl, name) is not None]
    secret_file = sasl.secret_file
    if secret_file is not None:
        option = "token_file" if sasl.mechanism == "OAUTHBEARER" else "password_file"
        try:
            read_secret(secret_file, token=sasl.mechanism == "OAUTHBEARER")
        except ValueError as exc:
            problems.append(f"sasl.upstream.{option}: {exc}")
    return problems
