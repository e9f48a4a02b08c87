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

from vgpu_operator.control import claim_binding, feed, gang_runtime, pod_facts, queue, reporting
from vgpu_operator.kube.binding import BindOutcome
from vgpu_operator.kube.eviction import EvictOutcome
from vgpu_operator.metrics import OperatorMetrics, OtherReason, PreemptionResult, Result
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


class Binder(Protocol):
    async def bind(self, pod: Pod, node: str, annotations: Mapping[str, str]) -> BindOutcome: ...

    async def read_pod(self, namespace: str, name: str) -> Pod | None: ...


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


class Preemptor(Protocol):
    """Preemption's writes: evictions and the preemptor's ``nominatedNodeName``."""

    async def evict(self, victim: PodKey, uid: str) -> EvictOutcome: ...
    async def nominate(self, pod: Pod, node: str | None) -> None: ...
    async def preempted(self, victim: PodKey, preemptor: Pod, node: str) -> None: ...
    async def preempting(self, pod: Pod, node: str, victims: int) -> None: ...


class Gate(Protocol):
    """Whether this replica may decide (peering), with a count of openings."""

    def is_open(self) -> bool: ...
    async def wait_open(self) -> int: ...


#: Writes a PodGroup's condition (``kube.pod_groups``), given ``namespace/name``.
GroupConditionWriter = Callable[[str, Mapping[str, object]], Awaitable[None]]


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class AlwaysOpen:
    """The gate of a standalone operator."""

    def is_open(self) -> bool:
        return True

    async def wait_open(self) -> int:
        return 1


#: How long the worker decides back to back before the loop serves anything else. One
#: decision per turn of the loop left the Bindings in flight refilled one per turn while
#: answers, watch events and Events also wanted turns: in a 1,000-pod backlog they fell
#: from 64 to a handful again and again (the API server then waits for us). A few
#: milliseconds of decisions at once keep them near the bound.
DECIDING_SLICE_S = 0.005

#: Reading back a pod whose Binding's answer was lost: first retry, and the longest wait.
_REREAD_INITIAL_S = 0.5
_REREAD_MAX_S = 5.0

#: A Binding that has waited this long for its node's allocation gate, held this long by
#: one pod, is shown on its pod (condition and Event): plugins that answer in a second or
#: two keep a burst quiet, one that does not answer is seen.
GATE_REPORT_AFTER_S = 5.0


