"""Gangs (``scheduling.gangs.gangs``): a PodGroup's members placed all together or not at all."""

from __future__ import annotations

from typing import Any

import pytest
from builders import cluster, make_node, make_pod

from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.scheduling.gangs.gangs import GroupError, GroupSpec, decide_group, read_pod_group
from vgpu_operator.scheduling.pod_key import PodKey

ISLAND = "vgpu.io/island"


def pod_group(name: str, policy: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": gangs.API_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"schedulingPolicy": policy, **spec},
    }


def member(name: str, group: str = "train", **container: Any) -> dict[str, Any]:
    pod = make_pod(name, "ml").container(**(container or {"gpu": 1})).obj()
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def booked(state: ClusterState) -> dict[str, tuple[int, int, int]]:
    return {
        row.uuid: (row.used_slots, row.used_memory_mib, row.used_cores)
        for row in state.device_usage()
        if row.used_slots
    }


def gpus(name: str, count: int, island: str | None = None) -> Any:
    node = make_node(name)
    if island is not None:
        node.label(ISLAND, island)
    for i in range(count):
        node.gpu(f"{name}-{i}", memory_mib=16384)
    return node


def test_a_gang_that_fits_is_reserved_whole() -> None:
    state = cluster(gpus("a", 2), gpus("b", 2))
    spec = GroupSpec("ml/train", gang=True, min_count=4)
    pods = [member(f"w{i}", gpumem=4000) for i in range(4)]
    out = decide_group(state, spec, "ml/train", pods, {}, 0.0)
    assert out.reason is None
    assert sorted(d.pod for d in out.placed) == [f"ml/w{i}" for i in range(4)]
    assert all(d.scheduled for d in out.placed)
    assert sum(slots for slots, _, _ in booked(state).values()) == 4


def test_a_gang_that_does_not_fit_whole_holds_nothing() -> None:
    state = cluster(gpus("a", 2), gpus("b", 1))
    state.take_freed()
    spec = GroupSpec("ml/train", gang=True, min_count=4)
    pods = [member(f"w{i}") for i in range(4)]
    out = decide_group(state, spec, "ml/train", pods, {}, 0.0)
    assert out.placed == ()
    assert booked(state) == {}  # the three members that fit were released again
    assert out.reason is not None
    assert "3 of the 4 members" in out.reason
    assert "0/2 nodes are available" in out.reason  # the device counts, as for pods
    assert {d.pod for d in out.waiting} == {f"ml/w{i}" for i in range(4)}
    assert all(d.diagnosis is not None for d in out.waiting)
    assert out.hint is not None
    assert out.hint.verdict is not None
    # Rolling the attempt back freed nothing a waiting pod could use.
    assert state.take_freed() == []


def test_two_gangs_that_each_fit_alone_do_not_deadlock() -> None:
    state = cluster(gpus("a", 3), gpus("b", 3))
    first = GroupSpec("ml/one", gang=True, min_count=4)
    second = GroupSpec("ml/two", gang=True, min_count=4)
    one = [member(f"one-{i}", "one") for i in range(4)]
    two = [member(f"two-{i}", "two") for i in range(4)]
    placed = decide_group(state, first, "ml/one", one, {}, 0.0)
    waits = decide_group(state, second, "ml/two", two, {}, 0.0)
    assert len(placed.placed) == 4
    assert waits.placed == ()
    assert sum(s for s, _, _ in booked(state).values()) == 4  # the second holds nothing
    for decision in placed.placed:  # the first gang leaves: the second now fits whole
        state.remove_pod(decision.pod)
    again = decide_group(state, second, "ml/two", two, {}, 0.0)
    assert len(again.placed) == 4


def test_bound_members_count_toward_min_count() -> None:
    state = cluster(gpus("a", 2))
    spec = GroupSpec("ml/train", gang=True, min_count=4)
    bound: dict[PodKey, str] = {"ml/w0": "x", "ml/w1": "x"}
    out = decide_group(state, spec, "ml/train", [member("w2"), member("w3")], bound, 0.0)
    assert out.reason is None
    assert len(out.placed) == 2
    assert out.needed == 2


