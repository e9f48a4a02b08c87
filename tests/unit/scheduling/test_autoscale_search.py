"""The autoscaling search: which new nodes hold the waiting pods (``autoscale.search``)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from autoscale_cases import H100X8, L40SX4, ONE80, instance_type, options, share
from builders import bound, cluster, make_node, make_pod

from vgpu_operator.scheduling import gangs
from vgpu_operator.scheduling.autoscale import search, shrink
from vgpu_operator.scheduling.autoscale.whatif import Slot, Unit
from vgpu_operator.scheduling.pod_key import pod_key


def test_one_small_share_gets_the_cheapest_type_that_holds_it() -> None:
    state = cluster()
    plan = search.plan(state.books, [share("a", memory_mib=20000)], options(), now=0.0)
    assert plan.summary() == "1 x gpu-1xa100"
    assert plan.optimal


def test_many_shares_fill_few_nodes() -> None:
    state = cluster()
    units = [share(f"p{i}", memory_mib=40000) for i in range(8)]
    plan = search.plan(state.books, units, options(), now=0.0)
    # 8 x 40 GB: one 8xH100 holds all (two per card), 2 x 4xL40S (one per card) too: one
    # node is fewest.
    assert len(plan.new) == 1
    assert plan.summary() == "1 x gpu-8xh100"
    assert set(plan.where) == {u.keys[0] for u in units}


def test_card_type_rule_is_the_engines() -> None:
    state = cluster()
    unit = share("h", memory_mib=1000, **{"nvidia.com/use-gputype": "H100"})
    plan = search.plan(state.books, [unit], options(), now=0.0)
    assert plan.summary() == "1 x gpu-8xh100"


def test_what_no_type_holds_is_said() -> None:
    state = cluster()
    unit = share("big", memory_mib=100000)
    plan = search.plan(state.books, [unit], options(), now=0.0)
    assert plan.new == ()
    assert unit.key in plan.unplaceable


def test_pool_limit_is_kept() -> None:
    state = cluster()
    units = [share(f"p{i}", memory_mib=40000) for i in range(3)]
    opts = options(limits={"nvidia.com/gpu": Fraction(2)})
    plan = search.plan(state.books, units, opts, now=0.0)
    assert plan.summary() == "2 x gpu-1xa100"
    assert len(plan.unplaceable) == 1


def test_a_gang_is_placed_whole_on_as_many_nodes_as_it_needs() -> None:
    members = []
    for i in range(3):
        pod = make_pod(f"w{i}", "team").container(gpu=1, gpumem=60000).obj()
        pod["spec"]["schedulingGroup"] = {"podGroupName": "train"}
        members.append(pod)
    unit = Unit("team/train", tuple(members), gangs.GroupSpec("team/train", True, 3))
    small = instance_type("one-small", 1, 24576, "NVIDIA L4", 0.5)
    plan = search.plan(cluster().books, [unit], options((small, ONE80)), now=0.0)
    assert plan.summary() == "3 x p-1x80"
    assert sorted(plan.where.values()) == [s.name for s in plan.new]


def test_a_what_if_leaves_the_live_books_as_they_were() -> None:
    state = cluster(make_node("live").gpu("GPU-live", memory_mib=16384))
    before = (dict(state.books.nodes), dict(state.books.pods), state.quota_usage())
    units = [share(f"p{i}", memory_mib=30000) for i in range(5)]
    plan = search.plan(state.books, units, options(), now=0.0)
    assert plan.new
    assert (dict(state.books.nodes), dict(state.books.pods), state.quota_usage()) == before
    assert list(state.books.nodes) == ["live"]


def test_pods_nominated_to_a_requested_node_stay_there_and_a_node_no_pod_needs_goes() -> None:
    opts = options()
    h100 = next(o for o in opts if o.instance_type is H100X8)
    l40s = next(o for o in opts if o.instance_type is L40SX4)
    requested = [Slot("claim-h100", h100), Slot("claim-l40s", l40s)]
    unit = share("a", memory_mib=20000)
    pinned = Unit(unit.key, unit.pods, pinned="claim-l40s")
    plan = search.plan(cluster().books, [pinned], opts, requested, now=0.0)
    assert plan.new == ()
    assert plan.where == {unit.keys[0]: "claim-l40s"}
    assert plan.unused == ("claim-h100",)


# --- scale-down: a node whose pods would all fit elsewhere --------------------------------


def _replica(name: str, memory_mib: int) -> dict[str, Any]:
    pod = make_pod(name, "team").container(gpu=1, gpumem=memory_mib).obj()
    pod["metadata"]["uid"] = f"uid-{name}"
    pod["metadata"]["labels"] = {"app": "rs"}
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "rs",
            "uid": "rs",
            "controller": True,
        }
    ]
    return pod


def _two_nodes_one_pod_each() -> tuple[Any, dict[str, Any]]:
    """Two nodes of two 40 GB cards; five 20 GB pods of a ReplicaSet fill the first (the
    node policy binpacks) and put one on the second; then one pod of the first goes:
    the second's lone pod would fit in its room."""
    state = cluster(
        make_node("a").gpu("GPU-a0", memory_mib=40000).gpu("GPU-a1", memory_mib=40000),
        make_node("b").gpu("GPU-b0", memory_mib=40000).gpu("GPU-b1", memory_mib=40000),
    )
    running = {}
    for name in ("p", "q", "r", "s", "t"):
        pod = _replica(name, 20000)
        placed = bound(pod, state.schedule(pod, 0.0))
        state.set_pod(placed)
        running[pod_key(placed)] = placed
    full = next(n for n in ("a", "b") if sum(_node_of(running, p) == n for p in "pqrst") == 4)
    gone = next(p for p in "pqrst" if _node_of(running, p) == full)
    state.remove_pod(pod_key(running.pop(f"team/{gone}")))
    return state, running


def _node_of(running: dict[str, Any], name: str) -> str:
    return str(running[f"team/{name}"]["spec"]["nodeName"])


def test_a_node_whose_pods_fit_elsewhere_can_be_emptied() -> None:
    state, running = _two_nodes_one_pod_each()
    left = [k.partition("/")[2] for k in running]
    on = {n: [p for p in left if _node_of(running, p) == n] for n in ("a", "b")}
    lone = next(n for n, pods in on.items() if len(pods) == 1)
    other = "b" if lone == "a" else "a"
    out = shrink.empty_node(state, lone, running, 0.0)
    assert isinstance(out, shrink.Emptying), out
    assert out.moves == {f"team/{on[lone][0]}": other}
    assert sorted(state.books.pods) == sorted(running)  # nothing moved live


def test_a_node_is_not_emptied_past_a_budget_or_a_bare_pod() -> None:
    state, running = _two_nodes_one_pod_each()
    nodes = [pod["spec"]["nodeName"] for pod in running.values()]
    lone = next(n for n in ("a", "b") if nodes.count(n) == 1)
    budget = {
        "metadata": {"namespace": "team", "name": "keep"},
        "spec": {"selector": {"matchLabels": {"app": "rs"}}},
        "status": {"disruptionsAllowed": 0},
    }
    state.set_budget(budget)
    out = shrink.empty_node(state, lone, running, 0.0)
    assert isinstance(out, str)
    assert "PodDisruptionBudget" in out
    state, running = _two_nodes_one_pod_each()
    bare = {
        key: {**pod, "metadata": {**pod["metadata"], "ownerReferences": []}}
        for key, pod in running.items()
    }
    out = shrink.empty_node(state, lone, bare, 0.0)
    assert isinstance(out, str)
    assert "may not be moved" in out
