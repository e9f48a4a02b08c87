"""The bench's own API client: one long-lived aiohttp session per identity.

The bench creates thousands of pods and watches them while the operator works; a plain
asyncio client keeps its own cost low and the same code is the binding ceiling's client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp

from vgpu_operator.testing.controlplane import ClientCredentials, ControlPlane

Json = dict[str, Any]


class ApiError(Exception):
    def __init__(self, method: str, path: str, status: int, text: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {text[:300]}")
        self.status = status


class Api:
    """JSON requests, paged lists and watches against one API server as one user."""

    def __init__(
        self, server: str, ca_path: str, creds: ClientCredentials, connections: int = 64
    ) -> None:
        self.server = server
        context = ssl.create_default_context(cafile=ca_path)
        context.load_cert_chain(str(creds.cert_path), str(creds.key_path))
        self._connector = aiohttp.TCPConnector(ssl=context, limit=connections)
        # trust_env=False: no proxy or netrc lookups on loopback.
        self._session = aiohttp.ClientSession(
            connector=self._connector,
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )

    @classmethod
    def for_plane(cls, cp: ControlPlane, creds: ClientCredentials, connections: int = 64) -> Api:
        return cls(cp.server, str(cp.ca_path), creds, connections)

    async def close(self) -> None:
        await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
    ) -> Json:
        data = json.dumps(body) if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        try:
            return await self._once(method, path, data, headers, timeout_s)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            # A kept-alive connection the server had closed: once more on a fresh one.
            return await self._once(method, path, data, headers, timeout_s)

    async def _once(
        self, method: str, path: str, data: str | None, headers: dict[str, str], timeout_s: float
    ) -> Json:
        async with self._session.request(
            method,
            self.server + path,
            data=data,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            text = await response.text()
            if response.status >= 400:
                raise ApiError(method, path, response.status, text)
        return json.loads(text) if text else {}

    async def text(self, path: str) -> str:
        async with self._session.get(self.server + path) as response:
            body = await response.text()
            if response.status >= 400:
                raise ApiError("GET", path, response.status, body)
            return body

    async def create(self, path: str, body: Mapping[str, Any]) -> Json:
        return await self.request("POST", path, body)

    async def merge_patch(self, path: str, body: Mapping[str, Any]) -> Json:
        return await self.request("PATCH", path, body, content_type="application/merge-patch+json")

    async def list_all(self, path: str, page: int = 2000) -> list[Json]:
        """Every item of a collection, page by page."""
        items: list[Json] = []
        token = ""
        separator = "&" if "?" in path else "?"
        while True:
            query = f"{separator}limit={page}" + (f"&continue={token}" if token else "")
            body = await self.request("GET", path + query, timeout_s=120)
            items.extend(body.get("items") or [])
            token = (body.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    async def ensure_namespace(self, name: str) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        try:
            await self.create("/api/v1/namespaces", body)
        except ApiError as exc:
            if exc.status != 409:
                raise

    async def delete_pods(self, namespace: str) -> None:
        """Every pod of the namespace (grace 0: KWOK runs no kubelet to wait for). One
        DELETE per pod, many at once: the server deletes a collection one pod at a time
        (``--delete-collection-workers`` is 1), which outlives the request at thousands."""
        pods = await self.list_all(f"/api/v1/namespaces/{namespace}/pods")

        async def delete(name: str) -> None:
            with contextlib.suppress(ApiError):
                await self.request(
                    "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}?gracePeriodSeconds=0"
                )

        await gather_limited(32, [delete(pod["metadata"]["name"]) for pod in pods])

    async def watch(self, path: str, resource_version: str = "") -> AsyncIterator[Json]:
        """Watch events (``{"type", "object"}``) until the server ends the stream."""
        query = "?watch=1&allowWatchBookmarks=false"
        if resource_version:
            query += f"&resourceVersion={resource_version}"
        async with self._session.get(
            self.server + path + query, timeout=aiohttp.ClientTimeout(total=None)
        ) as response:
            if response.status >= 400:
                raise ApiError("GET", path, response.status, await response.text())
            async for line in response.content:
                if line.strip():
                    yield json.loads(line)


async def gather_limited(limit: int, jobs: list[Any]) -> list[Any]:
    """Run coroutines with at most ``limit`` in flight; results in order."""
    gate = asyncio.Semaphore(limit)

    async def one(job: Any) -> Any:
        async with gate:
            return await job

    return await asyncio.gather(*(one(job) for job in jobs))


def now() -> float:
    return time.time()
