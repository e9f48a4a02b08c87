"""KWOK's side: the stages it runs (``kwok-stages.yaml``) and fake GPU Node objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from vgpu_operator.devices import nvidia
from vgpu_operator.testing.errors import JSON

#: Marks a node as managed by kwok (``--manage-nodes-with-annotation-selector``).
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"

POD_CIDR = "10.244.0.0/16"

FAKE_NODE_IP = "10.1.0.1"

#: Stages for kwok >= 0.8 (which has no built-in stages): the "fast" set from kwok v0.8.0
#: kustomize/stage/{node/fast,node/heartbeat-with-lease,pod/fast} (kubernetes-sigs/kwok,
#: Apache-2.0; one template action wrapped onto two lines).
#: Nodes become Ready at once; bound pods go Pending -> Running; Job pods complete; pods with a
#: deletionTimestamp are deleted (no kubelet finishes graceful deletion otherwise).
KWOK_STAGES: Final = Path(__file__).resolve().with_name("kwok-stages.yaml").read_text()


def fake_gpu_node_manifest(
    name: str,
    *,
    gpus: int = 8,
    gpu_resource: str = nvidia.COUNT_RESOURCE,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: str = "110",
    extra_capacity: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
) -> JSON:
    """A Node object that kwok manages (annotation ``kwok.x-k8s.io/node: fake``).

    Capacity and allocatable are set in ``status``; kwok's node-initialize stage keeps them.
    """
    capacity = {"cpu": cpu, "memory": memory, "pods": pods, gpu_resource: str(gpus)}
    capacity.update(extra_capacity or {})
    key, value = FAKE_NODE_ANNOTATION
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **(labels or {}),
            },
            "annotations": {key: value, **(annotations or {})},
        },
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
    }
