"""The feed: which objects reach the engine, which pods wait, which events wake them."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from manual_clock import ManualClock

from vgpu_operator import config as device_config
from vgpu_operator import names
from vgpu_operator.control.feed import ConfigOutcome, StateFeed
from vgpu_operator.control.queue import OWN_CHANGE_ONLY, Refused, SchedulingQueue, WaitsForVictims
from vgpu_operator.devices import model, nvidia
from vgpu_operator.scheduling.books.changes import Freed

SCHED = "vgpu-scheduler"


class FakeEngine:
    """Records what the feed tells the engine."""

    def __init__(self) -> None:
        self.pods: dict[str, Mapping[str, Any]] = {}
        self.nodes: dict[str, Mapping[str, Any]] = {}
        self.inventories: dict[str, tuple[list[str], float | None, list[str]]] = {}
        #: Every heartbeat moved on its own (``set_heartbeat``), in order.
        self.heartbeats: list[tuple[str, float | None]] = []
        self.quotas: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.budgets: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.config: device_config.DeviceConfig | None = None
        self.calls: list[str] = []
        self.expired: list[tuple[str, str]] = []
        #: Room freed, as the books report it: a bound pod that ended or went away.
        self.freed: list[Freed] = []
        #: (verdict, node) pairs where the verdict's pods fit now; (verdict, namespace)
        #: pairs whose quota may help.
        self.fitting: set[tuple[object, str]] = set()
        self.quota_helped: set[tuple[object, str]] = set()
        #: Every question the feed asked about a verdict.
        self.asked: list[tuple[object, str]] = []

    def set_config(self, config: device_config.DeviceConfig) -> None:
        self.config = config

    def set_node(self, node: Mapping[str, Any]) -> None:
        self.nodes[node["metadata"]["name"]] = node

    def node_warnings(self, name: str) -> tuple[str, ...]:
        # Stands in for the engine's reading of the node layer: one warning per
        # annotation whose value starts with "bad".
        annotations = self.nodes[name]["metadata"].get("annotations") or {}
        return tuple(
            f"{k} unreadable" for k, v in sorted(annotations.items()) if v.startswith("bad")
        )

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name, None)

    def set_inventory(
        self,
        node_name: str,
        devices: Sequence[model.DeviceInfo],
        pair_scores: model.PairScores,
        heartbeat: float | None,
        cordoned: Sequence[str] = (),
    ) -> None:
        self.inventories[node_name] = ([d.id for d in devices], heartbeat, list(cordoned))

    def set_heartbeat(self, node_name: str, heartbeat: float | None) -> None:
        self.heartbeats.append((node_name, heartbeat))

    def remove_inventory(self, node_name: str) -> None:
        self.inventories.pop(node_name, None)

    def set_pod(self, pod: Mapping[str, Any]) -> None:
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        before = self.pods.get(key)
        if before is not None and _holds_room(before) and not _holds_room(pod):
            self.freed.append(Freed(before["spec"]["nodeName"], pod["metadata"]["namespace"]))
        self.pods[key] = pod
        self.calls.append(f"set {key} node={pod.get('spec', {}).get('nodeName')}")

    def allocation_error(self, key: str) -> str | None:
        return None

    def allocation_warning(self, key: str) -> str | None:
        return None

    def expired_gates(self, now: float) -> list[tuple[str, str]]:
        expired, self.expired = self.expired, []
        return expired

    def remove_pod(self, key: str) -> None:
        before = self.pods.pop(key, None)
        if before is not None and _holds_room(before):
            self.freed.append(Freed(before["spec"]["nodeName"], before["metadata"]["namespace"]))
        self.calls.append(f"remove {key}")

    def take_freed(self) -> list[Freed]:
        taken, self.freed = self.freed, []
        return taken

    def fits_now(self, verdict: object, node: str, now: float) -> bool:
        self.asked.append((verdict, node))
        return (verdict, node) in self.fitting

    def quota_may_help(self, verdict: object, namespace: str) -> bool:
        return (verdict, namespace) in self.quota_helped

    def set_quota(self, quota: Mapping[str, Any]) -> None:
        meta = quota["metadata"]
        self.quotas[(meta["namespace"], meta["name"])] = quota

    def remove_quota(self, namespace: str, name: str) -> None:
        self.quotas.pop((namespace, name), None)

    def set_budget(self, pdb: Mapping[str, Any]) -> None:
        meta = pdb["metadata"]
        self.budgets[(meta["namespace"], meta["name"])] = pdb

    def remove_budget(self, namespace: str, name: str) -> None:
        self.budgets.pop((namespace, name), None)


def _holds_room(pod: Mapping[str, Any]) -> bool:
    return bool(pod.get("spec", {}).get("nodeName")) and pod.get("status", {}).get("phase") not in (
        "Succeeded",
        "Failed",
    )


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture
def queue(clock: ManualClock) -> SchedulingQueue:
    return SchedulingQueue(clock=clock)


@pytest.fixture
def feed(engine: FakeEngine, queue: SchedulingQueue, clock: ManualClock) -> StateFeed:
    return StateFeed(engine, queue, inventory_timeout_s=60, wall_clock=clock)


def pod(
    name: str,
    version: int,
    *,
    node: str | None = None,
    phase: str = "Pending",
    scheduler: str = SCHED,
    uid: str = "u1",
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [{"name": "c"}]}
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": str(version),
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def bound(name: str, version: int, *, phase: str = "Running") -> dict[str, Any]:
    return pod(name, version, node="n1", phase=phase, annotations={names.ASSIGNED_NODE: "n1"})


def park(queue: SchedulingQueue, key: str) -> None:
    assert queue.pop() == key
    queue.park(key)


def test_pending_pod_of_ours_is_queued(feed: StateFeed, queue: SchedulingQueue) -> None:
    feed.pod_event("ADDED", pod("a", 1))
    assert "ns/a" in queue
    assert feed.pending_pod("ns/a") is not None


def test_other_schedulers_pods_reach_the_engine_but_not_the_queue(
    feed: StateFeed, queue: SchedulingQueue, engine: FakeEngine
) -> None:
    feed.pod_event("ADDED", pod("a", 1, scheduler="default-scheduler"))
    assert "ns/a" not in queue
    assert "ns/a" in engine.pods


def test_bound_pod_leaves_the_queue(feed: StateFeed, queue: SchedulingQueue) -> None:
    feed.pod_event("ADDED", pod("a", 1))
    feed.pod_event("MODIFIED", bound("a", 2))
    assert "ns/a" not in queue
    assert feed.pending_pod("ns/a") is None


def test_stale_event_does_not_reach_the_engine(feed: StateFeed, engine: FakeEngine) -> None:
    feed.pod_event("MODIFIED", bound("a", 5))
    feed.pod_event("MODIFIED", pod("a", 4))
    assert engine.pods["ns/a"]["spec"].get("nodeName") == "n1"


def test_unbound_copy_during_binding_cannot_undo_the_reservation(
    feed: StateFeed, engine: FakeEngine, queue: SchedulingQueue
) -> None:
    feed.pod_event("ADDED", pod("a", 1))
    queue.pop()
    feed.binding_started("ns/a", "u1")
    engine.calls.clear()
    # Our own condition patch from an earlier attempt arrives while the Binding is written.
    feed.pod_event("MODIFIED", pod("a", 2))
    feed.binding_succeeded("ns/a")
    feed.pod_event("MODIFIED", pod("a", 3))
    assert engine.calls == []
    assert "ns/a" not in queue
    feed.pod_event("MODIFIED", bound("a", 4))
    assert engine.calls == ["set ns/a node=n1"]
    feed.pod_event("MODIFIED", bound("a", 5))
    assert engine.calls[-1] == "set ns/a node=n1"


def test_failed_binding_lets_updates_through_again(feed: StateFeed, engine: FakeEngine) -> None:
    feed.pod_event("ADDED", pod("a", 1))
    feed.binding_started("ns/a", "u1")
    feed.binding_failed("ns/a")
    engine.calls.clear()
    feed.pod_event("MODIFIED", pod("a", 2))
    assert engine.calls == ["set ns/a node=None"]


@pytest.mark.parametrize(
    "ending",
    [
        pytest.param(
            lambda f: f.pod_event("MODIFIED", bound("h", 3, phase="Succeeded")), id="succeeded"
        ),
        pytest.param(lambda f: f.pod_event("MODIFIED", bound("h", 3, phase="Failed")), id="failed"),
        pytest.param(lambda f: f.pod_event("DELETED", bound("h", 3)), id="deleted"),
        pytest.param(lambda f: f.pods_listed([pod("w", 1)], "10"), id="vanished-from-listing"),
    ],
)
def test_end_of_a_device_holder_wakes_parked_pods(
    feed: StateFeed, queue: SchedulingQueue, clock: ManualClock, ending: Any
) -> None:
    feed.pod_event("ADDED", bound("h", 2))
    feed.pod_event("ADDED", pod("w", 1))
    park(queue, "ns/w")
    ending(feed)
    assert queue.parked_count == 0
    clock.now += 1
    assert queue.pop() == "ns/w"


def test_device_plugin_answer_opens_the_nodes_gate(feed: StateFeed) -> None:
    settled: list[str] = []
    feed.on_settled = settled.append
    allocating = {names.ASSIGNED_NODE: "n1", names.BIND_PHASE: "allocating"}
    feed.pod_event("ADDED", pod("h", 2, node="n1", phase="Pending", annotations=allocating))
    feed.pod_event("MODIFIED", pod("h", 3, node="n1", phase="Pending", annotations=allocating))
    assert settled == []  # still allocating: nothing changed for the gate
    answered = {**allocating, names.BIND_PHASE: "success"}
    feed.pod_event("MODIFIED", pod("h", 4, node="n1", phase="Pending", annotations=answered))
    assert settled == ["n1"]
    feed.pod_event("MODIFIED", pod("h", 5, node="n1", phase="Running", annotations=answered))
    assert settled == ["n1"]


def test_deleting_a_pod_that_awaits_its_devices_opens_the_gate(feed: StateFeed) -> None:
    settled: list[str] = []
    feed.on_settled = settled.append
    allocating = {names.ASSIGNED_NODE: "n1", names.BIND_PHASE: "allocating"}
    feed.pod_event("ADDED", pod("h", 2, node="n1", phase="Pending", annotations=allocating))
    feed.pod_event("DELETED", pod("h", 3, node="n1", phase="Pending", annotations=allocating))
    assert settled == ["n1"]


def test_timed_out_gates_open_their_nodes(feed: StateFeed, engine: FakeEngine) -> None:
    settled: list[str] = []
    feed.on_settled = settled.append
    assert feed.check_gates() == []
    engine.expired = [("n1", "ns/h")]
    assert feed.check_gates() == [("n1", "ns/h")]
    assert settled == ["n1"]


def test_room_freed_wakes_only_the_pods_it_lets_fit(
    feed: StateFeed, queue: SchedulingQueue, engine: FakeEngine, clock: ManualClock
) -> None:
    """A pod that ends frees room on its node: each waiting shape (verdict) is asked once
    whether it fits there now; pods that cannot be helped by room stay."""
    feed.pod_event("ADDED", pod("plain", 2, node="n1", phase="Running"))
    helped, not_helped = "verdict-fits-n1", "verdict-too-big"
    engine.fitting.add((helped, "n1"))
    for name, hint in (
        ("w1", helped),
        ("w2", helped),
        ("big", not_helped),
        ("bad", OWN_CHANGE_ONLY),
        ("refused", Refused("ns")),
        ("victims-n1", WaitsForVictims("n1")),
        ("victims-n2", WaitsForVictims("n2")),
    ):
        feed.pod_event("ADDED", pod(name, 1, uid=name))
        assert queue.pop() == f"ns/{name}"
        queue.park(f"ns/{name}", hint=hint)
    feed.pod_event("DELETED", pod("plain", 3, node="n1"))
    assert sorted(engine.asked) == [(helped, "n1"), (not_helped, "n1")]
    assert {k for k in ("ns/w1", "ns/w2", "ns/victims-n1") if not queue.is_unschedulable(k)} == {
        "ns/w1",
        "ns/w2",
        "ns/victims-n1",
    }
    assert all(queue.is_unschedulable(f"ns/{n}") for n in ("big", "bad", "refused", "victims-n2"))


def test_room_freed_in_a_namespace_wakes_its_quota_bound_pods_wherever(
    feed: StateFeed, queue: SchedulingQueue, engine: FakeEngine
) -> None:
    feed.pod_event("ADDED", pod("plain", 2, node="n1", phase="Running"))
    engine.quota_helped.add(("verdict-quota", "ns"))
    feed.pod_event("ADDED", pod("w", 1))
    assert queue.pop() == "ns/w"
    queue.park("ns/w", hint="verdict-quota")
    feed.pod_event("MODIFIED", pod("plain", 3, node="n1", phase="Succeeded"))
    assert not queue.is_unschedulable("ns/w")
    assert engine.asked == []  # the quota answered: no node needs asking


def test_a_pod_whose_request_cannot_be_read_waits_for_its_own_edit(
    feed: StateFeed, queue: SchedulingQueue
) -> None:
    feed.node_event("ADDED", node("n1", 1, unschedulable=True))
    feed.pod_event("ADDED", pod("w", 1))
    assert queue.pop() == "ns/w"
    queue.park("ns/w", hint=OWN_CHANGE_ONLY)
    feed.node_event("MODIFIED", node("n1", 2))
    feed.quota_event("ADDED", quota(1, "1000"))
    assert queue.is_unschedulable("ns/w")
    feed.pod_event("MODIFIED", pod("w", 2, annotations={nvidia.USE_TYPE_ANNOTATION: "A100"}))
    assert not queue.is_unschedulable("ns/w")


def test_own_status_update_does_not_wake_a_parked_pod(
    feed: StateFeed, queue: SchedulingQueue
) -> None:
    feed.pod_event("ADDED", pod("w", 1))
    park(queue, "ns/w")
    updated = pod("w", 2)
    updated["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    feed.pod_event("MODIFIED", updated)
    assert queue.parked_count == 1


def test_edited_pod_is_woken(feed: StateFeed, queue: SchedulingQueue) -> None:
    feed.pod_event("ADDED", pod("w", 1))
    park(queue, "ns/w")
    feed.pod_event("MODIFIED", pod("w", 2, annotations={nvidia.USE_TYPE_ANNOTATION: "A100"}))
    assert queue.parked_count == 0


def node(
    name: str, version: int, *, unschedulable: bool = False, heartbeat: str = "t"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": str(version)},
        "spec": {"unschedulable": unschedulable},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}]
        },
    }


def test_node_change_wakes_only_when_schedulable_facts_change(
    feed: StateFeed, queue: SchedulingQueue, engine: FakeEngine
) -> None:
    feed.node_event("ADDED", node("n1", 1, unschedulable=True))
    feed.pod_event("ADDED", pod("w", 1))
    park(queue, "ns/w")
    feed.node_event("MODIFIED", node("n1", 2, unschedulable=True, heartbeat="t2"))
    assert queue.parked_count == 1
    feed.node_event("MODIFIED", node("n1", 3))
    assert queue.parked_count == 0
    assert engine.nodes["n1"]["metadata"]["resourceVersion"] == "3"


def _annotated(name: str, version: int, annotations: dict[str, str]) -> dict[str, Any]:
    built = node(name, version)
    built["metadata"]["annotations"] = annotations
    return built


def test_unreadable_node_annotations_are_reported_once_per_change(feed: StateFeed) -> None:
    feed.node_event("ADDED", _annotated("n1", 1, {names.NODE_SCHEDULER_POLICY: "bad-1"}))
    taken = feed.take_warnings()
    assert [(w.obj["metadata"]["name"], w.message) for w in taken] == [
        ("n1", f"{names.NODE_SCHEDULER_POLICY} unreadable")
    ]
    assert feed.take_warnings() == []
    # A routine update with the same problem says nothing new...
    feed.node_event("MODIFIED", _annotated("n1", 2, {names.NODE_SCHEDULER_POLICY: "bad-1"}))
    assert feed.take_warnings() == []
    # ...fixing it says nothing, and breaking it again is reported again.
    feed.node_event("MODIFIED", _annotated("n1", 3, {names.NODE_SCHEDULER_POLICY: "spread"}))
    assert feed.take_warnings() == []
    feed.node_event("MODIFIED", _annotated("n1", 4, {nvidia.USE_TYPE_ANNOTATION: "bad-2"}))
    assert [w.message for w in feed.take_warnings()] == [f"{nvidia.USE_TYPE_ANNOTATION} unreadable"]


def test_node_restriction_change_wakes_parked_pods(feed: StateFeed, queue: SchedulingQueue) -> None:
    feed.node_event("ADDED", _annotated("n1", 1, {nvidia.USE_TYPE_ANNOTATION: "A100"}))
    feed.pod_event("ADDED", pod("w", 1))
    park(queue, "ns/w")
    feed.node_event("MODIFIED", _annotated("n1", 2, {nvidia.USE_TYPE_ANNOTATION: "A100,H100"}))
    assert queue.parked_count == 0


def test_node_deletion_removes_it_from_the_engine(feed: StateFeed, engine: FakeEngine) -> None:
    feed.node_event("ADDED", node("n1", 1))
    feed.node_event("DELETED", node("n1", 2))
    assert engine.nodes == {}


def _stamp(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_s, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def inventory(
    version: int, *, heartbeat_s: float, uuids: Sequence[str] = ("GPU-0",)
) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "resourceVersion": str(version)},
        "spec": {"cordonedDevices": ["GPU-0"]},
        "status": {
            "nodeName": "n1",
            "heartbeat": _stamp(heartbeat_s),
            "devices": [
                {
                    "uuid": u,
                    "index": i,
                    "model": "A100",
                    "type": "NVIDIA-A100",
                    "memoryMiB": 40960,
                    "cores": 100,
                    "splitCount": 10,
                    "health": "Healthy",
                }
                for i, u in enumerate(uuids)
            ],
            "summary": {"gpuCount": len(uuids), "healthyCount": len(uuids), "totalMemoryMiB": 0},
        },
    }


def test_inventory_reaches_the_engine_with_heartbeat_and_cordons(
    feed: StateFeed, engine: FakeEngine, clock: ManualClock
) -> None:
    feed.inventory_event("ADDED", inventory(1, heartbeat_s=clock.now, uuids=("GPU-0", "GPU-1")))
    assert engine.inventories["n1"] == (["GPU-0", "GPU-1"], clock.now, ["GPU-0"])


def test_unreadable_inventory_offers_no_devices(
    feed: StateFeed, engine: FakeEngine, clock: ManualClock
) -> None:
    feed.inventory_event("ADDED", inventory(1, heartbeat_s=clock.now))
    broken = inventory(2, heartbeat_s=clock.now)
    broken["status"]["devices"][0]["memoryMiB"] = -5
    feed.inventory_event("MODIFIED", broken)
    assert "n1" not in engine.inventories


def test_unreadable_inventory_is_reported_on_the_object_once(
    feed: StateFeed, engine: FakeEngine, clock: ManualClock
) -> None:
    broken = inventory(1, heartbeat_s=clock.now)
    broken["status"]["devices"][0]["memoryMiB"] = -5
    feed.inventory_event("ADDED", broken)
    (warning,) = feed.take_warnings()
    assert (warning.kind, warning.reason) == ("DeviceInventory", "InventoryRefused")
    assert "memoryMiB" in warning.message
    broken["metadata"]["resourceVersion"] = "2"
    feed.inventory_event("MODIFIED", broken)
    assert feed.take_warnings() == []  # the same problem is not repeated


def test_inventory_claiming_another_node_is_refused(
    feed: StateFeed, engine: FakeEngine, clock: ManualClock
) -> None:
    """An inventory named "evil" that says it describes n1 must not replace n1's cards."""
    feed.inventory_event("ADDED", inventory(1, heartbeat_s=clock.now))
    evil = inventory(1, heartbeat_s=clock.now, uuids=("GPU-fake",))
    evil["metadata"]["name"] = "evil"
    feed.inventory_event("ADDED", evil)
    assert engine.inventories["n1"][0] == ["GPU-0"]
    assert "evil" not in engine.inventories
    (warning,) = feed.take_warnings()
    assert warning.obj["metadata"]["name"] == "evil"
    assert "nodeName" in warning.message


