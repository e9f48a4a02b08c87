"""The allocations the books believe: only pods a trusted scheduler bound, within what they
ask for, and the first allocation of each (issue 22's attacks, on the books alone)."""

from __future__ import annotations

from typing import Any

import pytest
from builders import cluster, make_node, make_pod

from vgpu_operator import names
from vgpu_operator.config import load_config
from vgpu_operator.devices import nvidia
from vgpu_operator.scheduling.cycle.cluster import ClusterState

Json = dict[str, Any]


def l40s() -> ClusterState:
    return cluster(make_node("n").gpu("GPU-0", memory_mib=46068).gpu("GPU-1", memory_mib=46068))


def booked(state: ClusterState) -> dict[str, tuple[int, int, int]]:
    return {
        r.uuid: (r.used_slots, r.used_memory_mib, r.used_cores)
        for r in state.device_usage()
        if r.used_slots
    }


def forged(pod: Json, allocation: str, scheduler: str | None = names.SCHEDULER_NAME) -> Json:
    """``pod`` bound to node n with ``allocation`` written by whoever created it."""
    pod["spec"]["nodeName"] = "n"
    if scheduler is not None:
        pod["spec"]["schedulerName"] = scheduler
    pod["metadata"]["annotations"].update(
        {
            names.ASSIGNED_NODE: "n",
            nvidia.ALLOCATED_ANNOTATION: allocation,
            names.BIND_PHASE: "success",
        }
    )
    pod["status"] = {"phase": "Running"}
    return pod


WHOLE = "GPU-0,NVIDIA,46068,100:;"


@pytest.mark.parametrize("scheduler", ["other-scheduler", None])
def test_a_pod_another_scheduler_placed_holds_nothing(scheduler: str | None) -> None:
    """Attack 1: another schedulerName (or the default one), a preset node and
    hand-written annotations."""
    state = l40s()
    pod = forged(make_pod("thief").container(gpu=1).obj(), WHOLE, scheduler)
    state.set_pod(pod)
    assert booked(state) == {}
    assert "not by a scheduler this operator trusts" in (
        state.allocation_error("default/thief") or ""
    )


def test_an_opted_in_scheduler_is_believed() -> None:
    state = l40s()
    state.set_config(load_config({"scheduler": {"trustedSchedulerNames": ["hami-scheduler"]}}))
    pod = forged(make_pod("hami").container(gpu=1).obj(), WHOLE, "hami-scheduler")
    state.set_pod(pod)
    assert booked(state) == {"GPU-0": (1, 46068, 100)}


def test_a_cpu_only_pod_squats_nothing() -> None:
    """Attack 3: no GPU request, an allocation naming every card."""
    state = l40s()
    squat = "GPU-0,NVIDIA,46068,100:GPU-1,NVIDIA,46068,100:;"
    state.set_pod(forged(make_pod("squat").container(cpu="100m").obj(), squat))
    assert booked(state) == {}
    assert "asks for none" in (state.allocation_error("default/squat") or "")


@pytest.mark.parametrize(
    ("container", "allocation", "problem"),
    [
        pytest.param(
            {"gpu": 1},
            "GPU-0,NVIDIA,46068,100:GPU-1,NVIDIA,46068,100:;",
            "holds 2 NVIDIA devices, asks for 1",
            id="more-cards",
        ),
        pytest.param(
            {"gpu": 1, "gpumem": 1024},
            "GPU-0,NVIDIA,46068,0:;",
            "holds 46068 MiB of GPU-0, asks for 1024",
            id="more-memory",
        ),
        pytest.param(
            {"gpu": 1, "gpumem": 1024, "cores": 10},
            "GPU-0,NVIDIA,1024,100:;",
            "holds 100 % of GPU-0's cores, asks for 10",
            id="more-cores",
        ),
    ],
)
def test_an_allocation_beyond_the_request_is_not_booked(
    container: dict[str, Any], allocation: str, problem: str
) -> None:
    state = l40s()
    state.set_pod(forged(make_pod("p").container(**container).obj(), allocation))
    assert booked(state) == {}
    assert problem in (state.allocation_error("default/p") or "")


