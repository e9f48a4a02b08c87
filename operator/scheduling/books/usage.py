"""What metrics and the demo read of the books: each card's booking, and the memory no
pending request could use (``stranded``). Read through the books' view."""

from __future__ import annotations

from collections.abc import Iterable

from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling import node_basics
from vgpu_operator.scheduling.books.entries import DeviceUsageRow
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.policies import policies, stranded
from vgpu_operator.wire import Pod


def device_usage(view: BooksView) -> list[DeviceUsageRow]:
    rows: list[DeviceUsageRow] = []
    for node in sorted(view.nodes.values(), key=lambda n: n.order):
        view.refresh(node)
        for card in node.cards:
            rows.append(
                DeviceUsageRow(
                    node.name,
                    card.id,
                    card.vendor,
                    card.type,
                    card.used,
                    card.count,
                    card.used_memory_mib,
                    card.total_memory_mib,
                    card.used_cores,
                    card.total_cores,
                )
            )
    return rows


def stranded_memory_mib(view: BooksView, pending: Iterable[Pod]) -> dict[str, int]:
    """Per node, the free card memory no request of the ``pending`` pods could use
    (``stranded``); every node with cards is named, 0 where nothing is stranded.

    A pod whose request cannot be read adds no request: its own Event says why.
    """
    requests: set[stranded.CardRequest] = set()
    for pod in pending:
        spec = pod.get("spec") or {}
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            try:
                asked = view.vendors.requests(container)
            except (CodecError, ValueError):
                continue
            requests.update(stranded.CardRequest.of(r) for r in asked.values())
    out: dict[str, int] = {}
    for node in sorted(view.nodes.values(), key=lambda n: n.order):
        view.refresh(node)
        if not node.cards:
            continue
        cards = [c for c in node.cards if stranded.offered(c, node.inventory_cordoned)]
        out[node.name] = stranded.stranded_memory_mib(cards, requests)
    return out


def drifted_nodes(view: BooksView) -> list[str]:
    """Nodes whose cards, usage, score or summary, as the books keep them up to date pod
    by pod (``Books._shift``), differ from a rebuild from their pods: always none unless
    the in-place bookkeeping is wrong (the property tests call it after every step)."""
    drifted = []
    pods = view.pods
    for node in view.nodes.values():
        if node.dirty:
            continue
        cards = view.fresh_cards(node, frozenset())
        used = node_basics.PodResources()
        for key in node.pods:
            entry = pods.get(key)
            if entry is not None:
                used = used + entry.requests
        if (
            cards != node.cards
            or used != node.used
            or policies.node_score(cards) != node.score
            or placement.Summary.of(cards) != node.summary
        ):
            drifted.append(node.name)
    return drifted


def holding_pods(view: BooksView) -> dict[PodKey, str]:
    """Pods that hold devices or reservations, and their nodes."""
    return {k: e.node for k, e in view.pods.items() if e.node is not None}


def register_errors(view: BooksView) -> dict[str, str]:
    return {n.name: n.register_error for n in view.nodes.values() if n.register_error}


def node_warnings(view: BooksView, name: str) -> tuple[str, ...]:
    """The annotations of one node that could not be read and are ignored: the node
    layer's, and a device registration (its vendor's cards are then not offered)."""
    node = view.nodes.get(name)
    if node is None:
        return ()
    if node.register_error is None:
        return node.layer.problems
    registration = f"{node.register_error}; the node's cards from it are not offered"
    return (*node.layer.problems, registration)


def node_layer_problems(view: BooksView) -> dict[str, tuple[str, ...]]:
    """Per node, the node-layer annotations that could not be read (and are ignored)."""
    return {n.name: n.layer.problems for n in view.nodes.values() if n.layer.problems}


def gate_holders(view: BooksView) -> dict[str, list[PodKey]]:
    """Per node, the pods holding its allocation gate (for status and tests)."""
    return {n.name: sorted(n.allocating) for n in view.nodes.values() if n.allocating}


def quota_usage(view: BooksView) -> dict[str, dict[str, tuple[int, int]]]:
    """Per namespace, the memory and cores each quota resource counts."""
    return {ns: view.quota.usage(ns) for ns in view.quota.namespaces()}