def test_heartbeat_alone_wakes_nobody_but_a_revived_node_does(
    feed: StateFeed, queue: SchedulingQueue, clock: ManualClock
) -> None:
    feed.inventory_event("ADDED", inventory(1, heartbeat_s=clock.now))
    feed.pod_event("ADDED", pod("w", 1))
    park(queue, "ns/w")
    clock.now += 30
    feed.inventory_event("MODIFIED", inventory(2, heartbeat_s=clock.now))
    assert queue.parked_count == 1
    clock.now += 61
    assert feed.check_heartbeats() == ["n1"]
    assert feed.check_heartbeats() == []  # reported once
    feed.inventory_event("MODIFIED", inventory(3, heartbeat_s=clock.now))
    assert queue.parked_count == 0


def test_inventory_content_change_wakes(
    feed: StateFeed, queue: SchedulingQueue, clock: ManualClock
) -> None:
    feed.inventory_event("ADDED", inventory(1, heartbeat_s=clock.now))
    feed.pod_event("ADDED", pod("w", 1))
    park(queue, "ns/w")
    feed.inventory_event("MODIFIED", inventory(2, heartbeat_s=clock.now, uuids=("GPU-0", "GPU-1")))
    assert queue.parked_count == 0


def node_lease(version: int, *, renewed_s: float | None, holder: str = "n1") -> dict[str, Any]:
    """n1's Lease as the agent renews it (``renewed_s`` None: no renewTime)."""
    spec: dict[str, Any] = {"holderIdentity": holder, "leaseDurationSeconds": 120}
    if renewed_s is not None:
        moment = datetime.datetime.fromtimestamp(renewed_s, datetime.UTC)
        spec["renewTime"] = moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "metadata": {
            "name": "n1",
            "namespace": "vgpu-node-leases",
            "resourceVersion": str(version),
        },
        "spec": spec,
    }


