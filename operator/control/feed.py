"""Feeding the engine: cluster objects in, queue updates and wake-ups out.

``StateFeed`` is the one place that turns watch events and full listings of Pods, Nodes,
DeviceInventories, node Leases, ResourceQuotas, PodDisruptionBudgets and the device-config
ConfigMap into calls on the engine (``ClusterState``), and decides which pods wait in the
scheduling queue and which cluster events wake unschedulable pods (the queueing hints,
``docs/queueing.md``): each event is weighed against each distinct hint the waiting pods
hold, and wakes a pod only where the engine says the event lets it fit. It is
synchronous and does no I/O: the watch loops (``kube/watch_loop.py``, one per kind, run by
``watching``) hand it each listing and event, and it can be tested without them.

Two rules keep the books right while a Binding is being written:
- an older, unbound copy of a pod being bound (or just bound) never reaches the engine,
  so it cannot undo the reservation or the booking;
- stale news never overwrites fresh (``versions.VersionLedger``).
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar, cast

import structlog

from vgpu_operator import config as device_config
from vgpu_operator import names, node_leases, resources
from vgpu_operator.control import pod_facts, queue, unbound, versions
from vgpu_operator.devices import model
from vgpu_operator.errors import CodecError, ConfigError
from vgpu_operator.scheduling.books.changes import Freed
from vgpu_operator.scheduling.cycle import cluster
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.wire import (
    ConfigMap,
    DeviceInventory,
    KubeObject,
    Lease,
    Node,
    Pod,
    name_of,
    namespaced_name_of,
)

log = structlog.get_logger("vgpu_operator.feed")

DEFAULT_CONFIG_KEY = "device-config.yaml"


class EngineInputs(Protocol):
    """The part of ``scheduling.cycle.cluster.ClusterState`` that the feed calls."""

    def set_config(self, config: device_config.DeviceConfig) -> None: ...
    def set_node(self, node: Mapping[str, Any]) -> None: ...
    def node_warnings(self, name: str) -> tuple[str, ...]: ...
    def remove_node(self, name: str) -> None: ...
    def set_inventory(
        self,
        node_name: str,
        devices: Sequence[model.DeviceInfo],
        pair_scores: model.PairScores,
        heartbeat: float | None,
        cordoned: Sequence[str] = (),
    ) -> None: ...
    def set_heartbeat(self, node_name: str, heartbeat: float | None) -> None: ...
    def remove_inventory(self, node_name: str) -> None: ...
    def set_pod(self, pod: Pod) -> None: ...
    def allocation_error(self, key: PodKey) -> str | None: ...
    def allocation_warning(self, key: PodKey) -> str | None: ...
    def expired_gates(self, now: float) -> list[tuple[str, PodKey]]: ...
    def remove_pod(self, key: PodKey) -> None: ...
    def set_quota(self, quota: Mapping[str, Any]) -> None: ...
    def remove_quota(self, namespace: str, name: str) -> None: ...
    def set_budget(self, pdb: Mapping[str, Any]) -> None: ...
    def remove_budget(self, namespace: str, name: str) -> None: ...
    # The queueing hints (a verdict is the engine's, opaque here).
    def take_freed(self) -> list[Freed]: ...
    def fits_now(self, verdict: Any, node: str, now: float) -> bool: ...
    def quota_may_help(self, verdict: Any, namespace: str) -> bool: ...


class ConfigOutcome(enum.Enum):
    APPLIED = "applied"
    UNCHANGED = "unchanged"
    REJECTED = "rejected"
    KEPT = "kept"  # the ConfigMap was deleted: the last good config stays


@dataclass(frozen=True, slots=True)
class ObjectWarning:
    """Something wrong with an object the operator reads, for a Warning Event on it: a
    Node annotation it ignores, a DeviceInventory it refuses."""

    obj: KubeObject
    kind: str
    reason: str
    message: str


#: Event reasons of the warnings.
NODE_ANNOTATION_IGNORED: Final = "NodeAnnotationIgnored"
INVENTORY_REFUSED: Final = "InventoryRefused"


@dataclass(frozen=True, slots=True)
class ConfigResult:
    outcome: ConfigOutcome
    error: ConfigError | None = None


def parse_config_map(
    config_map: ConfigMap, key: str = DEFAULT_CONFIG_KEY
) -> device_config.DeviceConfig:
    """The DeviceConfig in a ConfigMap's ``data[key]``; raises ``ConfigError``."""
    data = config_map.get("data")
    if not isinstance(data, Mapping) or key not in data:
        raise ConfigError(f"data.{key}", "the ConfigMap has no such key")
    text = data[key]
    if not isinstance(text, str):
        raise ConfigError(f"data.{key}", "must be a string")
    return device_config.load_config_yaml(text)