def test_later_members_are_placed_one_by_one() -> None:
    state = cluster(gpus("a", 1))
    spec = GroupSpec("ml/train", gang=True, min_count=2)
    bound: dict[PodKey, str] = {"ml/w0": "x", "ml/w1": "x"}
    out = decide_group(state, spec, "ml/train", [member("w2"), member("w3")], bound, 0.0)
    assert [d.pod for d in out.placed] == ["ml/w2"]
    assert [d.pod for d in out.waiting] == ["ml/w3"]


def test_min_count_above_the_members_that_exist_waits_with_a_reason() -> None:
    state = cluster(gpus("a", 8))
    spec = GroupSpec("ml/train", gang=True, min_count=5)
    out = decide_group(state, spec, "ml/train", [member("w0"), member("w1")], {}, 0.0)
    assert out.placed == ()
    assert booked(state) == {}
    assert out.reason == "pod group ml/train waits for its members: minCount 5, 2 exist"
    assert out.hint is None


def test_a_missing_pod_group_and_mixed_schedulers_are_refused() -> None:
    state = cluster(gpus("a", 8))
    missing = decide_group(state, None, "ml/train", [member("w0")], {}, 0.0)
    assert missing.reason == "PodGroup ml/train does not exist"
    assert missing.placed == ()
    spec = GroupSpec("ml/train", gang=True, min_count=1)
    names = ["vgpu-scheduler", "default-scheduler"]
    mixed = decide_group(state, spec, "ml/train", [member("w0")], {}, 0.0, names)
    assert mixed.placed == ()
    assert mixed.reason is not None
    assert "different schedulers (default-scheduler, vgpu-scheduler)" in mixed.reason
    assert booked(state) == {}


def test_basic_policy_places_pod_by_pod() -> None:
    state = cluster(gpus("a", 1))
    spec = GroupSpec("ml/train", gang=False, min_count=1)
    out = decide_group(state, spec, "ml/train", [member("w0"), member("w1")], {}, 0.0)
    assert [d.pod for d in out.placed] == ["ml/w0"]
    assert out.reason is None


def test_topology_keeps_the_group_in_one_domain() -> None:
    state = cluster(gpus("a1", 2, "x"), gpus("a2", 1, "x"), gpus("b1", 2, "y"), gpus("b2", 2, "y"))
    spec = GroupSpec("ml/train", gang=True, min_count=4, topology_key=ISLAND)
    out = decide_group(state, spec, "ml/train", [member(f"w{i}") for i in range(4)], {}, 0.0)
    assert out.reason is None
    assert out.domain == "y"
    assert {d.node for d in out.placed} == {"b1", "b2"}
    # A later member joins the domain of those bound.
    bound = {d.pod: d.node or "" for d in out.placed}
    late = decide_group(
        state, GroupSpec("ml/train", True, 4, ISLAND), "ml/train", [member("w4")], bound, 0.0
    )
    assert late.reason is not None
    assert late.placed == ()


def test_topology_with_no_domain_that_holds_the_group() -> None:
    state = cluster(gpus("a", 2, "x"), gpus("b", 2, "y"))
    spec = GroupSpec("ml/train", gang=True, min_count=3, topology_key=ISLAND)
    out = decide_group(state, spec, "ml/train", [member(f"w{i}") for i in range(3)], {}, 0.0)
    assert out.placed == ()
    assert booked(state) == {}
    assert out.reason is not None
    assert f"in one {ISLAND} domain" in out.reason


def test_release_gives_back_what_a_failed_binding_held() -> None:
    state = cluster(gpus("a", 4))
    spec = GroupSpec("ml/train", gang=True, min_count=2)
    out = decide_group(state, spec, "ml/train", [member("w0"), member("w1")], {}, 0.0)
    state.confirm(out.placed[0].pod)
    gangs.release(state, [out.placed[1].pod])
    assert sum(s for s, _, _ in booked(state).values()) == 1


