"""A node's cards and usage as its pods and claims book them: what ``Books.refresh``
caches on the node entry, and what a trial books afresh (``Books.fresh_cards``). Pure
functions of the entries given; only ``refresh`` writes, and only the node's derived
usage (the books call it, readers never)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from vgpu_operator.devices import model
from vgpu_operator.scheduling import node_basics
from vgpu_operator.scheduling.books.entries import NodeEntry, PodEntry, change_node
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.policies import policies
from vgpu_operator.scheduling.vendors import Vendors

#: The DRA part's bookings on a node's cards (``ClaimBooks.bookings_on``).
ClaimBookings = Callable[[str, Mapping[str, model.DeviceUsage]], list[list[placement.Booking]]]


def booked_cards(
    node: NodeEntry,
    skip: frozenset[PodKey],
    pods: Mapping[PodKey, PodEntry],
    vendors: Vendors,
    claim_bookings: ClaimBookings,
) -> list[model.DeviceUsage]:
    """The node's registered cards booked with its pods but ``skip``, and its claims."""
    cards = [model.DeviceUsage.from_info(info) for info in node.registered]
    for card, info in zip(cards, node.registered, strict=True):
        vendors.prepare_card(card, info.mig_profiles)
    by_id = {card.id: card for card in cards}
    for key in sorted(node.pods - skip):
        entry = pods.get(key)
        if entry is not None:
            placement.book(by_id, entry.bookings)
    for booked in claim_bookings(node.name, by_id):
        placement.book(by_id, {"claims": booked})
    return cards


def refresh(
    node: NodeEntry, cards: list[model.DeviceUsage], pods: Mapping[PodKey, PodEntry]
) -> None:
    """Cache the node's derived usage: its booked cards, its pods' requests, its score
    and free-capacity summary (§4.3)."""
    used = node_basics.PodResources()
    for key in sorted(node.pods):
        entry = pods.get(key)
        if entry is not None:
            used = used + entry.requests
    change_node(
        node,
        cards=cards,
        used=used,
        score=policies.node_score(cards),
        summary=placement.Summary.of(cards),
        dirty=False,
    )
