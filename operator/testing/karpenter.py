"""Karpenter's controller with its KWOK cloud provider on the test control plane
(``ControlPlane.start_karpenter``).

Built from source by ``hack/control-plane/build.sh karpenter`` (``make karpenter``) with its
CRDs (NodePool, NodeClaim, NodeOverlay from the core, KWOKNodeClass from the provider)
copied beside it from the same module (``karpenter-crd/``). What it needs here, read from its
code (``kwok/main.go``, ``pkg/operator``): a kubeconfig (``KUBECONFIG``), no leader election
(one replica; its Lease would need a namespace), a health-probe port of its own (readiness
means its caches synced and its CRDs served), an instance-types file (the provider's JSON:
name, offerings with price and requirements, architecture, operating systems, resources).
It has no webhooks to serve. Its metrics listen on a port the kernel picks.

The provider launches a NodeClaim by creating the Node itself, annotated
``kwok.x-k8s.io/node: fake``: the control plane's kwok (which manages exactly the nodes so
annotated) makes it Ready, as kubelet would; Karpenter then registers and initialises it.
Nothing here starts a node's agent: the tests do (``tests/integration/karpenter_env.py``),
from the instance type's machine, once the Node exists.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

API_GROUP: Final = "karpenter.sh"
NODE_POOLS: Final = "/apis/karpenter.sh/v1/nodepools"
NODE_CLAIMS: Final = "/apis/karpenter.sh/v1/nodeclaims"
NODE_CLASSES: Final = "/apis/karpenter.kwok.sh/v1alpha1/kwoknodeclasses"
#: The labels Karpenter puts on its nodes and claims.
NODE_POOL_LABEL: Final = "karpenter.sh/nodepool"
CAPACITY_TYPE_LABEL: Final = "karpenter.sh/capacity-type"
INSTANCE_TYPE_LABEL: Final = "node.kubernetes.io/instance-type"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
#: The CRDs the controller needs served before it is ready.
CRD_NAMES: Final = (
    "nodepools.karpenter.sh",
    "nodeclaims.karpenter.sh",
    "nodeoverlays.karpenter.sh",
    "kwoknodeclasses.karpenter.kwok.sh",
)
#: The one KWOKNodeClass the tests' NodePools name.
NODE_CLASS: Final = "default"


def crd_manifests(crd_dir: Path) -> Iterator[dict[str, Any]]:
    """Karpenter's CRDs as copied beside its binary (no conversion webhooks in them)."""
    for path in sorted(crd_dir.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                yield doc


def argv(
    binary: Path,
    instance_types: Path,
    *,
    health_port: int,
    batch_idle_s: float = 0.5,
    batch_max_s: float = 2.0,
    feature_gates: str | None = None,
) -> list[str]:
    """The controller's command line. Its batching window is shortened (a second idle, ten
    at most, by default): pods created together are still provisioned together."""
    args = [
        str(binary),
        f"--instance-types-file-path={instance_types}",
        "--disable-leader-election=true",
        f"--health-probe-port={health_port}",
        "--metrics-port=0",
        f"--batch-idle-duration={batch_idle_s}s",
        f"--batch-max-duration={batch_max_s}s",
        "--log-level=debug",
    ]
    if feature_gates is not None:
        args.append(f"--feature-gates={feature_gates}")
    return args


def node_class(name: str = NODE_CLASS) -> dict[str, Any]:
    """A KWOKNodeClass (Ready by its CRD's default status)."""
    return {
        "apiVersion": "karpenter.kwok.sh/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": name},
    }


def node_pool(
    name: str,
    instance_types: Sequence[str],
    *,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    limits: Mapping[str, str] | None = None,
    consolidate_after: str = "Never",
    node_class_name: str = NODE_CLASS,
    capacity_types: Sequence[str] = ("on-demand",),
) -> dict[str, Any]:
    """A NodePool offering ``instance_types`` (one requirement each on the instance type and
    the capacity type). ``consolidate_after``: how long an empty or underused node stays
    (Never: Karpenter never consolidates it away)."""
    requirements = [
        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": list(instance_types)},
        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": list(capacity_types)},
    ]
    template: dict[str, Any] = {
        "spec": {
            "nodeClassRef": {
                "group": "karpenter.kwok.sh",
                "kind": "KWOKNodeClass",
                "name": node_class_name,
            },
            "requirements": requirements,
            "expireAfter": "Never",
        }
    }
    if labels:
        template["metadata"] = {"labels": dict(labels)}
    if taints:
        template["spec"]["taints"] = [dict(t) for t in taints]
    spec: dict[str, Any] = {
        "template": template,
        "disruption": {
            "consolidationPolicy": "WhenEmptyOrUnderutilized",
            "consolidateAfter": consolidate_after,
        },
    }
    if limits:
        spec["limits"] = dict(limits)
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": spec,
    }
