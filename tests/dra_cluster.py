"""A DRA node of one card behind the real feeds and engine, for tests that decide pods
with claims (``DraCluster.decide``)."""

from __future__ import annotations

import copy
from typing import Any

from vgpu_operator.config import DeviceConfig
from vgpu_operator.control import claims_feed, feed, queue
from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision

CARD_MIB = 46068
NODE = "dra-a"


class DraCluster:
    """The real feeds and engine: one DRA node of one L40S card (``CARD_MIB``)."""

    def __init__(self) -> None:
        self.state = ClusterState(DeviceConfig())
        pods = queue.SchedulingQueue(flush_after_s=10**9)
        self.feed = feed.StateFeed(self.state, pods)
        self.claims = claims_feed.ClaimFeed(self.state, pods)
        self.version = 10
        for device_class in dra.device_classes():
            meta = {**device_class["metadata"], "resourceVersion": "1"}
            self.claims.class_event("ADDED", {**device_class, "metadata": meta})
        labels = {dra.NODE_PATH_LABEL: dra.PATH_DRA}
        node = {"metadata": {"name": NODE, "resourceVersion": "1", "labels": labels}}
        self.feed.node_event("ADDED", node)
        card = dra.CardShape("GPU-a", 0, "L40S", "NVIDIA-L40S", CARD_MIB, 100, 4, "hami-core")
        published = copy.deepcopy(dict(dra.slice_wire(NODE, [card], 1, None)))
        published["metadata"]["resourceVersion"] = "2"
        self.claims.slice_event("ADDED", published)

    def label_admin(self, namespace: str, allowed: bool) -> None:
        """The namespace gains or loses ``resource.kubernetes.io/admin-access=true``."""
        labels = {claims_feed.ADMIN_ACCESS_LABEL: "true"} if allowed else {}
        obj = {"metadata": {"name": namespace, "resourceVersion": "5", "labels": labels}}
        self.claims.admin_namespace_event("MODIFIED" if allowed else "DELETED", obj)

    def decide(
        self,
        name: str,
        namespace: str,
        exactly: dict[str, Any],
        config: list[dict[str, Any]] | None = None,
    ) -> Decision:
        """Make claim ``name`` of one request ``gpu`` (our shared class and ``exactly``;
        ``config``: the claim's configs) and decide a pod that names it."""
        return self.state.schedule(self.claim_pod(name, namespace, exactly, config), 1000.0)

    def claim_pod(
        self,
        name: str,
        namespace: str,
        exactly: dict[str, Any],
        config: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Make claim ``name`` (see ``decide``) and give a pending pod that names it."""
        self.version += 1
        version = str(self.version)
        meta = {"namespace": namespace, "name": name, "uid": f"uid-{name}"}
        meta["resourceVersion"] = version
        request = {"name": "gpu", "exactly": {"deviceClassName": dra.SHARED_CLASS, **exactly}}
        spec: dict[str, Any] = {"devices": {"requests": [request]}}
        if config is not None:
            spec["devices"]["config"] = config
        self.claims.claim_event("ADDED", {"metadata": meta, "spec": spec})
        pod_meta = {"namespace": namespace, "name": name, "uid": f"uid-p-{name}"}
        pod_meta["resourceVersion"] = version
        pod = {
            "metadata": pod_meta,
            "spec": {
                "schedulerName": "vgpu-scheduler",
                "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            },
            "status": {"phase": "Pending"},
        }
        return pod
