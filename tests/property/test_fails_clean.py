"""A failed decision changes nothing, and a rollback undoes a reservation completely.

Bulk operations that fail halfway must apply none of their effects (bidict's
``putall_with_bad_item``): a multi-container pod whose second container does not fit
must not leave the first container's cards or quota booked.
"""

from __future__ import annotations

from typing import Any

from builders import make_node, make_pod, resource_quota
from hypothesis import given
from strategies import Replay, Scenario, Schedule, scenarios

from vgpu_operator.config import load_config
from vgpu_operator.scheduling.cycle.cluster import ClusterState


def observable(state: ClusterState) -> Any:
    return state.device_usage(), state.quota_usage(), state.holding_pods()


@given(scenarios())
def test_failed_schedule_leaves_state_unchanged(scenario: Scenario) -> None:
    replay = Replay(scenario.cluster.build())
    for step in scenario.steps:
        before = observable(replay.state)
        decision = replay.apply(step)
        if isinstance(step, Schedule) and decision is not None and not decision.scheduled:
            assert observable(replay.state) == before


@given(scenarios())
def test_rollback_restores_state(scenario: Scenario) -> None:
    replay = Replay(scenario.cluster.build())
    for step in scenario.steps:
        if isinstance(step, Schedule):
            before = observable(replay.state)
            decision = replay.state.schedule(step.pod, 0.0)
            if decision.scheduled:
                replay.state.rollback(decision.pod)
                assert observable(replay.state) == before
                # ...and deciding again gives the same answer as the first time.
                again = replay.state.schedule(step.pod, 0.0)
                assert (again.node, again.devices) == (decision.node, decision.devices)
                replay.state.rollback(again.pod)
        replay.apply(step)


def test_second_container_failing_books_nothing() -> None:
    state = ClusterState(load_config({}))
    make_node("n").gpu("GPU-0", memory_mib=16384).install(state)
    state.set_quota(resource_quota("team", gpumem=30000))
    before = observable(state)
    pod = make_pod("p", "team").container(gpu=1, gpumem=8000).container(gpu=1, gpumem=9000)
    decision = state.schedule(pod.obj(), 0.0)
    assert not decision.scheduled
    assert observable(state) == before
