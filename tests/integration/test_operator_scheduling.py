"""The operator against a real API server: binding, waiting pods, release, config, nodes.

Each test starts its own operator (in a thread) with its own scheduler name, and places
its pods on its own kwok nodes (a node label plus a nodeSelector), so tests never see
each other's pods even though they share the control plane.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from integration import operator_env as env

from vgpu_operator import names
from vgpu_operator.devices import nvidia
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.controlplane import ControlPlane, fake_gpu_node_manifest


@dataclass
class Setup:
    cp: ControlPlane
    namespace: str
    scheduler: str

    def pod(self, name: str, **kwargs: Any) -> dict[str, Any]:
        return env.gpu_pod(
            self.namespace, name, scheduler=self.scheduler, group=self.namespace, **kwargs
        )

    def create(self, name: str, **kwargs: Any) -> dict[str, Any]:
        return env.create_pod(self.cp, self.pod(name, **kwargs))

    def get(self, name: str) -> dict[str, Any]:
        return env.get_pod(self.cp, self.namespace, name)

    def node(self, suffix: str) -> str:
        return f"{self.namespace}-{suffix}"


@pytest.fixture
def setup(control_plane: ControlPlane, namespace: str) -> Iterator[Setup]:
    scheduler = env.new_scheduler(control_plane, namespace)
    yield Setup(control_plane, namespace, scheduler)
    env.cleanup_group(control_plane, namespace)


@pytest.fixture
def operator(setup: Setup) -> Iterator[OperatorThread]:
    with OperatorThread(env.options(setup.cp, setup.namespace)) as running:
        yield running


def _wait_condition(s: Setup, name: str, pattern: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cond = env.condition(s.get(name))
        if cond and cond.get("status") == "False" and re.search(pattern, cond.get("message", "")):
            return dict(cond)
        return None

    return env.wait_until(f"{name} to be marked unschedulable ({pattern})", check, 30)


def _wait_event(s: Setup, name: str, reason: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        found = [e for e in env.events_for(s.cp, s.namespace, name) if e["reason"] == reason]
        return found[0] if found else None

    return env.wait_until(f"a {reason} event for {name}", check, 30)


def test_pod_is_bound_with_its_allocation_in_one_write(
    setup: Setup, operator: OperatorThread
) -> None:
    cards = env.cards(setup.node("a"), 2, memory_mib=40000)
    env.gpu_node(setup.cp, setup.node("a"), cards, group=setup.namespace)
    setup.create("p1", gpumem=10000, gpucores=30)
    pod = env.wait_bound(setup.cp, setup.namespace, "p1")
    annotations = pod["metadata"]["annotations"]
    assert pod["spec"]["nodeName"] == setup.node("a")
    assert annotations[names.ASSIGNED_NODE] == setup.node("a")
    ((card, memory_mib, cores),) = env.allocation(pod)
    assert card in {c.uuid for c in cards}
    assert (memory_mib, cores) == (10000, 30)
    # No Kopf bookkeeping on pods: no progress annotations and no finalizers.
    assert not [k for k in annotations if "kopf" in k]
    assert not pod["metadata"].get("finalizers")
    env.wait_until("the pod to run", lambda: setup.get("p1")["status"].get("phase") == "Running")
    scheduled = _wait_event(setup, "p1", "Scheduled")
    assert scheduled["type"] == "Normal"
    assert setup.node("a") in scheduled["message"]


def test_node_with_only_hami_annotations_is_used(setup: Setup, operator: OperatorThread) -> None:
    cards = env.cards(setup.node("h"), 1, memory_mib=24000)
    env.gpu_node(
        setup.cp,
        setup.node("h"),
        cards,
        group=setup.namespace,
        inventory=False,
        annotations={nvidia.REGISTER_ANNOTATION: env.hami_register_annotation(cards)},
    )
    setup.create("p1", gpumem=4000)
    pod = env.wait_bound(setup.cp, setup.namespace, "p1")
    assert pod["spec"]["nodeName"] == setup.node("h")
    assert [c for c, _, _ in env.allocation(pod)] == [cards[0].uuid]


@pytest.mark.parametrize("release", ["completes", "is-deleted"])
def test_waiting_pod_is_reported_then_bound_when_capacity_frees(
    setup: Setup, operator: OperatorThread, release: str
) -> None:
    env.gpu_node(
        setup.cp,
        setup.node("a"),
        env.cards(setup.node("a"), 1, memory_mib=20000),
        group=setup.namespace,
    )
    setup.create("first", gpumem=15000)
    env.wait_bound(setup.cp, setup.namespace, "first")
    setup.create("second", gpumem=15000)
    cond = _wait_condition(setup, "second", r"1 CardInsufficientMemory")
    assert cond["reason"] == "Unschedulable"
    assert re.match(r"^0/\d+ nodes are available: .*1 CardInsufficientMemory.*\.$", cond["message"])
    event = _wait_event(setup, "second", "FailedScheduling")
    assert event["type"] == "Warning"
    assert "Devices ruled out:" in event["message"]
    assert "CardInsufficientMemory" in event["message"]
    assert not setup.get("second")["spec"].get("nodeName")

    first_path = f"/api/v1/namespaces/{setup.namespace}/pods/first"
    if release == "completes":
        setup.cp.request(
            "PATCH",
            f"{first_path}/status",
            {"status": {"phase": "Succeeded"}},
            content_type="application/merge-patch+json",
        )
    else:
        setup.cp.delete(first_path)
    second = env.wait_bound(setup.cp, setup.namespace, "second", 30)
    assert second["spec"]["nodeName"] == setup.node("a")
    # Retries bumped one Event rather than writing one per attempt.
    failed = [
        e
        for e in env.events_for(setup.cp, setup.namespace, "second")
        if e["reason"] == "FailedScheduling"
    ]
    assert len(failed) == 1


def _set_init_state(s: Setup, name: str, state: dict[str, Any]) -> None:
    """Write the pod's init container status as kubelet does (the status subresource)."""
    s.cp.request(
        "PATCH",
        f"/api/v1/namespaces/{s.namespace}/pods/{name}/status",
        {
            "status": {
                "initContainerStatuses": [
                    {
                        "name": "prepare",
                        "image": "registry.invalid/cuda:latest",
                        "ready": False,
                        "restartCount": 1,
                        "state": state,
                    }
                ]
            }
        },
        content_type="application/merge-patch+json",
    )


