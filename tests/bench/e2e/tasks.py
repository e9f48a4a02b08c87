"""The bench's background loops (samplers, watchers): started on the running event loop,
stopped by cancelling and waiting until they have ended."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


def start(loop: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(loop)


async def stop(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if started) and wait for it: nothing of it runs after this returns."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
