"""The AdmissionCheck ``vgpu-operator.io/placeable`` on the engine (``control.placeable_check``):
the issue's case (four pods of 20 GiB where each card has 19 GiB free) is Retry with the
device counts, Ready once four cards can hold it; a Ready answer holds its shares so a
second workload does not count them, until admitted, released or expired."""

from __future__ import annotations

from typing import Any

from builders import bound, cluster, make_node, make_pod

from vgpu_operator.control.placeable_check import HOLD_PREFIX, PlaceableCheck
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.pod_key import PodKey

GIB = 1024


def workload(name: str, count: int, gpumem_mib: int, *, gpus: int = 1) -> dict[str, Any]:
    template = make_pod("template", "team").container(gpu=gpus, gpumem=gpumem_mib).obj()
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
        "spec": {
            "podSets": [
                {
                    "name": "main",
                    "count": count,
                    "template": {"metadata": {}, "spec": template["spec"]},
                }
            ]
        },
    }


def four_cards_with_19_gib_free() -> ClusterState:
    """Two nodes of two 24 GiB cards, each card already giving 5 GiB to a running pod."""
    state = cluster(
        make_node("n0").gpu("GPU-00", memory_mib=24 * GIB).gpu("GPU-01", memory_mib=24 * GIB),
        make_node("n1").gpu("GPU-10", memory_mib=24 * GIB).gpu("GPU-11", memory_mib=24 * GIB),
    )
    for i, (node, card) in enumerate(
        [("n0", "GPU-00"), ("n0", "GPU-01"), ("n1", "GPU-10"), ("n1", "GPU-11")]
    ):
        allocated = f"{card},NVIDIA,{5 * GIB},0:;"
        state.set_pod(
            make_pod(f"small-{i}", "other")
            .container(gpu=1, gpumem=5 * GIB)
            .on_node(node, allocated)
            .obj()
        )
    return state


def test_no_four_cards_hold_the_workload_retry_with_device_counts() -> None:
    state = four_cards_with_19_gib_free()
    check = PlaceableCheck(state)
    answer = check.judge(workload("big", 4, 20 * GIB), 1.0)
    assert answer.state == "Retry"
    assert "pod 1 of 4 fits on no node now" in answer.message, answer.message
    assert "(devices: 4 CardInsufficientMemory)" in answer.message
    # Nothing is held: a pod of 19 GiB still fits on every card.
    assert check.holding() == {}
    for i in range(4):
        pod = make_pod(f"fits-{i}", "team").container(gpu=1, gpumem=19 * GIB).obj()
        assert state.schedule(pod, 1.0).scheduled


def test_ready_once_room_appears() -> None:
    state = four_cards_with_19_gib_free()
    check = PlaceableCheck(state)
    assert check.judge(workload("big", 4, 20 * GIB), 1.0).state == "Retry"
    for i in range(4):
        state.remove_pod(bound_key(f"small-{i}"))
    answer = check.judge(workload("big", 4, 20 * GIB), 2.0)
    assert answer.state == "Ready", answer.message
    assert sorted(answer.placed["main"]) == ["n0", "n0", "n1", "n1"]


def bound_key(name: str) -> PodKey:
    return PodKey(f"other/{name}")


def test_a_ready_answer_holds_its_shares_from_the_next_workload() -> None:
    state = cluster(
        make_node("n0").gpu("GPU-00", memory_mib=24 * GIB).gpu("GPU-01", memory_mib=24 * GIB)
    )
    check = PlaceableCheck(state, hold_s=30.0)
    assert check.judge(workload("first", 2, 20 * GIB), 0.0).state == "Ready"
    assert all(k.split("/", 1)[1].startswith(HOLD_PREFIX) for k in check.holding()["team/first"])
    # Both cards are held: the second workload is not told they are free.
    assert check.judge(workload("second", 1, 20 * GIB), 1.0).state == "Retry"
    # Kueue admits the first: its hold ends and its own pods take the room.
    assert check.release("team/first")
    pods = [make_pod(f"first-{i}", "team").container(gpu=1, gpumem=20 * GIB).obj() for i in (0, 1)]
    assert all(state.schedule(p, 2.0).scheduled for p in pods)


def test_a_hold_expires() -> None:
    state = cluster(make_node("n0").gpu("GPU-00", memory_mib=24 * GIB))
    check = PlaceableCheck(state, hold_s=30.0)
    assert check.judge(workload("first", 1, 20 * GIB), 0.0).state == "Ready"
    assert check.judge(workload("second", 1, 20 * GIB), 29.0).state == "Retry"
    assert check.expire(30.0) == ["team/first"]
    assert check.judge(workload("second", 1, 20 * GIB), 30.0).state == "Ready"


def test_judging_again_replaces_the_earlier_hold() -> None:
    state = cluster(make_node("n0").gpu("GPU-00", memory_mib=24 * GIB))
    check = PlaceableCheck(state)
    assert check.judge(workload("first", 1, 20 * GIB), 0.0).state == "Ready"
    # Its own earlier hold does not stand in its way.
    assert check.judge(workload("first", 1, 20 * GIB), 1.0).state == "Ready"


def test_pod_sets_without_devices_are_passed() -> None:
    state = cluster(make_node("n0").gpu("GPU-00", memory_mib=24 * GIB))
    check = PlaceableCheck(state)
    cpu_only = workload("cpu", 3, 0)
    cpu_only["spec"]["podSets"][0]["template"]["spec"] = {
        "containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]
    }
    answer = check.judge(cpu_only, 0.0)
    assert answer.state == "Ready"
    assert "no devices" in answer.message
    assert check.holding() == {}


def test_the_check_never_preempts() -> None:
    state = cluster(make_node("n0").gpu("GPU-00", memory_mib=24 * GIB))
    low = make_pod("low", "other").container(gpu=1, gpumem=20 * GIB).obj()
    decision = state.schedule(low, 0.0)
    state.set_pod(bound(low, decision))
    high = workload("high", 1, 20 * GIB)
    high["spec"]["podSets"][0]["template"]["spec"]["priority"] = 1000
    assert PlaceableCheck(state).judge(high, 1.0).state == "Retry"
    assert state.nominated_node(bound_key("low")) is None
