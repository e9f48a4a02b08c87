"""PodGroup condition writes, one at a time per group and the latest last.

The worker hands a group's ``PodGroupInitiallyScheduled`` condition over as a background
write after each attempt. Two writes for one group in flight at once could land in either
order, leaving an older message ("minCount 4, 1 exist") over a newer one. So each group has
at most one write in flight; a condition handed over meanwhile replaces any that waits, and
is written when the one in flight ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

Write = Callable[[str, Mapping[str, object]], Awaitable[None]]


class GroupConditionWrites:
    """Serialises ``write(group, condition)`` per group, keeping only the newest waiting."""

    def __init__(self, write: Write) -> None:
        self._write = write
        self._waiting: dict[str, Mapping[str, object]] = {}
        self._writing: set[str] = set()

    async def __call__(self, group: str, condition: Mapping[str, object]) -> None:
        self._waiting[group] = condition
        if group in self._writing:
            return  # the write in flight picks it up when it ends
        self._writing.add(group)
        try:
            while (latest := self._waiting.pop(group, None)) is not None:
                await self._write(group, latest)
        finally:
            self._writing.discard(group)
