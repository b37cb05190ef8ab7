"""The README's install, as a user runs it: its commands, as written, in fresh venvs outside the
checkout (a copy of it), through pip's isolated build; then the installed kproxy used as a user
uses it: ``kproxy --version``, ``kproxy run --check``, the README's pytest plugin example, and
``kproxy analyze`` of a capture that install wrote.

Two machines in one: with a C compiler on PATH, the wheel is built once the README's way and
installed with its extras from the directory it was copied to (compiled, every later check reuses
it); then, in the same checkout, with no compiler on PATH, the wheel is pure Python and one line
says why, and ``pip install '.[capture]'`` from the checkout installs that way.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from kproxy.testing import Broker, free_port, wait_for_port
from tests.support.doc_blocks import ROOT, Block, all_blocks, commands
from tests.support.e2e import consume_confluent, create_topic, produce_confluent, unique

# What a checkout holds that a fresh clone has not (a build of the hot path, venvs, caches).
NOT_IN_A_CLONE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "_native", "__pycache__", "*.egg-info",
                                        ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis", "node_modules")
COMPILER = re.compile(r"(.*-)?(gcc|cc|clang|c89|c99|tcc)(-[0-9.]+)?")
PURE_LINE = "kproxy: building a pure-Python wheel: "
TIMEOUT = 1800


def readme_block(section: str, mode: str, needle: str) -> Block:
    """The README block of ``mode`` holding ``needle`` (the one of ``section``)."""
    found = [b for b in all_blocks() if b.path == "README.md" and b.mode == mode and needle in b.text]
    assert len(found) == 1, f"README.md: {section}: one {mode} block holding {needle!r}, found {len(found)}"
    return found[0]


INSTALL = commands(readme_block("Install", "skip", "pip wheel").text)
PLUGIN_EXAMPLE = readme_block("Testing your Kafka code against faults", "pytest", "def test_").text


def command(prefix: str) -> str:
    """The README's install command starting with ``prefix``, as written (its trailing comment kept)."""
    [found] = [c for c in INSTALL if c.startswith(prefix)]
    return found


def pinned_test_requirements() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        test = tomllib.load(f)["project"]["optional-dependencies"]["test"]
    return {re.split(r"[=<>!~ ]", r, maxsplit=1)[0].lower(): r for r in test}


@dataclass
class Venv:
    """A fresh venv and the environment its user's shell has: its bin first, nothing of this checkout."""

    path: Path
    env: dict[str, str]

    def sh(self, line: str, cwd: Path, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["bash", "-e", "-c", line], cwd=cwd, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        assert done.returncode == 0, f"{line}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        return done

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)


def fresh_venv(where: Path, path_dirs: list[str]) -> Venv:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "KPROXY_PURE", "KPROXY_TEST_BUILD", "CC", "PYTEST_ADDOPTS")}
    env["PATH"] = os.pathsep.join([str(where / "bin"), *path_dirs])
    env["VIRTUAL_ENV"] = str(where)
    return Venv(where, env)


def system_path() -> list[str]:
    """This PATH without venvs (this test's own among them): a user's shell."""
    return [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not (Path(d).parent / "pyvenv.cfg").is_file()]


def path_without_a_compiler(shims: Path) -> list[str]:
    """One directory holding every command of :func:`system_path` but the C compilers."""
    shims.mkdir()
    for directory in system_path():
        for entry in sorted(Path(directory).glob("*")) if Path(directory).is_dir() else []:
            target = shims / entry.name
            if COMPILER.fullmatch(entry.name) or target.exists() or target.is_symlink():
                continue
            target.symlink_to(entry)
    return [str(shims)]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository as a fresh clone has it, outside this checkout."""
    copy = tmp_path_factory.mktemp("clone") / "kproxy"
    shutil.copytree(ROOT, copy, ignore=NOT_IN_A_CLONE, symlinks=True)
    return copy


def have_a_compiler() -> bool:
    return shutil.which("gcc") is not None or shutil.which("cc") is not None


@pytest.fixture(scope="module")
def compiled(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The wheel built the README's way where a C compiler is, copied elsewhere, installed from there
    with its extras into a fresh venv."""
    if not have_a_compiler():
        pytest.skip("no C compiler on this machine: the compiled wheel cannot be built here")
    venv = fresh_venv(tmp_path_factory.mktemp("compiled") / "venv", system_path())
    venv.sh(command("python -m pip wheel"), checkout)
    wheels = sorted((checkout / "dist").glob("kproxy_kafka-*.whl"))
    assert [w.name for w in wheels] == [f"kproxy_kafka-0.1.0-cp{sys.version_info[0]}{sys.version_info[1]}-"
                                        f"cp{sys.version_info[0]}{sys.version_info[1]}-linux_x86_64.whl"], wheels
    elsewhere = venv.path.parent / "elsewhere"
    shutil.copytree(checkout / "dist", elsewhere / "dist")
    venv.sh(command("pip install --find-links dist"), elsewhere)
    return venv


