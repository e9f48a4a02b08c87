"""The preemptor: ``control.evictions.Preemptor`` over the API (Evictions, ``nominatedNodeName``)
and the Events that tell both sides, written by whoever reports for the operator."""

from __future__ import annotations

from typing import Protocol

from vgpu_operator.kube import eviction
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.wire import Pod, meta_of


class PreemptionNews(Protocol):
    """The Events of a preemption (``control.reporting.KubeReporter`` writes them)."""

    async def preempted(self, victim: str, preemptor: Pod, node: str) -> None: ...
    async def preempting(self, pod: Pod, node: str, victims: int) -> None: ...


class KubePreemptor:
    """``control.evictions.Preemptor`` over the API: Evictions, nominatedNodeName, Events."""

    def __init__(self, api: ApiClient, news: PreemptionNews) -> None:
        self._api = api
        self._news = news

    async def evict(self, victim: str, uid: str) -> eviction.EvictOutcome:
        namespace, _, name = victim.partition("/")
        return await eviction.evict_pod(self._api, namespace, name, uid)

    async def nominate(self, pod: Pod, node: str | None) -> None:
        meta = meta_of(pod)
        namespace = str(meta.get("namespace") or "default")
        await eviction.set_nominated_node(self._api, namespace, str(meta.get("name")), node)

    async def preempted(self, victim: str, preemptor: Pod, node: str) -> None:
        await self._news.preempted(victim, preemptor, node)

    async def preempting(self, pod: Pod, node: str, victims: int) -> None:
        await self._news.preempting(pod, node, victims)
