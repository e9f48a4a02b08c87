"""The defragmentation planner: which pods move, where their replacements go, and what
it never does (move what nothing recreates, what matters more, what a budget protects;
change the books)."""

from __future__ import annotations

from typing import Any

from builders import A100_40, cluster, make_node
from defrag_cases import books_fingerprint, budget, running_pod, two_half_full_cards, waiting_pod
from dra_cluster import NODE, DraCluster

from vgpu_operator.config import load_config
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.defrag import defrag
from vgpu_operator.scheduling.defrag.defrag_books import DefragBooks

L40S = "NVIDIA L40S"
GIB = 1024


def state_with(*nodes: Any, pods: list[dict[str, Any]], config: Any = None) -> ClusterState:
    state = cluster(*nodes, config=config)
    for pod in pods:
        state.set_pod(pod)
    return state


def only_plan(report: defrag.Report) -> defrag.Plan:
    assert len(report.plans) == 1, report
    return report.plans[0]


# --- the verdict ----------------------------------------------------------------------------


def test_a_pod_whose_room_is_split_over_cards_is_blocked_by_fragmentation() -> None:
    nodes, pods = two_half_full_cards()
    state = state_with(*nodes, pods=pods)
    books = DefragBooks(state)
    job = books.job(waiting_pod("w", 12 * GIB))
    assert job is not None
    assert not books.fits_somewhere(job, 0.0)
    verdict = defrag.fragmentation(books, job, 0.0)
    # a holds 14 GiB free over two cards; b holds 10 GiB, not enough even pooled.
    assert verdict == defrag.FragmentationVerdict(("a",))


def test_a_pod_bigger_than_the_free_memory_of_any_node_is_not_fragmented() -> None:
    nodes, pods = two_half_full_cards()
    state = state_with(*nodes, pods=pods)
    report = defrag.plan(state, [waiting_pod("w", 15 * GIB)], pods, 0.0)
    assert report.fragmented == ()
    assert report.plans == ()


def test_cards_of_a_type_the_pod_refuses_do_not_count() -> None:
    nodes = [make_node("a").gpu("GPU-a0", memory_mib=16 * GIB).gpu("GPU-a1", type=L40S)]
    pods = [running_pod("p", "a", "GPU-a0", 10 * GIB)]
    state = state_with(*nodes, pods=pods)
    books = DefragBooks(state)
    job = books.job(waiting_pod("w", 12 * GIB, annotations={"nvidia.com/use-gputype": "A100"}))
    assert job is not None
    assert defrag.fragmentation(books, job, 0.0) is None


def test_a_pod_that_fits_needs_no_plan() -> None:
    nodes, pods = two_half_full_cards()
    state = state_with(*nodes, pods=pods)
    assert defrag.plan(state, [waiting_pod("w", 8 * GIB)], pods, 0.0).fragmented == ()


# --- what moves -----------------------------------------------------------------------------


def test_the_plan_moves_the_least_memory_and_says_where_it_fits_again() -> None:
    nodes, pods = two_half_full_cards()
    state = state_with(*nodes, pods=pods)
    plan = only_plan(defrag.plan(state, [waiting_pod("w", 12 * GIB)], pods, 0.0))
    # Moving p8 (8 GiB) frees a1; moving p10 would move more. p8 fits again on b0 only.
    assert [m.pod for m in plan.moves] == ["default/p8"]
    move = plan.moves[0]
    assert (move.from_node, move.from_cards) == ("a", ("GPU-a1",))
    assert (move.to_node, move.to_cards) == ("b", ("GPU-b0",))
    assert (plan.node, plan.cards) == ("a", (("GPU-a1",),))
    assert plan.to_json()["moves"][0]["owner"] == "ReplicaSet/p8-owner"


def test_fewer_evictions_win_over_less_memory() -> None:
    nodes = [
        make_node("a").gpu("GPU-a0", memory_mib=24 * GIB).gpu("GPU-a1", memory_mib=24 * GIB),
        make_node("b").gpu("GPU-b0", memory_mib=24 * GIB),
    ]
    pods = [
        running_pod("big", "a", "GPU-a0", 14 * GIB),  # a0: 10 free
        *(running_pod(f"s{i}", "a", "GPU-a1", 5 * GIB) for i in range(3)),  # a1: 9 free
        running_pod("stays", "b", "GPU-b0", 9 * GIB, priority=100),  # b0: 15 free
    ]
    state = state_with(*nodes, pods=pods)
    # One move of 14 GiB (big to b0) beats two of 5 (two small pods to b0).
    plan = only_plan(defrag.plan(state, [waiting_pod("w", 16 * GIB)], pods, 0.0))
    assert [(m.pod, m.to_node) for m in plan.moves] == [("default/big", "b")]
    assert (plan.evictions, plan.memory_mib) == (1, 14 * GIB)


