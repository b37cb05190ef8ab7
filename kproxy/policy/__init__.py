"""The rule policy: the rules in force applied to each connection's requests. Sans-IO, no trio.

* :mod:`.live_rules` - :class:`LiveRules`, the rule set in force, replaceable while connections run.
* :mod:`.injector`   - :class:`FaultInjector`, one rule set at work (engine, counters, per-rule plans).
* :mod:`.policy`     - :class:`RulePolicy`, one connection's
  :class:`~kproxy.proxy.session.RequestPolicy`: a decision of the rules -> the session's verdict.
* :mod:`.faults`     - :class:`FaultRecord` (the admin API's ``/faults``) and the fault log line.
* :mod:`.peer`       - a client's address, hashed once for the engine's per-peer cache.

It stands below the server and the admin API, which both use it, and above kproxy.rules and
kproxy.proxy, which it wires together (pyproject.toml's import contracts). Nothing is imported
here: importers name the module they use.
"""