def test_a_lease_renewal_is_the_nodes_heartbeat_when_later(
    feed: StateFeed, engine: FakeEngine, clock: ManualClock
) -> None:
    feed.inventory_event("ADDED", inventory(1, heartbeat_s=clock.now - 600))
    feed.lease_event("ADDED", node_lease(1, renewed_s=clock.now - 5))
    assert engine.heartbeats == [("n1", clock.now - 5)]
    # The inventory's cards stay as they were: only the heartbeat moved.
    assert engine.inventories["n1"] == (["GPU-0"], clock.now - 600, ["GPU-0"])
    feed.lease_event("MODIFIED", node_lease(2, renewed_s=clock.now - 900))
    assert engine.heartbeats[-1] == ("n1", clock.now - 600)  # the inventory's is later
    assert feed.check_heartbeats() == ["n1"]


def test_a_fresh_lease_keeps_a_node_with_an_old_report_fresh(
    feed: StateFeed, queue: SchedulingQueue, clock: ManualClock
) -> None:
    feed.lease_event("ADDED", node_lease(1, renewed_s=clock.now))
    feed.inventory_event("ADDED", inventory(1, heartbeat_s=clock.now - 600))
    feed.pod_event("ADDED", pod("w", 1))
    park(queue, "ns/w")
    clock.now += 30
    feed.lease_event("MODIFIED", node_lease(2, renewed_s=clock.now))
    assert queue.parked_count == 1  # a renewal of a fresh node wakes nobody
    assert feed.check_heartbeats() == []
    clock.now += 61
    assert feed.check_heartbeats() == ["n1"]  # neither moved within the timeout
    feed.lease_event("MODIFIED", node_lease(3, renewed_s=clock.now))
    assert queue.parked_count == 0  # revived by its Lease
    assert feed.stale_nodes == frozenset()


