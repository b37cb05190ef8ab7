"""Rules in Kubernetes: the chart and the sidecar example mount them from a ConfigMap directory.

Rendered offline by Helm's Go SDK (as tests/test_deploy_artifacts.py does). What must hold: the
pod's kproxy.yaml points ``rules:`` at the mounted directory, which is the whole ConfigMap (a
subPath mount never sees an update), and a change of the rules changes nothing of the pod
template (no checksum: the rules reload in place), while kproxy.yaml's checksum stays.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.rules_reload import ConfigMapVolume
from tests.test_deploy_artifacts import (
    CHART,
    ROOT,
    SIDECAR_EXAMPLE,
    container,
    kinds,
    load_kproxy_config,
    one,
    parent_chart,  # noqa: F401  (a fixture: an app chart that includes the sidecar templates)
    render,
    with_sidecar_secrets,
)

RULES_DIR = "/etc/kproxy-rules"
SLOW = """rules:
  - id: slow-produce
    match: {api: produce}
    actions:
      - delay: {ms: 200}
"""
DENY = """rules:
  - id: deny
    match: {api: produce, topic: secret}
    actions:
      - inject_error: {error: TOPIC_AUTHORIZATION_FAILED}
"""


@pytest.fixture(scope="module")
def helm() -> Any:
    import helm_python  # type: ignore[import-not-found,import-untyped,unused-ignore]

    return helm_python


WITH_RULES = {"rules": {"enabled": True, "files": {"10-slow.yaml": SLOW, "20-deny.yml": DENY}}}


def config_maps(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}


def rules_volume(spec: dict[str, Any], c: dict[str, Any]) -> str:
    """The ConfigMap mounted whole at the rules directory (no subPath, read-only)."""
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == RULES_DIR)
    assert "subPath" not in mount and mount["readOnly"] is True
    name: str = next(v for v in spec["volumes"] if v["name"] == mount["name"])["configMap"]["name"]
    return name


def loads_as_kproxy_would(config_text: str, rules_data: dict[str, str], tmp_path: Path) -> list[str]:
    """Publish the rules ConfigMap as kubelet would, point kproxy.yaml at it, load: the rule ids."""
    volume_dir = tmp_path / "kproxy-rules"
    volume_dir.mkdir()
    ConfigMapVolume(volume_dir).publish(rules_data)
    cfg = load_kproxy_config(config_text.replace(RULES_DIR, str(volume_dir)), tmp_path)
    assert cfg.rules is not None and cfg.rules.source == str(volume_dir)
    return [r.id for r in cfg.rules.rules]


def test_rules_come_from_a_configmap_directory_kproxy_yaml_points_at(helm: Any, tmp_path: Path) -> None:
    docs = render(helm, WITH_RULES)
    assert kinds(docs) == ["ConfigMap", "ConfigMap", "Deployment", "Service", "ServiceAccount"]
    maps = config_maps(docs)
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    c = container(spec)
    rules_cm = maps[rules_volume(spec, c)]
    assert rules_cm["metadata"]["name"] == "kp-kproxy-rules"
    assert rules_cm["data"] == {"10-slow.yaml": SLOW, "20-deny.yml": DENY}
    config_text = maps["kp-kproxy-config"]["data"]["kproxy.yaml"]
    assert yaml.safe_load(config_text)["rules"] == RULES_DIR
    assert loads_as_kproxy_would(config_text, rules_cm["data"], tmp_path) == ["slow-produce", "deny"]


def test_a_rules_change_does_not_roll_the_pods_and_a_config_change_does(helm: Any) -> None:
    def pod_template(values: dict[str, Any]) -> dict[str, Any]:
        template: dict[str, Any] = one(render(helm, values), "Deployment")["spec"]["template"]
        return template

    base = pod_template(WITH_RULES)
    other_rules = pod_template({"rules": {"enabled": True, "files": {"10-slow.yaml": DENY}}})
    assert other_rules == base, "a rules change must reach the pods by a reload, not a rollout"
    other_config = pod_template({**WITH_RULES, "kproxy": {"logLevel": "debug"}})
    assert other_config["metadata"]["annotations"]["checksum/config"] != base["metadata"]["annotations"][
        "checksum/config"]
    assert [k for k in base["metadata"]["annotations"] if "rules" in k] == []


def test_an_empty_rules_configmap_is_a_directory_with_no_rules(helm: Any, tmp_path: Path) -> None:
    docs = render(helm, {"rules": {"enabled": True}})
    maps = config_maps(docs)
    assert maps["kp-kproxy-rules"]["data"] in ({}, None)
    assert loads_as_kproxy_would(maps["kp-kproxy-config"]["data"]["kproxy.yaml"], {}, tmp_path) == []


def test_an_existing_configmap_is_mounted_and_none_is_rendered(helm: Any) -> None:
    docs = render(helm, {"rules": {"enabled": True, "existingConfigMap": "chaos-rules"}})
    assert list(config_maps(docs)) == ["kp-kproxy-config"]
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert rules_volume(spec, container(spec)) == "chaos-rules"


def test_without_rules_nothing_changes(helm: Any) -> None:
    docs = render(helm)
    assert list(config_maps(docs)) == ["kp-kproxy-config"]
    assert "rules" not in yaml.safe_load(one(docs, "ConfigMap")["data"]["kproxy.yaml"])
    c = container(one(docs, "Deployment")["spec"]["template"]["spec"])
    assert RULES_DIR not in {m["mountPath"] for m in c["volumeMounts"]}


@pytest.mark.parametrize(("values", "message"), [
    ({"rules": {"enabled": True, "files": {"a.yaml": SLOW}, "existingConfigMap": "x"}}, "exclude each other"),
    ({"rules": {"enabled": True, "files": {"chaos.json": SLOW}}}, "'chaos.json' does not match pattern"),
    ({"rules": {"enabled": True, "files": {"a.yaml": ["not", "text"]}}}, "/rules/files/a.yaml"),
    ({"rules": {"enable": True}}, "additional properties 'enable' not allowed"),
], ids=["both-sources", "file-name", "file-text", "misspelt"])
def test_bad_rules_values_are_refused(helm: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render(helm, values)


def test_the_chart_with_rules_lints_clean(helm: Any) -> None:
    for values in (WITH_RULES, {"mode": "sidecar", **WITH_RULES}):
        report = helm.lint(str(CHART), values, strict=True)
        assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []


def test_the_sidecar_mounts_the_rules_of_its_chart(helm: Any, request: pytest.FixtureRequest) -> None:
    docs = render(helm, {"kproxy": WITH_RULES}, chart=request.getfixturevalue("parent_chart"))
    assert kinds(docs) == ["ConfigMap", "ConfigMap", "Deployment"]
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert rules_volume(spec, container(spec)) == "kp-kproxy-rules"
    assert {v["name"] for v in spec["volumes"]} == {m["name"] for m in container(spec)["volumeMounts"]}


def test_the_sidecar_example_loads_its_rules_from_a_directory(tmp_path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(SIDECAR_EXAMPLE.read_text()) if d]
    maps = config_maps(docs)
    spec = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    c = container(spec)
    rules_cm = maps[rules_volume(spec, c)]
    config_text = next(m for m in maps.values() if "kproxy.yaml" in m.get("data", {}))["data"]["kproxy.yaml"]
    config_text = with_sidecar_secrets(config_text, tmp_path)  # its SASL password and CA, as mounted files
    assert loads_as_kproxy_would(config_text, rules_cm["data"], tmp_path) == ["slow-produce"]
    # The rules ConfigMap carries no checksum annotation on the pod: edits reload in place.
    pod_annotations = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["metadata"].get(
        "annotations", {})
    assert not [k for k in pod_annotations if "rules" in k]


# -- the admin API, kept on the pod's loopback ---------------------------------------------------------
def test_the_admin_api_listens_on_loopback_with_no_port_published(helm: Any, tmp_path: Path) -> None:
    for values in ({"admin": {"enabled": True}, **WITH_RULES}, {"mode": "sidecar", "admin": {"enabled": True}}):
        docs = render(helm, values)
        config_text = config_maps(docs)["kp-kproxy-config"]["data"]["kproxy.yaml"]
        assert yaml.safe_load(config_text)["admin"] == {"listen": "127.0.0.1:9901"}
        raw = {k: v for k, v in yaml.safe_load(config_text).items() if k != "rules"}
        cfg = load_kproxy_config(yaml.safe_dump(raw), tmp_path)  # kproxy accepts it (no token: loopback)
        assert cfg.admin.listen is not None and cfg.admin.listen.port == 9901
    deploy = one(render(helm, {"admin": {"enabled": True}}), "Deployment")
    c = container(deploy["spec"]["template"]["spec"])
    assert 9901 not in {p["containerPort"] for p in c["ports"]}
    svc = one(render(helm, {"admin": {"enabled": True}}), "Service")
    assert 9901 not in {p["port"] for p in svc["spec"]["ports"]}
    assert "admin" not in yaml.safe_load(one(render(helm), "ConfigMap")["data"]["kproxy.yaml"])
    with pytest.raises(helm.HelmError, match="must all differ"):
        render(helm, {"admin": {"enabled": True, "port": 9308}})
    with pytest.raises(helm.HelmError, match="additional properties 'listen' not allowed"):
        render(helm, {"admin": {"enabled": True, "listen": "0.0.0.0:9901"}})


def test_the_sidecar_example_keeps_the_admin_api_on_loopback(tmp_path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(SIDECAR_EXAMPLE.read_text()) if d]
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and "kproxy.yaml" in d["data"])
    admin = yaml.safe_load(cm["data"]["kproxy.yaml"])["admin"]
    assert admin["listen"].startswith("127.0.0.1:")
    port = int(admin["listen"].rsplit(":", 1)[1])
    spec = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert port not in {p["containerPort"] for p in container(spec)["ports"]}


# -- the dashboard -----------------------------------------------------------------------------------
def test_the_faults_row_shows_dry_run_matches_beside_the_actions_done() -> None:
    board = json.loads((ROOT / "deploy" / "grafana" / "kproxy-dashboard.json").read_text())
    rows = [p for p in board["panels"] if p["type"] == "row"]
    faults = next(r for r in rows if r["title"] == "Faults")
    # Collapsed or not, a row's panels are those between it and the next row.
    panels = faults.get("panels") or []
    if not panels:
        after = board["panels"][board["panels"].index(faults) + 1:]
        panels = next(([*after[:i]] for i, p in enumerate(after) if p["type"] == "row"), after)
    by_title = {p["title"]: p for p in panels}
    done, shadow = by_title["Rule actions done"], by_title["Dry-run matches"]
    assert [t["expr"] for t in done["targets"]] == [t["expr"].replace('dry_run="true"', 'dry_run="false"')
                                                    for t in shadow["targets"]]
    assert 'dry_run="true"' in shadow["targets"][0]["expr"]
    assert shadow["gridPos"]["y"] == done["gridPos"]["y"]
    assert shadow["gridPos"]["x"] == done["gridPos"]["x"] + done["gridPos"]["w"]  # side by side
    assert shadow["fieldConfig"]["defaults"]["unit"] == done["fieldConfig"]["defaults"]["unit"]
    in_force = " ".join(t["expr"] for t in by_title["Rules in force"]["targets"])
    assert "kproxy_rules_generation" in in_force and "kproxy_rules_reloads_total" in in_force
