"""kproxy's admin API: rules changed while kproxy runs (docs/ADMIN.md).

* :mod:`kproxy.admin.book` -- the rule-editing logic (JSON values -> the rules in force);
* :mod:`kproxy.admin.server` -- its HTTP side (trio, h11), started by ``kproxy run --admin-listen``;
* :mod:`kproxy.admin.client` -- a small client (stdlib only), used by ``kproxy rules ... --admin``
  and the pytest plugin (kproxy/testing/pytest_plugin.py).

Nothing is imported here: the client must stay importable without trio or the server.
"""
