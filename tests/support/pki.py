"""A throwaway CA and a server certificate for localhost and 127.0.0.1, as PEM files (trustme)."""

from __future__ import annotations

from pathlib import Path

import trustme


def server_pki(directory: Path) -> dict[str, Path]:
    """``ca``, ``cert`` and ``key`` PEM files in ``directory``: a server certificate for localhost and
    127.0.0.1 signed by a CA made for it."""
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    files = {"ca": directory / "ca.pem", "cert": directory / "server.pem", "key": directory / "server.key"}
    ca.cert_pem.write_to_path(files["ca"])
    server.private_key_pem.write_to_path(files["key"])
    server.cert_chain_pems[0].write_to_path(files["cert"])
    return files
