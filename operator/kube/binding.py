"""One write per placement: a Binding whose metadata carries the allocation annotations.

The API server copies a Binding's annotations onto the pod in the same update that sets
``spec.nodeName`` (``BindingREST.Create`` -> ``setPodNodeAndMetadata``), so the pod is
never seen bound without its allocation, nor annotated without being bound: a restarted
operator rebuilds exactly what was committed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import cast

from kubernetes_asyncio import client

from vgpu_operator.kube import requests
from vgpu_operator.wire import Binding, ObjectMeta, Pod


class BindOutcome(enum.Enum):
    BOUND = "bound"
    CONFLICT = "conflict"  # already bound (by us earlier, or by someone else), or deleting
    GONE = "gone"  # the pod no longer exists


def binding_body(
    namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
) -> Binding:
    """The Binding object for ``pods/{name}/binding``.

    The uid is a precondition: a pod deleted and re-created under the same name while
    the decision was made is not bound by mistake (the server answers 409).
    """
    metadata: ObjectMeta = {
        "name": name,
        "namespace": namespace,
        "annotations": dict(annotations),
    }
    if uid:
        metadata["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


async def bind_pod(
    api: client.ApiClient,
    namespace: str,
    name: str,
    uid: str,
    node: str,
    annotations: Mapping[str, str],
) -> BindOutcome:
    """POST the Binding. 409 and 404 are outcomes; other errors raise ``ApiError``."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/binding"
    try:
        await requests.request_json(
            api, "POST", path, body=binding_body(namespace, name, uid, node, annotations)
        )
    except requests.ApiError as exc:
        if exc.status == 409:
            return BindOutcome.CONFLICT
        if exc.status == 404:
            return BindOutcome.GONE
        raise
    return BindOutcome.BOUND


async def read_pod(api: client.ApiClient, namespace: str, name: str) -> Pod | None:
    """The pod as the server has it now, or None when it is gone."""
    try:
        found = await requests.request_json(
            api, "GET", f"/api/v1/namespaces/{namespace}/pods/{name}"
        )
        return cast(Pod, found)
    except requests.ApiError as exc:
        if exc.status == 404:
            return None
        raise
