"""The README's install where a C compiler is, as a user runs it: the wheel built once its way (in a
copy of the checkout, through pip's isolated build), copied elsewhere and installed from there with
its extras into a fresh venv; then that install used as a user uses it: ``kproxy --version``,
``kproxy run --check``, the README's pytest plugin example, and ``kproxy analyze`` of a capture the
install wrote. (Without a compiler: test_install_pure.py; mypyc or the compiler failing:
test_install_fallback.py.)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from kproxy.testing import Broker, free_port, wait_for_port
from tests.support.e2e import round_trip
from tests.support.install import (
    COMPILED_WHEEL,
    PLUGIN_EXAMPLE,
    Venv,
    clone,
    command,
    fresh_venv,
    have_a_compiler,
    pinned_test_requirements,
    run_check,
    system_path,
    version,
    wheels,
)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The wheel built the README's way where a C compiler is, copied elsewhere, installed from there
    with its extras into a fresh venv."""
    if not have_a_compiler():
        pytest.skip("no C compiler on this machine: the compiled wheel cannot be built here")
    checkout = clone(tmp_path_factory.mktemp("clone") / "kproxy")
    venv = fresh_venv(tmp_path_factory.mktemp("compiled") / "venv", system_path())
    venv.sh(command("python -m pip wheel"), checkout)
    assert wheels(checkout) == [COMPILED_WHEEL]
    elsewhere = venv.path.parent / "elsewhere"
    shutil.copytree(checkout / "dist", elsewhere / "dist")
    venv.sh(command("pip install --find-links dist"), elsewhere)
    return venv


def test_the_wheel_is_compiled_and_installs_with_its_extras(compiled: Venv, tmp_path: Path) -> None:
    said = version(compiled, tmp_path)
    assert said.startswith("kproxy 0.1.0\nbuild: compiled (mypyc "), said
    where = compiled.sh("python -c 'import kproxy, pyspark, pyarrow, matplotlib; print(kproxy.__file__)'", tmp_path)
    assert where.stdout.startswith(str(compiled.path)), where.stdout  # the venv's, not this checkout's
    run_check(compiled, tmp_path)


def test_the_readme_plugin_example_passes_on_that_install(compiled: Venv, tansu: Broker, tmp_path: Path) -> None:
    pins = pinned_test_requirements()
    compiled.sh(f"python -m pip install --quiet '{pins['pytest']}' '{pins['confluent-kafka']}'", tmp_path)
    (tmp_path / "test_example.py").write_text(PLUGIN_EXAMPLE)
    done = compiled.sh(f"python -m pytest -q -p no:cacheprovider test_example.py --kproxy-upstream {tansu.bootstrap}",
                       tmp_path, timeout=300)
    assert "1 passed" in done.stdout, done.stdout


def test_kproxy_analyze_reads_a_capture_that_install_wrote(compiled: Venv, tansu: Broker, tmp_path: Path) -> None:
    java = os.environ.get("JAVA_HOME") or shutil.which("java")
    if java is None:
        pytest.skip("no Java on this machine (kproxy analyze runs Spark: Java 17+)")
    listen, metrics = free_port(), free_port()
    capture = tmp_path / "capture"
    config = tmp_path / "kproxy.yaml"
    config.write_text(f"upstream: {tansu.bootstrap}\nlisten: 127.0.0.1:{listen}\nbroker_port_base: {free_port()}\n"
                      f"metrics_listen: 127.0.0.1:{metrics}\ncapture: {{dir: {capture}}}\n")
    log = (tmp_path / "kproxy.log").open("w")
    proc = subprocess.Popen([compiled.bin("kproxy"), "run", "--config", str(config)], env=compiled.env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port("127.0.0.1", listen)
        round_trip(f"127.0.0.1:{listen}", "installed", 100)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (tmp_path / "kproxy.log").read_text()[-3000:]
        log.close()
    assert list(capture.rglob("*.parquet")), "the install wrote no capture"
    done = compiled.sh(f"kproxy analyze {capture} --out {tmp_path / 'report'}", tmp_path, timeout=600)
    assert (tmp_path / "report" / "report.html").is_file()
    assert "produce" in done.stdout, done.stdout
