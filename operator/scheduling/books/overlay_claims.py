"""The DRA part of a what-if's overlay (``overlay.Overlay``): the live books' claims part
as the what-if changed it, never written.

Three changes a what-if makes on the DRA path, kept here beside the live part
(``claim_books.ClaimBooks``, read through ``view.ClaimReads``):

- the pools of nodes that do not exist yet (autoscaling's: the slices a new node's agent
  would publish, read by the books' own code: ``hypothetical``);
- the holds of its decisions (``hold_decided``: the claims a trial allocated, held on
  their node's cards and in the namespace's quota as the live books hold a decision's,
  until the trial is undone: ``take_decided``, ``release_decided``);
- claims that do not exist yet (a waiting pod's template claim, as the claim controller
  would make it: ``add_claim``).

The overlay books the holds on its copies of the nodes' cards (``bookings_on``) and in
its copy of the quota ledger (``sums``); the live part's holds stay counted as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vgpu_operator.devices import model
from vgpu_operator.scheduling.books import claim_ledger
from vgpu_operator.scheduling.books.claim_ledger import Decided, Hold
from vgpu_operator.scheduling.books.view import ClaimReads
from vgpu_operator.scheduling.cel import claim_cel
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import claim_mig, claims, dra_pool
from vgpu_operator.wire import ResourceClaim


class OverlayClaims:
    """``view.ClaimReads`` over the live part, with a what-if's pools, holds and claims.
    ``registered``: a node's cards as the overlay has them (for what a hold books)."""

    def __init__(
        self, live: ClaimReads, registered: Callable[[str], Sequence[model.DeviceInfo]]
    ) -> None:
        self._live = live
        self._registered = registered
        self._pools: dict[str, dra_pool.Pool] = {}
        self._migs: dict[str, claim_mig.MigNode] = {}
        self._ledger = claim_ledger.ClaimLedger()
        self._objects: dict[str, ResourceClaim] = {}
        #: Objects seen through ``objects``: the live ones with the what-if's added.
        self._merged: dict[str, ResourceClaim] | None = None

    @property
    def empty(self) -> bool:
        """Whether nothing of the what-if is held here (pools and claims stay: they are
        what the what-if reads, not what it changed)."""
        return not self._ledger.holds

    # --- what the what-if adds ---------------------------------------------------------
    def add_pool(
        self, node: str, pool: dra_pool.Pool | None, mig: claim_mig.MigNode | None
    ) -> None:
        """The pool (and MIG placements) of a node that does not exist yet."""
        if pool is not None:
            self._pools[node] = pool
        if mig is not None:
            self._migs[node] = mig

    def remove_pool(self, node: str) -> None:
        self._pools.pop(node, None)
        self._migs.pop(node, None)

    def add_claim(self, obj: ResourceClaim) -> None:
        """A claim that does not exist yet (a template's, as the claim controller would
        make it); a claim the live books hold is never replaced."""
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
        if key in self._live.objects:
            return
        self._objects[key] = obj
        self._merged = None

    # --- the decisions' holds ------------------------------------------------------------
    def hold_decided(
        self, pod: str, node: str, decided: Mapping[str, tuple[str, Sequence[Any]]]
    ) -> list[Hold]:
        """Hold what a trial's decision allocates (claim key -> (namespace, picks)); the
        holds made, for the overlay to count on the node's cards and in the quota."""
        made = []
        for key, (namespace, picks) in decided.items():
            shares = claim_ledger.decided_shares(node, picks)
            hold = Hold(key, namespace, node, shares, Decided.WRITING, pod)
            self._ledger.put(hold)
            made.append(hold)
        if decided:
            self._ledger.decided_for.setdefault(pod, []).extend(decided)
        return made

    def take_decided(self, pod: str) -> list[Hold]:
        """The pod's holds dropped (``restore_decided`` puts them back)."""
        taken = []
        for key in self._ledger.decided_for.pop(pod, ()):
            hold = self._ledger.holds.get(key)
            if hold is not None and hold.pod == pod:
                self._ledger.drop(key)
                taken.append(hold)
        return taken

    def restore_decided(self, pod: str, taken: Sequence[object]) -> list[Hold]:
        holds = [h for h in taken if isinstance(h, Hold) and h.key not in self._ledger.holds]
        for hold in holds:
            self._ledger.put(hold)
        if holds:
            self._ledger.decided_for.setdefault(pod, []).extend(h.key for h in holds)
        return holds

    def held_on(self, node: str) -> bool:
        """Whether a hold of the what-if is on ``node``."""
        return bool(self._ledger.on_node(node))

    def bookings_on(
        self, node: str, cards: Mapping[str, model.DeviceUsage]
    ) -> list[list[placement.Booking]]:
        """What the what-if's holds take of the node's cards (the live holds are booked
        by the live books)."""
        return [claim_ledger.bookings(h, cards) for h in self._ledger.on_node(node)]

    def sums(self, hold: Hold) -> dict[str, tuple[int, int]]:
        """What ``hold`` counts in its namespace's quota (``claim_ledger.hold_sums``)."""
        return claim_ledger.hold_sums(hold, self._registered(hold.node), self.mig_of(hold.node))

    # --- the read view (``view.ClaimReads``) ----------------------------------------------
    @property
    def objects(self) -> Mapping[str, ResourceClaim]:
        if not self._objects:
            return self._live.objects
        if self._merged is None:
            self._merged = {**self._live.objects, **self._objects}
        return self._merged

    @property
    def classes(self) -> Mapping[str, claims.DeviceClass]:
        return self._live.classes

    @property
    def selector_cache(self) -> claim_cel.SelectorCache:
        return self._live.selector_cache

    @property
    def admin_namespaces(self) -> frozenset[str]:
        return self._live.admin_namespaces

    def pool_of(self, node: str) -> dra_pool.Pool | None:
        pool = self._pools.get(node)
        return pool if pool is not None else self._live.pool_of(node)

    def mig_of(self, node: str) -> claim_mig.MigNode | None:
        mig = self._migs.get(node)
        return mig if mig is not None else self._live.mig_of(node)

    def held_devices(self, node: str) -> list[str]:
        mine = [s.device for h in self._ledger.on_node(node) for s in h.shares]
        return [*self._live.held_devices(node), *mine]

    def holders_on(self, node: str) -> list[tuple[Hold, frozenset[str]]]:
        mine = [(h, frozenset[str]()) for h in self._ledger.on_node(node)]
        return [*self._live.holders_on(node), *mine]

    def holds_claim(self, key: str) -> bool:
        return key in self._ledger.holds or self._live.holds_claim(key)

    def decided_by_other(self, key: str, pod: str) -> Hold | None:
        hold = self._ledger.holds.get(key)
        if hold is not None:
            return None if hold.pod in ("", pod) else hold
        return self._live.decided_by_other(key, pod)
