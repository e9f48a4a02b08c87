"""A Node's labels (the agent reads its own at start: which GPU path the node is on)."""

from __future__ import annotations

from typing import Final
from urllib.parse import quote

from vgpu_operator.kube.requests import ApiClient, request_json

_NODES: Final = "/api/v1/nodes"


async def read_node_labels(api: ApiClient, node: str) -> dict[str, str]:
    found = await request_json(api, "GET", f"{_NODES}/{quote(node)}")
    labels = (found.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}
