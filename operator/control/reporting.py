"""What pods' owners see: the ``PodScheduled`` condition and Events.

The texts are built by pure functions (tested without a cluster); ``KubeReporter`` writes
them. The condition carries kube-scheduler's node-counting message
(``0/3 nodes are available: 2 CardInsufficientMemory, 1 CardTypeMismatch.``); the
``FailedScheduling`` Event adds how many devices each reason ruled out.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Sequence
from typing import Final

import structlog

from vgpu_operator.control.deferred import DeferredWrites
from vgpu_operator.kube import conditions, events
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.metrics import OtherReason
from vgpu_operator.scheduling import status
from vgpu_operator.scheduling.cycle import cluster
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
#: A preemptor waits for its victims to leave (Normal Event), or its hold timed out
#: before they did (Warning Event and condition).
REASON_WAITING_FOR_VICTIMS: Final = "WaitingForPreemptedPods"
REASON_NOMINATION_TIMED_OUT: Final = "NominationTimedOut"
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


def not_routed_claims_message(classes: Iterable[str], scheduler: str) -> str:
    """Why a pod whose claims ask for our DeviceClasses, left to kube-scheduler, waits."""
    named = ", ".join(sorted(classes))
    return (
        f"The pod's ResourceClaims ask for DeviceClass {named}, but the pod was created while "
        "the vgpu-operator webhook did not answer, so it kept schedulerName "
        "default-scheduler: kube-scheduler may not allocate this driver's devices (the "
        "namespace's GPU quota would not hold), so it waits forever (a pod's scheduler "
        "cannot be changed after creation). Delete it so that its controller recreates it "
        f"while the operator runs, or set schedulerName: {scheduler} in its template."
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


#: The most victims a message names (a preemption may evict many).
_NAMED_VICTIMS: Final = 5


def _victims(keys: Sequence[str]) -> str:
    shown = ", ".join(keys[:_NAMED_VICTIMS])
    more = len(keys) - _NAMED_VICTIMS
    return f"{shown} and {more} more" if more > 0 else shown


def preempting_condition_message(node: str, victims: int) -> str:
    return (
        f"{preempting_message(node, victims)}; the pod is bound there once they have left "
        "(the room they free is held for it meanwhile)."
    )


def waiting_for_victims_message(wait: cluster.NominationWait) -> str:
    """What a preemptor still waits for (its victims, or their claims' release)."""
    if wait.victims:
        left = f"{len(wait.victims)} still there: {_victims(wait.victims)}"
        return f"Waiting on node {wait.node} for the pods preempted for it to leave ({left})."
    return (
        f"Waiting on node {wait.node} for the ResourceClaims of the pods preempted for it "
        f"to be deallocated ({_victims(wait.claims)})."
    )


def nothing_to_evict_message(diagnosis: status.Diagnosis, node: str) -> str:
    """A nomination with no victim: preemption found room that the node's own checks
    refuse. Nothing is evicted; the pod waits for the cluster to change."""
    return (
        f"{diagnosis.message()} Preemption chose node {node} without any pod to evict, "
        "but the pod does not fit there as it is: nothing is evicted, and the pod is "
        "decided again when the cluster changes."
    )


def nomination_expired_message(expired: cluster.NominationWait) -> str:
    """A preemptor's hold timed out before its victims left."""
    left = (
        f"{len(expired.victims)} still there: {_victims(expired.victims)}"
        if expired.victims
        else "their ResourceClaims were not deallocated"
    )
    return (
        f"The pods preempted on node {expired.node} for this pod did not leave in time "
        f"({left}); the room held for it there is given up, and the pod is decided again "
        "(a victim that does not end, held by a finalizer, say, keeps its room)."
    )


def preemption_failed_message(node: str, victim: str | None, evicted: int, error: str) -> str:
    """Why a preemption stopped: an eviction failed (not a budget's refusal)."""
    before = "no pod was evicted" if not evicted else f"{evicted} evicted before it"
    what = f"the eviction of {victim} failed" if victim else "it could not start"
    return (
        f"Preemption on node {node} stopped: {what} ({error}); {before}. The pod is "
        "decided again after its backoff."
    )


def _pod_ref(pod: Pod) -> events.ObjectRef:
    return events.ObjectRef.of(pod, kind="Pod")


class KubeReporter:
    """Writes conditions and Events for the worker (``worker.Reporter``; its Bindings'
    part is ``binding_writes.BindingNews``)."""

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
        """``PodScheduled=False`` saying the pod preempts, and a Normal Event."""
        ref = _pod_ref(pod)
        now = self._clock()
        condition = conditions.unschedulable_condition(
            pod, preempting_condition_message(node, victims), now
        )
        if condition is not None:
            await conditions.patch_pod_condition(self._api, ref.namespace, ref.name, condition)
        message = preempting_message(node, victims)
        write = self._events.record(ref, REASON_PREEMPTING, message, now, events.TYPE_NORMAL)
        await self._write(write, ref, REASON_PREEMPTING)

    async def waiting_for_victims(self, pod: Pod, message: str) -> None:
        """``PodScheduled=False`` (Unschedulable) and a Normal Event: the pod waits for
        the pods preempted for it to leave."""
        await self._told(pod, message, REASON_WAITING_FOR_VICTIMS, events.TYPE_NORMAL)

    async def nomination_timed_out(self, pod: Pod, message: str) -> None:
        """``PodScheduled=False`` (NominationTimedOut) and a Warning Event."""
        reason = REASON_NOMINATION_TIMED_OUT
        await self._told(pod, message, reason, events.TYPE_WARNING, condition_reason=reason)

    async def _told(
        self,
        pod: Pod,
        message: str,
        event_reason: str,
        event_type: str,
        *,
        condition_reason: str = conditions.REASON_UNSCHEDULABLE,
    ) -> None:
        ref = _pod_ref(pod)
        now = self._clock()
        condition = conditions.unschedulable_condition(pod, message, now, reason=condition_reason)
        if condition is not None:
            await conditions.patch_pod_condition(self._api, ref.namespace, ref.name, condition)
        write = self._events.record(ref, event_reason, message, now, event_type)
        await self._write(write, ref, event_reason)

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
        if fresh.action is events.EventWriteAction.CREATE:
            await events.write_event(self._api, fresh)
