"""Faults injected while a burst is being placed, and the time to recover from each.

Each fault starts once a third of the burst is bound. Recovery is the time from the end of
the fault (the operator or API server serving again, the network healed) to the next pod
seen bound. The run's own recount then says whether every pod ended bound or waiting
with a reason and whether any card was over-committed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from e2e.tracking import Tracker

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def toxiproxy_call(api_port: int, method: str, path: str, body: dict[str, Any] | None) -> None:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{api_port}{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with _NO_PROXY.open(request, timeout=10) as response:
        response.read()


async def _third_bound(tracker: Tracker, total: int) -> None:
    await tracker.wait(lambda: len(tracker.bound) >= total // 3, 600)


def fault(
    total: int,
    inject: Callable[[], Awaitable[dict[str, Any]]],
) -> Callable[[Tracker], Coroutine[Any, Any, dict[str, Any]]]:
    """Wait for a third of ``total`` bound, run ``inject`` (which returns when the fault is
    over), let the burst finish, and measure from the end of the fault to the first bind
    after it (None when the burst finished while the fault lasted) and the longest pause
    between binds from the fault's start to the end of the burst."""

    async def during(tracker: Tracker) -> dict[str, Any]:
        await _third_bound(tracker, total)
        began = time.time()
        bound_before = len(tracker.bound)
        figures = await inject()
        healed = time.time()
        figures["fault_s"] = healed - began
        figures["bound_during"] = len(tracker.bound) - bound_before
        await tracker.wait(lambda: len(tracker.bound) >= total, 600)
        after = [t for t in tracker.bound.values() if t >= healed]
        figures["recover_s"] = min(after) - healed if after else None
        # What a user sees: the longest stretch without a bind from the fault's start on.
        points = [began, *sorted(t for t in tracker.bound.values() if t >= began)]
        figures["pause_s"] = max((b - a for a, b in itertools.pairwise(points)), default=None)
        return figures

    return during


def proxy_toxic(
    api_port: int, proxy: str, toxic: dict[str, Any], hold_s: float
) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def inject() -> dict[str, Any]:
        await asyncio.to_thread(toxiproxy_call, api_port, "POST", f"/proxies/{proxy}/toxics", toxic)
        await asyncio.sleep(hold_s)
        await asyncio.to_thread(
            toxiproxy_call, api_port, "DELETE", f"/proxies/{proxy}/toxics/{toxic['name']}", None
        )
        return {"toxic": toxic["type"], "held_s": hold_s}

    return inject


def partition(api_port: int, proxy: str, hold_s: float) -> Callable[[], Awaitable[dict[str, Any]]]:
    """The proxy refuses and drops every connection for ``hold_s``."""

    async def inject() -> dict[str, Any]:
        await asyncio.to_thread(
            toxiproxy_call, api_port, "POST", f"/proxies/{proxy}", {"enabled": False}
        )
        await asyncio.sleep(hold_s)
        await asyncio.to_thread(
            toxiproxy_call, api_port, "POST", f"/proxies/{proxy}", {"enabled": True}
        )
        return {"held_s": hold_s}

    return inject
