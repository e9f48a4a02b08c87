"""A clock for tests that only moves when a test sets ``now``: what the control loops
take as ``clock=`` / ``wall_clock=`` (a callable giving seconds)."""

from __future__ import annotations


class ManualClock:
    """Reads ``now``; a test moves time by assigning to it (or adding to it)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
