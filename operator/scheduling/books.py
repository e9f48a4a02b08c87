"""The books: the cluster as the engine knows it.

Nodes and their cards (from DeviceInventories or HAMi's register annotations), the pods
that hold shares on them, namespace quotas and disruption budgets, reservations made by
decisions (reserve, confirm, rollback) and preemptors' holds, and the ranking index that
keeps nodes in policy order with a free-capacity summary each. Handlers feed it plain
dicts (through ``cluster.ClusterState``); the decision cycle (``decision``) reads it
through its public members (the read view, ``view.BooksView``) and writes reservations
and holds through ``add_pod``/``drop_pod`` and the nomination methods, like
kube-scheduler's cache beside its scheduling cycle. The DRA inputs are a part of their
own (``claim_books.ClaimBooks``, ``claims``). Pure and synchronous: no I/O, no clock
reads.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vgpu_operator import names
from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import codec, model, plausibility
from vgpu_operator.devices.catalog import VENDOR_TABLE
from vgpu_operator.devices.quantity import as_int
from vgpu_operator.devices.vendor import VendorSpec
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling import (
    allocation_gate,
    allocation_trust,
    changes,
    claim_books,
    claim_cel,
    disruption,
    dra_pool,
    init_release,
    mig,
    mig_records,
    node_annotations,
    node_basics,
    node_layer,
    placement,
    policies,
    preemption,
    stranded,
)
from vgpu_operator.scheduling import claims as claims_module
from vgpu_operator.scheduling.entries import (
    DeviceUsageRow,
    NodeEntry,
    Nomination,
    PodEntry,
    is_dra_node,
)
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.scheduling.quota import QuotaLedger
from vgpu_operator.scheduling.vendors import Vendors
from vgpu_operator.timestamps import unix_time

#: How long a preemptor's hold on the shares its victims free lasts without a bind.
DEFAULT_NOMINATION_TIMEOUT_S = 300.0


def _same_shares(old: PodEntry, new: PodEntry) -> bool:
    """Whether two entries of a pod book the same on the same node (what a node's
    cards, usage, score and summary are built from)."""
    return (
        old.node == new.node
        and old.bookings == new.bookings
        and old.requests == new.requests
        and old.devices.keys() == new.devices.keys()
    )


def _share_source(pod: Mapping[str, Any], node: str | None, deleting: bool) -> tuple[Any, ...]:
    """Every part of a pod its entry is read from but the start time and labels: equal
    sources give equal shares, quota sums, priority and gate."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    return (
        meta.get("uid"),
        node,
        deleting,
        meta.get("annotations"),
        spec.get("priority"),
        [c.get("resources") for c in spec.get("containers") or ()],
        [c.get("resources") for c in spec.get("initContainers") or ()],
        init_release.init_containers_done(pod),
    )


def _check_instance_names(devices: model.PodDevices) -> None:
    """Raise CodecError for a device id with a bracket that is not a MIG suffix
    (``GPU-a[x``): HAMi's decoder lets it through, and no card could be named by it."""
    for single in devices.values():
        for container in single:
            for device in container:
                codec.split_mig_uuid(device.uuid)


def _with_spots(
    bookings: dict[str, list[placement.Booking]],
    spots: Mapping[str, Sequence[mig_records.Spot]],
) -> dict[str, list[placement.Booking]]:
    """A pod's bookings with its spots (MIG instances known by their slices) added to
    the booking of their card, or as a booking of their own (no memory, cores or slot:
    the device entries carry those)."""
    for vendor_word, vendor_spots in spots.items():
        held = bookings.setdefault(vendor_word, [])
        for spot in vendor_spots:
            place = (spot.start, spot.size)
            at = next((i for i, b in enumerate(held) if b.uuid == spot.card), None)
            if at is None:
                held.append(placement.Booking(spot.card, vendor_word, 0, 0, 0, (place,)))
            else:
                booking = held[at]
                held[at] = dataclasses.replace(booking, spots=(*booking.spots, place))
        if not held:
            del bookings[vendor_word]
    return bookings


