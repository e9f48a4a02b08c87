"""The per-node allocation gate: one GPU pod per node between Binding and the plugin's answer."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from builders import bound, cluster, make_node, make_pod

from vgpu_operator import names
from vgpu_operator.devices import node_lock, nvidia
from vgpu_operator.scheduling.books import allocation_gate
from vgpu_operator.scheduling.books.allocation_gate import GateMode
from vgpu_operator.scheduling.cycle.cluster import ClusterState

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


def confirmed(state: ClusterState, name: str) -> Json:
    """Decide and bind ``name``: the bound copy, bind-phase allocating."""
    decision = state.schedule(gpu_pod(name), 100)
    assert decision.scheduled
    state.confirm(f"t/{name}")
    pod = bound(gpu_pod(name), decision, phase="Pending")
    state.set_pod(pod)
    return pod


def test_the_gate_delays_bindings_never_decisions() -> None:
    """Placement is what it would be without the gate (binpack packs); only the
    Binding of the second pod waits for the first pod's devices."""
    state = two_nodes()
    first = confirmed(state, "p1")
    second = state.schedule(gpu_pod("p2"), 100)
    assert second.scheduled
    assert second.node == first["spec"]["nodeName"]
    node = str(second.node)
    assert not state.bind_gate_open(node, "t/p2", 101)
    assert state.bind_gate_open("b", "t/p2", 101)
    state.set_pod(with_phase(first, "success"))
    assert state.bind_gate_open(node, "t/p2", 101)


def test_decided_but_unbound_pods_do_not_shut_the_gate() -> None:
    state = two_nodes()
    state.schedule(gpu_pod("p1"), 100)  # reserved, its Binding not written yet
    assert state.bind_gate_open("a", "t/p2", 100)
    assert state.gate_holders() == {"a": ["t/p1"]}


@pytest.mark.parametrize("answer", ["success", "failed"])
def test_either_answer_opens_the_node(answer: str) -> None:
    state = two_nodes()
    state.set_pod(bound_by_another(state, "p1", "a", 100))
    assert state.gate_holders() == {"a": ["t/p1"]}
    assert not state.bind_gate_open("a", "t/x", 110)
    state.set_pod(with_phase(bound_by_another(state, "p1", "a", 100), answer))
    assert state.gate_holders() == {}
    assert state.bind_gate_open("a", "t/x", 110)


def bound_by_another(state: ClusterState, name: str, node: str, at: int) -> Json:
    """A pod as another replica bound it: annotations with bind-phase allocating."""
    pod = gpu_pod(name)
    pod["metadata"]["annotations"] = {
        names.ASSIGNED_NODE: node,
        names.BIND_PHASE: "allocating",
        names.BIND_TIME: str(at),
        nvidia.ALLOCATED_ANNOTATION: f"GPU-{node}0,NVIDIA,1024,0:;",
        nvidia.TO_ALLOCATE_ANNOTATION: f"GPU-{node}0,NVIDIA,1024,0:;",
    }
    pod["spec"]["nodeName"] = node
    pod["spec"]["schedulerName"] = names.SCHEDULER_NAME
    pod["status"] = {"phase": "Pending"}
    return pod


def test_the_gate_times_out_on_the_operators_clock_and_is_reported_once() -> None:
    """A holder found already allocating (another replica bound it) is timed from the
    operator's first look at the gate, whatever its bind-time says."""
    state = two_nodes()
    state.set_pod(bound_by_another(state, "x", "a", 100))
    state.set_pod(bound_by_another(state, "y", "b", 100))
    assert not state.bind_gate_open("a", "t/p", 150)  # the clock of x starts here
    assert state.expired_gates(150) == []  # and that of y
    assert state.expired_gates(209) == []
    assert state.expired_gates(211) == [("a", "t/x"), ("b", "t/y")]
    assert state.expired_gates(300) == []
    assert state.bind_gate_open("a", "t/p", 211)


@pytest.mark.parametrize("bind_time", ["yesterday", "4102444800", "2099-01-01T00:00:00Z", "0"])
def test_a_pods_bind_time_is_never_read(bind_time: str) -> None:
    """Neither a time in the future (which held a node shut) nor one long past (which
    let the next pod through at once) nor an unreadable one moves the gate."""
    state = two_nodes()
    pod = bound_by_another(state, "x", "a", 100)
    pod["metadata"]["annotations"][names.BIND_TIME] = bind_time
    state.set_pod(pod)
    assert state.gate_holders() == {"a": ["t/x"]}
    assert not state.bind_gate_open("a", "t/p", 1000)
    assert not state.bind_gate_open("a", "t/p", 1060)
    assert state.expired_gates(1061) == [("a", "t/x")]
    assert state.bind_gate_open("a", "t/p", 1061)


