"""A node's free-capacity summary: what the index rules out without a Fit.

It must rule out what Fit would refuse (a card with a free slot but no free memory
refuses a whole-GPU request, which asks for 100 % of the card's memory), and never a
node that fits; full nodes leave the index, and a pod that wants no device is still
placed on one.
"""

from __future__ import annotations

from builders import bound, cluster, make_node, make_pod

from vgpu_operator.devices import model
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.dialects.annotation import placement


def _card(uuid: str, used_memory_mib: int, used: int = 1) -> model.DeviceUsage:
    card = model.DeviceUsage.from_info(model.DeviceInfo(uuid, 0, 10, 16384, 100, "A100", 0, True))
    card.used = used
    card.used_memory_mib = used_memory_mib
    return card


def _job(state: ClusterState, pod: dict[str, object]) -> placement.Job:
    return placement.Job.from_pod(pod, state.config, state.vendors, state.quota)


def test_a_card_with_a_free_slot_but_no_memory_takes_no_whole_gpu_request() -> None:
    state = cluster(make_node("n").gpu("GPU-0"))
    whole = _job(state, make_pod("whole").container(gpu=1).obj())
    some_memory = _job(state, make_pod("mib").container(gpu=1, gpumem=1).obj())
    full = placement.Summary.of([_card("GPU-0", used_memory_mib=16384)])
    assert not full.may_fit(whole)
    assert not full.may_fit(some_memory)
    assert not full.has_room()


def test_a_percentage_is_measured_on_each_card() -> None:
    state = cluster(make_node("n").gpu("GPU-0"))
    half = _job(state, make_pod("half").container(gpu=1, percentage=50).obj())
    whole = _job(state, make_pod("whole").container(gpu=1).obj())
    half_free = placement.Summary.of([_card("GPU-0", used_memory_mib=8192)])
    assert half_free.may_fit(half)
    assert not half_free.may_fit(whole)
    assert half_free.has_room()


def test_whole_gpu_pods_fill_every_card_and_the_next_goes_elsewhere() -> None:
    state = cluster(make_node("a").gpu("GPU-a0").gpu("GPU-a1"), make_node("b").gpu("GPU-b0"))
    nodes = []
    for i in range(3):
        pod = make_pod(f"p{i}").container(gpu=1).obj()
        decision = state.schedule(pod, now=0.0)
        assert decision.scheduled
        state.confirm(decision.pod)
        state.set_pod(bound(pod, decision))
        nodes.append(decision.node)
    assert sorted(nodes) == ["a", "a", "b"]
    refused = state.schedule(make_pod("p3").container(gpu=1).obj(), now=0.0)
    assert not refused.scheduled
    # A pod that wants no device still finds a node, full of GPU pods or not.
    plain = state.schedule(make_pod("plain").container(cpu="1").obj(), now=0.0)
    assert plain.scheduled
    assert plain.node in ("a", "b")
