"""HAMi's node lock (``--allocation-gate=hami-lock``) on the real API server: taken for
one pod, refused to another while the holder lives, retaken once the holder is gone,
and released only by its owner."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from vgpu_operator import names
from vgpu_operator.devices import node_lock as lock_codec
from vgpu_operator.kube import node_lock
from vgpu_operator.kube.client import api_client
from vgpu_operator.testing.controlplane import ControlPlane

pytestmark = pytest.mark.integration


def _lock_of(cp: ControlPlane, node: str) -> str | None:
    annotations = cp.get(f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {}
    value = annotations.get(names.NODE_LOCK)
    return None if value is None else lock_codec.decode(value).owner


def _run(cp: ControlPlane, body: Callable[[Any], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with api_client(str(cp.kubeconfig_path)) as api:
            return await body(api)

    return asyncio.run(main())


def _pod(cp: ControlPlane, namespace: str, name: str) -> None:
    cp.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        },
    )


def test_the_lock_is_exclusive_while_its_owner_lives(
    control_plane: ControlPlane, namespace: str
) -> None:
    cp = control_plane
    node = f"lock-{namespace}"
    cp.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    try:
        _pod(cp, namespace, "first")
        assert _run(cp, lambda api: node_lock.take(api, node, namespace, "first", 300))
        assert _lock_of(cp, node) == f"{namespace}/first"
        # The same pod again (a retried Binding) keeps it; another pod is refused.
        assert _run(cp, lambda api: node_lock.take(api, node, namespace, "first", 300))
        assert not _run(cp, lambda api: node_lock.take(api, node, namespace, "second", 300))
        # Only the owner releases it.
        _run(cp, lambda api: node_lock.release(api, node, namespace, "second"))
        assert _lock_of(cp, node) == f"{namespace}/first"
        # The owner is gone: the lock is retaken.
        cp.delete(f"/api/v1/namespaces/{namespace}/pods/first")
        assert _run(cp, lambda api: node_lock.take(api, node, namespace, "second", 300))
        assert _lock_of(cp, node) == f"{namespace}/second"
        _run(cp, lambda api: node_lock.release(api, node, namespace, "second"))
        assert _lock_of(cp, node) is None
    finally:
        cp.delete(f"/api/v1/nodes/{node}")


def test_an_expired_lock_is_retaken(control_plane: ControlPlane, namespace: str) -> None:
    cp = control_plane
    node = f"lock-old-{namespace}"
    stale = lock_codec.encode(1_000_000_000, namespace, "holder")
    cp.create(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node, "annotations": {names.NODE_LOCK: stale}},
        },
    )
    try:
        _pod(cp, namespace, "holder")
        assert _run(cp, lambda api: node_lock.take(api, node, namespace, "next", 300))
        assert _lock_of(cp, node) == f"{namespace}/next"
    finally:
        cp.delete(f"/api/v1/nodes/{node}")
