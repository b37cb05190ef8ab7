"""The container image, built and run as its users build and run it, with no Docker daemon: the
repository's Dockerfile built by buildah from a base given as a build argument, the image run by
podman in front of the session's real broker, with a mounted config file.

The base is made of Debian packages (debootstrap: bookworm, python3, python3-venv, ca-certificates)
and imported into podman's storage under a tag naming its recipe: a machine makes it once, later
runs reuse it. A build on this network reaches the package index only when the base trusts this
machine's CA bundle (the file pip's ``cert`` setting names here), so the base carries that bundle
and a pip configuration naming it; the Dockerfile stays generic. Containers run with runc, on the
host's network (the broker listens on loopback), with explicit rlimits (crun could not set them
in the sandbox this test was first run in).

The build keeps buildah's layer cache (``--layers``): an instruction whose inputs (the Dockerfile's
line, the files it copies, the layer before) are unchanged since an earlier build on this machine is
not run again, so a later run recompiles only when kproxy's source changed, and a cache miss is a
build from scratch. The test image's tag is removed afterwards, its layers kept (``--no-prune``);
untagged layers made more than CACHE_DAYS ago are pruned.

Skipped, saying why, only where buildah or podman cannot run (not installed, not root, no storage);
scripts/system-deps installs them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kproxy.testing import Broker, free_port, wait_for_port
from tests.support.e2e import round_trip, unique

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("buildah", "podman", "runc", "debootstrap")
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
MIRROR = "http://deb.debian.org/debian"
BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # where Debian's ca-certificates puts the bundle
RUN = ["--runtime", "runc", "--network", "host", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
BUILD_TIMEOUT = 1800
CACHE_DAYS = 7


def why_not_here() -> str | None:
    """Why buildah and podman cannot build and run images on this machine, or None."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(TOOLS)} (scripts/system-deps installs them); missing: {', '.join(missing)}"
    if os.geteuid() != 0:
        return "debootstrap, and buildah and podman without subordinate id ranges, need root"
    info = subprocess.run(["podman", "info", "--format", "{{.Store.GraphDriverName}}"], capture_output=True,
                          text=True, timeout=60, check=False)
    if info.returncode != 0:
        return f"podman cannot run here: {(info.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


pytestmark = pytest.mark.skipif(why_not_here() is not None, reason=str(why_not_here()))


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)


def pip_cert() -> Path:
    """The CA bundle pip trusts on this machine (its ``cert`` setting), else the system's."""
    named = os.environ.get("PIP_CERT")
    if not named:
        done = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.cert"], capture_output=True,
                              text=True, timeout=60, check=False)
        named = done.stdout.strip() if done.returncode == 0 else BUNDLE
    return Path(named)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Debian base image: made by debootstrap once per recipe, kept in podman's storage by a tag naming it."""
    bundle = pip_cert().read_bytes()
    pip_conf = f"[global]\ncert = {BUNDLE}\n"
    recipe = json.dumps([SUITE, PACKAGES, MIRROR, hashlib.sha256(bundle).hexdigest(), pip_conf])
    tag = f"localhost/kproxy-test-base:{SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:16]}"
    if podman("image", "exists", tag).returncode == 0:
        return tag
    root = tmp_path_factory.mktemp("base") / "root"
    log = root.parent / "debootstrap.log"
    with log.open("w") as out:
        done = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
                               str(root), MIRROR], stdout=out, stderr=subprocess.STDOUT, timeout=1200, check=False)
    assert done.returncode == 0, log.read_text()[-3000:]
    (root / BUNDLE.lstrip("/")).write_bytes(bundle)
    (root / "etc" / "pip.conf").write_text(pip_conf)
    for deb in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        deb.unlink()
    archive = root.parent / "base.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname=".")
    imported = podman("import", str(archive), tag, timeout=600)
    assert imported.returncode == 0, imported.stderr
    shutil.rmtree(root)
    archive.unlink()
    return tag