@pytest.fixture(scope="module")
def pure(checkout: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[Venv, str]:
    """In the same checkout (where a compiler is, the compiled build left in its build/), with no C
    compiler on PATH: the wheel, built with pip -v to show its build's output, then
    ``pip install '.[capture]'``."""
    if have_a_compiler():
        request.getfixturevalue("compiled")
    work = tmp_path_factory.mktemp("pure")
    venv = fresh_venv(work / "venv", path_without_a_compiler(work / "bin"))
    assert shutil.which("gcc", path=venv.env["PATH"]) is None and shutil.which("cc", path=venv.env["PATH"]) is None
    shutil.rmtree(checkout / "dist", ignore_errors=True)
    built = venv.sh(command("python -m pip wheel").replace("pip wheel", "pip wheel -v", 1), checkout)
    venv.sh(command("pip install '.["), checkout)
    return venv, built.stdout + built.stderr


def version(venv: Venv, tmp_path: Path) -> str:
    return venv.sh(command("kproxy --version"), tmp_path).stdout


def run_check(venv: Venv, tmp_path: Path) -> None:
    config = tmp_path / "kproxy.yaml"
    config.write_text(f"upstream: 127.0.0.1:9092\nlisten: 127.0.0.1:{free_port()}\n"
                      f"metrics_listen: 127.0.0.1:{free_port()}\ncapture: {{dir: {tmp_path / 'capture'}}}\n")
    done = venv.sh(f"kproxy run --config {config} --check", tmp_path)
    assert done.stderr.count("\n") <= 1, done.stderr


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
        bootstrap = f"127.0.0.1:{listen}"
        topic = unique("installed")
        create_topic(bootstrap, topic, partitions=2)
        sent = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(100)]
        produce_confluent(bootstrap, topic, sent).flush(10)
        assert len(consume_confluent(bootstrap, topic, 2, len(sent))) == len(sent)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (tmp_path / "kproxy.log").read_text()[-3000:]
        log.close()
    assert list(capture.rglob("*.parquet")), "the install wrote no capture"
    done = compiled.sh(f"kproxy analyze {capture} --out {tmp_path / 'report'}", tmp_path, timeout=600)
    assert (tmp_path / "report" / "report.html").is_file()
    assert "produce" in done.stdout, done.stdout


def test_without_a_compiler_the_wheel_is_pure_and_says_why_in_one_line(pure: tuple[Venv, str],
                                                                      checkout: Path) -> None:
    _, output = pure
    lines = [line.strip() for line in output.splitlines() if PURE_LINE in line]
    assert lines == [f"{PURE_LINE}no C compiler (gcc)"], lines
    assert [w.name for w in (checkout / "dist").glob("*.whl")] == ["kproxy_kafka-0.1.0-py3-none-any.whl"]


def test_pip_install_from_the_checkout_without_a_compiler(pure: tuple[Venv, str], tmp_path: Path) -> None:
    venv, _ = pure
    said = version(venv, tmp_path)
    assert said == "kproxy 0.1.0\nbuild: pure Python (the wheel was built pure: no C compiler (gcc))\n", said
    probe = "import kproxy, pathlib; print(*pathlib.Path(kproxy.__file__).parent.rglob('*.so'))"
    listing = venv.sh(f'python -c "{probe}"', tmp_path)
    assert listing.stdout.strip() == ""  # nothing compiled left from the earlier build of the same checkout
    run_check(venv, tmp_path)


def test_when_mypyc_or_the_compiler_fails_the_wheel_is_pure_and_says_why(tmp_path: Path) -> None:
    """Not only without a compiler: mypyc failing (here, as it did in every README install, for want
    of kproxy's dependencies in pip's isolated build environment) or the C compiler failing on its
    output gives a pure wheel and one line, never a failed install."""
    clone = tmp_path / "kproxy"
    shutil.copytree(ROOT, clone, ignore=NOT_IN_A_CLONE, symlinks=True)
    pyproject = clone / "pyproject.toml"
    text = pyproject.read_text()
    start = text.index("requires = [", text.index("[build-system]"))
    end = text.index("]\n", start) + 2
    pyproject.write_text(text[:start] + 'requires = ["setuptools>=77", "wheel", "mypy==2.4.1"]\n' + text[end:])
    venv = fresh_venv(tmp_path / "venv", system_path())
    wheel = command("python -m pip wheel").replace("pip wheel", "pip wheel -v", 1)
    built = venv.sh(wheel, clone)
    lines = [line.strip() for line in (built.stdout + built.stderr).splitlines() if PURE_LINE in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{PURE_LINE}mypyc failed: ") and 'module named "trio"' in lines[0], lines
    assert [w.name for w in (clone / "dist").glob("*.whl")] == ["kproxy_kafka-0.1.0-py3-none-any.whl"]
    venv.sh(command("pip install --find-links dist"), clone)
    said = version(venv, tmp_path)
    assert said.startswith("kproxy 0.1.0\nbuild: pure Python (the wheel was built pure: mypyc failed: "), said

    # The compiler found, but failing on mypyc's C: the wheel, declared with extensions, is pure all the same.
    pyproject.write_text(text)
    shutil.rmtree(clone / "dist")
    failing = Venv(venv.path, {**venv.env, "CC": "false"})
    built = failing.sh(wheel, clone)
    lines = [line.strip() for line in (built.stdout + built.stderr).splitlines() if PURE_LINE in line]
    assert len(lines) == 1 and lines[0].startswith(f"{PURE_LINE}the C compiler failed on mypyc's output: "), lines
    [pure_wheel] = (clone / "dist").glob("*.whl")
    assert pure_wheel.name == "kproxy_kafka-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(pure_wheel) as archive:
        names = archive.namelist()
        assert "kproxy/_native/not-built.txt" in names and not [n for n in names if n.endswith(".so")], names
        assert "Root-Is-Purelib: true" in archive.read("kproxy_kafka-0.1.0.dist-info/WHEEL").decode()