def test_a_lease_without_an_inventory_does_nothing_until_one_comes(
    feed: StateFeed, engine: FakeEngine, queue: SchedulingQueue, clock: ManualClock
) -> None:
    feed.pod_event("ADDED", pod("w", 1))
    park(queue, "ns/w")
    feed.lease_event("ADDED", node_lease(1, renewed_s=clock.now))
    assert engine.heartbeats == []
    assert engine.inventories == {}
    assert queue.parked_count == 1
    assert feed.check_heartbeats() == []
    # The inventory arrives later with an old report: the Lease's renewal stands.
    feed.inventory_event("ADDED", inventory(1, heartbeat_s=clock.now - 600))
    assert engine.inventories["n1"][1] == clock.now


@pytest.mark.parametrize(
    "unreadable",
    [
        pytest.param(node_lease(2, renewed_s=None), id="no-renew-time"),
        pytest.param(node_lease(2, renewed_s=1000.0, holder="n2"), id="another-holder"),
    ],
)
def test_an_unreadable_lease_is_no_heartbeat(
    feed: StateFeed, engine: FakeEngine, clock: ManualClock, unreadable: dict[str, Any]
) -> None:
    feed.inventory_event("ADDED", inventory(1, heartbeat_s=clock.now - 600))
    feed.lease_event("ADDED", node_lease(1, renewed_s=clock.now))
    feed.lease_event("MODIFIED", unreadable)
    # Not fresh by default, and the renewal read before it does not stand either.
    assert engine.heartbeats[-1] == ("n1", clock.now - 600)
    assert feed.check_heartbeats() == ["n1"]


