"""Feeding the engine: cluster objects in, queue updates and wake-ups out.

``StateFeed`` is the one place that turns watch events and full listings of Pods, Nodes,
DeviceInventories, node Leases, ResourceQuotas, PodDisruptionBudgets and the device-config
ConfigMap into calls on the engine (``ClusterState``), and decides which pods wait in the
scheduling queue and which cluster events wake unschedulable pods (the queueing hints,
``docs/queueing.md``): each event is weighed against each distinct hint the waiting pods
hold, and wakes a pod only where the engine says the event lets it fit. It is
synchronous and does no I/O: the watch loops (``kube/watch_loop.py``, one per kind, run by
``watching``) hand it each listing and event, and it can be tested without them. Its parts:
``node_feed`` (Nodes, DeviceInventories, Leases and heartbeats), ``wakeups`` (which pods an
event wakes), ``foreign_pods`` (the pods of other schedulers it watches for).

Two rules keep the books right while a Binding is being written:
- an older, unbound copy of a pod being bound (or just bound) never reaches the engine,
  so it cannot undo the reservation or the booking;
- stale news never overwrites fresh (``versions.VersionLedger``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast

import structlog

from vgpu_operator import config as device_config
from vgpu_operator.control import pod_facts, queue, unbound, versions
from vgpu_operator.control.foreign_pods import ForeignPods
from vgpu_operator.control.node_feed import NodeFeed, NodeInputs, ObjectWarning
from vgpu_operator.control.wakeups import HintJudge, Wakeups
from vgpu_operator.devices import catalog
from vgpu_operator.errors import ConfigError
from vgpu_operator.scheduling.cycle import cluster
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.wire import (
    ConfigMap,
    DeviceInventory,
    KubeObject,
    Lease,
    Node,
    Pod,
    PodDisruptionBudget,
    ResourceQuota,
    name_of,
    namespaced_name_of,
)

log = structlog.get_logger("vgpu_operator.feed")

DEFAULT_CONFIG_KEY = "device-config.yaml"


class EngineInputs(NodeInputs, HintJudge, Protocol):
    """The part of ``scheduling.cycle.cluster.ClusterState`` that the feed calls (its
    nodes' part in ``node_feed``, the queueing hints' in ``wakeups``)."""

    def set_config(self, config: device_config.DeviceConfig) -> None: ...
    def set_pod(self, pod: Pod) -> None: ...
    def allocation_error(self, key: PodKey) -> str | None: ...
    def allocation_warning(self, key: PodKey) -> str | None: ...
    def expired_gates(self, now: float) -> list[tuple[str, PodKey]]: ...
    def remove_pod(self, key: PodKey) -> None: ...
    def set_quota(self, quota: ResourceQuota) -> None: ...
    def remove_quota(self, namespace: str, name: str) -> None: ...
    def set_budget(self, pdb: PodDisruptionBudget) -> None: ...
    def remove_budget(self, namespace: str, name: str) -> None: ...


class ConfigOutcome(enum.Enum):
    APPLIED = "applied"
    UNCHANGED = "unchanged"
    REJECTED = "rejected"
    KEPT = "kept"  # the ConfigMap was deleted: the last good config stays


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
    return catalog.load_config_yaml(text)


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
        self._wall_clock = wall_clock or time.time
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
        #: Pods of other schedulers: another allocator at work, pods that missed the webhook.
        self._foreign = ForeignPods()
        #: Per pod, what the books could not believe of its allocation, as last logged.
        self._allocation_problems: dict[PodKey, tuple[str | None, str | None]] = {}
        self._wakeups = Wakeups(engine, pods_queue, self._wall_clock)
        self._nodes_feed = NodeFeed(
            engine,
            self._node_changed,
            inventory_timeout_s=inventory_timeout_s,
            wall_clock=self._wall_clock,
        )
        self._quota_fingerprints: dict[str, str] = {}
        self._add_watched_kinds()

    # --- every kind -----------------------------------------------------------------------
    def _add_watched_kinds(self) -> None:
        """The six watched kinds differ only in these rows; events and relists of every
        kind go through ``_event`` and ``_listed``, each kind with a ledger of its own."""
        self._pod_kind: _Kind[PodKey, Pod] = _Kind(
            "pod",
            cluster.pod_key,
            versions.VersionLedger(),
            lambda key, pod: self._apply_pod(key, pod_facts.slim(pod)),
            self._forget_pod,
            vanished="pod_vanished",
        )
        self._node_kind: _Kind[str, Node] = _Kind(
            "node",
            name_of,
            versions.VersionLedger(),
            lambda key, node: self._nodes_feed.apply_node(key, pod_facts.slim(node)),
            self._nodes_feed.forget_node,
        )
        self._inventory_kind: _Kind[str, DeviceInventory] = _Kind(
            "inventory",
            name_of,
            versions.VersionLedger(),
            self._nodes_feed.apply_inventory,
            self._nodes_feed.forget_inventory,
        )
        self._lease_kind: _Kind[str, Lease] = _Kind(
            "lease",
            name_of,
            versions.VersionLedger(),
            self._nodes_feed.apply_lease,
            self._nodes_feed.forget_lease,
        )
        self._quota_kind: _Kind[str, KubeObject] = _Kind(
            "quota",
            namespaced_name_of,
            versions.VersionLedger(),
            lambda key, quota: self._apply_quota(key, pod_facts.slim(quota)),
            self._forget_quota,
        )
        self._budget_kind: _Kind[str, KubeObject] = _Kind(
            "budget",
            namespaced_name_of,
            versions.VersionLedger(),
            lambda _key, pdb: self._engine.set_budget(
                cast(PodDisruptionBudget, pod_facts.slim(pdb))
            ),
            self._forget_budget,
        )

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
        result = kind.ledger.reconcile_listing(by_key, list_version)
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
        return self._nodes_feed.stale_nodes

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
        self._foreign.note(key, pod, self.scheduler_name)
        self._bound_members.note(key, pod)
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

    def take_bound_by_default(self) -> list[Pod]:
        """Pods bound by the default scheduler (or by their creator) that ask for a
        domain-qualified resource, each handed out once while it lives (``foreign_pods``)."""
        return self._foreign.take_bound_by_default()

    def other_allocator_seen(self) -> float | None:
        """When a pod of another scheduler with claims was last waiting (now, while one
        is), on the monotonic clock; None if never."""
        return self._foreign.other_allocator_seen()

    def _forget_pod(self, key: PodKey) -> None:
        self._foreign.forget(key)
        self._bound_members.discard(key)
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
        return self._nodes_feed.take_warnings()

    # --- device inventories ---------------------------------------------------------------
    def inventory_event(self, event_type: str | None, obj: DeviceInventory) -> None:
        self._event(self._inventory_kind, event_type, obj)

    def inventories_listed(
        self, items: Iterable[DeviceInventory], list_version: str | None
    ) -> None:
        self._listed(self._inventory_kind, items, list_version)

    # --- node Leases (the agents' heartbeats) ---------------------------------------------
    def lease_event(self, event_type: str | None, lease: Lease) -> None:
        self._event(self._lease_kind, event_type, lease)

    def leases_listed(self, items: Iterable[Lease], list_version: str | None) -> None:
        self._listed(self._lease_kind, items, list_version)

    def check_heartbeats(self) -> list[str]:
        """Nodes whose heartbeat (inventory and Lease) has just gone stale (for the
        periodic watchdog's log); the engine applies the timeout itself at each decision."""
        return self._nodes_feed.check_heartbeats()

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
            self._engine.set_quota(cast(ResourceQuota, quota))  # a ResourceQuota's watch
            self._quota_fingerprints[key] = fingerprint
            self._wakeups.for_quota(key.partition("/")[0])

    def _forget_quota(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        self._engine.remove_quota(namespace, name)
        self._quota_fingerprints.pop(key, None)
        self._wakeups.for_quota(namespace)

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
    def _node_changed(self, event: queue.ClusterEvent, node: str) -> None:
        """A node appeared or changed what a decision reads of it: the autoscaler is told
        first (``on_node_changed``), then the pods it may help are woken."""
        self.on_node_changed(node)
        self._wakeups.for_node(event, node)

    def settle_releases(self) -> None:
        """Wake the pods that the room freed since the last call lets fit (``wakeups``).
        Called after every event applied, and by the worker after its own releases."""
        self._wakeups.settle_releases()
