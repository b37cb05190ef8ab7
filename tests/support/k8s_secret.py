"""A Kubernetes Secret volume as the kubelet lays it out and updates it (AtomicWriter), for the tests
of secret files kproxy re-reads."""

from __future__ import annotations

import os
from pathlib import Path


def kubernetes_secret(root: Path, password: str) -> Path:
    """A Secret volume as the kubelet lays it out (AtomicWriter): ``password`` -> ``..data/password``,
    ``..data`` -> a timestamped directory holding the file. Returns the path kproxy is given."""
    root.mkdir(exist_ok=True)
    swap(root, password, "..2024_01_01_00_00_00.1")
    (root / "password").symlink_to("..data/password")
    return root / "password"


def swap(root: Path, password: str, version: str) -> None:
    """What the kubelet does on an update: a new directory, then ``..data`` renamed over atomically."""
    directory = root / version
    directory.mkdir()
    (directory / "password").write_text(password)
    tmp = root / "..data_tmp"
    tmp.symlink_to(version)
    os.replace(tmp, root / "..data")
