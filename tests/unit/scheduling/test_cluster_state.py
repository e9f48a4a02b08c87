"""ClusterState: reservations, releases, node health, config changes and the diagnosis."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from builders import (
    GPUMEM,
    T4,
    bound,
    card_uuids,
    cluster,
    make_node,
    make_pod,
    resource_quota,
)
from strategies import MIG_CONFIG

from vgpu_operator import names
from vgpu_operator.config import load_config
from vgpu_operator.devices import nvidia
from vgpu_operator.scheduling.cycle.cluster import Books, ClusterState
from vgpu_operator.scheduling.status import Diagnosis, NodeFailure, Reason

Booked = dict[str, tuple[int, int, int]]


def booked(state: ClusterState) -> Booked:
    """Per card with anything on it: (slots, memory MiB, cores)."""
    return {
        row.uuid: (row.used_slots, row.used_memory_mib, row.used_cores)
        for row in state.device_usage()
        if row.used_slots or row.used_memory_mib or row.used_cores
    }


def one_card(inventory_timeout_s: float | None = None) -> ClusterState:
    return cluster(make_node("n").gpu("GPU-0"), inventory_timeout_s=inventory_timeout_s)


POD = make_pod("p", "team").container(gpu=1, gpumem=4096, cores=30)


# --- reserve, confirm, rollback, release -------------------------------------------------


def test_schedule_reserves_at_once() -> None:
    state = one_card()
    decision = state.schedule(POD.obj(), 0)
    assert decision.scheduled
    assert booked(state) == {"GPU-0": (1, 4096, 30)}
    assert state.holding_pods() == {"team/p": "n"}
    assert state.quota_usage() == {"team": {GPUMEM: (4096, 0), "nvidia.com/gpucores": (30, 0)}}


def test_confirmed_pod_holds_devices_and_ignores_rollback() -> None:
    state = one_card()
    state.schedule(POD.obj(), 0)
    state.confirm("team/p")
    state.rollback("team/p")
    assert booked(state) == {"GPU-0": (1, 4096, 30)}


def test_rollback_releases_reservation() -> None:
    state = one_card()
    before = (state.device_usage(), state.quota_usage())
    state.schedule(POD.obj(), 0)
    state.rollback("team/p")
    assert (state.device_usage(), state.quota_usage()) == before
    assert state.holding_pods() == {}


def test_rollback_unknown_pod_is_harmless() -> None:
    state = one_card()
    state.rollback("team/nobody")
    state.confirm("team/nobody")
    assert booked(state) == {}


def test_decision_annotations_carry_the_allocation() -> None:
    decision = one_card().schedule(POD.obj(), 1732072495)
    assert decision.annotations == {
        names.ASSIGNED_NODE: "n",
        names.ASSIGNED_TIME: "1732072495",
        names.BIND_PHASE: "allocating",
        names.BIND_TIME: "1732072495",
        nvidia.TO_ALLOCATE_ANNOTATION: "GPU-0,NVIDIA,4096,30:;",
        nvidia.ALLOCATED_ANNOTATION: "GPU-0,NVIDIA,4096,30:;",
    }


def test_bound_pod_observed_books_the_same() -> None:
    state = one_card()
    decision = state.schedule(POD.obj(), 0)
    state.confirm("team/p")
    before = (state.device_usage(), state.quota_usage())
    state.set_pod(bound(POD.obj(), decision))
    assert (state.device_usage(), state.quota_usage()) == before


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pod_releases(phase: str) -> None:
    state = one_card()
    decision = state.schedule(POD.obj(), 0)
    state.confirm("team/p")
    state.set_pod(bound(POD.obj(), decision, phase=phase))
    assert booked(state) == {}
    assert state.quota_usage() == {}
    assert state.holding_pods() == {}


def test_removed_pod_releases_quota() -> None:
    state = cluster(make_node("n").gpu("GPU-0").gpu("GPU-1"))
    state.set_quota(resource_quota("team", gpumem=6000))
    first = state.schedule(make_pod("a", "team").container(gpu=1, gpumem=4096).obj(), 0)
    state.confirm(first.pod)
    second = make_pod("b", "team").container(gpu=1, gpumem=4096).obj()
    refused = state.schedule(second, 0)
    assert refused.diagnosis is not None
    assert refused.diagnosis.to_json() == {"n": {"ResourceQuotaNotFit": 2}}
    state.remove_pod(first.pod)
    assert state.quota_usage()["team"][GPUMEM] == (0, 6000)
    assert state.schedule(second, 0).scheduled


def test_scheduling_a_pod_again_releases_its_old_placement() -> None:
    state = one_card()
    state.schedule(POD.obj(), 0)
    state.confirm("team/p")
    state.schedule(POD.obj(), 0)
    assert booked(state) == {"GPU-0": (1, 4096, 30)}


def test_running_pod_with_unreadable_allocation_holds_nothing() -> None:
    state = one_card()
    state.set_pod(make_pod("r").container(gpu=1).on_node("n", "GPU-0,NVIDIA,lots,0:;").obj())
    assert booked(state) == {}
    assert state.holding_pods() == {"default/r": "n"}


def test_running_pod_on_unknown_card_ignored() -> None:
    state = one_card()
    state.set_pod(make_pod("r").container(gpu=1).on_node("n", "GPU-gone,NVIDIA,1024,0:;").obj())
    assert booked(state) == {}


def test_running_pod_before_its_node_is_counted() -> None:
    state = ClusterState(load_config({}))
    state.set_pod(make_pod("r").container(gpu=1).on_node("n", "GPU-0,NVIDIA,1024,10:;").obj())
    make_node("n").gpu("GPU-0").install(state)
    assert booked(state) == {"GPU-0": (1, 1024, 10)}


def test_pod_without_gpu_placed_without_devices() -> None:
    state = one_card()
    decision = state.schedule(make_pod("web").container(cpu="1").obj(), 0)
    assert decision.scheduled
    assert decision.devices == {}
    assert booked(state) == {}


# --- several containers -------------------------------------------------------------------


def test_app_containers_take_their_own_cards_in_order() -> None:
    state = cluster(make_node("n").gpu("GPU-0").gpu("GPU-1").gpu("GPU-2"))
    pod = make_pod("p").container(gpu=2, gpumem=1024).container(gpu=1, gpumem=2048).container()
    decision = state.schedule(pod.obj(), 0)
    chosen = card_uuids(decision)
    assert [len(c) for c in chosen] == [2, 1, 0]
    assert decision.annotations[nvidia.ALLOCATED_ANNOTATION].endswith(";;")


def test_init_container_booked_at_its_peak() -> None:
    state = one_card()
    pod = make_pod("p").init_container(gpu=1, gpumem=10000).container(gpu=1, gpumem=8000)
    decision = state.schedule(pod.obj(), 0)
    assert card_uuids(decision) == [["GPU-0"], ["GPU-0"]]
    assert booked(state) == {"GPU-0": (1, 10000, 0)}


def test_app_containers_on_one_card_summed() -> None:
    state = one_card()
    pod = make_pod("p").container(gpu=1, gpumem=4000, cores=10).container(gpu=1, gpumem=6000)
    state.schedule(pod.obj(), 0)
    assert booked(state) == {"GPU-0": (2, 10000, 10)}


def test_pod_fits_only_if_every_container_fits() -> None:
    state = one_card()
    pod = make_pod("p").container(gpu=1, gpumem=10000).container(gpu=1, gpumem=8000)
    decision = state.schedule(pod.obj(), 0)
    assert decision.diagnosis is not None
    assert decision.diagnosis.to_json() == {"n": {"CardInsufficientMemory": 1}}
    assert booked(state) == {}


# --- node health ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "scheduled"),
    [
        pytest.param(60.0, True, id="at-the-timeout"),
        pytest.param(60.5, False, id="past-the-timeout"),
    ],
)
def test_old_heartbeat_inventory_stale(now: float, scheduled: bool) -> None:
    state = one_card(inventory_timeout_s=60.0)
    decision = state.schedule(POD.obj(), now)
    assert decision.scheduled is scheduled
    if not scheduled:
        assert decision.diagnosis is not None
        assert decision.diagnosis.to_json() == {"n": {"InventoryStale": 1}}


def test_heartbeat_with_the_same_cards_keeps_bookings_and_freshens_the_node() -> None:
    node = make_node("n").gpu("GPU-0")
    state = cluster(node, inventory_timeout_s=60.0)
    assert state.schedule(make_pod("a", "team").container(gpu=1, gpumem=4096).obj(), 0).scheduled
    stale = state.schedule(POD.obj(), 100.0)
    assert stale.diagnosis is not None
    assert stale.diagnosis.to_json() == {"n": {"InventoryStale": 1}}
    # The agent's heartbeat: the same cards, a new time.
    state.set_inventory("n", node.obj()[1], {}, heartbeat=90.0)
    assert booked(state) == {"GPU-0": (1, 4096, 0)}
    assert state.schedule(POD.obj(), 100.0).scheduled
    assert booked(state) == {"GPU-0": (2, 8192, 30)}


def test_a_lease_renewal_moves_only_the_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """``set_heartbeat`` (a node's Lease renewed): the node is fresh again, with its cards
    and bookings as they were and nothing of it worked out again."""
    state = cluster(make_node("n").gpu("GPU-0"), inventory_timeout_s=60.0)
    assert state.schedule(make_pod("a", "team").container(gpu=1, gpumem=4096).obj(), 0).scheduled
    stale = state.schedule(POD.obj(), 100.0)
    assert stale.diagnosis is not None
    assert stale.diagnosis.to_json() == {"n": {"InventoryStale": 1}}

    def no_rebuild(*_: object) -> None:
        raise AssertionError("a heartbeat must not register the node's cards again")

    monkeypatch.setattr(Books, "_register", no_rebuild)
    state.set_heartbeat("n", 90.0)
    monkeypatch.undo()
    assert booked(state) == {"GPU-0": (1, 4096, 0)}
    assert state.schedule(POD.obj(), 100.0).scheduled
    # An unreadable or missing renewal (None) is no heartbeat: stale again.
    state.set_heartbeat("n", None)
    late = state.schedule(make_pod("b", "team").container(gpu=1, gpumem=1024).obj(), 100.0)
    assert late.diagnosis is not None
    assert late.diagnosis.to_json() == {"n": {"InventoryStale": 1}}


def test_a_heartbeat_for_a_node_without_an_inventory_changes_nothing() -> None:
    state = one_card(inventory_timeout_s=60.0)
    state.set_heartbeat("ghost", 100.0)  # a Lease with no inventory behind it
    state.remove_inventory("n")
    state.set_heartbeat("n", 100.0)
    decision = state.schedule(POD.obj(), 100.0)
    assert decision.diagnosis is not None
    assert decision.diagnosis.to_json() == {"n": {"NodeUnregistered": 1}}


def test_gpus_vanished_from_allocatable_node_unregistered() -> None:
    node = make_node("n").gpu("GPU-0").allocatable(gpus="1")
    state = cluster(node)
    assert state.schedule(POD.obj(), 0).scheduled
    state.rollback("team/p")
    state.set_node(make_node("n").allocatable(gpus="0").obj()[0])
    decision = state.schedule(POD.obj(), 0)
    assert decision.diagnosis is not None
    assert decision.diagnosis.to_json() == {"n": {"NodeUnregistered": 1}}
    state.set_node(make_node("n").allocatable(gpus="1").obj()[0])
    assert state.schedule(POD.obj(), 0).scheduled


def test_allocatable_gpus_as_quantity_accepted() -> None:
    state = one_card()
    state.set_node(make_node("n").allocatable(gpus="1k").obj()[0])
    assert state.schedule(POD.obj(), 0).scheduled


def test_node_that_never_reported_gpus_in_allocatable_still_schedules() -> None:
    state = one_card()
    state.set_node(make_node("n").allocatable(gpus="0").obj()[0])
    assert state.schedule(POD.obj(), 0).scheduled


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda s: s.remove_inventory("n"), id="inventory-removed"),
        pytest.param(lambda s: s.set_inventory("n", [], {}, heartbeat=0.0), id="no-cards"),
    ],
)
def test_node_without_cards_node_unregistered(build: Callable[[ClusterState], None]) -> None:
    state = one_card()
    build(state)
    decision = state.schedule(POD.obj(), 0)
    assert decision.diagnosis is not None
    assert decision.diagnosis.to_json() == {"n": {"NodeUnregistered": 1}}


def test_cards_from_register_annotation() -> None:
    register = json.dumps(
        [{"id": "GPU-r0", "index": 0, "count": 10, "devmem": 16384, "devcore": 100,
          "type": "NVIDIA A100", "numa": 0, "mode": "hami-core", "health": True}]
    )  # fmt: skip
    node, _ = make_node("n").annotate(nvidia.REGISTER_ANNOTATION, register).obj()
    state = ClusterState(load_config({}))
    state.set_node(node)
    assert card_uuids(state.schedule(POD.obj(), 0)) == [["GPU-r0"]]


def test_malformed_register_annotation_recorded_and_node_unregistered() -> None:
    node, _ = make_node("n").annotate(nvidia.REGISTER_ANNOTATION, "[{").obj()
    state = ClusterState(load_config({}))
    state.set_node(node)
    assert nvidia.REGISTER_ANNOTATION in state.register_errors()["n"]
    decision = state.schedule(POD.obj(), 0)
    assert decision.diagnosis is not None
    assert decision.diagnosis.to_json() == {"n": {"NodeUnregistered": 1}}


def test_inventory_wins_over_register_annotation() -> None:
    register = json.dumps([{"id": "GPU-ann", "count": 10, "devmem": 16384, "devcore": 100,
                            "type": "NVIDIA A100", "health": True}])  # fmt: skip
    state = cluster(make_node("n").gpu("GPU-inv").annotate(nvidia.REGISTER_ANNOTATION, register))
    assert [r.uuid for r in state.device_usage()] == ["GPU-inv"]


def test_cordoned_card_skipped() -> None:
    state = cluster(make_node("n").gpu("GPU-0").gpu("GPU-1").annotate(
        names.NODE_DEVICE_CORDON, " GPU-1 ,"
    ))  # fmt: skip
    assert card_uuids(state.schedule(POD.obj(), 0)) == [["GPU-0"]]
    only_cordoned = make_pod("q").container(gpu=1).annotate(nvidia.USE_UUID_ANNOTATION, "GPU-1")
    decision = state.schedule(only_cordoned.obj(), 0)
    assert decision.diagnosis is not None
    assert decision.diagnosis.to_json() == {"n": {"CardCordoned": 1, "CardUuidMismatch": 1}}


def test_removed_node_no_longer_offered() -> None:
    state = cluster(make_node("a").gpu("GPU-a0"), make_node("b").gpu("GPU-b0"))
    state.remove_node("a")
    assert state.node_names() == ["b"]
    assert state.schedule(POD.obj(), 0).node == "b"


# --- config -----------------------------------------------------------------------------


def test_config_change_keeps_usage_and_quota() -> None:
    state = cluster(make_node("n").gpu("GPU-0").gpu("GPU-1"))
    state.set_quota(resource_quota("team", gpumem=10000))
    first = state.schedule(POD.obj(), 0)
    state.confirm(first.pod)
    assert card_uuids(first) == [["GPU-1"]]  # spread: the idle cards tie, the last is tried first
    before = (state.device_usage(), state.quota_usage(), state.holding_pods())
    state.set_config(load_config({"scheduler": {"gpuSchedulerPolicy": "binpack"}}))
    assert (state.device_usage(), state.quota_usage(), state.holding_pods()) == before
    second = state.schedule(make_pod("q", "team").container(gpu=1, gpumem=4096).obj(), 0)
    assert card_uuids(second) == [["GPU-1"]]  # binpack now: onto the busy card


def test_config_change_applies_new_memory_factor_to_quota() -> None:
    state = one_card()
    state.set_quota(resource_quota("team", gpumem=4))
    pod = make_pod("p", "team").container(gpu=1, gpumem=4).obj()
    assert state.schedule(pod, 0).scheduled  # 4 MiB within a limit of 4
    state.rollback("team/p")
    state.set_config(load_config({"nvidia": {"memoryFactor": 1024}}))
    decision = state.schedule(pod, 0)
    assert decision.scheduled
    assert booked(state) == {"GPU-0": (1, 4096, 0)}


# --- the diagnosis ------------------------------------------------------------------------


def test_diagnosis_message_counts_nodes_per_main_reason() -> None:
    state = cluster(
        make_node("a").gpu("GPU-a0"),
        make_node("b").gpu("GPU-b0"),
        make_node("c").gpu("GPU-c0", type=T4),
    )
    pod = make_pod("p").container(gpu=1, gpumem=20000).annotate(nvidia.NOUSE_TYPE_ANNOTATION, "T4")
    decision = state.schedule(pod.obj(), 0)
    assert decision.diagnosis is not None
    assert decision.diagnosis.message() == (
        "0/3 nodes are available: 2 CardInsufficientMemory, 1 CardTypeMismatch."
    )


@pytest.mark.parametrize(
    ("failures", "message"),
    [
        pytest.param(
            {"a": {Reason.CARD_TYPE_MISMATCH: 1, Reason.CARD_INSUFFICIENT_MEMORY: 3}},
            "0/1 nodes are available: 1 CardInsufficientMemory.",
            id="main-reason-most-devices",
        ),
        pytest.param(
            {"a": {Reason.CARD_INSUFFICIENT_MEMORY: 2, Reason.CARD_NOT_HEALTH: 2}},
            "0/1 nodes are available: 1 CardNotHealth.",
            id="tie-goes-to-earlier-check",
        ),
        pytest.param(
            {
                "a": {Reason.NODE_UNSCHEDULABLE: 1},
                "b": {Reason.CARD_NOT_HEALTH: 1},
                "c": {Reason.CARD_NOT_HEALTH: 1},
            },
            "0/3 nodes are available: 2 CardNotHealth, 1 NodeUnschedulable.",
            id="most-nodes-first",
        ),
        pytest.param(
            {"b": {Reason.NODE_UNSCHEDULABLE: 1}, "a": {Reason.CARD_NOT_HEALTH: 1}},
            "0/2 nodes are available: 1 CardNotHealth, 1 NodeUnschedulable.",
            id="equal-counts-by-name",
        ),
        pytest.param({}, "0/0 nodes are available.", id="no-nodes"),
    ],
)
def test_diagnosis_message(failures: dict[str, dict[Reason, int]], message: str) -> None:
    diagnosis = Diagnosis(
        {node: NodeFailure(reasons) for node, reasons in failures.items()}, len(failures)
    )
    assert diagnosis.message() == message


def test_diagnosis_on_empty_cluster() -> None:
    decision = ClusterState(load_config({})).schedule(POD.obj(), 0)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert decision.diagnosis.message() == "0/0 nodes are available."


# --- MIG (seed form) ------------------------------------------------------------------

#: The first two geometries of the A100 40GB (seven 1g, or one 1g and three 2g).
MIG_GEOMETRIES = copy.deepcopy(MIG_CONFIG)
MIG_GEOMETRIES["nvidia"]["knownMigGeometries"][0]["allowedGeometries"][2:] = []


def mig_cluster() -> ClusterState:
    node = make_node("n").gpu("GPU-m", memory_mib=40960, count=7, mode="mig")
    return cluster(node, config=load_config(MIG_GEOMETRIES))


def test_mig_instances_taken_from_one_geometry() -> None:
    state = mig_cluster()
    first = state.schedule(make_pod("a").container(gpu=1, gpumem=8192).obj(), 0)
    second = state.schedule(make_pod("b").container(gpu=2, gpumem=1024).obj(), 0)
    assert card_uuids(first) == [["GPU-m[1-1]"]]
    assert card_uuids(second) == [["GPU-m[1-0]", "GPU-m[1-2]"]]
    assert booked(state) == {"GPU-m": (3, 25600, 70)}


def test_mig_init_and_app_containers_share_one_geometry() -> None:
    # Regression: init containers used to start from an idle card, choose another geometry
    # than the app containers, and later pods over-committed the card (112 of 100 cores).
    state = mig_cluster()
    pod = make_pod("a").init_container(gpu=1, gpumem=8192).container(gpu=1, gpumem=1024)
    decision = state.schedule(pod.obj(), 0)
    geometries = {uuid.split("[")[1].split("-")[0] for c in card_uuids(decision) for uuid in c}
    state.schedule(make_pod("b").container(gpu=3, gpumem=1024).obj(), 0)
    (row,) = state.device_usage()
    assert row.used_cores <= row.total_cores
    assert len(geometries) == 1


def test_mig_card_slots_bound_instances_of_one_container() -> None:
    node = make_node("n").gpu("GPU-m", memory_mib=40960, count=2, mode="mig")
    state = cluster(node, config=load_config(MIG_GEOMETRIES))
    state.schedule(make_pod("a").container(gpu=3, gpumem=1024).obj(), 0)
    (row,) = state.device_usage()
    assert row.used_slots <= row.total_slots


# --- the order in which the cluster is observed -------------------------------------------

_RUNNING = make_pod("r").container(gpu=1, gpumem=16000).on_node("n", "GPU-0,NVIDIA,16000,100:;")
_NODE, _CARDS = make_node("n").gpu("GPU-0", memory_mib=16384).obj()
_EVENTS = {
    "pod": lambda s: s.set_pod(_RUNNING.obj()),
    "inventory": lambda s: s.set_inventory("n", _CARDS, {}, heartbeat=0.0),
    "node": lambda s: s.set_node(_NODE),
}


@pytest.mark.parametrize(
    "order",
    [
        pytest.param(("node", "inventory", "pod"), id="node-inventory-pod"),
        pytest.param(("node", "pod", "inventory"), id="node-pod-inventory"),
        pytest.param(("inventory", "node", "pod"), id="inventory-node-pod"),
        pytest.param(("inventory", "pod", "node"), id="inventory-pod-node"),
        pytest.param(("pod", "node", "inventory"), id="pod-node-inventory"),
        pytest.param(("pod", "inventory", "node"), id="pod-inventory-node"),
    ],
)
def test_running_pod_booked_whatever_the_order_of_events(order: tuple[str, ...]) -> None:
    state = ClusterState(load_config({}))
    for event in order:
        _EVENTS[event](state)
    assert booked(state) == {"GPU-0": (1, 16000, 100)}


def test_an_unreadable_allocation_is_reported_and_cleared_when_the_pod_changes() -> None:
    state = cluster(make_node("n").gpu("GPU-a"))
    pod = make_pod("p").container(1, 1000).on_node("n", allocated="GPU-a,NVIDIA,oops,0:;").obj()
    state.set_pod(pod)
    problem = state.allocation_error("default/p")
    assert problem is not None
    assert "oops" in problem or "integer" in problem
    state.remove_pod("default/p")
    assert state.allocation_error("default/p") is None


def test_an_implausible_register_annotation_offers_nothing_and_says_why() -> None:
    from vgpu_operator.devices import codec, model, nvidia

    huge = model.DeviceInfo("GPU-h", 0, 10, 900_000_000, 100, "NVIDIA H100", 0, True)
    node = make_node("n").obj()[0]
    node["metadata"]["annotations"] = {
        nvidia.REGISTER_ANNOTATION: codec.encode_node_devices_json([huge])
    }
    state = ClusterState(load_config({}))
    state.set_node(node)
    decision = state.schedule(make_pod("p").container(1, 1000).obj(), now=0.0)
    assert not decision.scheduled
    (warning,) = state.node_warnings("n")
    assert nvidia.REGISTER_ANNOTATION in warning
    assert "900000000" in warning


def test_a_retried_pod_is_admitted_and_parsed_once_until_something_it_depends_on_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = ClusterState(load_config({}))
    admissions: list[object] = []
    admit = state.cycle.admit

    def counting(pod: Any) -> Any:
        admissions.append(pod)
        return admit(pod)

    monkeypatch.setattr(state.cycle, "admit", counting)
    make_node("n").gpu("GPU-a", memory_mib=1000).install(state)
    pod = make_pod("p").container(1, 4000).obj()  # fits nowhere: it is retried
    assert not state.schedule(pod, now=0.0).scheduled
    assert not state.schedule(pod, now=1.0).scheduled
    assert len(admissions) == 1
    state.set_quota(resource_quota("default", gpumem=10**6))
    assert not state.schedule(pod, now=2.0).scheduled
    assert len(admissions) == 2
    changed = make_pod("p").container(1, 500).obj()  # the pod itself changed
    assert state.schedule(changed, now=3.0).scheduled
    assert len(admissions) == 3


def test_a_node_on_the_dra_path_offers_no_device_plugin_share() -> None:
    from vgpu_operator.devices import dra

    state = cluster(make_node("n").gpu("GPU-0").label(dra.NODE_PATH_LABEL, dra.PATH_DRA))
    # Its cards are DRA devices (the agent publishes a ResourceSlice and runs no device
    # plugin there): an annotation-protocol pod must not be placed on them too.
    assert not state.schedule(POD.obj(), 0).scheduled
    assert booked(state) == {}
    back = cluster(make_node("n").gpu("GPU-0").label(dra.NODE_PATH_LABEL, dra.PATH_DEVICE_PLUGIN))
    assert back.schedule(POD.obj(), 0).scheduled
