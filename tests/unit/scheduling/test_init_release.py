"""An init container's share is released once every init container has succeeded, as
``status.initContainerStatuses`` (kubelet's) says, and held again if they run again."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from builders import cluster, make_node, make_pod

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import model
from vgpu_operator.scheduling.books import init_release
from vgpu_operator.scheduling.cycle.cluster import ClusterState

DONE = {"terminated": {"exitCode": 0, "reason": "Completed"}}
FAILED = {"terminated": {"exitCode": 1, "reason": "Error"}}
RUNNING = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}


def _pod(*states: dict[str, Any] | None, init_names: tuple[str, ...] = ("a", "b")) -> Any:
    pod = {"spec": {"initContainers": [{"name": n} for n in init_names], "containers": []}}
    reported = [{"name": n, "state": s} for n, s in zip(init_names, states, strict=False) if s]
    pod["status"] = {"initContainerStatuses": reported}
    return pod


@pytest.mark.parametrize(
    ("pod", "done"),
    [
        pytest.param(_pod(DONE, DONE), True, id="all-succeeded"),
        pytest.param(_pod(DONE, RUNNING), False, id="one-running"),
        pytest.param(_pod(DONE, FAILED), False, id="one-failed"),
        pytest.param(_pod(DONE, None), False, id="one-not-reported"),
        pytest.param(_pod(DONE, DONE, init_names=()), False, id="no-init-containers"),
        pytest.param({"spec": {"initContainers": [{"name": "a"}]}}, False, id="no-status"),
        pytest.param(
            {
                "spec": {"initContainers": [{"name": "a"}]},
                "status": {"initContainerStatuses": [{"name": "a", "state": DONE}, {"name": "a"}]},
            },
            False,
            id="reported-twice-once-without-state",
        ),
        pytest.param(
            {
                "spec": {"initContainers": [{"name": "a"}]},
                "status": {
                    "initContainerStatuses": [
                        {"name": "a", "state": {"terminated": {"exitCode": "0"}}}
                    ]
                },
            },
            False,
            id="exit-code-not-a-number",
        ),
        pytest.param(
            {
                "spec": {"initContainers": [{"name": "a"}]},
                "status": {"initContainerStatuses": "done"},
            },
            False,
            id="statuses-not-a-list",
        ),
    ],
)
def test_init_containers_done(pod: Any, done: bool) -> None:
    assert init_release.init_containers_done(pod) is done


def _usage(state: ClusterState) -> dict[str, tuple[int, int]]:
    return {r.uuid: (r.used_slots, r.used_memory_mib) for r in state.device_usage()}


def _running_with_peak() -> dict[str, Any]:
    """Init container 30000 MiB, app container 10000 MiB, both on GPU-0."""
    pod = (
        make_pod("peak")
        .init_container(gpu=1, gpumem=30000)
        .container(gpu=1, gpumem=10000)
        .on_node("n", "GPU-0,NVIDIA,30000,0:;GPU-0,NVIDIA,10000,0:;")
        .phase("Running")
        .obj()
    )
    pod["status"]["initContainerStatuses"] = [{"name": "init0", "state": RUNNING}]
    return pod


def _with_init_state(pod: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    updated = copy.deepcopy(pod)
    updated["status"]["initContainerStatuses"] = [{"name": "init0", "state": state}]
    return updated


def test_books_release_the_init_peak_when_init_succeeds_and_hold_it_again_on_a_rerun() -> None:
    state = cluster(make_node("n").gpu("GPU-0", memory_mib=40000))
    pod = _running_with_peak()
    state.set_pod(pod)
    assert _usage(state)["GPU-0"] == (1, 30000)
    state.set_pod(_with_init_state(pod, DONE))
    assert _usage(state)["GPU-0"] == (1, 10000)
    assert state.quota_usage() == {"default": {"nvidia.com/gpumem": (10000, 0)}}
    # kubelet recreated the sandbox and runs the init container again: the peak holds.
    state.set_pod(_with_init_state(pod, RUNNING))
    assert _usage(state)["GPU-0"] == (1, 30000)
    assert state.drifted_nodes() == []


def test_a_failed_init_container_keeps_the_peak() -> None:
    state = cluster(make_node("n").gpu("GPU-0", memory_mib=40000))
    state.set_pod(_with_init_state(_running_with_peak(), FAILED))
    assert _usage(state)["GPU-0"] == (1, 30000)


def test_the_release_is_room_freed_for_the_queueing_hints() -> None:
    state = cluster(make_node("n").gpu("GPU-0", memory_mib=40000))
    pod = _running_with_peak()
    state.set_pod(pod)
    state.take_freed()
    state.set_pod(_with_init_state(pod, RUNNING))  # nothing released yet
    assert state.take_freed() == []
    state.set_pod(_with_init_state(pod, DONE))
    assert [(f.node, f.namespace) for f in state.take_freed()] == [("n", "default")]


def test_the_released_share_can_be_placed_again() -> None:
    state = cluster(make_node("n").gpu("GPU-0", memory_mib=40000))
    pod = _running_with_peak()
    state.set_pod(pod)
    waiting = make_pod("next").container(gpu=1, gpumem=25000).obj()
    assert not state.schedule(waiting, now=0.0).scheduled
    state.set_pod(_with_init_state(pod, DONE))
    assert state.schedule(waiting, now=0.0).scheduled


def test_an_init_containers_mig_instance_keeps_its_slices_after_the_release() -> None:
    # HAMi v2.10 keeps every MIG record of a pod until it ends: the init container's
    # instance frees its memory with the release, not its slices.
    config = DeviceConfig.model_validate(
        {
            "nvidia": {
                "knownMigGeometries": [
                    {
                        "models": ["A100-SXM4-40GB"],
                        "allowedGeometries": [
                            [{"name": "3g.20gb", "memory": 20480, "core": 42, "count": 2}]
                        ],
                    }
                ]
            }
        }
    )
    state = cluster(
        make_node("n").gpu("GPU-m", memory_mib=40960, count=2, mode=model.MODE_MIG),
        config=config,
    )
    pod = (
        make_pod("peak")
        .init_container(gpu=1, gpumem=20480)
        .container(gpu=1, gpumem=1000)
        .on_node("n", "GPU-m[0-0],NVIDIA,20480,42:;GPU-m[0-1],NVIDIA,20480,42:;")
        .phase("Running")
        .obj()
    )
    pod["status"]["initContainerStatuses"] = [{"name": "init0", "state": DONE}]
    state.set_pod(pod)
    assert _usage(state)["GPU-m"] == (1, 20480)
    # Both 3g.20gb instances are still taken: nothing else fits on the card.
    waiting = make_pod("next").container(gpu=1, gpumem=1000).obj()
    assert not state.schedule(waiting, now=0.0).scheduled
