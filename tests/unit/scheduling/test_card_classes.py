"""Card classes: cards alike in what Fit reads are judged once, and answer as Fit does.

Each case puts an idle card beside a used one of the same model, so that only what the
used card holds tells them apart, and compares the class judgement with the full Fit.
"""

from __future__ import annotations

from typing import Any

import pytest
from builders import make_node, make_pod

from vgpu_operator import names
from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import nvidia
from vgpu_operator.scheduling.cycle import verdicts
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.dialects.annotation import card_classes, placement
from vgpu_operator.scheduling.status import NodeFailure, Reason


def _state_with_one_used_card(
    gpumem: int, gpucores: int, slots: int = 10, other: tuple[int, int] | None = None
) -> ClusterState:
    """Two cards of one model; GPU-a1 holds a pod of (gpumem, gpucores), GPU-a0 holds
    ``other`` (None: nothing)."""
    state = ClusterState(DeviceConfig())
    node = make_node("a")
    for uuid in ("GPU-a0", "GPU-a1"):
        node.gpu(uuid, memory_mib=16384, count=slots)
    node.install(state)
    loads = [("GPU-a1", gpumem, gpucores)]
    if other is not None:
        loads.append(("GPU-a0", *other))
    for at, (uuid, memory, cores) in enumerate(loads):
        load = make_pod(f"load{at}", "ns").container(1, memory, cores)
        load.annotate(nvidia.USE_UUID_ANNOTATION, uuid)
        decision = state.schedule(load.obj(), 0.0)
        assert decision.scheduled
        state.confirm(decision.pod)
    return state


def _judge(state: ClusterState, pod: dict[str, Any]) -> tuple[object, NodeFailure | None]:
    admitted = state.admit(pod)
    job = placement.Job.from_pod(admitted.pod, state.config, state.vendors, state.quota)
    simple = card_classes.Simple.of(job)
    assert simple is not None
    profile = state.cycle.judged.node_profile(
        "a", simple.wants_ids(state.cycle.judged.node_layer("a"))
    )
    assert profile is not None
    outcome = state.cycle.judged.node_fit("a", job, 0.0)
    return simple.judge(profile), None if outcome.ok else verdicts.failure_of(outcome)


@pytest.mark.parametrize(
    ("load", "other", "probe", "policy", "reason"),
    [
        # mutex: a card anyone holds is refused, an idle one of the same model is not.
        pytest.param(
            (1024, 0),
            None,
            (2, 1024, 0),
            "mutex",
            Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
            id="mutex",
        ),
        # 100 cores want a card nobody shares.
        pytest.param(
            (1024, 0),
            None,
            (2, 1024, 100),
            None,
            Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
            id="exclusive-cores",
        ),
        # 0 cores cannot go where every core is booked (the other card holds some).
        pytest.param(
            (1024, 100),
            (1024, 10),
            (2, 1024, 0),
            None,
            Reason.CARD_COMPUTE_UNITS_EXHAUSTED,
            id="cores-exhausted",
        ),
        # Memory: one used card has too little left, the other enough.
        pytest.param(
            (12000, 0),
            (1024, 0),
            (2, 8000, 0),
            None,
            Reason.CARD_INSUFFICIENT_MEMORY,
            id="memory",
        ),
        # Cores: one used card has too few left, the other enough.
        pytest.param(
            (1024, 80),
            (1024, 10),
            (2, 1024, 30),
            None,
            Reason.CARD_INSUFFICIENT_CORE,
            id="cores",
        ),
    ],
)
def test_cards_of_one_model_are_judged_by_what_they_hold(
    load: tuple[int, int],
    other: tuple[int, int] | None,
    probe: tuple[int, int, int],
    policy: str | None,
    reason: Reason,
) -> None:
    state = _state_with_one_used_card(*load, other=other)
    pod = make_pod("probe", "ns").container(*probe)
    if policy is not None:
        pod.annotate(names.GPU_SCHEDULER_POLICY, policy)
    judged, expected = _judge(state, pod.obj())
    assert expected is not None
    assert expected.reasons == {
        reason: 1,
        Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: 1,
    }
    assert judged == expected


def test_a_card_whose_slots_are_all_taken_is_time_slicing_exhausted() -> None:
    state = _state_with_one_used_card(1024, 0, slots=2, other=(1024, 0))
    load = (
        make_pod("load-more", "ns")
        .container(1, 1024, 0)
        .annotate(nvidia.USE_UUID_ANNOTATION, "GPU-a1")
    )
    decision = state.schedule(load.obj(), 0.0)
    assert decision.scheduled
    judged, expected = _judge(state, make_pod("probe", "ns").container(2, 1024, 0).obj())
    assert expected is not None
    assert expected.reasons == {
        Reason.CARD_TIME_SLICING_EXHAUSTED: 1,
        Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: 1,
    }
    assert judged == expected


def test_a_request_larger_than_every_card_could_never_fit() -> None:
    state = _state_with_one_used_card(1024, 0)
    admitted = state.admit(make_pod("huge", "ns").container(1, 1 << 20, 10).obj())
    job = placement.Job.from_pod(admitted.pod, state.config, state.vendors, state.quota)
    simple = card_classes.Simple.of(job)
    assert simple is not None
    profile = state.cycle.judged.node_profile("a", False)
    assert profile is not None
    assert not simple.could_ever(profile)
    fits = card_classes.Simple.of(
        placement.Job.from_pod(
            state.admit(make_pod("small", "ns").container(1, 20000, 10).obj()).pod,
            state.config,
            state.vendors,
            state.quota,
        )
    )
    assert fits is not None
    assert not fits.could_ever(profile)  # 20000 MiB is more than a 16384 MiB card too


def test_identical_idle_nodes_share_one_profile() -> None:
    state = ClusterState(DeviceConfig())
    for name in ("a", "b"):
        make_node(name).gpu(f"GPU-{name}0").gpu(f"GPU-{name}1").install(state)
    first, second = (
        state.cycle.judged.node_profile("a", False),
        state.cycle.judged.node_profile("b", False),
    )
    assert first is not None
    assert second is not None
    assert first == second
    assert first is not second
    assert len(first.classes) == 1
    assert first.classes[0].count == 2


def test_pods_that_depend_on_card_order_are_not_judged_by_classes() -> None:
    state = _state_with_one_used_card(1024, 0)

    def simple(pod: dict[str, Any]) -> object:
        admitted = state.admit(pod)
        job = placement.Job.from_pod(admitted.pod, state.config, state.vendors, state.quota)
        return card_classes.Simple.of(job)

    two_containers = make_pod("two", "ns").container(1, 1024, 0).container(1, 1024, 0)
    numa = (
        make_pod("numa", "ns").container(2, 1024, 0).annotate(nvidia.NUMA_BIND_ANNOTATION, "true")
    )
    assert simple(two_containers.obj()) is None
    assert simple(numa.obj()) is None
    assert simple(make_pod("one", "ns").container(2, 1024, 0).obj()) is not None
