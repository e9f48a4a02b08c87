"""The one node gate of both dialects: what rules a node out before any card is looked at.

Taints, selectors, affinity, CPU and memory (``node_basics.check_node``), then which path
the node's cards are offered on (device-plugin shares or DRA devices: a pod of one
dialect never goes to a node of the other) and whether the node's agent is fresh.
"""

from __future__ import annotations

from collections.abc import Sequence

from vgpu_operator.scheduling import node_basics
from vgpu_operator.scheduling.books.entries import NodeEntry, PodEntry, is_dra_node
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.status import Reason


def check(
    node: NodeEntry,
    job: placement.Job,
    now: float,
    inventory_timeout_s: float | None,
    claims: bool = False,
    leaving: Sequence[PodEntry] = (),
) -> Reason | None:
    """Why the node cannot take the pod (as if ``leaving`` had left it), or None.
    ``claims``: the pod is on the DRA path (its devices come from claims)."""
    used = node.used
    for entry in leaving:
        used = used - entry.requests
    reason = node_basics.check_node(
        job.pod, job.resources, node.facts, used, len(node.pods) - len(leaving), job.node_terms
    )
    if reason is not None:
        return reason
    if claims:
        if not is_dra_node(node):
            return Reason.NODE_NOT_ON_DRA_PATH
    elif not job.wants_devices:
        return None
    elif is_dra_node(node):
        return Reason.NODE_ON_DRA_PATH
    elif node.gpus_lost or not node.registered:
        return Reason.NODE_UNREGISTERED
    if stale(node, now, inventory_timeout_s):
        return Reason.INVENTORY_STALE
    return None


def stale(node: NodeEntry, now: float, inventory_timeout_s: float | None) -> bool:
    """Whether the node's inventory is older than the timeout (its agent is not heard)."""
    return (
        inventory_timeout_s is not None
        and node.inventory is not None
        and (node.heartbeat is None or now - node.heartbeat > inventory_timeout_s)
    )
