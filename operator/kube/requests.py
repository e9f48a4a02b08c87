"""Raw JSON requests through a kubernetes_asyncio ``ApiClient``.

The generated API methods deserialise responses into model objects, which costs time on
large lists and fails outright for the pods/binding subresource (the server answers a
Binding with a ``Status``; see control-plane.md §6.2). These helpers send and return
plain JSON, with the client's authentication, and always release the connection.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeAlias

from kubernetes_asyncio import client

#: The client type, for modules above ``kube`` that must not import the library.
ApiClient: TypeAlias = client.ApiClient

JSON_CONTENT: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"


class ApiError(Exception):
    """The API server answered with an HTTP error status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:300]}")
        self.method = method
        self.path = path
        self.status = status
        self.body = body

    @property
    def reason(self) -> str:
        """The ``reason`` of the returned Status object (``AlreadyExists``...), if any."""
        try:
            data = json.loads(self.body)
        except ValueError:
            return ""
        return str(data.get("reason", "")) if isinstance(data, dict) else ""


async def request_json(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    query: Mapping[str, str | int] | None = None,
    body: Mapping[str, Any] | Sequence[Any] | None = None,
    content_type: str = JSON_CONTENT,
    timeout_s: float | None = 30.0,
) -> dict[str, Any]:
    """Send one request; return the decoded JSON object (``{}`` for an empty body).

    Raises ``ApiError`` for HTTP statuses outside 2xx.
    """
    headers = {"Accept": JSON_CONTENT, "Content-Type": content_type}
    response = await api.call_api(
        path,
        method,
        query_params=list(query.items()) if query else None,
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=timeout_s,
    )
    try:
        raw = await response.read()
    finally:
        response.release()
    if not 200 <= response.status < 300:
        raise ApiError(method, path, response.status, raw.decode(errors="replace"))
    if not raw:
        return {}
    data = json.loads(raw)
    return data if isinstance(data, dict) else {"items": data}
