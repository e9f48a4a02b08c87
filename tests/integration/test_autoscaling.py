"""Karpenter on the live harness, and the engine's autoscaling with it (``make karpenter``;
docs/autoscaling.md).

Karpenter's controller with its KWOK provider runs against the test API server with three
GPU instance types (``karpenter_env.GPU_TYPES``: 8x H100, 4x L40S, one A100 in MIG mode),
each described by the cards the agent reports on the matching simulated machine. Every node
Karpenter makes gets its agent (``karpenter_env.NodeAgents``), so its DeviceInventory and
Lease appear as on a real node. Karpenter acts on every unschedulable pod of the cluster,
so this module runs its own control plane.

The operator runs on its ServiceAccount's token under the manifests' roles
(``manifests/rbac.yaml`` and the opt-in ``manifests/karpenter-autoscaling.yaml``, applied
with kubectl): the whole flow needs nothing more, and what it may not do is refused.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from integration import karpenter_env
from integration import operator_env as env
from integration.test_install import service_account_token, token_kubeconfig

from vgpu_operator import node_leases
from vgpu_operator.control.options import AutoscaleOptions
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing import karpenter
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import ControlPlane

pytestmark = pytest.mark.integration

INVENTORIES = env.INVENTORIES


OPERATOR_NAMESPACE = "vgpu-operator"
ROLES = ("namespace.yaml", "rbac.yaml", "karpenter-autoscaling.yaml")


class Harness:
    def __init__(
        self, cp: ControlPlane, agents: karpenter_env.NodeAgents, work: Path, kubeconfig: Path
    ) -> None:
        self.cp = cp
        self.agents = agents
        self.work = work
        #: The operator's ServiceAccount token, under the manifests' roles.
        self.operator_kubeconfig = kubeconfig


def _install_roles(cp: ControlPlane, kubectl: Path, work: Path) -> Path:
    for name in ROLES:
        done = subprocess.run(
            [str(kubectl), f"--kubeconfig={cp.kubeconfig_path}", "apply", "-f",
             str(env.REPO / "manifests" / name)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    token = service_account_token(cp, "vgpu-operator")
    return token_kubeconfig(cp, token, work / "operator.kubeconfig")


@pytest.fixture(scope="module")
def harness(
    control_plane_binaries: Binaries,
    karpenter_binary: Path,
    kubectl: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Harness]:
    work = tmp_path_factory.mktemp("karpenter")
    types_file, machines = karpenter_env.write_instance_types(work)
    with ControlPlane(kwok=True, binaries=control_plane_binaries) as plane:
        plane.ensure_namespace(node_leases.NAMESPACE)
        env.install_crd(plane)
        plane.start_karpenter(types_file, karpenter_binary)
        kubeconfig = _install_roles(plane, kubectl, work)
        with karpenter_env.NodeAgents(plane, machines, plane.kubeconfig_path) as agents:
            yield Harness(plane, agents, work, kubeconfig)


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


def _operator_options(harness: Harness, scheduler: str, **autoscale: Any) -> Any:
    """The operator of one test, on its ServiceAccount's token, deciding the pods that name
    ``scheduler`` (its device config in the operator's namespace, as installed)."""
    # A batching window of 2 s: pods created one by one on this loaded machine come in
    # over a second or more.
    settings = {
        "interval_s": 0.5,
        "node_timeout_s": 120.0,
        "cool_off_s": 120.0,
        "batch_idle_s": 2.0,
        **autoscale,
    }
    env.put_config_map(harness.cp, OPERATOR_NAMESPACE, env.config_text(scheduler))
    return env.options(
        harness.cp,
        OPERATOR_NAMESPACE,
        kubeconfig=harness.operator_kubeconfig,
        autoscale=AutoscaleOptions(instance_types=harness.work / "instance-types.json", **settings),
    )


def _scheduler(cp: ControlPlane) -> tuple[str, str]:
    """A fresh namespace and scheduler name for one test."""
    namespace = env.unique("as")
    cp.ensure_namespace(namespace)
    return namespace, env.unique("sched")


def _claims(cp: ControlPlane) -> list[dict[str, Any]]:
    return list(cp.get(karpenter.NODE_CLAIMS).get("items") or ())


def _pool_claims(cp: ControlPlane, pool: str) -> list[dict[str, Any]]:
    return [
        c for c in _claims(cp) if c["metadata"]["labels"].get(karpenter.NODE_POOL_LABEL) == pool
    ]


def _messages(cp: ControlPlane, namespace: str, name: str) -> list[str]:
    return [str(e.get("message") or "") for e in env.events_for(cp, namespace, name)]


def test_the_engine_asks_for_the_fewest_nodes_and_the_pods_bind_there(harness: Harness) -> None:
    """Six pods of 40 GB each: no node holds them; one 8xH100 holds all six (two 4xL40S
    would be cheaper but two nodes). Exactly one NodeClaim is made, of that type, and all
    six pods are bound on its node; each was told what it waited for."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    pool = f"shares-{namespace}"
    cp.create(
        karpenter.NODE_POOLS,
        karpenter.node_pool(pool, ["gpu-8xh100", "gpu-4xl40s"], labels={env.TEST_LABEL: namespace}),
    )
    with OperatorThread(_operator_options(harness, scheduler)):
        for i in range(6):
            pod = env.gpu_pod(
                namespace, f"p{i}", scheduler=scheduler, group=namespace, gpumem=40960
            )
            env.create_pod(cp, pod)
        bound = [env.wait_bound(cp, namespace, f"p{i}", timeout_s=120) for i in range(6)]
        nodes = {p["spec"]["nodeName"] for p in bound}
        assert len(nodes) == 1
        claims = _pool_claims(cp, pool)
        assert len(claims) == 1, [c["metadata"]["name"] for c in claims]
        claim = claims[0]
        assert claim["metadata"]["labels"][karpenter.INSTANCE_TYPE_LABEL] == "gpu-8xh100"
        assert claim["status"]["nodeName"] in nodes
        told = _messages(cp, namespace, "p0")
        assert any("waits for a new node: 1 x gpu-8xh100 requested" in m for m in told), told
