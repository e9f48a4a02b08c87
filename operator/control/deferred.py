"""Writes that may wait: done while the hot path is idle, or once they waited long enough.

The Normal ``Scheduled`` Event of a bound pod tells its owner news that the pod itself
already shows (``spec.nodeName``, the ``PodScheduled`` condition the Binding sets). Written
beside each Binding it doubles the API writes of a burst and competes with the Bindings
for the API server and the operator's one core. Queued here instead, it is written when
no Binding is in flight and no pod is ready to decide, and at the latest ``max_delay_s``
after it was queued, so under a steady stream the Events still follow, a few seconds late.

The queue is bounded: beyond ``limit`` waiting writes the oldest are dropped (counted),
because news about pods bound long ago is worth less than memory.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from typing import Final

DEFAULT_MAX_DELAY_S: Final = 5.0
DEFAULT_LIMIT: Final = 20_000
#: Writes sent together once the queue may drain.
BATCH: Final = 8
#: How often a busy hot path is looked at again.
POLL_S: Final = 0.05

Write = Callable[[], Awaitable[None]]


class DeferredWrites:
    """See the module docstring. ``busy`` says whether the hot path has work now."""

    def __init__(
        self,
        *,
        busy: Callable[[], bool] = lambda: False,
        max_delay_s: float = DEFAULT_MAX_DELAY_S,
        limit: int = DEFAULT_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.busy = busy
        self._max_delay_s = max_delay_s
        self._limit = limit
        self._clock = clock
        self._items: collections.deque[tuple[float, Write]] = collections.deque()
        self._queued = asyncio.Event()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, write: Write) -> None:
        if len(self._items) >= self._limit:
            self._items.popleft()
            self.dropped += 1
        self._items.append((self._clock(), write))
        self._queued.set()

    def due(self) -> bool:
        """Whether the oldest write may go now."""
        if not self._items:
            return False
        return not self.busy() or self._clock() - self._items[0][0] >= self._max_delay_s

    async def run(self, on_error: Callable[[Exception], None]) -> None:
        """Write forever (until cancelled); a failed write is reported, not retried."""
        while True:
            await self._queued.wait()
            while self._items:
                if not self.due():
                    await asyncio.sleep(POLL_S)
                    continue
                batch = [self._items.popleft()[1] for _ in range(min(BATCH, len(self._items)))]
                writing = (write() for write in batch)
                results = await asyncio.gather(*writing, return_exceptions=True)
                for result in results:
                    if isinstance(result, Exception):
                        on_error(result)
            self._queued.clear()
