"""The README's install where no C compiler is, as a user runs it: in a copy of the checkout, with
no compiler on PATH, the wheel is pure Python and one line says why, and ``pip install '.[capture]'``
from the checkout installs that way. Where the machine has a compiler, the checkout first holds a
real compiled build in its build/ (what a user who built there before has): nothing of it may reach
the pure wheel or that install, nor the wheel of a compiler that fails on mypyc's output, which
builds in the same build/ directory as that compiled build. (The compiled install:
test_install_compiled.py; mypyc failing: test_install_fallback.py.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.support.install import (
    COMPILED_WHEEL,
    PURE_LINE,
    PURE_WHEEL,
    Venv,
    clone,
    command,
    fresh_venv,
    have_a_compiler,
    one_native_module,
    path_without_a_compiler,
    pure_lines,
    run_check,
    system_path,
    verbose_wheel,
    version,
    wheels,
)


def leave_a_compiled_build(checkout: Path, venv: Venv) -> None:
    """Build the README's wheel in ``checkout`` with a C compiler (of one native module: the shape of a
    whole build at less cost), then drop dist/: build/ keeps that compiled build."""
    with one_native_module(checkout):
        venv.sh(command("python -m pip wheel"), checkout)
    assert wheels(checkout) == [COMPILED_WHEEL]
    assert compiled_in_build(checkout), "the compiled build left no extension in build/"
    shutil.rmtree(checkout / "dist")


def compiled_in_build(checkout: Path) -> list[str]:
    return [p.name for p in (checkout / "build").rglob("*.so")]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv whose PATH has no C compiler."""
    work = tmp_path_factory.mktemp("pure")
    venv = fresh_venv(work / "venv", path_without_a_compiler(work / "bin"))
    assert shutil.which("gcc", path=venv.env["PATH"]) is None and shutil.which("cc", path=venv.env["PATH"]) is None
    return venv


def with_a_compiler(venv: Venv) -> Venv:
    """``venv`` with the machine's PATH, its compilers included."""
    return Venv(venv.path, {**venv.env, "PATH": os.pathsep.join([str(venv.path / "bin"), *system_path()])})


@pytest.fixture(scope="module")
def checkout(venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout; where the machine has a compiler, holding a compiled build in build/."""
    checkout = clone(tmp_path_factory.mktemp("clone") / "kproxy")
    if have_a_compiler():
        leave_a_compiled_build(checkout, with_a_compiler(venv))
    return checkout


@pytest.fixture(scope="module")
def pure(venv: Venv, checkout: Path) -> tuple[Venv, subprocess.CompletedProcess[str], Path]:
    """In that checkout, with no C compiler on PATH: the wheel, built with pip -v to show its build's
    output, then ``pip install '.[capture]'``."""
    built = venv.sh(verbose_wheel(), checkout)
    venv.sh(command("pip install '.["), checkout)
    return venv, built, checkout


def test_without_a_compiler_the_wheel_is_pure_and_says_why_in_one_line(
        pure: tuple[Venv, subprocess.CompletedProcess[str], Path]) -> None:
    _, built, checkout = pure
    assert pure_lines(built) == [f"{PURE_LINE}no C compiler (gcc)"]
    assert wheels(checkout) == [PURE_WHEEL]
    with zipfile.ZipFile(checkout / "dist" / PURE_WHEEL) as archive:
        assert not [n for n in archive.namelist() if n.endswith(".so")], archive.namelist()


def test_pip_install_from_the_checkout_without_a_compiler(pure: tuple[Venv, subprocess.CompletedProcess[str], Path],
                                                          tmp_path: Path) -> None:
    venv, _, _ = pure
    said = version(venv, tmp_path)
    assert said == "kproxy 0.1.0\nbuild: pure Python (the wheel was built pure: no C compiler (gcc))\n", said
    probe = "import kproxy, pathlib; print(*pathlib.Path(kproxy.__file__).parent.rglob('*.so'))"
    listing = venv.sh(f'python -c "{probe}"', tmp_path)
    assert listing.stdout.strip() == ""  # nothing compiled left from the earlier build of the same checkout
    run_check(venv, tmp_path)


def test_when_the_compiler_fails_on_mypycs_output_the_wheel_is_pure(venv: Venv, checkout: Path) -> None:
    """The compiler found, but failing on mypyc's C: the wheel, declared with extensions, is pure all
    the same, and holds nothing of the compiled build its build directory already has. The compiler
    fails on whatever C it is given, so mypyc is given one module's worth."""
    if have_a_compiler():  # CC=false needs none: only the compiled build to build over does
        assert compiled_in_build(checkout), "the checkout's build/ no longer holds the compiled build"
    shutil.rmtree(checkout / "dist", ignore_errors=True)
    failing = with_a_compiler(venv)
    failing.env["CC"] = "false"
    with one_native_module(checkout):
        lines = pure_lines(failing.sh(verbose_wheel(), checkout))
    assert len(lines) == 1 and lines[0].startswith(f"{PURE_LINE}the C compiler failed on mypyc's output: "), lines
    assert wheels(checkout) == [PURE_WHEEL]
    with zipfile.ZipFile(checkout / "dist" / PURE_WHEEL) as archive:
        names = archive.namelist()
        assert "kproxy/_native/not-built.txt" in names and not [n for n in names if n.endswith(".so")], names
        assert "Root-Is-Purelib: true" in archive.read("kproxy_kafka-0.1.0.dist-info/WHEEL").decode()
