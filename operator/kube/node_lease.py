"""Renewing a node's Lease (``node_leases``), the agent's heartbeat.

One merge patch of the spec per renewal: no read first, so the agent needs only the
``patch`` verb, and ``create`` for the first renewal (or after someone deleted it).
"""

from __future__ import annotations

import datetime
from typing import Final

import structlog
from kubernetes_asyncio import client

from vgpu_operator import node_leases
from vgpu_operator.errors import VgpuError
from vgpu_operator.kube import requests
from vgpu_operator.kube.inventory import read_node_uid

log = structlog.get_logger(__name__)

_NOT_FOUND: Final = 404
_CONFLICT: Final = 409


class LeaseNamespaceMissingError(VgpuError):
    """The namespace of the node Leases does not exist."""

    def __init__(self) -> None:
        super().__init__(
            f"the namespace {node_leases.NAMESPACE} does not exist; apply "
            "manifests/namespace.yaml (kubectl apply -k manifests/ creates it)"
        )


async def renew_node_lease(
    api: client.ApiClient, node_name: str, renewed: datetime.datetime, duration_s: int
) -> None:
    """Move the node's Lease to ``renewed``, creating the Lease if there is none.

    Raises ``LeaseNamespaceMissingError``, ``NodeNotFoundError`` (on creation) or
    ``requests.ApiError``.
    """
    if await _patch(api, node_name, renewed, duration_s):
        return
    manifest = node_leases.lease_manifest(
        node_name, renewed, duration_s, await read_node_uid(api, node_name)
    )
    try:
        await requests.request_json(api, "POST", node_leases.COLLECTION, body=manifest)
    except requests.ApiError as exc:
        if exc.status == _NOT_FOUND:
            raise LeaseNamespaceMissingError() from exc
        if exc.status == _CONFLICT and await _patch(api, node_name, renewed, duration_s):
            return  # created in between (a second agent on a restart): renewed all the same
        raise
    log.info("node_lease_created", node=node_name, namespace=node_leases.NAMESPACE)


async def _patch(
    api: client.ApiClient, node_name: str, renewed: datetime.datetime, duration_s: int
) -> bool:
    """Renew an existing Lease; False when there is none."""
    body = {"spec": node_leases.renewal_spec(node_name, renewed, duration_s)}
    try:
        await requests.request_json(
            api,
            "PATCH",
            node_leases.lease_path(node_name),
            body=body,
            content_type=requests.MERGE_PATCH,
        )
    except requests.ApiError as exc:
        if exc.status == _NOT_FOUND:
            return False
        raise
    return True
