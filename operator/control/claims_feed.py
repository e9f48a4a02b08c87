"""Feeding the engine's DRA path: ResourceSlices, ResourceClaims and DeviceClasses in,
wake-ups out (the DRA counterpart of ``feed.StateFeed``, kept apart so that each stays
small).

Stale news never overwrites fresh (``versions.VersionLedger``, as for every kind). Which
claim changes wake parked pods: a new claim (a pod may be waiting for the claim its
template makes), and a claim whose allocation went or that was deleted (its shares are
free again); an allocation being written frees nothing and wakes nobody. A changed slice
is a node's devices changing.

DeviceTaintRules are folded into the slices they select before the engine sees them
(``scheduling.dialects.claims.taint_rules``): the feed keeps each slice as listed, so that a
rule that comes, changes or goes hands every slice over again with the taints now in force (a
slice whose devices came out differently wakes the DRA path's pods, as any slice change does).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any, Final, Protocol, cast

import structlog

from vgpu_operator import names
from vgpu_operator.control import pod_facts, queue, versions
from vgpu_operator.scheduling.dialects.claims import taint_rules
from vgpu_operator.wire import (
    DeviceClass,
    DeviceTaintRule,
    KubeObject,
    ResourceClaim,
    ResourceSlice,
    name_of,
    namespaced_name_of,
)

log = structlog.get_logger("vgpu_operator.claims_feed")


class ClaimInputs(Protocol):
    """The part of ``scheduling.cycle.cluster.ClusterState`` the DRA feed calls."""

    def set_slice(self, obj: ResourceSlice) -> None: ...
    def remove_slice(self, name: str) -> None: ...
    def set_claim(self, obj: ResourceClaim) -> None: ...
    def remove_claim(self, key: str) -> None: ...
    def set_device_class(self, obj: DeviceClass) -> None: ...
    def remove_device_class(self, name: str) -> None: ...
    def set_admin_namespaces(self, names: frozenset[str]) -> None: ...
    def quota_may_help(self, verdict: Any, namespace: str) -> bool: ...
    def on_claims_path(self, verdict: Any) -> bool: ...


def _allocated(claim: ResourceClaim) -> bool:
    return bool(claim.get("status", {}).get("allocation"))


#: The label upstream requires on a namespace whose claims ask adminAccess.
ADMIN_ACCESS_LABEL: Final = names.ADMIN_ACCESS_LABEL


class ClaimFeed:
    def __init__(self, engine: ClaimInputs, pods_queue: queue.SchedulingQueue) -> None:
        self._engine = engine
        self._queue = pods_queue
        self._slices = versions.VersionLedger()
        self._claims = versions.VersionLedger()
        self._classes = versions.VersionLedger()
        self._allocated: set[str] = set()
        #: Claims seen so far (a claim seen for the first time may be a pod's awaited one).
        self._seen: set[str] = set()
        self._slice_digests: dict[str, str] = {}
        #: Each slice as listed (slim), before the rules' taints.
        self._listed_slices: dict[str, ResourceSlice] = {}
        self._rule_versions = versions.VersionLedger()
        self._rules: dict[str, taint_rules.TaintRule] = {}
        #: Namespaces labelled for adminAccess (the watch selects only those).
        self._admin_namespaces: set[str] = set()
        #: A node's slice changed what the engine reads (the autoscaler holds the pods
        #: planned on a new DRA node once its slice is here: ``Autoscaler.node_changed``).
        self.on_slice_changed: Callable[[str], None] = lambda node: None

    # --- slices ------------------------------------------------------------------------
    def slice_event(self, event_type: str | None, obj: ResourceSlice) -> None:
        name, version = name_of(obj), versions.version_of(obj)
        if event_type == "DELETED":
            if self._slices.accept_delete(name, version):
                self._forget_slice(name)
        elif self._slices.accept_update(name, version):
            self._apply_slice(name, obj)

    def slices_listed(self, items: Iterable[ResourceSlice], version: str | None) -> None:
        by_name = {name_of(i): i for i in items}
        result = self._slices.reconcile_listing(by_name, version)
        for name in result.apply:
            self._apply_slice(name, by_name[name])
        for name in result.remove:
            self._forget_slice(name)

    def _apply_slice(self, name: str, obj: ResourceSlice) -> None:
        slim = pod_facts.slim(obj)
        self._listed_slices[name] = slim
        self._hand_over(name, slim)

    def _hand_over(self, name: str, slim: ResourceSlice) -> None:
        """The slice to the engine with the rules' taints; wakes pods if it changed."""
        tainted = taint_rules.tainted_slice(slim, tuple(self._rules.values()))
        self._engine.set_slice(tainted)
        digest = pod_facts.digest(tainted.get("spec"))
        if self._slice_digests.get(name) != digest:
            self._slice_digests[name] = digest
            node = (tainted.get("spec") or {}).get("nodeName")
            if isinstance(node, str) and node:
                self.on_slice_changed(node)
            self._wake_claim_pods(queue.ClusterEvent.INVENTORY_CHANGED)

    def _forget_slice(self, name: str) -> None:
        self._engine.remove_slice(name)
        self._slice_digests.pop(name, None)
        self._listed_slices.pop(name, None)

    # --- device taint rules ----------------------------------------------------------
    def rule_event(self, event_type: str | None, obj: KubeObject) -> None:
        name, version = name_of(obj), versions.version_of(obj)
        if event_type == "DELETED":
            if self._rule_versions.accept_delete(name, version):
                self._set_rule(name, None)
        elif self._rule_versions.accept_update(name, version):
            self._set_rule(name, taint_rules.read_rule(cast(DeviceTaintRule, obj)))

    def rules_listed(self, items: Iterable[KubeObject], version: str | None) -> None:
        by_name = {name_of(i): i for i in items}
        result = self._rule_versions.reconcile_listing(by_name, version)
        changed = False
        for name in result.apply:
            changed |= self._put_rule(
                name, taint_rules.read_rule(cast(DeviceTaintRule, by_name[name]))
            )
        for name in result.remove:
            changed |= self._put_rule(name, None)
        if changed:
            self._retaint()

    def _set_rule(self, name: str, rule: taint_rules.TaintRule | None) -> None:
        if self._put_rule(name, rule):
            self._retaint()

    def _put_rule(self, name: str, rule: taint_rules.TaintRule | None) -> bool:
        """Record the rule (None: gone, or selects nothing); whether anything changed."""
        old = self._rules.pop(name, None)
        if rule is not None:
            self._rules[name] = rule
        return old != rule

    def _retaint(self) -> None:
        """Every slice to the engine again, with the rules now in force."""
        for name, slim in self._listed_slices.items():
            self._hand_over(name, slim)

    def _on_claims_path(self, hint: Hashable | None) -> bool:
        """Pods on the DRA path: those waiting without a verdict (hint None: any event may
        help them) and those whose verdict the DRA dialect judges (the engine's
        ``on_claims_path``). A slice, claim or class changing may help them; it cannot
        help a pod on the annotation path, which DRA nodes never take."""
        return hint is None or self._engine.on_claims_path(hint)

    def _wake_claim_pods(self, event: queue.ClusterEvent) -> None:
        woken = self._queue.wake(self._on_claims_path)
        if woken:
            log.debug("pods_woken", cluster_event=event.value, woken=woken)

    def _claim_released(self, key: str) -> None:
        """A claim's shares are free again: the DRA path's pods may fit now, and so may
        the annotation path's pods of its namespace that a quota held back (claims count
        in the namespace's quota)."""
        namespace = key.partition("/")[0]

        def helps(hint: Hashable | None) -> bool:
            if self._on_claims_path(hint):
                return True
            if isinstance(hint, queue.WaitsForVictims):
                # A DRA preemptor waits for its victims' claims to be released, not only
                # for their pods to go (a pod's claim is deallocated after it).
                return True
            if hint is queue.OWN_CHANGE_ONLY or isinstance(hint, queue.Refused):
                return False
            return self._engine.quota_may_help(hint, namespace)

        woken = self._queue.wake(helps)
        if woken:
            log.debug("pods_woken", cluster_event=queue.ClusterEvent.ROOM_FREED.value, woken=woken)

    # --- claims ------------------------------------------------------------------------
    def claim_event(self, event_type: str | None, obj: ResourceClaim) -> None:
        key, version = namespaced_name_of(obj), versions.version_of(obj)
        if event_type == "DELETED":
            if self._claims.accept_delete(key, version):
                self._forget_claim(key)
        elif self._claims.accept_update(key, version):
            self._apply_claim(key, obj)

    def claims_listed(self, items: Iterable[ResourceClaim], version: str | None) -> None:
        by_key = {namespaced_name_of(i): i for i in items}
        result = self._claims.reconcile_listing(by_key, version)
        for key in result.apply:
            self._apply_claim(key, by_key[key])
        for key in result.remove:
            self._forget_claim(key)

    def _apply_claim(self, key: str, obj: ResourceClaim) -> None:
        new = key not in self._seen
        self._seen.add(key)
        self._engine.set_claim(pod_facts.slim(obj))
        was = key in self._allocated
        now = _allocated(obj)
        if now:
            self._allocated.add(key)
        else:
            self._allocated.discard(key)
        if was and not now:
            self._claim_released(key)
        elif new:
            self._wake_claim_pods(queue.ClusterEvent.INVENTORY_CHANGED)

    def _forget_claim(self, key: str) -> None:
        self._engine.remove_claim(key)
        self._seen.discard(key)
        if key in self._allocated:
            self._allocated.discard(key)
            self._claim_released(key)

    # --- device classes ------------------------------------------------------------------
    def class_event(self, event_type: str | None, obj: DeviceClass) -> None:
        name, version = name_of(obj), versions.version_of(obj)
        if event_type == "DELETED":
            if self._classes.accept_delete(name, version):
                self._engine.remove_device_class(name)
        elif self._classes.accept_update(name, version):
            self._engine.set_device_class(pod_facts.slim(obj))
            self._wake_claim_pods(queue.ClusterEvent.CONFIG_CHANGED)

    def classes_listed(self, items: Iterable[DeviceClass], version: str | None) -> None:
        by_name = {name_of(i): i for i in items}
        result = self._classes.reconcile_listing(by_name, version)
        for name in result.apply:
            self._engine.set_device_class(pod_facts.slim(by_name[name]))
        for name in result.remove:
            self._engine.remove_device_class(name)

    # --- namespaces that allow adminAccess ----------------------------------------------
    def admin_namespace_event(self, event_type: str | None, obj: KubeObject) -> None:
        """A Namespace labelled ``resource.kubernetes.io/admin-access: "true"`` (the watch
        selects only those: one that loses the label comes as DELETED)."""
        name = name_of(obj)
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if event_type != "DELETED" and labels.get(ADMIN_ACCESS_LABEL) == "true":
            self._admin_namespaces.add(name)
        else:
            self._admin_namespaces.discard(name)
        self._set_admin_namespaces()

    def admin_namespaces_listed(self, items: Iterable[KubeObject], version: str | None) -> None:
        self._admin_namespaces = {
            name_of(i)
            for i in items
            if ((i.get("metadata") or {}).get("labels") or {}).get(ADMIN_ACCESS_LABEL) == "true"
        }
        self._set_admin_namespaces()

    def _set_admin_namespaces(self) -> None:
        self._engine.set_admin_namespaces(frozenset(self._admin_namespaces))
        self._wake_claim_pods(queue.ClusterEvent.CONFIG_CHANGED)
