"""Following one run's pods: when each was created and when it was seen bound.

A watch on the run's namespace records the moment the bench first sees a pod bound (sub-
second, unlike the API server's timestamps) and the reason a pod waits. It survives the
API server going away (faults): it re-lists and watches again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from e2e import tasks
from e2e.api import Api, ApiError, Json
from e2e.checks import scheduled_condition


@dataclass
class Tracker:
    api: Api
    namespace: str
    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = tasks.start(self._run())

    async def stop(self) -> None:
        await tasks.stop(self._task)

    def _see(self, pod: Json) -> None:
        name = pod["metadata"]["name"]
        if (pod.get("spec") or {}).get("nodeName"):
            if name not in self.bound:
                self.bound[name] = time.time()
                self.waiting.pop(name, None)
                self.changed.set()
            return
        condition = scheduled_condition(pod)
        if condition and condition.get("status") == "False" and condition.get("message"):
            if name not in self.waiting:
                self.changed.set()
            self.waiting[name] = str(condition["message"])

    async def _run(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        while True:
            try:
                listing = await self.api.request("GET", path, timeout_s=120)
                for pod in listing.get("items") or []:
                    self._see(pod)
                version = (listing.get("metadata") or {}).get("resourceVersion", "")
                async for event in self.api.watch(path, version):
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._see(event["object"])
                    elif event.get("type") == "ERROR":
                        break
            except (TimeoutError, ApiError, aiohttp.ClientError, OSError, ValueError):
                await asyncio.sleep(0.5)

    async def wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``done()`` holds or ``timeout_s`` passes; whether it holds."""
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))
        return True
