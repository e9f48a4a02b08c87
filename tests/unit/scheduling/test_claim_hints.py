"""Pods on the DRA path wait with a verdict, as annotation pods do (issue 34): an event
that cannot let their claims fit does not wake them; one that may, does.

The real feeds, queue and engine: a DRA node whose one card is too small for the pod's
claim, and a device-plugin node beside it. Events on the device-plugin node (its labels,
its inventory, a pod ending there) and a quota of another namespace wake nobody; a slice
that offers a card big enough wakes the pod, which is then placed.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable
from typing import Any

from builders import claim_status, make_node

from vgpu_operator.config import DeviceConfig
from vgpu_operator.control import claims_feed, feed, queue
from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision

DRA_NODE = "dra-a"
GPU_NODE = "gpu-b"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _claim(name: str, memory: str) -> dict[str, Any]:
    request = {"deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": {"memory": memory}}}
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


def _pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
        "status": {"phase": "Pending"},
    }


def _slice(node: str, memory_mib: int, version: str) -> dict[str, Any]:
    card = dra.CardShape(f"GPU-{node}", 0, "L40S", "NVIDIA-L40S", memory_mib, 100, 4, "hami-core")
    obj = copy.deepcopy(dict(dra.slice_wire(node, [card], 1, None)))
    obj["metadata"]["resourceVersion"] = version
    return obj


def _hint(decision: Decision) -> Hashable | None:
    """What the worker parks a pod with (``worker._hint_of``)."""
    if decision.waits_for_claims:
        return None
    if decision.diagnosis is not None and decision.diagnosis.error is not None:
        return queue.OWN_CHANGE_ONLY
    return decision.verdict


class Cluster:
    def __init__(self) -> None:
        self.clock = Clock()
        self.state = ClusterState(DeviceConfig())
        self.queue = queue.SchedulingQueue(clock=self.clock, flush_after_s=10**9)
        self.feed = feed.StateFeed(self.state, self.queue, wall_clock=self.clock)
        self.claims = claims_feed.ClaimFeed(self.state, self.queue)
        self.version = 10
        self.attempts: dict[str, int] = {}
        for device_class in dra.device_classes():
            self.claims.class_event(
                "ADDED",
                {**device_class, "metadata": {**device_class["metadata"], "resourceVersion": "1"}},
            )
        dra_node = {
            "metadata": {
                "name": DRA_NODE,
                "resourceVersion": "1",
                "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA},
            },
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}},
        }
        self.feed.node_event("ADDED", dra_node)
        self.claims.slice_event("ADDED", _slice(DRA_NODE, 10240, "2"))
        gpu_node, devices = make_node(GPU_NODE).gpu("GPU-b0").obj()
        self.gpu_node = gpu_node
        self.send_node()
        self.state.set_inventory(GPU_NODE, devices, {}, heartbeat=None)

    def next_version(self) -> str:
        self.version += 1
        return str(self.version)

    def send_node(self) -> None:
        node = copy.deepcopy(self.gpu_node)
        node["metadata"]["resourceVersion"] = self.next_version()
        self.feed.node_event("MODIFIED", node)

    def work(self) -> None:
        """The worker: decide every due pod, park those that fit nowhere with their hint."""
        while (key := self.queue.pop()) is not None:
            self.attempts[key] = self.attempts.get(key, 0) + 1
            pod = self.feed.pending_pod(key)
            assert pod is not None
            decision = self.state.schedule(pod, self.clock.now)
            self.feed.settle_releases()
            if decision.scheduled:
                self.state.confirm(key)
                self.queue.remove(key)
            else:
                self.queue.park(key, hint=_hint(decision))
            self.clock.now += 20  # past any backoff


def test_a_dra_pod_whose_claim_cannot_fit_is_not_retried_on_unrelated_events() -> None:
    cluster = Cluster()
    cluster.claims.claim_event("ADDED", _claim("big", "20Gi"))
    cluster.feed.pod_event("ADDED", _pod("p", "big"))
    cluster.work()
    assert cluster.attempts == {"ns/p": 1}
    assert cluster.queue.is_unschedulable("ns/p")
    hint = cluster.queue.hint_of("ns/p")
    assert hint is not None, "a DRA pod that fits nowhere waits with a verdict"

    # Events that cannot let a 20 GiB claim fit: the device-plugin node relabelled, a pod
    # placed there and ending (room freed there), a quota of another namespace.
    cluster.gpu_node["metadata"]["labels"]["zone"] = "b"
    cluster.send_node()
    cluster.work()
    bound = {
        "metadata": {"namespace": "other", "name": "done", "uid": "u-done", "resourceVersion": "5"},
        "spec": {
            "nodeName": GPU_NODE,
            "schedulerName": "vgpu-scheduler",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
        },
        "status": {"phase": "Running"},
    }
    cluster.feed.pod_event("ADDED", bound)
    cluster.work()
    cluster.feed.pod_event(
        "MODIFIED",
        {
            **bound,
            "metadata": {**bound["metadata"], "resourceVersion": "6"},
            "status": {"phase": "Succeeded"},
        },
    )
    cluster.work()
    quota = {
        "metadata": {"namespace": "other", "name": "q", "resourceVersion": "7"},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "1000"}},
    }
    cluster.feed.quota_event("ADDED", quota)
    cluster.work()
    assert cluster.attempts == {"ns/p": 1}, "woken by an event that cannot help it"

    # A slice that offers a 40 GiB card: the pod is woken and placed.
    cluster.claims.slice_event("MODIFIED", _slice(DRA_NODE, 40960, "3"))
    cluster.work()
    assert cluster.attempts == {"ns/p": 2}
    assert not cluster.queue.is_unschedulable("ns/p")
    assert cluster.state.holding_pods() == {"ns/p": DRA_NODE}


def test_a_released_claim_wakes_a_preemptor_waiting_for_its_victims() -> None:
    """On the DRA path a preemptor waits for its victims' claims to be released after
    their pods are gone (the claim controller deallocates them): the release wakes it."""
    cluster = Cluster()
    held = _claim("victims", "8Gi")
    consumed = {"memory": "8Gi", "cores": "0", "shares": "1"}
    held["status"] = claim_status(DRA_NODE, "gpu-a", consumed=consumed)
    cluster.claims.claim_event("ADDED", held)
    cluster.queue.add("ns/urgent", "u-urgent")
    assert cluster.queue.pop() == "ns/urgent"
    cluster.queue.park("ns/urgent", hint=queue.WaitsForVictims(DRA_NODE))
    cluster.clock.now += 20
    released = copy.deepcopy(held)
    released["metadata"]["resourceVersion"] = "99"
    del released["status"]
    cluster.claims.claim_event("MODIFIED", released)
    assert not cluster.queue.is_unschedulable("ns/urgent")