def test_the_gate_is_timed_from_the_binding_not_the_decision() -> None:
    """A pod decided at 100 that waited for the gate until 500 holds it from its Binding:
    the pod after it is not let through the moment it is bound."""
    state = two_nodes()
    decision = state.schedule(gpu_pod("p1"), 100)
    assert decision.scheduled
    state.confirm("t/p1", now=500)
    state.set_pod(bound(gpu_pod("p1"), decision, phase="Pending"))
    node = str(decision.node)
    assert not state.bind_gate_open(node, "t/p2", 501)
    assert not state.bind_gate_open(node, "t/p2", 560)
    assert state.bind_gate_open(node, "t/p2", 561)
    holder = state.gate_holder(node, 530)
    assert holder is not None
    assert holder.pod == "t/p1"
    assert holder.held_s == pytest.approx(30)
    assert holder.opens_in_s == pytest.approx(30)


def test_a_pod_holds_the_gate_once() -> None:
    """Once answered (or timed out), a pod that says allocating again holds nothing."""
    state = two_nodes()
    pod = bound_by_another(state, "x", "a", 100)
    state.set_pod(pod)
    state.set_pod(with_phase(pod, "success"))
    state.set_pod(with_phase(pod, "allocating"))
    assert state.gate_holders() == {}
    assert state.bind_gate_open("a", "t/p", 100)
    timed_out = bound_by_another(state, "y", "b", 100)
    state.set_pod(timed_out)
    state.expired_gates(100)
    assert state.expired_gates(161) == [("b", "t/y")]
    state.set_pod(with_phase(timed_out, "success"))
    state.set_pod(with_phase(timed_out, "allocating"))
    assert state.bind_gate_open("b", "t/p", 162)


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
    pod = bound_by_another(state, "x", "a", 100)
    state.set_pod(pod)
    change(pod)
    state.set_pod(pod)
    assert state.gate_holders() == {}


def test_a_deleted_holder_opens_the_node() -> None:
    state = two_nodes()
    state.set_pod(bound_by_another(state, "x", "a", 100))
    state.remove_pod("t/x")
    assert state.bind_gate_open("a", "t/p", 100)


def test_rollback_of_a_failed_binding_leaves_no_holder() -> None:
    state = two_nodes()
    state.schedule(gpu_pod("p1"), 100)
    state.rollback("t/p1")
    assert state.gate_holders() == {}


def test_failed_allocation_releases_the_booking() -> None:
    """The plugin refused the pod: kubelet will not start it with these devices."""
    state = two_nodes()
    pod = bound_by_another(state, "x", "a", 100)
    state.set_pod(pod)
    assert any(row.used_slots for row in state.device_usage())
    state.set_pod(with_phase(pod, "failed"))
    assert not any(row.used_slots for row in state.device_usage())


def test_a_pod_that_got_its_devices_and_says_failed_later_keeps_its_booking() -> None:
    """Its plugin's first answer was success: its containers run on the devices, and only
    its end releases them (a tenant's edit must not free the card under it)."""
    state = two_nodes()
    pod = bound_by_another(state, "x", "a", 100)
    state.set_pod(pod)
    state.set_pod(with_phase(pod, "success"))
    state.set_pod(with_phase(pod, "failed"))
    assert any(row.used_slots for row in state.device_usage())


def test_pods_without_devices_hold_no_gate() -> None:
    state = two_nodes()
    plain = make_pod("plain", "t").container(cpu="100m").obj()
    decision = state.schedule(plain, 100)
    assert decision.scheduled
    state.confirm("t/plain")
    state.set_pod(bound(plain, decision, phase="Pending"))
    assert state.gate_holders() == {}


def test_off_never_waits() -> None:
    state = two_nodes(GateMode.OFF)
    state.set_pod(bound_by_another(state, "x", "a", 100))
    assert state.bind_gate_open("a", "t/p", 100)
    assert state.expired_gates(10_000) == []


# --- HAMi's node lock ----------------------------------------------------------------


def test_hami_lock_mode_honours_another_pods_node_lock() -> None:
    state = two_nodes(GateMode.HAMI_LOCK)
    state.set_pod(with_phase(bound_by_another(state, "holder", "a", 10), "success"))
    locked = make_node("a").gpu("GPU-a0").gpu("GPU-a1")
    locked.annotate(names.NODE_LOCK, node_lock.encode(100, "t", "holder"))
    state.set_node(locked.obj()[0])
    assert not state.bind_gate_open("a", "t/p", 110)
    assert state.bind_gate_open("a", "t/p", 500)  # expired
    # Its own lock (a Binding that failed after the lock was taken) does not stop it.
    own = make_node("a").gpu("GPU-a0").gpu("GPU-a1")
    own.annotate(names.NODE_LOCK, node_lock.encode(100, "t", "p"))
    state.set_node(own.obj()[0])
    assert state.bind_gate_open("a", "t/p", 110)


def test_books_mode_ignores_the_node_lock() -> None:
    state = two_nodes(GateMode.BOOKS)
    locked = make_node("a").gpu("GPU-a0").gpu("GPU-a1")
    locked.annotate(names.NODE_LOCK, node_lock.encode(100, "t", "other"))
    state.set_node(locked.obj()[0])
    assert state.bind_gate_open("a", "t/p", 110)


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
