"""Rule actions, one module per kind: what a rule does to the requests it matches.

Each kind module (``delay.py``, ``inject_error.py``...) holds the whole kind: its frozen dataclass,
its YAML reader, what it does to a request and to a response, and its part of the verdict (see
:class:`~kproxy.rules.actions.base.RuleAction`). :mod:`.registry` lists every kind by its YAML
name; :mod:`.draft` is the verdict being written (:class:`~kproxy.rules.actions.draft.VerdictDraft`).

This package module imports nothing, so that :mod:`kproxy.rules.model` can import the base class
without loading every kind (the kinds import the model's neighbours).
"""