def _holds_devices(decision: cluster.Decision) -> bool:
    return any(any(single) for single in decision.devices.values())


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
        self._binder = binder
        self._reporter = reporter
        self._metrics = metrics
        self._resync = resync
        self._gate = gate or AlwaysOpen()
        self._preemptor = preemptor
        self._clock = clock
        self._wall_clock = wall_clock
        self._gate_report_after_s = gate_report_after_s
        #: The DRA path's writes before a Binding (None: no pod here uses claims).
        self._claims = claims
        #: Where CEL verdicts a decision lacked are computed (None: all on the loop).
        self._selectors = selectors
        self._bind_slots = asyncio.Semaphore(max_binds_in_flight)
        self._binds_in_flight = 0
        self._wakeup = asyncio.Event()
        self._synced_opening = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._reports: dict[PodKey, asyncio.Task[None]] = {}
        #: Per waiting pod, the message last reported (its condition and Event), with the
        #: pod's uid: a new pod under an old name has been told nothing yet.
        self._reported: dict[PodKey, tuple[str, str]] = {}
        #: Bindings waiting for their node's allocation gate, and the one being written.
        self._gate_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._binding_on: dict[str, PodKey] = {}
        self.synced = asyncio.Event()

    def poke(self) -> None:
        """Something may have become due (the queue's notify hook)."""
        self._wakeup.set()

    @property
    def binds_in_flight(self) -> int:
        return self._binds_in_flight

    def busy(self) -> bool:
        """Whether a Binding is being written or a pod is ready to decide (writes that
        may wait, ``deferred.DeferredWrites``, wait for this to be False)."""
        return self._binds_in_flight > 0 or self._queue.has_ready()

    # --- the loop -----------------------------------------------------------------------
    async def run(self) -> None:
        """Decide forever (until cancelled)."""
        slice_started = time.perf_counter()
        try:
            while True:
                await self._ensure_active_and_synced()
                # Hold a bind slot before deciding: the Binding task takes it over (and
                # a free slot is taken without yielding to the loop).
                await self._bind_slots.acquire()
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
                        self._bind_slots.release()
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
            self._spawn(f"bind {key}", self._bind(key, pod, decision.node, decision, slot_held))
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
            bind = self._bind(decision.pod, member, decision.node, decision, held)
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
        victims = decision.victims
        preemptor = self._preemptor
        assert preemptor is not None
        refused: list[PodKey] = []
        evicted = 0
        ending = PreemptionResult.EVICTED
        current: PodKey | None = None
        failure = ""
        try:
            await preemptor.nominate(pod, node)
            await preemptor.preempting(pod, node, len(victims))
            # The engine lists the victims a budget covers first: if the Eviction API
            # refuses one (its budget changed since the engine read it), no other victim
            # has been evicted for nothing.
            for victim in victims:
                current = victim
                outcome = await preemptor.evict(victim, decision.victim_uids.get(victim, ""))
                if outcome is EvictOutcome.REFUSED:
                    refused.append(victim)
                    break
                log.info("pod_preempted", pod=victim, by=key, node=node, outcome=outcome.value)
                if outcome is EvictOutcome.EVICTED:
                    evicted += 1
                    await preemptor.preempted(victim, pod, node)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("preemption_failed", pod=key, node=node, error=str(exc))
            self._metrics.api_error("evict")
            refused.append(PodKey(""))
            ending = PreemptionResult.ERROR
            failure = str(exc) or type(exc).__name__
        if refused and ending is PreemptionResult.EVICTED:
            ending = PreemptionResult.REFUSED
        self._metrics.preemption(ending, len(victims))
        if not refused:
            return
        # Give the hold back; the next attempt sees the budgets and victims as they are.
        log.warning(
            "preemption_refused",
            pod=key,
            node=node,
            refused=[v for v in refused if v],
            evicted=evicted,
        )
        self._engine.cancel_preemption(key)
        self._feed.settle_releases()
        with contextlib.suppress(Exception):
            await preemptor.nominate(pod, None)
        self._queue.retry_later(key)
        named = [v for v in refused if v]
        if named:
            message = reporting.eviction_refused_message(node, named[0], evicted)
        else:
            message = reporting.preemption_failed_message(node, current, evicted, failure)
        self._report(key, self._reporter.preemption_blocked(pod, message))

    async def _bind(
        self,
        key: PodKey,
        pod: Pod,
        node: str,
        decision: cluster.Decision,
        slot_held: bool,
    ) -> None:
        # Without the allocation gate nothing asks a node's Bindings to go one at a time:
        # the books already keep decisions apart, so they are all written at once.
        gated = self._engine.bind_gate_enabled() and _holds_devices(decision)
        if gated and not self._gate_passable(node, key):
            # Wait for the node's previous GPU pod to get its devices without holding a
            # bind slot: other nodes' Bindings go on meanwhile.
            if slot_held:
                self._bind_slots.release()
                slot_held = False
            try:
                await self._await_gate(node, key, pod)
            except asyncio.CancelledError:
                self._engine.rollback(key)
                self._feed.binding_failed(key)
                raise
        if gated:
            self._binding_on[node] = key
        reporting_now = self._reports.get(key)
        if reporting_now is not None and not reporting_now.done():
            # The Binding sets PodScheduled True; a report still being written (the gate's
            # wait, say) lands first, or its False would stay on the bound pod.
            await asyncio.wait([reporting_now])
        if not slot_held:
            await self._bind_slots.acquire()
        self._binds_in_flight += 1
        try:
            await self._bind_once(key, pod, node, decision)
        finally:
            self._binds_in_flight -= 1
            self._bind_slots.release()
            if gated and self._binding_on.get(node) == key:
                del self._binding_on[node]
                # Bound: the gate stays shut until the plugin answers (the feed says
                # so). Not bound: the next pod decided onto the node may try now.
                self.node_settled(node)

    # --- the allocation gate ----------------------------------------------------------------
    def _gate_passable(self, node: str, key: PodKey) -> bool:
        writing = self._binding_on.get(node)
        if writing is not None and writing != key:
            return False
        return self._engine.bind_gate_open(node, key, self._wall_clock())

    async def _await_gate(self, node: str, key: PodKey, pod: Pod) -> None:
        """Wait, in decision order, until the pod may be bound on ``node``; a wait longer
        than ``gate_report_after_s`` is shown on the pod (``_report_gated``), and shown
        again when another pod comes to hold the gate meanwhile (the first holder timed
        out or answered and an earlier waiter took the gate): the condition must not go
        on naming a holder that has long let go."""
        self._metrics.attempt(Result.GATED)
        log.debug("binding_waits_for_allocation_gate", pod=key, node=node)
        loop = asyncio.get_running_loop()
        report_at: float | None = self._clock() + self._gate_report_after_s
        told: str | None = None  # the holder the pod's condition names
        while not self._gate_passable(node, key):
            turn: asyncio.Future[None] = loop.create_future()
            self._gate_waiters.setdefault(node, []).append(turn)
            try:
                timeout = None if report_at is None else max(0.0, report_at - self._clock())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(turn), timeout)
                due = report_at is not None and self._clock() >= report_at
                # Once told, every settling of the node (a holder answered or timed out)
                # is a look at who holds the gate now.
                if (due or (told is not None and turn.done())) and not self._gate_passable(
                    node, key
                ):
                    report_at, told = self._report_gated(key, node, pod, told)
            finally:
                waiters = self._gate_waiters.get(node)
                if waiters is not None and turn in waiters:
                    waiters.remove(turn)

    def _report_gated(
        self, key: PodKey, node: str, pod: Pod, told: str | None
    ) -> tuple[float | None, str | None]:
        """The pod's Binding has waited long for the node's gate. If the pod holding it has
        held it long too (its plugin is slow or silent), and the pod was not told about
        that holder already, say who, for how long, and when the gate opens at the latest
        (a condition, an Event, a log line). In a burst whose holders answer promptly
        nothing is written (the waits are the queue's). Returns when to look next (None:
        at the node's next settling) and the holder the pod has been told about."""
        after = self._gate_report_after_s
        holder = self._engine.gate_holder(node, self._wall_clock())
        if holder is None or holder.held_s < after:
            held = 0.0 if holder is None else holder.held_s
            return self._clock() + max(after - held, 0.05), told
        if holder.pod == told:
            return None, told
        message = reporting.gate_wait_message(node, holder.pod, holder.held_s, holder.opens_in_s)
        log.info(
            "binding_waits_for_allocation_gate",
            pod=key,
            node=node,
            holder=holder.pod,
            held_s=round(holder.held_s, 1),
        )
        self._report(key, self._reporter.gated(pod, message))
        return None, holder.pod

    def node_settled(self, node: str) -> None:
        """The node's previous GPU pod has its devices (or gave up, or timed out): the
        Bindings waiting for it check again, the earliest first."""
        for turn in self._gate_waiters.pop(node, []):
            if not turn.done():
                turn.set_result(None)

    async def _bind_once(
        self, key: PodKey, pod: Pod, node: str, decision: cluster.Decision
    ) -> None:
        started = self._clock()
        if decision.claim_writes and not await self._reserve_claims(key, node, decision):
            return
        try:
            outcome = await self._binder.bind(pod, node, decision.annotations)
        except asyncio.CancelledError:
            self._engine.rollback(key)
            self._feed.binding_failed(key)
            raise
        except Exception as exc:
            self._metrics.api_error("bind")
            log.warning("bind_answer_lost", pod=key, node=node, error=str(exc))
            # The Binding may have been written before the answer was lost: the books
            # keep its shares until the pod itself says (freeing them now could give
            # the card to another pod while this one lands on it).
            read_back = await self._outcome_from_the_pod(key, pod, node)
            if read_back is None:
                if decision.claim_writes and self._claims is not None:
                    await self._claims.undo(decision.claim_writes)
                self._engine.rollback(key)
                self._feed.binding_failed(key)
                self._metrics.attempt(Result.ERROR)
                backoff_s = self._queue.retry_later(key)
                log.warning("bind_failed", pod=key, node=node, retry_after_s=backoff_s)
                return
            outcome = read_back
        finally:
            self._metrics.bind_finished(self._clock() - started)
        if outcome is BindOutcome.BOUND:
            # The node's allocation gate is timed from here, on our own clock.
            self._engine.confirm(key, self._wall_clock())
            self._feed.binding_succeeded(key)
            self._metrics.attempt(Result.SCHEDULED)
            created = pod_facts.created_at(pod)
            if created is not None:
                self._metrics.bound_after(time.time() - created)
            # One line per pod at info would cost more than the decision in a burst.
            log.debug("pod_bound", pod=key, node=node)
            self._report(key, self._bound_news(pod, node, decision.warnings))
            return
        if decision.claim_writes and self._claims is not None:
            await self._claims.undo(decision.claim_writes)
        self._engine.rollback(key)
        self._feed.binding_failed(key)
        if outcome is BindOutcome.GONE:
            self._queue.remove(key)
            log.info("pod_gone_before_bind", pod=key, node=node)
            return
        self._metrics.attempt(Result.BIND_CONFLICT)
        await self._reread_after_conflict(key, pod, node)

    async def _reserve_claims(self, key: PodKey, node: str, decision: cluster.Decision) -> bool:
        """The DRA path: write the pod's claims (``claim_binding``) before its Binding.
        False: not written (a conflict, another allocator took a device, an API error);
        the decision is given up and the pod tried again after its backoff."""
        problem: str | None = "no claim writer is configured"
        if self._claims is not None:
            try:
                problem = await self._claims.reserve(key, node, decision.claim_writes)
            except asyncio.CancelledError:
                self._engine.rollback(key)
                self._feed.binding_failed(key)
                raise
            except Exception as exc:
                self._metrics.api_error("claim")
                problem = str(exc)
        if problem is None:
            return True
        self._engine.rollback(key)
        self._feed.binding_failed(key)
        self._metrics.attempt(Result.BIND_CONFLICT)
        backoff_s = self._queue.retry_later(key)
        log.info(
            "claims_not_reserved", pod=key, node=node, problem=problem, retry_after_s=backoff_s
        )
        return False

    async def _outcome_from_the_pod(self, key: PodKey, pod: Pod, node: str) -> BindOutcome | None:
        """What a Binding whose answer was lost did, read from the pod: BOUND (here, by
        it), CONFLICT (bound elsewhere, or deleting), GONE, or None (still unbound: it was
        not written). Reads until the API server answers; a drain cancels it."""
        meta = meta_of(pod)
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        uid = meta.get("uid")
        delay = _REREAD_INITIAL_S
        while True:
            try:
                fresh = await self._binder.read_pod(namespace, name)
                break
            except Exception as exc:
                self._metrics.api_error("pod_read")
                log.warning("bind_outcome_unknown", pod=key, node=node, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, _REREAD_MAX_S)
        if fresh is None or (uid and meta_of(fresh).get("uid") != uid):
            return BindOutcome.GONE
        bound_to = (fresh.get("spec") or {}).get("nodeName")
        if not bound_to:
            return None
        if bound_to == node:
            return BindOutcome.BOUND
        return BindOutcome.CONFLICT

    async def _reread_after_conflict(self, key: PodKey, pod: Pod, node: str) -> None:
        meta = meta_of(pod)
        try:
            fresh = await self._binder.read_pod(str(meta.get("namespace")), str(meta.get("name")))
        except Exception as exc:
            log.warning("pod_reread_failed", pod=key, error=str(exc))
            self._metrics.api_error("pod_read")
            self._queue.retry_later(key)
            return
        if fresh is None:
            self._feed.pod_event("DELETED", pod)
            self._queue.remove(key)
            return
        self._feed.pod_event("MODIFIED", fresh)
        bound_to = (fresh.get("spec") or {}).get("nodeName")
        log.info("bind_conflict", pod=key, node=node, bound_to=bound_to)
        if self._feed.pending_pod(key) is not None:
            self._queue.retry_later(key)
        elif self._queue.is_in_flight(key):
            self._queue.remove(key)

    # --- background work ----------------------------------------------------------------
    def _spawn(self, name: str, coro: Awaitable[None]) -> asyncio.Task[None]:
        async def guarded() -> None:
            await coro

        task = asyncio.create_task(guarded(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _bound_news(self, pod: Pod, node: str, warnings: tuple[str, ...]) -> None:
        """One report (one per pod runs at a time): the Scheduled Event, then what the
        engine adjusted in the request."""
        await self._reporter.scheduled(pod, node)
        for warning in warnings:
            await self._reporter.adjusted(pod, warning)

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
