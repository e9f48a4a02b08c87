"""The holds on the nodes the autoscaler asked for: a pod alone when its node arrives, a
gang only whole (every node of it arrived, every member fits), in either dialect."""

from __future__ import annotations

import copy
from typing import Any

from dra_cluster import NODE, DraCluster

from vgpu_operator.control import autoscale_holds
from vgpu_operator.control.autoscale_holds import Planned
from vgpu_operator.devices import dra
from vgpu_operator.scheduling.defrag.defrag_books import DefragBooks
from vgpu_operator.scheduling.pod_key import PodKey, pod_key


def _pod(name: str, group: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": []}
    if group is not None:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"metadata": {"namespace": "n", "name": name}, "spec": spec}


class _Books:
    """Holds that fit while ``room`` lasts (one unit a pod), and what was released."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.held: list[tuple[str, str]] = []
        self.released: list[PodKey] = []

    def hold(self, pod: Any, node: str) -> bool:
        if self.room == 0:
            return False
        self.room -= 1
        self.held.append((str(pod_key(pod)), node))
        return True

    def release(self, key: PodKey) -> None:
        self.room += 1
        self.released.append(key)


def _hold(pods: list[dict[str, Any]], planned: list[Planned], books: _Books) -> list[PodKey]:
    by_key = {pod_key(p): p for p in pods}
    return autoscale_holds.hold_arrived(
        planned,
        pending=by_key.get,  # type: ignore[arg-type]
        in_books=lambda key: False,
        hold=books.hold,
        release=books.release,
    )


def test_a_pod_alone_is_held_when_its_node_arrives() -> None:
    pods = [_pod("a"), _pod("b")]
    books = _Books(room=10)
    held = _hold(pods, [Planned(PodKey("n/a"), "node-1"), Planned(PodKey("n/b"), None)], books)
    assert held == ["n/a"]
    assert books.held == [("n/a", "node-1")]


def test_a_gang_is_not_held_while_one_of_its_nodes_is_on_its_way() -> None:
    pods = [_pod("g0", "g"), _pod("g1", "g")]
    books = _Books(room=10)
    planned = [Planned(PodKey("n/g0"), "node-1"), Planned(PodKey("n/g1"), None)]
    assert _hold(pods, planned, books) == []
    assert books.held == []
    planned[1] = Planned(PodKey("n/g1"), "node-2")
    assert _hold(pods, planned, books) == ["n/g0", "n/g1"]


def test_a_gang_one_member_of_which_does_not_fit_is_given_back_whole() -> None:
    pods = [_pod("g0", "g"), _pod("g1", "g"), _pod("g2", "g")]
    books = _Books(room=2)
    planned = [Planned(PodKey(f"n/g{i}"), "node-1") for i in range(3)]
    assert _hold(pods, planned, books) == []
    assert books.released == ["n/g0", "n/g1"]
    assert books.room == 2


def _memory(mib: int) -> dict[str, Any]:
    return {"capacity": {"requests": {"memory": f"{mib}Mi"}}}


def test_a_gang_with_claims_is_held_whole_or_not_at_all_on_the_real_books() -> None:
    """The claims dialect's holds: two 30 GB members do not both fit the node's 45 GB card,
    so neither is held and the card stays free; two of 20 GB are both held."""
    cluster = DraCluster()
    books = DefragBooks(cluster.state)

    def hold(members: list[dict[str, Any]]) -> list[PodKey]:
        for pod in members:
            pod["spec"]["schedulingGroup"] = {"podGroupName": "g"}
        return autoscale_holds.hold_arrived(
            [Planned(pod_key(p), NODE) for p in members],
            pending={pod_key(p): p for p in members}.get,  # type: ignore[arg-type]
            in_books=lambda key: cluster.state.nominated_node(key) is not None,
            hold=lambda pod, node: books.hold(pod, node, frozenset(), 1000.0) is not None,
            release=lambda key: books.release(key, frozenset()),
        )

    big = [cluster.claim_pod(f"big{i}", "team", _memory(30000)) for i in range(2)]
    assert hold(big) == []
    assert cluster.decide("probe", "team", _memory(40000)).node == NODE
    cluster.state.remove_pod("team/probe")
    small = [cluster.claim_pod(f"small{i}", "team", _memory(20000)) for i in range(2)]
    assert hold(small) == ["team/small0", "team/small1"]
    assert all(cluster.state.nominated_node(pod_key(p)) == NODE for p in small)


def test_a_slice_that_changes_tells_the_autoscaler_its_node() -> None:
    """A new DRA node has arrived for the autoscaler once its slice is read: the claims
    feed says which node's slice changed (the same slice again says nothing)."""
    cluster = DraCluster()
    told: list[str] = []
    cluster.claims.on_slice_changed = told.append
    card = dra.CardShape("GPU-b", 0, "L40S", "NVIDIA-L40S", 46068, 100, 4, "hami-core")
    published = copy.deepcopy(dict(dra.slice_wire("dra-b", [card], 1, None)))
    published["metadata"]["resourceVersion"] = "7"
    cluster.claims.slice_event("ADDED", published)
    assert told == ["dra-b"]
    again = copy.deepcopy(published)
    again["metadata"]["resourceVersion"] = "8"
    cluster.claims.slice_event("MODIFIED", again)
    assert told == ["dra-b"]
