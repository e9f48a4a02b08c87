"""The books: the cluster as the engine knows it, held by ``Books`` as parts.

Nodes and their cards (inventories or register annotations), the pods that hold shares,
reservations and preemptors' holds, quotas, budgets, with parts of their own: ranking index
(``ranking``), allocation gate (``gate_book``), bound pods' allocations
(``allocation_book``), DRA inputs (``claim_books``), PodGroups (``group_victims``). Readers
use the view (``view.BooksView``); the decision cycle writes through ``add_pod``/``drop_pod``
and the nomination methods. Pure and synchronous."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from vgpu_operator import names, wire
from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import model
from vgpu_operator.devices.catalog import VENDOR_TABLE
from vgpu_operator.devices.vendor import VendorSpec
from vgpu_operator.scheduling import node_annotations, node_basics
from vgpu_operator.scheduling.books import (
    changes,
    claim_books,
    node_cards,
    node_register,
    pod_entries,
)
from vgpu_operator.scheduling.books.allocation_book import Allocations
from vgpu_operator.scheduling.books.entries import (
    NodeEntry,
    Nomination,
    PodEntry,
    change_node,
    is_dra_node,
)
from vgpu_operator.scheduling.books.gate_book import GateBook
from vgpu_operator.scheduling.books.group_claims import GroupClaims
from vgpu_operator.scheduling.books.group_victims import GroupReads, PodGroups, ReadGroups
from vgpu_operator.scheduling.books.nominations import Nominations
from vgpu_operator.scheduling.books.ranking import RankIndex
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import dra_pool
from vgpu_operator.scheduling.mig import mig_records
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.scheduling.policies import node_layer, policies
from vgpu_operator.scheduling.preemption import disruption
from vgpu_operator.scheduling.quota import QuotaLedger
from vgpu_operator.scheduling.vendors import Vendors

#: How long a preemptor's hold on the shares its victims free lasts without a bind.
DEFAULT_NOMINATION_TIMEOUT_S = 300.0


class Books:
    """What the engine knows of the cluster, kept current by the ``set_*``/``remove_*``
    inputs (those of the DRA path on the ``claims`` part). Not thread-safe: callers
    serialise access."""

    def __init__(
        self,
        config: DeviceConfig,
        inventory_timeout_s: float | None = None,
        vendor_table: Sequence[VendorSpec] = VENDOR_TABLE,
    ) -> None:
        self._config = config
        self._vendor_table = tuple(vendor_table)
        self._vendors = Vendors(config, self._vendor_table)
        self._node_annotation_keys = node_annotations.read_keys(self._vendor_table)
        self._inventory_timeout_s = inventory_timeout_s
        self._nodes: dict[str, NodeEntry] = {}
        self._pods: dict[PodKey, PodEntry] = {}
        # What readers get: live read-only views, no copy (a write through one fails).
        self._nodes_read = MappingProxyType(self._nodes)
        self._pods_read = MappingProxyType(self._pods)
        self._quota = QuotaLedger(self._vendors.memory_resources(), self._vendors.core_resources())
        self._quota_objects: dict[tuple[str, str], wire.ResourceQuota] = {}
        self._next_order = 0
        #: Nodes with a free card in each policy's order (``ranking``), kept current
        #: through ``_dirty``.
        self._rank = RankIndex()
        self._dirty: set[str] = set()
        self._budgets: dict[tuple[str, str], disruption.Budget] = {}
        self._groups = PodGroups()  # rules, claims and members (``group_victims``)
        self._groups_read = ReadGroups(self._groups)
        #: Preemptors waiting for their victims (a hold on the freed shares), the victims
        #: marked, and the holds that timed out until the runtime takes them.
        self._nominations = Nominations()
        #: Bound pods' allocations as first seen, and those not believed or edited.
        self._allocations = Allocations(self._record_keys())
        #: Bumped when what admission and parsing depend on changes (config, quota limits);
        #: the decision's per-pod parse cache is valid within one epoch.
        self._epoch = 0
        #: The decision's read of each waiting pod (``pod_read``), dropped when it goes.
        self._attempts: dict[PodKey, object] = {}
        #: The allocation gate's part: mode, timeout, the plugins' answers.
        self.gate = GateBook()
        #: Every change to a node a Fit reads, numbered (verdicts judge again only the
        #: nodes changed since they were made), and the room pods freed (queueing hints).
        self._changes = changes.ChangeLog()
        self._freed = changes.FreedRoom()
        #: The DRA inputs: slices, claims, device classes and the claims' holds.
        self.claims = claim_books.ClaimBooks(
            claim_books.Hooks(
                self._cards_changed, self._holds_changed, self._registered_on, lambda: self._quota
            )
        )

    @property
    def config(self) -> DeviceConfig:
        return self._config

    @property
    def vendors(self) -> Vendors:
        """The vendor table, configured."""
        return self._vendors

    @property
    def quota(self) -> QuotaLedger:
        """The namespaces' quota ledger (read it; the books keep it current)."""
        return self._quota

    # --- the read view (``view.BooksView``) ------------------------------------------------
    @property
    def nodes(self) -> Mapping[str, NodeEntry]:
        """Every node by name, in the order the books met them (read-only)."""
        return self._nodes_read

    @property
    def pods(self) -> Mapping[PodKey, PodEntry]:
        """Every pod that holds shares or a reservation (read-only)."""
        return self._pods_read

    @property
    def epoch(self) -> int:
        """Bumped when what admission and parsing depend on changes (config, quota limits)."""
        return self._epoch

    @property
    def inventory_timeout_s(self) -> float | None:
        return self._inventory_timeout_s

    @property
    def change_log(self) -> changes.ChangeLog:
        """Every change to a node a Fit reads, numbered (read, never change)."""
        return self._changes

    def budgets(self) -> list[disruption.Budget]:
        return list(self._budgets.values())

    @property
    def groups(self) -> GroupReads:
        return self._groups_read

    @property
    def group_claims(self) -> Mapping[str, GroupClaims]:
        return self._groups.claims

    def note_pod_group(self, key: str, pod_group: wire.PodGroup | None) -> None:
        """The PodGroup ``key`` as read now (None: gone): the store's and simulate's write."""
        self._groups.note(key, pod_group)

    def is_preempted(self, key: PodKey) -> bool:
        """Whether the pod is a victim of a preemption or plan under way."""
        return self._nominations.is_preempted(key)

    def ranking(self, pod_node_policy: str | None) -> Sequence[tuple[float, int, str]]:
        """The nodes with a free card, best first: (key, order, name); ``rerank`` first."""
        return self._rank.ranking(pod_node_policy)

    def rank_entry(self, name: str, pod_node_policy: str | None) -> tuple[float, int, str] | None:
        """The node's entry in ``ranking(pod_node_policy)`` (None: it has no free card)."""
        return self._rank.entry(name, pod_node_policy)

    # --- the decision's writes ---------------------------------------------------------
    def pod_read(self, key: PodKey) -> object:
        """A waiting pod's read (``pod_read``), dropped here when it is bound or gone."""
        return self._attempts.get(key)

    def keep_read(self, key: PodKey, read: object) -> None:
        self._attempts[key] = read

    def nomination(self, key: PodKey) -> Nomination | None:
        return self._nominations.get(key)

    def pop_nomination(self, key: PodKey) -> Nomination | None:
        return self._nominations.pop(key)

    def nominate(self, key: PodKey, nomination: Nomination) -> None:
        """Hold a preemptor's nomination; its victims may not be chosen again meanwhile."""
        self._nominations.add(key, nomination)

    def take_decided(self, key: PodKey) -> tuple[object, ...]:
        """A DRA decision given up: its holds go (``claim_books``; ``restore_decided``)."""
        return self.claims.take_decided(key)

    def restore_decided(self, key: PodKey, taken: tuple[object, ...]) -> None:
        self.claims.restore_decided(key, taken)

    def hold_decided(
        self, pod: PodKey, node: str, decided: Mapping[str, tuple[str, Sequence[Any]]]
    ) -> None:
        """Hold what a DRA decision allocates until its claims come back (``claim_books``)."""
        self.claims.hold_decided(pod, node, decided)

    def unmark_preempted(self, keys: Iterable[PodKey]) -> None:
        """Let these pods be chosen again (a hold given up)."""
        self._nominations.unmark(keys)

    def set_config(self, config: DeviceConfig) -> None:
        self._epoch += 1
        self._config = config
        self._vendors = Vendors(config, self._vendor_table)
        self._allocations.set_keys(self._record_keys())
        ledger = QuotaLedger(self._vendors.memory_resources(), self._vendors.core_resources())
        for quota in self._quota_objects.values():
            ledger.set_quota(quota)
        self._quota = ledger
        for entry in self._pods.values():
            self._quota.add_sums(entry.namespace, entry.quota_sums)
        self.claims.requota()
        for node in self._nodes.values():
            self._register(node)
        for pod in self._allocations.reconsider():
            self.set_pod(pod)

    def _record_keys(self) -> list[str]:
        """The annotations a pod's allocation is read from (``FirstRecords``)."""
        return [*self._vendors.allocated_keys().values(), names.MIG_ALLOCATIONS]

    def set_node(self, node: wire.Node) -> None:
        facts = node_basics.NodeFacts.from_node(node, self._node_annotation_keys)
        entry = self._node_entry(facts.name)
        change_node(entry, facts=facts)
        self._observe_gpu_count(entry)
        self._register(entry)

    def _node_entry(self, name: str) -> NodeEntry:
        """The node's entry, created on first sight (by its Node or its inventory, in
        either order) with the pods already known to run there."""
        entry = self._nodes.get(name)
        if entry is None:
            entry = NodeEntry(name, self._next_order, node_basics.NodeFacts(name))
            self._next_order += 1
            self._nodes[name] = entry
            entry.pods.update(p.key for p in self._pods.values() if p.node == name)
        return entry

    def remove_node(self, name: str) -> None:
        if name in self._nodes:
            self._unrank(name)
            del self._nodes[name]
            self._changes.bump(name)

    def set_inventory(
        self,
        node_name: str,
        devices: Sequence[model.DeviceInfo],
        pair_scores: model.PairScores,
        heartbeat: float | None,
        cordoned: Sequence[str] = (),
    ) -> None:
        entry = self._node_entry(node_name)
        inventory, banned = tuple(devices), frozenset(cordoned)
        change_node(entry, heartbeat=heartbeat)
        if (
            entry.inventory == inventory
            and entry.inventory_scores == pair_scores
            and entry.inventory_cordoned == banned
        ):
            # A report with the same cards (the agent re-asserting it, an older agent's
            # heartbeat): the node keeps its cards, bookings and rank, not rebuilt.
            return
        change_node(
            entry, inventory=inventory, inventory_scores=pair_scores, inventory_cordoned=banned
        )
        self._register(entry)

    def set_heartbeat(self, node_name: str, heartbeat: float | None) -> None:
        """Move only the node's heartbeat (its Lease was renewed): nothing else of the node
        changes, so nothing is rebuilt. A node without an inventory has no heartbeat."""
        entry = self._nodes.get(node_name)
        if entry is not None and entry.inventory is not None:
            change_node(entry, heartbeat=heartbeat)

    def remove_inventory(self, node_name: str) -> None:
        entry = self._nodes.get(node_name)
        if entry is not None:
            change_node(entry, inventory=None, heartbeat=None)
            self._register(entry)

    def set_pod(self, pod: wire.Pod) -> None:
        """Record a pod; one bound with an allocation holds its devices until it ends.

        A pending preemptor's hold on its nominated node survives updates of the pod
        (its ``nominatedNodeName`` status, for one) until it binds, ends or times out.
        """
        key = pod_key(pod)
        self.claims.pod_seen(pod)  # a claim that went keeps its hold while its pods run
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        node = (pod.get("spec") or {}).get("nodeName") or None
        deleting = bool(meta.get("deletionTimestamp"))
        if (
            node is None
            and key in self._nominations
            and not deleting
            and phase not in names.TERMINAL_PHASES
        ):
            return
        previous = self._pods.get(key)
        source = (self._epoch, *pod_entries.share_source(pod, node, deleting))
        if (
            previous is not None
            and previous.source is not None
            and phase not in names.TERMINAL_PHASES
            and previous.source == source
        ):
            # A status update (kubelet's or KWOK's) or the bound copy read again: nothing
            # the shares, quotas or gate are read from changed, so the node stays as it
            # is; only what preemption reads of the pod itself is taken afresh.
            started, labels = pod_entries.start_time(pod), meta.get("labels") or {}
            if previous.started != started or previous.labels != labels:
                self._pods[key] = dataclasses.replace(
                    previous, started=started, labels=dict(labels)
                )
            return
        clean = previous is not None and self._is_clean(previous.node)
        self.drop_pod(key)
        self._nominations.pop(key)
        self._allocations.clear(key)
        if node is not None or phase in names.TERMINAL_PHASES:
            self._attempts.pop(key, None)  # no longer waiting: its parse is done with
        if node is None or phase in names.TERMINAL_PHASES:
            return
        entry = pod_entries.bound_entry(
            key,
            pod,
            node,
            deleting,
            previous,
            source,
            self.gate,
            self._allocations,
            self._vendors,
            self._config,
        )
        on_mig = bool(entry.mig_records) or pod_entries.on_mig_cards(
            self._nodes.get(node or ""), entry.devices
        )
        self.add_pod(entry)
        if on_mig:
            self._read_mig_records(node)
        elif clean and previous is not None and pod_entries.same_shares(previous, entry):
            # The bound copy of a reservation, or a status update: the node's cards,
            # score and summary stand, so it need not be rebuilt and ranked again.
            self._untouch(node)

    def _read_mig_records(self, node_name: str) -> None:
        """Book the MIG instances of the node's pods afresh (``pod_entries.mig_reread``):
        done again whenever the node's cards change, since the tables come with them."""
        for entry in pod_entries.mig_reread(self._nodes.get(node_name), self._pods, self._vendors):
            self.drop_pod(entry.key)
            self.add_pod(entry)

    def mig_tables_of(self, node_name: str) -> mig_records.TableOf:
        """What names the instances of each MIG card of the node, by card UUID."""
        return pod_entries.mig_tables(self._nodes.get(node_name), self._vendors)

    def remove_pod(self, key: PodKey) -> None:
        self.claims.pod_gone(key)
        self.claims.release_decided(key)
        self._attempts.pop(key, None)
        self.drop_pod(key)
        self._nominations.gone(key)
        self._allocations.forget(key)
        self.gate.forget(key)

    def allocation_error(self, key: PodKey) -> str | None:
        """Why a bound pod's allocation annotation could not be read or is not believed
        (it books nothing)."""
        return self._allocations.error(key)

    def allocation_warning(self, key: PodKey) -> str | None:
        """What the books ignored of a bound pod's annotations (an edit after binding)."""
        return self._allocations.warning(key)

    def set_budget(self, pdb: wire.PodDisruptionBudget) -> None:
        """Record a PodDisruptionBudget (preemption spares the pods it protects if it can)."""
        budget = disruption.Budget.from_object(pdb)
        self._budgets[(budget.namespace, budget.name)] = budget

    def remove_budget(self, namespace: str, name: str) -> None:
        self._budgets.pop((namespace, name), None)

    def set_quota(self, quota: wire.ResourceQuota) -> None:
        self._epoch += 1
        meta = quota.get("metadata") or {}
        self._quota.set_quota(quota)
        self._quota_objects[(meta.get("namespace") or "default", meta.get("name", ""))] = quota

    def remove_quota(self, namespace: str, name: str) -> None:
        self._epoch += 1
        self._quota.remove_quota(namespace, name)
        self._quota_objects.pop((namespace, name), None)

    def confirm(self, key: PodKey, now: float | None = None) -> None:
        """The pod is bound: its reservation (or preemption hold) becomes a booking, and
        its hold on the node's allocation gate is timed from ``now`` (the Binding's answer,
        on the operator's clock; None: from the gate's next look)."""
        entry = self._pods.get(key)
        if entry is not None:
            if entry.reserved:
                entry = self._pods[key] = dataclasses.replace(entry, reserved=False)
            if entry.allocating_since is not None and now is not None:
                self.gate.time(entry, self._nodes.get(entry.node or ""), now)
        self._nominations.pop(key)
        self.claims.settle_decided(key)

    def rollback(self, key: PodKey) -> None:
        entry = self._pods.get(key)
        if entry is not None and entry.reserved and key not in self._nominations:
            self.drop_pod(key)
        self.claims.release_decided(key)

    def cancel_preemption(self, key: PodKey) -> None:
        """Give up a preemptor's hold (an eviction was refused): its victims that are
        still running may be chosen again by a later decision."""
        if self._nominations.cancel(key) is None:
            return
        entry = self._pods.get(key)
        if entry is not None and entry.reserved:
            self.drop_pod(key)
        self.claims.release_decided(key)  # a DRA preemptor's hold on the freed shares

    def nominated_node(self, key: PodKey) -> str | None:
        nomination = self._nominations.get(key)
        return None if nomination is None else nomination.node

    def fresh_cards(
        self,
        node: NodeEntry,
        skip: frozenset[PodKey],
        pods: Mapping[PodKey, PodEntry] | None = None,
    ) -> list[model.DeviceUsage]:
        """A node's cards booked with its pods, except ``skip`` (cf. ``refresh``);
        ``pods``: the pod entries to book (an overlay's; default the books' own)."""
        on = self._pods if pods is None else pods
        return node_cards.booked_cards(node, skip, on, self._vendors, self.claims.bookings_on)

    def victims_remain(self, nomination: Nomination) -> bool:
        return bool(nomination.remaining(self._pods))

    def expire_nominations(self, now: float) -> None:
        for key in self._nominations.expire(now):
            self.cancel_preemption(key)

    def take_expired(self) -> list[tuple[PodKey, Nomination]]:
        return self._nominations.take_expired()

    def awaited_on(self, node: str) -> frozenset[PodKey]:
        """The victims the nominations on ``node`` wait for (``nominations``)."""
        return self._nominations.awaited_on(node)

    def take_freed(self) -> list[changes.Freed]:
        """Room freed on nodes since the last call (``changes.FreedRoom``): where to look."""
        return self._freed.take()

    def forget_freed(self, keys: Iterable[PodKey]) -> None:  # see FreedRoom.forget
        self._freed.forget(keys)

    def node_names(self) -> list[str]:
        return [n.name for n in sorted(self._nodes.values(), key=lambda n: n.order)]

    def add_pod(self, entry: PodEntry) -> None:
        self._pods[entry.key] = entry
        self._groups.joined(entry)
        self._freed.came(entry.key, entry.node, (entry.bookings, entry.requests))
        self._quota.add_sums(entry.namespace, entry.quota_sums)
        node = self._nodes.get(entry.node or "")
        if node is not None:
            node.pods.add(entry.key)
            since = self.gate.held_since(entry)
            if since is not None:
                node.allocating[entry.key] = since
            self._shift(node, entry, 1)

    def drop_pod(self, key: PodKey) -> None:
        entry = self._pods.pop(key, None)
        if entry is None:
            return
        self._groups.left(entry)
        if entry.node is not None:
            self._freed.left(key, entry.node, entry.namespace, (entry.bookings, entry.requests))
        self._quota.remove_sums(entry.namespace, entry.quota_sums)
        node = self._nodes.get(entry.node or "")
        if node is not None:
            node.pods.discard(key)
            node.allocating.pop(key, None)
            self._shift(node, entry, -1)

    def _shift(self, node: NodeEntry, entry: PodEntry, sign: int) -> None:
        """One pod joins (1) or leaves (-1) a node whose cards are current: its shares
        are added or taken away in place and the node is ranked again, instead of
        rebuilding the node from all its pods (which grows with the pods a shared node
        holds). A node whose cards are stale, or a pod on MIG, is rebuilt on next use."""
        if node.dirty or not placement.shift(node.cards, entry.bookings, sign):
            self._touch(node)
            return
        used = node.used + entry.requests if sign > 0 else node.used - entry.requests
        score, summary = policies.node_score(node.cards), placement.Summary.of(node.cards)
        change_node(node, used=used, score=score, summary=summary)
        self._dirty.add(node.name)
        self._changes.bump(node.name)

    def _observe_gpu_count(self, node: NodeEntry) -> None:
        node_register.observe_gpu_count(node, self._vendors)

    def _register(self, node: NodeEntry) -> None:
        """Work out which cards a node offers, from its inventory or its annotations."""
        devices, scores, error = node_register.offered(
            node, self._vendors.specs(), self._config.node_override(node.name)
        )
        change_node(node, register_error=error)
        if is_dra_node(node):
            # The node's agent offers its cards as DRA devices (a ResourceSlice; it runs no
            # device plugin there): a card is never a device-plugin share at the same time.
            # Its cards are the slice's devices, for claims only (``cycle.claims_plugin``).
            pool = self.claims.pool_of(node.name)
            devices = [] if pool is None else list(pool.cards)
            scores = {} if pool is None else dict(dra_pool.pair_scores(pool, node.inventory_scores))
        change_node(
            node,
            registered=tuple(devices),
            pair_scores=scores,
            layer=node_layer.read(node.facts.annotations, self._vendors.specs()),
        )
        self._read_mig_records(node.name)
        self._touch(node)

    # --- the DRA part's hooks (claim_books.Hooks) ------------------------------------------
    def _cards_changed(self, node: str) -> None:
        entry = self._nodes.get(node)
        if entry is not None:
            self._register(entry)

    def _holds_changed(self, node: str) -> None:
        entry = self._nodes.get(node)
        if entry is not None:
            self._touch(entry)

    def _registered_on(self, node: str) -> Sequence[model.DeviceInfo]:
        entry = self._nodes.get(node)
        return () if entry is None else entry.registered

    def _is_clean(self, name: str | None) -> bool:
        node = self._nodes.get(name or "")
        return node is not None and not node.dirty and node.name not in self._dirty

    def _untouch(self, name: str) -> None:
        """Undo the touches of dropping and re-adding a pod with the same shares on a
        node that was clean before."""
        node = self._nodes.get(name)
        if node is not None:
            change_node(node, dirty=False)
            self._dirty.discard(name)

    def _touch(self, node: NodeEntry) -> None:
        change_node(node, dirty=True)
        self._dirty.add(node.name)
        self._changes.bump(node.name)

    def _unrank(self, name: str) -> None:
        self._rank.remove(name)
        self._dirty.discard(name)

    def refresh(self, node: NodeEntry) -> None:
        """Rebuild a node's card usage from its registered cards and its pods (§4.3)."""
        if not node.dirty:
            return
        node_cards.refresh(node, self.fresh_cards(node, frozenset()), self._pods)

    def rerank(self) -> None:
        for name in list(self._dirty):
            node = self._nodes.get(name)
            self._unrank(name)
            if node is None:
                continue
            self.refresh(node)
            if not node.summary.has_room():
                # Full: no pod that wants a device fits, so no search walks past it
                # (``Cycle.find`` sends pods that want none to the reference path).
                continue
            self._rank.add(name, node.order, node.score, self.layered_preference(node))
        self._dirty.clear()

    def layered_preference(self, node: NodeEntry) -> float:
        policy = node.layer.node_policy or self._config.scheduler.node_scheduler_policy
        return policies.node_preference(node.score, policy)
