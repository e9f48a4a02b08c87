"""Preemption: victim selection and node choice as kube-scheduler's DefaultPreemption,
and the operator-side life of a preemption in the books (hold, wait, timeout, cancel)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from builders import cluster, make_node, make_pod
from defrag_cases import budget as budget_object

from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.preemption import disruption, preemption
from vgpu_operator.scheduling.preemption.preemption import Candidate, Occupant, Victims


def occupant(name: str, priority: int, started: float | None = 0.0, **labels: str) -> Occupant:
    return Occupant(f"default/{name}", priority, started, labels)


def needs_gone(*names: str) -> Callable[[frozenset[str]], bool]:
    """A fit that holds once every named pod has left (and not before)."""
    wanted = {f"default/{n}" for n in names}

    def fits(removed: frozenset[str]) -> bool:
        return wanted <= removed

    return fits


def fits_if_any_gone(*names: str) -> Callable[[frozenset[str]], bool]:
    wanted = {f"default/{n}" for n in names}

    def fits(removed: frozenset[str]) -> bool:
        return bool(wanted & removed)

    return fits


def budget(allowed: int, **labels: str) -> disruption.Budget:
    return disruption.Budget.from_object(
        {
            "metadata": {"namespace": "default", "name": "pdb"},
            "spec": {"selector": {"matchLabels": labels}},
            "status": {"disruptionsAllowed": allowed},
        }
    )


# --- victims on one node ------------------------------------------------------------------


def test_no_candidate_when_even_all_lower_pods_are_not_enough() -> None:
    pods = [occupant("low", 1), occupant("peer", 10)]
    assert preemption.select_victims(10, pods, [], needs_gone("low", "peer")) is None


def test_only_strictly_lower_priorities_are_taken_out() -> None:
    seen: list[frozenset[str]] = []

    def fits(removed: frozenset[str]) -> bool:
        seen.append(removed)
        return True

    preemption.select_victims(10, [occupant("low", 9), occupant("peer", 10)], [], fits)
    assert seen[0] == {"default/low"}


def test_most_important_pods_are_put_back_first() -> None:
    pods = [occupant("b", 1), occupant("a", 5), occupant("c", 1, started=-1.0)]
    victims = preemption.select_victims(10, pods, [], fits_if_any_gone("a", "b", "c"))
    assert victims is not None
    # a (priority 5) goes back first, then c (earlier start than b): b alone is the victim.
    assert [p.key for p in victims.pods] == ["default/b"]
    assert victims.budget_violations == 0


def test_budget_protected_pods_are_put_back_before_more_important_ones() -> None:
    pods = [occupant("guarded", 1, app="db"), occupant("plain", 5)]
    victims = preemption.select_victims(
        10,
        pods,
        [budget(0, app="db")],
        fits_if_any_gone("guarded", "plain"),
    )
    assert victims is not None
    assert [p.key for p in victims.pods] == ["default/plain"]


def test_violations_count_only_protected_victims() -> None:
    pods = [occupant("guarded", 1, app="db"), occupant("plain", 1)]
    victims = preemption.select_victims(
        10,
        pods,
        [budget(0, app="db")],
        needs_gone("guarded", "plain"),
    )
    assert victims is not None
    assert victims.budget_violations == 1
    assert victims.keys == {"default/guarded", "default/plain"}


def test_budget_allows_as_many_disruptions_as_it_says() -> None:
    pods = [disruption.PodIdentity("default", n, {"app": "db"}) for n in ("a", "b", "c")]
    violating, others = disruption.split_by_violation(pods, [budget(2, app="db")])
    assert (violating, others) == ([2], [0, 1])


def test_budget_selects_nothing_without_selector_or_labels() -> None:
    empty = disruption.Budget("default", "x", {}, 0, frozenset())
    assert not empty.covers("default", "p", {"app": "db"})
    assert not budget(0, app="db").covers("default", "p", {})
    assert not budget(0, app="db").covers("other", "p", {"app": "db"})


def test_selector_expressions() -> None:
    selector = {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["db"]}]}
    assert disruption.selector_matches(selector, {"tier": "db"})
    assert not disruption.selector_matches(selector, {"tier": "web"})
    gone = {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}
    assert disruption.selector_matches(gone, {"app": "x"})


# --- choosing the node ----------------------------------------------------------------------


def candidate(node: str, *pods: Occupant, violations: int = 0) -> Candidate:
    return Candidate(node, Victims(tuple(sorted(pods, key=preemption.importance)), violations))


def picked(*candidates: Candidate) -> str | None:
    chosen = preemption.pick_node(candidates)
    return None if chosen is None else chosen.node


def test_node_order_of_criteria() -> None:
    low, mid = occupant("x", 1), occupant("y", 50)
    assert picked(candidate("a", low, violations=1), candidate("b", mid)) == "b"
    assert picked(candidate("a", mid), candidate("b", low)) == "b"
    assert picked(candidate("a", mid, occupant("z", 40)), candidate("b", mid, low)) == "b"
    assert picked(candidate("a", low, occupant("z", 0)), candidate("b", low)) == "b"
    early, late = occupant("e", 1, started=10.0), occupant("l", 1, started=20.0)
    assert picked(candidate("a", early), candidate("b", late)) == "b"
    assert picked(candidate("a", low), candidate("b", low)) == "a"
    assert picked() is None


def test_not_started_counts_as_latest() -> None:
    assert (
        picked(candidate("a", occupant("s", 1, 5.0)), candidate("b", occupant("n", 1, None))) == "b"
    )


def test_negative_priorities_sum_sanely() -> None:
    one = candidate("a", occupant("x", -5), occupant("y", -5))
    assert picked(one, candidate("b", occupant("z", -5))) == "b"


def test_candidate_limit() -> None:
    assert preemption.candidate_limit(3) == 3
    assert preemption.candidate_limit(500) == 100
    assert preemption.candidate_limit(5000) == 100


def test_eligibility_and_priority() -> None:
    assert not preemption.eligible({"spec": {"preemptionPolicy": "Never"}})
    assert preemption.eligible({"spec": {"preemptionPolicy": "PreemptLowerPriority"}})
    assert preemption.priority_of({"spec": {"priority": 7}}) == 7
    assert preemption.priority_of({"spec": {}}) == 0


# --- the books: hold, wait, timeout, cancel --------------------------------------------------


def running(name: str, priority: int, memory: int) -> dict[str, Any]:
    pod = make_pod(name).container(gpu=1, gpumem=memory).on_node("n", f"GPU-0,NVIDIA,{memory},0:;")
    obj = pod.spec("priority", priority).obj()
    obj["metadata"]["uid"] = f"uid-{name}"
    return obj


URGENT = make_pod("urgent").container(gpu=1, gpumem=6000).spec("priority", 1000).obj()
FILLER = make_pod("filler").container(gpu=1, gpumem=2000).spec("priority", 0).obj()


def full_card() -> ClusterState:
    state = cluster(make_node("n").gpu("GPU-0", memory_mib=10000))
    state.preemption_enabled = True
    state.set_pod(running("batch", 1, 9000))
    return state


def test_preemption_holds_the_freed_shares_until_the_victims_leave() -> None:
    state = full_card()
    decision = state.schedule(URGENT, 0)
    assert not decision.scheduled
    assert (decision.nominated_node, decision.victims) == ("n", ("default/batch",))
    assert decision.victim_uids == {"default/batch": "uid-batch"}
    # While the victim terminates, nothing else takes the card, nor is it chosen again.
    assert not state.schedule(FILLER, 1).scheduled
    state.set_pod(running("batch", 1, 9000))  # a routine update of the victim
    other = make_pod("urgent-2").container(gpu=1, gpumem=6000).spec("priority", 1000).obj()
    assert state.schedule(other, 2).victims == ()
    # The preemptor's own updates keep its hold; it waits rather than preempting again.
    state.set_pod(URGENT)
    waiting = state.schedule(URGENT, 3)
    assert (waiting.scheduled, waiting.nominated_node, waiting.victims) == (False, "n", ())
    assert not state.schedule(FILLER, 4).scheduled
    state.remove_pod("default/batch")
    placed = state.schedule(URGENT, 5)
    assert placed.scheduled
    assert placed.node == "n"


def test_hold_ends_when_the_preemptor_is_deleted() -> None:
    state = full_card()
    state.schedule(URGENT, 0)
    state.remove_pod("default/urgent")
    state.remove_pod("default/batch")
    assert state.schedule(FILLER, 1).scheduled


def test_hold_ends_after_the_timeout_and_victims_may_be_chosen_again() -> None:
    state = full_card()
    state.nomination_timeout_s = 10
    state.schedule(URGENT, 0)
    other = make_pod("urgent-2").container(gpu=1, gpumem=6000).spec("priority", 1000).obj()
    again = state.schedule(other, 11)
    assert again.victims == ("default/batch",)


def test_what_a_nomination_waits_for_and_its_timeout_are_handed_to_the_runtime() -> None:
    """Issue 44: a hold that timed out was dropped silently; the runtime now takes each
    (once) with the victims still there, to tell the pod."""
    state = full_card()
    state.nomination_timeout_s = 10
    state.schedule(URGENT, 0)
    wait = state.nomination_wait("default/urgent")
    assert wait is not None
    assert (wait.node, wait.victims, wait.waits) == ("n", ("default/batch",), True)
    assert state.take_expired_nominations(5) == []
    (expired,) = state.take_expired_nominations(11)
    assert (expired.pod, expired.node, expired.victims) == (
        "default/urgent",
        "n",
        ("default/batch",),
    )
    assert state.nomination_wait("default/urgent") is None
    assert state.take_expired_nominations(12) == []  # handed over once


def test_no_preemption_unless_enabled() -> None:
    state = full_card()
    state.preemption_enabled = False
    assert state.schedule(URGENT, 0).nominated_node is None


def test_cancelled_preemption_frees_the_hold() -> None:
    state = full_card()
    state.schedule(URGENT, 0)
    state.rollback("default/urgent")  # a hold is not a Binding's reservation
    assert state.nominated_node("default/urgent") == "n"
    state.cancel_preemption("default/urgent")
    assert state.nominated_node("default/urgent") is None
    assert state.schedule(URGENT, 1).victims == ("default/batch",)


def test_deleting_pod_is_no_victim() -> None:
    state = cluster(make_node("n").gpu("GPU-0", memory_mib=10000))
    state.preemption_enabled = True
    leaving = running("batch", 1, 9000)
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    state.set_pod(leaving)
    decision = state.schedule(URGENT, 0)
    assert (decision.scheduled, decision.victims) == (False, ())


# --- budgets: checked before anything is evicted --------------------------------------------


def labelled(name: str, priority: int, memory: int, **labels: str) -> dict[str, Any]:
    obj = running(name, priority, memory)
    obj["metadata"]["labels"] = labels
    return obj


def db_and_batch(first: tuple[str, int], second: tuple[str, int], allowed: int) -> Any:
    """One 10000 MiB card holding two 4000 MiB pods (``(app, priority)`` each, labelled
    ``app``) and a budget ``db-budget`` over the ``db`` pod allowing ``allowed``
    disruptions; an urgent 9000 MiB pod decided there."""
    state = cluster(make_node("n").gpu("GPU-0", memory_mib=10000))
    state.preemption_enabled = True
    for app, priority in (first, second):
        state.set_pod(labelled(app, priority, 4000, app=app))
    state.set_budget(budget_object("db-budget", {"app": "db"}, allowed))
    urgent = make_pod("urgent").container(gpu=1, gpumem=9000).spec("priority", 1000).obj()
    return state, state.schedule(urgent, 0)


def test_a_preemption_that_needs_a_protected_victim_evicts_nobody() -> None:
    """Two victims are needed and one is protected by a budget that allows no disruption:
    the Eviction API would refuse it after the other was gone, so neither is chosen, and
    the decision says which budget stops it."""
    state, decision = db_and_batch(("db", 1), ("batch", 1), allowed=0)
    assert (decision.scheduled, decision.nominated_node, decision.victims) == (False, None, ())
    assert decision.preemption_blocked is not None
    assert "default/db (PodDisruptionBudget default/db-budget)" in decision.preemption_blocked
    assert "no pod was evicted" in decision.preemption_blocked
    # Nothing was taken out of the books: both still hold the card.
    (row,) = state.device_usage()
    assert row.used_memory_mib == 8000


def test_victims_a_budget_covers_are_evicted_first() -> None:
    """A budget that allows the disruption: the covered victim comes first, so a refusal
    (the budget changed meanwhile) stops the preemption before the others go."""
    _, decision = db_and_batch(("batch", 5), ("db", 1), allowed=1)
    assert decision.nominated_node == "n"
    assert decision.victims == ("default/db", "default/batch")
    assert decision.preemption_blocked is None
