"""What the removal of pods frees on a node of the claims (DRA) dialect.

A pod on a DRA node holds nothing itself: its claims do. So a room with some pods removed
releases the holds of the claims whose every holder is among them
(``claim_books.ClaimBooks.holders_on``): a claim shared by several pods only when all of
them go, an exclusive or whole-card (``hamiCore: false``) claim like any other, and never a
claim reserved for nobody or one a decision is still writing (no eviction frees those).
The quota the released claims held is released on a copy of the ledger
(``plugin.job_in_room``), their MIG instances give their counters back, and a preemptor
waits for the released claims to go (``Nomination.claims``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vgpu_operator.devices import dra
from vgpu_operator.scheduling.books import claim_ledger
from vgpu_operator.scheduling.books.entries import NodeEntry
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.cycle.plugin import Holding, Room, holders_by_card
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.pod_key import PodKey


@dataclass(frozen=True, slots=True)
class HeldClaim:
    """A claim's hold on one node, as a room releases it."""

    key: str
    namespace: str
    #: The pods that keep it (empty: no eviction releases it). A holder the books do not
    #: know as a pod of the node is named by its uid, which no removal names.
    holders: frozenset[PodKey]
    bookings: tuple[placement.Booking, ...]
    #: The device of every result it holds: a MIG instance gives its counters back
    #: (``claim_mig``) when the hold is released.
    devices: tuple[str, ...] = ()

    def quota_sums(self) -> dict[str, tuple[int, int]]:
        memory = sum(b.memory_mib for b in self.bookings)
        return {dra.VENDOR: (memory, sum(b.cores for b in self.bookings))}


class ClaimsFreeing:
    """What removals free on one DRA node (``plugin.Freeing``): made from the node as it
    is, it holds for every trial until the node changes (the claims plugin keeps it)."""

    def __init__(self, view: BooksView, node: NodeEntry) -> None:
        self._view = view
        self._node = node
        view.refresh(node)
        pods = view.pods
        by_uid = {pods[k].uid: k for k in node.pods if k in pods and pods[k].uid}
        by_id = {card.id: card for card in node.cards}
        self.held = [
            HeldClaim(
                h.key,
                h.namespace,
                frozenset(by_uid.get(uid, PodKey(f"uid:{uid}")) for uid in holders),
                tuple(claim_ledger.bookings(h, by_id)),
                tuple(s.device for s in h.shares),
            )
            for h, holders in view.claims.holders_on(node.name)
        ]
        mig = view.claims.mig_of(node.name)
        #: Each MIG instance's card: its holders stand in the way on that card.
        self._mig_cards = {} if mig is None else {d.name: d.card for d in mig.pool.devices}
        self._units: dict[str, list[Holding]] | None = None
        self._holders: Mapping[str, frozenset[PodKey]] | None = None

    def freed(self, removed: frozenset[PodKey]) -> list[HeldClaim]:
        """The holds released once ``removed`` have left: every holder among them."""
        return [h for h in self.held if h.holders and h.holders <= removed]

    def room(self, removed: frozenset[PodKey], only: str | None = None) -> Room | None:
        pods = self._view.pods
        leaving = [pods[k] for k in sorted(removed) if k in pods]
        freed = self.freed(removed)
        cards = [card.copy() for card in self._node.cards if only is None or card.id == only]
        for held in freed:
            if not placement.shift(cards, {"claims": held.bookings}, -1):
                return None  # cards a release cannot be read off: no trial
        quota = [(h.namespace, h.quota_sums()) for h in freed]
        instances = [d for held in freed for d in held.devices]
        return Room(leaving, cards, quota, instances)

    def fitted(self, removed: frozenset[PodKey], room: Room) -> None:
        """Each room is made afresh from the node's cards (a claim's release is a few
        bookings)."""

    def units(self) -> Mapping[str, Sequence[Holding]]:
        """Per card, what each held claim has on it, kept by its holders; a MIG instance
        is a unit of no room on its card (its holders stand in the way there)."""
        if self._units is not None:
            return self._units
        out: dict[str, list[Holding]] = {}
        for held in self.held:
            on: dict[str, list[placement.Booking]] = {}
            for booking in held.bookings:
                on.setdefault(booking.uuid, []).append(booking)
            for card, bookings in on.items():
                memory = sum(b.memory_mib for b in bookings)
                cores = sum(b.cores for b in bookings)
                slots = sum(b.slots for b in bookings)
                out.setdefault(card, []).append(Holding(held.holders, memory, cores, slots))
            for device in held.devices:
                mig_card = self._mig_cards.get(device)
                if mig_card is not None:
                    out.setdefault(mig_card.lower(), []).append(Holding(held.holders, 0, 0, 0))
        self._units = out
        return out

    def holders_by_card(self) -> Mapping[str, frozenset[PodKey]]:
        if self._holders is None:
            self._holders = holders_by_card(self.units())
        return self._holders

    def freed_claims(self, removed: frozenset[PodKey]) -> frozenset[str]:
        return frozenset(h.key for h in self.freed(removed))