def test_a_deleted_or_vanished_lease_leaves_the_inventory_heartbeat(
    feed: StateFeed, engine: FakeEngine, clock: ManualClock
) -> None:
    feed.inventory_event("ADDED", inventory(1, heartbeat_s=clock.now - 600))
    feed.lease_event("ADDED", node_lease(1, renewed_s=clock.now))
    feed.lease_event("DELETED", node_lease(2, renewed_s=clock.now))
    assert engine.heartbeats[-1] == ("n1", clock.now - 600)
    feed.leases_listed([node_lease(3, renewed_s=clock.now)], "3")
    assert engine.heartbeats[-1] == ("n1", clock.now)
    feed.leases_listed([], "4")  # gone while nobody watched
    assert engine.heartbeats[-1] == ("n1", clock.now - 600)


@pytest.mark.parametrize("source", ["lease", "inventory"])
def test_a_heartbeat_from_the_future_counts_from_when_it_is_seen(
    feed: StateFeed, engine: FakeEngine, clock: ManualClock, source: str
) -> None:
    # A year ahead: read as is, the node would stay fresh for a year after its agent stops.
    ahead = clock.now + 365 * 86400
    if source == "lease":
        feed.inventory_event("ADDED", inventory(1, heartbeat_s=clock.now - 600))
        feed.lease_event("ADDED", node_lease(1, renewed_s=ahead))
        assert engine.heartbeats[-1] == ("n1", clock.now)
    else:
        feed.inventory_event("ADDED", inventory(1, heartbeat_s=ahead))
        assert engine.inventories["n1"][1] == clock.now
    assert feed.check_heartbeats() == []
    clock.now += 61
    assert feed.check_heartbeats() == ["n1"]


