"""Verdicts: one per shape of pod that fits nowhere, reused while nothing changed, judged
again where something did."""

from __future__ import annotations

from typing import Any

from builders import bound, make_node, make_pod, resource_quota

from vgpu_operator.config import DeviceConfig
from vgpu_operator.scheduling.cycle.cluster import ClusterState


def _cluster(timeout_s: float | None = None) -> ClusterState:
    state = ClusterState(DeviceConfig(), inventory_timeout_s=timeout_s)
    for name in ("a", "b", "c"):
        make_node(name).gpu(f"GPU-{name}0", memory_mib=16384).install(state, heartbeat=0.0)
    return state


def _huge(name: str) -> dict[str, Any]:
    return make_pod(name, "ns").container(1, 1 << 20, 10).obj()


def test_pods_of_one_shape_share_one_verdict_and_its_diagnosis() -> None:
    state = _cluster()
    first = state.schedule(_huge("huge-1"), 0.0)
    second = state.schedule(_huge("huge-2"), 0.0)
    assert not first.scheduled
    assert not second.scheduled
    assert first.verdict is not None
    assert second.verdict is first.verdict
    # Nothing changed in between: the very same diagnosis, message and all.
    assert second.diagnosis is first.diagnosis
    assert first.diagnosis is not None
    assert first.diagnosis.message() == "0/3 nodes are available: 3 CardInsufficientMemory."


def test_a_different_shape_gets_its_own_verdict() -> None:
    state = _cluster()
    huge = state.schedule(_huge("huge"), 0.0)
    typed = state.schedule(
        make_pod("typed", "ns")
        .container(1, 1024, 10)
        .annotate("nvidia.com/use-gputype", "B200")
        .obj(),
        0.0,
    )
    assert typed.verdict is not huge.verdict
    assert typed.diagnosis is not None
    assert typed.diagnosis.message() == "0/3 nodes are available: 3 CardTypeMismatch."


def test_a_change_is_seen_by_the_next_pod_of_the_shape() -> None:
    state = _cluster()
    holder = make_pod("holder", "ns").container(1, 16000, 10).obj()
    placed = state.schedule(holder, 0.0)
    assert placed.scheduled
    state.confirm(placed.pod)
    big = make_pod("big-1", "ns").container(3, 8000, 10).obj()
    waiting = state.schedule(big, 0.0)
    assert not waiting.scheduled
    assert waiting.diagnosis is not None
    assert waiting.diagnosis.message() == "0/3 nodes are available: 3 NodeInsufficientDevice."
    make_node("d").gpu("GPU-d0").gpu("GPU-d1").gpu("GPU-d2").install(state, heartbeat=0.0)
    twin = make_pod("big-2", "ns").container(3, 8000, 10).obj()
    now_fits = state.schedule(twin, 0.0)
    assert now_fits.scheduled
    assert now_fits.node == "d"


def test_a_release_lets_the_shape_fit_where_it_was_ruled_out() -> None:
    state = _cluster()
    holders = []
    for name in ("a", "b", "c"):
        pod = make_pod(f"holder-{name}", "ns").container(1, 16000, 10).obj()
        decision = state.schedule(pod, 0.0)
        state.confirm(decision.pod)
        holders.append((pod, decision))
    assert not state.schedule(make_pod("w-1", "ns").container(1, 8000, 10).obj(), 0.0).scheduled
    pod, decision = holders[1]
    state.set_pod(bound(pod, decision, phase="Succeeded"))
    again = state.schedule(make_pod("w-2", "ns").container(1, 8000, 10).obj(), 0.0)
    assert again.scheduled
    assert again.node == decision.node


def test_a_stale_node_fits_again_once_its_heartbeat_moves() -> None:
    state = _cluster(timeout_s=60.0)
    pod = make_pod("p", "ns").container(1, 8000, 10).obj()
    stale = state.schedule(pod, 100.0)
    assert not stale.scheduled
    assert stale.diagnosis is not None
    assert stale.diagnosis.message() == "0/3 nodes are available: 3 InventoryStale."
    state.set_heartbeat("b", 95.0)
    fresh = state.schedule(pod, 100.0)
    assert fresh.scheduled
    assert fresh.node == "b"


