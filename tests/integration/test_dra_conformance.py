"""The agent's DRA plugin driven by kubelet's own DRA code (issue 25).

``hack/dra-conformance`` runs kubelet's plugin manager (the watcher of its plugin registry
directory) with kubelet's DRA manager (``pkg/kubelet/cm/dra``) as the DRA handler, at the
pinned Kubernetes version, reading claims from the real API server. The agent (simulated
machine, KWOK node labelled for DRA) registers through its socket in the harness's
registry directory; the harness prepares a pod's claim, resolves the CDI spec the plugin
wrote with the CDI reference library into the container edits a runtime applies, restarts
(kubelet's checkpoint and a fresh registration), and unprepares.

The claim's allocation is written here as an allocator would (kube-scheduler's own
allocation is test_dra_scheduling's subject). The harness is built by
``make dra-conformance`` (``make test`` does it); without it these tests skip, or fail
when VGPU_REQUIRE_CONTROL_PLANE is set.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from integration import operator_env as env
from integration.dra_env import RESOURCE, dra_agent, node_slice
from integration.test_agent import AgentThread, rewrite, wait_for
from integration.test_deviceplugin_conformance import Kubelet, require_harness

from vgpu_operator.agent.sim_machine import resolve_machine_path
from vgpu_operator.devices import dra
from vgpu_operator.testing.controlplane import ControlPlane

HARNESS = "dra-conformance"
HARNESS_ENV = "VGPU_DRA_CONFORMANCE"
SPLIT = 4
CARD = "GPU-0b7e2c41-5a66-4f1e-8c2d-4a5b00000001"  # l40s-pcie-4, index 1


@pytest.fixture(scope="session")
def dra_harness() -> Path:
    return require_harness(HARNESS, HARNESS_ENV, "kubelet's DRA manager")


class DraKubelet(Kubelet):
    """The harness process (same line protocol as the device-plugin one)."""

    def __init__(
        self, binary: Path, directory: Path, cdi_dir: Path, kubeconfig: Path, node: str, log: Path
    ) -> None:
        self.argv = [
            str(binary),
            "-dir",
            str(directory),
            "-cdi-dir",
            str(cdi_dir),
            "-kubeconfig",
            str(kubeconfig),
            "-node",
            node,
            "-v",
            "4",
        ]
        self.directory = directory
        self.log = log
        self._log_file = log.open("w")
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
        )


@dataclass
class DraNode:
    name: str
    kubelet: DraKubelet
    cdi_dir: Path
    hami_core_dir: Path
    #: The agent's machine file (a copy of l40s-pcie-4): rewrite it to make a card fail.
    machine: Path


@pytest.fixture
def dra_node(
    dra_harness: Path, control_plane: ControlPlane, kubeconfig_env: Path, tmp_path: Path
) -> Iterator[DraNode]:
    env.install_crd(control_plane)
    name = f"dra-{uuid.uuid4().hex[:8]}"
    control_plane.create_fake_gpu_node(name, gpus=0, labels={dra.NODE_PATH_LABEL: dra.PATH_DRA})
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
    root = Path(tempfile.mkdtemp(prefix="dra-"))
    cdi_dir = tmp_path / "cdi"
    kubelet = DraKubelet(
        dra_harness, root / "kubelet", cdi_dir, kubeconfig_env, name, tmp_path / "kubelet.log"
    )
    agent: AgentThread | None = None
    machine = tmp_path / "machine.yaml"
    shutil.copy(resolve_machine_path("l40s-pcie-4"), machine)
    try:
        kubelet.ok("start")
        agent = dra_agent(
            name,
            str(machine),
            kubeconfig_env,
            tmp_path,
            split=SPLIT,
            registry_dir=root / "kubelet" / "plugins_registry",
            sockets=root,
        )
        wait_for(f"{name}'s slice", lambda: node_slice(control_plane, name), 60)
        yield DraNode(name, kubelet, cdi_dir, tmp_path / "vgpu", machine)
    finally:
        if agent is not None:
            agent.stop()
        kubelet.close()
        shutil.rmtree(root, ignore_errors=True)
        control_plane.delete(f"{env.INVENTORIES}/{name}")
        control_plane.delete(f"/api/v1/nodes/{name}")


def allocated_pod(
    plane: ControlPlane,
    namespace: str,
    node: str,
    *,
    consumed: dict[str, str],
    allocated_to: str | None = None,
) -> dict[str, Any]:
    """A claim allocated (as an allocator writes it) on ``node``'s card 1 and reserved for a
    pod bound to ``node``; the pod as the API server has it."""
    claim = plane.create(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gpu"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.SHARED_CLASS}}]
                }
            },
        },
    )
    pod = plane.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "train"},
            "spec": {
                "nodeName": node,
                "containers": [
                    {"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}},
                    {"name": "sidecar", "image": "busybox"},
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
            },
        },
    )
    pool = allocated_to or node
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": dra.DRIVER,
                        "pool": pool,
                        "device": CARD.lower(),
                        "shareID": str(uuid.uuid4()),
                        "consumedCapacity": consumed,
                    }
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pool]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": "train", "uid": pod["metadata"]["uid"]}],
    }
    plane.request("PUT", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/gpu/status", claim)
    return pod


QUARTER = {"memory": "10Gi", "cores": "25", "shares": "1"}


def test_kubelet_registers_prepares_resolves_restarts_and_unprepares(
    dra_node: DraNode, control_plane: ControlPlane, namespace: str
) -> None:
    kubelet = dra_node.kubelet
    kubelet.ok("wait_registered", driver=dra.DRIVER)
    pod = allocated_pod(control_plane, namespace, dra_node.name, consumed=QUARTER)
    prepared = kubelet.ok("prepare", pod=pod)
    assert prepared["spec_errors"] == []
    main, sidecar = prepared["containers"]
    claim = control_plane.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/gpu")
    uid = claim["metadata"]["uid"]
    assert main["cdi_devices"] == [f"vgpu-operator.io/gpu={uid}-0"]
    # Exactly the share's settings, as the CDI library hands them to the runtime.
    assert main["env"] == {
        "NVIDIA_VISIBLE_DEVICES": CARD,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "10240m",
        "CUDA_DEVICE_SM_LIMIT": "25",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"/usr/local/vgpu/{uid}.cache",
    }
    hook = dra_node.hami_core_dir
    assert {(m["destination"], m["source"]) for m in main["mounts"]} == {
        ("/usr/local/vgpu", f"{hook}/claims/{uid}"),
        ("/usr/local/vgpu/libvgpu.so", f"{hook}/libvgpu.so"),
        ("/tmp/vgpulock", "/tmp/vgpulock"),
        ("/etc/ld.so.preload", f"{hook}/ld.so.preload"),
    }
    assert (hook / "claims" / uid).is_dir()
    # A container that names no claim gets nothing.
    assert sidecar["cdi_devices"] == []
    assert sidecar["env"] == {}

    # A kubelet restart: the plugin is found again, the prepared claim is in kubelet's
    # checkpoint, and the CDI spec is still there for the runtime.
    kubelet.ok("restart")
    kubelet.ok("wait_registered", driver=dra.DRIVER)
    again = kubelet.ok("resources", pod=pod)
    assert again["containers"][0]["env"] == main["env"]
    # Prepare repeated after the restart changes nothing.
    assert kubelet.ok("prepare", pod=pod)["containers"][0] == main

    kubelet.ok("unprepare", pod=pod)
    assert list(dra_node.cdi_dir.glob("*.json")) == []
    assert not (hook / "claims" / uid).exists()


def test_a_claim_allocated_to_another_node_is_refused_with_the_reason(
    dra_node: DraNode, control_plane: ControlPlane, namespace: str
) -> None:
    kubelet = dra_node.kubelet
    kubelet.ok("wait_registered", driver=dra.DRIVER)
    pod = allocated_pod(
        control_plane, namespace, dra_node.name, consumed=QUARTER, allocated_to="elsewhere"
    )
    reply = kubelet.call("prepare", pod=pod)
    assert not reply["ok"]
    assert f"not to {dra_node.name}" in reply["error"]
    assert list(dra_node.cdi_dir.glob("*.json")) == []


def test_a_claim_asking_more_than_the_card_has_is_refused(
    dra_node: DraNode, control_plane: ControlPlane, namespace: str
) -> None:
    kubelet = dra_node.kubelet
    kubelet.ok("wait_registered", driver=dra.DRIVER)
    pod = allocated_pod(
        control_plane, namespace, dra_node.name, consumed={"memory": "60Gi", "cores": "25"}
    )
    reply = kubelet.call("prepare", pod=pod)
    assert not reply["ok"]
    assert "which has 46068 MiB" in reply["error"]


def allocated_status(kubelet: DraKubelet, pod: dict[str, Any]) -> dict[str, Any]:
    """Container name -> its allocatedResourcesStatus, as kubelet would write it now."""
    reply = kubelet.ok("health", pod=pod)
    return {c["name"]: c["allocatedResourcesStatus"] for c in reply["containers"]}


def test_kubelet_shows_a_card_fault_in_the_pods_allocated_resources_status(
    dra_node: DraNode, control_plane: ControlPlane, namespace: str
) -> None:
    kubelet = dra_node.kubelet
    kubelet.ok("wait_registered", driver=dra.DRIVER)
    pod = allocated_pod(control_plane, namespace, dra_node.name, consumed=QUARTER)
    kubelet.ok("prepare", pod=pod)
    uid = control_plane.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/gpu")["metadata"][
        "uid"
    ]
    resource = f"vgpu-operator.io/gpu={uid}-0"  # kubelet names the device by its CDI ID

    def shown(health: str, message: str | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {"resourceID": resource, "health": health}
        if message is not None:
            entry["message"] = message
        return {"main": [{"name": "claim:gpu", "resources": [entry]}], "sidecar": []}

    # The stream reported every card when kubelet opened it at registration.
    assert allocated_status(kubelet, pod) == shown("Healthy")
    # The card the claim holds raises a critical XID: kubelet is told, and the pod's
    # status would say Unhealthy with the agent's reason.
    start = time.monotonic()
    rewrite(dra_node.machine, lambda body: body["gpus"][1].update(xid=48))
    assert kubelet.ok("wait_health_update", timeout_s=30)["pods"] == [pod["metadata"]["uid"]]
    sick_s = time.monotonic() - start
    assert allocated_status(kubelet, pod) == shown("Unhealthy", "critical XID 48")
    # Then it falls off the bus: lost, which the message says first.
    start = time.monotonic()
    rewrite(dra_node.machine, lambda body: body["gpus"][1].update(lost=True))
    assert kubelet.ok("wait_health_update", timeout_s=30)["pods"] == [pod["metadata"]["uid"]]
    lost_s = time.monotonic() - start
    assert allocated_status(kubelet, pod) == shown(
        "Unhealthy", "card lost: GPU is lost (fell off the bus)"
    )
    print(
        f"\ncard fault -> kubelet's health update for the pod: XID {sick_s:.2f} s, "
        f"lost {lost_s:.2f} s (test settings: 0.2 s polls; shared 2-core machine)"
    )
    kubelet.ok("unprepare", pod=pod)
