"""Feeding the engine's DRA path: ResourceSlices, ResourceClaims and DeviceClasses in,
wake-ups out (the DRA counterpart of ``feed.StateFeed``, kept apart so that each stays
small).

Stale news never overwrites fresh (``versions.VersionLedger``, as for every kind). Which
claim changes wake parked pods: a new claim (a pod may be waiting for the claim its
template makes), and a claim whose allocation went or that was deleted (its shares are
free again); an allocation being written frees nothing and wakes nobody. A changed slice
is a node's devices changing.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any, Protocol

import structlog

from vgpu_operator.control import pod_facts, queue, versions
from vgpu_operator.wire import (
    DeviceClass,
    ResourceClaim,
    ResourceSlice,
    name_of,
    namespaced_name_of,
)

log = structlog.get_logger("vgpu_operator.claims_feed")


class ClaimInputs(Protocol):
    """The part of ``scheduling.cluster.ClusterState`` the DRA feed calls."""

    def set_slice(self, obj: Mapping[str, Any]) -> None: ...
    def remove_slice(self, name: str) -> None: ...
    def set_claim(self, obj: Mapping[str, Any]) -> None: ...
    def remove_claim(self, key: str) -> None: ...
    def set_device_class(self, obj: Mapping[str, Any]) -> None: ...
    def remove_device_class(self, name: str) -> None: ...
    def quota_may_help(self, verdict: Any, namespace: str) -> bool: ...
    def on_claims_path(self, verdict: Any) -> bool: ...


def _allocated(claim: ResourceClaim) -> bool:
    return bool(claim.get("status", {}).get("allocation"))


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
        result = self._slices.reconcile(
            {k: versions.version_of(v) for k, v in by_name.items()},
            versions.parse_version(version),
        )
        for name in result.apply:
            self._apply_slice(name, by_name[name])
        for name in result.remove:
            self._forget_slice(name)

    def _apply_slice(self, name: str, obj: ResourceSlice) -> None:
        slim = pod_facts.slim(obj)
        self._engine.set_slice(slim)
        digest = pod_facts.digest(slim.get("spec"))
        if self._slice_digests.get(name) != digest:
            self._slice_digests[name] = digest
            self._wake_claim_pods(queue.ClusterEvent.INVENTORY_CHANGED)

    def _forget_slice(self, name: str) -> None:
        self._engine.remove_slice(name)
        self._slice_digests.pop(name, None)

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
        result = self._claims.reconcile(
            {k: versions.version_of(v) for k, v in by_key.items()},
            versions.parse_version(version),
        )
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
        result = self._classes.reconcile(
            {k: versions.version_of(v) for k, v in by_name.items()},
            versions.parse_version(version),
        )
        for name in result.apply:
            self._engine.set_device_class(pod_facts.slim(by_name[name]))
        for name in result.remove:
            self._engine.remove_device_class(name)
