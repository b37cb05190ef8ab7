"""Every example of the docs runs as written (tests/support/doc_blocks.py says how blocks are
marked and what each mode means): a doc cannot drift from the code unnoticed.

Blocks that need something the test machine has not (a Kubernetes cluster, minutes of benchmark)
are marked ``skip`` with the reason, and listed as skipped here.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kproxy.rules.load import load_text
from kproxy.testing import Broker, free_port
from kproxy.testing.fixture import Kproxy
from tests.support.doc_blocks import MODES, ROOT, Block, all_blocks, commands

BLOCKS = all_blocks()
BIN = Path(sys.executable).parent

# Example inputs a `sh` block may ask for (`files=`): the frames the README's decode examples read.
_METADATA_V0_REQUEST = "00000012 0003 0000 00000001 0004 74657374 ffffffff"  # as the README echoes it
_METADATA_V0_RESPONSE = "0000000c 00000001 00000000 00000000"  # no brokers, no topics
EXAMPLE_FILES: dict[str, bytes] = {
    "capture.bin": bytes.fromhex(_METADATA_V0_REQUEST.replace(" ", "")),
    "response.txt": (_METADATA_V0_RESPONSE + "\n").encode(),
}
COPIED = ("deploy", "rules")  # blocks may write there (a regenerated dashboard): copies, not links


def of_mode(*modes: str) -> list[Any]:
    return [pytest.param(b, id=b.where) for b in BLOCKS if b.mode in modes]


def test_every_block_of_the_docs_says_how_it_is_tested() -> None:
    assert BLOCKS, "no Markdown found"
    unmarked = [b.where for b in BLOCKS if b.mode is None]
    assert not unmarked, f"blocks without a <!-- doc-test: MODE --> marker: {unmarked}"
    unknown = [f"{b.where}: {b.mode}" for b in BLOCKS if b.mode not in MODES]
    assert not unknown, f"unknown modes (known: {MODES}): {unknown}"
    reasonless = [b.where for b in BLOCKS if b.mode == "skip" and not b.args]
    assert not reasonless, f"skip markers without a reason: {reasonless}"


@pytest.mark.parametrize("block", of_mode("skip"))
def test_blocks_not_run(block: Block) -> None:
    pytest.skip(f"not run: {block.args}")


@pytest.mark.parametrize("block", of_mode("json"))
def test_json_blocks_parse(block: Block) -> None:
    json.loads(block.text)


@pytest.mark.parametrize("block", of_mode("rules"))
def test_rule_blocks_load(block: Block) -> None:
    rules = load_text(block.text, block.where)
    assert rules.rules, "a rule file example with no rule"


@pytest.mark.parametrize("block", of_mode("config"))
def test_config_blocks_pass_check(block: Block, tmp_path: Path) -> None:
    path = tmp_path / "kproxy.yaml"
    path.write_text(block.text)
    done = _run([str(BIN / "kproxy"), "run", "--config", str(path), "--check"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("block", of_mode("python"))
def test_python_blocks_run(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.text)
    done = _run([sys.executable, str(script)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("block", of_mode("pytest"))
def test_pytest_blocks_pass_with_the_plugin(block: Block, kproxy: Kproxy) -> None:
    """The block's one test, run in this process with the plugin's own ``kproxy`` fixture (its
    session kproxy over the session's broker, tests/conftest.py). Tracebacks name the doc's lines.
    tests/plugin/ runs a user's suite as a user does: its own pytest process, the plugin loaded
    from its entry point."""
    namespace: dict[str, Any] = {"__name__": "doc_example"}
    exec(compile("\n" * block.line + block.text, block.path, "exec"), namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_") and callable(fn)]
    assert len(tests) == 1, f"{block.where}: a pytest block holds one test function, not {len(tests)}"
    [test] = tests
    asked = list(inspect.signature(test).parameters)
    assert asked == ["kproxy"], f"{block.where}: {test.__name__} asks for {asked}; only the kproxy fixture is given"
    test(kproxy)


@pytest.mark.parametrize("block", of_mode("sh"))
def test_shell_blocks_run(block: Block, tmp_path: Path) -> None:
    work = _mirror(tmp_path)
    wanted = block.args.partition("files=")[2].split(",") if "files=" in block.args else []
    for name in filter(None, (w.strip() for w in wanted)):
        (work / name).write_bytes(EXAMPLE_FILES[name])
    for command in commands(block.text):
        done = _run(["bash", "-e", "-o", "pipefail", "-c", command], work)
        assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("block", of_mode("serve"))
def test_serve_blocks_start_serve_and_stop_cleanly(block: Block, tansu: Broker, tmp_path: Path) -> None:
    (command,) = commands(block.text)
    if command.startswith("kproxy broker"):
        _serve_broker(command, tmp_path)
        return
    assert command.startswith("kproxy run "), command
    given = re.findall(r"127\.0\.0\.1:\d+", command)
    ports = {a: f"127.0.0.1:{free_port()}" for a in given if a != "127.0.0.1:9092"}
    ports["127.0.0.1:9092"] = tansu.bootstrap  # the doc's broker is the test's broker
    live = re.sub(r"127\.0\.0\.1:\d+", lambda m: ports[m.group(0)], command)
    metrics = ports[_after(command, "--metrics-listen")]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "KPROXY_BROKER_PORT_BASE": str(free_port())}  # the default 19093+N may be taken here
    proc = subprocess.Popen(["bash", "-c", f"exec {live}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(f"http://{metrics}/readyz", proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _serve_broker(command: str, tmp_path: Path) -> None:
    """A ``kproxy broker`` block: its address a free port, the line naming it printed, a real client
    answered there, then Ctrl-C and exit 0."""
    address = f"127.0.0.1:{free_port()}"
    live = command.replace("127.0.0.1:9092", address)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(["bash", "-c", f"exec {live}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert address in line, (line, proc.stderr.read() if proc.stderr and proc.poll() is not None else "")
        from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

        metadata = AdminClient({"bootstrap.servers": address}).list_topics(timeout=15)
        assert [f"{b.host}:{b.port}" for b in metadata.brokers.values()] == [address]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _after(command: str, flag: str) -> str:
    match = re.search(rf"{flag}[ =](\S+)", command)
    assert match is not None, f"{flag} not in {command}"
    return match.group(1)


def _wait_ready(url: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"kproxy exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready within 30 s")


def _mirror(tmp_path: Path) -> Path:
    """A directory that reads like the repository root: links to its entries, copies of those
    a block may write to."""
    work = tmp_path / "repo"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in COPIED:
            shutil.copytree(entry, work / entry.name)
        elif entry.name not in (".git",):
            (work / entry.name).symlink_to(entry)
    return work


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


# -- what a newcomer is pointed to exists and says what they look for ---------------------------------
def test_the_chart_has_the_readme_its_values_point_to() -> None:
    values = (ROOT / "helm" / "kproxy" / "values.yaml").read_text()
    assert "(see README.md)" in values
    chart_readme = (ROOT / "helm" / "kproxy" / "README.md").read_text()
    for needed in ("kproxy.sidecar", "kproxy.sidecar.volumes", "image.repository", "mode: sidecar", "helm install"):
        assert needed in chart_readme, needed


def test_the_readme_shows_the_pytest_plugin_it_ships() -> None:
    readme = [b for b in BLOCKS if b.path == "README.md"]
    assert any(b.mode == "pytest" and "def test_" in b.text for b in readme), "no runnable plugin example"
    lines = (ROOT / "README.md").read_text().splitlines()
    layout = next(line for line in lines if line.startswith("| `kproxy/testing/`"))
    assert "pytest plugin" in layout and "seed" not in layout, layout


def test_deploy_readme_names_every_dashboard_variable() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "kproxy-dashboard.json").read_text())
    names = [v["name"] for v in dashboard["templating"]["list"]]
    grafana = (ROOT / "deploy" / "README.md").read_text().partition("## Grafana")[2]
    missing = [n for n in names if f"`{n}`" not in grafana]
    assert not missing, f"deploy/README.md's Grafana section does not name: {missing}"