def test_finished_init_containers_release_their_peak(
    setup: Setup, operator: OperatorThread
) -> None:
    name = setup.node("i")
    env.gpu_node(setup.cp, name, env.cards(name, 1, memory_mib=40000), group=setup.namespace)
    peak = setup.pod("peak", gpumem=10000)
    peak["spec"]["initContainers"] = [
        {
            "name": "prepare",
            "image": "registry.invalid/cuda:latest",
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000"}},
        }
    ]
    env.create_pod(setup.cp, peak)
    bound = env.wait_bound(setup.cp, setup.namespace, "peak")
    assert [m for _, m, _ in env.allocation(bound)] == [30000, 10000]

    def init_succeeded() -> bool:
        statuses = setup.get("peak")["status"].get("initContainerStatuses") or []
        return [s.get("state", {}).get("terminated", {}).get("exitCode") for s in statuses] == [0]

    # KWOK plays kubelet: it runs the pod and reports its init container done.
    env.wait_until("kwok to finish the init container", init_succeeded)
    # kubelet runs init containers again when it recreates a pod's sandbox: the init
    # container holds its 30000 MiB again, and 25000 more do not fit on the card.
    _set_init_state(setup, "peak", {"running": {"startedAt": env.rfc3339()}})
    setup.create("second", gpumem=25000)
    _wait_condition(setup, "second", r"1 CardInsufficientMemory")
    # It succeeds: only the app container's 10000 MiB hold, and the second pod fits.
    _set_init_state(
        setup,
        "peak",
        {
            "terminated": {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": env.rfc3339(),
                "finishedAt": env.rfc3339(),
            }
        },
    )
    second = env.wait_bound(setup.cp, setup.namespace, "second", 30)
    assert second["spec"]["nodeName"] == name


def test_cordoned_node_is_used_once_uncordoned(setup: Setup, operator: OperatorThread) -> None:
    name = setup.node("c")
    manifest = fake_gpu_node_manifest(name, gpus=1, labels={env.TEST_LABEL: setup.namespace})
    manifest["spec"]["unschedulable"] = True
    setup.cp.create("/api/v1/nodes", manifest)
    setup.cp.wait_for_node_ready(name)
    env.write_inventory(setup.cp, name, env.cards(name, 1))
    state = operator.app.running.state
    assert state is not None
    env.wait_until("the operator to see the node", lambda: name in state.node_names())
    setup.create("p1", gpumem=1000)
    _wait_condition(setup, "p1", r"NodeUnschedulable")
    setup.cp.patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": False}})
    assert env.wait_bound(setup.cp, setup.namespace, "p1")["spec"]["nodeName"] == name


