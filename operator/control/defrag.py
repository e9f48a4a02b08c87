"""Carrying out defragmentation plans (``run --defrag``; off by default).

Every ``interval_s``, while this replica decides and its books are synced, the runner
looks at the pods waiting for this scheduler (the 32 most important). When the engine
finds one blocked by fragmentation (``scheduling.defrag.defrag``), it lists the running pods
(their owners and specs), asks the planner for one plan (for the most important such pod)
and carries it out, one plan at a time.

Planning runs on the event loop, on the books themselves, in slices: the planner
(``defrag.plan_steps``) stops before each node it looks at, at a point where its what-if
has put every change to the books back, and after ``_SLICE_S`` of planning the runner
lets the loop run (decisions, the feed's events) before it goes on. At 1,000 nodes a
plan takes about 0.2 s at the median and up to a few seconds (``docs/benchmarks.md``);
decisions wait ``_SLICE_S`` plus one step instead of the whole plan. The longest steps
were the interpreter's full garbage collections (up to about 0.8 s of CPU with the books
of 1,000 nodes, measured with ``gc.callbacks``), which pause any other work just the
same: before each round the runner now freezes what survived since the last one
(``heap.refreeze``), so the full passes the planner's short-lived objects set off walk
only what was made since. The books may change between two slices, so the plan returned
may be out of date: right before the hold, with no await in between, it is checked again
on the books as they then are (``defrag.recheck``: the pod still waits, the pods to move
are still there and may move, the budgets allow it, the hold and each replacement replay
through the engine), and dropped if not (the next round plans again). Not a copy of the
books planned on in a thread: the copy (every node's cards and tens of thousands of pod
entries) would hold the loop up as long as planning does, a thread gains no CPU under
the GIL, and the plan would still need the same check on the live books before the hold.

1. The waiting pod is given the hold a preemption gives: the shares the plan frees on
   its node are booked for it at once and it waits for every pod the plan moves (the
   engine's nomination; the worker binds it once they are gone). Its
   ``status.nominatedNodeName`` is written, and an Event ``Defragmenting`` says what
   moves where.
2. Each move, in order: the pod is evicted through the Eviction API (with its uid as a
   precondition), an Event ``DefragmentationMove`` on it says why and where it will fit
   again; then the runner waits until the pod is gone and its replacement (a new pod of
   the same controller; for a StatefulSet, the same name with a new uid) is bound, and
   checks that it went to the planned node. A bare pod (where allowed) has no
   replacement to wait for.
3. Once the waiting pod is bound: an Event ``Defragmented``.

Any refusal or surprise stops the plan: an eviction refused (a PodDisruptionBudget with
no disruption left), a pod to move already gone, a replacement bound elsewhere than
planned or not bound within ``step_timeout_s``, the hold gone (it timed out, or the
pod was deleted or bound elsewhere), an API error. The hold is given back,
``nominatedNodeName`` cleared, and a Warning Event ``DefragmentationStopped`` on the
waiting pod says why; the pods already moved stay where they went. ``DefragMetrics``
counts plans, moves and failures.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from vgpu_operator.control import feed, heap, options
from vgpu_operator.kube.eviction import EvictOutcome
from vgpu_operator.metrics import DefragFailure, DefragMetrics, DefragMove
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.defrag import defrag
from vgpu_operator.scheduling.defrag.defrag_books import DefragBooks
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.scheduling.preemption import preemption
from vgpu_operator.wire import Pod, meta_of

log = structlog.get_logger("vgpu_operator.defrag")

#: The most waiting pods looked at in one round, the most important first.
_LOOKS = 32

#: The longest stretch of planning (or looking for fragmented pods) before the loop runs
#: other work.
_SLICE_S = 0.02

#: Event reasons.
DEFRAGMENTING = "Defragmenting"
MOVE = "DefragmentationMove"
DONE = "Defragmented"
STOPPED = "DefragmentationStopped"


class DefragActions(Protocol):
    """What carrying out a plan writes and reads through the API."""

    async def list_pods(self, namespace: str | None = None) -> list[Pod]: ...
    async def evict(self, key: PodKey, uid: str) -> EvictOutcome: ...
    async def nominate(self, pod: Pod, node: str | None) -> None: ...
    async def event(self, pod: Pod, reason: str, message: str, warning: bool = False) -> None: ...


class Decides(Protocol):
    """Whether this replica decides now (the leader, with synced books)."""

    def __call__(self) -> bool: ...


class _Stop(Exception):
    """A plan stops: why (for the Event), and the failure counted."""

    def __init__(self, failure: DefragFailure, message: str) -> None:
        super().__init__(message)
        self.failure = failure
        self.message = message


class PlanOutcome(enum.Enum):
    DONE = "done"
    STOPPED = "stopped"


def _name(pod: Pod) -> str:
    return str(meta_of(pod).get("name") or "")


def _uid(pod: Pod) -> str:
    return str(meta_of(pod).get("uid") or "")


def _controller_uid(pod: Pod) -> str | None:
    owner = defrag.controller_of(pod)
    return None if owner is None else owner.uid


def _cards(cards: Sequence[str]) -> str:
    return ",".join(cards)


def plan_message(plan: defrag.Plan) -> str:
    moves = "; ".join(
        f"{m.pod} from {m.from_node} {_cards(m.from_cards)} to {m.to_node} {_cards(m.to_cards)}"
        for m in plan.moves
    )
    cards = " ".join(_cards(c) for c in plan.cards)
    count = f"{plan.evictions} pod{'s' if plan.evictions != 1 else ''}"
    return (
        f"Moving {count} ({plan.memory_mib} MiB) to make room on node {plan.node} ({cards}), "
        f"where the free shares are scattered over cards: {moves}"
    )


def move_message(plan: defrag.Plan, move: defrag.Move) -> str:
    return (
        f"Evicted by defragmentation to make room for {plan.pod} on node {plan.node}; "
        f"expected to fit again on node {move.to_node} ({_cards(move.to_cards)})"
    )


@dataclass
class _Carrying:
    """A plan being carried out."""

    plan: defrag.Plan
    pod: Pod
    movers: Mapping[PodKey, Pod]
    done: int = 0


class DefragRunner:
    """See the module docstring."""

    def __init__(
        self,
        state: ClusterState,
        state_feed: feed.StateFeed,
        actions: DefragActions,
        metrics: DefragMetrics,
        settings: options.DefragOptions,
        *,
        decides: Decides,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._state = state
        self._books = DefragBooks(state)
        self._feed = state_feed
        self._actions = actions
        self._metrics = metrics
        self._settings = settings
        self._decides = decides
        self._wall_clock = wall_clock
        self._clock = clock
        self._sleep = sleep
        self._plan_options = defrag.PlanOptions(
            max_evictions=settings.max_evictions,
            allow_bare_pods=settings.allow_bare_pods,
            owner_kinds=settings.owner_kinds,
        )

    async def run(self) -> None:
        """Forever: a round every ``interval_s`` (until cancelled)."""
        while True:
            await self._sleep(self._settings.interval_s)
            if not self._decides():
                continue
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Listing the pods failed (a plan's own errors stop the plan): next round.
                log.warning("defrag_round_failed", error=str(exc))

    async def round(self) -> PlanOutcome | None:
        """One look for a pod blocked by fragmentation; carries out at most one plan."""
        waiting = self._feed.waiting_for(self._feed.scheduler_name)
        if not waiting or not await self._any_fragmented(waiting):
            return None
        listed = await self._actions.list_pods()
        running = {pod_key(p): p for p in listed}
        # The listing took a while: the waiting pods are read afresh.
        waiting = self._feed.waiting_for(self._feed.scheduler_name)
        now = self._wall_clock()
        ranked = sorted(waiting, key=lambda p: -preemption.priority_of(p))[:_LOOKS]
        # What survived since the last round out of the collector's full passes, which
        # would otherwise run in the middle of the planner's steps (``heap``).
        heap.refreeze()
        steps = defrag.plan_steps(self._state, ranked, running, now, self._plan_options, limit=1)
        report = await self._in_slices(steps)
        for key, why in report.unplanned.items():
            log.info("defrag_no_plan", pod=key, reason=why)
        if not report.plans:
            return None
        # Other work ran while the plan was made: it is checked again on the books as
        # they are now, and from here to the hold nothing awaits.
        made = report.plans[0]
        now = self._wall_clock()
        pod = self._feed.pending_pod(made.pod)
        plan = None
        if pod is not None:
            plan = defrag.recheck(self._state, made, pod, running, now, self._plan_options)
        if pod is None or plan is None:
            log.info("defrag_plan_outdated", pod=made.pod, node=made.node)
            return None
        held = self._books.hold(pod, plan.node, plan.moved, now)
        if held is None:
            # The plan's hold replayed a moment ago: an engine bug, not a reason to evict
            # anyone.
            log.error("defrag_hold_refused", pod=plan.pod, node=plan.node)
            return None
        self._feed.held_for(plan.pod)
        by_key = running
        carrying = _Carrying(plan, pod, {m.pod: by_key[m.pod] for m in plan.moves})
        return await self.carry_out(carrying)

    async def _in_slices(self, steps: Generator[None, None, defrag.Report]) -> defrag.Report:
        """Run the planner to its report, letting the loop run every ``_SLICE_S``."""
        began = self._clock()
        try:
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    report: defrag.Report = done.value
                    return report
                if self._clock() - began >= _SLICE_S:
                    await asyncio.sleep(0)
                    began = self._clock()
        finally:
            steps.close()  # cancelled meanwhile: the planner's what-if is closed too

    async def _any_fragmented(self, waiting: Sequence[Pod]) -> bool:
        """Whether one of the most important waiting pods is blocked by fragmentation
        (a look costs a walk over the nodes: at most ``_LOOKS`` pods per round, and the
        loop runs other work between two looks every ``_SLICE_S``)."""
        ranked = sorted(waiting, key=lambda p: -preemption.priority_of(p))
        began = self._clock()
        for pod in ranked[:_LOOKS]:
            if self._clock() - began >= _SLICE_S:
                await asyncio.sleep(0)
                began = self._clock()
            now = self._wall_clock()
            key = pod_key(pod)
            if self._feed.pending_pod(key) is None:
                continue  # bound or deleted while the loop ran other work
            if self._books.entry(key) is not None or self._books.is_nominated(key):
                continue
            job = self._books.job(pod)
            if job is None or self._books.fits_somewhere(job, now):
                continue
            if defrag.fragmentation(self._books, job, now) is not None:
                return True
        return False

    async def carry_out(self, carrying: _Carrying) -> PlanOutcome:
        plan = carrying.plan
        self._metrics.plan_started()
        log.info(
            "defrag_plan",
            pod=plan.pod,
            node=plan.node,
            moves=[(m.pod, m.to_node) for m in plan.moves],
            memory_mib=plan.memory_mib,
        )
        try:
            await self._actions.nominate(carrying.pod, plan.node)
            await self._actions.event(carrying.pod, DEFRAGMENTING, plan_message(plan))
            for move in plan.moves:
                if self._bound(plan.pod):
                    break  # it fits already (room came free on its own): nothing more to move
                await self._move(carrying, move)
                carrying.done += 1
            await self._until_bound(plan)
        except _Stop as stop:
            await self._stop(carrying, stop)
            return PlanOutcome.STOPPED
        except asyncio.CancelledError:
            self._books.release(plan.pod, plan.moved)
            raise
        except Exception as exc:
            await self._stop(carrying, _Stop(DefragFailure.API_ERROR, f"API error: {exc}"))
            return PlanOutcome.STOPPED
        self._books.release(plan.pod, plan.moved)
        self._metrics.plan_succeeded()
        log.info("defrag_done", pod=plan.pod, node=plan.node, moved=carrying.done)
        message = f"Room made on node {plan.node} by moving {carrying.done} of {plan.evictions}"
        await self._quietly(carrying.pod, DONE, message, warning=False)
        return PlanOutcome.DONE

    async def _move(self, carrying: _Carrying, move: defrag.Move) -> None:
        plan = carrying.plan
        moving = carrying.movers[move.pod]
        namespace = move.pod.partition("/")[0]
        owner_uid = _controller_uid(moving)
        # The controller's pods now: its replacement is the one that is not among them.
        before = {
            _uid(p)
            for p in await self._actions.list_pods(namespace)
            if owner_uid is not None and _controller_uid(p) == owner_uid
        }
        self._check_hold(plan)
        outcome = await self._actions.evict(move.pod, move.uid)
        if outcome is EvictOutcome.REFUSED:
            self._metrics.moved(DefragMove.REFUSED)
            raise _Stop(
                DefragFailure.REFUSED,
                f"the eviction of {move.pod} was refused (a PodDisruptionBudget allows no "
                "disruption now)",
            )
        if outcome is EvictOutcome.GONE:
            self._metrics.moved(DefragMove.GONE)
            raise _Stop(DefragFailure.GONE, f"{move.pod} was gone before its eviction")
        self._metrics.moved(DefragMove.EVICTED)
        log.info("defrag_moved", pod=move.pod, by=plan.pod, to=move.to_node)
        await self._quietly(moving, MOVE, move_message(plan, move), warning=False)
        await self._until_replaced(plan, move, moving, owner_uid, before)

    async def _until_replaced(
        self,
        plan: defrag.Plan,
        move: defrag.Move,
        moving: Pod,
        owner_uid: str | None,
        before: set[str],
    ) -> None:
        """Wait for the evicted pod to be gone and its replacement bound where planned."""
        namespace = move.pod.partition("/")[0]
        deadline = self._clock() + self._settings.step_timeout_s
        while True:
            self._check_hold(plan)
            gone = self._books.entry(move.pod) is None
            if owner_uid is None:
                if gone:
                    return  # a bare pod: nothing recreates it
            else:
                for pod in await self._actions.list_pods(namespace):
                    if _controller_uid(pod) != owner_uid or _uid(pod) in before:
                        continue
                    node = (pod.get("spec") or {}).get("nodeName")
                    if node and node != move.to_node:
                        raise _Stop(
                            DefragFailure.MISPLACED,
                            f"the replacement of {move.pod} ({pod_key(pod)}) was bound to "
                            f"node {node}, not {move.to_node} as planned",
                        )
                    if node and gone:
                        return
            if self._clock() >= deadline:
                raise _Stop(
                    DefragFailure.TIMEOUT,
                    f"{move.pod} was not gone and replaced within "
                    f"{self._settings.step_timeout_s:.0f} s",
                )
            await self._sleep(self._settings.poll_s)

    async def _until_bound(self, plan: defrag.Plan) -> None:
        deadline = self._clock() + self._settings.step_timeout_s
        while not self._bound(plan.pod):
            self._check_hold(plan)
            if self._clock() >= deadline:
                raise _Stop(
                    DefragFailure.TIMEOUT,
                    f"{plan.pod} was not bound within {self._settings.step_timeout_s:.0f} s "
                    "of the last move",
                )
            await self._sleep(self._settings.poll_s)

    def _bound(self, key: PodKey) -> bool:
        entry = self._books.entry(key)
        return entry is not None and not entry.reserved and self._feed.pending_pod(key) is None

    def _check_hold(self, plan: defrag.Plan) -> None:
        """The hold must stand until the pod binds (which ends it), in the books of the
        replica that decides."""
        if not self._decides():
            raise _Stop(DefragFailure.HOLD_LOST, "this replica no longer decides")
        if self._bound(plan.pod) or self._books.is_nominated(plan.pod):
            return
        if self._feed.pending_pod(plan.pod) is None and self._books.entry(plan.pod) is None:
            raise _Stop(DefragFailure.HOLD_LOST, f"{plan.pod} is gone")
        if self._books.entry(plan.pod) is not None:
            return  # decided: its Binding is being written
        raise _Stop(
            DefragFailure.HOLD_LOST,
            f"the shares held for {plan.pod} on node {plan.node} were released (the hold "
            "timed out)",
        )

    async def _stop(self, carrying: _Carrying, stop: _Stop) -> None:
        plan = carrying.plan
        self._books.release(plan.pod, plan.moved)
        self._metrics.failed(stop.failure)
        self._metrics.plan_stopped()
        log.warning(
            "defrag_stopped",
            pod=plan.pod,
            node=plan.node,
            moved=carrying.done,
            reason=stop.failure.value,
            message=stop.message,
        )
        try:
            await self._actions.nominate(carrying.pod, None)
        except Exception as exc:
            log.warning("defrag_nomination_not_cleared", pod=plan.pod, error=str(exc))
        message = (
            f"Stopped after {carrying.done} of {plan.evictions} moves: {stop.message}; the "
            f"shares held on node {plan.node} are released"
        )
        await self._quietly(carrying.pod, STOPPED, message, warning=True)

    async def _quietly(self, pod: Pod, reason: str, message: str, *, warning: bool) -> None:
        """An Event that may fail without changing the plan (it is logged anyway)."""
        try:
            await self._actions.event(pod, reason, message, warning)
        except Exception as exc:
            log.warning("event_write_failed", pod=pod_key(pod), reason=reason, error=str(exc))
