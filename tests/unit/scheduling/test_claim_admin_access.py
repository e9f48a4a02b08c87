"""adminAccess on the DRA path (issue 44): upstream's rule. A request with adminAccess is
allocated only in a namespace labelled ``resource.kubernetes.io/admin-access: "true"``,
on a device its selectors allow whatever others hold of it, consuming nothing; in any
other namespace it is refused with a sentence."""

from __future__ import annotations

import copy
from typing import Any

from vgpu_operator.config import DeviceConfig
from vgpu_operator.control import claims_feed, feed, queue
from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cluster import ClusterState, Decision

CARD_MIB = 46068


class Cluster:
    """The real feeds and engine: a DRA node of one card."""

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
        node = {"metadata": {"name": "dra-a", "resourceVersion": "1", "labels": labels}}
        self.feed.node_event("ADDED", node)
        card = dra.CardShape("GPU-a", 0, "L40S", "NVIDIA-L40S", CARD_MIB, 100, 4, "hami-core")
        published = copy.deepcopy(dict(dra.slice_wire("dra-a", [card], 1, None)))
        published["metadata"]["resourceVersion"] = "2"
        self.claims.slice_event("ADDED", published)

    def label(self, namespace: str, value: str | None) -> None:
        labels = {} if value is None else {claims_feed.ADMIN_ACCESS_LABEL: value}
        obj = {"metadata": {"name": namespace, "resourceVersion": "5", "labels": labels}}
        self.claims.admin_namespace_event("MODIFIED" if value else "DELETED", obj)

    def decide(self, name: str, namespace: str, exactly: dict[str, Any]) -> Decision:
        self.version += 1
        meta = {"namespace": namespace, "name": name, "uid": f"uid-{name}",
                "resourceVersion": str(self.version)}  # fmt: skip
        request = {"name": "gpu", "exactly": {"deviceClassName": dra.SHARED_CLASS, **exactly}}
        self.claims.claim_event("ADDED", {"metadata": meta, "spec": {"devices": {
            "requests": [request]}}})  # fmt: skip
        pod = {
            "metadata": {
                "namespace": namespace,
                "name": name,
                "uid": f"uid-p-{name}",
                "resourceVersion": str(self.version),
            },  # fmt: skip
            "spec": {
                "schedulerName": "vgpu-scheduler",
                "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            },
            "status": {"phase": "Pending"},
        }
        return self.state.schedule(pod, 1000.0)


WHOLE = {"capacity": {"requests": {"memory": f"{CARD_MIB}Mi"}}}


def test_refused_with_a_sentence_where_the_namespace_is_not_labelled() -> None:
    cluster = Cluster()
    decision = cluster.decide("admin", "team", {"adminAccess": True})
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert decision.diagnosis.error == (
        "ResourceClaim team/admin, request 'gpu' asks adminAccess, which is allowed only in "
        "namespaces an administrator labelled resource.kubernetes.io/admin-access=true, and "
        "namespace team is not: remove adminAccess, or ask an administrator for the label"
    )


def test_allocated_where_labelled_on_a_full_card_consuming_nothing() -> None:
    cluster = Cluster()
    cluster.label("ops", "true")
    whole = cluster.decide("whole", "team", WHOLE)  # takes all of the card's memory
    assert whole.scheduled
    cluster.state.confirm(whole.pod)
    admin = cluster.decide("admin", "ops", {"adminAccess": True})
    assert admin.scheduled
    (write,) = admin.claim_writes
    assert write.allocation is not None
    (result,) = write.allocation["devices"]["results"]
    assert result["adminAccess"] is True
    assert "consumedCapacity" not in result
    assert "shareID" not in result


def test_an_admin_claim_leaves_the_card_to_others() -> None:
    cluster = Cluster()
    cluster.label("ops", "true")
    admin = cluster.decide("admin", "ops", {"adminAccess": True})
    assert admin.scheduled
    cluster.state.confirm(admin.pod)
    assert cluster.decide("whole", "team", WHOLE).scheduled


def test_a_namespace_that_loses_the_label_is_refused_again() -> None:
    cluster = Cluster()
    cluster.label("ops", "true")
    cluster.label("ops", None)
    decision = cluster.decide("admin", "ops", {"adminAccess": True})
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert "namespace ops is not" in str(decision.diagnosis.error)
