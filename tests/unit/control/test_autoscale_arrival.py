"""A NodeClaim's node arrives for the autoscaler only once it takes pods: until Karpenter
has registered it (its ``karpenter.sh/unregistered`` taint gone), it is a node on its way,
and a pod arriving meanwhile is planned onto the room its planned pods leave free, never
given a NodeClaim of its own (issue 49: a ReplicaSet's late fourth pod got a second
4xL40S while the first, with a spare card, was still tainted)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, cast

from autoscale_cases import L40SX4, claim_unit, dra_books, dra_options, options, share
from builders import cluster, make_node

from vgpu_operator.control import autoscale_claims, autoscale_holds, feed, queue
from vgpu_operator.control.autoscale_catalogue import Catalogue
from vgpu_operator.control.autoscaler import Autoscaler, NodeClaimRequest
from vgpu_operator.control.options import AutoscaleOptions
from vgpu_operator.scheduling.autoscale import search
from vgpu_operator.scheduling.autoscale.whatif import Slot, Unit
from vgpu_operator.scheduling.cycle import ClusterState
from vgpu_operator.scheduling.node_basics import NodeFacts
from vgpu_operator.scheduling.pod_key import PodKey


class _Feed:
    scheduler_name = "vgpu"

    def waiting_for(self, _scheduler: str) -> list[Any]:
        return []

    def pending_pod(self, key: PodKey) -> dict[str, Any] | None:
        namespace, _, name = str(key).partition("/")
        return {"metadata": {"namespace": namespace, "name": name}, "spec": {}}

    def held_for(self, _key: PodKey) -> None:
        pass


class _Queue:
    def is_unschedulable(self, _key: PodKey) -> bool:
        return True

    def wake_one(self, _key: PodKey) -> None:
        pass


def _autoscaler(state: ClusterState) -> Autoscaler:
    return Autoscaler(
        state,
        cast(feed.StateFeed, _Feed()),
        cast(queue.SchedulingQueue, _Queue()),
        None,
        cast(Any, object()),
        Catalogue((L40SX4,)),
        AutoscaleOptions(instance_types=Path("/nonexistent")),
        decides=lambda: True,
        wall_clock=lambda: 100.0,
        sleep=lambda _s: asyncio.sleep(0),
    )


def _node(taints: tuple[str, ...] = (), ready: bool = True) -> Any:
    node = make_node("kwok-1").label(autoscale_claims.CLAIM_LABEL, "claim-a")
    for index in range(4):
        node.gpu(f"card-{index}", index=index, memory_mib=46068, type="NVIDIA-L40S")
    for key in taints:
        node.taint(key, effect="NoExecute")
    return node if ready else node.not_ready()


def test_a_node_karpenter_has_not_registered_is_still_on_its_way() -> None:
    state = cluster()
    scaler = _autoscaler(state)
    (option,) = options((L40SX4,))
    request = NodeClaimRequest("claim-a", option, 90.0, (PodKey("team/p0"),))
    scaler.requests["claim-a"] = request
    _node(("karpenter.sh/unregistered",)).install(state)
    scaler.node_changed("kwok-1")
    # Not arrived: the next plan counts it (with its pods' room) as a node requested.
    assert request.arrived is None
    assert scaler._on_their_way() == [request]
    _node(ready=False).install(state)
    scaler.node_changed("kwok-1")
    assert request.arrived is None
    _node().install(state)
    scaler.node_changed("kwok-1")
    assert request.arrived == "kwok-1"


def test_a_startup_taint_of_the_pool_keeps_the_node_on_its_way() -> None:
    template = {"spec": {"startupTaints": [{"key": "gpu.example/warming", "effect": "NoSchedule"}]}}
    facts = make_node("n").taint("gpu.example/warming").obj()[0]
    tainted = NodeFacts.from_node(facts)
    assert not autoscale_holds.takes_pods(tainted, template)
    assert autoscale_holds.takes_pods(dataclasses.replace(tainted, taints=()), template)
    assert autoscale_holds.takes_pods(tainted, {})


def _pinned(units: list[Unit], claim: str) -> list[Unit]:
    return [dataclasses.replace(u, pinned=claim) for u in units]


def test_a_late_share_is_planned_onto_the_room_a_requested_node_leaves() -> None:
    """Annotation dialect: three 40 GB pods planned on one requested 4xL40S; a fourth
    arriving later goes onto its spare card; a fifth would need a node of its own."""
    books = cluster().books
    (option,) = options((L40SX4,))
    first = [share(f"p{i}", memory_mib=40000) for i in range(3)]
    requested = [Slot("claim-a", option)]
    plan = search.plan(
        books,
        [*_pinned(first, "claim-a"), share("late", memory_mib=40000)],
        [option],
        requested,
        now=0.0,
    )
    assert plan.new == ()
    assert set(plan.where.values()) == {"claim-a"}
    assert len(plan.where) == 4
    more = [share(f"late{i}", memory_mib=40000) for i in range(2)]
    plan = search.plan(books, [*_pinned(first, "claim-a"), *more], [option], requested, now=0.0)
    assert plan.summary() == "1 x gpu-4xl40s"


def test_a_late_claim_is_planned_onto_the_room_a_requested_node_leaves() -> None:
    """Claims dialect: the same with 40 GB claims on a DRA 4xL40S."""
    books = dra_books()
    (option,) = dra_options((L40SX4,))
    first = [claim_unit(books, f"p{i}", memory_mib=40000) for i in range(3)]
    late = claim_unit(books, "late", memory_mib=40000)
    plan = search.plan(
        books, [*_pinned(first, "claim-a"), late], [option], [Slot("claim-a", option)], now=0.0
    )
    assert plan.new == ()
    assert plan.where[late.keys[0]] == "claim-a"


def test_a_node_that_never_takes_pods_is_withdrawn_after_the_timeout() -> None:
    state = cluster()
    scaler = _autoscaler(state)
    (option,) = options((L40SX4,))
    request = NodeClaimRequest("claim-a", option, 90.0, (PodKey("team/p0"),))
    scaler.requests["claim-a"] = request
    _node(ready=False).install(state)
    # Joined (not listed among the claims this round): not gone, not late yet.
    assert scaler._withdrawal(request, None, 100.0) is None
    late = scaler._withdrawal(request, None, 90.0 + 601.0)
    assert late == "NodeClaim claim-a (gpu-4xl40s) did not become a node within 600 s"


class _Arriving(_Feed):
    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []

    def waiting_for(self, _scheduler: str) -> list[Any]:
        return self.pods


def test_pods_still_coming_in_are_planned_together() -> None:
    """Karpenter's batching window: no node is asked for while a new pod was first seen
    less than ``batch_idle_s`` ago, nor past ``batch_max_s`` after the first."""
    arriving = _Arriving()
    scaler = _autoscaler(cluster())
    scaler._feed = cast(feed.StateFeed, arriving)
    settings = scaler._settings
    idle, most = settings.batch_idle_s, settings.batch_max_s
    units = [share("p0", memory_mib=1000)]
    arriving.pods = [{"metadata": {"namespace": "default", "name": "p0"}, "spec": {}}]
    assert scaler._batching(units, 0.0)
    assert not scaler._batching(units, idle)  # quiet for the idle window: plan
    # A pod every half window keeps the batch open only up to batch_max_s.
    now = idle
    while now < most:
        name = f"q{now}"
        arriving.pods.append({"metadata": {"namespace": "default", "name": name}, "spec": {}})
        assert scaler._batching(units, now)
        now += idle / 2
    arriving.pods.append({"metadata": {"namespace": "default", "name": "last"}, "spec": {}})
    assert not scaler._batching(units, most)
    assert not scaler._batching([dataclasses.replace(units[0], pinned="claim-a")], most)
