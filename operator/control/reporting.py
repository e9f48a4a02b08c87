"""What pods' owners see: the ``PodScheduled`` condition and Events.

The texts are built by pure functions (tested without a cluster); ``KubeReporter`` writes
them. The condition carries kube-scheduler's node-counting message
(``0/3 nodes are available: 2 CardInsufficientMemory, 1 CardTypeMismatch.``); the
``FailedScheduling`` Event adds how many devices each reason ruled out.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from typing import Final

import structlog

from vgpu_operator.control.deferred import DeferredWrites
from vgpu_operator.kube import conditions, events
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.metrics import OtherReason
from vgpu_operator.scheduling import status
from vgpu_operator.timestamps import format_rfc3339
from vgpu_operator.wire import KubeObject, Pod, meta_of

log = structlog.get_logger("vgpu_operator.reporting")

REASON_FAILED_SCHEDULING: Final = "FailedScheduling"
REASON_SCHEDULED: Final = "Scheduled"
REASON_REQUEST_ADJUSTED: Final = "GpuRequestAdjusted"
REASON_PREEMPTED: Final = "Preempted"
REASON_PREEMPTING: Final = "Preempting"
#: A decided pod waits for its node's allocation gate (the previous pod's device plugin).
REASON_GATED: Final = "WaitingForAllocationGate"
#: A preemption that would violate a PodDisruptionBudget, or whose eviction was refused.
REASON_PREEMPTION_BLOCKED: Final = "PreemptionBlocked"
#: A GPU pod created while the webhook did not answer: it kept the default scheduler.
REASON_NOT_ROUTED: Final = "NotRoutedToGpuScheduler"
CONDITION_NOT_ROUTED: Final = "vgpu-operator.io/RoutedToGpuScheduler"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def failed_scheduling_message(diagnosis: status.Diagnosis) -> str:
    """The Event text: the node summary, then the devices each reason ruled out."""
    summary = diagnosis.message()
    counts = diagnosis.device_counts()
    if not counts:
        return summary
    details = ", ".join(f"{n} {reason}" for reason, n in counts.items())
    return f"{summary} Devices ruled out: {details}."


def condition_reasons(diagnosis: status.Diagnosis) -> tuple[str, ...]:
    """The reason codes the condition message names (each node's main reason, without
    the node annotations that caused it), for ``unschedulable_pods{reason}``; a message
    that names none (no node to try, or an unreadable request) gets a code of its own."""
    if diagnosis.error is not None:
        return (OtherReason.INVALID_REQUEST.value,)
    return diagnosis.main_reasons() or (OtherReason.NO_NODES.value,)


def scheduled_message(pod: Pod, node: str) -> str:
    meta = meta_of(pod)
    return f"Successfully assigned {meta.get('namespace')}/{meta.get('name')} to {node}"


def preempted_message(preemptor: Pod, node: str) -> str:
    meta = meta_of(preemptor)
    return f"Preempted by {meta.get('namespace')}/{meta.get('name')} on node {node}"


def preempting_message(node: str, victims: int) -> str:
    return f"Preempting {victims} pod{'s' if victims != 1 else ''} on node {node}"


def not_routed_message(pod: Pod, resources: Iterable[str], scheduler: str) -> str:
    """Why a GPU pod on the default scheduler gets no share, and how to fix it."""
    names_ = ", ".join(sorted(resources)) or "a GPU resource"
    return (
        f"The pod asks for {names_} but was created while the vgpu-operator webhook did "
        "not answer, so it kept schedulerName default-scheduler and gets no GPU share "
        "(a pod's scheduler cannot be changed after creation). Delete it so that its "
        f"controller recreates it while the operator runs, or set schedulerName: {scheduler} "
        "in its template."
    )


def gate_wait_message(node: str, holder: str, held_s: float, opens_in_s: float) -> str:
    """Why a decided pod is not bound yet: its node's allocation gate is shut."""
    return (
        f"Waiting for the allocation gate of node {node}: pod {holder} was bound there "
        f"{held_s:.0f} s ago and its device plugin has not answered yet. The pod is bound "
        f"once it answers, or in {max(opens_in_s, 0.0):.0f} s at the latest."
    )


def eviction_refused_message(node: str, victim: str, evicted: int) -> str:
    """Why a preemption stopped: the Eviction API refused a victim (its budget)."""
    before = (
        "no pod was evicted"
        if not evicted
        else f"{evicted} pod{'s were' if evicted != 1 else ' was'} evicted before it"
    )
    return (
        f"Preemption on node {node} stopped: the eviction of {victim} was refused (a "
        f"PodDisruptionBudget allows no disruption now); {before}. The pod is decided "
        "again after its backoff."
    )


def _pod_ref(pod: Pod) -> events.ObjectRef:
    return events.ObjectRef.of(pod, kind="Pod")


