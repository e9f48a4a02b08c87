"""A Fit of one pod on one node as if some of its pods had left: preemption's victim
search and the defragmentation planner's what-ifs.

A what-if on an overlay of the books, never on the books themselves: the pods that
leave are taken off a copy of the node's cards, and the quota they free is released in a
copy of the namespace's ledger, so the live books (cards, pods, quota) are read only.
"""

from __future__ import annotations

import dataclasses

from vgpu_operator.devices import model
from vgpu_operator.scheduling.books.entries import NodeEntry
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.cycle import node_gate
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.pod_key import PodKey


class RemovalTrial:
    """Fit one pod on one node as if some of its pods had left (their quota usage too).

    The search asks again and again with fewer pods removed (one put back at a time), so
    a trial starts from the cards of the last one that fitted and books back only the
    pods returned since, instead of rebuilding the node from all its pods.
    """

    def __init__(self, view: BooksView, node: NodeEntry, job: placement.Job, now: float):
        self._view = view
        self._node = node
        self._job = job
        self._now = now
        self._fitted: tuple[frozenset[PodKey], list[model.DeviceUsage]] | None = None
        view.refresh(node)

    def fits(self, removed: frozenset[PodKey]) -> bool:
        return self.outcome(removed).ok

    def outcome(self, removed: frozenset[PodKey]) -> placement.Outcome:
        view, node, job = self._view, self._node, self._job
        pods = view.pods
        leaving = [pods[k] for k in sorted(removed) if k in pods]
        gate = node_gate.check(node, job, self._now, view.inventory_timeout_s, leaving=leaving)
        if gate is not None:
            return placement.Outcome.rejected({gate: 1})
        cards = self.cards_without(removed)
        # A quota is freed only by pods of the pod's own namespace: released on a copy.
        released = [e for e in leaving if e.namespace == job.namespace]
        if released and job.quota.has_limits(job.namespace):
            ledger = job.quota.copy()
            for entry in released:
                ledger.remove_sums(entry.namespace, entry.quota_sums)
            job = dataclasses.replace(job, quota=ledger)
        outcome = placement.fit_pod(
            job, cards, node.facts, node.pair_scores, node.inventory_cordoned
        )
        if outcome.ok:
            self._fitted = (removed, cards)
        return outcome

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
