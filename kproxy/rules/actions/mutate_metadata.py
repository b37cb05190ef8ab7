"""The ``mutate_metadata`` action: edit Metadata answers (hide brokers or partitions, move leaders,
shrink the ISR), as a cluster in trouble would describe itself.

YAML: ``- mutate_metadata: {hide_brokers: [2], hide_partitions: [{topic: t, partition: 0}],
move_leader: [{topic: t, partition: 0, to: 1}], shrink_isr: [{topic: t, partition: 0, to: [1]}]}``.
Acts on metadata, describe_cluster and describe_topic_partitions only. Every edit gives an answer a
cluster in trouble could give (:class:`kproxy.protocol.response_faults.MetadataEdits`): a hidden
partition is listed leaderless (LEADER_NOT_AVAILABLE), and the broker answering is never hidden.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kproxy.protocol.codes import ApiKey
from kproxy.protocol.record_faults import Selector
from kproxy.protocol.records import RecordBudget
from kproxy.protocol.response_faults import MetadataEdits, mutate_metadata
from kproxy.rules.actions.base import RuleAction, Step
from kproxy.rules.yaml_nodes import BAD, INT32, Bad, NodeReader

if TYPE_CHECKING:
    import yaml

METADATA_APIS: frozenset[int] = frozenset({ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER, ApiKey.DESCRIBE_TOPIC_PARTITIONS})


@dataclass(frozen=True, slots=True)
class PartitionRef:
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class MutateMetadata(RuleAction):
    """Edit Metadata answers: hide brokers or partitions, move leaders, shrink the ISR."""

    hide_brokers: frozenset[int] = frozenset()
    hide_partitions: tuple[PartitionRef, ...] = ()
    move_leader: tuple[tuple[PartitionRef, int], ...] = ()
    shrink_isr: tuple[tuple[PartitionRef, tuple[int, ...]], ...] = ()

    kind: ClassVar[str] = "mutate_metadata"
    keys: ClassVar[tuple[str, ...]] = ("hide_brokers", "hide_partitions", "move_leader", "shrink_isr")
    apis: ClassVar[frozenset[int] | None] = METADATA_APIS

    def __post_init__(self) -> None:
        if not (self.hide_brokers or self.hide_partitions or self.move_leader or self.shrink_isr):
            raise ValueError("nothing to mutate")

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw: dict[str, Any] = {}
        if "hide_brokers" in m:
            kw["hide_brokers"] = reader.one_or_many(m["hide_brokers"], f"{path}.hide_brokers",
                                                    lambda n, p: _node_id(reader, n, p))
        if "hide_partitions" in m:
            kw["hide_partitions"] = reader.items(m["hide_partitions"], f"{path}.hide_partitions",
                                                 lambda n, p: _partition_alone(reader, n, p))
        if "move_leader" in m:
            kw["move_leader"] = reader.items(m["move_leader"], f"{path}.move_leader",
                                             lambda n, p: _partition_ref(reader, n, p, ("to",), _node_id))
        if "shrink_isr" in m:
            kw["shrink_isr"] = reader.items(m["shrink_isr"], f"{path}.shrink_isr",
                                            lambda n, p: _partition_ref(reader, n, p, ("to",), _node_ids))
        return reader.made(at, path, kw, cls)

    @property
    def edits_response(self) -> bool:
        return True

    @property
    def leader_moves(self) -> frozenset[tuple[str, int]]:
        """The (topic, partition) pairs whose leader epoch this action raises (``move_leader``):
        the policy keeps advertising at least that epoch after the rule ends
        (kproxy.protocol.leader_epochs)."""
        return frozenset((ref.topic, ref.partition) for ref, _ in self.move_leader)

    def response_step(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                      ) -> Step | None:
        return self.response_step_from(api_key, api_version, only, budget, None)

    def response_step_from(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget,
                           answering: int | None) -> Step | None:
        if api_key not in METADATA_APIS:
            return None
        edits = metadata_edits(self)
        return "mutate_metadata", lambda f: mutate_metadata(f, api_key, api_version, edits, answering)


def metadata_edits(action: MutateMetadata) -> MetadataEdits:
    """The protocol-level edits a ``mutate_metadata`` action stands for."""
    return MetadataEdits(
        hide_brokers=action.hide_brokers,
        hide_partitions=frozenset((ref.topic, ref.partition) for ref in action.hide_partitions),
        move_leader={(ref.topic, ref.partition): to for ref, to in action.move_leader},
        shrink_isr={(ref.topic, ref.partition): isr for ref, isr in action.shrink_isr},
    )


def _partition_alone(reader: NodeReader, node: yaml.Node, path: str) -> PartitionRef | Bad:
    """A ``{topic, partition}`` entry (BAD, not a tuple, when it does not read)."""
    got = _partition_ref(reader, node, path, ())
    return got if isinstance(got, Bad) else got[0]


def _node_id(reader: NodeReader, node: yaml.Node, path: str) -> int | Bad:
    return reader.integer(node, path, 0, INT32[1])


def _node_ids(reader: NodeReader, node: yaml.Node, path: str) -> tuple[int, ...] | Bad:
    got: tuple[int, ...] | Bad = reader.one_or_many(node, path, lambda n, p: _node_id(reader, n, p), container=tuple)
    return got


def _partition_ref(reader: NodeReader, node: yaml.Node, path: str, extra: tuple[str, ...],
                   read: Callable[[NodeReader, yaml.Node, str], Any] | None = None) -> Any:
    """``(PartitionRef,)`` of a ``{topic, partition}`` entry, or ``(PartitionRef, value)`` with the
    value of its one ``extra`` key read by ``read``; BAD when it does not read."""
    m = reader.mapping(node, path, ("topic", "partition", *extra))
    if m is None:
        return BAD
    got: list[Any] = []
    for key in ("topic", "partition", *extra):
        if key not in m:
            got.append(reader.fail(node, f"{path}.{key}", "missing"))
        elif key == "topic":
            got.append(reader.string(m[key], f"{path}.topic"))
        elif key == "partition":
            got.append(reader.integer(m[key], f"{path}.partition", 0, INT32[1]))
        else:
            assert read is not None
            got.append(read(reader, m[key], f"{path}.{key}"))
    if any(isinstance(g, Bad) for g in got):
        return BAD
    ref = PartitionRef(got[0], got[1])
    return (ref,) if not extra else (ref, got[2])
