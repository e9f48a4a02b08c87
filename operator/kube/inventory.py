"""Reading and writing DeviceInventory objects (and the agent's HAMi node annotations).

The agent creates its node's inventory (owned by the Node, so it goes away with it) and
writes ``status`` through the status subresource with JSON merge patches. The operator
reads the objects. Everything returned is a plain dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, cast

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from vgpu_operator import names, resources
from vgpu_operator.errors import VgpuError
from vgpu_operator.kube import requests
from vgpu_operator.kube.client import to_dict
from vgpu_operator.wire import DeviceInventory

log = structlog.get_logger(__name__)


_NOT_FOUND: Final = 404
_CONFLICT: Final = 409


class CrdMissingError(VgpuError):
    """The API server does not serve DeviceInventory: the CRD is not installed."""

    def __init__(self) -> None:
        super().__init__(
            f"the CustomResourceDefinition {resources.CRD_NAME} is not installed; "
            "apply crds/deviceinventories.vgpu-operator.io.yaml "
            "(or run `vgpu-operator crds --output DIR` and apply the file)"
        )


class NodeNotFoundError(VgpuError):
    """The Node the inventory would belong to does not exist."""

    def __init__(self, node_name: str) -> None:
        super().__init__(f"node {node_name!r} does not exist; check --node-name")
        self.node_name = node_name


def inventory_manifest(node_name: str, node_uid: str) -> DeviceInventory:
    """A new, empty DeviceInventory for ``node_name``, owned by that Node."""
    return {
        "apiVersion": resources.API_VERSION,
        "kind": names.DEVICE_INVENTORY_KIND,
        "metadata": {
            "name": node_name,
            "labels": {names.MANAGED_BY_LABEL: names.MANAGED_BY_AGENT},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node_name,
                    "uid": node_uid,
                }
            ],
        },
        "spec": {},
    }


def _custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


_GROUP: Final = names.CRD_GROUP
_VERSION: Final = names.CRD_VERSION
_PLURAL: Final = names.DEVICE_INVENTORY_PLURAL


async def get_inventory(api: client.ApiClient, name: str) -> DeviceInventory | None:
    """The inventory named ``name``, or None if there is none.

    A 404 may also mean the CRD is missing; ``create_inventory`` tells the two apart.
    """
    try:
        obj = await _custom(api).get_cluster_custom_object(_GROUP, _VERSION, _PLURAL, name)
    except ApiException as exc:
        if exc.status == _NOT_FOUND:
            return None
        raise
    return cast(DeviceInventory, to_dict(obj))


async def list_inventories(api: client.ApiClient) -> list[DeviceInventory]:
    """Every DeviceInventory in the cluster."""
    try:
        listed = await _custom(api).list_cluster_custom_object(_GROUP, _VERSION, _PLURAL)
    except ApiException as exc:
        if exc.status == _NOT_FOUND:
            raise CrdMissingError() from exc
        raise
    items: list[DeviceInventory] = to_dict(listed).get("items", [])
    return items


async def read_node_uid(api: client.ApiClient, node_name: str) -> str:
    """The uid of a Node, for owner references."""
    try:
        node = await client.CoreV1Api(api).read_node(node_name)
    except ApiException as exc:
        if exc.status == _NOT_FOUND:
            raise NodeNotFoundError(node_name) from exc
        raise
    uid: str = node.metadata.uid
    return uid


async def create_inventory(api: client.ApiClient, node_name: str) -> DeviceInventory:
    """Create the node's inventory (owned by the Node); an existing one is returned.

    Raises ``CrdMissingError`` when the resource type is unknown to the API server
    (a POST to a collection only answers 404 then) and ``NodeNotFoundError``.
    """
    uid = await read_node_uid(api, node_name)
    try:
        created = await _custom(api).create_cluster_custom_object(
            _GROUP, _VERSION, _PLURAL, inventory_manifest(node_name, uid)
        )
    except ApiException as exc:
        if exc.status == _NOT_FOUND:
            raise CrdMissingError() from exc
        if exc.status == _CONFLICT:
            existing = await get_inventory(api, node_name)
            if existing is not None:
                return existing
        raise
    log.info("inventory_created", node=node_name)
    return cast(DeviceInventory, to_dict(created))


async def ensure_inventory(api: client.ApiClient, node_name: str) -> DeviceInventory:
    """The node's inventory, created if absent."""
    existing = await get_inventory(api, node_name)
    if existing is not None:
        return existing
    return await create_inventory(api, node_name)


async def patch_inventory_status(
    api: client.ApiClient, name: str, status: Mapping[str, Any]
) -> DeviceInventory:
    """Merge-patch ``status`` (wire form) through the status subresource."""
    # The client would pick JSON-patch or strategic merge; custom resources take
    # merge patches. (The type stubs omit `_content_type`, which the client accepts.)
    patched = await _custom(api).patch_cluster_custom_object_status(  # type: ignore[call-arg]
        _GROUP,
        _VERSION,
        _PLURAL,
        name,
        {"status": dict(status)},
        _content_type=requests.MERGE_PATCH,
    )
    return cast(DeviceInventory, to_dict(patched))


async def read_inventory_cached(api: client.ApiClient, name: str) -> DeviceInventory | None:
    """The inventory as the API server's watch cache holds it (``resourceVersion=0``: no
    etcd read), or None if there is none; for the agent's periodic check of its report."""
    path = f"/apis/{_GROUP}/{_VERSION}/{_PLURAL}/{name}"
    try:
        found = await requests.request_json(api, "GET", path, query={"resourceVersion": "0"})
        return cast(DeviceInventory, found)
    except requests.ApiError as exc:
        if exc.status == _NOT_FOUND:
            return None
        raise


async def patch_node_annotations(
    api: client.ApiClient, node_name: str, annotations: Mapping[str, str | None]
) -> None:
    """Merge-patch annotations on a Node (a None value removes the key)."""
    await client.CoreV1Api(api).patch_node(  # type: ignore[call-arg]
        node_name,
        body={"metadata": {"annotations": dict(annotations)}},
        _content_type=requests.MERGE_PATCH,
    )
