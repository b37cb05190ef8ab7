"""kproxy's admin API: rules changed while kproxy runs (docs/ADMIN.md).

* :mod:`kproxy.admin.book` -- the rule-editing logic (JSON values -> the rules in force), edits
  planned and built off the loop;
* :mod:`kproxy.admin.listing` -- what the API shows of the rules, from a snapshot (any thread);
* :mod:`kproxy.admin.jsonbody` -- request bodies decoded as JSON within bounds;
* :mod:`kproxy.admin.api_server` -- its HTTP side, served by kproxy/http_server.py, started by
  ``kproxy run --admin-listen``;
* :mod:`kproxy.admin.api_client` -- a small client (stdlib only), used by ``kproxy rules ... --admin``
  and the pytest plugin (kproxy/testing/pytest_plugin.py).

Nothing is imported here: the client must stay importable without trio or the server.
"""
