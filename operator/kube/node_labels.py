"""A Node's labels (the agent reads its own at start: which GPU path the node is on)."""

from __future__ import annotations

from typing import Final, cast
from urllib.parse import quote

from vgpu_operator.kube.requests import ApiClient, request_json
from vgpu_operator.wire import Node, meta_of

_NODES: Final = "/api/v1/nodes"


async def read_node_labels(api: ApiClient, node: str) -> dict[str, str]:
    found = cast(Node, await request_json(api, "GET", f"{_NODES}/{quote(node)}"))
    labels = meta_of(found).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}