def test_pods_nothing_recreates_stay_unless_bare_pods_are_allowed() -> None:
    nodes, pods = two_half_full_cards()
    pods = [
        running_pod("p10", "a", "GPU-a0", 10 * GIB, owner=("apps/v1", "DaemonSet")),
        running_pod("p8", "a", "GPU-a1", 8 * GIB, owner=(None, None)),
        running_pod("q6", "b", "GPU-b0", 6 * GIB, priority=100),
    ]
    state = state_with(*nodes, pods=pods)
    w = waiting_pod("w", 12 * GIB)
    report = defrag.plan(state, [w], pods, 0.0)
    assert report.plans == ()
    assert "default/w" in report.unplanned
    allowed = defrag.PlanOptions(allow_bare_pods=True)
    plan = only_plan(defrag.plan(state, [w], pods, 0.0, allowed))
    assert [m.pod for m in plan.moves] == ["default/p8"]
    assert plan.moves[0].replacement is defrag.Replacement.AFTER_GONE


def test_other_controller_kinds_move_when_named() -> None:
    pod = running_pod("p", "a", "GPU-a0", GIB, owner=("example.com/v1", "Trainer"))
    assert defrag.replacement_rule(pod, defrag.PlanOptions()) is None
    named = defrag.PlanOptions(owner_kinds=frozenset({"example.com/Trainer"}))
    assert defrag.replacement_rule(pod, named) is defrag.Replacement.WHILE_TERMINATING
    statefulset = running_pod("s", "a", "GPU-a0", GIB, owner=("apps/v1", "StatefulSet"))
    assert defrag.replacement_rule(statefulset, named) is defrag.Replacement.AFTER_GONE
    # A kind is read with its API group: a ReplicaSet of another group is unknown.
    impostor = running_pod("i", "a", "GPU-a0", GIB, owner=("example.com/v1", "ReplicaSet"))
    assert defrag.replacement_rule(impostor, defrag.PlanOptions()) is None


def test_only_pods_this_operator_placed_move() -> None:
    # HAMi's scheduler is trusted (its allocations are booked), but it, not this
    # operator, would place a replacement: its pod p8 stays, and p10 moves instead.
    nodes, pods = two_half_full_cards()
    trusting = load_config({"scheduler": {"trustedSchedulerNames": ["hami-scheduler"]}})
    pods[1] = running_pod("p8", "a", "GPU-a1", 8 * GIB, scheduler="hami-scheduler")
    state = state_with(*nodes, pods=pods, config=trusting)
    w = waiting_pod("w", 12 * GIB)
    plan = only_plan(defrag.plan(state, [w], pods, 0.0))
    assert [m.pod for m in plan.moves] == ["default/p10"]
    pods[0] = running_pod("p10", "a", "GPU-a0", 10 * GIB, scheduler="hami-scheduler")
    state = state_with(*nodes, pods=pods, config=trusting)
    report = defrag.plan(state, [w], pods, 0.0)
    assert report.fragmented == ("default/w",)
    assert report.plans == ()


def test_pods_of_higher_priority_stay() -> None:
    nodes, pods = two_half_full_cards()
    pods[1] = running_pod("p8", "a", "GPU-a1", 8 * GIB, priority=10)
    state = state_with(*nodes, pods=pods)
    # Equal priority may move: p10 (priority 5, like the pod) is the choice now.
    plan = only_plan(defrag.plan(state, [waiting_pod("w", 12 * GIB, priority=5)], pods, 0.0))
    assert [m.pod for m in plan.moves] == ["default/p10"]


def test_a_budget_with_no_disruption_left_protects_its_pods() -> None:
    nodes, pods = two_half_full_cards()
    pods[1] = running_pod("p8", "a", "GPU-a1", 8 * GIB, labels={"app": "db"})
    state = state_with(*nodes, pods=pods)
    state.set_budget(budget("db", {"app": "db"}, 0))
    plan = only_plan(defrag.plan(state, [waiting_pod("w", 12 * GIB)], pods, 0.0))
    assert [m.pod for m in plan.moves] == ["default/p10"]


