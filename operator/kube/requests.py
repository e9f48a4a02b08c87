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
from urllib.parse import urlencode

import aiohttp
import orjson
from kubernetes_asyncio import client

from vgpu_operator.kube import session

#: The client type, for modules above ``kube`` that must not import the library.
ApiClient: TypeAlias = client.ApiClient

JSON_CONTENT: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"


class ApiError(Exception):
    """The API server answered with an HTTP error status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {_why(body)}")
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


#: The most characters of an error body an ``ApiError`` quotes.
_BODY_CHARS: Final = 600


def _why(body: str) -> str:
    """What an error body says, bounded: a Status object's reason and message first (the
    first 300 characters of its JSON were mostly ``kind``, ``apiVersion`` and ``metadata``,
    and a long message lost its end), any other body cut in its middle."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("kind") == "Status" and data.get("message"):
        text = f"{data.get('reason') or 'Failure'}: {data['message']}"
    else:
        text = " ".join(body.split())
    if len(text) <= _BODY_CHARS:
        return text
    head = _BODY_CHARS // 2
    cut = len(text) - _BODY_CHARS
    return f"{text[:head]}… ({cut} more characters) …{text[len(text) - (_BODY_CHARS - head) :]}"


async def auth_headers(api: client.ApiClient) -> dict[str, str]:
    """The client's credentials as headers (a bearer token, refreshed by the client's
    own hook when it expires; client certificates are in the session's TLS context)."""
    configuration = api.configuration
    if "BearerToken" not in configuration.api_key:
        return {}
    value = await configuration.get_api_key_with_prefix("BearerToken")
    return {"Authorization": str(value)} if value else {}


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

    Straight through the client's long-lived session (``session.tune``): the generated
    client's generic request path (parameter sanitising, its own JSON encoding) is not
    needed for a path and a dict, and costs more than the request itself in a burst.
    Raises ``ApiError`` for HTTP statuses outside 2xx.
    """
    data = orjson.dumps(body) if body is not None else None
    raw = await request_bytes(
        api, method, path, query=query, data=data, content_type=content_type, timeout_s=timeout_s
    )
    if not raw:
        return {}
    decoded = orjson.loads(raw)
    return decoded if isinstance(decoded, dict) else {"items": decoded}


async def request_bytes(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    query: Mapping[str, str | int] | None = None,
    data: bytes | None = None,
    content_type: str = JSON_CONTENT,
    accept: str = JSON_CONTENT,
    timeout_s: float | None = 30.0,
) -> bytes:
    """``request_json`` with the bodies as bytes, sent and returned as they are (for an
    object whose raw parts must travel byte for byte). Raises ``ApiError``."""
    configuration = api.configuration
    headers = {"Accept": accept, "Content-Type": content_type, **await auth_headers(api)}
    url = f"{configuration.host}{path}"
    if query:
        url = f"{url}?{urlencode(list(query.items()))}"
    async with session.session_of(api).request(
        method,
        url,
        data=data,
        headers=headers,
        proxy=configuration.proxy,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        server_hostname=configuration.tls_server_name,
    ) as response:
        raw = await response.read()
        status = response.status
    if not 200 <= status < 300:
        raise ApiError(method, path, status, raw.decode(errors="replace"))
    return raw
