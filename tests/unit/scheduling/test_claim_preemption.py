"""Preemption on the DRA path (issue 35): victims are the pods whose claims' shares stand
in the way on one node; a claim is released only when every pod it is reserved for is a
victim; the preemptor's claims are allocated only once the victims are gone and their
claims no longer hold, the freed shares held for it meanwhile."""

from __future__ import annotations

from typing import Any

from unit.scheduling.test_claim_books import NODE, claim, pod, state, used_memory

from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cycle.cluster import ClusterState

Json = dict[str, Any]


def engine() -> ClusterState:
    found = state()  # one card: 10240 MiB, 100 cores, 4 shares
    found.preemption_enabled = True
    return found


def running(engine: ClusterState, name: str, memory: str, priority: int, *holders: str) -> None:
    """A bound pod ``name`` (priority ``priority``) using claim ``c-<name>`` of ``memory``,
    allocated and reserved for it and ``holders`` (other pods' names) too."""
    obj = claim(f"c-{name}", memory, allocated=True)
    obj["status"]["reservedFor"] = [
        {"resource": "pods", "name": n, "uid": f"uid-{n}"} for n in (name, *holders)
    ]
    engine.set_claim(obj)
    engine.set_pod(bound_pod(name, f"c-{name}", priority))


def bound_pod(name: str, claim_name: str, priority: int, started: float = 0.0) -> Json:
    obj = pod(name, claim_name)
    obj["spec"]["nodeName"] = NODE
    obj["spec"]["priority"] = priority
    obj["status"] = {"phase": "Running", "startTime": "2026-11-28T10:00:00Z"}
    return obj


def preemptor(engine: ClusterState, name: str, memory: str, priority: int, **spec: Any) -> Json:
    engine.set_claim(claim(f"c-{name}", memory))
    obj = pod(name, f"c-{name}")
    obj["spec"]["priority"] = priority
    obj["spec"].update(spec)
    return obj


def deallocated(name: str, memory: str) -> Json:
    obj = claim(f"c-{name}", memory)
    obj["metadata"]["resourceVersion"] = "2"
    return obj


def test_a_higher_priority_claim_evicts_the_pod_whose_share_stands_in_the_way() -> None:
    state = engine()
    running(state, "low", "8Gi", 1)
    urgent = preemptor(state, "urgent", "6Gi", 100)
    decision = state.schedule(urgent, now=0)
    assert not decision.scheduled
    assert decision.nominated_node == NODE
    assert decision.victims == ("ns/low",)
    assert decision.victim_uids == {"ns/low": "uid-low"}
    assert decision.claim_writes == ()  # nothing allocated while the victim runs


def test_the_preemptor_waits_for_its_victims_claim_to_be_released_then_is_allocated() -> None:
    state = engine()
    running(state, "low", "8Gi", 1)
    urgent = preemptor(state, "urgent", "6Gi", 100)
    assert state.schedule(urgent, now=0).victims == ("ns/low",)
    # The victim's pod is gone, but its claim is still allocated: wait, do not preempt.
    state.remove_pod("ns/low")
    waiting = state.schedule(urgent, now=1)
    assert waiting.nominated_node == NODE
    assert waiting.victims == ()
    assert not waiting.scheduled
    # The claim controller deallocates it: the preemptor's claim is allocated now.
    state.set_claim(deallocated("low", "8Gi"))
    placed = state.schedule(urgent, now=2)
    assert placed.scheduled
    assert placed.node == NODE
    [write] = placed.claim_writes
    assert write.allocation is not None
    assert write.name == "c-urgent"


def test_the_freed_shares_are_held_for_the_preemptor_meanwhile() -> None:
    state = engine()
    running(state, "low", "8Gi", 1)
    urgent = preemptor(state, "urgent", "6Gi", 100)
    state.schedule(urgent, now=0)
    state.remove_pod("ns/low")
    state.set_claim(deallocated("low", "8Gi"))
    # A pod of no priority that would fit in the freed room does not take it.
    other = preemptor(state, "other", "6Gi", 0)
    assert not state.schedule(other, now=1).scheduled
    assert used_memory(state) == 6 * 1024
    assert state.schedule(urgent, now=2).scheduled


def test_cancelling_the_preemption_releases_the_held_shares() -> None:
    state = engine()
    running(state, "low", "8Gi", 1)
    urgent = preemptor(state, "urgent", "6Gi", 100)
    state.schedule(urgent, now=0)
    assert used_memory(state) == 14 * 1024  # the victim's share and the preemptor's hold
    state.cancel_preemption("ns/urgent")
    assert used_memory(state) == 8 * 1024


