"""Members of a PodGroup as preemption victims (``scheduling.books.group_victims``): one by one
only when the group's ``disruptionMode`` is ``single``; on the DRA path as on the
annotation path (the annotation path: ``test_gangs.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from builders import make_pod
from unit.scheduling.test_claim_books import claim
from unit.scheduling.test_claim_preemption import bound_pod, engine, preemptor

from vgpu_operator import simulation
from vgpu_operator.control.gang_runtime import PodGroupStore
from vgpu_operator.scheduling.books import group_victims
from vgpu_operator.scheduling.gangs import gangs


def _member_of_train(name: str, priority: int) -> dict[str, Any]:
    obj = bound_pod(name, f"c-{name}", priority)
    obj["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    return obj


@pytest.mark.parametrize(("single", "victims"), [(False, ()), (True, ("ns/low",))])
def test_a_claim_pods_group_decides_whether_it_is_a_victim(
    single: bool, victims: tuple[str, ...]
) -> None:
    state = engine()
    held = claim("c-low", "8Gi", allocated=True)
    held["status"]["reservedFor"] = [{"resource": "pods", "name": "low", "uid": "uid-low"}]
    state.set_claim(held)
    if single:
        state.books.single_groups.add("ns/train")
    state.set_pod(_member_of_train("low", 1))
    decision = state.schedule(preemptor(state, "urgent", "6Gi", 100), now=0)
    assert not decision.scheduled
    assert decision.victims == victims


def _pod_group(name: str, mode: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": 2}}}
    if mode is not None:
        spec["disruptionMode"] = mode
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": spec}


@pytest.mark.parametrize(
    ("mode", "one_by_one"),
    [({"single": {}}, True), ({"all": {}}, False), (None, False), ("single", False)],
)
def test_only_disruption_mode_single_lets_members_go_one_by_one(
    mode: Any, one_by_one: bool
) -> None:
    assert group_victims.disrupted_one_by_one(_pod_group("g", mode)) is one_by_one


def test_the_pod_group_store_keeps_the_books_single_groups() -> None:
    books_set: set[str] = set()
    store = PodGroupStore(single_groups=books_set)
    asyncio.run(store.listed([_pod_group("a", {"single": {}}), _pod_group("b", {"all": {}})], "1"))
    assert books_set == {"ml/a"}
    asyncio.run(store.event("MODIFIED", _pod_group("b", {"single": {}})))
    asyncio.run(store.event("MODIFIED", _pod_group("a", {"all": {}})))
    assert books_set == {"ml/b"}
    asyncio.run(store.event("DELETED", _pod_group("b", {"single": {}})))
    assert books_set == set()


@pytest.mark.parametrize(
    ("mode", "victims"),
    [(None, ["ml/w0"]), ({"single": {}}, ["ml/w0"]), ({"all": {}}, [])],
)
def test_simulate_takes_a_member_alone_only_from_a_single_group(
    mode: Any, victims: list[str]
) -> None:
    """``simulate`` reads the modes from ``podGroups``; none named is the API's default,
    ``single``."""
    running = make_pod("w0", "ml").container(gpu=1, gpumem=9000)
    member = running.on_node("n", "GPU-0,NVIDIA,9000,0:;").spec("priority", 1).obj()
    member["spec"]["schedulingGroup"] = {"podGroupName": "g"}
    urgent = make_pod("urgent", "ml").container(gpu=1, gpumem=6000).spec("priority", 1000)
    device = {"id": "GPU-0", "count": 10, "devmem": 10000, "devcore": 100, "type": "NVIDIA"}
    scenario = {
        "nodes": [{"metadata": {"name": "n"}, "devices": [{**device, "numa": 0, "health": True}]}],
        "podGroups": [_pod_group("g", mode)],
        "pods": [member, urgent.obj()],
    }
    decisions = simulation.simulate(scenario)["decisions"]
    assert [d.get("victims", []) for d in decisions] == [victims]


@pytest.mark.parametrize(("own", "preempts"), [(0, False), (100, True)])
def test_a_claim_gang_preempts_with_no_more_than_its_members_own_priority(
    own: int, preempts: bool
) -> None:
    """The DRA dialect: a PodGroup naming a class of priority 100 whose member's own
    priority is 0 preempts nobody (a group never lifts its members, issue 44); a member
    whose own priority is 100 preempts as before."""
    state = engine()
    held = claim("c-low", "8Gi", allocated=True)
    held["status"]["reservedFor"] = [{"resource": "pods", "name": "low", "uid": "uid-low"}]
    state.set_claim(held)
    state.set_pod(bound_pod("low", "c-low", 0))
    member = preemptor(state, "w0", "6Gi", own, schedulingGroup={"podGroupName": "train"})
    group = {
        "metadata": {"name": "train", "namespace": "ns"},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 1}},
            "priorityClassName": "high",
            "priority": 100,
        },
    }
    spec = gangs.read_pod_group(group)
    out = gangs.decide_group(state, spec, "ns/train", [member], {}, now=0)
    assert out.placed == ()
    victims = [v for d in out.preempting for v in d.victims]
    assert victims == (["ns/low"] if preempts else [])
