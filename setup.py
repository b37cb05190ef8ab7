"""setuptools' hook for the compiled hot path: pyproject.toml holds everything else.

A wheel (``pip wheel .``, ``pip install .``, the Dockerfile's build stage) carries the modules of
``[tool.kproxy.native] modules`` compiled by mypyc under ``kproxy/_native/`` beside the pure
sources, when a C compiler and the Python headers are there (scripts/native_build.py). A wheel is
never refused for the compiled part: without a compiler, when mypyc fails (a type it cannot find,
a module it cannot compile) or when the C compiler fails on its output, the wheel is pure Python
(tagged ``py3-none-any``), one line says why (``pip -v`` shows it), and the wheel keeps that line in
``kproxy/_native/not-built.txt``, which ``kproxy --version`` prints. ``KPROXY_PURE=1`` builds a pure
wheel on purpose. An editable install (``pip install -e``, scripts/setup's) compiles nothing:
scripts/setup builds the checkout's own ``kproxy/_native/`` (scripts/native_build.py), and rebuilds
it when a source it was built from changes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.errors import CCompilerError, ExecError, PlatformError

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
import native_build

PURE = os.environ.get("KPROXY_PURE", "").strip().lower() in ("1", "true", "yes", "on")
WHEEL = "bdist_wheel" in sys.argv or "build_ext" in sys.argv  # not editable_wheel, egg_info, sdist
NOT_BUILT = native_build.NATIVE / "not-built.txt"  # kproxy.native.NOT_BUILT

# Why this wheel is pure Python, once it is known (empty: it is compiled, or not a wheel build).
pure_because: list[str] = []


def fall_back(why: str, build_lib: Path | None = None) -> None:
    """Make the wheel pure Python, saying ``why`` in one line and, in ``build_lib``, to kproxy --version."""
    pure_because.append(why)
    print(f"kproxy: building a pure-Python wheel: {why}", file=sys.stderr, flush=True)
    if build_lib is not None:
        write_not_built(build_lib)


def write_not_built(build_lib: Path) -> None:
    native_build.clear(build_lib)  # whatever a failed build left: nothing compiled goes in
    note = build_lib / NOT_BUILT
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(pure_because[0] + "\n")


class BuildPy(build_py):  # type: ignore[misc]
    def run(self) -> None:
        super().run()
        if pure_because:
            write_not_built(Path(self.build_lib))


ext_modules = []
cmdclass: dict[str, type] = {"build_py": BuildPy}
if WHEEL and PURE:
    fall_back("KPROXY_PURE was set")
elif WHEEL:
    missing = native_build.compiler_missing()
    if missing is not None:
        fall_back(missing)
    else:
        modules = native_build.listed_modules()
        sources = native_build.source_stamps(native_build.source_closure(modules))  # before mypyc reads them
        try:
            ext_modules = native_build.extensions(modules)
        except native_build.NotBuilt as failed:
            fall_back(str(failed))
    if ext_modules:
        from setuptools.command.bdist_wheel import bdist_wheel

        class BuildExt(native_build.build_ext_class()):  # type: ignore[misc]
            def run(self) -> None:
                native_build.clear(Path(self.build_lib))  # what an earlier build of this tree left there
                try:
                    super().run()
                except (CCompilerError, ExecError, PlatformError, OSError) as exc:
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    fall_back(f"the C compiler failed on mypyc's output: {first}", Path(self.build_lib))
                    return
                native_build.write_manifest(Path(self.build_lib), modules, sources)

        class BdistWheel(bdist_wheel):  # type: ignore[misc]
            def get_tag(self) -> tuple[str, str, str]:
                # Asked once the build ran: a build that fell back holds no extension, so the wheel
                # is pure, whatever the extensions declared up front made setuptools expect.
                if pure_because:
                    self.root_is_pure = True
                tag: tuple[str, str, str] = super().get_tag()
                return tag

        cmdclass["build_ext"] = BuildExt
        cmdclass["bdist_wheel"] = BdistWheel

setup(ext_modules=ext_modules, cmdclass=cmdclass)