def quota(version: int, hard: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "q", "namespace": "ns", "resourceVersion": str(version)},
        "spec": {"hard": {"limits.nvidia.com/gpumem": hard}},
    }


def test_quota_limit_change_wakes_and_deletion_removes(
    feed: StateFeed, queue: SchedulingQueue, engine: FakeEngine
) -> None:
    feed.quota_event("ADDED", quota(1, "1000"))
    feed.pod_event("ADDED", pod("w", 1))
    park(queue, "ns/w")
    feed.quota_event("MODIFIED", quota(2, "1000"))  # status churn only
    assert queue.parked_count == 1
    feed.quota_event("MODIFIED", quota(3, "2000"))
    assert queue.parked_count == 0
    feed.quota_event("DELETED", quota(4, "2000"))
    assert engine.quotas == {}


def test_a_quota_change_wakes_the_pods_it_refused_or_ruled_out_in_its_namespace(
    feed: StateFeed, queue: SchedulingQueue, engine: FakeEngine
) -> None:
    feed.quota_event("ADDED", quota(1, "1000"))
    engine.quota_helped.add(("verdict-quota", "ns"))
    for name, hint in (
        ("quota-bound", "verdict-quota"),
        ("too-big", "verdict-too-big"),
        ("refused-here", Refused("ns")),
        ("refused-elsewhere", Refused("other")),
    ):
        feed.pod_event("ADDED", pod(name, 1, uid=name))
        assert queue.pop() == f"ns/{name}"
        queue.park(f"ns/{name}", hint=hint)
    feed.quota_event("MODIFIED", quota(2, "1000"))  # status churn only: no engine call
    assert queue.parked_count == 4
    feed.quota_event("MODIFIED", quota(3, "2000"))
    assert not queue.is_unschedulable("ns/quota-bound")
    assert not queue.is_unschedulable("ns/refused-here")
    assert queue.is_unschedulable("ns/too-big")
    assert queue.is_unschedulable("ns/refused-elsewhere")


