"""Kueue's own controller asks the placeable check about whole workloads (issue 47 item 6):
a Kueue pod group whose pods are the members of an upstream PodGroup is judged as one
gang (one domain of its topology constraint), and a pod set that uses ResourceClaims is
judged by the engine's claim fit.

One control plane of its own (Kueue's pod webhook gates every pod naming a queue):
kube-apiserver (with the alpha gate TopologyAwareWorkloadScheduling: without it the API
server drops a PodGroup's topology constraint), KWOK, kube-controller-manager's claim
controller, the DRA device classes,
Kueue v0.17 with its ``DynamicResourceAllocation`` gate and a device-class mapping (it
counts our shared class's claims as ``vgpu.io/shares``), two annotation nodes in two NVLink
islands (one 24 GiB card each), and one DRA node with its agent (four 46068 MiB L40S cards).
Pods name our scheduler themselves (no webhook here); the operator runs with the check.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from integration import operator_env as env
from integration.dra_env import (
    CLAIM_CONTROLLERS,
    RESOURCE,
    claim_pod,
    create_claim_template,
    dra_agent,
    node_slice,
)
from integration.test_agent import wait_for
from integration.test_kueue import (
    CHECK,
    GROUP_COUNT,
    GROUP_LABEL,
    KUEUE,
    QUEUE_LABEL,
    _queue_pair,
    flavor_and_check,
)

from vgpu_operator import node_leases
from vgpu_operator.control.options import PlaceableOptions
from vgpu_operator.devices import dra
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.testing import kueue
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import KWOK_STAGES, ControlPlane

pytestmark = pytest.mark.integration

GIB = 1024
ISLAND = "vgpu.io/island"
SHARES = "vgpu.io/shares"
DRA_NODE = "kueue-dra"
NAMESPACE = "kueue-whole"


@pytest.fixture(scope="module")
def plane(
    control_plane_binaries: Binaries, kueue_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    stages = kueue.kwok_stages(KWOK_STAGES)
    # A PodGroup's topology constraint is kept only with this alpha gate (1.37).
    topology = ("--feature-gates=TopologyAwareWorkloadScheduling=true",)
    with ControlPlane(
        kwok=True,
        binaries=control_plane_binaries,
        kwok_stages=stages,
        extra_apiserver_args=topology,
    ) as cp:
        env.install_crd(cp)
        for doc in yaml.safe_load_all(
            (env.REPO / "manifests" / "dra-deviceclasses.yaml").read_text()
        ):
            cp.create(f"{RESOURCE}/deviceclasses", doc)
        cp.start_controller_manager(list(CLAIM_CONTROLLERS))
        cp.start_kueue(
            kueue_binary,
            feature_gates="VisibilityOnDemand=false,DynamicResourceAllocation=true",
            device_class_mappings={SHARES: [dra.SHARED_CLASS]},
        )
        cp.create_fake_gpu_node(DRA_NODE, gpus=0, labels={dra.NODE_PATH_LABEL: dra.PATH_DRA})
        work = tmp_path_factory.mktemp("kueue-dra")
        agent = dra_agent(
            DRA_NODE,
            "l40s-pcie-4",
            cp.kubeconfig_path,
            work,
            split=4,
            sockets=Path(tempfile.mkdtemp(prefix="kq-")),
        )
        try:
            wait_for("the DRA node's slice", lambda: node_slice(cp, DRA_NODE), timeout=60)
            yield cp
        finally:
            agent.stop()


def _queue(cp: ControlPlane) -> str:
    """A ClusterQueue naming our check over HAMi's transformed resources and the DRA
    shares, and its LocalQueue."""
    flavor_and_check(cp)
    name = env.unique("whole")
    checks = [{"name": CHECK}]
    _queue_pair(
        cp, NAMESPACE, name, gpus=16, gpumem_mib=256 * GIB, checks=checks, extra={SHARES: "16"}
    )
    return name


@pytest.fixture(scope="module")
def setup(plane: ControlPlane) -> Iterator[tuple[str, str]]:
    """The queue and the operator's scheduler name, with the operator running."""
    plane.ensure_namespace(NAMESPACE)
    plane.ensure_namespace(node_leases.NAMESPACE)
    scheduler = env.new_scheduler(plane, NAMESPACE)
    queue = _queue(plane)
    options = env.options(
        plane,
        NAMESPACE,
        inventory_timeout_s=None,
        kueue_check=PlaceableOptions(hold_s=30, retry_after_s=2),
    )
    with OperatorThread(options):
        yield queue, scheduler


