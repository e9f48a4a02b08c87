"""The reference path of the node walk: every node fitted, the best by the policy's key.

The indexed walk (``decision.Cycle.find``) must choose as this does; tests compare the two
(``Settings.use_index``). Kept apart from the cycle so that the walk the runtime uses
reads top to bottom there, and this, the slow and obviously right one, here.
"""

from __future__ import annotations

from collections.abc import Callable

from vgpu_operator.scheduling.books.entries import NodeEntry
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.cycle.fragmentation_order import Placer, rank_key
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.policies import policies

TryNode = Callable[[NodeEntry, placement.Job, float], placement.Outcome]


def find(
    view: BooksView,
    placer: Placer,
    try_node: TryNode,
    job: placement.Job,
    now: float,
    tried: dict[str, placement.Outcome],
) -> tuple[NodeEntry, placement.Outcome] | None:
    """The best node that fits, fitting every node; those that do not fit go in ``tried``."""
    best: tuple[tuple[tuple[float, float], int], NodeEntry, placement.Outcome] | None = None
    for node in view.nodes.values():
        outcome = try_node(node, job, now)
        if not outcome.ok:
            tried[node.name] = outcome
            continue
        rank = (node_key(view, placer, node, job), node.order)
        if best is None or rank < best[0]:
            best = (rank, node, outcome)
    return None if best is None else (best[1], best[2])


def find_in_key_order(
    view: BooksView,
    placer: Placer,
    try_node: TryNode,
    job: placement.Job,
    now: float,
    tried: dict[str, placement.Outcome],
) -> tuple[NodeEntry, placement.Outcome] | None:
    """What ``find`` chooses, fitting nodes best key first and stopping at the first that
    fits: the smallest (key, order) that fits is the first fitting one in that order. For
    a pod that wants no device (the index ranks only nodes with a free card), whose Fit
    is the node gate: one pod in eight of the FGD replay, fitted on all 1,213 nodes."""
    for node in view.nodes.values():
        view.refresh(node)  # the key reads the node's score, as ``find`` reads it after its Fit
    ranked = sorted(
        ((node_key(view, placer, node, job), node.order, node) for node in view.nodes.values()),
        key=lambda entry: (entry[0], entry[1]),
    )
    for _key, _order, node in ranked:
        outcome = try_node(node, job, now)
        if outcome.ok:
            return node, outcome
        tried[node.name] = outcome
    return None


def node_key(
    view: BooksView, placer: Placer, node: NodeEntry, job: placement.Job
) -> tuple[float, float]:
    """The reference path's key (lower is better), the same as the index's lists;
    under ``fragmentation``, the rise (a pod that wants no card strands cards too)."""
    if placer.walks_nodes(job, view.config.scheduler.node_scheduler_policy):
        rise = placer.rise(node, job)
        return (float("inf"), 0.0) if rise is None else rank_key(rise, node)
    if job.pod_node_policy is None:
        return (-view.layered_preference(node), 0.0)
    return (node.score if job.pod_node_policy == policies.SPREAD else -node.score, 0.0)
