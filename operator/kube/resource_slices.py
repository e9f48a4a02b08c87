"""The node's ResourceSlices and the claims its DRA driver prepares (``resource.k8s.io/v1``).

Plain JSON through ``requests.request_json``: the generated client of the version pinned
here may not know the newest DRA fields (consumable capacity, taints), and a model object
would drop what it does not know.
"""

from __future__ import annotations

from typing import Final, cast
from urllib.parse import quote

from vgpu_operator import names
from vgpu_operator.kube import inventory
from vgpu_operator.kube.requests import ApiClient, ApiError, request_json
from vgpu_operator.wire import OwnerReference, ResourceClaim, ResourceSlice, meta_of, name_of

_BASE: Final = "/apis/resource.k8s.io/v1"
_SLICES: Final = f"{_BASE}/resourceslices"


async def list_slices(api: ApiClient, driver: str, node: str) -> list[ResourceSlice]:
    """The slices of ``driver`` for ``node`` (field selectors the API server indexes)."""
    listed = await request_json(
        api,
        "GET",
        _SLICES,
        query={"fieldSelector": f"spec.driver={driver},spec.nodeName={node}"},
    )
    items: list[ResourceSlice] = listed.get("items") or []
    return items


async def put_slice(api: ApiClient, wanted: ResourceSlice) -> ResourceSlice:
    """Create the slice, or replace the one of the same name (its resourceVersion taken
    from the server's copy, so a concurrent writer makes this fail with 409)."""
    name = name_of(wanted)
    try:
        return cast(ResourceSlice, await request_json(api, "POST", _SLICES, body=wanted))
    except ApiError as exc:
        if exc.status != 409:
            raise
    current = await request_json(api, "GET", f"{_SLICES}/{quote(name)}")
    body: ResourceSlice = {
        **wanted,
        "metadata": {**meta_of(wanted), "resourceVersion": current["metadata"]["resourceVersion"]},
    }
    return cast(
        ResourceSlice, await request_json(api, "PUT", f"{_SLICES}/{quote(name)}", body=body)
    )


async def delete_slice(api: ApiClient, name: str) -> None:
    try:
        await request_json(api, "DELETE", f"{_SLICES}/{quote(name)}")
    except ApiError as exc:
        if exc.status != 404:
            raise


async def get_claim(api: ApiClient, namespace: str, name: str) -> ResourceClaim | None:
    """The ResourceClaim, or None when there is none."""
    try:
        found = await request_json(
            api, "GET", f"{_BASE}/namespaces/{quote(namespace)}/resourceclaims/{quote(name)}"
        )
        return cast(ResourceClaim, found)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


class ApiSliceStore:
    """``agent.dra.publisher.SliceStore`` over one ApiClient."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api

    async def list_slices(self, driver: str, node: str) -> list[ResourceSlice]:
        return await list_slices(self.api, driver, node)

    async def put_slice(self, wanted: ResourceSlice) -> None:
        await put_slice(self.api, wanted)

    async def delete_slice(self, name: str) -> None:
        await delete_slice(self.api, name)

    async def owner(self, node: str) -> OwnerReference | None:
        """The node's DeviceInventory (owned by the Node) as an ownerReference."""
        found = await inventory.get_inventory(self.api, node)
        if found is None:
            return None
        return {
            "apiVersion": f"{names.CRD_GROUP}/{names.CRD_VERSION}",
            "kind": names.DEVICE_INVENTORY_KIND,
            "name": node,
            "uid": found["metadata"]["uid"],
        }
