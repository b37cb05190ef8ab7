"""kafkajs, the Node.js client, for tests: installed from npm once per machine, run as a subprocess.

:func:`kafkajs_home` installs the pinned version into a cache directory (``KPROXY_TEST_NODE_CACHE``,
else ``~/.cache/kproxy-tests/node``) the first time, under a file lock so that parallel workers
install it once; :func:`run_node` runs one of the scripts of tests/support/node/ with it. A machine
without ``node`` and ``npm`` skips the tests that use them (they say so).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

KAFKAJS_VERSION = "2.2.4"
SCRIPTS = Path(__file__).resolve().parent / "node"


def kafkajs_home() -> Path:
    """A directory whose node_modules holds kafkajs (installed now if it is not yet)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("kafkajs tests need node and npm on PATH")
    root = Path(os.environ.get("KPROXY_TEST_NODE_CACHE", Path.home() / ".cache" / "kproxy-tests" / "node"))
    home = root / f"kafkajs-{KAFKAJS_VERSION}"
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / "node_modules" / "kafkajs" / "package.json").is_file():
            done = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(home),
                                   f"kafkajs@{KAFKAJS_VERSION}"], capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"npm install kafkajs failed: {done.stderr[-2000:]}"
    return home


def run_node(script: str, config: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
    """Run tests/support/node/``script`` with ``config`` (as JSON, its one argument); the JSON
    lines it printed."""
    env = {**os.environ, "NODE_PATH": str(kafkajs_home() / "node_modules")}
    done = subprocess.run(["node", str(SCRIPTS / script), json.dumps(config)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert done.returncode == 0, f"node {script} failed ({done.returncode}): {done.stderr[-2000:]}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