def test_a_fresh_node_goes_stale_in_the_verdict_as_time_passes() -> None:
    state = _cluster(timeout_s=60.0)
    state.set_heartbeat("a", 50.0)
    state.set_heartbeat("b", 50.0)
    state.set_heartbeat("c", 50.0)
    huge = state.schedule(_huge("huge-1"), 100.0)
    assert huge.diagnosis is not None
    assert huge.diagnosis.message() == "0/3 nodes are available: 3 CardInsufficientMemory."
    later = state.schedule(_huge("huge-2"), 200.0)
    assert later.verdict is huge.verdict
    assert later.diagnosis is not None
    assert later.diagnosis.message() == "0/3 nodes are available: 3 InventoryStale."


def test_fits_now_answers_for_the_node_as_it_is() -> None:
    state = _cluster()
    holder = make_pod("holder", "ns").container(1, 16000, 10).obj()
    placed = state.schedule(holder, 0.0)
    state.confirm(placed.pod)
    for name in ("x", "y"):
        state.confirm(state.schedule(make_pod(name, "ns").container(1, 16000, 10).obj(), 0.0).pod)
    waiting = state.schedule(make_pod("w", "ns").container(1, 8000, 10).obj(), 0.0)
    verdict = waiting.verdict
    assert verdict is not None
    assert placed.node is not None
    assert not state.fits_now(verdict, placed.node, 0.0)
    state.set_pod(bound(holder, placed, phase="Succeeded"))
    assert state.fits_now(verdict, placed.node, 0.0)
    huge = state.schedule(_huge("huge"), 0.0)
    assert huge.verdict is not None
    assert not state.fits_now(huge.verdict, placed.node, 0.0)


def test_room_freed_is_reported_once_net_of_pods_put_back() -> None:
    state = _cluster()
    holder = make_pod("holder", "ns").container(1, 8000, 10).obj()
    placed = state.schedule(holder, 0.0)
    state.confirm(placed.pod)
    state.take_freed()
    state.set_pod(bound(holder, placed))  # its own bound copy: the same shares
    assert state.take_freed() == []
    state.set_pod(bound(holder, placed, phase="Succeeded"))
    freed = state.take_freed()
    assert [(f.node, f.namespace) for f in freed] == [(placed.node, "ns")]
    assert state.take_freed() == []


def test_a_quota_bound_verdict_may_be_helped_by_its_namespace_only() -> None:
    state = _cluster()
    state.set_quota(resource_quota("ns", gpumem=10000))
    holder = make_pod("holder", "ns").container(1, 8000, 10).obj()
    state.confirm(state.schedule(holder, 0.0).pod)
    blocked = state.schedule(make_pod("w", "ns").container(1, 4000, 10).obj(), 0.0)
    assert blocked.diagnosis is not None
    assert "ResourceQuotaNotFit" in blocked.diagnosis.message()
    assert blocked.verdict is not None
    assert state.quota_may_help(blocked.verdict, "ns")
    assert not state.quota_may_help(blocked.verdict, "other")
    unlimited = state.schedule(make_pod("huge", "other").container(1, 1 << 20, 10).obj(), 0.0)
    assert unlimited.verdict is not None
    assert not state.quota_may_help(unlimited.verdict, "other")


def test_a_node_ruled_out_by_quota_alone_when_it_appears_makes_the_verdict_quota_bound() -> None:
    """The pod first failed for another reason on every node (it asks for a card no node
    had); the node with that card appears, and there only the quota stops it: its
    namespace's usage falling must now wake it, though it was not decided again."""
    state = ClusterState(DeviceConfig())
    make_node("a").gpu("GPU-a0", memory_mib=16384).install(state, heartbeat=0.0)
    state.set_quota(resource_quota("ns", gpumem=10000))
    holder = make_pod("holder", "ns").container(1, 8000, 10).obj()
    state.confirm(state.schedule(holder, 0.0).pod)
    wanting = (
        make_pod("w", "ns").container(1, 4000, 10).annotate("nvidia.com/use-gpuuuid", "GPU-d0")
    )
    blocked = state.schedule(wanting.obj(), 0.0)
    assert blocked.verdict is not None
    assert blocked.diagnosis is not None
    assert "ResourceQuotaNotFit" not in blocked.diagnosis.message()
    assert not state.quota_may_help(blocked.verdict, "ns")
    make_node("d").gpu("GPU-d0", memory_mib=16384).install(state, heartbeat=0.0)
    assert not state.fits_now(blocked.verdict, "d", 0.0)
    assert state.quota_may_help(blocked.verdict, "ns")