def test_a_budget_counts_every_eviction_of_the_plan() -> None:
    nodes = [
        make_node("a").gpu("GPU-a0", memory_mib=24 * GIB).gpu("GPU-a1", memory_mib=24 * GIB),
        make_node("b").gpu("GPU-b0", memory_mib=24 * GIB),
    ]
    web = {"app": "web"}
    pods = [
        running_pod("w1", "a", "GPU-a0", 5 * GIB, labels=web),
        running_pod("w2", "a", "GPU-a0", 5 * GIB, labels=web),
        running_pod("x", "a", "GPU-a0", 6 * GIB, priority=100),  # a0: 8 free
        running_pod("k1", "a", "GPU-a1", 6 * GIB),
        running_pod("k2", "a", "GPU-a1", 6 * GIB),
        running_pod("m", "a", "GPU-a1", 4 * GIB, priority=100),  # a1: 8 free
        running_pod("v", "b", "GPU-b0", 10 * GIB, priority=100),  # b0: 14 free
    ]
    state = state_with(*nodes, pods=pods)
    w = waiting_pod("w", 16 * GIB)
    assert only_plan(defrag.plan(state, [w], pods, 0.0)).moved == {"default/w1", "default/w2"}
    # One web pod may go, not two: the two heavier k pods go instead.
    state.set_budget(budget("web", web, 1))
    assert only_plan(defrag.plan(state, [w], pods, 0.0)).moved == {"default/k1", "default/k2"}


def test_no_plan_beyond_the_eviction_limit() -> None:
    nodes = [
        make_node("a").gpu("GPU-a0", memory_mib=24 * GIB).gpu("GPU-a1", memory_mib=24 * GIB),
        make_node("b").gpu("GPU-b0", memory_mib=24 * GIB),
    ]
    pods = [
        *(running_pod(f"s{i}", "a", f"GPU-a{i % 2}", 2 * GIB) for i in range(18)),
        running_pod("stays", "b", "GPU-b0", 18 * GIB, priority=100),
    ]
    state = state_with(*nodes, pods=pods)
    # Each card of a has 6 GiB free among nine 2 GiB pods: three must go for 12 GiB.
    w = waiting_pod("w", 12 * GIB)
    assert only_plan(defrag.plan(state, [w], pods, 0.0)).evictions == 3
    two = defrag.PlanOptions(max_evictions=2)
    report = defrag.plan(state, [w], pods, 0.0, two)
    assert report.plans == ()
    assert "at most 2 evictions" in report.unplanned["default/w"]


# --- where the replacements go ---------------------------------------------------------------


def test_a_replacement_keeps_its_card_type() -> None:
    nodes = [
        make_node("a").gpu("GPU-a0", memory_mib=16 * GIB).gpu("GPU-a1", memory_mib=16 * GIB),
        make_node("b").gpu("GPU-b0", memory_mib=16 * GIB, type=L40S),
        make_node("c").gpu("GPU-c0", memory_mib=16 * GIB, type=A100_40),
    ]
    picky = {"nvidia.com/use-gputype": "A100"}
    pods = [
        running_pod("p10", "a", "GPU-a0", 10 * GIB, annotations=picky),
        running_pod("p8", "a", "GPU-a1", 8 * GIB, annotations=picky),
        running_pod("c8", "c", "GPU-c0", 8 * GIB),
    ]
    state = state_with(*nodes, pods=pods)
    # b is empty but an L40S: the A100-only pods may go to c only, which has 8 GiB.
    plan = only_plan(defrag.plan(state, [waiting_pod("w", 12 * GIB, annotations=picky)], pods, 0))
    assert [(m.pod, m.to_node) for m in plan.moves] == [("default/p8", "c")]


def test_the_hold_keeps_a_replacement_off_the_card_it_left() -> None:
    binpack = load_config({"scheduler": {"gpuSchedulerPolicy": "binpack"}})
    nodes = [
        make_node("a").gpu("GPU-a0", memory_mib=16 * GIB).gpu("GPU-a1", memory_mib=16 * GIB),
        make_node("b").gpu("GPU-b0", memory_mib=16 * GIB),
    ]
    pods = [
        running_pod("p4", "a", "GPU-a0", 4 * GIB),
        running_pod("p6", "a", "GPU-a0", 6 * GIB),  # a0: 6 free
        running_pod("p8", "a", "GPU-a1", 8 * GIB),  # a1: 8 free
        running_pod("stays", "b", "GPU-b0", 6 * GIB, priority=100),  # b0: 10 free
    ]
    state = state_with(*nodes, pods=pods, config=binpack)
    plan = only_plan(defrag.plan(state, [waiting_pod("w", 12 * GIB)], pods, 0.0))
    # p6 out of a0 frees 12 GiB there: less to move than p8's 8 for a1 (p4 would free
    # only 10). Its replacement, created while p6 terminates, would go back to a0, the
    # busiest card with room, under binpack: the hold on a0 sends it to a1.
    assert [m.pod for m in plan.moves] == ["default/p6"]
    assert plan.cards == (("GPU-a0",),)
    assert plan.moves[0].to_cards == ("GPU-a1",)


