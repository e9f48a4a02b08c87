"""Karpenter's NodePools and NodeClaims (``karpenter.sh/v1``), as the autoscaler reads and
writes them: NodePools read; NodeClaims listed, created (the nodes the engine asks for) and
deleted (a request withdrawn). Every call is one request; everything returned is a plain
dict."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from vgpu_operator.kube import claims, eviction, pods, requests
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.wire import Pod

NODE_POOLS: Final = "/apis/karpenter.sh/v1/nodepools"
NODE_CLAIMS: Final = "/apis/karpenter.sh/v1/nodeclaims"
#: A listing larger than this is refused (bounded work per round).
_LIMIT: Final = 2000


class KarpenterMissingError(Exception):
    """The API server does not serve Karpenter's kinds."""

    def __init__(self) -> None:
        super().__init__(
            "the API server does not serve karpenter.sh/v1 NodePools and NodeClaims: "
            "install Karpenter (its CRDs) or run without --autoscale-instance-types"
        )


async def _list(api: ApiClient, path: str) -> list[dict[str, Any]]:
    try:
        listed = await requests.request_json(api, "GET", path, query={"limit": _LIMIT})
    except requests.ApiError as exc:
        if exc.status == 404:
            raise KarpenterMissingError() from exc
        raise
    if (listed.get("metadata") or {}).get("continue"):
        raise requests.ApiError("GET", path, 413, f"more than {_LIMIT} objects")
    items: list[dict[str, Any]] = list(listed.get("items") or ())
    return items


async def list_node_pools(api: ApiClient) -> list[dict[str, Any]]:
    return await _list(api, NODE_POOLS)


async def list_node_claims(api: ApiClient) -> list[dict[str, Any]]:
    return await _list(api, NODE_CLAIMS)


async def create_node_claim(api: ApiClient, body: Mapping[str, Any]) -> dict[str, Any]:
    """Create a NodeClaim (``generateName``): the created object, with its name."""
    return await requests.request_json(api, "POST", NODE_CLAIMS, body=body)


async def delete_node_claim(api: ApiClient, name: str) -> bool:
    """Delete a NodeClaim (Karpenter then deletes its node); False when it is gone."""
    try:
        await requests.request_json(api, "DELETE", f"{NODE_CLAIMS}/{name}")
    except requests.ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return True


class KubeKarpenter:
    """``autoscaler.KarpenterApi`` over the API server (and the pods' nominatedNodeName)."""

    def __init__(self, api: ApiClient) -> None:
        self._api = api

    async def node_pools(self) -> list[dict[str, Any]]:
        return await list_node_pools(self._api)

    async def node_claims(self) -> list[dict[str, Any]]:
        return await list_node_claims(self._api)

    async def create_claim(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return await create_node_claim(self._api, body)

    async def delete_claim(self, name: str) -> bool:
        return await delete_node_claim(self._api, name)

    async def pods_on(self, node: str) -> list[Pod]:
        return list(await pods.pods_on_node(self._api, node))

    async def nominate(self, namespace: str, name: str, node: str | None) -> bool:
        return await eviction.set_nominated_node(self._api, namespace, name, node)

    async def template(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await claims.read_template(self._api, namespace, name)
