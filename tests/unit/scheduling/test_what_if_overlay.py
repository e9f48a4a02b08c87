"""What-ifs run on an overlay of the books (issue 34): within one, the planner sees its
changes (a pod out, a replacement in) while the live books, their quota, change log and
freed room stay as they were; on exit nothing is left."""

from __future__ import annotations

from builders import bound, cluster, make_node, make_pod, resource_quota

from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.defrag.defrag_books import DefragBooks, WhatIf


def _running(state: ClusterState, name: str, memory_mib: int) -> str:
    pod = make_pod(name, "team").container(gpu=1, gpumem=memory_mib).obj()
    decision = state.schedule(pod, 0.0)
    assert decision.scheduled
    state.confirm(decision.pod)
    state.set_pod(bound(pod, decision))
    return decision.pod


def test_a_what_if_changes_only_its_overlay() -> None:
    state = cluster(make_node("n").gpu("GPU-0", memory_mib=8192))
    state.set_quota(resource_quota("team", gpumem=10000))
    held = _running(state, "held", 6144)
    state.take_freed()
    live = (state.device_usage(), state.quota_usage(), state.holding_pods())
    seq = state.books.change_log.seq
    books = DefragBooks(state)
    mover = make_pod("mover", "team").container(gpu=1, gpumem=7168).obj()
    with WhatIf(books) as what_if:
        assert not what_if.place(mover, 0.0).scheduled  # the card and the quota are taken
        what_if.take_out(held)
        assert books.entry(held) is None
        assert [c.used_memory_mib for c in books.cards("n")] == [0]
        placed = what_if.place(mover, 0.0)
        assert placed.scheduled, "the overlay frees the card and the quota"
        assert books.entry(placed.pod) is not None
        # Meanwhile the live books are as they were.
        assert (state.device_usage(), state.quota_usage(), state.holding_pods()) == live
        assert state.books.change_log.seq == seq
    assert (state.device_usage(), state.quota_usage(), state.holding_pods()) == live
    assert state.books.change_log.seq == seq
    assert state.take_freed() == [], "a what-if woke nobody"
    assert books.entry(held) is not None
    assert books.entry("team/mover") is None
