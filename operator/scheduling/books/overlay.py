"""A what-if on an overlay of the books: pods out, reservations and holds in, the live
books never written.

The defragmentation planner tries plans (pods evicted, their replacements placed, a hold
for the waiting pod) by running the decision cycle (``decision.Cycle``) on an
``Overlay``: it reads the live books through their view and keeps its own changes beside
them. A node a change touches is copied and rebuilt from the overlay's pods; every other
node is the live one. The quota ledger is a copy (pods are parsed against it). The
live books' bookings, quota, nominations, change log and freed room (the queue's hints)
are never written, so a what-if cannot leave anything behind, and the books may change
between two steps of a plan made in steps as long as the overlay holds no change then.
On the DRA path a decision holds its claims' devices until the claims come back allocated
(``claim_books``); on an overlay those holds are the overlay's own (``overlay_claims``),
booked on its copies of the nodes' cards and in its copy of the quota ledger.

Autoscaling's what-if (``autoscale``) also adds nodes that do not exist yet (``add_node``):
entries built by the books' own code from the Node and inventory a new node of an instance
type would have, walked, ranked and fitted like every other node, after all the live ones; a
new node on the DRA path comes with the pool its agent would publish.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import model
from vgpu_operator.scheduling import node_basics
from vgpu_operator.scheduling.books import changes, claim_ledger, pod_entries
from vgpu_operator.scheduling.books.books import Books
from vgpu_operator.scheduling.books.entries import NodeEntry, Nomination, PodEntry, change_node
from vgpu_operator.scheduling.books.group_claims import GroupClaims
from vgpu_operator.scheduling.books.group_victims import GroupReads
from vgpu_operator.scheduling.books.overlay_claims import OverlayClaims
from vgpu_operator.scheduling.books.view import ClaimReads
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import claim_mig, dra_pool
from vgpu_operator.scheduling.mig import mig_records
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.policies import policies
from vgpu_operator.scheduling.preemption import disruption
from vgpu_operator.scheduling.quota import QuotaLedger
from vgpu_operator.scheduling.vendors import Vendors
from vgpu_operator.wire import ResourceClaim

_K = TypeVar("_K")
_V = TypeVar("_V")


class _Layered(Mapping[_K, _V]):
    """A live mapping with some keys replaced or hidden (the overlay's nodes and pods)."""

    def __init__(self, live: Mapping[_K, _V], added: Mapping[_K, _V], hidden: set[_K]):
        self._live, self._added, self._hidden = live, added, hidden

    def __getitem__(self, key: _K) -> _V:
        if key in self._added:
            return self._added[key]
        if key in self._hidden:
            raise KeyError(key)
        return self._live[key]

    def get(self, key: _K, default: Any = None) -> Any:
        if key in self._added:
            return self._added[key]
        if key in self._hidden:
            return default
        return self._live.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._added or (key not in self._hidden and key in self._live)

    def __iter__(self) -> Iterator[_K]:
        for key in self._live:
            if key in self._added or key not in self._hidden:
                yield key
        for key in self._added:
            if key not in self._live:
                yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Overlay:
    """The books as a what-if changed them (``view.BooksWriter``), over live ``Books``."""

    def __init__(self, live: Books) -> None:
        self._live = live
        #: Live pods taken out, and pods put in (reservations, holds, live pods put back).
        self._out: set[PodKey] = set()
        self._in: dict[PodKey, PodEntry] = {}
        #: Copies of the nodes a change touched, rebuilt from the overlay's pods.
        self._nodes: dict[str, NodeEntry] = {}
        self._quota: QuotaLedger | None = None
        self._nominations: dict[PodKey, Nomination] = {}
        self._nominations_gone: set[PodKey] = set()
        self._preempted: set[PodKey] = set()
        self._unpreempted: set[PodKey] = set()
        self._reads: dict[PodKey, object] = {}
        #: The live nodes with the touched ones replaced, while the touched set holds.
        self._node_map: Mapping[str, NodeEntry] | None = None
        #: Nodes that do not exist (``add_node``), kept in ``_nodes`` like touched copies.
        self._added: set[str] = set()
        #: The DRA part: new nodes' pools, the decisions' holds, claims not made yet.
        self._claims = OverlayClaims(live.claims, self._registered_on)
        #: Per hold of a decision, its namespace and what it counts in the quota copy.
        self._hold_sums: dict[str, tuple[str, dict[str, tuple[int, int]]]] = {}

    @property
    def empty(self) -> bool:
        """Whether the overlay holds no change (it reads as the live books)."""
        return not (
            self._added
            or self._out
            or self._in
            or self._nominations
            or self._nominations_gone
            or self._preempted
            or self._unpreempted
            or not self._claims.empty
        )

    def _settle(self) -> None:
        """Forget what was derived from changes once none is left: the live books may
        change before the next one."""
        if self.empty:
            self._nodes.clear()
            self._node_map = None
            self._quota = None
            self._reads.clear()  # their jobs check quota against the copy dropped

    # --- the read view ---------------------------------------------------------------
    @property
    def config(self) -> DeviceConfig:
        return self._live.config

    @property
    def vendors(self) -> Vendors:
        return self._live.vendors

    @property
    def quota(self) -> QuotaLedger:
        """A copy of the live ledger (jobs parsed on the overlay check against it)."""
        return self._ledger()

    @property
    def nodes(self) -> Mapping[str, NodeEntry]:
        if not self._nodes:
            return self._live.nodes
        if self._node_map is None:
            # A plain dict (the walks look every node up): rebuilt only when another node
            # is touched, since the touched copies change in place.
            self._node_map = MappingProxyType({**self._live.nodes, **self._nodes})
        return self._node_map

    @property
    def pods(self) -> Mapping[PodKey, PodEntry]:
        if not self._in and not self._out:
            return self._live.pods
        return _Layered(self._live.pods, self._in, self._out)

    @property
    def epoch(self) -> int:
        return self._live.epoch

    @property
    def inventory_timeout_s(self) -> float | None:
        return self._live.inventory_timeout_s

    @property
    def change_log(self) -> changes.ChangeLog:
        return self._live.change_log

    @property
    def claims(self) -> ClaimReads:
        return self._claims

    def add_claim(self, obj: ResourceClaim) -> None:
        """A claim that does not exist yet joins the what-if (a waiting pod's template
        claim, as the claim controller would make it: ``overlay_claims``)."""
        self._claims.add_claim(obj)

    def budgets(self) -> list[disruption.Budget]:
        return self._live.budgets()

    @property
    def groups(self) -> GroupReads:
        return self._live.groups

    @property
    def group_claims(self) -> Mapping[str, GroupClaims]:
        return self._live.group_claims

    def is_preempted(self, key: PodKey) -> bool:
        if key in self._preempted:
            return True
        return key not in self._unpreempted and self._live.is_preempted(key)

    def nominated_node(self, key: PodKey) -> str | None:
        nomination = self._nomination(key)
        return None if nomination is None else nomination.node

    def victims_remain(self, nomination: Nomination) -> bool:
        return bool(nomination.remaining(self.pods))

    def awaited_on(self, node: str) -> frozenset[PodKey]:
        """The live books' (also where the overlay gave a nomination up: what may not be
        counted on stays so) and the overlay's own."""
        own = {v for n in self._nominations.values() if n.node == node for v in n.victims}
        return self._live.awaited_on(node) | own

    def node_names(self) -> list[str]:
        added = sorted(self._added, key=lambda name: self._nodes[name].order)
        return [*self._live.node_names(), *added]

    def add_node(
        self,
        entry: NodeEntry,
        pool: dra_pool.Pool | None = None,
        mig: claim_mig.MigNode | None = None,
    ) -> None:
        """A node that does not exist yet joins the what-if (autoscaling's): ``entry`` is
        the books' own record of it, with no pod, ordered after every live node; ``pool``
        and ``mig``: the DRA pool its agent would publish (a node on the DRA path)."""
        if entry.name in self._live.nodes or entry.name in self._nodes:
            raise ValueError(f"node {entry.name!r} is already in the books")
        if entry.pods:
            raise ValueError(f"a node added to a what-if starts empty ({entry.name!r})")
        self._nodes[entry.name] = entry
        self._added.add(entry.name)
        self._claims.add_pool(entry.name, pool, mig)
        self._node_map = None

    def remove_node(self, name: str) -> None:
        """Take back a node ``add_node`` added; it must hold no pod by then."""
        node = self._nodes.get(name)
        if name not in self._added or node is None:
            raise ValueError(f"node {name!r} was not added to this what-if")
        if node.pods:
            raise ValueError(f"node {name!r} still holds pods")
        if self._claims.held_on(name):
            raise ValueError(f"node {name!r} still holds claims")
        del self._nodes[name]
        self._added.discard(name)
        self._claims.remove_pool(name)
        self._node_map = None
        self._settle()

    def added_nodes(self) -> list[str]:
        """The nodes ``add_node`` added and not removed, in their order."""
        return sorted(self._added, key=lambda name: self._nodes[name].order)

    def forget_freed(self, keys: Iterable[PodKey]) -> None:
        """Nothing is freed on an overlay (the queue's hints are the live books')."""

    def refresh(self, node: NodeEntry) -> None:
        copy = self._nodes.get(node.name)
        if copy is not node:
            self._live.refresh(node)
            return
        if not node.dirty:
            return
        pods = self.pods
        change_node(node, cards=self.fresh_cards(node, frozenset(), pods))
        used = node_basics.PodResources()
        for key in sorted(node.pods):
            entry = pods.get(key)
            if entry is not None:
                used = used + entry.requests
        change_node(
            node,
            used=used,
            score=policies.node_score(node.cards),
            summary=placement.Summary.of(node.cards),
            dirty=False,
        )

    def rerank(self) -> None:
        self._live.rerank()
        for node in self._nodes.values():
            self.refresh(node)

    def ranking(self, pod_node_policy: str | None) -> Iterable[tuple[float, int, str]]:
        """The live ranking with the touched nodes where their overlay puts them."""
        live = self._live.ranking(pod_node_policy)
        if not self._nodes:
            return live
        merged = list(live)
        for name in self._nodes:
            old = self._live.rank_entry(name, pod_node_policy)
            if old is not None:
                at = bisect.bisect_left(merged, old)
                if at < len(merged) and merged[at] == old:
                    del merged[at]
            entry = self.rank_entry(name, pod_node_policy)
            if entry is not None:
                bisect.insort(merged, entry)
        return merged

    def rank_entry(self, name: str, pod_node_policy: str | None) -> tuple[float, int, str] | None:
        node = self._nodes.get(name)
        if node is None:
            return self._live.rank_entry(name, pod_node_policy)
        self.refresh(node)
        if not node.summary.has_room():
            return None
        if pod_node_policy is None:
            return (-self.layered_preference(node), node.order, name)
        if pod_node_policy == policies.SPREAD:
            return (node.score, node.order, name)
        return (-node.score, node.order, name)

    def layered_preference(self, node: NodeEntry) -> float:
        return self._live.layered_preference(node)

    def fresh_cards(
        self,
        node: NodeEntry,
        skip: frozenset[PodKey],
        pods: Mapping[PodKey, PodEntry] | None = None,
    ) -> list[model.DeviceUsage]:
        cards = self._live.fresh_cards(node, skip, self.pods if pods is None else pods)
        by_id = {card.id: card for card in cards}
        for booked in self._claims.bookings_on(node.name, by_id):
            placement.book(by_id, {"claims": booked})
        return cards

    def mig_tables_of(self, node_name: str) -> mig_records.TableOf:
        if node_name in self._added:
            return pod_entries.mig_tables(self._nodes[node_name], self._live.vendors)
        return self._live.mig_tables_of(node_name)

    # --- the cycle's writes, kept here ----------------------------------------------
    def add_pod(self, entry: PodEntry) -> None:
        key = entry.key
        if key in self._out and self._live.pods.get(key) is entry:
            self._out.discard(key)  # a live pod put back as it was
        else:
            self._in[key] = entry
        self._ledger().add_sums(entry.namespace, entry.quota_sums)
        node = self._touched(entry.node)
        if node is not None:
            node.pods.add(key)
            self._shift(node, entry, 1)
        self._settle()

    def drop_pod(self, key: PodKey) -> None:
        entry = self._in.pop(key, None)
        if entry is None:
            entry = self._live.pods.get(key)
            if entry is None or key in self._out:
                return
            self._out.add(key)
        self._ledger().remove_sums(entry.namespace, entry.quota_sums)
        node = self._touched(entry.node)
        if node is not None:
            node.pods.discard(key)
            self._shift(node, entry, -1)
        self._settle()

    def nominate(self, key: PodKey, nomination: Nomination) -> None:
        self._nominations[key] = nomination
        self._nominations_gone.discard(key)
        self._preempted.update(nomination.victims)

    def pop_nomination(self, key: PodKey) -> Nomination | None:
        nomination = self._nomination(key)
        self._nominations.pop(key, None)
        if nomination is not None and self._live.nominated_node(key) is not None:
            self._nominations_gone.add(key)
        self._settle()
        return nomination

    def cancel_preemption(self, key: PodKey) -> None:
        """Give up a hold made on the overlay (``Books.cancel_preemption``)."""
        nomination = self.pop_nomination(key)
        if nomination is None:
            return
        entry = self.pods.get(key)
        if entry is not None and entry.reserved:
            self.drop_pod(key)
        self.unmark_preempted(nomination.victims)

    def unmark_preempted(self, keys: Iterable[PodKey]) -> None:
        for key in keys:
            if key in self._preempted:
                self._preempted.discard(key)
            elif self._live.is_preempted(key):
                self._unpreempted.add(key)
        self._settle()

    def expire_nominations(self, now: float) -> None:
        """Nothing expires within a what-if (the live books expire their own)."""

    def pod_read(self, key: PodKey) -> object:
        """The overlay's own reads only: a live read's job checks the live ledger."""
        return self._reads.get(key)

    def keep_read(self, key: PodKey, read: object) -> None:
        self._reads[key] = read

    def forget(self, key: PodKey) -> None:
        """Drop all the overlay knows of a pod that never was (a replacement)."""
        self.release_decided(key)
        self.drop_pod(key)
        self.pop_nomination(key)
        self._reads.pop(key, None)

    # --- the DRA path's holds (``overlay_claims``) -----------------------------------
    def hold_decided(
        self, pod: PodKey, node: str, decided: Mapping[str, tuple[str, Sequence[Any]]]
    ) -> None:
        """Hold what a trial's decision allocates: on the overlay's copy of the node's
        cards and in its copy of the quota ledger (the live books are never written)."""
        for hold in self._claims.hold_decided(pod, node, decided):
            self._counted(hold, 1)

    def take_decided(self, key: PodKey) -> tuple[object, ...]:
        """The pod's holds dropped, for ``restore_decided`` (only the overlay's own: a
        live decision's holds are the live books')."""
        taken = self._claims.take_decided(key)
        for hold in taken:
            self._counted(hold, -1)
        self._settle()
        return tuple(taken)

    def restore_decided(self, key: PodKey, taken: tuple[object, ...]) -> None:
        for hold in self._claims.restore_decided(key, taken):
            self._counted(hold, 1)

    def release_decided(self, key: PodKey) -> None:
        """A trial's decision undone: its holds go."""
        self.take_decided(key)

    # --- helpers -----------------------------------------------------------------------
    def _nomination(self, key: PodKey) -> Nomination | None:
        if key in self._nominations:
            return self._nominations[key]
        if key in self._nominations_gone:
            return None
        return self._live.nomination(key)

    def _registered_on(self, name: str) -> Sequence[model.DeviceInfo]:
        node = self.nodes.get(name)
        return () if node is None else node.registered

    def _counted(self, hold: claim_ledger.Hold, sign: int) -> None:
        """A hold joins (1) or leaves (-1): its node's copy is rebuilt on next use, and
        what it counts in its namespace's quota is added to or taken from the copy."""
        node = self._touched(hold.node)
        if node is not None:
            change_node(node, dirty=True)
        if sign > 0:
            sums = self._claims.sums(hold)
            self._hold_sums[hold.key] = (hold.namespace, sums)
            self._ledger().add_sums(hold.namespace, sums)
            return
        counted = self._hold_sums.pop(hold.key, None)
        if counted is not None:
            self._ledger().remove_sums(*counted)

    def _ledger(self) -> QuotaLedger:
        if self._quota is None:
            self._quota = self._live.quota.copy()
        return self._quota

    def _touched(self, name: str | None) -> NodeEntry | None:
        """The overlay's copy of a node a change touches (made on first touch, with a
        copy of its cards as the live books have them)."""
        if name is None:
            return None
        node = self._nodes.get(name)
        if node is None:
            live = self._live.nodes.get(name)
            if live is None:
                return None
            self._live.refresh(live)
            cards = [card.copy() for card in live.cards]
            node = dataclasses.replace(
                live, pods=set(live.pods), cards=cards, allocating=dict(live.allocating)
            )
            self._nodes[name] = node
            self._node_map = None
        return node

    def _shift(self, node: NodeEntry, entry: PodEntry, sign: int) -> None:
        """One pod joins (1) or leaves (-1) a touched node: its shares are added to or
        taken from the copy's cards in place (``Books._shift``), else it is rebuilt."""
        if node.dirty or not placement.shift(node.cards, entry.bookings, sign):
            change_node(node, dirty=True)
            return
        change_node(
            node,
            used=node.used + entry.requests if sign > 0 else node.used - entry.requests,
            score=policies.node_score(node.cards),
            summary=placement.Summary.of(node.cards),
        )
