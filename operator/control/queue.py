"""The queues of pods waiting for a decision: active, backoff and unschedulable.

Modelled on kube-scheduler's scheduling queue. A pod is in one of them, or *in flight*
(the worker holds it):

- *active*: due now, taken highest priority first, then oldest;
- *backoff*: it failed recently and is due at ``ready_at``; its backoff doubles with each
  failed attempt from ``initial_backoff_s`` (1 s) up to ``max_backoff_s`` (10 s);
- *unschedulable*: it fitted nowhere, and waits for an event that could change that.

Each unschedulable pod keeps its *hint*: why it waits, as an object the feed asks about
an event (a ``verdicts.Verdict`` from the engine, shared by every pod of one shape, or a
hint of this module). Pods are grouped by hint, so an event is weighed once per distinct
hint, not once per pod: a backlog of thousands of identical pods that no event can help
costs one question per event. A woken pod goes to *backoff* if its backoff has not run
out yet, else to *active*. Pods that waited longer than ``flush_after_s`` without an
event that helps are moved on anyway (``flush``, kube-scheduler's periodic flush of
long-unschedulable pods).

Pure and synchronous; time comes from an injected clock, so tests need no sleeping.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from vgpu_operator.scheduling.pod_key import PodKey

#: kube-scheduler's defaults: podInitialBackoffSeconds, podMaxBackoffSeconds, and
#: podMaxInUnschedulablePodsDuration.
DEFAULT_INITIAL_BACKOFF_S: Final = 1.0
DEFAULT_MAX_BACKOFF_S: Final = 10.0
DEFAULT_FLUSH_AFTER_S: Final = 300.0


class ClusterEvent(enum.Enum):
    """Changes that may let an unschedulable pod fit (kube-scheduler's cluster events);
    named in logs and in ``docs/queueing.md``'s table."""

    ROOM_FREED = "RoomFreed"  # a pod left a node: ended, deleted, rolled back, a hold given up
    NODE_CHANGED = "NodeChanged"  # a node was added or its schedulable facts changed
    INVENTORY_CHANGED = "InventoryChanged"  # a node's cards, cordons or freshness changed
    QUOTA_CHANGED = "QuotaChanged"  # a namespace's ResourceQuota limits changed
    CONFIG_CHANGED = "ConfigChanged"  # the device config
    POD_CHANGED = "PodChanged"  # the waiting pod's own spec, labels or annotations
    FLUSH = "Flush"  # waited longer than flush_after_s


class QueueName(enum.StrEnum):
    """The three queues, named as kube-scheduler names them (``census``)."""

    ACTIVE = "active"
    BACKOFF = "backoff"
    UNSCHEDULABLE = "unschedulable"


@dataclass(frozen=True, slots=True)
class WaitsForVictims:
    """Hint of a preemptor: it waits for its victims to leave ``node``."""

    node: str


@dataclass(frozen=True, slots=True)
class Refused:
    """Hint of a pod admission refuses (its own demand exceeds its namespace's quota):
    only a change of that quota or of the config can help."""

    namespace: str


class _OwnChangeOnly:
    """Hint of a pod whose request cannot be read: only its own edit can help."""

    def __repr__(self) -> str:
        return "OWN_CHANGE_ONLY"


OWN_CHANGE_ONLY: Final = _OwnChangeOnly()


@dataclass(frozen=True, slots=True)
class QueueCensus:
    """Pods per queue, and per reason code the unschedulable pods that name it (a pod
    that names several reasons counts under each)."""

    pods: Mapping[QueueName, int]
    unschedulable_reasons: Mapping[str, int]


class _State(enum.Enum):
    ACTIVE = enum.auto()  # in the active heap
    BACKOFF = enum.auto()  # in the backoff heap
    UNSCHEDULABLE = enum.auto()  # in a hint group
    IN_FLIGHT = enum.auto()


@dataclass(slots=True)
class _Entry:
    uid: str
    priority: int
    seq: int  # arrival order, kept through its moves (the active heap's tie-break)
    state: _State = _State.ACTIVE
    attempts: int = 0
    ready_at: float = 0.0
    generation: int = 0  # bumps whenever the entry moves, to drop stale heap items
    #: While unschedulable: why (its hint, the reason codes of its condition), since when.
    hint: Hashable | None = None
    reasons: tuple[str, ...] = ()
    parked_at: float = 0.0


class SchedulingQueue:
    """Pods waiting to be scheduled; see the module docstring.

    ``notify`` is called whenever a pod may have become ready (the worker's wake-up).
    """

    def __init__(
        self,
        *,
        initial_backoff_s: float = DEFAULT_INITIAL_BACKOFF_S,
        max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
        flush_after_s: float = DEFAULT_FLUSH_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
        notify: Callable[[], None] | None = None,
    ) -> None:
        if initial_backoff_s <= 0 or max_backoff_s < initial_backoff_s:
            raise ValueError("backoff must be positive and max >= initial")
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._flush_after_s = flush_after_s
        self._clock = clock
        self._notify = notify or (lambda: None)
        self._entries: dict[PodKey, _Entry] = {}
        self._seq = itertools.count()
        # (-priority, seq, key, generation): the active queue.
        self._active: list[tuple[int, int, PodKey, int]] = []
        # (ready_at, seq, key, generation): the backoff queue, by when each is due.
        self._backoff: list[tuple[float, int, PodKey, int]] = []
        # The unschedulable pods, grouped by hint.
        self._groups: dict[Hashable | None, set[PodKey]] = {}
        self._unschedulable = 0

    # --- membership -----------------------------------------------------------------
    def add(self, key: PodKey, uid: str, priority: int = 0) -> bool:
        """Queue a pending pod (active). Returns True when it is new (or a new pod under
        an old name). A pod already queued keeps its place, backoff and hint: its own
        updates (the condition we write, for one) must not make it try again."""
        entry = self._entries.get(key)
        if entry is not None and entry.uid == uid:
            return False
        if entry is not None:
            self._leave_group(key, entry)
        entry = _Entry(uid=uid, priority=priority, seq=next(self._seq), ready_at=self._clock())
        self._entries[key] = entry
        self._to_active(key, entry)
        return True

    def set_priority(self, key: PodKey, priority: int) -> None:
        """Change a queued pod's priority (its PodGroup's came or changed); an active pod
        takes its new place in the active queue, any other keeps its state."""
        entry = self._entries.get(key)
        if entry is None or entry.priority == priority:
            return
        entry.priority = priority
        if entry.state is _State.ACTIVE:
            self._to_active(key, entry)  # the old heap item is now stale

    def remove(self, key: PodKey) -> None:
        """Forget a pod (bound, deleted, no longer ours). Stale heap items are skipped."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._leave_group(key, entry)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> Iterator[PodKey]:
        return iter(list(self._entries))

    @property
    def parked_count(self) -> int:
        """Pods in the unschedulable queue."""
        return self._unschedulable

    def census(self) -> QueueCensus:
        """How many pods wait in each queue, and why the unschedulable ones do.

        A pod whose backoff has run out counts as active (kube-scheduler moves such pods
        every second; here ``pop`` moves them). A pod the worker holds (being decided,
        or its Binding being written) is in none, as a pod popped from kube-scheduler's
        queue is in none.
        """
        now = self._clock()
        counts = dict.fromkeys(QueueName, 0)
        reasons: dict[str, int] = {}
        for entry in self._entries.values():
            state = entry.state
            if state is _State.UNSCHEDULABLE:
                counts[QueueName.UNSCHEDULABLE] += 1
                for reason in entry.reasons:
                    reasons[reason] = reasons.get(reason, 0) + 1
            elif state is _State.ACTIVE or (state is _State.BACKOFF and entry.ready_at <= now):
                counts[QueueName.ACTIVE] += 1
            elif state is _State.BACKOFF:
                counts[QueueName.BACKOFF] += 1
        return QueueCensus(counts, reasons)

    def attempts(self, key: PodKey) -> int:
        entry = self._entries.get(key)
        return 0 if entry is None else entry.attempts

    def is_in_flight(self, key: PodKey) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.state is _State.IN_FLIGHT

    def is_unschedulable(self, key: PodKey) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.state is _State.UNSCHEDULABLE

    def hint_of(self, key: PodKey) -> Hashable | None:
        """The hint an unschedulable pod waits with (None otherwise)."""
        entry = self._entries.get(key)
        return entry.hint if entry is not None and entry.state is _State.UNSCHEDULABLE else None

    # --- the worker's side ----------------------------------------------------------
    def pop(self) -> PodKey | None:
        """The next due pod (marked in flight), or None when none is due yet."""
        self._move_due_backoff()
        while self._active:
            _, _, key, generation = heapq.heappop(self._active)
            entry = self._entries.get(key)
            if entry is None or entry.generation != generation or entry.state is not _State.ACTIVE:
                continue
            entry.state = _State.IN_FLIGHT
            entry.generation += 1
            return key
        return None

    def next_due_at(self) -> float | None:
        """When the earliest backing-off pod becomes due (clock time), if any."""
        while self._backoff:
            ready_at, _, key, generation = self._backoff[0]
            entry = self._entries.get(key)
            if entry is not None and entry.generation == generation:
                return ready_at
            heapq.heappop(self._backoff)
        return None

    def has_ready(self) -> bool:
        """Whether ``pop`` would return a pod now."""
        due = self.next_due_at()
        if due is not None and due <= self._clock():
            return True
        active = self._active
        while active:
            _, _, key, generation = active[0]
            entry = self._entries.get(key)
            if entry is not None and entry.generation == generation:
                return True
            heapq.heappop(active)
        return False

    def park(
        self, key: PodKey, *, hint: Hashable | None = None, reasons: Sequence[str] = ()
    ) -> float:
        """The pod did not fit: to the unschedulable queue, until an event its ``hint``
        says could help (and at least its backoff). ``hint`` None: any event may help.
        ``reasons`` say why (for ``census``). Returns the backoff in seconds."""
        entry = self._entries.get(key)
        if entry is None:
            return 0.0
        backoff_s = self._fail(entry)
        self._leave_group(key, entry)
        entry.state = _State.UNSCHEDULABLE
        entry.hint = hint
        entry.reasons = tuple(reasons)
        entry.parked_at = self._clock()
        self._groups.setdefault(hint, set()).add(key)
        self._unschedulable += 1
        return backoff_s

    def retry_later(self, key: PodKey) -> float:
        """A transient failure (the Binding write failed): backoff, then active again."""
        entry = self._entries.get(key)
        if entry is None:
            return 0.0
        backoff_s = self._fail(entry)
        self._leave_group(key, entry)
        self._to_backoff(key, entry)
        return backoff_s

    def take(self, key: PodKey) -> bool:
        """Mark a queued pod in flight out of turn (a gang's member, decided with the one
        popped): its place in the queues is left. False when it is not queued or already
        in flight."""
        entry = self._entries.get(key)
        if entry is None or entry.state is _State.IN_FLIGHT:
            return False
        self._leave_group(key, entry)
        entry.state = _State.IN_FLIGHT
        entry.generation += 1
        return True

    def release(self, key: PodKey) -> None:
        """The worker gives a pod back untouched (it was not ours to decide after all)."""
        entry = self._entries.get(key)
        if entry is not None and entry.state is _State.IN_FLIGHT:
            entry.ready_at = self._clock()
            self._to_active(key, entry)

    # --- waking -----------------------------------------------------------------------
    def wake(self, helps: Callable[[Hashable | None], bool]) -> int:
        """Move the unschedulable pods whose hint ``helps`` says the event helps; each
        distinct hint is asked once. Returns how many pods moved."""
        woken = 0
        for hint in [h for h in self._groups if helps(h)]:
            for key in list(self._groups.get(hint, ())):
                woken += self._unpark(key)
        return woken

    def wake_all(self) -> int:
        """Move every unschedulable pod (the config changed)."""
        return sum(self._unpark(key) for keys in list(self._groups.values()) for key in list(keys))

    def wake_one(self, key: PodKey) -> None:
        """Move one pod (its own spec or annotations changed)."""
        self._unpark(key)

    def flush(self) -> int:
        """Move the pods unschedulable for longer than ``flush_after_s`` (run it
        periodically: kube-scheduler checks every 30 s)."""
        now = self._clock()
        stale = [
            key
            for keys in self._groups.values()
            for key in keys
            if now - self._entries[key].parked_at >= self._flush_after_s
        ]
        return sum(self._unpark(key) for key in stale)

    def hints(self) -> list[Hashable | None]:
        """The distinct hints unschedulable pods wait with."""
        return list(self._groups)

    # --- internals --------------------------------------------------------------------
    def _fail(self, entry: _Entry) -> float:
        entry.attempts += 1
        backoff_s: float = min(
            self._initial_backoff_s * 2.0 ** (entry.attempts - 1), self._max_backoff_s
        )
        entry.ready_at = self._clock() + backoff_s
        entry.generation += 1
        return backoff_s

    def _unpark(self, key: PodKey) -> int:
        entry = self._entries.get(key)
        if entry is None or entry.state is not _State.UNSCHEDULABLE:
            return 0
        self._leave_group(key, entry)
        if entry.ready_at > self._clock():
            self._to_backoff(key, entry)
        else:
            self._to_active(key, entry)
        return 1

    def _leave_group(self, key: PodKey, entry: _Entry) -> None:
        if entry.state is not _State.UNSCHEDULABLE:
            return
        group = self._groups.get(entry.hint)
        if group is not None:
            group.discard(key)
            if not group:
                del self._groups[entry.hint]
        self._unschedulable -= 1
        entry.hint = None
        entry.reasons = ()
        entry.state = _State.IN_FLIGHT  # moved on by the caller

    def _to_active(self, key: PodKey, entry: _Entry) -> None:
        entry.state = _State.ACTIVE
        entry.generation += 1
        heapq.heappush(self._active, (-entry.priority, entry.seq, key, entry.generation))
        self._notify()

    def _to_backoff(self, key: PodKey, entry: _Entry) -> None:
        entry.state = _State.BACKOFF
        entry.generation += 1
        heapq.heappush(self._backoff, (entry.ready_at, entry.seq, key, entry.generation))
        self._notify()

    def _move_due_backoff(self) -> None:
        now = self._clock()
        while self._backoff and self._backoff[0][0] <= now:
            _, _, key, generation = heapq.heappop(self._backoff)
            entry = self._entries.get(key)
            if entry is not None and entry.generation == generation:
                self._to_active(key, entry)