def test_read_pod_group() -> None:
    spec = read_pod_group(
        pod_group(
            "train",
            {"gang": {"minCount": 3}},
            schedulingConstraints={"topology": [{"key": ISLAND}]},
            disruptionMode={"all": {}},
        )
    )
    assert spec == GroupSpec("ml/train", True, 3, ISLAND, True)
    assert read_pod_group(pod_group("b", {"basic": {}})) == GroupSpec("ml/b", False, 1)
    assert gangs.group_of(member("w0")) == "ml/train"
    assert gangs.group_of(make_pod("p").obj()) is None


@pytest.mark.parametrize(
    ("policy", "extra", "says"),
    [
        ({}, {}, "exactly one of basic, gang"),
        ({"basic": {}, "gang": {"minCount": 1}}, {}, "exactly one of basic, gang"),
        ({"gang": {"minCount": 0}}, {}, "minCount must be a positive integer"),
        ({"gang": {"minCount": "3"}}, {}, "minCount must be a positive integer"),
        ({"gang": "3"}, {}, "minCount must be a positive integer"),
        ({"gang": {"minCount": True}}, {}, "minCount must be a positive integer"),
        (
            {"gang": {"minCount": 1}},
            {"schedulingConstraints": {"topology": [{"key": ""}]}},
            "needs a node label key",
        ),
        (
            {"gang": {"minCount": 1}},
            {"schedulingConstraints": {"topology": [{"key": "a"}, {"key": "b"}]}},
            "at most one topology constraint",
        ),
    ],
)
def test_bad_pod_groups_get_a_reason(
    policy: dict[str, Any], extra: dict[str, Any], says: str
) -> None:
    with pytest.raises(GroupError, match=says):
        read_pod_group(pod_group("bad", policy, **extra))


