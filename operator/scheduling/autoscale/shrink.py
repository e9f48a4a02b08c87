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
member's within its group's topology domain. A pod whose GPUs come from ResourceClaims
moves when its claims are made again for its replacement from their templates, the
replacement fitted with those claims by the claims dialect (``shrink_claims``); one that
uses a standalone or shared claim keeps the node. Nothing reaches the live books.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from vgpu_operator.scheduling import defrag, preemption
from vgpu_operator.scheduling.autoscale import shrink_claims
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
    templates: shrink_claims.Templates | None = None,
) -> Emptying | str:
    """Where every pod of ``node`` would go if it left (``running``: the node's pod
    objects by key), or why it cannot be emptied. ``templates``: the
    ResourceClaimTemplates (by ``namespace/name``) the claims of the node's pods of the
    claims dialect were made from (``shrink_claims``: their replacements' claims)."""
    books = defrag.DefragBooks(state)
    keys = books.keys_on(node)
    if not keys:
        return "it holds no pod"
    movers = _movers(books, keys, running, options, templates or {})
    if isinstance(movers, str):
        return movers
    identities = []
    for mover, _remade in movers:
        namespace, _, name = str(mover.key).partition("/")
        identities.append(preemption.PodIdentity(namespace, name, mover.labels))
    violating, _ = preemption.split_by_violation(identities, books.budgets())
    if violating:
        return f"a PodDisruptionBudget allows no eviction of {len(violating)} of its pods"
    written = defrag.scheduler_written(state)
    moves: dict[PodKey, str] = {}
    with defrag.WhatIf(books) as what_if:
        for mover, _remade in movers:
            what_if.take_out(mover.key)
        ordered = sorted(movers, key=lambda m: (-m[0].memory_mib, -len(m[0].cards), m[0].key))
        for mover, remade in ordered:
            twin: Pod
            if remade is None:
                twin = defrag.replacement_pod(mover.pod, written)
            else:
                for claim in remade.claims:
                    books.add_claim(claim)
                twin = remade.pod
            decision = what_if.place(away_from(twin, node), now)
            if not decision.scheduled or decision.node is None:
                return f"pod {mover.key} fits on no other node"
            if not defrag.stays_in_domain(books, mover, decision.node):
                return f"pod {mover.key} fits on no other node of its pod group's domain"
            moves[mover.key] = decision.node
    return Emptying(node, moves)


_Movers = list[tuple[defrag.Mover, shrink_claims.Remade | None]]


def _movers(
    books: defrag.DefragBooks,
    keys: Sequence[PodKey],
    running: Mapping[PodKey, Pod],
    options: defrag.PlanOptions,
    templates: shrink_claims.Templates,
) -> _Movers | str:
    """Each pod of the node as a move may take it (with a claims pod's replacement and
    claims, as made again), or why one may not move."""
    out: _Movers = []
    for key in keys:
        pod = running.get(key)
        if pod is not None and shrink_claims.uses_claims(pod):
            found = shrink_claims.claim_mover(books, key, pod, options, templates)
            if isinstance(found, str):
                return found
            out.append(found)
            continue
        mover = None if pod is None else defrag.mover_of(books, key, pod, options)
        if mover is None:
            return f"pod {key} may not be moved (not this scheduler's, no controller, a gang's)"
        out.append((mover, None))
    return out