@pytest.fixture(scope="module")
def image(base: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The repository's Dockerfile, built by buildah from ``base``; removed afterwards."""
    tag = f"localhost/kproxy-test:{uuid.uuid4().hex[:12]}"
    log = tmp_path_factory.mktemp("build") / "buildah.log"
    with log.open("w") as out:
        done = subprocess.run(["buildah", "bud", "--layers", "--format", "docker", *RUN, "--build-arg", f"BASE={base}",
                               "--build-arg", "VCS_REF=test", "-f", str(ROOT / "Dockerfile"), "-t", tag, str(ROOT)],
                              stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT, check=False)
    assert done.returncode == 0, log.read_text()[-5000:]
    try:
        yield tag
    finally:
        podman("rmi", "--force", "--no-prune", tag)
        podman("image", "prune", "--force", "--filter", f"until={CACHE_DAYS * 24}h")


def http_get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


def wait_http(url: str, timeout: float = 30.0) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return http_get(url)
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def test_the_image_says_it_is_compiled_and_how_it_runs(image: str) -> None:
    done = podman("run", "--rm", *RUN, image, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith("build: compiled (mypyc"), done.stdout
    [config] = json.loads(podman("image", "inspect", image).stdout)
    settings = config["Config"]
    assert settings["User"] == "10001:10001"
    assert settings["Entrypoint"] == ["kproxy"] and settings["Cmd"] == ["run", "--config", "/etc/kproxy/kproxy.yaml"]
    assert config["Labels"]["org.opencontainers.image.base.name"].startswith("localhost/kproxy-test-base:")
    assert config["Healthcheck"]["Test"] == ["CMD", "kproxy", "health", "--config", "/etc/kproxy/kproxy.yaml"]


def test_the_image_serves_in_front_of_a_broker_as_non_root_and_stops_cleanly(
        image: str, tansu: Broker, tmp_path: Path) -> None:
    listen, metrics = free_port(), free_port()
    config = tmp_path / "kproxy.yaml"
    config.write_text(f"upstream: {tansu.bootstrap}\nlisten: 127.0.0.1:{listen}\nbroker_port_base: {free_port()}\n"
                      f"metrics_listen: 127.0.0.1:{metrics}\n")
    config.chmod(0o644)  # read by the image's user, 10001
    name = unique("kproxy-image")
    started = podman("run", "--detach", "--name", name, *RUN, "--volume", f"{config}:/etc/kproxy/kproxy.yaml:ro",
                     image)
    assert started.returncode == 0, started.stderr
    try:
        assert wait_http(f"http://127.0.0.1:{metrics}/healthz") == (200, "ok\n")
        assert wait_http(f"http://127.0.0.1:{metrics}/readyz")[0] == 200
        wait_for_port("127.0.0.1", listen)
        pid = podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        assert status["Uid"].split() == ["10001"] * 4 and status["Gid"].split() == ["10001"] * 4
        assert Path(f"/proc/{pid}/comm").read_text().strip() in ("kproxy", "python3")
        health = podman("exec", name, "kproxy", "health", "--config", "/etc/kproxy/kproxy.yaml")
        assert (health.returncode, health.stderr) == (0, ""), health.stderr  # the image's HEALTHCHECK command

        round_trip(f"127.0.0.1:{listen}", "image", 200)

        stopped = podman("stop", "--time", "30", name, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        state = json.loads(podman("inspect", "--format", "{{json .State}}", name).stdout)
        assert state["ExitCode"] == 0, state  # SIGTERM handled: not killed (137) at the end of the grace
        logs = podman("logs", name)
        assert "event=signal signal=SIGTERM" in logs.stderr and "event=stopped" in logs.stderr, logs.stderr[-2000:]
        assert " level=error " not in logs.stderr, logs.stderr[-2000:]
    finally:
        podman("rm", "--force", name)
