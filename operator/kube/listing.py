"""Full listings (paged) of the kinds the operator feeds to its engine, as plain dicts,
with the resourceVersion the listing is consistent with; and a raw watch stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import orjson
from kubernetes_asyncio import client

from vgpu_operator import names, node_leases
from vgpu_operator.kube import requests
from vgpu_operator.wire import KubeObject, WatchEventType

PODS: Final = "/api/v1/pods"
NODES: Final = "/api/v1/nodes"
NAMESPACES: Final = "/api/v1/namespaces"
RESOURCE_QUOTAS: Final = "/api/v1/resourcequotas"
POD_DISRUPTION_BUDGETS: Final = "/apis/policy/v1/poddisruptionbudgets"
DEVICE_INVENTORIES: Final = (
    f"/apis/{names.CRD_GROUP}/{names.CRD_VERSION}/{names.DEVICE_INVENTORY_PLURAL}"
)
#: The node agents' heartbeats, in their one namespace.
NODE_LEASES: Final = node_leases.COLLECTION


@dataclass(frozen=True, slots=True)
class Listing:
    items: list[KubeObject]
    resource_version: str | None


async def list_all(
    api: client.ApiClient,
    path: str,
    *,
    page_size: int = 500,
    field_selector: str | None = None,
    label_selector: str | None = None,
) -> Listing:
    """Every object at ``path``; an absent kind (CRD not installed) lists as empty."""
    items: list[KubeObject] = []
    version: str | None = None
    token: str | None = None
    while True:
        query: dict[str, str | int] = {"limit": page_size}
        if token:
            query["continue"] = token
        if field_selector:
            query["fieldSelector"] = field_selector
        if label_selector:
            query["labelSelector"] = label_selector
        try:
            page = await requests.request_json(api, "GET", path, query=query, timeout_s=120.0)
        except requests.ApiError as exc:
            if exc.status == 404:
                return Listing([], None)
            raise
        meta = page.get("metadata") or {}
        if version is None:
            version = meta.get("resourceVersion")
        for item in page.get("items") or []:
            if isinstance(item, dict):
                _drop_managed_fields(item)
                items.append(cast(KubeObject, item))
        token = meta.get("continue")
        if not token:
            return Listing(items, version)


def _drop_managed_fields(item: dict[str, Any]) -> None:
    """A listing holds every object of its kind at once (10,000 pods at a restart);
    ``metadata.managedFields``, which nothing here reads, is often half of each. Dropped
    as each page arrives, it never adds to the listing's peak, nor to the heap that the
    process keeps (freed memory is not returned to the system in one piece)."""
    meta = item.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)


async def get_object(api: client.ApiClient, path: str) -> dict[str, Any] | None:
    """One object, or None when it does not exist."""
    try:
        return await requests.request_json(api, "GET", path)
    except requests.ApiError as exc:
        if exc.status == 404:
            return None
        raise


def cluster_peering_path(name: str) -> str:
    return f"/apis/kopf.dev/v1/clusterkopfpeerings/{name}"


def namespaced_peering_path(namespace: str, name: str) -> str:
    return f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/{name}"


#: A watch event that only moves the resourceVersion on.
BOOKMARK: Final = "BOOKMARK"
#: The event types a watch hands on (an ERROR event is raised instead).
_EVENT_TYPES: Final = frozenset({"ADDED", "MODIFIED", "DELETED", BOOKMARK})


class WatchExpired(Exception):
    """The server no longer has the requested resourceVersion (410): list again."""


async def watch(
    api: client.ApiClient,
    path: str,
    *,
    resource_version: str | None,
    field_selector: str | None = None,
    label_selector: str | None = None,
    timeout_s: int = 300,
    bookmarks: bool = False,
) -> AsyncIterator[tuple[WatchEventType, KubeObject]]:
    """Stream ``(type, object)`` watch events from ``resource_version`` until the server
    ends the watch (after about ``timeout_s``). Bookmarks (only a resourceVersion) are
    yielded as ``BOOKMARK`` when ``bookmarks``, else skipped; a 410 raises
    ``WatchExpired``; other stream errors raise ``ApiError``."""
    query: list[tuple[str, str | int]] = [
        ("watch", "true"),
        ("allowWatchBookmarks", "true"),
        ("timeoutSeconds", timeout_s),
    ]
    if resource_version:
        query.append(("resourceVersion", resource_version))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    if label_selector:
        query.append(("labelSelector", label_selector))
    response = await api.call_api(
        path,
        "GET",
        query_params=query,
        header_params={"Accept": requests.JSON_CONTENT},
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=timeout_s + 30,
    )
    try:
        if not 200 <= response.status < 300:
            body = (await response.read()).decode(errors="replace")
            raise requests.ApiError("WATCH", path, response.status, body)
        async for line in response.content:
            if not line.strip():
                continue
            # The watch's every event passes here: orjson decodes it in less than half
            # the time (and, like the API server, refuses NaN and Infinity).
            event = orjson.loads(line)
            kind = str(event.get("type") or "")
            obj = event.get("object") or {}
            if kind == BOOKMARK and not bookmarks:
                continue
            if kind == "ERROR":
                code = obj.get("code") if isinstance(obj, Mapping) else None
                if code == 410:
                    raise WatchExpired(str(obj.get("message", "")))
                raise requests.ApiError("WATCH", path, int(code or 500), json.dumps(obj))
            if kind not in _EVENT_TYPES or not isinstance(obj, dict):
                raise requests.ApiError("WATCH", path, 500, f"unexpected event {line[:200]!r}")
            yield cast(WatchEventType, kind), cast(KubeObject, obj)
    finally:
        response.release()
