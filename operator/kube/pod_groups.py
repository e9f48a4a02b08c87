"""PodGroups (``scheduling.k8s.io/v1beta1``, the GenericWorkload gate): where they are read,
and the status condition their scheduler writes (``PodGroupInitiallyScheduled``), applied
with a strategic merge patch on ``podgroups/status`` so that conditions merge by ``type``
(the controller's and other writers' are kept)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from vgpu_operator.kube import requests
from vgpu_operator.kube.requests import ApiClient

#: Every namespace's PodGroups (the watch's collection).
POD_GROUPS: Final = "/apis/scheduling.k8s.io/v1beta1/podgroups"


def status_path(namespace: str, name: str) -> str:
    return f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups/{name}/status"


async def patch_pod_group_condition(
    api: ApiClient, namespace: str, name: str, condition: Mapping[str, Any]
) -> bool:
    """Write one condition on the PodGroup's status; False when the PodGroup is gone."""
    body = {"status": {"conditions": [dict(condition)]}}
    try:
        await requests.request_json(
            api,
            "PATCH",
            status_path(namespace, name),
            body=body,
            content_type=requests.STRATEGIC_MERGE_PATCH,
        )
    except requests.ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return True
