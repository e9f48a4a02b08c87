"""Exponential backoff with full jitter, capped: how long to wait after a failure."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable


class Backoff:
    """Delays grow ``initial_s * factor**n`` up to ``max_s``; each delay drawn is
    uniformly random in [half of it, all of it], so agents that lost the API server
    together do not all come back in the same instant."""

    def __init__(
        self,
        initial_s: float = 1.0,
        max_s: float = 60.0,
        factor: float = 2.0,
        *,
        random_fraction: Callable[[], float] = random.random,
    ) -> None:
        if initial_s <= 0 or max_s < initial_s or factor < 1:
            raise ValueError("need 0 < initial_s <= max_s and factor >= 1")
        self.initial_s = initial_s
        self.max_s = max_s
        self.factor = factor
        self._random = random_fraction
        self._failures = 0

    @property
    def failures(self) -> int:
        """Failures since the last success."""
        return self._failures

    def next_delay_s(self) -> float:
        """Record one more failure and return how long to wait before retrying."""
        # The exponent is bounded so that a long outage cannot overflow the float.
        ceiling = min(self.max_s, self.initial_s * self.factor ** min(self._failures, 64))
        self._failures += 1
        return ceiling * (0.5 + 0.5 * self._random())

    def reset(self) -> None:
        """A success: the next failure waits ``initial_s`` again."""
        self._failures = 0


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or less when ``stop`` is set meanwhile: the pause of every agent
    loop between two tries or two polls, which a shutdown must not sit out."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