def test_exact_search_moves_a_pod_out_of_the_way_of_a_replacement() -> None:
    nodes = [
        make_node("a").gpu("GPU-a0", memory_mib=24 * GIB).gpu("GPU-a1", memory_mib=24 * GIB),
        make_node("b").gpu("GPU-b0", memory_mib=24 * GIB),
        make_node("c").gpu("GPU-c0", memory_mib=24 * GIB),
    ]
    pods = [
        running_pod("p", "a", "GPU-a0", 12 * GIB),  # a0: 12 free, w needs 16
        running_pod("m", "a", "GPU-a1", 20 * GIB, priority=10),  # a1: 4 free
        running_pod("z", "b", "GPU-b0", 10 * GIB, priority=10),
        running_pod("y", "b", "GPU-b0", 4 * GIB),  # b0: 10 free, p needs 12
        running_pod("r", "c", "GPU-c0", 18 * GIB, priority=10),  # c0: 6 free
    ]
    state = state_with(*nodes, pods=pods)
    w = waiting_pod("w", 16 * GIB, priority=5)
    plan = only_plan(defrag.plan(state, [w], pods, 0.0))
    # p fits nowhere until y (4 GiB) leaves b0 for the last 4 GiB of a1: two moves, y
    # first; then p goes to b0.
    assert [(m.pod, m.to_cards) for m in plan.moves] == [
        ("default/y", ("GPU-a1",)),
        ("default/p", ("GPU-b0",)),
    ]
    assert plan.node == "a"
    assert defrag.replay(state, w, "a", ["default/p", "default/y"], pods, 0.0) is None
    # The heuristic moves pods off the target node only: it finds none here.
    assert defrag.plan(state, [w], pods, 0.0, exact=False).plans == ()


# --- several waiting pods, and the books ------------------------------------------------------


def test_a_second_waiting_pod_is_planned_after_the_first_plan() -> None:
    nodes, pods = two_half_full_cards()
    state = state_with(*nodes, pods=pods)
    first = waiting_pod("first", 12 * GIB, priority=10)
    second = waiting_pod("second", 12 * GIB)
    report = defrag.plan(state, [second, first], pods, 0.0)
    # The more important pod first: p8 goes to b0 and a1 is held for it. Then a has 6
    # GiB free on a0 and 4 beside the hold on a1, b 2: not even pooled room for second.
    assert [p.pod for p in report.plans] == ["default/first"]
    assert report.plans[0].moves[0].to_node == "b"
    assert report.fragmented == ("default/first",)
    alone = defrag.plan(state, [second], pods, 0.0)
    assert alone.fragmented == ("default/second",)


def test_planning_leaves_the_books_as_they_were() -> None:
    nodes, pods = two_half_full_cards()
    state = state_with(*nodes, pods=pods)
    before = books_fingerprint(state)
    other = waiting_pod("other", 5 * GIB)
    expected = state_with(*two_half_full_cards()[0], pods=pods).schedule(other, 0.0)
    defrag.plan(state, [waiting_pod("w", 12 * GIB)], pods, 0.0)
    defrag.plan(state, [waiting_pod("w", 12 * GIB)], pods, 0.0, exact=False)
    assert books_fingerprint(state) == before
    decision = state.schedule(other, 0.0)
    assert (decision.node, dict(decision.devices)) == (expected.node, dict(expected.devices))


def test_a_hold_keeps_the_freed_shares_for_the_waiting_pod_until_released() -> None:
    nodes, pods = two_half_full_cards()
    state = state_with(*nodes, pods=pods)
    books = DefragBooks(state)
    w = waiting_pod("w", 12 * GIB)
    held = books.hold(w, "a", frozenset({"default/p8"}), 0.0)
    assert held is not None
    assert held.nominated_node == "a"
    assert held.victim_uids == {"default/p8": "uid-default-p8"}
    state.remove_pod("default/p8")  # evicted and gone
    # a1 now has 16 GiB free, 12 of them held: another 12 GiB pod does not fit there.
    assert not state.schedule(waiting_pod("intruder", 12 * GIB), 0.0).scheduled
    assert state.schedule(w, 0.0).node == "a"
    books.release("default/w", frozenset({"default/p8"}))


