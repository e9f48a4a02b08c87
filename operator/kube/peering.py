"""The operator's ClusterKopfPeering object, created when it is missing.

The manifests declare only the peering CRD: a custom resource applied in the same
`kubectl apply` as its CRD fails on a fresh cluster (the type is not served yet), so the
operator makes its own peering object at start instead.
"""

from __future__ import annotations

from typing import Final

from vgpu_operator.kube import requests

CLUSTER_PEERINGS: Final = "/apis/kopf.dev/v1/clusterkopfpeerings"


class PeeringCrdMissingError(RuntimeError):
    """The ClusterKopfPeering CRD is not installed (manifests/peering.yaml)."""


async def ensure_cluster_peering(api: requests.ApiClient, name: str) -> bool:
    """Create the ClusterKopfPeering ``name`` unless it exists; True when it was created."""
    body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}}
    try:
        await requests.request_json(api, "POST", CLUSTER_PEERINGS, body=body)
    except requests.ApiError as exc:
        if exc.status == 409:
            return False
        if exc.status == 404:
            raise PeeringCrdMissingError(
                "the ClusterKopfPeering CRD is not installed; apply manifests/peering.yaml"
            ) from exc
        raise
    return True