def budget(name: str, version: int, allowed: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(version)},
        "spec": {"selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": allowed},
    }


def test_budgets_reach_the_engine_newest_first_and_wake_nobody(
    feed: StateFeed, queue: SchedulingQueue, engine: FakeEngine
) -> None:
    feed.pod_event("ADDED", pod("w", 1))
    park(queue, "ns/w")
    feed.budget_event("ADDED", budget("db", 2, 1))
    feed.budget_event("MODIFIED", budget("db", 1, 5))  # stale news
    assert engine.budgets[("ns", "db")]["status"]["disruptionsAllowed"] == 1
    assert queue.parked_count == 1  # a budget changes who is evicted, not who fits
    feed.budgets_listed([budget("web", 3, 0)], "4")
    assert set(engine.budgets) == {("ns", "web")}
    feed.budget_event("DELETED", budget("web", 5, 0))
    assert engine.budgets == {}


def config_map(text: str, version: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "cfg", "namespace": "sys", "resourceVersion": str(version)},
        "data": {"device-config.yaml": text},
    }


def test_invalid_config_is_refused_and_the_last_good_stays(
    feed: StateFeed, engine: FakeEngine
) -> None:
    good = feed.config_event("ADDED", config_map("nvidia:\n  deviceSplitCount: 4\n"))
    assert good.outcome is ConfigOutcome.APPLIED
    bad = feed.config_event("MODIFIED", config_map("nvidia:\n  deviceSplitCount: 0\n", 2))
    assert bad.outcome is ConfigOutcome.REJECTED
    assert bad.error is not None
    assert bad.error.field == "nvidia.deviceSplitCount"
    assert engine.config is not None
    assert nvidia.section(engine.config).device_split_count == 4
    again = feed.config_event("MODIFIED", config_map("nvidia:\n  deviceSplitCount: 0\n", 3))
    assert again.outcome is ConfigOutcome.UNCHANGED  # reported once per bad text
    assert feed.config_event("DELETED", config_map("", 4)).outcome is ConfigOutcome.KEPT
    assert nvidia.section(feed.config).device_split_count == 4


def test_config_without_the_key_is_refused(feed: StateFeed) -> None:
    result = feed.config_event("ADDED", {"metadata": {"name": "cfg"}, "data": {"other": "x"}})
    assert result.outcome is ConfigOutcome.REJECTED
    assert result.error is not None
    assert result.error.field == "data.device-config.yaml"


def test_new_scheduler_name_moves_pending_pods_in_and_out(
    feed: StateFeed, queue: SchedulingQueue
) -> None:
    feed.pod_event("ADDED", pod("old", 1))
    feed.pod_event("ADDED", pod("new", 2, scheduler="other-scheduler", uid="u2"))
    feed.config_event("ADDED", config_map("scheduler:\n  schedulerName: other-scheduler\n"))
    assert "ns/new" in queue
    assert "ns/old" not in queue
    assert feed.pending_pod("ns/old") is None


def test_listing_adds_missed_pods_and_forgets_vanished_ones(
    feed: StateFeed, engine: FakeEngine, queue: SchedulingQueue
) -> None:
    feed.pod_event("ADDED", bound("gone", 3))
    feed.pods_listed([pod("missed", 5), bound("held", 6)], "10")
    assert set(engine.pods) == {"ns/missed", "ns/held"}
    assert "ns/missed" in queue


def test_fresh_report_after_an_unnoticed_stale_one_wakes(
    feed: StateFeed, queue: SchedulingQueue, clock: ManualClock
) -> None:
    feed.inventory_event("ADDED", inventory(1, heartbeat_s=clock.now - 600))
    feed.pod_event("ADDED", pod("w", 1))
    park(queue, "ns/w")
    feed.inventory_event("MODIFIED", inventory(2, heartbeat_s=clock.now))
    assert queue.parked_count == 0


