"""The scheduling worker: one task that takes due pods from the queue and decides.

Decisions are made one at a time on the event loop (the engine is synchronous and
reserves what it picks), so no two decisions can see the same free capacity. Each
placement is then written as one Binding by a background task, with a bounded number in
flight: decision (reserved) -> Binding -> ``confirm``; on failure ``rollback`` and retry
with backoff; on 409 the pod is re-read. A pod that does not fit goes to the
unschedulable queue with its hint (the verdict its diagnosis was read from) and is
reported (``PodScheduled=False`` plus an Event) in the background, but only when the
message differs from the last one reported for it: a pod retried with the same verdict
costs no API write.

A pod that fits nowhere but may preempt (the engine named victims) is not bound: in the
background its ``nominatedNodeName`` is set and its victims are evicted (with Events on
both sides), while the engine holds the freed shares for it; it is parked and binds on
a later attempt, once the victims are gone. The engine does not preempt where a
PodDisruptionBudget would be violated (the decision says why, and the pod is told with a
Warning Event and its condition). If the Eviction API still refuses a victim (a budget
changed meanwhile), the preemption stops there and is given up: the hold is released,
``nominatedNodeName`` cleared, the pod told, and decided again after its backoff.

The worker decides only while the ``Gate`` is open (this replica is the active one), and
after every opening it first waits for a full resync, so that every pod bound by anyone
before is in the books before its first decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Protocol

import structlog

from vgpu_operator.control import (
    claim_binding,
    evictions,
    feed,
    gang_runtime,
    pod_facts,
    queue,
    reporting,
)
from vgpu_operator.control.binding_writes import GATE_REPORT_AFTER_S, Binder, BindingWrites
from vgpu_operator.control.evictions import Preemptor
from vgpu_operator.control.leadership import AlwaysOpen, Gate
from vgpu_operator.metrics import OperatorMetrics, OtherReason, Result
from vgpu_operator.scheduling import status
from vgpu_operator.scheduling.books.allocation_gate import GateHolder
from vgpu_operator.scheduling.cycle import cluster
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.wire import Pod, meta_of

log = structlog.get_logger("vgpu_operator.worker")


class EngineDecisions(Protocol):
    """The part of ``scheduling.cycle.cluster.ClusterState`` the worker calls."""

    def schedule(self, pod: Pod, now: float) -> cluster.Decision: ...
    def confirm(self, key: PodKey, now: float | None = None) -> None: ...
    def rollback(self, key: PodKey) -> None: ...
    def cancel_preemption(self, key: PodKey) -> None: ...
    def bind_gate_open(self, node_name: str, key: PodKey, now: float) -> bool: ...
    def bind_gate_enabled(self) -> bool: ...
    def gate_holder(self, node_name: str, now: float) -> GateHolder | None: ...
    def nomination_wait(self, key: PodKey) -> cluster.NominationWait | None: ...
    def take_expired_nominations(self, now: float) -> list[cluster.NominationWait]: ...


class SelectorsOffLoop(Protocol):
    """``cel_offload.OffLoopSelectors``: what a decision lacked of CEL verdicts."""

    def decided(self, key: PodKey) -> None: ...


class Reporter(Protocol):
    """Tells the pod's owner what happened (conditions, Events)."""

    async def unschedulable(self, pod: Pod, diagnosis: status.Diagnosis) -> None: ...
    async def rejected(self, pod: Pod, message: str) -> None: ...
    async def failed(self, pod: Pod, message: str) -> None: ...
    async def scheduled(self, pod: Pod, node: str) -> None: ...
    async def adjusted(self, pod: Pod, message: str) -> None: ...
    async def gated(self, pod: Pod, message: str) -> None: ...
    async def preemption_blocked(self, pod: Pod, message: str) -> None: ...
    async def waiting_for_victims(self, pod: Pod, message: str) -> None: ...
    async def nomination_timed_out(self, pod: Pod, message: str) -> None: ...
    async def waits(self, pod: Pod, diagnosis: status.Diagnosis, note: str) -> None: ...


