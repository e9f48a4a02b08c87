"""The autoscaling search: which new nodes hold the waiting pods (``autoscale.search``)."""

from __future__ import annotations

from fractions import Fraction

from autoscale_cases import H100X8, L40SX4, ONE80, instance_type, options, share
from builders import cluster, make_node, make_pod

from vgpu_operator.scheduling import gangs
from vgpu_operator.scheduling.autoscale import search
from vgpu_operator.scheduling.autoscale.whatif import Slot, Unit


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