def _asking(body: dict[str, Any], resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    body["spec"]["containers"][0]["resources"] = {"limits": {resource: "1"}}
    return body


def test_pods_bound_by_the_default_scheduler_are_handed_to_the_reporter_once(
    feed: StateFeed,
) -> None:
    """Issue 33 item 7: GPU pods that missed the webhook and were bound by kube-scheduler
    fail at Allocate; the not-routed reporter must see them (once each)."""
    default = "default-scheduler"
    feed.pod_event("ADDED", _asking(pod("a", 1, scheduler=default)))
    assert feed.take_bound_by_default() == []  # unbound: waiting_for reports it
    feed.pod_event("MODIFIED", _asking(pod("a", 2, scheduler=default, node="n1", phase="Running")))
    feed.pod_event("ADDED", _asking(pod("cpu", 1, scheduler=default, node="n1")))
    feed.pod_event("ADDED", pod("plain", 1, scheduler=default, node="n1"))  # no extended resource
    feed.pod_event("ADDED", _asking(pod("ours", 1, node="n1")))  # our scheduler's
    taken = feed.take_bound_by_default()
    assert sorted(p["metadata"]["name"] for p in taken) == ["a", "cpu"]
    # Later updates of the same pods are not handed out again ...
    feed.pod_event("MODIFIED", _asking(pod("a", 3, scheduler=default, node="n1", phase="Running")))
    assert feed.take_bound_by_default() == []
    # ... a pod of the same name made again is.
    feed.pod_event("DELETED", _asking(pod("a", 4, scheduler=default, node="n1")))
    feed.pod_event("ADDED", _asking(pod("a", 5, scheduler=default, node="n1", uid="u2")))
    assert [p["metadata"]["uid"] for p in feed.take_bound_by_default()] == ["u2"]


def _member(name: str, group: str, *, scheduler: str = SCHED, priority: int = 0) -> Any:
    obj = pod(name, 1, scheduler=scheduler, uid=f"u-{name}")
    obj["spec"]["schedulingGroup"] = {"podGroupName": group}
    obj["spec"]["priority"] = priority
    return obj


def test_a_groups_members_are_found_by_the_index_whichever_scheduler(feed: StateFeed) -> None:
    feed.pod_event("ADDED", _member("w0", "train"))
    feed.pod_event("ADDED", _member("w1", "train", scheduler="default-scheduler"))
    feed.pod_event("ADDED", _member("e0", "eval"))
    feed.pod_event("ADDED", pod("plain", 1, uid="u-plain"))
    assert [p["metadata"]["name"] for p in feed.group_members("ns/train")] == ["w0", "w1"]
    # A member that changes groups, one that is bound, one that is deleted: the index
    # follows the unbound pods exactly.
    moved = _member("e0", "train")
    moved["metadata"]["resourceVersion"] = "2"
    feed.pod_event("MODIFIED", moved)
    assert feed.group_members("ns/eval") == []
    placed = _member("w0", "train")
    placed["metadata"]["resourceVersion"] = "3"
    placed["spec"]["nodeName"] = "n1"
    placed["metadata"]["annotations"] = {names.ASSIGNED_NODE: "n1"}
    feed.pod_event("MODIFIED", placed)
    feed.pod_event("DELETED", _member("w1", "train", scheduler="default-scheduler"))
    assert [p["metadata"]["name"] for p in feed.group_members("ns/train")] == ["e0"]


def test_a_members_queue_priority_comes_from_the_hook(
    feed: StateFeed, queue: SchedulingQueue
) -> None:
    feed.queue_priority = lambda p: 0 if p["metadata"]["name"] == "lowered" else 7
    feed.pod_event("ADDED", _member("lowered", "train", priority=1000))
    feed.pod_event("ADDED", _member("other", "eval", priority=1))
    assert [queue.pop(), queue.pop()] == ["ns/other", "ns/lowered"]


def test_a_groups_bound_live_members_of_this_scheduler_are_indexed(feed: StateFeed) -> None:
    def bound_member(name: str, version: int, **kwargs: Any) -> Any:
        obj = _member(name, "train", **kwargs)
        obj["metadata"]["resourceVersion"] = str(version)
        obj["spec"]["nodeName"] = "n1"
        obj["status"] = {"phase": "Running"}
        return obj

    feed.pod_event("ADDED", bound_member("w0", 1))
    feed.pod_event("ADDED", bound_member("w1", 1))
    feed.pod_event("ADDED", bound_member("x0", 1, scheduler="default-scheduler"))
    feed.pod_event("ADDED", _member("w2", "train"))  # pending: not bound
    assert feed.bound_members("ns/train") == {"ns/w0": "n1", "ns/w1": "n1"}
    done = bound_member("w1", 2)
    done["status"]["phase"] = "Succeeded"
    feed.pod_event("MODIFIED", done)
    feed.pod_event("DELETED", bound_member("w0", 3))
    assert feed.bound_members("ns/train") == {}
