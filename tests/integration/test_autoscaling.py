"""Karpenter on the live harness, and the engine's autoscaling with it (``make karpenter``;
docs/autoscaling.md).

Karpenter's controller with its KWOK provider runs against the test API server with three
GPU instance types (``karpenter_env.GPU_TYPES``: 8x H100, 4x L40S, one A100 in MIG mode),
each described by the cards the agent reports on the matching simulated machine. Every node
Karpenter makes gets its agent (``karpenter_env.NodeAgents``), so its DeviceInventory and
Lease appear as on a real node. Karpenter acts on every unschedulable pod of the cluster,
so this module runs its own control plane.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from integration import karpenter_env
from integration import operator_env as env

from vgpu_operator import node_leases
from vgpu_operator.testing import karpenter
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import ControlPlane

pytestmark = pytest.mark.integration

INVENTORIES = env.INVENTORIES


class Harness:
    def __init__(self, cp: ControlPlane, agents: karpenter_env.NodeAgents, work: Path) -> None:
        self.cp = cp
        self.agents = agents
        self.work = work


@pytest.fixture(scope="module")
def harness(
    control_plane_binaries: Binaries,
    karpenter_binary: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Harness]:
    work = tmp_path_factory.mktemp("karpenter")
    types_file, machines = karpenter_env.write_instance_types(work)
    with ControlPlane(kwok=True, binaries=control_plane_binaries) as plane:
        plane.ensure_namespace(node_leases.NAMESPACE)
        env.install_crd(plane)
        plane.start_karpenter(types_file, karpenter_binary)
        with karpenter_env.NodeAgents(plane, machines, plane.kubeconfig_path) as agents:
            yield Harness(plane, agents, work)


def _mark_unschedulable(cp: ControlPlane, namespace: str, name: str) -> None:
    """What kube-scheduler writes on a pod no node holds (Karpenter acts on it)."""
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/0 nodes are available",
        "lastTransitionTime": env.rfc3339(),
    }
    cp.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        {"status": {"conditions": [condition]}},
        content_type="application/strategic-merge-patch+json",
    )


def _inventory_of(cp: ControlPlane, node: str) -> dict[str, Any] | None:
    try:
        obj = cp.get(f"{INVENTORIES}/{node}")
    except Exception:
        return None
    return obj if (obj.get("status") or {}).get("devices") else None


def test_karpenter_makes_a_node_whose_agent_reports_the_instance_types_cards(
    harness: Harness,
) -> None:
    cp = harness.cp
    cp.create(karpenter.NODE_POOLS, karpenter.node_pool("whole-gpus", ["gpu-4xl40s", "gpu-8xh100"]))
    namespace = env.unique("kp")
    cp.ensure_namespace(namespace)
    pod = env.plain_pod(namespace, "four-cards", {"nvidia.com/gpu": "4"})
    env.create_pod(cp, pod)
    _mark_unschedulable(cp, namespace, "four-cards")

    def made() -> dict[str, Any] | None:
        nodes = list(karpenter_env.nodes_of_pools(cp))
        return nodes[0] if nodes else None

    node = env.wait_until("Karpenter's node", made, 120)
    labels = node["metadata"]["labels"]
    # The cheapest type with four cards.
    assert labels[karpenter.INSTANCE_TYPE_LABEL] == "gpu-4xl40s"
    assert labels[karpenter.NODE_POOL_LABEL] == "whole-gpus"
    name = node["metadata"]["name"]
    inventory = env.wait_until("the node's inventory", lambda: _inventory_of(cp, name), 60)
    devices = inventory["status"]["devices"]
    assert [d["model"] for d in devices] == ["NVIDIA L40S"] * 4
    claims = cp.get(karpenter.NODE_CLAIMS)["items"]
    assert len(claims) == 1

    def initialized() -> bool:
        claim = cp.get(karpenter.NODE_CLAIMS)["items"][0]
        conditions = (claim.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Initialized" and c["status"] == "True" for c in conditions)

    env.wait_until("the NodeClaim to be initialized", initialized, 60)
