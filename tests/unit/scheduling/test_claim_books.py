"""The books on the DRA path: claims hold shares whoever allocated them, the engine's own
decisions hold until their claims come back, and a recount finds an over-commit."""

from __future__ import annotations

import copy
from typing import Any

from builders import claim_status

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cycle.cluster import ClusterState

NODE = "dra-a"


def state() -> ClusterState:
    engine = ClusterState(DeviceConfig())
    engine.set_node({"metadata": {"name": NODE, "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA}}})
    for device_class in dra.device_classes():
        engine.set_device_class(device_class)
    card = dra.CardShape("GPU-A", 0, "L40S", "NVIDIA-L40S", 10240, 100, 4, "hami-core")
    engine.set_slice(dra.slice_wire(NODE, [card], 1, None))
    return engine


def claim(name: str, memory: str, allocated: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": dra.SHARED_CLASS,
                            "capacity": {"requests": {"memory": memory}},
                        },
                    }
                ]
            }
        },
    }
    if allocated:
        consumed = {"memory": memory, "cores": "0", "shares": "1"}
        obj["status"] = claim_status(NODE, "gpu-a", consumed=consumed, pinned=True)
    return obj


def pod(name: str, claim_name: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
        },
    }


def used_memory(engine: ClusterState) -> int:
    [row] = engine.device_usage()
    return row.used_memory_mib


def test_an_allocated_claim_holds_its_share_whoever_wrote_it() -> None:
    engine = state()
    engine.set_claim(claim("upstream", "8Gi", allocated=True))
    assert used_memory(engine) == 8192
    engine.set_claim(claim("mine", "4Gi"))
    decision = engine.schedule(pod("p", "mine"), now=0)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert "CardInsufficientMemory" in decision.diagnosis.message()
    engine.remove_claim("ns/upstream")
    assert used_memory(engine) == 0
    assert engine.schedule(pod("p", "mine"), now=0).scheduled


def test_a_decision_holds_until_its_claim_comes_back_and_goes_on_rollback() -> None:
    engine = state()
    engine.set_claim(claim("mine", "6Gi"))
    decision = engine.schedule(pod("p", "mine"), now=0)
    assert decision.scheduled
    [write] = decision.claim_writes
    assert used_memory(engine) == 6144
    # A copy without the allocation (the finalizer's write) does not drop the hold.
    with_finalizer = claim("mine", "6Gi")
    with_finalizer["metadata"]["resourceVersion"] = "2"
    engine.set_claim(with_finalizer)
    assert used_memory(engine) == 6144
    other = claim("other", "6Gi")
    engine.set_claim(other)
    assert not engine.schedule(pod("q", "other"), now=0).scheduled
    engine.rollback("ns/p")
    assert used_memory(engine) == 0
    assert write.allocation is not None


def test_a_written_claim_becomes_the_truth() -> None:
    engine = state()
    engine.set_claim(claim("mine", "6Gi"))
    decision = engine.schedule(pod("p", "mine"), now=0)
    [write] = decision.claim_writes
    allocated = copy.deepcopy(claim("mine", "6Gi"))
    assert write.allocation is not None
    allocated["status"] = {
        "allocation": dict(write.allocation),
        "reservedFor": [dict(write.consumer)],
    }
    engine.set_claim(allocated)
    engine.confirm("ns/p")
    assert used_memory(engine) == 6144
    # Deallocated by the claim controller once the pod is done: the share is free.
    engine.set_claim(claim("mine", "6Gi"))
    assert used_memory(engine) == 0


def test_over_committed_devices_are_found_by_a_recount() -> None:
    engine = state()
    engine.set_claim(claim("a", "6Gi", allocated=True))
    assert engine.over_committed(NODE, ["gpu-a"]) == []
    engine.set_claim(claim("b", "6Gi", allocated=True))
    assert engine.over_committed(NODE, ["gpu-a"]) == ["gpu-a"]


def test_a_pod_whose_claim_is_not_in_the_books_yet_waits_for_it() -> None:
    engine = state()
    decision = engine.schedule(pod("p", "later"), now=0)
    assert not decision.scheduled
    assert decision.waits_for_claims  # the claim's arrival, not the pod's edit, helps
    engine.set_claim(claim("later", "4Gi"))
    placed = engine.schedule(pod("p", "later"), now=0)
    assert placed.scheduled
    assert not placed.waits_for_claims