def test_cordoned_device_is_skipped(setup: Setup, operator: OperatorThread) -> None:
    name = setup.node("d")
    cards = env.cards(name, 2, memory_mib=40000)
    env.gpu_node(setup.cp, name, cards, group=setup.namespace, cordoned=[cards[0].uuid])
    for i in range(3):
        setup.create(f"p{i}", gpumem=1000)
    for i in range(3):
        pod = env.wait_bound(setup.cp, setup.namespace, f"p{i}")
        assert [card for card, _, _ in env.allocation(pod)] == [cards[1].uuid]


def test_node_whose_gpus_vanish_is_not_offered(setup: Setup, operator: OperatorThread) -> None:
    name = setup.node("v")
    cards = env.cards(name, 1)
    register = {nvidia.REGISTER_ANNOTATION: env.hami_register_annotation(cards)}
    env.gpu_node(
        setup.cp, name, cards, group=setup.namespace, inventory=False, annotations=register
    )
    setup.create("before", gpumem=1000)
    env.wait_bound(setup.cp, setup.namespace, "before")
    # Seed 000 §9: allocatable GPUs drop to 0 while the plugin had reported some.
    gone = {"nvidia.com/gpu": "0"}
    setup.cp.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        {"status": {"capacity": gone, "allocatable": gone}},
        content_type="application/merge-patch+json",
    )
    state = setup.cp.get(f"/api/v1/nodes/{name}")["status"]["allocatable"]
    assert state["nvidia.com/gpu"] == "0"
    setup.create("after", gpumem=1000)
    _wait_condition(setup, "after", r"NodeUnregistered")


def test_quota_over_others_usage_waits_until_it_falls(
    setup: Setup, operator: OperatorThread
) -> None:
    env.gpu_node(
        setup.cp,
        setup.node("a"),
        env.cards(setup.node("a"), 2, memory_mib=40000),
        group=setup.namespace,
    )
    setup.cp.create(
        f"/api/v1/namespaces/{setup.namespace}/resourcequotas",
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": setup.namespace},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "20000"}},
        },
    )
    setup.create("first", gpumem=15000)
    env.wait_bound(setup.cp, setup.namespace, "first")
    setup.create("second", gpumem=15000)
    _wait_condition(setup, "second", r"ResourceQuotaNotFit|quota")
    setup.cp.delete(f"/api/v1/namespaces/{setup.namespace}/pods/first")
    env.wait_bound(setup.cp, setup.namespace, "second", 30)


def test_a_node_takes_pods_while_its_lease_or_its_report_is_fresh(setup: Setup) -> None:
    """A node's heartbeat is the later of its Lease's renewal and its inventory's
    status.heartbeat. With neither fresh it offers nothing; a Lease renewed by its agent
    keeps it schedulable however old the report; when the renewals stop, it stops taking
    pods once the timeout passes; a fresh report (an older agent's heartbeat) revives it."""
    timeout_s = 5.0
    name = setup.node("s")
    cards = env.cards(name, 2)
    env.gpu_node(setup.cp, name, cards, group=setup.namespace, inventory=False)
    env.write_inventory(setup.cp, name, cards, heartbeat="2020-01-01T00:00:00Z")
    options = env.options(setup.cp, setup.namespace, inventory_timeout_s=timeout_s)
    with OperatorThread(options):
        setup.create("p1", gpumem=1000)
        _wait_condition(setup, "p1", r"InventoryStale")
        with env.LeaseRenewer(setup.cp, name, every_s=1.0) as agent:
            assert env.wait_bound(setup.cp, setup.namespace, "p1")["spec"]["nodeName"] == name
            # Longer than the timeout: later renewals, not only the first, keep it fresh.
            time.sleep(timeout_s + 1.0)
            setup.create("p2", gpumem=1000)
            assert env.wait_bound(setup.cp, setup.namespace, "p2")["spec"]["nodeName"] == name
        # The agent is gone: its last renewal ages past the timeout, and the report is old.
        time.sleep(max(0.0, agent.last_renewed + timeout_s + 1.0 - time.time()))
        setup.create("p3", gpumem=1000)
        _wait_condition(setup, "p3", r"InventoryStale")
        assert env.get_pod(setup.cp, setup.namespace, "p3")["spec"].get("nodeName") is None
        env.write_inventory(setup.cp, name, cards)  # a fresh report
        assert env.wait_bound(setup.cp, setup.namespace, "p3")["spec"]["nodeName"] == name