class Autoscaling(Protocol):
    """The autoscaler's side (``autoscaler.Autoscaler``): what a waiting pod waits for,
    and a nudge when a pod is found waiting."""

    def note(self, key: PodKey) -> str | None: ...
    def poke(self) -> None: ...


#: Writes a PodGroup's condition (``kube.pod_groups``), given ``namespace/name``.
GroupConditionWriter = Callable[[str, Mapping[str, object]], Awaitable[None]]


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


#: How long the worker decides back to back before the loop serves anything else. One
#: decision per turn of the loop left the Bindings in flight refilled one per turn while
#: answers, watch events and Events also wanted turns: in a 1,000-pod backlog they fell
#: from 64 to a handful again and again (the API server then waits for us). A few
#: milliseconds of decisions at once keep them near the bound.
DECIDING_SLICE_S = 0.005


def _hint_of(decision: cluster.Decision) -> Hashable | None:
    """What an unschedulable pod waits for (``queue``): its verdict, which the engine
    weighs against each event; only its own edit for a request that cannot be read; any
    event where the engine kept no verdict (the reference path)."""
    if decision.waits_for_claims:
        return None  # the claim's arrival wakes it (``claims_feed``)
    if decision.diagnosis is not None and decision.diagnosis.error is not None:
        return queue.OWN_CHANGE_ONLY
    return decision.verdict


