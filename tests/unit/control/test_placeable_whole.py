"""The placeable check judges whole workloads (issue 47 item 6): pods that form an upstream
PodGroup as one gang (every member at once, in one domain of its topology constraint), and
pods that use ResourceClaims by the engine's claim fit, their claims made from the
templates as kube-controller-manager will make them."""

from __future__ import annotations

from typing import Any

from builders import cluster, make_node, make_pod
from unit.scheduling.test_claim_books import state as dra_state
from unit.scheduling.test_claim_books import used_memory

from vgpu_operator.control.placeable_check import PlaceableCheck, templates_named
from vgpu_operator.devices import dra

GIB = 1024
ISLAND = "vgpu.io/island"


def _workload(name: str, count: int, spec: dict[str, Any], namespace: str = "team") -> Any:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"podSets": [{"name": "main", "count": count, "template": {"spec": spec}}]},
    }


def _gang_workload(name: str, count: int, group: str = "train") -> Any:
    spec = make_pod("t", "team").container(gpu=1, gpumem=20 * GIB).obj()["spec"]
    spec["schedulingGroup"] = {"podGroupName": group}
    return _workload(name, count, spec)


def _pod_group(topology: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": 1}}}
    if topology is not None:
        spec["schedulingConstraints"] = {"topology": [{"key": topology}]}
    return {"metadata": {"name": "train", "namespace": "team"}, "spec": spec}


def _two_islands() -> Any:
    """Two nodes in two NVLink islands, one 24 GiB card each."""
    return cluster(
        make_node("a").label(ISLAND, "one").gpu("GPU-A", memory_mib=24 * GIB),
        make_node("b").label(ISLAND, "two").gpu("GPU-B", memory_mib=24 * GIB),
    )


def test_a_pod_group_with_a_topology_constraint_is_judged_as_one_gang_in_one_domain() -> None:
    """Two members fit on two nodes, but not in one island: Retry with the group's reason
    (a pod-by-pod judgement would have said Ready); without the constraint, Ready."""
    state = _two_islands()
    bound_to_one = PlaceableCheck(state, pod_groups=lambda key: _pod_group(ISLAND))
    answer = bound_to_one.judge(_gang_workload("island", 2), 0.0)
    assert answer.state == "Retry"
    assert answer.message.startswith("pod group team/train (pod set main): pod group team/train")
    assert "in one vgpu.io/island domain" in answer.message
    assert bound_to_one.holding() == {}
    free = PlaceableCheck(state, pod_groups=lambda key: _pod_group())
    answer = free.judge(_gang_workload("anywhere", 2), 0.0)
    assert answer.state == "Ready", answer.message
    assert sorted(answer.placed["main"]) == ["a", "b"]
    assert len(free.holding()["team/anywhere"]) == 2


def test_a_missing_or_unreadable_pod_group_is_retry_saying_so() -> None:
    missing = PlaceableCheck(_two_islands())
    answer = missing.judge(_gang_workload("lost", 1), 0.0)
    assert answer.state == "Retry"
    assert "PodGroup team/train does not exist" in answer.message
    bad = {"metadata": {"name": "train", "namespace": "team"}, "spec": {"schedulingPolicy": {}}}
    unreadable = PlaceableCheck(_two_islands(), pod_groups=lambda key: bad)
    assert "exactly one of basic, gang" in unreadable.judge(_gang_workload("x", 1), 0.0).message


def _claim_spec(template: str) -> dict[str, Any]:
    return {
        "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
    }


def _template(name: str, memory: str) -> dict[str, Any]:
    request = {"deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": {"memory": memory}}}
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    }


TEMPLATES = {"ns/six": _template("six", "6Gi"), "ns/four": _template("four", "4Gi")}


def test_dra_pod_sets_are_judged_by_the_claim_fit_and_held() -> None:
    """One card of 10 GiB: two pods of 6 GiB do not fit (Retry, nothing held), two of 4 GiB
    do, and their 8 GiB are held from the next workload until the hold ends."""
    state = dra_state()
    check = PlaceableCheck(state)
    too_big = _workload("big", 2, _claim_spec("six"), "ns")
    assert templates_named(too_big) == ["ns/six"]
    answer = check.judge(too_big, 0.0, TEMPLATES)
    assert answer.state == "Retry"
    assert "pod 2 of 2 fits on no node now" in answer.message
    assert used_memory(state) == 0
    assert check.holding() == {}
    answer = check.judge(_workload("fits", 2, _claim_spec("four"), "ns"), 0.0, TEMPLATES)
    assert answer.state == "Ready", answer.message
    assert answer.placed["main"] == ("dra-a", "dra-a")
    assert used_memory(state) == 8 * GIB
    later = check.judge(_workload("later", 1, _claim_spec("four"), "ns"), 1.0, TEMPLATES)
    assert later.state == "Retry"
    assert check.release("ns/fits")
    assert used_memory(state) == 0
    assert state.claim_object("ns/#placeable.fits.main.0.gpu") is None
    assert check.judge(_workload("later", 1, _claim_spec("four"), "ns"), 2.0, TEMPLATES).state == (
        "Ready"
    )


def test_a_template_that_does_not_exist_is_retry_naming_it() -> None:
    check = PlaceableCheck(dra_state())
    answer = check.judge(_workload("w", 1, _claim_spec("gone"), "ns"), 0.0, TEMPLATES)
    assert answer.state == "Retry"
    assert answer.message == "pod set main: ResourceClaimTemplate ns/gone not found"


def test_a_workloads_pods_group_read_from_a_pod_is_judged_as_one_gang() -> None:
    """Kueue v0.17 keeps no ``schedulingGroup`` in a Workload's pod sets: the runtime reads
    the group from a pod of the workload and the check judges the pod sets as its members."""
    spec = make_pod("t", "team").container(gpu=1, gpumem=20 * GIB).obj()["spec"]
    check = PlaceableCheck(_two_islands(), pod_groups=lambda key: _pod_group(ISLAND))
    plain = check.judge(_workload("kueue", 2, spec), 0.0)
    assert plain.state == "Ready"  # pod by pod: one per node
    check.release("team/kueue")
    grouped = check.judge(_workload("kueue", 2, spec), 0.0, pod_group="team/train")
    assert grouped.state == "Retry"
    assert "in one vgpu.io/island domain" in grouped.message
