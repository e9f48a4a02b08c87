"""The Binding writer: ``binding_writes.Binder`` over the API.

A placed pod's Binding carries the allocation annotations; with ``hami-lock`` a GPU pod's
Binding is preceded by HAMi's node lock (``node_lock``), released again if it fails.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from vgpu_operator import names
from vgpu_operator.kube import binding, node_lock
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.wire import Pod, meta_of

log = structlog.get_logger("vgpu_operator.operator")


class KubeBinder:
    """``binding_writes.Binder`` over the API. With ``lock_timeout_s`` (``hami-lock``) a GPU pod's
    Binding is preceded by HAMi's node lock, released again if the Binding fails."""

    def __init__(self, api: ApiClient, lock_timeout_s: float | None = None) -> None:
        self._api = api
        self._lock_timeout_s = lock_timeout_s

    async def bind(
        self, pod: Pod, node: str, annotations: Mapping[str, str]
    ) -> binding.BindOutcome:
        meta = meta_of(pod)
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "")
        locking = self._lock_timeout_s is not None and names.ASSIGNED_NODE in annotations
        if locking:
            assert self._lock_timeout_s is not None
            if not await node_lock.take(self._api, node, namespace, name, self._lock_timeout_s):
                log.info("node_lock_busy", pod=f"{namespace}/{name}", node=node)
                return binding.BindOutcome.CONFLICT
        # An exception leaves the lock: the Binding may have been written (its answer
        # lost), and then HAMi's plugin needs the lock; if not, it expires.
        outcome = await binding.bind_pod(
            self._api, namespace, name, str(meta.get("uid") or ""), node, annotations
        )
        if locking and outcome is not binding.BindOutcome.BOUND:
            await node_lock.release(self._api, node, namespace, name)
        return outcome

    async def read_pod(self, namespace: str, name: str) -> Pod | None:
        return await binding.read_pod(self._api, namespace, name)
