"""A PodGroup's own claims (``group_claims``, issue 47 item 3): allocated once, for the
first member placed, reserved for the PodGroup; the other members use the allocation on its
node (within one gang attempt, the first member's decision's devices, counted once)."""

from __future__ import annotations

from typing import Any

import pytest
from unit.scheduling.test_claim_books import NODE, claim, pod, state, used_memory

from vgpu_operator.scheduling.books import group_claims
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.scheduling.gangs.gangs import GroupSpec

GROUP_CONSUMER = {
    "apiGroup": "scheduling.k8s.io",
    "resource": "podgroups",
    "name": "train",
    "uid": "uid-train",
}


def pod_group(**entry: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "train", "namespace": "ns", "uid": "uid-train"},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 2}},
            "resourceClaims": [{"name": "gpu", **entry}],
        },
    }


def member(name: str, claim_name: str = "shared", group: str = "train") -> dict[str, Any]:
    obj = pod(name, claim_name)
    obj["spec"]["schedulingGroup"] = {"podGroupName": group}
    return obj


def engine() -> ClusterState:
    found = state()  # one card: 10240 MiB, 100 cores, 4 shares
    found.set_claim(claim("shared", "4Gi"))
    found.books.note_pod_group("ns/train", pod_group(resourceClaimName="shared"))
    assert found.books.group_claims["ns/train"] is not None
    return found


def test_reading_a_pod_groups_claims() -> None:
    read = group_claims.read(pod_group(resourceClaimTemplateName="t"))
    assert read is not None
    assert read.entries == {"gpu": (None, "t")}
    assert read.consumer() == GROUP_CONSUMER
    both = pod_group(resourceClaimName="a", resourceClaimTemplateName="t")
    assert group_claims.read(both) is None  # neither or both: not the group's
    assert group_claims.read({"metadata": {"name": "x"}, "spec": {}}) is None


def test_a_gangs_group_claim_is_allocated_once_and_reserved_for_the_group() -> None:
    s = engine()
    spec = GroupSpec("ns/train", gang=True, min_count=2)
    out = gangs.decide_group(s, spec, "ns/train", [member("w0"), member("w1")], {}, 0)
    assert [d.node for d in out.placed] == [NODE, NODE]
    first, second = (d.claim_writes for d in out.placed)
    (allocating,) = first
    assert allocating.allocation is not None
    assert allocating.consumer == GROUP_CONSUMER
    (waiting,) = second
    assert waiting.allocation is None
    assert waiting.awaits_allocation
    assert waiting.consumer == GROUP_CONSUMER
    assert used_memory(s) == 4 * 1024  # the claim's devices, held once


def test_once_allocated_for_the_group_a_later_member_writes_nothing() -> None:
    s = engine()
    allocated = claim("shared", "4Gi", allocated=True)
    allocated["status"]["reservedFor"] = [GROUP_CONSUMER]
    s.set_claim(allocated)
    decision = s.schedule(member("w2"), 0)
    assert decision.scheduled
    assert decision.node == NODE
    assert decision.claim_writes == ()
    assert used_memory(s) == 4 * 1024


@pytest.mark.parametrize("case", ["other entry", "no group"])
def test_a_claim_that_is_not_the_groups_is_the_pods_own(case: str) -> None:
    s = engine()
    obj = member("solo") if case == "other entry" else pod("solo", "shared")
    if case == "other entry":
        obj["spec"]["resourceClaims"][0]["name"] = "other"
        obj["spec"]["containers"][0]["resources"]["claims"] = [{"name": "other"}]
    decision = s.schedule(obj, 0)
    (write,) = decision.claim_writes
    assert write.consumer == {"resource": "pods", "name": "solo", "uid": "uid-solo"}


def test_a_group_claim_is_kept_while_a_member_runs_after_it_was_released() -> None:
    """kube-controller-manager releases a group's claim once the PodGroup is deleted; a
    member still running on its devices keeps them held in the books."""
    s = engine()
    allocated = claim("shared", "4Gi", allocated=True)
    allocated["status"]["reservedFor"] = [GROUP_CONSUMER]
    s.set_claim(allocated)
    running = member("w0")
    running["spec"]["nodeName"] = NODE
    running["status"] = {"phase": "Running"}
    s.set_pod(running)
    released = claim("shared", "4Gi")
    released["metadata"]["resourceVersion"] = "2"
    s.set_claim(released)
    assert used_memory(s) == 4 * 1024
    s.remove_pod("ns/w0")
    assert used_memory(s) == 0
