"""HAMi's node lock on the API server (``--allocation-gate=hami-lock``).

HAMi's device plugin serves only the pod named in the Node annotation
``hami.io/mutex.lock`` and deletes it when done. Where that plugin runs instead of the
agent's, the operator takes the lock before each GPU pod's Binding, as HAMi's scheduler
does: a merge patch guarded by the Node's resourceVersion, refused while another pod that
still exists holds a lock younger than the timeout, and released again if the Binding
is not written.
"""

from __future__ import annotations

import time
from typing import Final, cast

from vgpu_operator import names
from vgpu_operator.devices import node_lock
from vgpu_operator.errors import CodecError
from vgpu_operator.kube import requests
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.scheduling.books import allocation_gate
from vgpu_operator.wire import Node, meta_of

_ATTEMPTS: Final = 3


async def _node(api: ApiClient, node: str) -> Node:
    return cast(Node, await requests.request_json(api, "GET", f"/api/v1/nodes/{node}"))


async def _exists(api: ApiClient, owner: str) -> bool:
    namespace, _, name = owner.partition("/")
    try:
        pod = await requests.request_json(api, "GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    except requests.ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return (pod.get("status") or {}).get("phase") not in names.TERMINAL_PHASES


async def _patch(api: ApiClient, node: str, version: object, value: str | None) -> bool:
    body = {"metadata": {"annotations": {names.NODE_LOCK: value}, "resourceVersion": version}}
    try:
        await requests.request_json(
            api, "PATCH", f"/api/v1/nodes/{node}", body=body, content_type=requests.MERGE_PATCH
        )
    except requests.ApiError as exc:
        if exc.status == 409:
            return False  # the Node changed meanwhile: read it again
        raise
    return True


async def take(api: ApiClient, node: str, namespace: str, name: str, timeout_s: float) -> bool:
    """Take the node's lock for the pod; False while another live pod holds it."""
    me = f"{namespace}/{name}"
    for _ in range(_ATTEMPTS):
        current = await _node(api, node)
        meta = meta_of(current)
        annotations = meta.get("annotations") or {}
        now = time.time()
        owner = allocation_gate.lock_holder(annotations, now, timeout_s)
        if owner == me:
            return True
        if owner is not None and (not owner or await _exists(api, owner)):
            return False
        if await _patch(
            api, node, meta.get("resourceVersion"), node_lock.encode(now, namespace, name)
        ):
            return True
    return False


async def release(api: ApiClient, node: str, namespace: str, name: str) -> None:
    """Delete the lock if this pod holds it (a Binding that was not written)."""
    for _ in range(_ATTEMPTS):
        try:
            current = await _node(api, node)
        except requests.ApiError as exc:
            if exc.status == 404:
                return
            raise
        meta = meta_of(current)
        raw = (meta.get("annotations") or {}).get(names.NODE_LOCK)
        if not raw:
            return
        try:
            owner = node_lock.decode(raw).owner
        except CodecError:
            return
        if owner != f"{namespace}/{name}":
            return
        if await _patch(api, node, meta.get("resourceVersion"), None):
            return
