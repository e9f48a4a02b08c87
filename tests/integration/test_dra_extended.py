"""Extended resources backed by DRA (KEP-5004, issue 39) on the live API server: a plain
``nvidia.com/gpu`` pod of the operator's scheduler, on a DRA node whose shared class names
``extendedResourceName: nvidia.com/gpu`` (examples/dra/extended-resource.yaml), gets its
special claim made, allocated and reserved, its ``extendedResourceClaimStatus`` written,
and is bound; what a claim cannot say is refused with a sentence on the pod."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from integration.dra_env import (
    RESOURCE,
    TOLERATE_KWOK,
    dra_agent,
    dra_operator,
    dra_plane,
    fresh_namespace,
    node_slice,
)
from integration.test_agent import AgentThread, wait_for
from integration.test_deviceplugin_conformance import require_harness
from integration.test_dra_conformance import HARNESS, HARNESS_ENV, DraKubelet

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import catalog, dra
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.kube import claims as kube_claims
from vgpu_operator.kube.client import api_client
from vgpu_operator.scheduling.dialects.claims import extended_claims
from vgpu_operator.scheduling.vendors import Vendors
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane

pytestmark = pytest.mark.integration

NODE = "dra-ext"
SCHEDULER = "vgpu-dra-extended"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dra" / "extended-resource.yaml"


def _map_nvidia_gpu(cp: ControlPlane) -> None:
    """Apply the example: the shared class with extendedResourceName."""
    wanted = yaml.safe_load(EXAMPLE.read_text())
    path = f"{RESOURCE}/deviceclasses/{dra.SHARED_CLASS}"
    current = cp.get(path)
    wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    cp.request("PUT", path, wanted)


@pytest.fixture(scope="module")
def plane(
    control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    work = tmp_path_factory.mktemp("dra-extended")
    with dra_plane(
        control_plane_binaries,
        work,
        {NODE: "l40s-pcie-4"},
        split=4,
        before_scheduler=_map_nvidia_gpu,
    ) as cp:
        yield cp


@pytest.fixture(scope="module")
def operator(plane: ControlPlane) -> Iterator[OperatorThread]:
    with dra_operator(plane, "vgpu-dra-extended-config", SCHEDULER) as running:
        yield running


@pytest.fixture(scope="module")
def kubelet_harness() -> Path:
    return require_harness(HARNESS, HARNESS_ENV, "kubelet's DRA manager")


def gpu_pod(
    plane: ControlPlane,
    namespace: str,
    name: str,
    limits: dict[str, str],
    node: str | None = None,
) -> None:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": SCHEDULER,
            "tolerations": TOLERATE_KWOK,
            "containers": [
                {"name": "sidecar", "image": "busybox"},
                {"name": "main", "image": "cuda", "resources": {"limits": limits}},
            ],
        },
    }
    if node is not None:
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    plane.create(f"/api/v1/namespaces/{namespace}/pods", body)


def bound(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    obj = plane.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return obj if obj["spec"].get("nodeName") else None


def test_the_class_keeps_its_extended_resource_name(plane: ControlPlane) -> None:
    found = plane.get(f"{RESOURCE}/deviceclasses/{dra.SHARED_CLASS}")
    assert found["spec"].get("extendedResourceName") == "nvidia.com/gpu"


def test_a_gpu_pod_gets_its_special_claim_allocated_and_is_bound(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane, "ext")
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "25"}
    gpu_pod(plane, ns, "first", limits)
    pod = wait_for("the pod bound", lambda: bound(plane, ns, "first"), 60)
    assert pod["spec"]["nodeName"] == NODE
    status = pod["status"]["extendedResourceClaimStatus"]
    name = status["resourceClaimName"]
    assert name.startswith("first-extended-resources-")
    assert status["requestMappings"] == [
        {
            "containerName": "main",
            "resourceName": "nvidia.com/gpu",
            "requestName": "container-1-request-0",
        }
    ]
    claim = plane.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
    meta = claim["metadata"]
    assert meta["annotations"][extended_claims.ANNOTATION] == "true"
    [owner] = meta["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "Pod",
        pod["metadata"]["uid"],
        True,
    )
    assert "resource.kubernetes.io/delete-protection" in meta["finalizers"]
    [request] = claim["spec"]["devices"]["requests"]
    assert request["name"] == "container-1-request-0"
    assert request["exactly"]["deviceClassName"] == dra.SHARED_CLASS
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["request"] == "container-1-request-0"
    assert result["pool"] == NODE
    assert parse_quantity(result["consumedCapacity"]["memory"]) == 10240 * 2**20
    assert parse_quantity(result["consumedCapacity"]["cores"]) == 25
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
    # The claim as the API server stores it reads as the pod's own special claim (its
    # defaults and quantity spellings are no difference).
    vendors = Vendors(DeviceConfig(), catalog.VENDOR_TABLE)
    mapping = {"nvidia.com/gpu": dra.SHARED_CLASS}
    again = extended_claims.special(pod, mapping, {f"{ns}/{name}": claim}, vendors)
    assert not again.new


def test_a_share_a_claim_cannot_say_is_refused_on_the_pod(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane, "ext")
    gpu_pod(plane, ns, "half", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"})

    def refused() -> str | None:
        obj = plane.get(f"/api/v1/namespaces/{ns}/pods/half")
        for condition in obj.get("status", {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition.get("status") == "False":
                message = str(condition.get("message", ""))
                return message if "gpumem-percentage" in message else None
        return None

    message = wait_for("the refusal", refused, 60)
    assert "cannot be expressed as a DRA claim" in message
    claims = plane.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims")["items"]
    assert claims == []


def test_kubelets_dra_manager_prepares_the_special_claim_for_its_container(
    plane: ControlPlane, operator: OperatorThread, kubelet_harness: Path, tmp_path: Path
) -> None:
    """kubelet's own DRA manager (the harness) prepares the claim the engine made, and
    hands its devices to the container the pod's request mappings name, not the other."""
    node = "dra-ext-kubelet"
    plane.create_fake_gpu_node(node, gpus=0, labels={dra.NODE_PATH_LABEL: dra.PATH_DRA})
    root = Path(tempfile.mkdtemp(prefix="dra-"))
    kubelet = DraKubelet(
        kubelet_harness,
        root / "kubelet",
        tmp_path / "cdi",
        plane.kubeconfig_path,
        node,
        tmp_path / "kubelet.log",
    )
    agent: AgentThread | None = None
    try:
        kubelet.ok("start")
        agent = dra_agent(
            node,
            "l40s-pcie-4",
            plane.kubeconfig_path,
            tmp_path,
            split=4,
            registry_dir=root / "kubelet" / "plugins_registry",
            sockets=root,
        )
        wait_for(f"{node}'s slice", lambda: node_slice(plane, node), 60)
        kubelet.ok("wait_registered", driver=dra.DRIVER)
        ns = fresh_namespace(plane, "ext")
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "25"}
        gpu_pod(plane, ns, "prepared", limits, node=node)
        pod = wait_for("the pod bound", lambda: bound(plane, ns, "prepared"), 60)
        assert pod["spec"]["nodeName"] == node
        prepared = kubelet.ok("prepare", pod=pod)
        assert prepared["spec_errors"] == []
        sidecar, main = prepared["containers"]
        name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        claim = plane.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
        uid = claim["metadata"]["uid"]
        assert main["cdi_devices"] == [f"vgpu-operator.io/gpu={uid}-0"]
        assert main["env"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10240m"
        assert main["env"]["CUDA_DEVICE_SM_LIMIT"] == "25"
        assert sidecar["cdi_devices"] == []
        kubelet.ok("unprepare", pod=pod)
    finally:
        if agent is not None:
            agent.stop()
        kubelet.close()
        shutil.rmtree(root, ignore_errors=True)


def test_a_special_claim_made_for_a_pod_not_bound_is_deleted_again(
    plane: ControlPlane,
) -> None:
    """What ``claim_binding`` does when the Binding fails, on the live API server: the
    claim created, allocated and reserved with the delete-protection finalizer is taken
    apart (allocation, finalizer) and deleted."""
    ns = fresh_namespace(plane, "ext")
    pod = plane.create(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "unbound"},
            "spec": {
                "schedulerName": "nobody",
                "containers": [
                    {
                        "name": "main",
                        "image": "cuda",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        },
    )
    name = extended_claims.claim_name(pod)
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": "in-memory",
            "resourceVersion": "",
            "annotations": {extended_claims.ANNOTATION: "true"},
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "container-0-request-0",
                        "exactly": {"deviceClassName": dra.SHARED_CLASS},
                    }
                ]
            }
        },
    }
    device = node_slice(plane, NODE)["spec"]["devices"][0]["name"]  # type: ignore[index]
    allocation = {
        "devices": {
            "results": [
                {
                    "request": "container-0-request-0",
                    "driver": dra.DRIVER,
                    "pool": NODE,
                    "device": device,
                    "shareID": str(uuid.uuid4()),
                    "consumedCapacity": {"memory": "1Gi", "cores": "0", "shares": "1"},
                }
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
            ]
        },
    }
    consumer = {"resource": "pods", "name": "unbound", "uid": pod["metadata"]["uid"]}
    path = f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}"

    async def made_then_discarded() -> None:
        async with api_client(str(plane.kubeconfig_path)) as api:
            created = await kube_claims.create_claim(api, claim)
            assert created is not None
            assert await kube_claims.create_claim(api, claim) is None  # the name is taken
            written = await kube_claims.allocate(api, created, allocation, consumer)
            assert written is kube_claims.WriteOutcome.WRITTEN
            stored = plane.get(path)
            assert kube_claims.FINALIZER in stored["metadata"]["finalizers"]
            assert stored["status"]["reservedFor"] == [consumer]
            mapping = {
                "containerName": "main",
                "resourceName": "nvidia.com/gpu",
                "requestName": "container-0-request-0",
            }
            status = {"resourceClaimName": name, "requestMappings": [mapping]}
            assert await kube_claims.write_extended_status(api, ns, "unbound", status)
            await kube_claims.discard_claim(api, ns, name)

    asyncio.run(made_then_discarded())
    with pytest.raises(AdminRequestError) as gone:
        plane.get(path)
    assert gone.value.status == 404
    written_status = plane.get(f"/api/v1/namespaces/{ns}/pods/unbound")["status"]
    assert written_status["extendedResourceClaimStatus"]["resourceClaimName"] == name
