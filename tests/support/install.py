"""The README's install as a user runs it, for the install test modules (test_install_*.py): its
commands as written, fresh venvs holding nothing of this checkout, a copy of the repository as a
fresh clone has it, and a PATH with or without a C compiler."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kproxy.testing import free_port
from tests.support.doc_blocks import ROOT, Block, all_blocks, commands

# What a checkout holds that a fresh clone has not (a build of the hot path, venvs, caches).
NOT_IN_A_CLONE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "_native", "__pycache__", "*.egg-info",
                                        ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis", "node_modules")
COMPILER = re.compile(r"(.*-)?(gcc|cc|clang|c89|c99|tcc)(-[0-9.]+)?")
PURE_LINE = "kproxy: building a pure-Python wheel: "
PURE_WHEEL = "kproxy_kafka-0.1.0-py3-none-any.whl"
COMPILED_WHEEL = (f"kproxy_kafka-0.1.0-cp{sys.version_info[0]}{sys.version_info[1]}-"
                  f"cp{sys.version_info[0]}{sys.version_info[1]}-linux_x86_64.whl")
TIMEOUT = 1800
# A module of [tool.kproxy.native] that imports nothing of kproxy: compiled alone, it makes a build of
# the same shape as the whole list's (mypyc's C, an extension and a manifest in build/, the same
# setup.py path) at a fraction of its cost, for the checks that need a compiled build but not all of it.
ONE_MODULE = "kproxy.metrics.fixed_histogram"


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


def verbose_wheel() -> str:
    """The README's wheel build with ``pip -v``, which shows the build's output (the one line saying why)."""
    return command("python -m pip wheel").replace("pip wheel", "pip wheel -v", 1)


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


def clone(where: Path) -> Path:
    """The repository as a fresh clone has it, copied to ``where`` (outside this checkout)."""
    shutil.copytree(ROOT, where, ignore=NOT_IN_A_CLONE, symlinks=True)
    return where


def have_a_compiler() -> bool:
    return shutil.which("gcc") is not None or shutil.which("cc") is not None


def pure_lines(built: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines of a ``pip -v`` build saying why its wheel is pure Python."""
    return [line.strip() for line in (built.stdout + built.stderr).splitlines() if PURE_LINE in line]


def wheels(checkout: Path) -> list[str]:
    """The names of the wheels in ``checkout``'s dist/."""
    return sorted(w.name for w in (checkout / "dist").glob("*.whl"))


def version(venv: Venv, cwd: Path) -> str:
    return venv.sh(command("kproxy --version"), cwd).stdout


def run_check(venv: Venv, tmp_path: Path) -> None:
    """``kproxy run --check`` of a config with a capture, as installed in ``venv``: at most one line on stderr."""
    config = tmp_path / "kproxy.yaml"
    config.write_text(f"upstream: 127.0.0.1:9092\nlisten: 127.0.0.1:{free_port()}\n"
                      f"metrics_listen: 127.0.0.1:{free_port()}\ncapture: {{dir: {tmp_path / 'capture'}}}\n")
    done = venv.sh(f"kproxy run --config {config} --check", tmp_path)
    assert done.stderr.count("\n") <= 1, done.stderr


@contextmanager
def one_native_module(checkout: Path) -> Iterator[None]:
    """``checkout``'s pyproject.toml with [tool.kproxy.native] listing :data:`ONE_MODULE` alone, put back after."""
    pyproject = checkout / "pyproject.toml"
    text = pyproject.read_text()
    start = text.index("modules = [", text.index("[tool.kproxy.native]"))
    end = text.index("]\n", start) + 2
    assert f'"{ONE_MODULE}"' in text[start:end], f"pyproject.toml [tool.kproxy.native] no longer lists {ONE_MODULE}"
    pyproject.write_text(text[:start] + f'modules = ["{ONE_MODULE}"]\n' + text[end:])
    try:
        yield
    finally:
        pyproject.write_text(text)