def test_invalid_config_is_refused_and_the_last_good_one_stays(
    setup: Setup, operator: OperatorThread
) -> None:
    env.gpu_node(setup.cp, setup.node("a"), env.cards(setup.node("a"), 1), group=setup.namespace)
    # The good config is in force first (the operator's first listing of it may otherwise
    # come after the bad one, and then there is no previous config to keep).
    setup.create("p0", gpumem=1000)
    env.wait_bound(setup.cp, setup.namespace, "p0")
    env.put_config_map(
        setup.cp,
        setup.namespace,
        env.config_text(setup.scheduler, "nvidia:\n  deviceSplitCount: 0\n"),
    )

    def rejection() -> dict[str, Any] | None:
        found = [
            e
            for e in env.events_for(setup.cp, setup.namespace, env.CONFIG_MAP)
            if e["reason"] == "ConfigRejected"
        ]
        return found[0] if found else None

    event = env.wait_until("a ConfigRejected event", rejection, 30)
    assert event["type"] == "Warning"
    assert "nvidia.deviceSplitCount" in event["message"]
    assert event["involvedObject"]["kind"] == "ConfigMap"
    # The previous config (with our scheduler name) is still in force.
    setup.create("p1", gpumem=1000)
    env.wait_bound(setup.cp, setup.namespace, "p1")
    rejections = operator.app.metrics.registry.get_sample_value(
        "vgpu_operator_config_rejections_total"
    )
    assert rejections == 1


def test_metrics_show_the_booking_per_device(setup: Setup, operator: OperatorThread) -> None:
    name = setup.node("m")
    cards = env.cards(name, 1, memory_mib=40000)
    env.gpu_node(setup.cp, name, cards, group=setup.namespace)
    setup.create("p1", gpumem=12000, gpucores=25)
    env.wait_bound(setup.cp, setup.namespace, "p1")
    server = operator.app.server
    assert server is not None
    url = f"http://127.0.0.1:{server.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    wanted = (f'node="{name}"', f'device="{cards[0].uuid}"')

    def sample(metric: str) -> float:
        for line in text.splitlines():
            if line.startswith(metric + "{") and all(label in line for label in wanted):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{metric} for {wanted} not exposed")

    assert sample("vgpu_operator_device_memory_allocated_bytes") == 12000 * 1024 * 1024
    assert sample("vgpu_operator_device_cores_allocated_ratio") == 0.25
    assert sample("vgpu_operator_device_shares_allocated") == 1
    assert re.search(r'vgpu_operator_scheduling_attempts_total\{result="scheduled"\} [1-9]', text)


def test_unreadable_memory_never_binds_a_gpu_pod_without_a_gpu(
    setup: Setup, operator: OperatorThread
) -> None:
    """Without the webhook (created straight for our scheduler), a gpumem in bytes must
    not become "no request": the pod waits and says what to change."""
    env.gpu_node(setup.cp, setup.node("a"), env.cards(setup.node("a"), 1), group=setup.namespace)
    pod = env.gpu_pod(setup.namespace, "bytes", scheduler=setup.scheduler, group=setup.namespace)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "4Gi"
    env.create_pod(setup.cp, pod)
    condition = _wait_condition(setup, "bytes", r"nvidia\.com/gpumem.*MiB")
    assert condition["reason"] in ("Unschedulable", "SchedulerError")
    setup.create("fine", gpumem=1000)  # the node is usable: only the bad pod waits
    env.wait_bound(setup.cp, setup.namespace, "fine")
    assert not setup.get("bytes")["spec"].get("nodeName")


def test_cores_above_100_are_booked_as_100_and_the_pod_is_told(
    setup: Setup, operator: OperatorThread
) -> None:
    env.gpu_node(setup.cp, setup.node("a"), env.cards(setup.node("a"), 1), group=setup.namespace)
    setup.create("greedy", gpumem=1000, gpucores=150)
    pod = env.wait_bound(setup.cp, setup.namespace, "greedy")
    ((_card, _memory, cores),) = env.allocation(pod)
    assert cores == 100
    event = _wait_event(setup, "greedy", "GpuRequestAdjusted")
    assert event["type"] == "Warning"
    assert "nvidia.com/gpucores" in event["message"]
