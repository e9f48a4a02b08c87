"""A mapped extended resource served on either path on the live API server (issue 47
item 7, ``either_plugin``): with the shared class naming ``extendedResourceName:
nvidia.com/gpu``, a cluster with a DRA node (its agent's slice) and a device-plugin node
(its DeviceInventory, ``nvidia.com/gpu`` in its allocatable): a ``nvidia.com/gpu`` pod of
the operator's scheduler is bound to the device-plugin node with HAMi's annotations and no
special claim when only that node fits, to the DRA node through its special claim when
only that fits, and a pod neither can take is refused with both paths' reasons."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from integration import operator_env as env
from integration.dra_env import RESOURCE, dra_operator, dra_plane, fresh_namespace
from integration.test_agent import wait_for
from integration.test_dra_extended import _map_nvidia_gpu, bound, gpu_pod

from vgpu_operator.devices import nvidia
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import ControlPlane

pytestmark = pytest.mark.integration

DRA_NODE = "dra-either"  # four 46,068 MiB L40S cards, as DRA devices
DP_NODE = "dp-either"  # one 81,920 MiB card, through the device plugin
SCHEDULER = "vgpu-dra-extended"  # the scheduler name ``gpu_pod`` writes


def _mixed(cp: ControlPlane) -> None:
    _map_nvidia_gpu(cp)
    cp.create_fake_gpu_node(DP_NODE, gpus=1)
    env.write_inventory(cp, DP_NODE, env.cards("dp", 1, memory_mib=81920))


@pytest.fixture(scope="module")
def plane(
    control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    work = tmp_path_factory.mktemp("dra-either")
    with dra_plane(
        control_plane_binaries, work, {DRA_NODE: "l40s-pcie-4"}, split=4, before_scheduler=_mixed
    ) as cp:
        yield cp


@pytest.fixture(scope="module")
def operator(plane: ControlPlane) -> Iterator[OperatorThread]:
    with dra_operator(plane, "vgpu-dra-either-config", SCHEDULER) as running:
        yield running


def claims_of(plane: ControlPlane, namespace: str) -> list[Any]:
    return list(plane.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")["items"])


def test_only_the_device_plugin_node_fits_so_the_pod_is_bound_there_without_a_claim(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane, "either")
    gpu_pod(plane, ns, "big", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "60000"})
    pod = wait_for("the pod bound", lambda: bound(plane, ns, "big"), 60)
    assert pod["spec"]["nodeName"] == DP_NODE
    allocation = pod["metadata"]["annotations"][nvidia.TO_ALLOCATE_ANNOTATION]
    assert allocation == ";GPU-dp-0,NVIDIA,60000,0:;"  # the sidecar asks none
    assert "extendedResourceClaimStatus" not in (pod.get("status") or {})
    assert claims_of(plane, ns) == []


def test_only_the_dra_node_fits_so_the_pod_gets_its_special_claim(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane, "either")
    gpu_pod(plane, ns, "pair", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "10240"})
    pod = wait_for("the pod bound", lambda: bound(plane, ns, "pair"), 60)
    assert pod["spec"]["nodeName"] == DRA_NODE
    name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    [claim] = claims_of(plane, ns)
    assert claim["metadata"]["name"] == name
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["pool"] for r in results} == {DRA_NODE}
    assert len({r["device"] for r in results}) == 2
    assert nvidia.TO_ALLOCATE_ANNOTATION not in (pod["metadata"].get("annotations") or {})


def test_a_pod_neither_path_can_take_is_refused_with_both_reasons(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    """After the first test the device-plugin card has 21,920 MiB free: half of it is
    too much there, and no claim can say a percentage."""
    ns = fresh_namespace(plane, "either")
    gpu_pod(plane, ns, "half", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"})

    def refused() -> str | None:
        obj = plane.get(f"/api/v1/namespaces/{ns}/pods/half")
        for condition in obj.get("status", {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition.get("status") == "False":
                message = str(condition.get("message", ""))
                return message if "ExtendedClaimRefused" in message else None
        return None

    message = wait_for("the refusal", refused, 60)
    assert "CardInsufficientMemory" in message
    assert "DRA nodes cannot serve it" in message
    assert "gpumem-percentage" in message
    assert claims_of(plane, ns) == []
    assert bound(plane, ns, "half") is None
