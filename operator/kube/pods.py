"""Pod reads and writes shared by the adapters: the pods of one node (as the device plugin
reads and settles them), their annotations, and their status."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from vgpu_operator.kube import requests
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.wire import Pod, meta_of


async def pods_on_node(api: ApiClient, node: str) -> list[Pod]:
    """Every pod bound to ``node`` (one LIST with a field selector)."""
    found = await requests.request_json(
        api, "GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node}"}
    )
    items = found.get("items") or []
    return [cast(Pod, item) for item in items if isinstance(item, dict)]


async def patch_pod_annotations(api: ApiClient, pod: Pod, annotations: Mapping[str, str]) -> None:
    """Merge-patch annotations onto the pod as it was read: the resourceVersion makes the
    API server refuse the patch (409) if the pod changed meanwhile, so an entry is never
    consumed twice."""
    meta = meta_of(pod)
    body = {
        "metadata": {
            "annotations": dict(annotations),
            "resourceVersion": meta.get("resourceVersion"),
        }
    }
    path = f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}"
    await requests.request_json(api, "PATCH", path, body=body, content_type=requests.MERGE_PATCH)


async def patch_pod_status(
    api: ApiClient, namespace: str, name: str, status: Mapping[str, Any], content_type: str
) -> bool:
    """Patch the pod's status subresource with ``{"status": status}``; False when the pod is
    gone (a pod deleted meanwhile is no error for a scheduler writing about it)."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
    try:
        await requests.request_json(
            api, "PATCH", path, body={"status": dict(status)}, content_type=content_type
        )
    except requests.ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return True
