"""Device health as DRA device taints, on the live API server (issue 35).

A control plane of its own (kube-apiserver, kube-scheduler, kube-controller-manager's claim
controller), KWOK nodes on the DRA path with an agent each, and the operator. The agent
taints a slice device whose card it reads unhealthy (``gpu.vgpu-operator.io/unhealthy``,
NoSchedule) or lost (``gpu.vgpu-operator.io/lost``, NoExecute) and, health being sticky
as on the device-plugin path, publishes it untainted again once restarted on a repaired
card. The engine does not allocate a tainted device to a claim unless its request
tolerates the taint, and says so with device counts.

kube-controller-manager's device taint eviction controller evicts the pod whose claim holds
the lost card, not the one on the sick card. The seconds from a card's fault (the machine
file rewritten) to the taint on the slice are printed (``-s`` shows them); they are figures
of this shared machine, not asserted.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from integration.dra_env import (
    CLAIM_CONTROLLERS,
    RESOURCE,
    claim_pod,
    create_claim_template,
    dra_agent,
    dra_operator,
    dra_plane,
    fresh_namespace,
    node_slice,
)
from integration.test_agent import AgentThread, rewrite, wait_for

from vgpu_operator.agent.sim_machine import resolve_machine_path
from vgpu_operator.devices import dra
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane

pytestmark = pytest.mark.integration

SPLIT = 4
SCHEDULER = "vgpu-dra-health"
FAILING = "health-failing"  # h100-pcie-failing: card 2 raised critical XID 79
SICK = "GPU-9e4c7b10-6d2a-4f83-b5a1-0fa11ed00002"
CHANGING = "health-changing"  # a writable copy of l40s-pcie-4


@pytest.fixture(scope="module")
def plane(
    control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    work = tmp_path_factory.mktemp("dra-health")
    # The device taint eviction controller acts on NoExecute taints (a lost card).
    controllers = (*CLAIM_CONTROLLERS, "device-taint-eviction-controller")
    machines = {FAILING: "h100-pcie-failing"}
    with dra_plane(
        control_plane_binaries, work, machines, split=SPLIT, controllers=controllers
    ) as cp:
        yield cp


@pytest.fixture(scope="module")
def operator(plane: ControlPlane) -> Iterator[OperatorThread]:
    with dra_operator(plane, "vgpu-dra-health-config", SCHEDULER) as running:
        yield running


def taints(plane: ControlPlane, node: str) -> dict[str, list[tuple[str, str]]] | None:
    """Device name -> its (key, effect) taints, for the devices that have any."""
    found = node_slice(plane, node)
    if found is None:
        return None
    return {
        d["name"]: [(t["key"], t["effect"]) for t in d["taints"]]
        for d in found["spec"]["devices"]
        if d.get("taints")
    }


def taints_become(
    plane: ControlPlane, node: str, wanted: dict[str, list[tuple[str, str]]]
) -> float:
    """Seconds until the node's slice carries exactly ``wanted``."""
    start = time.monotonic()
    wait_for(f"{node}'s taints {wanted}", lambda: taints(plane, node) == wanted or None, 60)
    return time.monotonic() - start