def test_the_fewest_victims_are_taken_and_the_others_put_back() -> None:
    state = engine()
    running(state, "small", "2Gi", 1)
    running(state, "big", "6Gi", 1)
    urgent = preemptor(state, "urgent", "6Gi", 100)
    assert state.schedule(urgent, now=0).victims == ("ns/big",)


def test_a_shared_claim_is_released_only_when_all_its_pods_are_victims() -> None:
    state = engine()
    running(state, "low-a", "8Gi", 1, "low-b")
    state.set_pod(bound_pod("low-b", "c-low-a", 1))
    urgent = preemptor(state, "urgent", "6Gi", 100)
    assert set(state.schedule(urgent, now=0).victims) == {"ns/low-a", "ns/low-b"}


def test_a_claim_shared_with_a_more_important_pod_frees_nothing() -> None:
    state = engine()
    running(state, "low", "8Gi", 1, "peer")
    state.set_pod(bound_pod("peer", "c-low", 100))
    urgent = preemptor(state, "urgent", "6Gi", 100)
    decision = state.schedule(urgent, now=0)
    assert decision.nominated_node is None
    assert decision.victims == ()


def test_a_claim_reserved_for_nobody_is_no_ones_to_free() -> None:
    state = engine()
    obj = claim("c-orphan", "8Gi", allocated=True)
    obj["status"]["reservedFor"] = []
    state.set_claim(obj)
    state.set_pod(bound_pod("low", "c-orphan", 1))
    urgent = preemptor(state, "urgent", "6Gi", 100)
    assert state.schedule(urgent, now=0).victims == ()


def test_a_whole_card_claim_is_freed_whole() -> None:
    state = engine()
    obj = claim("c-whole", "1Gi", allocated=True)
    config = {"opaque": {"driver": dra.DRIVER, "parameters": {"hamiCore": False}}}
    obj["status"]["allocation"]["devices"]["config"] = [{"source": "FromClaim", **config}]
    obj["status"]["reservedFor"] = [{"resource": "pods", "name": "low", "uid": "uid-low"}]
    state.set_claim(obj)
    state.set_pod(bound_pod("low", "c-whole", 1))
    assert used_memory(state) == 10240  # nothing limits it: the card is its
    urgent = preemptor(state, "urgent", "9Gi", 100)
    assert state.schedule(urgent, now=0).victims == ("ns/low",)


def test_equal_priority_and_preemption_policy_never_preempt_nobody() -> None:
    state = engine()
    running(state, "low", "8Gi", 5)
    peer = preemptor(state, "peer", "6Gi", 5)
    assert state.schedule(peer, now=0).victims == ()
    never = preemptor(state, "never", "6Gi", 100, preemptionPolicy="Never")
    assert state.schedule(never, now=0).victims == ()


def test_a_budget_that_protects_the_only_victim_blocks_the_preemption() -> None:
    state = engine()
    running(state, "low", "8Gi", 1)
    low = bound_pod("low", "c-low", 1)
    low["metadata"]["labels"] = {"app": "batch"}
    state.set_pod(low)
    state.set_budget(
        {
            "metadata": {"namespace": "ns", "name": "batch"},
            "spec": {"selector": {"matchLabels": {"app": "batch"}}},
            "status": {"disruptionsAllowed": 0},
        }
    )
    decision = state.schedule(preemptor(state, "urgent", "6Gi", 100), now=0)
    assert decision.victims == ()
    assert decision.preemption_blocked is not None
    assert "ns/low (PodDisruptionBudget ns/batch)" in decision.preemption_blocked


def test_no_preemption_unless_enabled() -> None:
    state = engine()
    state.preemption_enabled = False
    running(state, "low", "8Gi", 1)
    assert state.schedule(preemptor(state, "urgent", "6Gi", 100), now=0).victims == ()


def test_a_pod_the_engine_placed_keeps_its_priority_before_its_bound_copy_comes_back() -> None:
    state = engine()
    first = preemptor(state, "first", "8Gi", 100)
    first["metadata"]["uid"] = "uid-first"
    assert state.schedule(first, now=0).scheduled
    state.confirm("ns/first")  # bound; the watch has not brought the bound copy yet
    peer = preemptor(state, "peer", "6Gi", 100)
    assert state.schedule(peer, now=1).victims == ()