class SchedulingWorker:
    """See the module docstring. ``resync`` lists the cluster and feeds the engine."""

    def __init__(
        self,
        engine: EngineDecisions,
        state_feed: feed.StateFeed,
        pods_queue: queue.SchedulingQueue,
        binder: Binder,
        reporter: Reporter,
        metrics: OperatorMetrics,
        *,
        resync: Callable[[], Awaitable[None]],
        gate: Gate | None = None,
        preemptor: Preemptor | None = None,
        max_binds_in_flight: int = 32,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        gate_report_after_s: float = GATE_REPORT_AFTER_S,
        claims: claim_binding.ClaimBinding | None = None,
        selectors: SelectorsOffLoop | None = None,
        gangs: gang_runtime.GangRuntime | None = None,
        write_group_condition: GroupConditionWriter | None = None,
        autoscaling: Autoscaling | None = None,
    ) -> None:
        self._engine = engine
        #: What pods wait for beyond the books (None: no autoscaling).
        self._autoscaling = autoscaling
        #: Pods in a PodGroup are decided with their group (None: no gang support wired).
        self._gangs = gangs
        self._write_group_condition = write_group_condition
        self._feed = state_feed
        self._queue = pods_queue
        self._reporter = reporter
        self._metrics = metrics
        self._resync = resync
        self._gate = gate or AlwaysOpen()
        self._preemptor = preemptor
        self._clock = clock
        self._wall_clock = wall_clock
        #: Where CEL verdicts a decision lacked are computed (None: all on the loop).
        self._selectors = selectors
        self._wakeup = asyncio.Event()
        self._synced_opening = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._reports: dict[PodKey, asyncio.Task[None]] = {}
        #: Per waiting pod, the message last reported (its condition and Event), with the
        #: pod's uid: a new pod under an old name has been told nothing yet.
        self._reported: dict[PodKey, tuple[str, str]] = {}
        self._binds = BindingWrites(
            engine,
            state_feed,
            pods_queue,
            binder,
            reporter,
            metrics,
            report=self._report,
            report_running=self._reports.get,
            max_in_flight=max_binds_in_flight,
            clock=clock,
            wall_clock=wall_clock,
            gate_report_after_s=gate_report_after_s,
            claims=claims,
        )
        self.synced = asyncio.Event()

    def poke(self) -> None:
        """Something may have become due (the queue's notify hook)."""
        self._wakeup.set()

    @property
    def binds_in_flight(self) -> int:
        return self._binds.in_flight

    def busy(self) -> bool:
        """Whether a Binding is being written or a pod is ready to decide (writes that
        may wait, ``deferred.DeferredWrites``, wait for this to be False)."""
        return self._binds.in_flight > 0 or self._queue.has_ready()

    # --- the loop -----------------------------------------------------------------------
    async def run(self) -> None:
        """Decide forever (until cancelled)."""
        slice_started = time.perf_counter()
        try:
            while True:
                await self._ensure_active_and_synced()
                # Hold a bind slot before deciding: the Binding task takes it over (and
                # a free slot is taken without yielding to the loop).
                await self._binds.slots.acquire()
                handed_over = False
                try:
                    key = self._queue.pop()
                    if key is None:
                        await self._sleep_until_due()
                        slice_started = time.perf_counter()
                        continue
                    handed_over = self._decide(key, slot_held=True)
                finally:
                    if not handed_over:
                        self._binds.slots.release()
                if time.perf_counter() - slice_started >= DECIDING_SLICE_S:
                    # Let watch events, Binding answers and webhooks in between.
                    await asyncio.sleep(0)
                    slice_started = time.perf_counter()
        finally:
            await self.drain(cancel=True)

    async def _ensure_active_and_synced(self) -> None:
        if self._gate.is_open() and self._synced_opening:
            return
        if not self._gate.is_open():
            self.synced.clear()
            log.info("scheduling_paused")
        opening = await self._gate.wait_open()
        if opening != self._synced_opening:
            await self._resync()
            self._synced_opening = opening
            self.synced.set()
            log.info("scheduling_active", pending=len(self._queue))

    async def _sleep_until_due(self) -> None:
        self._wakeup.clear()
        if self._queue.has_ready():
            return
        due = self._queue.next_due_at()
        timeout = None if due is None else max(0.0, due - self._clock())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)

    async def drain(self, *, cancel: bool = False) -> None:
        """Wait for (or cancel) the Binding and report tasks still running."""
        tasks = list(self._tasks)
        if cancel:
            for task in tasks:
                task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- one decision ---------------------------------------------------------------------
    def decide(self, key: PodKey) -> None:
        """Decide for one popped pod (synchronous: nothing else runs meanwhile)."""
        self._decide(key, slot_held=False)

    def _decide(self, key: PodKey, *, slot_held: bool) -> bool:
        """Returns True when a Binding task was started (and took over a held slot)."""
        pod = self._feed.pending_pod(key)
        if pod is None:
            self._queue.remove(key)
            self._reported.pop(key, None)
            return False
        group = None if self._gangs is None else self._gangs.group_of(pod)
        if group is not None:
            return self._decide_group(key, pod, group, slot_held=slot_held)
        started = time.perf_counter()
        try:
            decision = self._engine.schedule(pod, now=self._wall_clock())
        except Exception as exc:  # an engine bug or malformed input must not stop the loop
            log.exception("scheduling_failed", pod=key)
            self._metrics.attempt(Result.ERROR)
            self._queue.park(key, reasons=(OtherReason.SCHEDULING_ERROR.value,))
            message = f"scheduling failed: {exc}"
            self._report_once(key, pod, message, self._reporter.failed(pod, message))
            return False
        finally:
            # The decision may have let go of room (a hold expired, moved): wake who it helps.
            self._feed.settle_releases()
            if self._selectors is not None:
                self._selectors.decided(key)  # verdicts it lacked: computed off the loop
            self.check_nominations()  # holds the decision found timed out
        took_s = time.perf_counter() - started
        self._metrics.decided(took_s)
        if decision.victims and (pod.get("spec") or {}).get("resourceClaims"):
            self._metrics.dra_preemption_decided(took_s)
        if decision.scheduled and decision.node:
            self._reported.pop(key, None)
            self._feed.binding_started(key, str(meta_of(pod).get("uid") or ""))
            self._spawn(
                f"bind {key}", self._binds.bind(key, pod, decision.node, decision, slot_held)
            )
            return True
        if decision.nominated_node is not None:
            return self._await_victims(key, pod, decision, decision.nominated_node)
        if decision.rejected is not None:
            self._metrics.attempt(Result.REJECTED)
            namespace = str(meta_of(pod).get("namespace") or "default")
            backoff_s = self._queue.park(
                key,
                hint=queue.Refused(namespace),
                reasons=(OtherReason.ADMISSION_REJECTED.value,),
            )
            log.info("pod_rejected", pod=key, reason=decision.rejected, retry_after_s=backoff_s)
            self._report_once(
                key, pod, decision.rejected, self._reporter.rejected(pod, decision.rejected)
            )
            return False
        self._metrics.attempt(Result.UNSCHEDULABLE)
        diagnosis = decision.diagnosis or status.Diagnosis({}, 0)
        message = diagnosis.message()
        if decision.preemption_blocked is not None:
            message = f"{message} {decision.preemption_blocked}"
        backoff_s = self._queue.park(
            key, hint=_hint_of(decision), reasons=reporting.condition_reasons(diagnosis)
        )
        note = self._note(key) if decision.preemption_blocked is None else None
        told = message if note is None else f"{message} {note}"
        if self._reported.get(key) == (pod_facts.uid_of(pod), told):
            log.debug("pod_unschedulable", pod=key, message=told, retry_after_s=backoff_s)
            return False
        log.info(
            "pod_unschedulable",
            pod=key,
            message=told,
            devices=diagnosis.device_counts(),
            retry_after_s=backoff_s,
            preemption_blocked=decision.preemption_blocked,
        )
        if decision.preemption_blocked is not None:
            self._report_once(key, pod, message, self._reporter.preemption_blocked(pod, message))
            return False
        self._report_waiting(key, pod, diagnosis, message)
        return False

    def _note(self, key: PodKey) -> str | None:
        """What the pod waits for beyond the books (the autoscaler's note), and a nudge to
        the autoscaler: a pod was found waiting."""
        if self._autoscaling is None:
            return None
        self._autoscaling.poke()
        return self._autoscaling.note(key)

    def _report_waiting(
        self, key: PodKey, pod: Pod, diagnosis: status.Diagnosis, message: str
    ) -> None:
        """Tell a pod that fits nowhere why (``message``), and what it waits for."""
        note = self._note(key)
        if note is None:
            self._report_once(key, pod, message, self._reporter.unschedulable(pod, diagnosis))
            return
        told = f"{message} {note}"
        self._report_once(key, pod, told, self._reporter.waits(pod, diagnosis, note))

    def _decide_group(self, key: PodKey, pod: Pod, group: str, *, slot_held: bool) -> bool:
        """A PodGroup's members decided together (``gang_runtime``): those placed are bound
        (the popped one on its held slot), the others parked under one hint, each told the
        group's reason, and the PodGroup's condition written. True when the popped pod's
        Binding took over the slot."""
        assert self._gangs is not None
        started = time.perf_counter()
        try:
            out = self._gangs.decide(group, self._wall_clock())
        except Exception as exc:  # an engine bug or malformed input must not stop the loop
            log.exception("scheduling_failed", pod=key, group=group)
            self._metrics.attempt(Result.ERROR)
            self._queue.park(key, reasons=(OtherReason.SCHEDULING_ERROR.value,))
            message = f"scheduling failed: {exc}"
            self._report_once(key, pod, message, self._reporter.failed(pod, message))
            failed = gang_runtime.error_condition(message, _utc_now())
            if self._write_group_condition is not None:
                self._spawn(f"podgroup {group}", self._write_group_condition(group, failed))
            return False
        finally:
            self._feed.settle_releases()
        self._metrics.decided(time.perf_counter() - started)
        handed_over = False
        for decision in out.placed:
            member = self._feed.pending_pod(decision.pod)
            if member is None or decision.node is None:
                self._engine.rollback(decision.pod)
                continue
            self._queue.take(decision.pod)
            held = slot_held and decision.pod == key
            handed_over = handed_over or held
            self._reported.pop(decision.pod, None)
            self._feed.binding_started(decision.pod, pod_facts.uid_of(member))
            bind = self._binds.bind(decision.pod, member, decision.node, decision, held)
            self._spawn(f"bind {decision.pod}", bind)
        for decision in out.preempting:  # the group fits whole once their victims leave
            member = self._feed.pending_pod(decision.pod)
            if member is None or decision.nominated_node is None:
                continue
            self._queue.take(decision.pod)
            self._await_victims(decision.pod, member, decision, decision.nominated_node)
        hint = _hint_of(out.hint) if out.hint is not None else queue.OWN_CHANGE_ONLY
        for decision in out.waiting:
            member = self._feed.pending_pod(decision.pod)
            if member is None:
                continue
            self._queue.take(decision.pod)
            diagnosis = decision.diagnosis or status.Diagnosis({}, 0)
            message = out.reason or diagnosis.message()
            waits_for = hint if out.reason is not None else _hint_of(decision)
            self._metrics.attempt(Result.UNSCHEDULABLE)
            self._queue.park(decision.pod, hint=waits_for, reasons=(gang_runtime.WAIT_REASON,))
            self._report_waiting(decision.pod, member, diagnosis, message)
        decided = {d.pod for d in (*out.placed, *out.preempting, *out.waiting)}
        if key not in decided:
            self._queue.retry_later(key)  # not among the group's pending members now
        condition = self._gangs.condition_to_write(out, _utc_now())
        if condition is not None and self._write_group_condition is not None:
            self._spawn(f"podgroup {group}", self._write_group_condition(group, condition))
        log.info(
            "group_decided",
            group=group,
            placed=len(out.placed),
            waiting=len(out.waiting),
            reason=out.reason,
        )
        return handed_over

    def _await_victims(self, key: PodKey, pod: Pod, decision: cluster.Decision, node: str) -> bool:
        """A preempting decision (evict its victims now) or a pod still waiting for the
        victims of an earlier one: parked either way, woken when a victim is gone, and
        told what it waits for (once per news). A nomination with nothing to wait for
        (no victim, none left) is given up and the pod told why (``_nothing_to_evict``)."""
        diagnosis = decision.diagnosis or status.Diagnosis({}, 0)
        wait = None if decision.victims else self._engine.nomination_wait(key)
        if not decision.victims and (wait is None or not wait.waits):
            return self._nothing_to_evict(key, pod, decision, node)
        self._metrics.attempt(Result.PREEMPTING)
        backoff_s = self._queue.park(
            key,
            hint=queue.WaitsForVictims(node),
            reasons=reporting.condition_reasons(diagnosis),
        )
        if wait is not None:
            log.info("pod_waiting_for_victims", pod=key, node=node, retry_after_s=backoff_s)
            message = reporting.waiting_for_victims_message(wait)
            self._report_once(key, pod, message, self._reporter.waiting_for_victims(pod, message))
            return False
        log.info("pod_preempting", pod=key, node=node, victims=list(decision.victims))
        if self._preemptor is None:
            log.error("preemption_without_preemptor", pod=key)
            self._engine.cancel_preemption(key)
            self._feed.settle_releases()
            message = f"scheduling failed: preemption on node {node} has no preemptor"
            self._report_once(key, pod, message, self._reporter.failed(pod, message))
            return False
        self._spawn(f"preempt {key}", self._preempt(key, pod, node, decision))
        return False

    def _nothing_to_evict(
        self, key: PodKey, pod: Pod, decision: cluster.Decision, node: str
    ) -> bool:
        """A nomination that names no victim and waits for none: nothing would ever wake
        the pod. The hold is given up; the pod waits for a change that may let it fit,
        and is told so."""
        self._engine.cancel_preemption(key)
        self._feed.settle_releases()
        self._metrics.attempt(Result.UNSCHEDULABLE)
        diagnosis = decision.diagnosis or status.Diagnosis({}, 0)
        message = reporting.nothing_to_evict_message(diagnosis, node)
        backoff_s = self._queue.park(
            key, hint=_hint_of(decision), reasons=reporting.condition_reasons(diagnosis)
        )
        log.warning("preemption_without_victims", pod=key, node=node, retry_after_s=backoff_s)
        self._report_once(key, pod, message, self._reporter.preemption_blocked(pod, message))
        return False

    def check_nominations(self) -> None:
        """Preemptors whose hold on their node timed out (their victims did not all leave
        in time): each is told, its ``nominatedNodeName`` cleared, and decided again.
        Called after each decision and by the operator's housekeeping."""
        for expired in self._engine.take_expired_nominations(self._wall_clock()):
            pod = self._feed.pending_pod(expired.pod)
            if pod is None:
                continue
            victims = list(expired.victims)
            log.warning("nomination_timed_out", pod=expired.pod, node=expired.node, victims=victims)
            message = reporting.nomination_expired_message(expired)
            self._report_once(
                expired.pod, pod, message, self._reporter.nomination_timed_out(pod, message)
            )
            if self._preemptor is not None:
                self._spawn(f"unnominate {expired.pod}", self._unnominate(pod))
            self._queue.wake_one(expired.pod)

    async def _unnominate(self, pod: Pod) -> None:
        assert self._preemptor is not None
        try:
            await self._preemptor.nominate(pod, None)
        except Exception as exc:  # the next decision nominates afresh if it preempts
            log.warning("nomination_clear_failed", pod=cluster.pod_key(pod), error=str(exc))

    async def _preempt(self, key: PodKey, pod: Pod, node: str, decision: cluster.Decision) -> None:
        """Evict the decision's victims (``evictions``); where one is refused or the API
        fails, give the hold back: the next attempt sees the budgets and victims as they
        are, and the pod is told why."""
        preemptor = self._preemptor
        assert preemptor is not None
        message = await evictions.evict_victims(preemptor, self._metrics, key, pod, node, decision)
        if message is None:
            return
        self._engine.cancel_preemption(key)
        self._feed.settle_releases()
        with contextlib.suppress(Exception):
            await preemptor.nominate(pod, None)
        self._queue.retry_later(key)
        self._report(key, self._reporter.preemption_blocked(pod, message))

    def node_settled(self, node: str) -> None:
        """The node's previous GPU pod has its devices (or gave up, or timed out): the
        Bindings waiting for it check again, the earliest first."""
        self._binds.node_settled(node)

    # --- background work ----------------------------------------------------------------
    def _spawn(self, name: str, coro: Awaitable[None]) -> asyncio.Task[None]:
        async def guarded() -> None:
            await coro

        task = asyncio.create_task(guarded(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _report_once(self, key: PodKey, pod: Pod, message: str, coro: Awaitable[None]) -> None:
        """Report why the pod waits unless that message is what it was last told: the
        condition and Event are written when the message changes, not per attempt."""
        told = (pod_facts.uid_of(pod), message)
        if self._reported.get(key) == told:
            if asyncio.iscoroutine(coro):
                coro.close()
            return
        if len(self._reported) > 2 * len(self._queue) + 1024:
            # Pods that left without passing here (deleted while waiting).
            self._reported = {k: m for k, m in self._reported.items() if k in self._queue}
        self._reported[key] = told

        def forget() -> None:
            if self._reported.get(key) == told:
                del self._reported[key]  # not written: the next attempt tries again

        self._report(key, coro, on_failure=forget)

    def _report(
        self, key: PodKey, coro: Awaitable[None], on_failure: Callable[[], None] | None = None
    ) -> None:
        running = self._reports.get(key)
        if running is not None and not running.done():
            # One report per pod at a time; the next attempt reports the newer news.
            if asyncio.iscoroutine(coro):
                coro.close()
            if on_failure is not None:
                on_failure()
            return

        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("report_failed", pod=key, error=str(exc))
                self._metrics.api_error("report")
                if on_failure is not None:
                    on_failure()
            finally:
                if self._reports.get(key) is task:
                    del self._reports[key]

        task = self._spawn(f"report {key}", guarded())
        self._reports[key] = task