def test_a_card_fault_taints_its_device_and_a_repaired_card_is_published_untainted(
    plane: ControlPlane, operator: OperatorThread, tmp_path: Path
) -> None:
    machine = tmp_path / "machine.yaml"
    shutil.copy(resolve_machine_path("l40s-pcie-4"), machine)
    plane.create_fake_gpu_node(CHANGING, gpus=0, labels={dra.NODE_PATH_LABEL: dra.PATH_DRA})
    agent: AgentThread = dra_agent(
        CHANGING, str(machine), plane.kubeconfig_path, tmp_path, split=SPLIT
    )
    try:
        wait_for("the slice", lambda: node_slice(plane, CHANGING), 60)
        assert taints(plane, CHANGING) == {}
        names = [d["name"] for d in node_slice(plane, CHANGING)["spec"]["devices"]]  # type: ignore[index]
        # A pod on card 1 and one on card 2, allocated by the engine before the faults.
        ns = fresh_namespace(plane)
        for index in (1, 2):
            exactly = {
                "deviceClassName": dra.SHARED_CLASS,
                "capacity": {"requests": {"memory": "1Gi"}},
                "selectors": [
                    {"cel": {"expression": f'device.attributes["{dra.DRIVER}"].index == {index}'}}
                ],
            }
            create_claim_template(plane, ns, f"card-{index}", exactly)
            plane.create(
                f"/api/v1/namespaces/{ns}/pods",
                claim_pod(
                    f"on-{index}", template=f"card-{index}", scheduler=SCHEDULER, node=CHANGING
                ),
            )
        for index in (1, 2):
            got = wait_for(
                f"on-{index}'s claim", lambda i=index: allocated(plane, ns, f"on-{i}"), 60
            )
            assert got["device"] == names[index]
        # A critical XID: the card is sick, NoSchedule (claims on it keep running).
        rewrite(machine, lambda body: body["gpus"][1].update(xid=48))
        sick_s = taints_become(
            plane, CHANGING, {names[1]: [(dra.UNHEALTHY_TAINT_KEY, "NoSchedule")]}
        )
        # Another card falls off the bus: lost, NoExecute (its pods' work cannot go on).
        rewrite(machine, lambda body: body["gpus"][2].update(lost=True))
        lost_s = taints_become(
            plane,
            CHANGING,
            {
                names[1]: [(dra.UNHEALTHY_TAINT_KEY, "NoSchedule")],
                names[2]: [(dra.LOST_TAINT_KEY, "NoExecute")],
            },
        )
        found = node_slice(plane, CHANGING)
        assert found is not None
        values = {
            d["name"]: d["taints"][0]["value"] for d in found["spec"]["devices"] if d.get("taints")
        }
        assert values == {names[1]: "critical-XID-48", names[2]: "GPU-is-lost-fell-off-the-bus"}
        # kube-controller-manager's device taint eviction takes the pod off the lost card;
        # the pod on the sick card keeps running (NoSchedule evicts nothing).
        wait_for("the pod on the lost card to be evicted", lambda: evicted(plane, ns, "on-2"), 60)
        assert not evicted(plane, ns, "on-1")
        # Health is sticky until the agent restarts (as HAMi's device plugin): repaired
        # and restarted, the cards are published untainted, one generation up.
        generation = found["spec"]["pool"]["generation"]
        rewrite(
            machine,
            lambda body: [body["gpus"][i].pop(k, None) for i in (1, 2) for k in ("xid", "lost")],
        )
        agent.stop()
        agent = dra_agent(CHANGING, str(machine), plane.kubeconfig_path, tmp_path, split=SPLIT)
        repaired_s = taints_become(plane, CHANGING, {})
        again = node_slice(plane, CHANGING)
        assert again is not None
        assert again["spec"]["pool"]["generation"] > generation
        print(
            f"\ncard fault -> device taint: XID {sick_s:.2f} s, lost {lost_s:.2f} s; "
            f"agent restart on repaired cards -> untainted {repaired_s:.2f} s "
            "(test settings: 0.2 s polls; shared 2-core machine)"
        )
    finally:
        agent.stop()
        plane.delete(f"/api/v1/nodes/{CHANGING}")


def evicted(plane: ControlPlane, namespace: str, name: str) -> bool:
    """Whether the pod is gone or going (deleted, or marked a disruption target)."""
    try:
        obj = plane.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except AdminRequestError as exc:
        return exc.status == 404
    if obj["metadata"].get("deletionTimestamp"):
        return True
    conditions = obj.get("status", {}).get("conditions") or []
    return any(c["type"] == "DisruptionTarget" and c["status"] == "True" for c in conditions)


def pending_message(plane: ControlPlane, namespace: str, name: str, containing: str) -> str | None:
    obj = plane.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition.get("status") == "False":
            message = str(condition.get("message", ""))
            return message if containing in message else None
    return None


def event_message(plane: ControlPlane, namespace: str, name: str, containing: str) -> str | None:
    events = plane.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    for event in events:
        if event["involvedObject"].get("name") == name and containing in event.get("message", ""):
            return str(event["message"])
    return None


