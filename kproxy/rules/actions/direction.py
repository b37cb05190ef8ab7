"""The ``direction`` key of the byte-level toxics (``bandwidth``, ``slicer``, ``limit_data``,
``delay`` with ``at: wire``): which bytes of a matched connection they act on.

``upstream``: the client's bytes to the broker; ``downstream``: the bytes to the client (the
broker's answers and kproxy's own); ``both``. The default is ``downstream``, as in Toxiproxy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kproxy.toxics import Direction

if TYPE_CHECKING:
    import yaml

    from kproxy.rules.yaml_nodes import NodeReader

DEFAULT_DIRECTION = Direction.DOWNSTREAM


def read_direction(reader: NodeReader, m: dict[str, yaml.Node], path: str, kw: dict[str, Any]) -> None:
    """Put ``m``'s ``direction`` (checked) in ``kw``, when given."""
    if "direction" in m:
        kw["direction"] = reader.choice(m["direction"], f"{path}.direction", Direction)


__all__ = ["DEFAULT_DIRECTION", "Direction", "read_direction"]