def test_a_released_hold_frees_the_shares_and_the_pods_it_waited_for() -> None:
    nodes, pods = two_half_full_cards()
    state = state_with(*nodes, pods=pods)
    books = DefragBooks(state)
    before = books_fingerprint(state)
    assert books.hold(waiting_pod("w", 12 * GIB), "a", frozenset({"default/p8"}), 0.0)
    assert books.is_claimed("default/p8")
    books.release("default/w", frozenset({"default/p8"}))
    assert not books.is_claimed("default/p8")
    assert books_fingerprint(state) == before


# --- planning in steps, and the check before acting ----------------------------------------


def test_planning_in_steps_shows_other_work_the_books_as_they_were_at_every_step() -> None:
    nodes, pods = two_half_full_cards()
    state = state_with(*nodes, pods=pods)
    before = books_fingerprint(state)
    for exact in (True, False):
        steps = defrag.plan_steps(state, [waiting_pod("w", 12 * GIB)], pods, 0.0, exact=exact)
        paused = 0
        while True:
            try:
                next(steps)
            except StopIteration as done:
                report = done.value
                break
            paused += 1
            assert books_fingerprint(state) == before
        assert paused >= 1
        assert [m.pod for m in only_plan(report).moves] == ["default/p8"]
    assert books_fingerprint(state) == before


def test_a_plan_made_out_of_date_is_refused_by_the_recheck() -> None:
    nodes, pods = two_half_full_cards()
    state = state_with(*nodes, pods=pods)
    w = waiting_pod("w", 12 * GIB)
    made = only_plan(defrag.plan(state, [w], pods, 0.0))
    assert defrag.recheck(state, made, w, pods, 0.0) == made
    before = books_fingerprint(state)
    # Room on b0, where p8's replacement was to go, is taken meanwhile.
    intruder = running_pod("intruder", "b", "GPU-b0", 6 * GIB, priority=100)
    state.set_pod(intruder)
    assert defrag.recheck(state, made, w, [*pods, intruder], 0.0) is None
    state.remove_pod("default/intruder")
    # p8 was replaced by a pod of the same name (another uid).
    renewed = running_pod("p8", "a", "GPU-a1", 8 * GIB)
    renewed["metadata"]["uid"] = "uid-new"
    state.set_pod(renewed)
    assert defrag.recheck(state, made, w, [pods[0], renewed, pods[2]], 0.0) is None
    # A budget with no disruption left now covers p8.
    labelled = running_pod("p8", "a", "GPU-a1", 8 * GIB, labels={"app": "p8"})
    state.set_pod(labelled)
    state.set_budget(budget("keep", {"app": "p8"}, 0))
    assert defrag.recheck(state, made, w, [pods[0], labelled, pods[2]], 0.0) is None
    state.remove_budget("default", "keep")
    state.set_pod(pods[1])
    assert defrag.recheck(state, made, w, pods, 0.0) == made
    # The waiting pod was decided meanwhile.
    assert state.schedule(waiting_pod("w", 6 * GIB), 0.0).scheduled
    assert defrag.recheck(state, made, w, pods, 0.0) is None
    state.remove_pod("default/w")
    assert books_fingerprint(state) == before


def test_a_gang_member_is_not_moved_alone() -> None:
    nodes, pods = two_half_full_cards()
    pods[1]["spec"]["schedulingGroup"] = {"podGroupName": "train"}  # p8, the cheapest move
    state = state_with(*nodes, pods=pods)
    plan = only_plan(defrag.plan(state, [waiting_pod("w", 12 * GIB)], pods, 0.0))
    assert [m.pod for m in plan.moves] == ["default/p10"]


def test_a_hold_for_a_pod_with_claims_keeps_the_card_for_it() -> None:
    """The claims dialect's hold (a new node's pods, a defragmentation's move): the pod is
    nominated, its claim's share held, so another claim cannot take it meanwhile; the pod
    itself then gets it."""
    cluster = DraCluster()
    pod = cluster.claim_pod("held", "team", {"capacity": {"requests": {"memory": "30000Mi"}}})
    held = DefragBooks(cluster.state).hold(pod, NODE, frozenset(), 1000.0)
    assert held is not None
    assert held.nominated_node == NODE
    intruder = cluster.decide("intruder", "team", {"capacity": {"requests": {"memory": "30000Mi"}}})
    assert not intruder.scheduled
    assert cluster.state.schedule(pod, 1000.0).node == NODE
    assert DefragBooks(cluster.state).hold(pod, "nowhere", frozenset(), 1000.0) is None
