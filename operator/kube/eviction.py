"""Preemption's writes: evicting a victim, and the preemptor's ``nominatedNodeName``.

Victims leave through the Eviction API (``pods/eviction``), not a plain delete, so the
API server checks PodDisruptionBudgets at the moment of eviction: a budget with no
disruptions left makes it answer 429, which is reported as ``REFUSED`` and never
retried here (the preemption is given up and decided again later).
"""

from __future__ import annotations

import enum
from typing import Any

from kubernetes_asyncio import client

from vgpu_operator.kube import pods, requests


class EvictOutcome(enum.Enum):
    EVICTED = "evicted"
    GONE = "gone"  # already deleted, or re-created under the same name (uid mismatch)
    REFUSED = "refused"  # a PodDisruptionBudget allows no disruption now


def eviction_body(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """The policy/v1 Eviction; the uid precondition spares a re-created namesake."""
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    if uid:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    return body


async def evict_pod(api: client.ApiClient, namespace: str, name: str, uid: str) -> EvictOutcome:
    """POST the Eviction. 404 and 409 (gone), 429 (budget) are outcomes; others raise."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/eviction"
    try:
        await requests.request_json(api, "POST", path, body=eviction_body(namespace, name, uid))
    except requests.ApiError as exc:
        if exc.status in (404, 409):
            return EvictOutcome.GONE
        if exc.status == 429:
            return EvictOutcome.REFUSED
        raise
    return EvictOutcome.EVICTED


async def set_nominated_node(
    api: client.ApiClient, namespace: str, name: str, node: str | None
) -> bool:
    """Write (or clear, with None) ``status.nominatedNodeName``; False when the pod is gone."""
    return await pods.patch_pod_status(
        api, namespace, name, {"nominatedNodeName": node}, requests.MERGE_PATCH
    )
