"""The queue of pods waiting for a decision: ready, backing off, or parked.

Modelled on kube-scheduler's scheduling queue. A pod is *ready* (waiting for the worker),
*backing off* (it failed recently and may be tried again at ``ready_at``), *parked* (it
did not fit and waits for a cluster event that could change the answer), or *in flight*
(the worker holds it). Parked pods are woken only by an event that could help them, and
even then not before their backoff expires, so nothing spins: an unschedulable pod is
tried again at most once per backoff period, and only when something relevant changed
(or at the slow periodic resync).

Pure and synchronous; time comes from an injected clock, so tests need no sleeping.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from vgpu_operator.scheduling import status
from vgpu_operator.scheduling.pod_key import PodKey


class ClusterEvent(enum.Enum):
    """Changes that can make a parked pod fit (kube-scheduler's cluster events)."""

    POD_RELEASED = "PodReleased"  # a pod holding devices finished or went away
    NODE_SETTLED = "NodeSettled"  # a node's previous GPU pod has its devices (or timed out)
    NODE_CHANGED = "NodeChanged"  # a node was added or its schedulable facts changed
    INVENTORY_CHANGED = "InventoryChanged"  # a node's devices or cordons changed
    QUOTA_CHANGED = "QuotaChanged"
    CONFIG_CHANGED = "ConfigChanged"


#: Events that only help pods which more free capacity could help.
_CAPACITY_EVENTS = frozenset(
    {ClusterEvent.POD_RELEASED, ClusterEvent.NODE_SETTLED, ClusterEvent.QUOTA_CHANGED}
)


def release_could_help(diagnosis: status.Diagnosis | None) -> bool:
    """Whether freeing capacity (a released pod, a quota change) could make the pod fit.

    False when every node that ruled the pod out did so for a reason no release can
    clear (type mismatch, taints, ...), or when there were no nodes at all.
    """
    if diagnosis is None:
        return True
    if diagnosis.error is not None:
        return False
    return any(
        failure.code is status.Code.UNSCHEDULABLE for failure in diagnosis.node_failures.values()
    )


class QueueName(enum.StrEnum):
    """Where a waiting pod is, named as kube-scheduler's queues (``census``)."""

    ACTIVE = "active"
    BACKOFF = "backoff"
    UNSCHEDULABLE = "unschedulable"


@dataclass(frozen=True, slots=True)
class QueueCensus:
    """Pods per queue, and per reason code the parked pods that name it (a pod that
    names several reasons counts under each)."""

    pods: Mapping[QueueName, int]
    unschedulable_reasons: Mapping[str, int]


@dataclass(slots=True)
class _Entry:
    uid: str
    priority: int
    attempts: int = 0
    ready_at: float = 0.0
    parked: bool = False
    in_flight: bool = False
    release_helps: bool = True
    generation: int = 0  # bumps whenever the entry moves, to drop stale heap items
    #: While parked: why it did not fit (the reason codes of its condition message).
    reasons: tuple[str, ...] = ()


class SchedulingQueue:
    """Pods waiting to be scheduled; see the module docstring.

    ``notify`` is called whenever a pod may have become ready (the worker's wake-up).
    Backoff doubles per failed attempt from ``initial_backoff_s`` up to ``max_backoff_s``.
    """

    def __init__(
        self,
        *,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        notify: Callable[[], None] | None = None,
    ) -> None:
        if initial_backoff_s <= 0 or max_backoff_s < initial_backoff_s:
            raise ValueError("backoff must be positive and max >= initial")
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._clock = clock
        self._notify = notify or (lambda: None)
        self._entries: dict[PodKey, _Entry] = {}
        self._seq = itertools.count()
        # (ready_at, seq, key, generation): pods backing off, by the time they are due.
        self._waiting: list[tuple[float, int, PodKey, int]] = []
        # (-priority, seq, key, generation): due pods, highest priority and oldest first.
        self._ready: list[tuple[int, int, PodKey, int]] = []

    # --- membership -----------------------------------------------------------------
    def add(self, key: PodKey, uid: str, priority: int = 0) -> bool:
        """Queue a pending pod. Returns True when it is new (or a new pod under an old name).

        A pod already queued keeps its place, backoff and parking: its own updates (for
        instance the condition we write) must not make it try again.
        """
        entry = self._entries.get(key)
        if entry is not None and entry.uid == uid:
            return False
        entry = _Entry(uid=uid, priority=priority, ready_at=self._clock())
        self._entries[key] = entry
        self._schedule(key, entry)
        return True

    def remove(self, key: PodKey) -> None:
        """Forget a pod (bound, deleted, no longer ours). Stale heap items are skipped."""
        self._entries.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> Iterator[PodKey]:
        return iter(list(self._entries))

    @property
    def parked_count(self) -> int:
        return sum(1 for e in self._entries.values() if e.parked)

    def census(self) -> QueueCensus:
        """How many pods wait in each state, and why the parked ones did not fit.

        The states are kube-scheduler's queue names: *active* (due now), *backoff*
        (waiting for its backoff to end) and *unschedulable* (parked). A pod the worker
        holds (being decided, or its Binding being written) is in none, as a pod popped
        from kube-scheduler's queue is in none.
        """
        now = self._clock()
        counts = dict.fromkeys(QueueName, 0)
        reasons: dict[str, int] = {}
        for entry in self._entries.values():
            if entry.in_flight:
                continue
            if entry.parked:
                counts[QueueName.UNSCHEDULABLE] += 1
                for reason in entry.reasons:
                    reasons[reason] = reasons.get(reason, 0) + 1
            elif entry.ready_at > now:
                counts[QueueName.BACKOFF] += 1
            else:
                counts[QueueName.ACTIVE] += 1
        return QueueCensus(counts, reasons)

    def attempts(self, key: PodKey) -> int:
        entry = self._entries.get(key)
        return 0 if entry is None else entry.attempts

    def is_in_flight(self, key: PodKey) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.in_flight

    # --- the worker's side ----------------------------------------------------------
    def pop(self) -> PodKey | None:
        """The next due pod (marked in flight), or None when none is due yet."""
        now = self._clock()
        while self._waiting and self._waiting[0][0] <= now:
            _, seq, key, generation = heapq.heappop(self._waiting)
            entry = self._entries.get(key)
            if entry is not None and entry.generation == generation and not entry.parked:
                heapq.heappush(self._ready, (-entry.priority, seq, key, generation))
        while self._ready:
            _, _, key, generation = heapq.heappop(self._ready)
            entry = self._entries.get(key)
            if entry is None or entry.generation != generation or entry.parked:
                continue
            if entry.in_flight:
                continue
            entry.in_flight = True
            entry.generation += 1
            return key
        return None

    def next_due_at(self) -> float | None:
        """When the earliest backing-off pod becomes due (clock time), if any."""
        while self._waiting:
            ready_at, _, key, generation = self._waiting[0]
            entry = self._entries.get(key)
            if entry is not None and entry.generation == generation and not entry.parked:
                return ready_at
            heapq.heappop(self._waiting)
        return None

    def has_ready(self) -> bool:
        """Whether ``pop`` would return a pod now."""
        due = self.next_due_at()
        if due is not None and due <= self._clock():
            return True
        return any(
            (e := self._entries.get(k)) is not None and e.generation == g and not e.in_flight
            for _, _, k, g in self._ready
        )

    def park(
        self, key: PodKey, *, release_helps: bool = True, reasons: Sequence[str] = ()
    ) -> float:
        """The pod did not fit: wait for a helpful event, and at least for its backoff.

        ``reasons`` say why (for ``census``). Returns the backoff in seconds.
        """
        entry = self._entries.get(key)
        if entry is None:
            return 0.0
        backoff_s = self._fail(entry)
        entry.parked = True
        entry.release_helps = release_helps
        entry.reasons = tuple(reasons)
        return backoff_s

    def retry_later(self, key: PodKey) -> float:
        """A transient failure (the Binding write failed): try again after the backoff."""
        entry = self._entries.get(key)
        if entry is None:
            return 0.0
        backoff_s = self._fail(entry)
        entry.parked = False
        entry.reasons = ()
        self._schedule(key, entry)
        return backoff_s

    def release(self, key: PodKey) -> None:
        """The worker gives a pod back untouched (it was not ours to decide after all)."""
        entry = self._entries.get(key)
        if entry is not None and entry.in_flight:
            entry.in_flight = False
            entry.ready_at = self._clock()
            self._schedule(key, entry)

    # --- waking -----------------------------------------------------------------------
    def wake(self, event: ClusterEvent) -> int:
        """Unpark the pods this event could help; they run once their backoff is over."""
        woken = 0
        for key, entry in self._entries.items():
            if not entry.parked:
                continue
            if event in _CAPACITY_EVENTS and not entry.release_helps:
                continue
            self._unpark(key, entry)
            woken += 1
        return woken

    def wake_all(self) -> int:
        """Unpark everything (the slow periodic resync)."""
        woken = 0
        for key, entry in self._entries.items():
            if entry.parked:
                self._unpark(key, entry)
                woken += 1
        return woken

    def wake_one(self, key: PodKey) -> None:
        """Unpark one pod (its own spec or annotations changed)."""
        entry = self._entries.get(key)
        if entry is not None and entry.parked:
            self._unpark(key, entry)

    # --- internals --------------------------------------------------------------------
    def _fail(self, entry: _Entry) -> float:
        entry.in_flight = False
        entry.attempts += 1
        backoff_s: float = min(
            self._initial_backoff_s * 2.0 ** (entry.attempts - 1), self._max_backoff_s
        )
        entry.ready_at = self._clock() + backoff_s
        entry.generation += 1
        return backoff_s

    def _unpark(self, key: PodKey, entry: _Entry) -> None:
        entry.parked = False
        entry.reasons = ()
        self._schedule(key, entry)

    def _schedule(self, key: PodKey, entry: _Entry) -> None:
        entry.generation += 1
        heapq.heappush(self._waiting, (entry.ready_at, next(self._seq), key, entry.generation))
        self._notify()
