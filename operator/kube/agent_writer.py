"""The API calls of the node agent, over one ApiClient (``agent.inventory_loop.AgentWriter``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kubernetes_asyncio import client

from vgpu_operator.kube import inventory, node_lease
from vgpu_operator.wire import DeviceInventory


class KubeAgentWriter:
    """The node's inventory, its Lease (the heartbeat) and HAMi's node annotations."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    async def ensure(self, node_name: str) -> None:
        await inventory.ensure_inventory(self.api, node_name)

    async def write_status(self, node_name: str, status: Mapping[str, Any]) -> None:
        await inventory.patch_inventory_status(self.api, node_name, status)

    async def read_inventory(self, node_name: str) -> DeviceInventory | None:
        return await inventory.read_inventory_cached(self.api, node_name)

    async def renew_lease(self, node_name: str, renewed: datetime, duration_s: int) -> None:
        await node_lease.renew_node_lease(self.api, node_name, renewed, duration_s)

    async def write_node_annotations(
        self, node_name: str, annotations: Mapping[str, str | None]
    ) -> None:
        await inventory.patch_node_annotations(self.api, node_name, annotations)