class KubeReporter:
    """Writes conditions and Events for the worker (``worker.Reporter``)."""

    def __init__(
        self,
        api: ApiClient,
        *,
        aggregator: events.EventAggregator | None = None,
        clock: Callable[[], datetime.datetime] = _now,
        scheduled_events: bool = True,
        deferred: DeferredWrites | None = None,
    ) -> None:
        self._api = api
        self._events = aggregator or events.EventAggregator()
        self._clock = clock
        self._scheduled_events = scheduled_events
        #: Where the Scheduled Events wait for a quiet moment (None: written at once).
        self._deferred = deferred

    async def unschedulable(self, pod: Pod, diagnosis: status.Diagnosis) -> None:
        await self._not_scheduled(pod, diagnosis.message(), failed_scheduling_message(diagnosis))

    async def waits(self, pod: Pod, diagnosis: status.Diagnosis, note: str) -> None:
        """Unschedulable here, and what it waits for (a node the autoscaler asked for)."""
        await self._not_scheduled(
            pod, f"{diagnosis.message()} {note}", f"{failed_scheduling_message(diagnosis)} {note}"
        )

    async def rejected(self, pod: Pod, message: str) -> None:
        await self._not_scheduled(pod, message, message)

    async def failed(self, pod: Pod, message: str) -> None:
        await self._not_scheduled(pod, message, message)

    async def scheduled(self, pod: Pod, node: str) -> None:
        ref = _pod_ref(pod)
        self._events.forget(ref.namespace, ref.name)
        if self._scheduled_events:
            write = self._events.record(
                ref,
                REASON_SCHEDULED,
                scheduled_message(pod, node),
                self._clock(),
                events.TYPE_NORMAL,
            )
            self._events.forget(ref.namespace, ref.name)
            if self._deferred is None:
                await events.write_event(self._api, write)
                return
            api = self._api

            async def later() -> None:
                await events.write_event(api, write)

            self._deferred.put(later)

    async def adjusted(self, pod: Pod, message: str) -> None:
        """A Warning Event: the engine booked less than the pod wrote (cores above 100)."""
        ref = _pod_ref(pod)
        write = self._events.record(
            ref, REASON_REQUEST_ADJUSTED, message, self._clock(), events.TYPE_WARNING
        )
        await self._write(write, ref, REASON_REQUEST_ADJUSTED)

    async def preempted(self, victim: str, preemptor: Pod, node: str) -> None:
        """The Event on an evicted victim (named ``namespace/name``)."""
        namespace, _, name = victim.partition("/")
        ref = events.ObjectRef("Pod", namespace, name)
        message = preempted_message(preemptor, node)
        write = self._events.record(
            ref, REASON_PREEMPTED, message, self._clock(), events.TYPE_NORMAL
        )
        await self._write(write, ref, REASON_PREEMPTED)

    async def preempting(self, pod: Pod, node: str, victims: int) -> None:
        ref = _pod_ref(pod)
        message = preempting_message(node, victims)
        write = self._events.record(
            ref, REASON_PREEMPTING, message, self._clock(), events.TYPE_NORMAL
        )
        await self._write(write, ref, REASON_PREEMPTING)

    async def gated(self, pod: Pod, message: str) -> None:
        """``PodScheduled=False`` (reason WaitingForAllocationGate) and a Normal Event: the
        pod is decided, its Binding waits (the Binding sets the condition True)."""
        ref = _pod_ref(pod)
        now = self._clock()
        condition = conditions.unschedulable_condition(pod, message, now, reason=REASON_GATED)
        if condition is not None:
            await conditions.patch_pod_condition(self._api, ref.namespace, ref.name, condition)
        write = self._events.record(ref, REASON_GATED, message, now, events.TYPE_NORMAL)
        await self._write(write, ref, REASON_GATED)

    async def preemption_blocked(self, pod: Pod, message: str) -> None:
        """``PodScheduled=False`` (reason PreemptionBlocked) and a Warning Event."""
        ref = _pod_ref(pod)
        now = self._clock()
        condition = conditions.unschedulable_condition(
            pod, message, now, reason=REASON_PREEMPTION_BLOCKED
        )
        if condition is not None:
            await conditions.patch_pod_condition(self._api, ref.namespace, ref.name, condition)
        write = self._events.record(
            ref, REASON_PREEMPTION_BLOCKED, message, now, events.TYPE_WARNING
        )
        await self._write(write, ref, REASON_PREEMPTION_BLOCKED)

    async def not_routed(self, pod: Pod, message: str) -> None:
        """A Warning Event and a False condition on a GPU pod left to the default scheduler."""
        ref = _pod_ref(pod)
        now = self._clock()
        condition = {
            "type": CONDITION_NOT_ROUTED,
            "status": "False",
            "reason": "CreatedWhileWebhookDown",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": format_rfc3339(now),
        }
        await conditions.patch_pod_condition(self._api, ref.namespace, ref.name, condition)
        write = self._events.record(ref, REASON_NOT_ROUTED, message, now, events.TYPE_WARNING)
        await self._write(write, ref, REASON_NOT_ROUTED)

    def forget(self, namespace: str, name: str) -> None:
        self._events.forget(namespace, name)

    async def object_event(
        self, obj: KubeObject, kind: str, reason: str, message: str, event_type: str
    ) -> None:
        """An Event about any object (a rejected ConfigMap, for instance)."""
        ref = events.ObjectRef.of(obj, kind=kind)
        write = self._events.record(ref, reason, message, self._clock(), event_type)
        await self._write(write, ref, reason)

    async def _not_scheduled(self, pod: Pod, condition_message: str, event_message: str) -> None:
        ref = _pod_ref(pod)
        now = self._clock()
        condition = conditions.unschedulable_condition(pod, condition_message, now)
        if condition is not None:
            await conditions.patch_pod_condition(self._api, ref.namespace, ref.name, condition)
        write = self._events.record(ref, REASON_FAILED_SCHEDULING, event_message, now)
        await self._write(write, ref, REASON_FAILED_SCHEDULING)

    async def _write(self, write: events.EventWrite, ref: events.ObjectRef, reason: str) -> None:
        if await events.write_event(self._api, write):
            return
        # The Event we meant to bump has expired: start a new series.
        self._events.recreate(write, ref, reason)
        fresh = self._events.record(ref, reason, write.message, self._clock(), write.event_type)
        if fresh.action is events.Action.CREATE:
            await events.write_event(self._api, fresh)
