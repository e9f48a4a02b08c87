"""A defragmentation plan's API actions: ``control.defrag.DefragActions`` over the API
(listings, Evictions, ``nominatedNodeName``, Events)."""

from __future__ import annotations

from typing import Protocol, cast

from vgpu_operator.kube import events as kube_events
from vgpu_operator.kube import eviction, listing
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.wire import KubeObject, Pod, meta_of


class ObjectEvents(Protocol):
    """Writes an Event on an object (``control.reporting.KubeReporter`` does)."""

    async def object_event(
        self, obj: KubeObject, kind: str, reason: str, message: str, event_type: str
    ) -> None: ...


class KubeDefragActions:
    """``defrag.DefragActions`` over the API: listings, Evictions, nominatedNodeName,
    Events."""

    def __init__(self, api: ApiClient, events: ObjectEvents) -> None:
        self._api = api
        self._events = events

    async def list_pods(self, namespace: str | None = None) -> list[Pod]:
        path = listing.PODS if namespace is None else f"/api/v1/namespaces/{namespace}/pods"
        return cast(list[Pod], (await listing.list_all(self._api, path)).items)

    async def evict(self, key: str, uid: str) -> eviction.EvictOutcome:
        namespace, _, name = key.partition("/")
        return await eviction.evict_pod(self._api, namespace, name, uid)

    async def nominate(self, pod: Pod, node: str | None) -> None:
        meta = meta_of(pod)
        namespace = meta.get("namespace") or "default"
        await eviction.set_nominated_node(self._api, namespace, meta.get("name", ""), node)

    async def event(self, pod: Pod, reason: str, message: str, warning: bool = False) -> None:
        kind = kube_events.TYPE_WARNING if warning else kube_events.TYPE_NORMAL
        await self._events.object_event(pod, "Pod", reason, message, kind)