def test_values_from_defaults_are_not_held_against_running_pods() -> None:
    """Bound under defaultCores 30, the pod holds 30 % although the default is now 0: an
    administrator's change of defaults must not drop what running pods hold."""
    state = l40s()
    pod = forged(make_pod("p").container(gpu=1, gpumem=1024).obj(), "GPU-0,NVIDIA,1024,30:;")
    state.set_pod(pod)
    assert booked(state) == {"GPU-0": (1, 1024, 30)}


def test_an_allocation_within_the_request_is_booked() -> None:
    state = l40s()
    pod = forged(
        make_pod("p").container(gpu=1, gpumem=4096, cores=30).obj(), "GPU-1,NVIDIA,4096,30:;"
    )
    state.set_pod(pod)
    assert booked(state) == {"GPU-1": (1, 4096, 30)}
    assert state.allocation_error("default/p") is None


def test_a_container_without_hami_core_is_booked_as_the_whole_card() -> None:
    """Attack 6, where an administrator allows it: a container that turns HAMi-core off
    is limited by nothing, so the scheduler gives it a whole card, whatever it asked."""
    state = l40s()
    pod = make_pod("raw").container(gpu=1, gpumem=1024, cores=10).obj()
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    decision = state.schedule(pod, 0)
    assert decision.scheduled
    ((device,),) = decision.devices["NVIDIA"]
    assert (device.memory_mib, device.cores) == (46068, 100)
    assert any("booked as whole cards" in warning for warning in decision.warnings)
    other = make_pod("other").container(gpu=1, gpumem=1024).obj()
    assert state.schedule(other, 1).node == "n"
    second = state.schedule(make_pod("o2").container(gpu=1, gpumem=1024).obj(), 2)
    (card,) = {d.uuid for c in second.devices["NVIDIA"] for d in c}
    assert card != device.uuid  # the whole card is not shared


def test_disable_control_false_changes_nothing() -> None:
    state = l40s()
    pod = make_pod("p").container(gpu=1, gpumem=1024, cores=10).obj()
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_DISABLE_CONTROL", "value": "false"}]
    decision = state.schedule(pod, 0)
    ((device,),) = decision.devices["NVIDIA"]
    assert (device.memory_mib, device.cores) == (1024, 10)


def test_a_pod_is_judged_once_as_it_was_bound() -> None:
    """Renaming the scheduler does not take running pods' shares out of the books (they
    hold the cards until they end); a pod first seen after the rename is judged anew."""
    state = l40s()
    pod = forged(make_pod("old").container(gpu=1).obj(), WHOLE)
    state.set_pod(pod)
    state.set_config(load_config({"scheduler": {"schedulerName": "renamed"}}))
    pod["status"]["startTime"] = "2026-01-01T00:00:00Z"  # a status update
    pod["metadata"]["labels"] = {"touched": "yes"}
    state.set_pod(pod)
    assert booked(state) == {"GPU-0": (1, 46068, 100)}
    late = forged(make_pod("late").container(gpu=1).obj(), "GPU-1,NVIDIA,46068,100:;")
    state.set_pod(late)
    assert "GPU-1" not in booked(state)


def test_a_refusal_is_reconsidered_when_the_config_arrives() -> None:
    """After a restart the pods may be listed before the device config: a pod refused
    under the default scheduler name is booked once the config naming it is in force."""
    state = l40s()
    pod = forged(make_pod("early").container(gpu=1).obj(), WHOLE, scheduler="team-scheduler")
    state.set_pod(pod)
    assert booked(state) == {}
    state.set_config(load_config({"scheduler": {"schedulerName": "team-scheduler"}}))
    assert booked(state) == {"GPU-0": (1, 46068, 100)}
    assert state.allocation_error("default/early") is None
