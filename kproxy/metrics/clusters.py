"""Several clusters' series in one exposition, told apart by a ``cluster`` label.

Each cluster's server counts into its own :class:`~kproxy.metrics.stats.TrafficStats`, so the hot
path never looks its cluster up (a connection counts where its server does); the label is added
here, at scrape time, to every series of every family, but those of the process as a whole
(:data:`PROCESS_WIDE`: the build, the event loop, the rules, which every cluster shares, and the
capture), which come from the first cluster's collector alone, as they are.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

CLUSTER_LABEL = "cluster"
# Families of the process, not of a cluster: (name, or name prefix ending in '_').
PROCESS_WIDE = ("kproxy_build_info", "kproxy_event_loop_lag_seconds", "kproxy_event_loop_held_seconds",
                "kproxy_rules_", "kproxy_rule_",
                "kproxy_injected_errors", "kproxy_capture_records", "kproxy_records_over_budget")


def process_wide(name: str) -> bool:
    """Whether the family ``name`` is the process's (:data:`PROCESS_WIDE`)."""
    return any(name == wide or (wide.endswith("_") and name.startswith(wide)) for wide in PROCESS_WIDE)


class ClustersCollector(Collector):
    """The families of ``clusters`` (each a cluster's name and its collectors), merged by name, each
    series labelled with its cluster, but those of :data:`PROCESS_WIDE` families."""

    def __init__(self, clusters: Sequence[tuple[str, Sequence[Collector]]]) -> None:
        self.clusters = clusters

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for index, (name, collectors) in enumerate(self.clusters):
            for collector in collectors:
                for family in collector.collect():
                    wide = process_wide(family.name)
                    if wide and index > 0:
                        continue  # the first cluster's collector has them
                    out = merged.get(family.name)
                    if out is None:
                        out = merged[family.name] = Metric(family.name, family.documentation, family.type,
                                                           family.unit)
                    out.samples += family.samples if wide else [
                        sample._replace(labels={CLUSTER_LABEL: name, **sample.labels}) for sample in family.samples]
        yield from merged.values()
