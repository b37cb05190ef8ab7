"""A security scan (checkov) of the image and every manifest kproxy ships, in the test suite.

checkov runs from its own venv (.venv-tools, made by scripts/setup: its dependencies must not
move kproxy's). Each check skipped below says why; anything else it finds fails the test, so a
new template or a loosened securityContext cannot slip in unnoticed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_deploy_artifacts import CHART, DOCKERFILE, ROOT

CHECKOV = ROOT / ".venv-tools" / "bin" / "checkov"
SIDECAR_EXAMPLE = ROOT / "deploy" / "kubernetes" / "sidecar-example.yaml"

# Everything the chart can render, at once, with the image pinned by digest as production should.
CHART_VALUES: dict[str, Any] = {
    "image": {"digest": "sha256:" + "0" * 64},
    "serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
    "networkPolicy": {"enabled": True}, "podDisruptionBudget": {"enabled": True},
    "rules": {"enabled": True, "files": {"chaos.yaml": "rules: []\n"}}, "admin": {"enabled": True},
    "tls": {"upstream": {"enabled": True, "secretName": "kafka-ca"}},
    "sasl": {"upstream": {"mechanism": "SCRAM-SHA-512", "username": "svc", "secretName": "kafka-password"},
             "client": {"mode": "terminate", "credentialsSecret": "kproxy-users"}},
}

SKIPPED: dict[str, dict[str, str]] = {
    "chart": {
        # Charts leave metadata.namespace to Helm (`helm install -n NS`), which checkov cannot see.
        "CKV_K8S_21": "namespace is set by helm install -n",
        # Deliberate: a CPU limit makes the kernel throttle kproxy in 100 ms CFS periods, adding that
        # much to the tail latency of every Kafka request through it. Requests are set.
        "CKV_K8S_11": "no CPU limit on purpose (CFS throttling is tail latency for every request)",
    },
    "sidecar-example": {
        "CKV_K8S_11": "no CPU limit on purpose (CFS throttling is tail latency for every request)",
        # The example's images are placeholders (CHANGE markers) to be replaced by the user's.
        "CKV_K8S_43": "placeholder images in an example",
        "CKV_K8S_15": "placeholder images in an example; digests make IfNotPresent safe",
        # The app container's probes belong to the app; kproxy's own are there.
        "CKV_K8S_8": "the placeholder app's liveness probe is the app's own",
        "CKV_K8S_9": "the placeholder app's readiness probe is the app's own",
        # The app's NetworkPolicy belongs to the app's manifests; the chart ships one for kproxy.
        "CKV2_K8S_6": "the app's NetworkPolicy is the app's own",
    },
    "dockerfile": {
        # FROM names the BASE build argument (the base is chosen at build time), whose default is pinned
        # by digest (tests/test_image_health.py checks it); checkov reads no ARG default.
        "CKV_DOCKER_7": "the base is the BASE build argument, its default pinned by digest",
    },
}


@pytest.fixture(scope="module")
def rendered_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import helm_python  # type: ignore[import-not-found,import-untyped,unused-ignore]

    with helm_python.Chart.load(str(CHART)) as loaded:
        manifests: dict[str, str] = loaded.render(CHART_VALUES, name="kproxy", namespace="kafka")
    out = tmp_path_factory.mktemp("chart") / "chart.yaml"
    docs = [doc for t, text in sorted(manifests.items()) if not t.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]
    out.write_text(yaml.safe_dump_all(docs))
    return out


def checkov(target: Path, framework: str, skipped: dict[str, str]) -> dict[str, Any]:
    assert CHECKOV.exists(), "checkov missing: run scripts/setup (it makes .venv-tools)"
    args = [str(CHECKOV), "--skip-download", "--compact", "-o", "json", "--framework", framework, "-f", str(target)]
    if skipped:
        args += ["--skip-check", ",".join(skipped)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert done.stdout.strip(), done.stderr[-2000:]
    report = json.loads(done.stdout)
    (result,) = report if isinstance(report, list) else [report]
    assert isinstance(result, dict)
    return result


@pytest.mark.parametrize(("name", "framework"), [("chart", "kubernetes"), ("sidecar-example", "kubernetes"),
                                                 ("dockerfile", "dockerfile")])
def test_checkov_finds_nothing_unexplained(name: str, framework: str, rendered_chart: Path) -> None:
    target = {"chart": rendered_chart, "sidecar-example": SIDECAR_EXAMPLE, "dockerfile": DOCKERFILE}[name]
    result = checkov(target, framework, SKIPPED[name])
    failed = [f"{f['check_id']} {f['resource']}: {f['check_name']}" for f in result["results"]["failed_checks"]]
    assert failed == [], "\n".join(failed)
    assert result["summary"]["passed"] > 10, result["summary"]  # it really scanned something
    assert not result["summary"]["parsing_errors"], result["summary"]


def test_the_scan_does_fail_on_a_weakened_manifest(rendered_chart: Path, tmp_path: Path) -> None:
    """The scan is not vacuous: the same chart with a privileged, root container fails it."""
    docs = list(yaml.safe_load_all(rendered_chart.read_text()))
    for doc in docs:
        if doc["kind"] == "Deployment":
            doc["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": True, "runAsUser": 0}
    weakened = tmp_path / "weakened.yaml"
    weakened.write_text(yaml.safe_dump_all(docs))
    failed = {f["check_id"] for f in checkov(weakened, "kubernetes", SKIPPED["chart"])["results"]["failed_checks"]}
    assert {"CKV_K8S_16", "CKV_K8S_20"} <= failed, failed  # privileged; allowPrivilegeEscalation
