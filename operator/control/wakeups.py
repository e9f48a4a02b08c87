"""Which waiting pods a cluster event wakes (the queueing hints, ``docs/queueing.md``).

Each event is weighed against each distinct hint the waiting pods hold, and wakes a pod
only where the engine says the event lets it fit: room freed on a node, a node that
appeared or changed, a quota's limits. Part of ``StateFeed`` (``feed.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, Protocol

import structlog

from vgpu_operator.control import queue
from vgpu_operator.scheduling.books.changes import Freed

log = structlog.get_logger("vgpu_operator.feed")


class HintJudge(Protocol):
    """The engine's answers to the queueing hints (a verdict is the engine's, opaque here)."""

    def take_freed(self) -> list[Freed]: ...
    def fits_now(self, verdict: Any, node: str, now: float) -> bool: ...
    def quota_may_help(self, verdict: Any, namespace: str) -> bool: ...


class Wakeups:
    """See the module docstring. ``wall_clock`` gives epoch seconds."""

    def __init__(
        self, engine: HintJudge, pods_queue: queue.SchedulingQueue, wall_clock: Callable[[], float]
    ) -> None:
        self._engine = engine
        self._queue = pods_queue
        self._wall_clock = wall_clock

    def settle_releases(self) -> None:
        """Wake the pods that the room freed since the last call lets fit: pods ended or
        deleted, reservations rolled back, preemptors' holds given up, init containers'
        shares released (the engine keeps the list, ``take_freed``)."""
        for freed in self._engine.take_freed():
            self._wake(
                queue.ClusterEvent.ROOM_FREED,
                functools.partial(self._freed_helps, freed),
                node=freed.node,
                namespace=freed.namespace,
            )

    def _freed_helps(self, freed: Freed, hint: Hashable | None) -> bool:
        if hint is None:
            return True
        if hint is queue.OWN_CHANGE_ONLY or isinstance(hint, queue.Refused):
            return False
        if isinstance(hint, queue.WaitsForVictims):
            return hint.node == freed.node
        if self._engine.quota_may_help(hint, freed.namespace):
            return True  # its namespace's quota usage fell: any node may do now
        return self._engine.fits_now(hint, freed.node, self._wall_clock())

    def for_node(self, event: queue.ClusterEvent, node: str) -> None:
        """A node appeared, changed what a decision reads of it, or its inventory did:
        only pods that now fit it can be helped (every other node is as it was)."""

        def helps(hint: Hashable | None) -> bool:
            if hint is None:
                return True
            if hint is queue.OWN_CHANGE_ONLY or isinstance(hint, queue.Refused):
                return False
            if isinstance(hint, queue.WaitsForVictims):
                return hint.node == node
            return self._engine.fits_now(hint, node, self._wall_clock())

        self._wake(event, helps, node=node)

    def for_quota(self, namespace: str) -> None:
        """A quota's limits changed: pods of its namespace that it refused or that a
        quota ruled out."""

        def helps(hint: Hashable | None) -> bool:
            if hint is None:
                return True
            if isinstance(hint, queue.Refused):
                return hint.namespace == namespace
            if hint is queue.OWN_CHANGE_ONLY or isinstance(hint, queue.WaitsForVictims):
                return False
            return self._engine.quota_may_help(hint, namespace)

        self._wake(queue.ClusterEvent.QUOTA_CHANGED, helps, namespace=namespace)

    def _wake(
        self,
        event: queue.ClusterEvent,
        helps: Callable[[Hashable | None], bool],
        **context: str,
    ) -> None:
        woken = self._queue.wake(helps)
        if woken:
            log.debug("pods_woken", cluster_event=event.value, woken=woken, **context)
