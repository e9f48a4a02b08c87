"""Scale-down that understands shares: which Karpenter node to give back (pure of the API).

Looked at only while nothing waits and no requested node is on its way (the queue has
what it needs). The candidates are the nodes of a NodePool (Karpenter's label) with a
NodeClaim and an instance type of the catalogue (its offering's price is what removing
it saves), at least ``scale_down_after_s`` old, holding pods, none of them waiting for
this node: the most expensive first. The first whose pods would all fit elsewhere
(``scheduling.autoscale.shrink``: the defragmentation planner's rules, budgets, gangs
whole) is given back by deleting its NodeClaim: Karpenter then taints the node
(``karpenter.sh/disrupted``, so no pod of ours is placed there any more), evicts its pods
through the Eviction API (PodDisruptionBudgets honoured) and removes it; the pods'
controllers create them again and the worker places them where the what-if found room.
A node whose price is below ``scale_down_min_savings`` is not looked at: no move for less.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from vgpu_operator.control import autoscale_claims
from vgpu_operator.scheduling.autoscale import InstanceType
from vgpu_operator.scheduling.autoscale.catalogue import (
    CAPACITY_TYPE_LABEL,
    INSTANCE_TYPE_LABEL,
    NODE_POOL_LABEL,
    ZONE_LABEL,
)
from vgpu_operator.scheduling.books import NodeEntry


@dataclass(frozen=True, slots=True)
class ShrinkCandidate:
    """A node that may be given back: its claim, and what removing it saves per hour."""

    node: str
    claim: str
    price: float


def price_of(node: NodeEntry, types: Mapping[str, InstanceType]) -> float | None:
    """The node's price per hour, from the catalogue's offering matching its labels."""
    labels = node.facts.labels
    kind = types.get(labels.get(INSTANCE_TYPE_LABEL, ""))
    if kind is None:
        return None
    zone, capacity = labels.get(ZONE_LABEL), labels.get(CAPACITY_TYPE_LABEL)
    prices = [
        o.price
        for o in kind.offerings
        if o.zone in (None, zone) and o.capacity_type in (None, capacity)
    ]
    return min(prices) if prices else None


def candidates(
    nodes: Iterable[NodeEntry],
    claims: Sequence[autoscale_claims.NodeClaimFacts],
    types: Sequence[InstanceType],
    *,
    now: float,
    after_s: float,
    min_savings: float,
    busy: frozenset[str],
) -> list[ShrinkCandidate]:
    """The nodes that may be given back, the most expensive first (see the module)."""
    by_node = {c.node: c for c in claims if c.node and not c.deleting}
    kinds = {t.name: t for t in types}
    found: list[ShrinkCandidate] = []
    for node in nodes:
        claim = by_node.get(node.name)
        if claim is None or node.name in busy or not node.pods:
            continue
        if NODE_POOL_LABEL not in node.facts.labels or claim.created is None:
            continue
        if now - claim.created < after_s:
            continue
        price = price_of(node, kinds)
        if price is None or price < min_savings:
            continue
        found.append(ShrinkCandidate(node.name, claim.name, price))
    found.sort(key=lambda c: (-c.price, c.node))
    return found