def _start_time(pod: Mapping[str, Any]) -> float | None:
    return unix_time((pod.get("status") or {}).get("startTime"))


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
        self._quota = self._new_ledger()
        self._quota_objects: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._next_order = 0
        # Nodes in preference order for spread (score ascending) and binpack (descending);
        # equal scores go to the node registered first. Kept current through ``_dirty``.
        self._spread_rank: list[tuple[float, int, str]] = []
        self._binpack_rank: list[tuple[float, int, str]] = []
        # For pods that name no node policy: each node ranked by its own policy (node
        # annotation, else ConfigMap) on one scale, best first (``policies.node_preference``).
        self._layered_rank: list[tuple[float, int, str]] = []
        self._ranked: dict[str, tuple[float, float]] = {}
        self._dirty: set[str] = set()
        self._budgets: dict[tuple[str, str], disruption.Budget] = {}
        #: Preemptors waiting for their victims, with the hold on the freed shares.
        self._nominations: dict[PodKey, Nomination] = {}
        #: Victims of a preemption whose deletion has not been seen yet.
        self._preempted: set[PodKey] = set()
        #: Bound pods whose allocation annotation could not be read or is not believed
        #: (``allocation_trust``), and why: they book nothing.
        self._allocation_errors: dict[PodKey, str] = {}
        #: Bound pods whose allocation annotations were edited after binding (their first
        #: allocation stays booked), and what was ignored.
        self._allocation_warnings: dict[PodKey, str] = {}
        #: Each bound pod's allocation as first seen: later edits change nothing.
        self._first_records = allocation_trust.FirstRecords(self._record_keys())
        #: Bumped when what admission and parsing depend on changes (config, quota limits);
        #: the decision's per-pod parse cache is valid within one epoch.
        self._epoch = 0
        #: The decision's parse of each waiting pod (``decision._Attempt``); kept here so
        #: that the books drop it when the pod is bound or gone.
        self._attempts: dict[PodKey, object] = {}
        #: At most one GPU pod per node between Binding and the plugin's answer.
        self.gate_mode = allocation_gate.GateMode.OFF
        self.gate_timeout_s = allocation_gate.DEFAULT_TIMEOUT_S
        #: The first answer of each bound pod's device plugin (``success`` or ``failed``):
        #: a pod answered holds no gate again, and a later answer changes nothing.
        self._answers: dict[PodKey, str] = {}
        #: Pods whose hold on the gate timed out (reported once, by ``expired_gates``): a
        #: later ``allocating`` holds nothing.
        self._gate_expired: set[PodKey] = set()
        #: Every change to a node a Fit reads, numbered (verdicts judge again only the
        #: nodes changed since they were made), and the room pods freed (queueing hints).
        self._changes = changes.ChangeLog()
        self._freed = changes.FreedRoom()
        #: The DRA inputs: slices, claims, device classes and the claims' holds.
        self.claims = claim_books.ClaimBooks(
            claim_books.Hooks(
                self._cards_changed, self._holds_changed, self._registered_on, self._ledger
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
        """Every node by name, in the order the books met them (read, never change)."""
        return self._nodes

    @property
    def pods(self) -> Mapping[PodKey, PodEntry]:
        """Every pod that holds shares or a reservation (read, never change)."""
        return self._pods

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

    @property
    def selector_cache(self) -> claim_cel.SelectorCache:
        """The CEL verdicts the DRA dialect reads (filled off the loop by the operator)."""
        return self.claims.selector_cache

    def pool_of(self, node: str) -> dra_pool.Pool | None:
        return self.claims.pool_of(node)

    def claim_objects(self) -> Mapping[str, Mapping[str, Any]]:
        return self.claims.objects

    def device_classes(self) -> Mapping[str, claims_module.DeviceClass]:
        return self.claims.classes

    def budgets(self) -> list[disruption.Budget]:
        return list(self._budgets.values())

    def is_preempted(self, key: PodKey) -> bool:
        """Whether the pod is a victim of a preemption or plan under way."""
        return key in self._preempted

    def ranking(self, pod_node_policy: str | None) -> Sequence[tuple[float, int, str]]:
        """The ranked nodes (those with a free card) a pod with this node policy walks,
        best first: (key, order, name). Call ``rerank`` first."""
        if pod_node_policy is None:
            return self._layered_rank
        if pod_node_policy == policies.SPREAD:
            return self._spread_rank
        return self._binpack_rank

    def rank_entry(self, name: str, pod_node_policy: str | None) -> tuple[float, int, str] | None:
        """The node's entry in ``ranking(pod_node_policy)`` (None: not ranked, it has no
        free card)."""
        ranked = self._ranked.get(name)
        if ranked is None:
            return None
        score, preference = ranked
        order = self._nodes[name].order
        if pod_node_policy is None:
            return (-preference, order, name)
        if pod_node_policy == policies.SPREAD:
            return (score, order, name)
        return (-score, order, name)

    # --- the decision's writes ---------------------------------------------------------
    def pod_read(self, key: PodKey) -> object:
        """The decision's read of a waiting pod (``pod_read``; kept here so that the
        books drop it when the pod is bound or gone)."""
        return self._attempts.get(key)

    def keep_read(self, key: PodKey, read: object) -> None:
        self._attempts[key] = read

    def nomination(self, key: PodKey) -> Nomination | None:
        return self._nominations.get(key)

    def pop_nomination(self, key: PodKey) -> Nomination | None:
        return self._nominations.pop(key, None)

    def nominate(self, key: PodKey, nomination: Nomination) -> None:
        """Hold a preemptor's nomination; its victims may not be chosen again meanwhile."""
        self._nominations[key] = nomination
        self._preempted.update(nomination.victims)

    def release_decided(self, key: PodKey) -> None:
        """A DRA decision given up: the holds it made go (``claim_books``)."""
        self.claims.release_decided(key)

    def hold_decided(
        self, pod: PodKey, node: str, decided: Mapping[str, tuple[str, Sequence[Any]]]
    ) -> None:
        """Hold what a DRA decision allocates until its claims come back (``claim_books``)."""
        self.claims.hold_decided(pod, node, decided)

    def unmark_preempted(self, keys: Iterable[PodKey]) -> None:
        """Let these pods be chosen again (a hold given up)."""
        self._preempted.difference_update(keys)

    def set_config(self, config: DeviceConfig) -> None:
        self._epoch += 1
        self._config = config
        self._vendors = Vendors(config, self._vendor_table)
        self._first_records.set_keys(self._record_keys())
        ledger = self._new_ledger()
        for quota in self._quota_objects.values():
            ledger.set_quota(quota)
        self._quota = ledger
        for entry in self._pods.values():
            self._quota.add_sums(entry.namespace, entry.quota_sums)
        self.claims.requota()
        for node in self._nodes.values():
            self._register(node)
        for pod in self._first_records.reconsider():
            self.set_pod(pod)

    def _record_keys(self) -> list[str]:
        """The annotations a pod's allocation is read from (``FirstRecords``)."""
        return [*self._vendors.allocated_keys().values(), names.MIG_ALLOCATIONS]

    def _new_ledger(self) -> QuotaLedger:
        return QuotaLedger(self._vendors.memory_resources(), self._vendors.core_resources())

    def set_node(self, node: Mapping[str, Any]) -> None:
        facts = node_basics.NodeFacts.from_node(node, self._node_annotation_keys)
        entry = self._node_entry(facts.name)
        entry.facts = facts
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
        entry.heartbeat = heartbeat
        if (
            entry.inventory == inventory
            and entry.inventory_scores == pair_scores
            and entry.inventory_cordoned == banned
        ):
            # A report with the same cards (the agent re-asserting it, an older agent's
            # heartbeat): the node keeps its cards, bookings and rank, not rebuilt.
            return
        entry.inventory = inventory
        entry.inventory_scores = pair_scores
        entry.inventory_cordoned = banned
        self._register(entry)

    def set_heartbeat(self, node_name: str, heartbeat: float | None) -> None:
        """Move only the node's heartbeat (its Lease was renewed): nothing else of the node
        changes, so nothing is rebuilt. A node without an inventory has no heartbeat."""
        entry = self._nodes.get(node_name)
        if entry is not None and entry.inventory is not None:
            entry.heartbeat = heartbeat

    def remove_inventory(self, node_name: str) -> None:
        entry = self._nodes.get(node_name)
        if entry is not None:
            entry.inventory = None
            entry.heartbeat = None
            self._register(entry)

    def set_pod(self, pod: Mapping[str, Any]) -> None:
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
        source = (self._epoch, *_share_source(pod, node, deleting))
        if (
            previous is not None
            and previous.source is not None
            and phase not in names.TERMINAL_PHASES
            and previous.source == source
        ):
            # A status update (kubelet's or KWOK's) or the bound copy read again: nothing
            # the shares, quotas or gate are read from changed, so the node stays as it
            # is; only what preemption reads of the pod itself is taken afresh.
            previous.started = _start_time(pod)
            previous.labels = dict(meta.get("labels") or {})
            return
        clean = previous is not None and self._is_clean(previous.node)
        self.drop_pod(key)
        self._nominations.pop(key, None)
        self._allocation_errors.pop(key, None)
        self._allocation_warnings.pop(key, None)
        if node is not None or phase in names.TERMINAL_PHASES:
            self._attempts.pop(key, None)  # no longer waiting: its parse is done with
        if node is None or phase in names.TERMINAL_PHASES:
            return
        uid = str(meta.get("uid") or "")
        if previous is not None and previous.uid and previous.uid != uid:
            # Another pod of the same name: nothing the old one's plugin said applies.
            self._answers.pop(key, None)
            self._gate_expired.discard(key)
        annotations, edited = self._first_records.view(key, uid, meta.get("annotations") or {})
        if edited:
            self._allocation_warnings[key] = (
                "its allocation annotations were changed after it was bound; the books keep "
                "the allocation it was bound with"
            )
        devices = self._trusted_devices(key, pod, annotations)
        answer = allocation_gate.answer(annotations)
        if answer is not None and any(any(single) for single in devices.values()):
            self._answers.setdefault(key, answer)
        if self._answers.get(key) == codec.BindPhase.FAILED:
            # The device plugin refused it: kubelet will not start it with these devices.
            # (Only its plugin's first answer counts: a pod that got its devices and says
            # failed later is still on them.)
            devices = {}
        holds = any(any(single) for single in devices.values())
        allocating_since = self._gate_since(key, uid, previous, annotations, holds, deleting)
        init_count = len((pod.get("spec") or {}).get("initContainers") or [])
        init_done = init_release.init_containers_done(pod)
        records = mig_records.read(annotations) if holds else ()
        # Instances on MIG cards are read against the cards' tables (records and suffixes
        # to the engine's names and spots, ``_read_mig_records``), also when the pod has
        # no record, for a card that publishes profiles needs one for each instance.
        on_mig = bool(records) or self._on_mig_cards(node, devices)
        entry = PodEntry(
            key=key,
            namespace=key.split("/", 1)[0],
            node=node,
            requests=node_basics.pod_requests(pod),
            devices=devices,
            bookings=placement.collapse(devices, init_count, init_done),
            priority=preemption.priority_of(pod),
            started=_start_time(pod),
            labels=dict(meta.get("labels") or {}),
            deleting=deleting,
            uid=uid,
            mig_records=records,
            decoded=devices,
            init_count=init_count,
            init_done=init_done,
            allocating_since=allocating_since,
            source=source,
        )
        self.add_pod(entry)
        if on_mig:
            self._read_mig_records(node)
        elif clean and previous is not None and _same_shares(previous, entry):
            # The bound copy of a reservation, or a status update: the node's cards,
            # score and summary stand, so it need not be rebuilt and ranked again.
            self._untouch(node)

    def _trusted_devices(
        self, key: PodKey, pod: Mapping[str, Any], annotations: Mapping[str, str]
    ) -> dict[str, model.PodSingleDevice]:
        """The pod's allocation, if the books believe it (``allocation_trust``); else
        nothing, and the reason is kept for the runtime's log (``allocation_error``)."""
        try:
            devices = codec.decode_pod_devices(annotations, self._vendors.allocated_keys())
            _check_instance_names(devices)
        except CodecError as exc:
            self._allocation_errors[key] = str(exc)
            return {}
        judged, refused = self._first_records.judged(key)
        if not judged:
            trusted = self._config.scheduler.trusted_names()
            refused = allocation_trust.refusal(pod, devices, self._vendors, trusted)
            self._first_records.judge(key, refused, pod)
        if refused is not None:
            self._allocation_errors[key] = refused
            return {}
        return devices

    def _gate_since(
        self,
        key: PodKey,
        uid: str,
        previous: PodEntry | None,
        annotations: Mapping[str, str],
        holds: bool,
        deleting: bool,
    ) -> float | None:
        """Since when (the operator's clock) the pod holds its node's allocation gate, or
        None. The time is never read from the pod: it is carried over from the pod's
        earlier entry (its own Binding's, ``confirm``), or starts at the gate's next look
        (``allocation_gate.UNTIMED``)."""
        if deleting or key in self._answers or key in self._gate_expired:
            return None
        if not allocation_gate.claims_gate(annotations, holds):
            return None
        if (
            previous is not None
            and previous.allocating_since is not None
            and previous.uid in ("", uid)
        ):
            return previous.allocating_since
        return allocation_gate.UNTIMED

    def _on_mig_cards(self, node_name: str | None, devices: model.PodDevices) -> bool:
        """Whether an allocation names a MIG card of the node (or a MIG instance)."""
        node = self._nodes.get(node_name or "")
        mig_cards = (
            set() if node is None else {d.id for d in node.registered if d.mode == model.MODE_MIG}
        )
        for single in devices.values():
            for container in single:
                for device in container:
                    base, instance = codec.split_mig_uuid(device.uuid)
                    if instance is not None or base in mig_cards:
                        return True
        return False

    def _read_mig_records(self, node_name: str) -> None:
        """Book the MIG instances of the node's pods in the engine's terms: HAMi v2.10's
        JSON entries as instances of the card's table (one geometry per card where they
        fit one, ``mig_records.choose_geometries``) or as spots, and suffixes as the
        card's table reads them (``mig_records.resolve``). Done again whenever the
        node's cards change, since the tables come with them."""
        node = self._nodes.get(node_name)
        if node is None:
            return
        entries = [self._pods[k] for k in sorted(node.pods) if k in self._pods]
        entries = [e for e in entries if e.mig_records or self._on_mig_cards(node_name, e.decoded)]
        if not entries:
            return
        table_of = self.mig_tables_of(node_name)
        prefer = mig_records.choose_geometries(
            (r for e in entries for r in e.mig_records), table_of
        )
        for entry in entries:
            devices = dict(entry.decoded)
            spots: dict[str, list[mig_records.Spot]] = {}
            for vendor_word, single in devices.items():
                if self._vendors.spec(vendor_word).supports_mig:
                    devices[vendor_word], spots[vendor_word] = mig_records.resolve(
                        single, entry.mig_records, table_of, prefer
                    )
            self.drop_pod(entry.key)
            entry.devices = devices
            entry.bookings = _with_spots(
                placement.collapse(devices, entry.init_count, entry.init_done), spots
            )
            self.add_pod(entry)

    def mig_tables_of(self, node_name: str) -> mig_records.TableOf:
        """What names the instances of each MIG card of the node, by card UUID."""
        node = self._nodes.get(node_name)
        cards = {} if node is None else {d.id: d for d in node.registered}

        def table_of(uuid: str) -> mig.MigTable | None:
            card = cards.get(uuid)
            return None if card is None else self._vendors.mig_table(card)

        return table_of

    def remove_pod(self, key: PodKey) -> None:
        self.claims.pod_gone(key)
        self.claims.release_decided(key)
        self._attempts.pop(key, None)
        self.drop_pod(key)
        self._nominations.pop(key, None)
        self._preempted.discard(key)
        self._allocation_errors.pop(key, None)
        self._allocation_warnings.pop(key, None)
        self._first_records.forget(key)
        self._answers.pop(key, None)
        self._gate_expired.discard(key)

    def allocation_error(self, key: PodKey) -> str | None:
        """Why a bound pod's allocation annotation could not be read or is not believed
        (it books nothing)."""
        return self._allocation_errors.get(key)

    def allocation_warning(self, key: PodKey) -> str | None:
        """What the books ignored of a bound pod's annotations (an edit after binding)."""
        return self._allocation_warnings.get(key)

    def set_budget(self, pdb: Mapping[str, Any]) -> None:
        """Record a PodDisruptionBudget (preemption spares the pods it protects if it can)."""
        budget = disruption.Budget.from_object(pdb)
        self._budgets[(budget.namespace, budget.name)] = budget

    def remove_budget(self, namespace: str, name: str) -> None:
        self._budgets.pop((namespace, name), None)

    def set_quota(self, quota: Mapping[str, Any]) -> None:
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
            entry.reserved = False
            if entry.allocating_since is not None and now is not None:
                self._time_gate(entry, now)
        self._nominations.pop(key, None)
        self.claims.settle_decided(key)

    def _time_gate(self, entry: PodEntry, now: float) -> None:
        entry.allocating_since = now
        node = self._nodes.get(entry.node or "")
        if node is not None and entry.key in node.allocating:
            node.allocating[entry.key] = now

    def rollback(self, key: PodKey) -> None:
        entry = self._pods.get(key)
        if entry is not None and entry.reserved and key not in self._nominations:
            self.drop_pod(key)
        self.claims.release_decided(key)

    def cancel_preemption(self, key: PodKey) -> None:
        """Give up a preemptor's hold (an eviction was refused): its victims that are
        still running may be chosen again by a later decision."""
        nomination = self._nominations.pop(key, None)
        if nomination is None:
            return
        entry = self._pods.get(key)
        if entry is not None and entry.reserved:
            self.drop_pod(key)
        for victim in nomination.victims:
            self._preempted.discard(victim)

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
        cards = [model.DeviceUsage.from_info(info) for info in node.registered]
        for card, info in zip(cards, node.registered, strict=True):
            self._vendors.prepare_card(card, info.mig_profiles)
        by_id = {card.id: card for card in cards}
        entries = self._pods if pods is None else pods
        for key in sorted(node.pods - skip):
            entry = entries.get(key)
            if entry is not None:
                placement.book(by_id, entry.bookings)
        for booked in self.claims.bookings_on(node.name, by_id):
            placement.book(by_id, {"claims": booked})
        return cards

    def victims_remain(self, nomination: Nomination) -> bool:
        return any(v in self._pods for v in nomination.victims)

    def expire_nominations(self, now: float) -> None:
        for key, nomination in list(self._nominations.items()):
            if nomination.until < now:
                self.cancel_preemption(key)

    def device_usage(self) -> list[DeviceUsageRow]:
        rows: list[DeviceUsageRow] = []
        for node in sorted(self._nodes.values(), key=lambda n: n.order):
            self.refresh(node)
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

    def stranded_memory_mib(self, pending: Iterable[Mapping[str, Any]]) -> dict[str, int]:
        """Per node, the free card memory no request of the ``pending`` pods could use
        (``stranded``); every node with cards is named, 0 where nothing is stranded.

        A pod whose request cannot be read adds no request: its own Event says why.
        """
        requests: set[stranded.CardRequest] = set()
        for pod in pending:
            spec = pod.get("spec") or {}
            for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
                try:
                    asked = self._vendors.requests(container)
                except (CodecError, ValueError):
                    continue
                requests.update(stranded.CardRequest.of(r) for r in asked.values())
        out: dict[str, int] = {}
        for node in sorted(self._nodes.values(), key=lambda n: n.order):
            self.refresh(node)
            if not node.cards:
                continue
            cards = [c for c in node.cards if stranded.offered(c, node.inventory_cordoned)]
            out[node.name] = stranded.stranded_memory_mib(cards, requests)
        return out

    def quota_usage(self) -> dict[str, dict[str, tuple[int, int]]]:
        return {ns: self._quota.usage(ns) for ns in self._quota.namespaces()}

    def take_freed(self) -> list[changes.Freed]:
        """Room pods freed on nodes since the last call (``changes.FreedRoom``): where a
        waiting pod may fit now."""
        return self._freed.take()

    def holding_pods(self) -> dict[PodKey, str]:
        """Pods that hold devices or reservations, and their nodes."""
        return {k: e.node for k, e in self._pods.items() if e.node is not None}

    def node_names(self) -> list[str]:
        return [n.name for n in sorted(self._nodes.values(), key=lambda n: n.order)]

    def register_errors(self) -> dict[str, str]:
        return {n.name: n.register_error for n in self._nodes.values() if n.register_error}

    def node_warnings(self, name: str) -> tuple[str, ...]:
        """The annotations of one node that could not be read and are ignored: the node
        layer's, and a device registration (its vendor's cards are then not offered)."""
        node = self._nodes.get(name)
        if node is None:
            return ()
        if node.register_error is None:
            return node.layer.problems
        registration = f"{node.register_error}; the node's cards from it are not offered"
        return (*node.layer.problems, registration)

    def node_layer_problems(self) -> dict[str, tuple[str, ...]]:
        """Per node, the node-layer annotations that could not be read (and are ignored)."""
        return {n.name: n.layer.problems for n in self._nodes.values() if n.layer.problems}

    def add_pod(self, entry: PodEntry) -> None:
        self._pods[entry.key] = entry
        self._freed.came(entry.key, entry.node, (entry.bookings, entry.requests))
        self._quota.add_sums(entry.namespace, entry.quota_sums)
        node = self._nodes.get(entry.node or "")
        if node is not None:
            node.pods.add(entry.key)
            if entry.allocating_since is not None:
                node.allocating[entry.key] = entry.allocating_since
            self._shift(node, entry, 1)

    def drop_pod(self, key: PodKey) -> None:
        entry = self._pods.pop(key, None)
        if entry is None:
            return
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
        node.used = node.used + entry.requests if sign > 0 else node.used - entry.requests
        node.score = policies.node_score(node.cards)
        node.summary = placement.Summary.of(node.cards)
        self._dirty.add(node.name)
        self._changes.bump(node.name)

    # --- the allocation gate --------------------------------------------------------------
    def bind_gate_enabled(self) -> bool:
        """Whether a node's GPU pods are bound one at a time (any gate mode but off)."""
        return self.gate_mode is not allocation_gate.GateMode.OFF

    def bind_gate_open(self, node_name: str, key: PodKey, now: float) -> bool:
        """Whether ``key``, decided onto the node, may be bound there now: no other pod
        bound there still waits for its devices (and, with ``hami-lock``, HAMi's node
        lock is not held by another pod). Pods decided but not yet bound do not count:
        they wait for the gate themselves, in decision order."""
        if self.gate_mode is allocation_gate.GateMode.OFF:
            return True
        node = self._nodes.get(node_name)
        if node is None:
            return True
        timeout = self.gate_timeout_s
        for holder, since in list(node.allocating.items()):
            entry = self._pods.get(holder)
            if entry is None or entry.reserved:
                continue  # decided, not bound yet: it holds no gate
            if since == allocation_gate.UNTIMED:
                self._time_gate(entry, now)
                since = now
            if holder != key and now - since <= timeout:
                return False
        if self.gate_mode is allocation_gate.GateMode.HAMI_LOCK:
            owner = allocation_gate.lock_holder(node.facts.annotations, now, timeout)
            # Correctness does not rest on this: taking the lock is a guarded write.
            if owner is not None and owner != key and (not owner or owner in self._pods):
                return False
        return True

    def gate_holders(self) -> dict[str, list[PodKey]]:
        """Per node, the pods holding its gate (for status and tests)."""
        return {n.name: sorted(n.allocating) for n in self._nodes.values() if n.allocating}

    def gate_holder(self, node_name: str, now: float) -> allocation_gate.GateHolder | None:
        """The bound pod that keeps the node's gate shut now (for the waiting pods'
        condition), or None."""
        node = self._nodes.get(node_name)
        if node is None or self.gate_mode is allocation_gate.GateMode.OFF:
            return None
        for holder, since in sorted(node.allocating.items()):
            entry = self._pods.get(holder)
            if entry is None or entry.reserved:
                continue
            if since == allocation_gate.UNTIMED:
                self._time_gate(entry, now)
                since = now
            if now - since <= self.gate_timeout_s:
                held = now - since
                return allocation_gate.GateHolder(holder, held, self.gate_timeout_s - held)
        return None

    def expired_gates(self, now: float) -> list[tuple[str, PodKey]]:
        """Gates that timed out since the last call (node, holder): their nodes are open
        again, so parked pods should be retried, and the holders reported."""
        if self.gate_mode is allocation_gate.GateMode.OFF:
            return []
        expired: list[tuple[str, PodKey]] = []
        for node in self._nodes.values():
            for key, since in list(node.allocating.items()):
                entry = self._pods.get(key)
                if entry is None or entry.reserved:
                    continue  # decided, not bound yet: it holds no gate
                if since == allocation_gate.UNTIMED:
                    self._time_gate(entry, now)
                    continue
                if now - since > self.gate_timeout_s and key not in self._gate_expired:
                    self._gate_expired.add(key)
                    expired.append((node.name, key))
        return sorted(expired)

    def _observe_gpu_count(self, node: NodeEntry) -> None:
        """Seed 000 §9: GPUs that vanish from a node's allocatable make it unhealthy."""
        allocatable = node.facts.allocatable.get(self._config.nvidia.resource_count_name)
        count = 0 if allocatable is None else as_int(allocatable) or 0
        if count == 0:
            node.gpus_lost = node.reported_gpus > 0 or node.gpus_lost
        else:
            node.gpus_lost = False
        node.reported_gpus = count

    def _register(self, node: NodeEntry) -> None:
        """Work out which cards a node offers, from its inventory or its annotations."""
        node.register_error = None
        devices: list[model.DeviceInfo] = []
        scores: dict[str, Mapping[str, int]] = {}
        if node.inventory is not None:
            devices = list(node.inventory)
            scores = dict(node.inventory_scores)
        else:
            for spec in self._vendors.specs():
                raw = node.facts.annotations.get(spec.register_annotation)
                if not raw:
                    continue
                try:
                    registered = codec.decode_node_devices(
                        raw, spec.register_annotation, spec.common_word
                    )
                    problems = plausibility.card_problems(registered)
                    if problems:
                        raise CodecError(spec.register_annotation, "; ".join(problems[:3]))
                    devices.extend(registered)
                    if spec.score_annotation and node.facts.annotations.get(spec.score_annotation):
                        scores.update(
                            codec.decode_pair_scores(
                                node.facts.annotations[spec.score_annotation],
                                spec.score_annotation,
                            )
                        )
                except CodecError as exc:
                    devices = [d for d in devices if d.vendor != spec.common_word]
                    node.register_error = str(exc)
        override = self._config.node_override(node.name)
        if override is not None:
            banned_ids = set(override.filter_devices.uuid)
            banned_idx = set(override.filter_devices.index)
            devices = [d for d in devices if d.id not in banned_ids and d.index not in banned_idx]
        if is_dra_node(node):
            # The node's agent offers its cards as DRA devices (a ResourceSlice; it runs no
            # device plugin there): a card is never a device-plugin share at the same time.
            # Its cards are the slice's devices, for claims only (``claim_decision``).
            pool = self.claims.pool_of(node.name)
            devices = [] if pool is None else list(pool.cards)
            scores = {} if pool is None else dict(dra_pool.pair_scores(pool, node.inventory_scores))
        node.registered = tuple(devices)
        node.pair_scores = scores
        node.layer = node_layer.read(node.facts.annotations, self._vendors.specs())
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

    def _ledger(self) -> QuotaLedger:
        return self._quota

    def _is_clean(self, name: str | None) -> bool:
        node = self._nodes.get(name or "")
        return node is not None and not node.dirty and node.name not in self._dirty

    def _untouch(self, name: str) -> None:
        """Undo the touches of dropping and re-adding a pod with the same shares on a
        node that was clean before."""
        node = self._nodes.get(name)
        if node is not None:
            node.dirty = False
            self._dirty.discard(name)

    def _touch(self, node: NodeEntry) -> None:
        node.dirty = True
        self._dirty.add(node.name)
        self._changes.bump(node.name)

    def _unrank(self, name: str) -> None:
        ranked = self._ranked.pop(name, None)
        node = self._nodes.get(name)
        self._dirty.discard(name)
        if ranked is None:
            return
        if node is None:
            return
        order = node.order
        score, preference = ranked
        for ranking, entry in (
            (self._spread_rank, (score, order, name)),
            (self._binpack_rank, (-score, order, name)),
            (self._layered_rank, (-preference, order, name)),
        ):
            at = bisect.bisect_left(ranking, entry)
            if at < len(ranking) and ranking[at] == entry:
                del ranking[at]

    def refresh(self, node: NodeEntry) -> None:
        """Rebuild a node's card usage from its registered cards and its pods (§4.3)."""
        if not node.dirty:
            return
        cards = self.fresh_cards(node, frozenset())
        used = node_basics.PodResources()
        for key in sorted(node.pods):
            entry = self._pods.get(key)
            if entry is not None:
                used = used + entry.requests
        node.cards = cards
        node.used = used
        node.score = policies.node_score(cards)
        node.summary = placement.Summary.of(cards)
        node.dirty = False

    def rerank(self) -> None:
        for name in list(self._dirty):
            node = self._nodes.get(name)
            self._unrank(name)
            if node is None:
                continue
            self.refresh(node)
            if not node.summary.has_room():
                # Full: no pod that wants a device fits, so no search walks past it
                # (``decision._find`` sends pods that want none to the reference path).
                continue
            preference = self.layered_preference(node)
            bisect.insort(self._spread_rank, (node.score, node.order, name))
            bisect.insort(self._binpack_rank, (-node.score, node.order, name))
            bisect.insort(self._layered_rank, (-preference, node.order, name))
            self._ranked[name] = (node.score, preference)
        self._dirty.clear()

    def drifted_nodes(self) -> list[str]:
        """Nodes whose cards, usage, score or summary, as kept up to date pod by pod
        (``_shift``), differ from a rebuild from their pods: always none unless the
        in-place bookkeeping is wrong (the property tests call it after every step)."""
        drifted = []
        for node in self._nodes.values():
            if node.dirty:
                continue
            cards = self.fresh_cards(node, frozenset())
            used = node_basics.PodResources()
            for key in node.pods:
                entry = self._pods.get(key)
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

    def layered_preference(self, node: NodeEntry) -> float:
        policy = node.layer.node_policy or self._config.scheduler.node_scheduler_policy
        return policies.node_preference(node.score, policy)
