"""The run's one time budget: every step and subprocess takes its timeout from what is left,
so the whole check ends inside it (the GPU machine is lent for minutes, not hours)."""

from __future__ import annotations

import time
from collections.abc import Callable


class Budget:
    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.total_s = total_s
        self._clock = clock
        self._start = clock()

    def spent(self) -> float:
        return self._clock() - self._start

    def remaining(self) -> float:
        return max(0.0, self.total_s - self.spent())

    def timeout(self, cap_s: float) -> float:
        """A timeout for the next piece of work: at most ``cap_s``, never past the budget."""
        return max(0.0, min(cap_s, self.remaining()))

    def allows(self, needed_s: float) -> bool:
        """Whether ``needed_s`` seconds are still left."""
        return self.remaining() >= needed_s