def allocated(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    obj = plane.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    statuses = obj.get("status", {}).get("resourceClaimStatuses") or []
    if not obj["spec"].get("nodeName") or not statuses:
        return None
    claim = plane.get(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{statuses[0]['resourceClaimName']}"
    )
    results: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return results[0]


def test_the_engine_keeps_a_claim_off_a_tainted_card_unless_it_tolerates_the_taint(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane)
    on_sick = f'device.attributes["{dra.DRIVER}"].uuid == "{SICK}"'
    exactly: dict[str, Any] = {
        "deviceClassName": dra.SHARED_CLASS,
        "capacity": {"requests": {"memory": "1Gi"}},
        "selectors": [{"cel": {"expression": on_sick}}],
    }
    create_claim_template(plane, ns, "sick", exactly)
    plane.create(
        f"/api/v1/namespaces/{ns}/pods",
        claim_pod("on-sick", template="sick", scheduler=SCHEDULER, node=FAILING),
    )
    message = wait_for(
        "the engine to refuse the tainted card",
        lambda: pending_message(plane, ns, "on-sick", "DeviceUntoleratedTaint"),
        60,
    )
    assert "1 DeviceUntoleratedTaint" in message, message
    assert "DeviceNotSelected" not in message, message
    event = wait_for(
        "the FailedScheduling Event",
        lambda: event_message(plane, ns, "on-sick", "Devices ruled out"),
        60,
    )
    # The sick card is the news; the three cards its selector never named are not.
    ruled_out = event.split("Devices ruled out: ")[1]
    assert "1 DeviceUntoleratedTaint" in ruled_out, event
    assert "DeviceNotSelected" not in ruled_out, event
    # The same request tolerating the taint gets the card, the toleration recorded.
    tolerant = dict(exactly, tolerations=[{"key": dra.UNHEALTHY_TAINT_KEY, "operator": "Exists"}])
    create_claim_template(plane, ns, "tolerant", tolerant)
    plane.create(
        f"/api/v1/namespaces/{ns}/pods",
        claim_pod("tolerant", template="tolerant", scheduler=SCHEDULER, node=FAILING),
    )
    result = wait_for("the tolerant pod's claim", lambda: allocated(plane, ns, "tolerant"), 60)
    assert result["device"] == SICK.lower()
    assert result["tolerations"] == [{"key": dra.UNHEALTHY_TAINT_KEY, "operator": "Exists"}]
    # Claims without the toleration on that node land on the healthy cards.
    create_claim_template(plane, ns, "any", {k: v for k, v in exactly.items() if k != "selectors"})
    for i in range(3):
        plane.create(
            f"/api/v1/namespaces/{ns}/pods",
            claim_pod(f"any-{i}", template="any", scheduler=SCHEDULER, node=FAILING),
        )
    for i in range(3):
        got = wait_for(f"any-{i}'s claim", lambda i=i: allocated(plane, ns, f"any-{i}"), 60)
        assert got["device"] != SICK.lower()


def test_a_device_taint_rule_keeps_the_engine_off_its_device_until_it_goes(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane)
    healthy = "GPU-9e4c7b10-6d2a-4f83-b5a1-0fa11ed00000"
    rule = plane.create(
        f"{RESOURCE}/devicetaintrules",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": f"drain-{ns}"},
            "spec": {
                "deviceSelector": {
                    "driver": dra.DRIVER,
                    "pool": FAILING,
                    "device": healthy.lower(),
                },
                "taint": {
                    "key": "example.com/drain",
                    "value": "maintenance",
                    "effect": "NoSchedule",
                },
            },
        },
    )
    on_card = f'device.attributes["{dra.DRIVER}"].uuid == "{healthy}"'
    exactly = {
        "deviceClassName": dra.SHARED_CLASS,
        "capacity": {"requests": {"memory": "1Gi"}},
        "selectors": [{"cel": {"expression": on_card}}],
    }
    create_claim_template(plane, ns, "drained", exactly)
    plane.create(
        f"/api/v1/namespaces/{ns}/pods",
        claim_pod("drained", template="drained", scheduler=SCHEDULER, node=FAILING),
    )
    wait_for(
        "the engine to honour the rule",
        lambda: pending_message(plane, ns, "drained", "1 DeviceUntoleratedTaint"),
        60,
    )
    # The rule goes: the pod is woken and gets the card.
    plane.delete(f"{RESOURCE}/devicetaintrules/{rule['metadata']['name']}")
    result = wait_for("the pod's claim", lambda: allocated(plane, ns, "drained"), 60)
    assert result["device"] == healthy.lower()
