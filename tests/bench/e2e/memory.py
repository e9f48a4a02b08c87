"""The operator's resident memory per 1,000 nodes and per 10,000 bound pods (issue 38).

Three fresh processes of the same operator, each measured a few seconds after it has
read the cluster (``SETTLE_S``), so that what it holds is what the cluster costs it and
not what a burst left behind:

- ``empty``: started before the nodes exist (the interpreter, Kopf, the clients);
- ``with_nodes``: started on the cluster's nodes and inventories, no pod bound;
- ``with_pods``: restarted with ``pods`` bound pods present (the restart run).

Per 1,000 nodes is (with_nodes - empty) ÷ nodes x 1,000; per 10,000 bound pods is
(with_pods - with_nodes) ÷ pods x 10,000. Each figure is one process's RSS (statm),
which the allocator's free lists and the collector's timing move by a few MiB: read the
slopes of a small cluster with that in mind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: Seconds between a fresh operator having read the cluster and reading its RSS.
SETTLE_S: Final = 3.0


@dataclass
class Footprint:
    nodes: int
    empty_mib: float | None = None
    with_nodes_mib: float | None = None
    pods: int = 0
    with_pods_mib: float | None = None

    def per_1000_nodes(self) -> float | None:
        if self.empty_mib is None or self.with_nodes_mib is None or not self.nodes:
            return None
        return (self.with_nodes_mib - self.empty_mib) * 1000 / self.nodes

    def per_10000_pods(self) -> float | None:
        if self.with_nodes_mib is None or self.with_pods_mib is None or not self.pods:
            return None
        return (self.with_pods_mib - self.with_nodes_mib) * 10000 / self.pods

    def numbers(self) -> dict[str, float]:
        """What was measured, as numbers (``report.Cluster.measures``)."""
        out: dict[str, float] = {}
        for key in ("empty_mib", "with_nodes_mib", "with_pods_mib"):
            value = getattr(self, key)
            if value is not None:
                out[f"operator_rss.{key}"] = value
        if self.pods:
            out["operator_rss.pods"] = self.pods
        return out

    def facts(self) -> dict[str, str]:
        """Lines for the report (only those measured)."""
        out: dict[str, str] = {}
        if self.empty_mib is not None:
            out["operator RSS, no nodes yet"] = f"{self.empty_mib:.0f} MiB"
        if self.with_nodes_mib is not None:
            out[f"operator RSS, {self.nodes:,} nodes, no pod bound"] = (
                f"{self.with_nodes_mib:.0f} MiB"
            )
        if self.with_pods_mib is not None:
            out[f"operator RSS, {self.nodes:,} nodes and {self.pods:,} bound pods"] = (
                f"{self.with_pods_mib:.0f} MiB"
            )
        nodes = self.per_1000_nodes()
        if nodes is not None:
            out["operator RSS per 1,000 nodes"] = f"{nodes:.1f} MiB"
        pods = self.per_10000_pods()
        if pods is not None:
            out["operator RSS per 10,000 bound pods"] = f"{pods:.1f} MiB"
        return out
