"""Members of a PodGroup as preemption victims (``scheduling.books.group_victims``): one by one
only when the group's ``disruptionMode`` is ``single``, else with the whole group; the
books' rules and index of members; on the DRA path as on the annotation path (both:
``test_whole_group_victims.py``)."""

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


def test_a_claim_pods_group_member_goes_alone_or_with_its_group() -> None:
    """Two members of ``train`` hold a claim each on the one DRA node; the preemptor needs
    one claim's room: a ``single`` group gives one member, any other the whole group."""
    for mode, count in (("single", 1), ("all", 2)):
        state = engine()
        for name in ("low", "low2"):
            held = claim(f"c-{name}", "4Gi", allocated=True)
            held["status"]["reservedFor"] = [
                {"resource": "pods", "name": name, "uid": f"uid-{name}"}
            ]
            state.set_claim(held)
            state.set_pod(_member_of_train(name, 1))
        state.books.note_pod_group("ns/train", _pod_group("train", {mode: {}}))
        decision = state.schedule(preemptor(state, "urgent", "6Gi", 100), now=0)
        assert not decision.scheduled
        assert len(decision.victims) == count, mode


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


def test_the_pod_group_store_keeps_the_books_groups() -> None:
    store = PodGroupStore()
    books = store.rules
    asyncio.run(store.listed([_pod_group("a", {"single": {}}), _pod_group("b", {"all": {}})], "1"))
    assert set(books.single) == {"ml/a"}
    asyncio.run(store.event("MODIFIED", _pod_group("b", {"single": {}})))
    asyncio.run(store.event("MODIFIED", _pod_group("a", {"all": {}})))
    assert set(books.single) == {"ml/b"}
    assert books.rule("ml/a") == group_victims.GroupRule(one_by_one=False, priority=None)
    asyncio.run(store.event("DELETED", _pod_group("b", {"single": {}})))
    assert set(books.single) == set()
    assert books.rule("ml/b") is None


def test_the_books_find_a_groups_members_on_every_node() -> None:
    """The index by group: members bound, reserved, gone."""
    first = (
        make_pod("w0", "ml").container(gpu=1, gpumem=1000).on_node("n0", "GPU-0,NVIDIA,1000,0:;")
    )
    state = engine()
    books = state.books.groups
    for name, node in (("w0", "n0"), ("w1", "n1")):
        pod = first.obj()
        pod["metadata"]["name"] = name
        pod["spec"]["nodeName"] = node
        pod["spec"]["schedulingGroup"] = {"podGroupName": "g"}
        state.set_pod(pod)
    assert sorted(books.members("ml/g")) == ["ml/w0", "ml/w1"]
    state.remove_pod("ml/w0")
    assert sorted(books.members("ml/g")) == ["ml/w1"]
    state.remove_pod("ml/w1")
    assert list(books.members("ml/g")) == []


@pytest.mark.parametrize(
    ("mode", "victims"),
    [(None, ["ml/w0"]), ({"single": {}}, ["ml/w0"]), ({"all": {}}, ["ml/w0", "ml/w1"])],
)
def test_simulate_takes_a_member_alone_only_from_a_single_group(
    mode: Any, victims: list[str]
) -> None:
    """``simulate`` reads the modes from ``podGroups``; none named is the API's default,
    ``single``; ``all`` takes the member on the other node too."""
    members = []
    for name, node, card in (("w0", "n", "GPU-0"), ("w1", "m", "GPU-1")):
        running = make_pod(name, "ml").container(gpu=1, gpumem=9000)
        member = running.on_node(node, f"{card},NVIDIA,9000,0:;").spec("priority", 1).obj()
        member["spec"]["schedulingGroup"] = {"podGroupName": "g"}
        members.append(member)
    urgent = make_pod("urgent", "ml").container(gpu=1, gpumem=6000).spec("priority", 1000)
    device = {"count": 10, "devmem": 10000, "devcore": 100, "type": "NVIDIA"}
    nodes = [
        {"metadata": {"name": node}, "devices": [{**device, "id": card, "numa": 0, "health": True}]}
        for node, card in (("n", "GPU-0"), ("m", "GPU-1"))
    ]
    scenario = {
        "nodes": nodes,
        "podGroups": [_pod_group("g", mode)],
        "pods": [*members, urgent.obj()],
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
