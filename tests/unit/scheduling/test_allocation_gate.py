"""The per-node allocation gate: one GPU pod per node between Binding and the plugin's answer."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from builders import bound, cluster, make_node, make_pod

from vgpu_operator import names
from vgpu_operator.devices import node_lock
from vgpu_operator.scheduling import allocation_gate
from vgpu_operator.scheduling.allocation_gate import GateMode
from vgpu_operator.scheduling.cluster import ClusterState
from vgpu_operator.scheduling.status import Reason

Json = dict[str, Any]


def two_nodes(mode: GateMode = GateMode.BOOKS) -> ClusterState:
    state = cluster(
        make_node("a").gpu("GPU-a0").gpu("GPU-a1"),
        make_node("b").gpu("GPU-b0").gpu("GPU-b1"),
    )
    state.gate_mode = mode
    state.gate_timeout_s = 60.0
    return state


def gpu_pod(name: str) -> Json:
    return make_pod(name, "t").container(gpu=1, gpumem=1024).obj()


def with_phase(pod: Json, phase: str) -> Json:
    out = copy.deepcopy(pod)
    out["metadata"]["annotations"][names.BIND_PHASE] = phase
    return out


def test_a_decided_pod_shuts_its_node_until_the_plugin_answers() -> None:
    state = two_nodes()
    first = state.schedule(gpu_pod("p1"), 100)
    second = state.schedule(gpu_pod("p2"), 100)
    assert first.scheduled
    assert second.scheduled
    assert first.node != second.node
    third = state.schedule(gpu_pod("p3"), 100)
    assert not third.scheduled
    assert third.diagnosis is not None
    assert "2 NodeAllocationInProgress" in third.diagnosis.message()
    # The plugin answered for the first pod: its node takes the next one.
    state.set_pod(with_phase(bound(gpu_pod("p1"), first), "success"))
    fourth = state.schedule(gpu_pod("p3"), 101)
    assert fourth.scheduled
    assert fourth.node == first.node


@pytest.mark.parametrize("answer", ["success", "failed"])
def test_either_answer_opens_the_node(answer: str) -> None:
    state = two_nodes()
    state.set_pod(make_node_pod_bound(state, "p1", "a", 100))
    assert state.gate_holders() == {"a": ["t/p1"]}
    state.set_pod(with_phase(make_node_pod_bound(state, "p1", "a", 100), answer))
    assert state.gate_holders() == {}


def make_node_pod_bound(state: ClusterState, name: str, node: str, at: int) -> Json:
    """A pod as another replica bound it: annotations with bind-phase allocating."""
    pod = gpu_pod(name)
    pod["metadata"]["annotations"] = {
        names.ASSIGNED_NODE: node,
        names.BIND_PHASE: "allocating",
        names.BIND_TIME: str(at),
        names.NVIDIA_DEVICES_ALLOCATED: f"GPU-{node}0,NVIDIA,1024,0:;",
        names.NVIDIA_DEVICES_TO_ALLOCATE: f"GPU-{node}0,NVIDIA,1024,0:;",
    }
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Pending"}
    return pod


def test_gate_is_rebuilt_from_the_pods_annotations() -> None:
    """A restarted operator learns the gates from the bound pods it lists."""
    state = two_nodes()
    state.set_pod(make_node_pod_bound(state, "old", "a", 100))
    decision = state.schedule(gpu_pod("new"), 110)
    assert decision.node == "b"


def test_the_gate_times_out_and_is_reported_once() -> None:
    state = two_nodes()
    state.set_pod(make_node_pod_bound(state, "x", "a", 100))
    state.set_pod(make_node_pod_bound(state, "y", "b", 100))
    assert not state.schedule(gpu_pod("p"), 150).scheduled
    assert state.expired_gates(150) == []
    assert state.expired_gates(161) == [("a", "t/x"), ("b", "t/y")]
    assert state.expired_gates(170) == []
    assert state.schedule(gpu_pod("p"), 161).scheduled


def test_unreadable_bind_time_does_not_shut_the_node_for_good() -> None:
    state = two_nodes()
    pod = make_node_pod_bound(state, "x", "a", 100)
    pod["metadata"]["annotations"][names.BIND_TIME] = "yesterday"
    state.set_pod(pod)
    assert state.gate_holders() == {"a": ["t/x"]}
    assert state.expired_gates(1000) == [("a", "t/x")]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda p: p["metadata"].__setitem__("deletionTimestamp", "x"), id="deleting"),
        pytest.param(lambda p: p["status"].__setitem__("phase", "Failed"), id="failed"),
        pytest.param(lambda p: p["status"].__setitem__("phase", "Succeeded"), id="succeeded"),
    ],
)
def test_a_holder_that_goes_away_opens_the_node(change: Any) -> None:
    state = two_nodes()
    pod = make_node_pod_bound(state, "x", "a", 100)
    state.set_pod(pod)
    change(pod)
    state.set_pod(pod)
    assert state.gate_holders() == {}


def test_a_deleted_holder_opens_the_node() -> None:
    state = two_nodes()
    state.set_pod(make_node_pod_bound(state, "x", "a", 100))
    state.remove_pod("t/x")
    assert state.gate_holders() == {}


def test_rollback_of_a_failed_binding_opens_the_node() -> None:
    state = two_nodes()
    decision = state.schedule(gpu_pod("p1"), 100)
    assert decision.node is not None
    state.rollback("t/p1")
    assert state.gate_holders() == {}


def test_failed_allocation_releases_the_booking() -> None:
    """The plugin refused the pod: kubelet will not start it with these devices."""
    state = two_nodes()
    pod = make_node_pod_bound(state, "x", "a", 100)
    state.set_pod(pod)
    assert any(row.used_slots for row in state.device_usage())
    state.set_pod(with_phase(pod, "failed"))
    assert not any(row.used_slots for row in state.device_usage())


def test_pods_without_devices_neither_wait_nor_shut_nodes() -> None:
    state = two_nodes()
    state.schedule(gpu_pod("p1"), 100)
    state.schedule(gpu_pod("p2"), 100)
    plain = make_pod("plain", "t").container(cpu="100m").obj()
    assert state.schedule(plain, 100).scheduled
    assert set(state.gate_holders()) == {"a", "b"}


def test_off_binds_without_waiting() -> None:
    state = two_nodes(GateMode.OFF)
    nodes = [state.schedule(gpu_pod(f"p{i}"), 100).node for i in range(4)]
    assert None not in nodes


def test_a_gated_node_that_would_not_fit_anyway_says_why() -> None:
    state = two_nodes()
    state.schedule(gpu_pod("p1"), 100)
    state.schedule(gpu_pod("p2"), 100)
    big = make_pod("big", "t").container(gpu=1, gpumem=100_000).obj()
    decision = state.schedule(big, 100)
    assert decision.diagnosis is not None
    reasons = {r for f in decision.diagnosis.node_failures.values() for r in f.reasons}
    assert Reason.NODE_ALLOCATION_IN_PROGRESS not in reasons
    assert Reason.CARD_INSUFFICIENT_MEMORY in reasons


def test_a_gated_node_is_waited_for_not_preempted() -> None:
    """Node a fits once its previous pod has its devices; node b fits only by evicting."""
    state = two_nodes()
    state.preemption_enabled = True
    for i in range(2):
        low = make_node_pod_bound(state, f"low{i}", "b", 100)
        annotations = low["metadata"]["annotations"]
        annotations[names.BIND_PHASE] = "success"
        annotations[names.NVIDIA_DEVICES_ALLOCATED] = f"GPU-b{i},NVIDIA,16384,100:;"
        low["status"]["phase"] = "Running"
        state.set_pod(low)
    state.set_pod(make_node_pod_bound(state, "fresh", "a", 100))
    urgent = make_pod("urgent", "t").container(gpu=1, gpumem=1024).spec("priority", 1000).obj()
    decision = state.schedule(urgent, 101)
    assert not decision.scheduled
    assert decision.victims == ()
    assert decision.nominated_node is None


# --- HAMi's node lock ----------------------------------------------------------------


def test_hami_lock_mode_honours_another_pods_node_lock() -> None:
    state = two_nodes(GateMode.HAMI_LOCK)
    state.set_pod(make_node_pod_bound(state, "holder", "a", 10))
    state.set_pod(with_phase(make_node_pod_bound(state, "holder", "a", 10), "success"))
    locked = make_node("a").gpu("GPU-a0").gpu("GPU-a1")
    locked.annotate(names.NODE_LOCK, node_lock.encode(100, "t", "holder")).install(state)
    state.set_node(locked.obj()[0])
    decision = state.schedule(gpu_pod("p"), 110)
    assert decision.node == "b"
    # Its own lock (a Binding that failed after the lock was taken) does not stop it.
    own = (
        make_node("a")
        .gpu("GPU-a0")
        .gpu("GPU-a1")
        .annotate(names.NODE_LOCK, node_lock.encode(100, "t", "mine"))
    )
    state.set_node(own.obj()[0])
    state.schedule(make_pod("x", "t").container(gpu=1, gpumem=1024).obj(), 110)


def test_books_mode_ignores_the_node_lock() -> None:
    state = two_nodes(GateMode.BOOKS)
    locked = make_node("a").gpu("GPU-a0").gpu("GPU-a1").annotate(names.NODE_LOCK, "garbage")
    state.set_node(locked.obj()[0])
    assert state.schedule(gpu_pod("p"), 110).node == "a"


@pytest.mark.parametrize(
    ("value", "now", "holder"),
    [
        ("2026-01-01T00:00:00Z,t,p", 1767225600 + 10, "t/p"),
        ("2026-01-01T00:00:00Z,t,p", 1767225600 + 400, None),  # expired
        ("2026-01-01T00:00:00Z", 1767225600 + 10, ""),  # legacy, owner-less
        ("not a lock", 1767225600, None),  # unreadable: HAMi retakes it
    ],
)
def test_lock_holder(value: str, now: float, holder: str | None) -> None:
    got = allocation_gate.lock_holder({names.NODE_LOCK: value}, now, 300)
    assert got == holder


def test_node_lock_round_trip() -> None:
    lock = node_lock.decode(node_lock.encode(1767225600, "ns", "pod"))
    assert lock == node_lock.NodeLock(1767225600.0, "ns/pod")