def _workload_state(cp: ControlPlane, group: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    for wl in cp.get(f"{KUEUE}/namespaces/{NAMESPACE}/workloads").get("items", []):
        owners = {o.get("name", "") for o in wl["metadata"].get("ownerReferences") or ()}
        if any(o.startswith(f"{group}-") for o in owners):
            for state in (wl.get("status") or {}).get("admissionChecks") or ():
                if state.get("name") == CHECK:
                    return dict(wl), dict(state)
            return dict(wl), {}
    return None


def _answered(cp: ControlPlane, group: str, state: str) -> dict[str, Any] | None:
    found = _workload_state(cp, group)
    return found[1] if found is not None and found[1].get("state") == state else None


def _admitted(cp: ControlPlane, group: str) -> bool:
    found = _workload_state(cp, group)
    return found is not None and any(
        c.get("type") == "Admitted" and c.get("status") == "True"
        for c in (found[0].get("status") or {}).get("conditions") or ()
    )


def _kueue_pod(name: str, group: str, count: int, queue: str, scheduler: str) -> dict[str, Any]:
    pod = env.gpu_pod(NAMESPACE, name, scheduler=scheduler, group=NAMESPACE, gpumem=20 * GIB)
    pod["metadata"]["labels"] = {QUEUE_LABEL: queue, GROUP_LABEL: group}
    pod["metadata"]["annotations"] = {GROUP_COUNT: str(count)}
    return pod


def test_a_kueue_pod_group_of_podgroup_members_is_judged_as_one_gang(
    plane: ControlPlane, setup: tuple[str, str]
) -> None:
    """Two nodes of one free 24 GiB card each, in two islands; two pods of 20 GiB. As
    members of a PodGroup that keeps its members in one island they fit nowhere together:
    Retry, with the group's reason, though each fits alone; as members of a PodGroup
    without the constraint: Ready, admitted, and bound one per node."""
    queue, scheduler = setup
    cp = plane
    for island in ("one", "two"):
        name = f"{NAMESPACE}-{island}"
        env.gpu_node(cp, name, env.cards(name, 1, memory_mib=24 * GIB), group=NAMESPACE)
        cp.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {ISLAND: island}}})
    for group, topology in (("tight", [{"key": ISLAND}]), ("loose", None)):
        spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": 2}}}
        if topology:
            spec["schedulingConstraints"] = {"topology": topology}
        made = cp.create(
            f"/apis/{gangs.API_VERSION}/namespaces/{NAMESPACE}/podgroups",
            {"apiVersion": gangs.API_VERSION, "kind": "PodGroup", "metadata": {"name": group},
             "spec": spec},
        )  # fmt: skip
        assert made["spec"].get("schedulingConstraints") == spec.get("schedulingConstraints")
    for i in range(2):
        pod = _kueue_pod(f"tight-{i}", "tight", 2, queue, scheduler)
        pod["spec"]["schedulingGroup"] = {"podGroupName": "tight"}
        env.create_pod(cp, pod)
    # Kueue's webhook keeps the field its own Pod type does not know.
    assert env.get_pod(cp, NAMESPACE, "tight-0")["spec"]["schedulingGroup"] == {
        "podGroupName": "tight"
    }
    state = wait_for("the tight group's Retry", lambda: _answered(cp, "tight", "Retry"), 60)
    assert f"pod group {NAMESPACE}/tight" in state["message"]
    assert f"in one {ISLAND} domain" in state["message"]
    for i in range(2):
        pod = env.get_pod(cp, NAMESPACE, f"tight-{i}")
        assert pod["spec"].get("schedulingGates")
        assert not pod["spec"].get("nodeName")
        cp.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/tight-{i}")
    for i in range(2):
        pod = _kueue_pod(f"loose-{i}", "loose", 2, queue, scheduler)
        pod["spec"]["schedulingGroup"] = {"podGroupName": "loose"}
        env.create_pod(cp, pod)
    wait_for("the loose group's admission", lambda: _admitted(cp, "loose"), 60)
    bound = [env.wait_bound(cp, NAMESPACE, f"loose-{i}", 60) for i in range(2)]
    assert sorted(p["spec"]["nodeName"] for p in bound) == [f"{NAMESPACE}-one", f"{NAMESPACE}-two"]


def test_a_dra_pod_set_is_judged_by_the_claim_fit(
    plane: ControlPlane, setup: tuple[str, str]
) -> None:
    """Four L40S cards of 45 GiB and five pods whose claims ask 40 GiB each: Kueue counts
    five shares (within its quota) and the check answers Retry with the claim fit's device
    counts (pod 5 fits nowhere); four such pods are Ready, admitted and bound, one per card."""
    queue, scheduler = setup
    cp = plane
    exactly = {"deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": {"memory": "40Gi"}}}
    create_claim_template(cp, NAMESPACE, "most-of-a-card", exactly)

    def group(name: str, count: int) -> None:
        for i in range(count):
            body = claim_pod(f"{name}-{i}", template="most-of-a-card", scheduler=scheduler)
            body["metadata"]["labels"] = {QUEUE_LABEL: queue, GROUP_LABEL: name}
            body["metadata"]["annotations"] = {GROUP_COUNT: str(count)}
            body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": DRA_NODE}
            cp.create(f"/api/v1/namespaces/{NAMESPACE}/pods", body)

    group("five", 5)
    state = wait_for("the five pods' Retry", lambda: _answered(cp, "five", "Retry"), 60)
    assert "pod 5 of 5 fits on no node now" in state["message"], state["message"]
    for i in range(5):
        assert not env.get_pod(cp, NAMESPACE, f"five-{i}")["spec"].get("nodeName")
        cp.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/five-{i}")
    group("four", 4)
    wait_for("the four pods' admission", lambda: _admitted(cp, "four"), 60)
    bound = [env.wait_bound(cp, NAMESPACE, f"four-{i}", 90) for i in range(4)]
    assert {p["spec"]["nodeName"] for p in bound} == {DRA_NODE}
    devices = set()
    for pod in bound:
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = cp.get(
            f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{status['resourceClaimName']}"
        )
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        devices.add(result["device"])
    assert len(devices) == 4
