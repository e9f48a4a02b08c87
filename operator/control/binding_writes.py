"""Writing the Bindings of decided pods (the scheduling worker's background half).

A placement is written as one Binding, with a bounded number in flight: decision
(reserved) -> the pod's claims (the DRA path) -> Binding -> ``confirm``; on failure
``rollback`` and retry with backoff; on 409 the pod is re-read. A Binding whose answer
was lost keeps the pod's shares until the pod itself says whether it was bound. Where
the allocation gate is on, a node's GPU pods are bound one at a time, in decision order,
each once the previous one has its devices; a Binding that waits long for that is shown
on its pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import structlog

from vgpu_operator.control import claim_binding, feed, pod_facts, queue, reporting
from vgpu_operator.kube.binding import BindOutcome
from vgpu_operator.metrics import OperatorMetrics, Result
from vgpu_operator.scheduling.books.allocation_gate import GateHolder
from vgpu_operator.scheduling.cycle import cluster
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.wire import Pod, meta_of

log = structlog.get_logger("vgpu_operator.worker")

#: Reading back a pod whose Binding's answer was lost: first retry, and the longest wait.
_REREAD_INITIAL_S = 0.5
_REREAD_MAX_S = 5.0

#: A Binding that has waited this long for its node's allocation gate, held this long by
#: one pod, is shown on its pod (condition and Event): plugins that answer in a second or
#: two keep a burst quiet, one that does not answer is seen.
GATE_REPORT_AFTER_S = 5.0


class Binder(Protocol):
    async def bind(self, pod: Pod, node: str, annotations: Mapping[str, str]) -> BindOutcome: ...

    async def read_pod(self, namespace: str, name: str) -> Pod | None: ...


class BindingEngine(Protocol):
    """The part of ``scheduling.cycle.cluster.ClusterState`` a Binding answers to."""

    def confirm(self, key: PodKey, now: float | None = None) -> None: ...
    def rollback(self, key: PodKey) -> None: ...
    def bind_gate_open(self, node_name: str, key: PodKey, now: float) -> bool: ...
    def bind_gate_enabled(self) -> bool: ...
    def gate_holder(self, node_name: str, now: float) -> GateHolder | None: ...


class BindingNews(Protocol):
    """What the pods are told of their Bindings (``reporting.ApiReporter``)."""

    async def scheduled(self, pod: Pod, node: str) -> None: ...
    async def adjusted(self, pod: Pod, message: str) -> None: ...
    async def gated(self, pod: Pod, message: str) -> None: ...


#: Report in the background, one report per pod at a time (the worker's ``_report``).
Report = Callable[[PodKey, Awaitable[None]], None]


def _holds_devices(decision: cluster.Decision) -> bool:
    return any(any(single) for single in decision.devices.values())


class BindingWrites:
    """See the module docstring. ``slots`` bounds the Bindings in flight: the worker
    takes one before deciding, and a Binding task takes it over (``slot_held``)."""

    def __init__(
        self,
        engine: BindingEngine,
        state_feed: feed.StateFeed,
        pods_queue: queue.SchedulingQueue,
        binder: Binder,
        reporter: BindingNews,
        metrics: OperatorMetrics,
        *,
        report: Report,
        report_running: Callable[[PodKey], asyncio.Task[None] | None],
        max_in_flight: int,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        gate_report_after_s: float,
        claims: claim_binding.ClaimBinding | None,
    ) -> None:
        self._engine = engine
        self._feed = state_feed
        self._queue = pods_queue
        self._binder = binder
        self._reporter = reporter
        self._metrics = metrics
        self._report = report
        self._report_running = report_running
        self._clock = clock
        self._wall_clock = wall_clock
        self._gate_report_after_s = gate_report_after_s
        #: The DRA path's writes before a Binding (None: no pod here uses claims).
        self._claims = claims
        self.slots = asyncio.Semaphore(max_in_flight)
        self.in_flight = 0
        #: Bindings waiting for their node's allocation gate, and the one being written.
        self._gate_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._binding_on: dict[str, PodKey] = {}

    def _give_up(self, key: PodKey) -> None:
        """The decision's reservation rolled back and the feed told: its room is free."""
        self._engine.rollback(key)
        self._feed.binding_failed(key)

    async def bind(
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
                self.slots.release()
                slot_held = False
            try:
                await self._await_gate(node, key, pod)
            except asyncio.CancelledError:
                self._give_up(key)
                raise
        if gated:
            self._binding_on[node] = key
        reporting_now = self._report_running(key)
        if reporting_now is not None and not reporting_now.done():
            # The Binding sets PodScheduled True; a report still being written (the gate's
            # wait, say) lands first, or its False would stay on the bound pod.
            await asyncio.wait([reporting_now])
        if not slot_held:
            await self.slots.acquire()
        self.in_flight += 1
        try:
            await self._bind_once(key, pod, node, decision)
        finally:
            self.in_flight -= 1
            self.slots.release()
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
            self._give_up(key)
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
                self._give_up(key)
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
        self._give_up(key)
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
                self._give_up(key)
                raise
            except Exception as exc:
                self._metrics.api_error("claim")
                problem = str(exc)
        if problem is None:
            return True
        self._give_up(key)
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

    async def _bound_news(self, pod: Pod, node: str, warnings: tuple[str, ...]) -> None:
        """One report (one per pod runs at a time): the Scheduled Event, then what the
        engine adjusted in the request."""
        await self._reporter.scheduled(pod, node)
        for warning in warnings:
            await self._reporter.adjusted(pod, warning)
