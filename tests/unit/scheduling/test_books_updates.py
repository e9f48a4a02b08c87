"""Updates of a pod the books already hold: the same shares keep the node as it is, other
shares rebuild it (the node's cards must always match what its pods book)."""

from __future__ import annotations

import copy

from builders import bound, cluster, make_node, make_pod

from vgpu_operator.devices import nvidia
from vgpu_operator.scheduling.cycle.cluster import ClusterState


def _usage(state: ClusterState) -> dict[str, tuple[int, int]]:
    return {r.uuid: (r.used_slots, r.used_memory_mib) for r in state.device_usage()}


def _placed(state: ClusterState) -> dict[str, object]:
    pod = make_pod("p").container(gpu=1, gpumem=4000).obj()
    decision = state.schedule(pod, now=0.0)
    assert decision.scheduled
    state.confirm(decision.pod)
    copy_ = bound(pod, decision)
    state.set_pod(copy_)
    return copy_


def test_a_status_update_keeps_the_booking() -> None:
    state = cluster(make_node("n").gpu("GPU-0").gpu("GPU-1"))
    pod = _placed(state)
    before = _usage(state)
    running = copy.deepcopy(pod)
    running["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    state.set_pod(running)
    assert _usage(state) == before
    assert sum(slots for slots, _ in before.values()) == 1


def test_an_edit_of_the_allocation_after_binding_changes_nothing() -> None:
    """A tenant may edit their pod's annotations (where no admission policy stops them):
    the books keep the allocation the pod was bound with, and say so."""
    state = cluster(make_node("n").gpu("GPU-0").gpu("GPU-1"))
    pod = _placed(state)
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    before = _usage(state)
    held = next(uuid for uuid, (slots, _) in before.items() if slots)
    other = "GPU-1" if held == "GPU-0" else "GPU-0"
    for forged in (f"{other},NVIDIA,6000,0:;", f"{held},NVIDIA,1,0:;", ""):
        moved = copy.deepcopy(pod)
        moved["metadata"]["annotations"][nvidia.ALLOCATED_ANNOTATION] = forged
        state.set_pod(moved)
        assert _usage(state) == before
        assert "changed after it was bound" in (state.allocation_warning(key) or "")
    state.set_pod(pod)
    assert state.allocation_warning(key) is None
    assert state.drifted_nodes() == []


def test_a_pod_recreated_under_the_same_name_is_read_afresh() -> None:
    state = cluster(make_node("n").gpu("GPU-0").gpu("GPU-1"))
    pod = _placed(state)
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    state.remove_pod(key)
    again = copy.deepcopy(pod)
    again["metadata"]["uid"] = "another"
    again["metadata"]["annotations"][nvidia.ALLOCATED_ANNOTATION] = "GPU-1,NVIDIA,4000,0:;"
    state.set_pod(again)
    assert _usage(state)["GPU-1"] == (1, 4000)


def test_a_status_update_refreshes_what_preemption_reads() -> None:
    state = cluster(make_node("n").gpu("GPU-0"))
    pod = _placed(state)
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    running = copy.deepcopy(pod)
    running["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    running["metadata"]["labels"] = {"app": "web"}
    state.set_pod(running)
    entry = state.books.pods[key]
    assert entry.started == 1767225600.0
    assert entry.labels == {"app": "web"}


def test_an_ended_or_deleting_pod_is_read_again() -> None:
    state = cluster(make_node("n").gpu("GPU-0"))
    pod = _placed(state)
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    deleting = copy.deepcopy(pod)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    state.set_pod(deleting)
    assert state.books.pods[key].deleting
    ended = copy.deepcopy(deleting)
    ended["status"] = {"phase": "Succeeded"}
    state.set_pod(ended)
    assert all(slots == 0 for slots, _ in _usage(state).values())


def test_a_resized_container_is_read_again() -> None:
    state = cluster(make_node("n").gpu("GPU-0"))
    pod = _placed(state)
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    before = state.books.pods[key].requests
    resized = copy.deepcopy(pod)
    resized["spec"]["containers"][0].setdefault("resources", {}).setdefault("requests", {})[
        "cpu"
    ] = "3"
    state.set_pod(resized)
    assert state.books.pods[key].requests != before
    assert state.books.pods[key].requests.cpu == 3


def test_an_allocation_naming_a_malformed_mig_instance_books_nothing() -> None:
    state = cluster(make_node("n").gpu("GPU-0"))
    pod = (
        make_pod("odd")
        .container(gpu=1, gpumem=1000)
        .on_node("n", "GPU-0[x,NVIDIA,1000,0:;")
        .phase("Running")
        .obj()
    )
    state.set_pod(pod)
    assert "malformed MIG UUID" in (state.allocation_error("default/odd") or "")
    assert _usage(state) == {"GPU-0": (0, 0)}
