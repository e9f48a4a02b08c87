"""The kubernetes_asyncio client: how to connect, and plain dicts for everything above.

Upper layers (the engine, the agent's pure mapping, the handlers) only ever see plain
dicts: ``to_dict`` turns the library's generated model objects into the JSON shape the
API server sent.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from vgpu_operator.kube import session

#: Present in every pod's environment; absent on a workstation.
_IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"


async def create_api_client(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    context: str | None = None,
) -> client.ApiClient:
    """Connect using, in order: ``kubeconfig`` if given, the in-cluster service
    account if running in a pod, else ``$KUBECONFIG`` / ``~/.kube/config``.

    The caller owns the client and must ``await api.close()`` (or use ``api_client``).
    Its HTTP session is the long-lived one of ``session.tune``.
    """
    configuration = client.Configuration()
    if kubeconfig is not None:
        await config.load_kube_config(
            config_file=str(Path(kubeconfig)),
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    elif os.environ.get(_IN_CLUSTER_ENV):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(
            context=context, client_configuration=configuration, persist_config=False
        )
    api = client.ApiClient(configuration=configuration)
    await session.tune(api)
    return api


@asynccontextmanager
async def api_client(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    context: str | None = None,
) -> AsyncIterator[client.ApiClient]:
    """``create_api_client`` as an ``async with`` block that closes the session."""
    api = await create_api_client(kubeconfig, context=context)
    try:
        yield api
    finally:
        await api.close()


def to_dict(obj: Any) -> Any:
    """A generated model object (or list/dict of them) as plain JSON-shaped data.

    Uses the wire names (``metadata.creationTimestamp``), like the API server's JSON,
    and ISO 8601 strings for times. Plain dicts pass through unchanged.
    """
    if obj is None or isinstance(obj, bool | int | float | str | bytes):
        return obj
    if isinstance(obj, list | tuple):
        return [to_dict(item) for item in obj]
    if isinstance(obj, dict):
        return {key: to_dict(value) for key, value in obj.items()}
    if hasattr(obj, "isoformat"):
        return obj.isoformat()
    openapi_types = getattr(obj, "openapi_types", None)
    attribute_map = getattr(obj, "attribute_map", None)
    if isinstance(openapi_types, dict) and isinstance(attribute_map, dict):
        # The same walk as ApiClient.sanitize_for_serialization, which we cannot call
        # without an ApiClient, and building one opens an HTTP session.
        return {
            attribute_map[attr]: to_dict(getattr(obj, attr))
            for attr in openapi_types
            if getattr(obj, attr) is not None
        }
    raise TypeError(f"cannot convert {type(obj).__name__} to a dict")
