"""A client of kproxy's admin API (docs/ADMIN.md): the standard library only (urllib, json).

``kproxy rules list|apply|add|enable|disable|delete|reset|faults`` and the pytest plugin
(kproxy/testing/pytest_plugin.py) both use it. Every call is one HTTP request on a fresh
connection; it raises :class:`AdminRefused` when kproxy answers with an error (the server's JSON
errors attached) and :class:`AdminUnreachable` when no answer comes.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

DEFAULT_TIMEOUT = 10.0
DEFAULT_URL = "http://127.0.0.1:9901"  # where ``--admin-listen 127.0.0.1:9901`` (the documented one) serves


class AdminUnreachable(Exception):
    """No HTTP answer from the admin API (refused, timed out, not HTTP)."""


class AdminRefused(Exception):
    """kproxy answered with an error status; ``errors`` are its ``{"path", "reason"[, "hint"]}``."""

    def __init__(self, status: int, errors: list[dict[str, str]]) -> None:
        self.status = status
        self.errors = errors
        super().__init__(f"HTTP {status}: " + "; ".join(format_error(e) for e in errors))


def format_error(entry: Mapping[str, str]) -> str:
    """``path: reason (hint)``: a problem as ``kproxy rules check`` prints one, without file and line."""
    hint = entry.get("hint")
    return f"{entry.get('path', '?')}: {entry.get('reason', '?')}" + (f" ({hint})" if hint else "")


def admin_url(where: str) -> str:
    """The URL of the admin API at ``where``: a URL (``http://host:port``), or ``host:port`` as
    ``--admin-listen`` takes it (``http://`` is then assumed: the API has no TLS of its own)."""
    where = where.strip()
    return where if "://" in where else f"http://{where}"


class AdminClient:
    """``AdminClient("http://127.0.0.1:9901", token=None)``: one method per endpoint. ``url`` may
    also be ``host:port`` (:func:`admin_url`)."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = admin_url(url).rstrip("/")
        self.token = token
        self.timeout = timeout

    # -- rules --------------------------------------------------------------------------
    def rules(self) -> dict[str, Any]:
        """The rules in force: ``{"generation", "origin", "file", "diverged", "seed", "rules": [...]}``."""
        return self._call("GET", "/rules")

    def rule(self, rule_id: str) -> dict[str, Any]:
        return self._call("GET", _rule_path(rule_id))

    def add(self, rule: Mapping[str, Any]) -> dict[str, Any]:
        """Append a rule (a rule of a rule file, as a mapping); refused if its id exists."""
        return self._call("POST", "/rules", rule)

    def put(self, rule: Mapping[str, Any]) -> dict[str, Any]:
        """Replace the rule with ``rule["id"]`` in place, or add it."""
        return self._call("PUT", _rule_path(str(rule.get("id", ""))), rule)

    def apply(self, rules: Mapping[str, Any]) -> dict[str, Any]:
        """Replace every rule with a rule file's content (``{"seed": N, "rules": [...]}``)."""
        return self._call("PUT", "/rules", rules)

    def enable(self, rule_id: str) -> dict[str, Any]:
        return self._call("POST", _rule_path(rule_id) + "/enable")

    def disable(self, rule_id: str) -> dict[str, Any]:
        return self._call("POST", _rule_path(rule_id) + "/disable")

    def set_dry_run(self, rule_id: str, dry_run: bool = True) -> dict[str, Any]:
        return self._call("PATCH", _rule_path(rule_id), {"dry_run": dry_run})

    def delete(self, rule_id: str) -> dict[str, Any]:
        return self._call("DELETE", _rule_path(rule_id))

    def reset(self) -> dict[str, Any]:
        """Back to the rules of kproxy's rule file (none without one)."""
        return self._call("POST", "/reset")

    def faults(self, limit: int = 100, rule: str | None = None) -> list[dict[str, Any]]:
        """The most recent faults done, newest first."""
        return list(self.faults_report(limit, rule)["faults"])

    def faults_report(self, limit: int = 100, rule: str | None = None) -> dict[str, Any]:
        """``GET /faults`` whole: ``{"faults": [...], "never_fired": [{"id", "age_seconds"}...]}``, the
        most recent faults newest first and the enabled rules with no hit since the rules went in force."""
        query = {"limit": str(limit), **({"rule": rule} if rule is not None else {})}
        return self._call("GET", "/faults?" + urlencode(query))

    # -- HTTP ---------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            with exc:
                raw = exc.read()
            try:
                errors = list(json.loads(raw)["errors"])
            except (ValueError, KeyError, TypeError):
                errors = [{"path": "(response)", "reason": raw.decode("utf-8", "replace")[:200] or exc.reason}]
            raise AdminRefused(exc.code, errors) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise AdminUnreachable(f"{self.url}: {reason}") from None


def _rule_path(rule_id: str) -> str:
    return "/rules/" + quote(rule_id, safe="")


__all__ = ["DEFAULT_URL", "AdminClient", "AdminRefused", "AdminUnreachable", "admin_url", "format_error"]
