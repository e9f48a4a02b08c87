"""The node order where the books' index does not rank: every node, by the ranking's key.

The indexed walk (the ranking, with O(1) rule-outs) must choose as the plain one does:
every node in key order, where the first that fits is the node with the best key of all
those that fit (HAMi's walk: fit every node, take the best score). The tests compare the
two (``Settings.use_index`` off). A pod that wants no device is walked this way too: the
index ranks only nodes with a free card, and such a pod may go to a full one.
"""

from __future__ import annotations

from vgpu_operator.scheduling.books.entries import NodeEntry
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.cycle.fragmentation_order import Placer, rank_key
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.policies import policies


def in_key_order(view: BooksView, placer: Placer, job: placement.Job) -> list[NodeEntry]:
    """Every node, best key first (then the order the books met them)."""
    for node in view.nodes.values():
        view.refresh(node)  # the key reads the node's score
    ranked = sorted(
        ((node_key(view, placer, node, job), node.order, node) for node in view.nodes.values()),
        key=lambda entry: (entry[0], entry[1]),
    )
    return [node for _key, _order, node in ranked]


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
