"""The demo's DRA part: one node on the DRA path, one claim allocated by kube-scheduler,
and what its container would receive.

A KWOK node labelled for DRA whose agent publishes its four L40S cards as a ResourceSlice;
kube-controller-manager's resource claim controller makes the pod's claim from its
template, kube-scheduler allocates a share of one card (10 GiB, 25 % of its cores) and
binds the pod; then, as kubelet would on admission, the agent's DRA plugin is asked to
prepare the claim, and the CDI spec it wrote shows HAMi-core's settings for the share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from vgpu_operator.agent.dra.kubelet_standin import prepare_claim
from vgpu_operator.demo.nodes import AgentFleet, DemoNode, create_nodes
from vgpu_operator.demo.settings import DemoError, Say, wait_for
from vgpu_operator.devices import dra
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.testing.controlplane import ControlPlane

DRA_NODE: Final = DemoNode("gpu-dra-l40s", "l40s-pcie-4", cpu="64", memory="512Gi", dra=True)
NAMESPACE: Final = "vgpu-demo-dra"
POD: Final = "dra-share"
TEMPLATE: Final = "l40s-quarter"
RESOURCE: Final = "/apis/resource.k8s.io/v1"
#: What the claim asks of one card.
ASKED: Final = {"memory": "10Gi", "cores": "25"}


@dataclass(frozen=True, slots=True)
class DraClaimShown:
    """The claim as kube-scheduler allocated it, and what its container receives."""

    pod: str
    node: str
    claim: str
    device: str
    memory_mib: int
    cores: int
    share_id: str
    cdi_ids: tuple[str, ...]
    #: The container's environment from the claim's CDI spec (HAMi-core's settings).
    env: Mapping[str, str]
    #: Container path -> host path of the spec's mounts.
    mounts: Mapping[str, str]


def run_dra_claim(cp: ControlPlane, say: Say, timeout_s: float) -> DraClaimShown:
    """Start kube-scheduler and the claim controller, the DRA node and its agent, and
    follow one claim from template to prepared CDI spec."""
    say("DRA: kube-scheduler, the resource claim controller and a node on the DRA path...")
    cp.start_controller_manager(["resourceclaim-controller"])
    cp.start_scheduler()
    for device_class in dra.device_classes():
        cp.create(f"{RESOURCE}/deviceclasses", device_class)
    create_nodes(cp, [DRA_NODE])
    home = cp.workdir / "dra"
    fleet = AgentFleet(cp.kubeconfig_path, [DRA_NODE], plugin_root=home)
    fleet.start()
    try:
        wait_for(f"{DRA_NODE.name}'s ResourceSlice", lambda: _slice(cp), timeout_s)
        cp.ensure_namespace(NAMESPACE)
        cp.create(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaimtemplates", _template())
        cp.create(f"/api/v1/namespaces/{NAMESPACE}/pods", _pod())
        claim = wait_for("kube-scheduler to allocate the claim", lambda: _allocated(cp), timeout_s)
        plugin_home = home / DRA_NODE.name
        meta = claim["metadata"]
        prepared = asyncio.run(
            prepare_claim(
                plugin_home / "plugins" / dra.DRIVER / "dra.sock",
                plugin_home / "cdi",
                meta["namespace"],
                meta["name"],
                meta["uid"],
            )
        )
    finally:
        fleet.stop()
    if prepared.error or prepared.spec is None:
        raise DemoError(f"the DRA plugin did not prepare the claim: {prepared.error}")
    return _shown(cp, claim, prepared.cdi_ids, prepared.spec)


def _template() -> dict[str, Any]:
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": ASKED}},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def _pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD},
        "spec": {
            "containers": [
                {"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
        },
    }


def _slice(cp: ControlPlane) -> dict[str, Any] | None:
    query = f"fieldSelector=spec.nodeName%3D{DRA_NODE.name}"
    found = cp.request("GET", f"{RESOURCE}/resourceslices?{query}")["items"]
    return found[0] if found else None


def _allocated(cp: ControlPlane) -> dict[str, Any] | None:
    pod = cp.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}")
    statuses = pod.get("status", {}).get("resourceClaimStatuses") or []
    if not pod["spec"].get("nodeName") or not statuses:
        return None
    name = statuses[0].get("resourceClaimName")
    return cp.get(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{name}") if name else None


def _shown(
    cp: ControlPlane, claim: Mapping[str, Any], cdi_ids: tuple[str, ...], spec: Mapping[str, Any]
) -> DraClaimShown:
    result = claim["status"]["allocation"]["devices"]["results"][0]
    consumed = result.get("consumedCapacity") or {}
    pod = cp.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}")
    env_lines = [*spec["containerEdits"]["env"]]
    for device in spec["devices"]:
        env_lines += device["containerEdits"].get("env") or []
    return DraClaimShown(
        pod=f"{NAMESPACE}/{POD}",
        node=pod["spec"]["nodeName"],
        claim=claim["metadata"]["name"],
        device=result["device"],
        memory_mib=int(parse_quantity(consumed.get("memory", 0)) // dra.MIB),
        cores=int(parse_quantity(consumed.get("cores", 0))),
        share_id=str(result.get("shareID", "")),
        cdi_ids=cdi_ids,
        env=dict(line.split("=", 1) for line in env_lines),
        mounts={m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]},
    )


def render_dra_claim(shown: DraClaimShown) -> list[str]:
    """The lines the demo prints for the claim."""
    lines = [
        "DRA: one claim allocated by kube-scheduler on a node whose agent is its DRA driver:",
        f"  pod {shown.pod} on {shown.node}, claim {shown.claim}",
        f"  device {shown.device}: {shown.memory_mib} MiB, {shown.cores} % of its cores "
        f"(share {shown.share_id})",
        f"  prepared by the node's DRA plugin as CDI device {', '.join(shown.cdi_ids)};",
        "  what its container receives:",
    ]
    lines += [f"    {key}={value}" for key, value in sorted(shown.env.items())]
    lines += [f"    mount {path} <- {host}" for path, host in sorted(shown.mounts.items())]
    return lines
