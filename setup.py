"""setuptools' hook for the compiled hot path: pyproject.toml holds everything else.

A wheel (``pip wheel .``, ``pip install .``, the Dockerfile's build stage) carries the modules of
``[tool.kproxy.native] modules`` compiled by mypyc under ``kproxy/_native/`` beside the pure
sources, when a C compiler and the Python headers are there (scripts/native_build.py); without
them, the wheel is pure Python and one line says so. An editable install (``pip install -e``,
scripts/setup's) compiles nothing: scripts/setup builds the checkout's own ``kproxy/_native/``
(scripts/native_build.py), and rebuilds it when a source it was built from changes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
import native_build

PURE = os.environ.get("KPROXY_PURE", "").strip().lower() in ("1", "true", "yes", "on")
WHEEL = "bdist_wheel" in sys.argv or "build_ext" in sys.argv  # not editable_wheel, egg_info, sdist

ext_modules = []
cmdclass = {}
if WHEEL and not PURE:
    missing = native_build.compiler_missing()
    if missing is None:
        modules = native_build.listed_modules()
        sources = native_build.source_stamps(native_build.source_closure(modules))  # before mypyc reads them
        ext_modules = native_build.extensions(modules)
        base = native_build.build_ext_class()

        class build_ext(base):  # type: ignore[misc,valid-type]
            def run(self) -> None:
                super().run()
                native_build.write_manifest(Path(self.build_lib), modules, sources)

        cmdclass["build_ext"] = build_ext
    else:
        print(f"kproxy: {missing}: building a pure-Python wheel (the compiled hot path is left out)")

setup(ext_modules=ext_modules, cmdclass=cmdclass)
