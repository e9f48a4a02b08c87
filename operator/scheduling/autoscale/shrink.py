"""Scale-down that understands shares: whether a node's pods would all fit elsewhere.

Karpenter's own consolidation cannot tell: its simulation knows ``nvidia.com/gpu`` counts,
not card memory or cores, so a pod with a share (``nvidia.com/gpumem``...) fits nowhere
in it and its node is never emptied. Here the defragmentation planner's rules and what-if
(``defrag``) decide, on an overlay of the books: every pod of the node must be one a plan
may move (``defrag.mover_of``: this scheduler's, recreated by its controller, no member of
a PodGroup but a ``single`` one's, not already leaving), evicting them all must pass the
PodDisruptionBudgets, and each one's replacement (``defrag.replacement_pod``: unbound,
what the scheduler wrote removed) must be placed by the decision cycle on another node,
the most demanding first, the node itself ruled out by a ``matchFields`` term on its
name (as the taint Karpenter puts on a node it removes rules it out live), a group
member's within its group's topology domain. Nothing reaches the live books.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from vgpu_operator.scheduling import defrag, preemption
from vgpu_operator.scheduling.cycle import ClusterState
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.wire import Pod

#: Who may move: the defragmentation planner's rules (a pod its controller recreates).
_MOVABLE = defrag.PlanOptions()


@dataclass(frozen=True, slots=True)
class Emptying:
    """A node whose pods all fit elsewhere: where each one's replacement would go."""

    node: str
    moves: Mapping[PodKey, str]


def away_from(pod: Pod, node: str) -> Pod:
    """A copy of ``pod`` that no node named ``node`` takes: a ``matchFields`` requirement
    added to each of its required node-affinity terms (one term if it has none)."""
    out: dict[str, Any] = copy.deepcopy(dict(pod))  # a working copy, returned as the pod
    spec = out.setdefault("spec", {})
    affinity = spec.setdefault("affinity", {}) or {}
    spec["affinity"] = affinity
    node_affinity = affinity.setdefault("nodeAffinity", {}) or {}
    affinity["nodeAffinity"] = node_affinity
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", []) or [{}]
    rule = {"key": "metadata.name", "operator": "NotIn", "values": [node]}
    required["nodeSelectorTerms"] = [
        {**term, "matchFields": [*(term.get("matchFields") or ()), rule]} for term in terms
    ]
    return cast(Pod, out)


def empty_node(
    state: ClusterState,
    node: str,
    running: Mapping[PodKey, Pod],
    now: float,
    options: defrag.PlanOptions = _MOVABLE,
) -> Emptying | str:
    """Where every pod of ``node`` would go if it left (``running``: the node's pod
    objects by key), or why it cannot be emptied."""
    books = defrag.DefragBooks(state)
    keys = books.keys_on(node)
    if not keys:
        return "it holds no pod"
    movers = []
    for key in keys:
        pod = running.get(key)
        mover = None if pod is None else defrag.mover_of(books, key, pod, options)
        if mover is None:
            return f"pod {key} may not be moved (not this scheduler's, no controller, a gang's)"
        movers.append(mover)
    identities = []
    for mover in movers:
        namespace, _, name = str(mover.key).partition("/")
        identities.append(preemption.PodIdentity(namespace, name, mover.labels))
    violating, _ = preemption.split_by_violation(identities, books.budgets())
    if violating:
        return f"a PodDisruptionBudget allows no eviction of {len(violating)} of its pods"
    written = defrag.scheduler_written(state)
    moves: dict[PodKey, str] = {}
    with defrag.WhatIf(books) as what_if:
        for mover in movers:
            what_if.take_out(mover.key)
        for mover in sorted(movers, key=lambda m: (-m.memory_mib, -len(m.cards), m.key)):
            replacement = away_from(defrag.replacement_pod(mover.pod, written), node)
            decision = what_if.place(replacement, now)
            if not decision.scheduled or decision.node is None:
                return f"pod {mover.key} fits on no other node"
            if not defrag.stays_in_domain(books, mover, decision.node):
                return f"pod {mover.key} fits on no other node of its pod group's domain"
            moves[mover.key] = decision.node
    return Emptying(node, moves)