#: How a kind's objects are keyed: ``namespace/name`` (a ``PodKey`` for pods) or a name.
_K = TypeVar("_K", bound=str)
#: The kind's shape (``wire``).
_S = TypeVar("_S", bound=KubeObject)


@dataclass(frozen=True, slots=True)
class _Kind(Generic[_K, _S]):
    """One watched kind, as the feed handles it: how its objects are keyed, the ledger
    that drops stale events, and what applying or forgetting one does."""

    name: str
    key: Callable[[_S], _K]
    ledger: versions.VersionLedger
    apply: Callable[[_K, _S], None]
    forget: Callable[[_K], None]
    #: Logged when a relist no longer shows an object (it went while we were not watching).
    vanished: str | None = None


class StateFeed:
    """See the module docstring. ``wall_clock`` gives epoch seconds (heartbeats)."""

    def __init__(
        self,
        engine: EngineInputs,
        pods_queue: queue.SchedulingQueue,
        *,
        config: device_config.DeviceConfig | None = None,
        config_key: str = DEFAULT_CONFIG_KEY,
        inventory_timeout_s: float | None = None,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        self._engine = engine
        self._queue = pods_queue
        self._config = config or device_config.DeviceConfig()
        self._config_key = config_key
        self._inventory_timeout_s = inventory_timeout_s
        self._wall_clock = wall_clock or time.time
        self._pods = versions.VersionLedger()
        self._nodes = versions.VersionLedger()
        self._inventories = versions.VersionLedger()
        self._leases = versions.VersionLedger()
        self._quotas = versions.VersionLedger()
        self._budgets = versions.VersionLedger()
        self._config_version: int | None = None
        self._config_text_digest: str | None = None
        #: Unbound live pods (any scheduler), with their fingerprint, indexed by group.
        self._unbound = unbound.UnboundPods()
        #: Bound live members of each PodGroup (they count toward its minCount).
        self._bound_members = unbound.BoundMembers()
        #: The priority a pod is queued with (a gang member's may be lowered by its
        #: PodGroup: ``gang_runtime.PodGroupStore.queue_priority``).
        self.queue_priority: Callable[[Pod], int] = pod_facts.priority_of
        #: Bound pods whose device plugin has not answered, and their nodes: the
        #: answer opens the node's allocation gate.
        self._allocating: dict[PodKey, str] = {}
        #: Called with a node whose allocation gate opened (the worker's Bindings wait).
        self.on_settled: Callable[[str], None] = lambda node: None
        #: Called with a node that appeared or changed, before its waiting pods are woken
        #: (the autoscaler holds the shares of the pods it planned there first).
        self.on_node_changed: Callable[[str], None] = lambda node: None
        #: Pods with a Binding in flight or just written: key -> uid.
        self._binding: dict[PodKey, str] = {}
        #: Unbound pods of other schedulers that use ResourceClaims, and when one was last
        #: seen waiting: another allocator is at work on the slices (``claim_binding``).
        self._other_claim_pods: set[PodKey] = set()
        self._other_claim_pods_seen: float | None = None
        #: Bound pods of the default scheduler that ask for a domain-qualified resource,
        #: not yet handed to the not-routed reporter (``take_bound_by_default``), and the
        #: uid of each live pod handed already: each is looked at once.
        self._bound_by_default: dict[PodKey, Pod] = {}
        self._bound_by_default_taken: dict[PodKey, str] = {}
        #: Per pod, what the books could not believe of its allocation, as last logged.
        self._allocation_problems: dict[PodKey, tuple[str | None, str | None]] = {}
        self._node_fingerprints: dict[str, str] = {}
        #: Per node, the unreadable node-layer annotations last reported, so a Node's
        #: routine updates do not repeat its Event; and the reports not yet written.
        self._node_warnings: dict[str, tuple[str, ...]] = {}
        self._unreported: list[ObjectWarning] = []
        #: Per DeviceInventory, why it is refused (reported once per change of reason).
        self._inventory_problems: dict[str, str] = {}
        self._quota_fingerprints: dict[str, str] = {}
        self._inventory_fingerprints: dict[str, str] = {}
        self._inventory_nodes: dict[str, str] = {}  # inventory name -> node name
        #: Per node with an accepted inventory, the inventory's own heartbeat; a node's
        #: heartbeat is the later of it and its Lease's renewal (``_heartbeat``).
        self._inventory_beats: dict[str, float | None] = {}
        #: Per node Lease that reads as a heartbeat, its renewTime (any node: the Lease
        #: may arrive before the inventory).
        self._lease_beats: dict[str, float] = {}
        #: Per node Lease that does not, why (logged once per change of reason).
        self._lease_problems: dict[str, str] = {}
        self._stale_nodes: set[str] = set()
        # The six watched kinds differ only in these rows; events and relists of every
        # kind go through ``_event`` and ``_listed``.
        self._pod_kind: _Kind[PodKey, Pod] = _Kind(
            "pod",
            cluster.pod_key,
            self._pods,
            lambda key, pod: self._apply_pod(key, pod_facts.slim(pod)),
            self._forget_pod,
            vanished="pod_vanished",
        )
        self._node_kind: _Kind[str, Node] = _Kind(
            "node",
            name_of,
            self._nodes,
            lambda key, node: self._apply_node(key, pod_facts.slim(node)),
            self._forget_node,
        )
        self._inventory_kind: _Kind[str, DeviceInventory] = _Kind(
            "inventory", name_of, self._inventories, self._apply_inventory, self._forget_inventory
        )
        self._lease_kind: _Kind[str, Lease] = _Kind(
            "lease", name_of, self._leases, self._apply_lease, self._forget_lease
        )
        self._quota_kind: _Kind[str, KubeObject] = _Kind(
            "quota",
            namespaced_name_of,
            self._quotas,
            lambda key, quota: self._apply_quota(key, pod_facts.slim(quota)),
            self._forget_quota,
        )
        self._budget_kind: _Kind[str, KubeObject] = _Kind(
            "budget",
            namespaced_name_of,
            self._budgets,
            lambda _key, pdb: self._engine.set_budget(pod_facts.slim(pdb)),
            self._forget_budget,
        )

    # --- every kind -----------------------------------------------------------------------
    def _event(self, kind: _Kind[_K, _S], event_type: str | None, obj: _S) -> None:
        """A watch event (ADDED, MODIFIED, DELETED; ``None``: the object applied as it is,
        as a caller that has no event type gives it), applied unless the ledger has seen
        a newer version of the object."""
        key = kind.key(obj)
        version = versions.version_of(obj)
        if event_type == "DELETED":
            if kind.ledger.accept_delete(key, version):
                kind.forget(key)
                self.settle_releases()
            return
        if kind.ledger.accept_update(key, version):
            kind.apply(key, obj)
            self.settle_releases()

    def _listed(self, kind: _Kind[_K, _S], items: Iterable[_S], list_version: str | None) -> None:
        """A full listing: apply what is newer, forget what is gone."""
        by_key = {kind.key(item): item for item in items}
        result = kind.ledger.reconcile(
            {k: versions.version_of(v) for k, v in by_key.items()},
            versions.parse_version(list_version),
        )
        # The ledger hands back the keys it was given (typed as plain strings there).
        for key in cast(Iterable[_K], result.apply):
            kind.apply(key, by_key[key])
        for key in cast(Iterable[_K], result.remove):
            if kind.vanished is not None:
                log.info(kind.vanished, **{kind.name: key})
            kind.forget(key)
        self.settle_releases()

    # --- views ------------------------------------------------------------------------
    @property
    def config(self) -> device_config.DeviceConfig:
        return self._config

    @property
    def scheduler_name(self) -> str:
        return self._config.scheduler.scheduler_name

    def waiting_for(self, scheduler_name: str) -> list[Pod]:
        """Unbound live pods that name ``scheduler_name`` (another scheduler's, too)."""
        return [
            pod
            for pod, _ in self._unbound.values()
            if pod_facts.scheduler_name_of(pod) == scheduler_name
        ]

    def unbound_pods(self) -> list[Pod]:
        """Every unbound live pod, whichever scheduler it names."""
        return [pod for pod, _ in self._unbound.values()]

    def group_members(self, group: str) -> list[Pod]:
        """The unbound live pods that name the PodGroup ``group``, whichever scheduler
        they name: found through the index, not by a walk over every waiting pod."""
        return self._unbound.members(group)

    def bound_members(self, group: str) -> Mapping[PodKey, str]:
        """The members of ``group`` bound (and live) that name this scheduler, and their
        nodes, as the API says (a restarted operator counts them toward minCount)."""
        return self._bound_members.of(group, self.scheduler_name)

    def held_for(self, key: PodKey) -> None:
        """Shares are now held for the waiting pod (a defragmentation plan's hold): it is
        tried again, so that it waits for the moves as a preemptor waits for its victims
        (``queue.WaitsForVictims``) instead of under a verdict that the held room, being
        its own, can never change."""
        self._queue.wake_one(key)

    def pending_pod(self, key: PodKey) -> Pod | None:
        """The latest copy of a pod waiting for this scheduler, or None."""
        entry = self._unbound.get(key)
        if entry is None or pod_facts.scheduler_name_of(entry[0]) != self.scheduler_name:
            return None
        return entry[0]

    @property
    def stale_nodes(self) -> frozenset[str]:
        return frozenset(self._stale_nodes)

    # --- pods ---------------------------------------------------------------------------
    def pod_event(self, event_type: str | None, pod: Pod) -> None:
        self._event(self._pod_kind, event_type, pod)

    def pods_listed(self, items: Iterable[Pod], list_version: str | None) -> None:
        self._listed(self._pod_kind, items, list_version)

    def binding_started(self, key: PodKey, uid: str) -> None:
        self._binding[key] = uid

    def binding_failed(self, key: PodKey) -> None:
        """The Binding was not written: its reservation is rolled back, which frees room."""
        self._binding.pop(key, None)
        self.settle_releases()

    def binding_succeeded(self, key: PodKey) -> None:
        """The Binding is written: the pod is no longer pending (its bound copy follows)."""
        self._unbound.pop(key, None)
        self._queue.remove(key)

    def _apply_pod(self, key: PodKey, pod: Pod) -> None:
        bound = pod_facts.node_name_of(pod) is not None
        uid = pod_facts.uid_of(pod)
        binding_uid = self._binding.get(key)
        if binding_uid is not None:
            if binding_uid == uid and not bound and not pod_facts.is_deleting(pod):
                return  # an older copy than the Binding we are writing or just wrote
            del self._binding[key]
        self._engine.set_pod(pod)  # a pod that ends frees its room (``settle_releases``)
        problems = (self._engine.allocation_error(key), self._engine.allocation_warning(key))
        if problems != self._allocation_problems.get(key, (None, None)):
            # Said once per pod and problem, not at each of its status updates.
            if problems[0] is not None:
                # Its shares are not booked: say so, or the card looks freer than it is.
                log.warning(
                    "pod_allocation_not_booked",
                    pod=key,
                    node=pod_facts.node_name_of(pod),
                    error=problems[0],
                )
            if problems[1] is not None:
                log.warning("pod_allocation_edited", pod=key, problem=problems[1])
            if problems == (None, None):
                self._allocation_problems.pop(key, None)
            else:
                self._allocation_problems[key] = problems
        self._track_allocation(key, pod)
        self._note_other_allocator(key, pod)
        self._bound_members.note(key, pod)
        self._note_bound_by_default(key, uid, pod, bound)
        if pod_facts.is_waiting_for_scheduler(pod):
            fingerprint = pod_facts.pod_fingerprint(pod)
            previous = self._unbound.get(key)
            self._unbound[key] = (pod, fingerprint)
            if pod_facts.awaits_its_claims(pod):
                # Queued once its claims are made (the pod's status names them).
                if not self._queue.is_in_flight(key):
                    self._queue.remove(key)
            elif pod_facts.scheduler_name_of(pod) == self.scheduler_name:
                added = self._queue.add(key, uid, self.queue_priority(pod))
                if not added and previous is not None and previous[1] != fingerprint:
                    if self._queue.is_unschedulable(key):
                        log.debug("pods_woken", cluster_event=queue.ClusterEvent.POD_CHANGED.value)
                    self._queue.wake_one(key)
            else:
                self._queue.remove(key)
        else:
            self._unbound.pop(key, None)
            if not self._queue.is_in_flight(key):
                self._queue.remove(key)

    def _note_other_allocator(self, key: PodKey, pod: Pod) -> None:
        if (
            pod_facts.is_waiting_for_scheduler(pod)
            and (pod.get("spec") or {}).get("resourceClaims")
            and pod_facts.scheduler_name_of(pod) != self.scheduler_name
        ):
            self._other_claim_pods.add(key)
            self._other_claim_pods_seen = time.monotonic()
        elif key in self._other_claim_pods:
            self._other_claim_pods.discard(key)
            self._other_claim_pods_seen = time.monotonic()

    def _note_bound_by_default(self, key: PodKey, uid: str, pod: Pod, bound: bool) -> None:
        if (
            bound
            and pod_facts.scheduler_name_of(pod) == names.DEFAULT_SCHEDULER
            and not pod_facts.is_terminal(pod)
            and not pod_facts.is_deleting(pod)
            and self._bound_by_default_taken.get(key) != uid
            and pod_facts.extended_resources_of(pod)
        ):
            self._bound_by_default[key] = pod
        else:
            self._bound_by_default.pop(key, None)

    def take_bound_by_default(self) -> list[Pod]:
        """Pods bound by the default scheduler (or by their creator) that ask for a
        domain-qualified resource, each handed out once while it lives: GPU pods among
        them missed the webhook and fail at Allocate (the not-routed reporter says so)."""
        taken = list(self._bound_by_default.values())
        for key, pod in self._bound_by_default.items():
            self._bound_by_default_taken[key] = pod_facts.uid_of(pod)
        self._bound_by_default.clear()
        return taken

    def other_allocator_seen(self) -> float | None:
        """When a pod of another scheduler with claims was last waiting (now, while one
        is), on the monotonic clock; None if never."""
        if self._other_claim_pods:
            return time.monotonic()
        return self._other_claim_pods_seen

    def _forget_pod(self, key: PodKey) -> None:
        self._other_claim_pods.discard(key)
        self._bound_members.discard(key)
        self._bound_by_default.pop(key, None)
        self._bound_by_default_taken.pop(key, None)
        self._engine.remove_pod(key)
        self._allocation_problems.pop(key, None)
        self._unbound.pop(key, None)
        self._binding.pop(key, None)
        if not self._queue.is_in_flight(key):
            self._queue.remove(key)
        self._settle(key)

    def _settle(self, key: PodKey) -> None:
        node = self._allocating.pop(key, None)
        if node is not None:
            self.on_settled(node)

    def _track_allocation(self, key: PodKey, pod: Pod) -> None:
        node = pod_facts.node_name_of(pod)
        if node is not None and pod_facts.awaits_devices(pod):
            self._allocating[key] = node
        else:
            self._settle(key)

    def check_gates(self) -> list[tuple[str, PodKey]]:
        """Allocation gates that timed out since the last check (node, holder): their
        nodes take GPU pods again, so waiting Bindings go on (for the watchdog)."""
        expired = self._engine.expired_gates(self._wall_clock())
        for node, _holder in expired:
            self.on_settled(node)
        return expired

    # --- nodes --------------------------------------------------------------------------
    def node_event(self, event_type: str | None, node: Node) -> None:
        self._event(self._node_kind, event_type, node)

    def nodes_listed(self, items: Iterable[Node], list_version: str | None) -> None:
        self._listed(self._node_kind, items, list_version)

    def take_warnings(self) -> list[ObjectWarning]:
        """The warnings found since the last call (for Events on their objects)."""
        taken, self._unreported = self._unreported, []
        return taken

    def _apply_node(self, name: str, node: Node) -> None:
        self._engine.set_node(node)
        warnings = self._engine.node_warnings(name)
        if warnings != self._node_warnings.get(name, ()):
            self._node_warnings[name] = warnings
            for message in warnings:
                log.warning("node_annotation_ignored", node=name, problem=message)
                self._unreported.append(
                    ObjectWarning(node, "Node", NODE_ANNOTATION_IGNORED, message)
                )
        fingerprint = pod_facts.node_fingerprint(node)
        if self._node_fingerprints.get(name) != fingerprint:
            self._node_fingerprints[name] = fingerprint
            self._wake_for_node(queue.ClusterEvent.NODE_CHANGED, name)

    def _forget_node(self, name: str) -> None:
        self._engine.remove_node(name)
        self._node_fingerprints.pop(name, None)
        self._node_warnings.pop(name, None)
        log.info("node_removed", node=name)

    # --- device inventories ---------------------------------------------------------------
    def inventory_event(self, event_type: str | None, obj: DeviceInventory) -> None:
        self._event(self._inventory_kind, event_type, obj)

    def inventories_listed(
        self, items: Iterable[DeviceInventory], list_version: str | None
    ) -> None:
        self._listed(self._inventory_kind, items, list_version)

    def _apply_inventory(self, name: str, obj: DeviceInventory) -> None:
        # An inventory describes only the node it is named after: one that claims another
        # node would let whoever may write it redefine that node's GPUs.
        node = name
        status = obj.get("status")
        claimed = status.get("nodeName") if isinstance(status, Mapping) else None
        if claimed is not None and claimed != name:
            self._refuse_inventory(
                name,
                obj,
                f"status.nodeName {claimed!r} differs from the inventory's name {name!r}: an "
                "inventory describes only the node it is named after; its devices are ignored",
            )
            return
        try:
            reading = resources.read_inventory(obj)
        except CodecError as exc:
            # Without a readable report the node's devices are unknown: offer none.
            if exc.field == "status":
                log.info("inventory_not_reported_yet", node=node)
                self._forget_inventory(name)
            else:
                self._refuse_inventory(name, obj, f"unreadable, its devices are ignored: {exc}")
            return
        if self._inventory_problems.pop(name, None) is not None:
            log.info("inventory_accepted_again", node=node)
        devices, pair_scores = reading.devices, reading.pair_scores
        cordoned = sorted(reading.cordoned)
        previous_node = self._inventory_nodes.get(name)
        if previous_node is not None and previous_node != node:
            self._engine.remove_inventory(previous_node)
        self._inventory_nodes[name] = node
        was_stale = self._was_stale(node)
        self._inventory_beats[node] = (
            self._not_after_now(reading.heartbeat.timestamp())
            if reading.heartbeat is not None
            else None
        )
        heartbeat = self._heartbeat(node)
        self._engine.set_inventory(node, devices, pair_scores, heartbeat, cordoned)
        fingerprint = pod_facts.digest([[_device_wire(d) for d in devices], pair_scores, cordoned])
        changed = self._inventory_fingerprints.get(name) != fingerprint
        self._inventory_fingerprints[name] = fingerprint
        revived = was_stale and not self._is_stale(heartbeat)
        if revived:
            self._stale_nodes.discard(node)
            log.info("inventory_fresh_again", node=node)
        if changed or revived:
            self._wake_for_node(queue.ClusterEvent.INVENTORY_CHANGED, node)

    def _refuse_inventory(self, name: str, obj: DeviceInventory, problem: str) -> None:
        """Offer none of the inventory's devices, and say why (log, and an Event once per
        change of reason)."""
        self._forget_inventory(name)
        if self._inventory_problems.get(name) == problem:
            return
        self._inventory_problems[name] = problem
        log.warning("inventory_refused", inventory=name, problem=problem)
        self._unreported.append(ObjectWarning(obj, "DeviceInventory", INVENTORY_REFUSED, problem))

    def _forget_inventory(self, name: str) -> None:
        node = self._inventory_nodes.pop(name, name)
        self._engine.remove_inventory(node)
        self._inventory_fingerprints.pop(name, None)
        self._inventory_beats.pop(node, None)
        self._stale_nodes.discard(node)

    # --- node Leases (the agents' heartbeats) ---------------------------------------------
    def lease_event(self, event_type: str | None, lease: Lease) -> None:
        self._event(self._lease_kind, event_type, lease)

    def leases_listed(self, items: Iterable[Lease], list_version: str | None) -> None:
        self._listed(self._lease_kind, items, list_version)

    def _apply_lease(self, name: str, lease: Lease) -> None:
        # Each Lease is named after its node (the admission policy holds agents to it).
        try:
            renewed: float | None = self._not_after_now(node_leases.read_renewal(lease))
        except CodecError as exc:
            # Not a heartbeat, and the renewal read before it is not one now either: the
            # node is as fresh as its inventory says, no fresher.
            renewed = None
            if self._lease_problems.get(name) != str(exc):
                self._lease_problems[name] = str(exc)
                log.warning("node_lease_unreadable", node=name, problem=str(exc))
        else:
            self._lease_problems.pop(name, None)
        self._move_lease_beat(name, renewed)

    def _forget_lease(self, name: str) -> None:
        self._lease_problems.pop(name, None)
        self._move_lease_beat(name, None)

    def _move_lease_beat(self, node: str, renewed: float | None) -> None:
        """Record the node's Lease renewal; a node with an inventory gets its new
        heartbeat (cheap: nothing of its cards is rebuilt), and wakes pods if it revived."""
        was_stale = self._was_stale(node)
        if renewed is None:
            self._lease_beats.pop(node, None)
        else:
            self._lease_beats[node] = renewed
        if node not in self._inventory_beats:
            return  # no inventory, nothing to keep fresh
        heartbeat = self._heartbeat(node)
        self._engine.set_heartbeat(node, heartbeat)
        if was_stale and not self._is_stale(heartbeat):
            self._stale_nodes.discard(node)
            log.info("inventory_fresh_again", node=node)
            self._wake_for_node(queue.ClusterEvent.INVENTORY_CHANGED, node)

    def _not_after_now(self, beat: float) -> float:
        """A heartbeat stamped in the future (a node's clock ahead, or a careless
        writer) counts as made now, when it is seen: a Lease renewed "in 2099" must not
        keep a node fresh after its agent stops."""
        return min(beat, self._wall_clock())

    def _heartbeat(self, node: str) -> float | None:
        """The later of the node's inventory heartbeat and its Lease renewal."""
        beats = (self._inventory_beats.get(node), self._lease_beats.get(node))
        return max((beat for beat in beats if beat is not None), default=None)

    def _was_stale(self, node: str) -> bool:
        """Stale as the books have it now (whether or not the watchdog noticed it yet)."""
        return node in self._stale_nodes or (
            node in self._inventory_beats and self._is_stale(self._heartbeat(node))
        )

    def _is_stale(self, heartbeat: float | None) -> bool:
        if self._inventory_timeout_s is None or heartbeat is None:
            return False
        return self._wall_clock() - heartbeat > self._inventory_timeout_s

    def check_heartbeats(self) -> list[str]:
        """Nodes whose heartbeat (inventory and Lease) has just gone stale (for the
        periodic watchdog's log).

        The engine applies the timeout itself at each decision; this only notices it.
        """
        newly_stale = [
            node
            for node in self._inventory_beats
            if node not in self._stale_nodes and self._is_stale(self._heartbeat(node))
        ]
        self._stale_nodes.update(newly_stale)
        return newly_stale

    # --- quotas -------------------------------------------------------------------------
    def quota_event(self, event_type: str | None, quota: KubeObject) -> None:
        self._event(self._quota_kind, event_type, quota)

    def quotas_listed(self, items: Iterable[KubeObject], list_version: str | None) -> None:
        self._listed(self._quota_kind, items, list_version)

    def _apply_quota(self, key: str, quota: KubeObject) -> None:
        # Only the limits (spec) reach the engine: the quota controller rewrites status
        # with every pod of the namespace, and each new limit starts its verdicts over.
        fingerprint = pod_facts.quota_fingerprint(quota)
        if self._quota_fingerprints.get(key) != fingerprint:
            self._engine.set_quota(quota)
            self._quota_fingerprints[key] = fingerprint
            self._wake_for_quota(key.partition("/")[0])

    def _forget_quota(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        self._engine.remove_quota(namespace, name)
        self._quota_fingerprints.pop(key, None)
        self._wake_for_quota(namespace)

    # --- pod disruption budgets (read by preemption only: no pod is woken) ----------------
    def budget_event(self, event_type: str | None, pdb: KubeObject) -> None:
        self._event(self._budget_kind, event_type, pdb)

    def budgets_listed(self, items: Iterable[KubeObject], list_version: str | None) -> None:
        self._listed(self._budget_kind, items, list_version)

    def _forget_budget(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        self._engine.remove_budget(namespace, name)

    # --- device config ------------------------------------------------------------------
    def config_event(self, event_type: str | None, config_map: ConfigMap) -> ConfigResult:
        """A change of the device-config ConfigMap. An invalid one changes nothing."""
        if event_type == "DELETED":
            self._config_version = None
            self._config_text_digest = None
            return ConfigResult(ConfigOutcome.KEPT)
        data = config_map.get("data")
        digest = pod_facts.digest(data.get(self._config_key) if isinstance(data, Mapping) else None)
        if digest == self._config_text_digest:
            return ConfigResult(ConfigOutcome.UNCHANGED)
        try:
            parsed = parse_config_map(config_map, self._config_key)
        except ConfigError as exc:
            self._config_text_digest = digest  # report each bad text once, not per event
            return ConfigResult(ConfigOutcome.REJECTED, exc)
        self._config_text_digest = digest
        self.set_config(parsed)
        return ConfigResult(ConfigOutcome.APPLIED)

    def set_config(self, config: device_config.DeviceConfig) -> None:
        """Put a (valid) config in force and re-sort the pending pods by scheduler name."""
        old_name = self.scheduler_name
        self._config = config
        self._engine.set_config(config)
        if self.scheduler_name != old_name:
            for key, (pod, _) in list(self._unbound.items()):
                if pod_facts.scheduler_name_of(pod) == self.scheduler_name:
                    self._queue.add(key, pod_facts.uid_of(pod), self.queue_priority(pod))
                elif not self._queue.is_in_flight(key):
                    self._queue.remove(key)
        woken = self._queue.wake_all()
        if woken:
            log.debug(
                "pods_woken", cluster_event=queue.ClusterEvent.CONFIG_CHANGED.value, woken=woken
            )

    # --- the queueing hints -----------------------------------------------------------
    def settle_releases(self) -> None:
        """Wake the pods that the room freed since the last call lets fit: pods ended or
        deleted, reservations rolled back, preemptors' holds given up, init containers'
        shares released (the engine keeps the list, ``take_freed``). Called after every
        event applied, and by the worker after its own releases."""
        for freed in self._engine.take_freed():
            self._wake(
                queue.ClusterEvent.ROOM_FREED,
                functools.partial(self._freed_helps, freed),
                node=freed.node,
                namespace=freed.namespace,
            )

    def _freed_helps(self, freed: Freed, hint: Hashable | None) -> bool:
        if hint is None:
            return True
        if hint is queue.OWN_CHANGE_ONLY or isinstance(hint, queue.Refused):
            return False
        if isinstance(hint, queue.WaitsForVictims):
            return hint.node == freed.node
        if self._engine.quota_may_help(hint, freed.namespace):
            return True  # its namespace's quota usage fell: any node may do now
        return self._engine.fits_now(hint, freed.node, self._wall_clock())

    def _wake_for_node(self, event: queue.ClusterEvent, node: str) -> None:
        """A node appeared, changed what a decision reads of it, or its inventory did:
        only pods that now fit it can be helped (every other node is as it was)."""

        def helps(hint: Hashable | None) -> bool:
            if hint is None:
                return True
            if hint is queue.OWN_CHANGE_ONLY or isinstance(hint, queue.Refused):
                return False
            if isinstance(hint, queue.WaitsForVictims):
                return hint.node == node
            return self._engine.fits_now(hint, node, self._wall_clock())

        self.on_node_changed(node)
        self._wake(event, helps, node=node)

    def _wake_for_quota(self, namespace: str) -> None:
        """A quota's limits changed: pods of its namespace that it refused or that a
        quota ruled out."""

        def helps(hint: Hashable | None) -> bool:
            if hint is None:
                return True
            if isinstance(hint, queue.Refused):
                return hint.namespace == namespace
            if hint is queue.OWN_CHANGE_ONLY or isinstance(hint, queue.WaitsForVictims):
                return False
            return self._engine.quota_may_help(hint, namespace)

        self._wake(queue.ClusterEvent.QUOTA_CHANGED, helps, namespace=namespace)

    def _wake(
        self,
        event: queue.ClusterEvent,
        helps: Callable[[Hashable | None], bool],
        **context: str,
    ) -> None:
        woken = self._queue.wake(helps)
        if woken:
            log.debug("pods_woken", cluster_event=event.value, woken=woken, **context)


def _device_wire(device: model.DeviceInfo) -> list[Any]:
    return [
        device.id,
        device.index,
        device.count,
        device.memory_mib,
        device.cores,
        device.type,
        device.numa,
        device.health,
        device.mode,
        device.vendor,
    ]