@pytest.mark.parametrize("mode", [None, "single", "all", "unread"])
def test_a_groups_lone_member_is_a_victim_whatever_the_mode(mode: str | None) -> None:
    """Alone on its card, a member goes whatever its group's mode: one by one
    (``single``), or with its whole group, which is only itself (``all``, or a PodGroup
    not read: evicted whole, never a shield). ``test_whole_group_victims.py`` has groups
    of several members."""
    allocated = "GPU-0,NVIDIA,9000,0:;"
    pod = make_pod("batch").container(gpu=1, gpumem=9000).on_node("n", allocated)
    obj = pod.spec("priority", 1).obj()
    obj["metadata"]["uid"] = "uid-batch"
    if mode is not None:
        obj["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    urgent = make_pod("urgent").container(gpu=1, gpumem=6000).spec("priority", 1000).obj()
    state = cluster(make_node("n").gpu("GPU-0", memory_mib=10000))
    state.preemption_enabled = True
    if mode in ("single", "all"):
        state.books.note_pod_group("default/train", {"spec": {"disruptionMode": {mode: {}}}})
    state.set_pod(obj)
    decision = state.schedule(urgent, 0)
    assert not decision.scheduled
    assert decision.victims == ("default/batch",)


def _batch(name: str, card: str) -> dict[str, Any]:
    pod = make_pod(name).container(gpu=1, gpumem=9000).on_node("n", f"{card},NVIDIA,9000,0:;")
    obj = pod.spec("priority", 1).obj()
    obj["metadata"]["uid"] = f"uid-{name}"
    return obj


def _urgent_member(name: str) -> dict[str, Any]:
    pod = make_pod(name, "ml").container(gpu=1, gpumem=6000).spec("priority", 1000).obj()
    pod["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    return pod


def _two_busy_cards() -> ClusterState:
    state = cluster(make_node("n").gpu("GPU-0", memory_mib=10000).gpu("GPU-1", memory_mib=10000))
    state.preemption_enabled = True
    state.set_pod(_batch("b0", "GPU-0"))
    state.set_pod(_batch("b1", "GPU-1"))
    return state


def test_a_gang_preempts_when_the_whole_gang_then_fits() -> None:
    state = _two_busy_cards()
    spec = GroupSpec("ml/train", gang=True, min_count=2)
    out = decide_group(state, spec, "ml/train", [_urgent_member("w0"), _urgent_member("w1")], {}, 0)
    assert out.placed == ()
    assert sorted(v for d in out.preempting for v in d.victims) == ["default/b0", "default/b1"]
    assert out.reason is not None
    assert "fit once 2 lower-priority pods are preempted" in out.reason
    assert {state.nominated_node(d.pod) for d in out.preempting} == {"n"}


def test_a_gang_does_not_preempt_when_it_would_still_not_fit_whole() -> None:
    state = _two_busy_cards()
    before = booked(state)
    spec = GroupSpec("ml/train", gang=True, min_count=3)
    members = [_urgent_member(f"w{i}") for i in range(3)]
    out = decide_group(state, spec, "ml/train", members, {}, 0)
    assert out.placed == ()
    assert out.preempting == ()
    assert booked(state) == before
    assert all(state.nominated_node(f"ml/w{i}") is None for i in range(3))
    # Nobody was marked for eviction: a single urgent pod may still preempt b0 or b1.
    single = make_pod("solo", "ml").container(gpu=1, gpumem=6000).spec("priority", 1000).obj()
    assert len(state.schedule(single, 0).victims) == 1


def _member_at(name: str, priority: int) -> dict[str, Any]:
    pod = make_pod(name, "ml").container(gpu=1, gpumem=6000).spec("priority", priority).obj()
    pod["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    return pod


def test_a_pod_groups_priority_never_lifts_its_members() -> None:
    """A PodGroup may name a class its namespace's pods may not use (no quota counts
    PodGroups): its members still preempt with their own priority, here 0, and 0 preempts
    nobody (issue 44, item 2)."""
    members = [_member_at("w0", 0), _member_at("w1", 0)]
    plain = GroupSpec("ml/train", gang=True, min_count=2)
    assert decide_group(_two_busy_cards(), plain, "ml/train", members, {}, 0).preempting == ()
    defaulted = read_pod_group(pod_group("train", {"gang": {"minCount": 2}}, priority=0))
    assert defaulted.priority is None  # no class named: each member's own priority
    lifted = read_pod_group(
        pod_group("train", {"gang": {"minCount": 2}}, priority=1000, priorityClassName="hi")
    )
    assert lifted.priority == 1000
    state = _two_busy_cards()
    before = booked(state)
    out = decide_group(state, lifted, "ml/train", members, {}, 0)
    assert out.preempting == ()
    assert out.placed == ()
    assert booked(state) == before


def test_a_pod_groups_lower_priority_lowers_its_members() -> None:
    """Members of priority 1000 in a group that names a class of priority 1: the group's
    is the lower, so they may not preempt the batch pods (priority 1) either."""
    members = [_member_at("w0", 1000), _member_at("w1", 1000)]
    own = GroupSpec("ml/train", gang=True, min_count=2)
    assert len(decide_group(_two_busy_cards(), own, "ml/train", members, {}, 0).preempting) == 2
    low = read_pod_group(
        pod_group("train", {"gang": {"minCount": 2}}, priority=1, priorityClassName="lo")
    )
    assert decide_group(_two_busy_cards(), low, "ml/train", members, {}, 0).preempting == ()


def test_members_preempt_with_the_lower_of_their_own_and_the_groups_priority() -> None:
    """A group of priority 1000 whose members are 1000 preempts as before; a member's own
    priority, where lower than the group's, is the one it preempts with."""
    high = read_pod_group(
        pod_group("train", {"gang": {"minCount": 2}}, priority=1000, priorityClassName="hi")
    )
    members = [_member_at("w0", 1000), _member_at("w1", 1000)]
    assert len(decide_group(_two_busy_cards(), high, "ml/train", members, {}, 0).preempting) == 2
    mixed = [_member_at("w0", 1000), _member_at("w1", 0)]
    assert decide_group(_two_busy_cards(), high, "ml/train", mixed, {}, 0).preempting == ()


def test_a_groups_never_policy_keeps_it_from_preempting() -> None:
    members = [_member_at("w0", 1000), _member_at("w1", 1000)]
    never = read_pod_group(
        pod_group("train", {"gang": {"minCount": 2}}, priority=1000, preemptionPolicy="Never")
    )
    assert decide_group(_two_busy_cards(), never, "ml/train", members, {}, 0).preempting == ()
