"""The image's HEALTHCHECK and layers: `kproxy health` probes a real kproxy; dependencies build first."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from kproxy.testing import Broker, free_port, wait_for_port
from tests.test_deploy_artifacts import CONFIG_PATH, global_args, stages

KPROXY = [sys.executable, "-m", "kproxy"]


def health(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KPROXY, "health", *args], capture_output=True, text=True, timeout=30, check=False)


def test_health_follows_the_config_file_of_a_running_kproxy(tansu: Broker, tmp_path: Path) -> None:
    metrics = free_port()
    config = tmp_path / "kproxy.yaml"
    config.write_text(f"upstream: {tansu.bootstrap}\nlisten: 127.0.0.1:{free_port()}\n"
                      f"broker_port_base: 0\nmetrics_listen: 0.0.0.0:{metrics}\n")
    assert health("--config", str(config)).returncode == 1  # nothing runs yet
    proc = subprocess.Popen([*KPROXY, "run", "--config", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", metrics, timeout=60)
        done = health("--config", str(config))
        assert (done.returncode, done.stderr) == (0, "")
        assert health("--url", f"http://127.0.0.1:{metrics}/healthz").returncode == 0
        not_found = health("--url", f"http://127.0.0.1:{metrics}/nope")
        assert not_found.returncode == 1 and "HTTP 404" in not_found.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    gone = health("--config", str(config))
    assert gone.returncode == 1
    assert gone.stderr.startswith("kproxy health: unhealthy: http://127.0.0.1:") and gone.stderr.count("\n") == 1


def test_health_refuses_a_config_without_metrics(tmp_path: Path) -> None:
    config = tmp_path / "kproxy.yaml"
    config.write_text("upstream: 127.0.0.1:9092\n")
    done = health("--config", str(config))
    assert done.returncode == 2 and "metrics_listen is not set" in done.stderr
    missing = health("--config", str(tmp_path / "absent.yaml"))
    assert missing.returncode == 2 and "absent.yaml: cannot read" in missing.stderr


def test_image_builds_dependencies_before_the_source() -> None:
    """A change under kproxy/ must not rebuild every wheel: the dependency wheels come from a
    layer that only pyproject.toml feeds."""
    build, _ = stages()
    order = [(word, args) for word, args in build if word in ("COPY", "RUN")]
    copy_source = next(i for i, (w, a) in enumerate(order) if w == "COPY" and a.startswith("kproxy"))
    deps = next(i for i, (w, a) in enumerate(order) if w == "RUN" and "-r /tmp/requirements.txt" in a)
    assert deps < copy_source
    assert [a for w, a in order[:deps] if w == "COPY"] == ["pyproject.toml ./"]
    assert "--no-deps" in next(a for w, a in order[copy_source:] if w == "RUN")


def test_image_base_is_pinned_by_digest_and_labelled() -> None:
    build, final = stages()
    bases = [stage[0][1].split()[0] for stage in (build, final)]
    assert bases == ["${BASE}", "${BASE}"]  # one base for both stages: the venv is copied from one to the other
    assert re.fullmatch(r"python:3\.11-slim-trixie@sha256:[0-9a-f]{64}", global_args()["BASE"])
    labels = " ".join(args for word, args in final if word == "LABEL")
    assert 'org.opencontainers.image.base.name="${BASE}"' in labels and ("ARG", "BASE") in final
    for key in ("source", "revision", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert "fault injection" in labels  # what this build does (kproxy run --rules)
    (check,) = [args for word, args in final if word == "HEALTHCHECK"]
    command = json.loads(check.split("CMD", 1)[1])
    assert command == ["kproxy", "health", "--config", CONFIG_PATH]
