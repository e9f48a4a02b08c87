"""What the removal of pods frees on a node of the annotation dialect: each pod's own
shares of its cards (``PodEntry.bookings``) and its quota (``plugin.Freeing``).

A trial asks again and again with fewer pods removed (one put back at a time), so a room
starts from the cards of the last one the pod fitted in and books back only the pods
returned since, instead of rebuilding the node from all its pods. Everything is a copy:
the live books (cards, pods, quota) are read only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vgpu_operator.devices import model
from vgpu_operator.scheduling.books.entries import NodeEntry
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.cycle.plugin import Holding, Room, holders_by_card
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.pod_key import PodKey


class AnnotationFreeing:
    """The rooms of one trial on one node (``plugin.Freeing``)."""

    def __init__(self, view: BooksView, node: NodeEntry) -> None:
        self._view = view
        self._node = node
        self._fitted: tuple[frozenset[PodKey], list[model.DeviceUsage]] | None = None
        view.refresh(node)

    def room(self, removed: frozenset[PodKey], only: str | None = None) -> Room:
        pods = self._view.pods
        leaving = [pods[k] for k in sorted(removed) if k in pods]
        cards = self.cards_without(removed)
        if only is not None:
            cards = [card for card in cards if card.id == only]
        # A quota is freed only by pods of the pod's own namespace (``plugin.job_in_room``).
        freed = [(e.namespace, e.quota_sums) for e in leaving]
        return Room(leaving, cards, freed)

    def fitted(self, removed: frozenset[PodKey], room: Room) -> None:
        self._fitted = (removed, room.cards)

    def units(self) -> Mapping[str, Sequence[Holding]]:
        out: dict[str, list[Holding]] = {}
        pods = self._view.pods
        for key in sorted(self._node.pods):
            entry = pods.get(key)
            if entry is None:
                continue
            for bookings in entry.bookings.values():
                for b in bookings:
                    out.setdefault(b.uuid, []).append(
                        Holding(frozenset({key}), b.memory_mib, b.cores, b.slots)
                    )
        return out

    def holders_by_card(self) -> Mapping[str, frozenset[PodKey]]:
        return holders_by_card(self.units())

    def freed_claims(self, removed: frozenset[PodKey]) -> frozenset[str]:
        return frozenset()

    def cards_without(self, removed: frozenset[PodKey]) -> list[model.DeviceUsage]:
        """The node's cards booked with its pods but ``removed`` (new objects)."""
        if self._fitted is None or not removed <= self._fitted[0]:
            return self._view.fresh_cards(self._node, removed)
        last_removed, last_cards = self._fitted
        cards = [card.copy() for card in last_cards]
        by_id = {card.id: card for card in cards}
        for key in sorted(last_removed - removed):
            entry = self._view.pods.get(key)
            if entry is not None:
                placement.book(by_id, entry.bookings)
        return cards

    def fresh_cards(self, removed: frozenset[PodKey]) -> list[model.DeviceUsage]:
        """The same as ``cards_without``, rebuilt from the pods (the property tests compare)."""
        return self._view.fresh_cards(self._node, removed)
