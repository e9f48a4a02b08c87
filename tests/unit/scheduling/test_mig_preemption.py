"""MIG claims in DRA preemption (issue 39): a MIG pod that fits nowhere evicts the
lower-priority pods whose instances stand in the way; an instance's counters come back
only when every pod its claim is reserved for is a victim."""

from __future__ import annotations

from typing import Any

from builders import claim_status
from unit.scheduling.test_claim_mig import NODE, claim, instance, pod, state

from vgpu_operator.scheduling.cycle.cluster import ClusterState

Json = dict[str, Any]


def engine() -> ClusterState:
    found = state()  # one A100-40GB in MIG mode: 7 compute slices
    found.preemption_enabled = True
    return found


def running(
    engine: ClusterState, name: str, profile: str, start: int, priority: int, *holders: str
) -> None:
    """A bound pod ``name`` whose claim ``c-<name>`` holds the instance ``profile`` at
    ``start``, reserved for it and ``holders`` too."""
    obj = claim(f"c-{name}", profile=profile)
    obj["status"] = claim_status(
        NODE, instance(profile, start), request="mig", reserved_for=(name, *holders)
    )
    engine.set_claim(obj)
    bound = pod(name, f"c-{name}")
    bound["metadata"]["uid"] = f"uid-{name}"
    bound["spec"]["nodeName"] = NODE
    bound["spec"]["priority"] = priority
    bound["status"] = {"phase": "Running", "startTime": "2026-11-28T10:00:00Z"}
    engine.set_pod(bound)


def preemptor(engine: ClusterState, name: str, profile: str, priority: int) -> Json:
    engine.set_claim(claim(f"c-{name}", profile=profile))
    obj = pod(name, f"c-{name}")
    obj["spec"]["priority"] = priority
    return obj


def test_a_mig_pod_evicts_the_pod_whose_instance_stands_in_the_way() -> None:
    state = engine()
    running(state, "low", "7g.40gb", 0, 1)
    urgent = preemptor(state, "urgent", "1g.5gb", 100)
    decision = state.schedule(urgent, now=0)
    assert not decision.scheduled
    assert decision.nominated_node == NODE
    assert decision.victims == ("ns/low",)
    assert decision.claim_writes == ()  # nothing allocated while the victim runs


def test_the_least_important_instance_goes_and_the_other_is_kept() -> None:
    state = engine()
    running(state, "four", "4g.20gb", 0, 1)
    running(state, "three", "3g.20gb", 4, 5)
    urgent = preemptor(state, "urgent", "3g.20gb", 100)
    # Either instance's slices hold a 3g: the walk keeps the more important one.
    assert state.schedule(urgent, now=0).victims == ("ns/four",)


def test_the_preemptor_gets_the_freed_instance_once_the_claim_is_deallocated() -> None:
    state = engine()
    running(state, "low", "7g.40gb", 0, 1)
    urgent = preemptor(state, "urgent", "3g.20gb", 100)
    assert state.schedule(urgent, now=0).victims == ("ns/low",)
    state.remove_pod("ns/low")
    assert not state.schedule(urgent, now=1).scheduled  # its claim still holds
    state.set_claim(claim("c-low", profile="7g.40gb"))  # deallocated
    # Another pod of no priority does not take the freed slices meanwhile.
    other = preemptor(state, "other", "7g.40gb", 0)
    assert not state.schedule(other, now=1).scheduled
    placed = state.schedule(urgent, now=2)
    assert placed.scheduled
    [write] = placed.claim_writes
    assert write.name == "c-urgent"


def test_an_instance_shared_with_a_more_important_pod_frees_nothing() -> None:
    state = engine()
    running(state, "low", "7g.40gb", 0, 1, "keeper")
    keeper = pod("keeper", "c-low")
    keeper["metadata"]["uid"] = "uid-keeper"
    keeper["spec"]["nodeName"] = NODE
    keeper["spec"]["priority"] = 1000
    keeper["status"] = {"phase": "Running", "startTime": "2026-11-28T10:00:00Z"}
    state.set_pod(keeper)
    decision = state.schedule(preemptor(state, "urgent", "1g.5gb", 100), now=0)
    assert not decision.scheduled
    assert decision.victims == ()
    assert decision.nominated_node is None


def test_an_instance_shared_by_two_lower_pods_is_freed_with_both() -> None:
    state = engine()
    running(state, "a", "7g.40gb", 0, 1, "b")
    second = pod("b", "c-a")
    second["metadata"]["uid"] = "uid-b"
    second["spec"]["nodeName"] = NODE
    second["spec"]["priority"] = 2
    second["status"] = {"phase": "Running", "startTime": "2026-11-28T10:00:00Z"}
    state.set_pod(second)
    decision = state.schedule(preemptor(state, "urgent", "1g.5gb", 100), now=0)
    assert sorted(decision.victims) == ["ns/a", "ns/b"]
