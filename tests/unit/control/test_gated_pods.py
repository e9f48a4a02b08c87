"""A pod held by a scheduling gate (Kueue's ``kueue.x-k8s.io/admission`` until its workload
is admitted) is never queued for a decision, on the annotation path and on the DRA path
alike, and is queued as soon as its last gate is removed (docs/kueue.md)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from manual_clock import ManualClock
from unit.control.test_state_feed import FakeEngine, pod

from vgpu_operator.control.feed import StateFeed
from vgpu_operator.control.queue import SchedulingQueue

GATE = {"name": "kueue.x-k8s.io/admission"}


def annotation_path_pod(version: int) -> dict[str, Any]:
    out = pod("p", version)
    out["spec"]["containers"] = [
        {
            "name": "c",
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480"}},
        }
    ]
    return out


def dra_path_pod(version: int) -> dict[str, Any]:
    out = pod("p", version)
    out["spec"]["containers"] = [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}]
    out["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    # Its claim is made (kube-controller-manager named it): nothing else holds it back.
    out["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "p-gpu"}]
    return out


@pytest.mark.parametrize("make", [annotation_path_pod, dra_path_pod])
def test_a_gated_pod_is_not_queued_until_its_gate_is_removed(make: Any) -> None:
    clock = ManualClock(1000.0)
    queue = SchedulingQueue(clock=clock)
    feed = StateFeed(FakeEngine(), queue, inventory_timeout_s=60, wall_clock=clock)
    gated = make(1)
    gated["spec"]["schedulingGates"] = [GATE]
    feed.pod_event("ADDED", gated)
    assert "ns/p" not in queue
    assert feed.pending_pod("ns/p") is None
    ungated = copy.deepcopy(make(2))
    feed.pod_event("MODIFIED", ungated)
    assert "ns/p" in queue
