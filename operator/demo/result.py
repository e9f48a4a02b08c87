"""What happened to each pod: read from the API server once every pod is decided."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpu_operator import names
from vgpu_operator.agent.deviceplugin.kubelet_standin import ContainerSettings
from vgpu_operator.demo.dra_claim import DraClaimShown
from vgpu_operator.demo.nodes import CardFacts
from vgpu_operator.demo.operator_process import OperatorProcess
from vgpu_operator.demo.settings import POLL_S, DemoError, Json
from vgpu_operator.devices import codec, nvidia
from vgpu_operator.errors import CodecError
from vgpu_operator.testing.controlplane import (
    ControlPlane,
)


@dataclass(frozen=True, slots=True)
class GpuGrant:
    """One container's share of one card, from ``hami.io/vgpu-devices-allocated``.

    ``uuid`` is the card's UUID as written, with a MIG instance's ``[geometry-slot]``
    suffix; ``card_uuid`` is without it.
    """

    container: int
    uuid: str
    card_uuid: str
    memory_mib: int
    cores: int


@dataclass(frozen=True, slots=True)
class PlacedPod:
    """A pod bound to a node, with the cards named in its allocation annotation."""

    namespace: str
    name: str
    node: str
    gpus: tuple[GpuGrant, ...]


@dataclass(frozen=True, slots=True)
class WaitingPod:
    """A pod the operator reported as unschedulable (condition ``PodScheduled=False``)."""

    namespace: str
    name: str
    reason: str
    message: str
    #: The latest FailedScheduling Event's text (with devices ruled out per reason).
    event_message: str


@dataclass(frozen=True, slots=True)
class PreemptedPod:
    """A pod evicted to make room for a higher-priority one (its ``Preempted`` Event)."""

    namespace: str
    name: str
    message: str


@dataclass(frozen=True, slots=True)
class DemoResult:
    """What the operator decided for the example pods, and the cards it chose from."""

    #: Card UUID -> the card as its DeviceInventory reports it.
    cards: Mapping[str, CardFacts]
    placed: tuple[PlacedPod, ...]
    waiting: tuple[WaitingPod, ...]
    #: Pods neither bound nor reported as waiting when the wait ended ("ns/name").
    undecided: tuple[str, ...]
    #: Seconds per phase, in the order they ran.
    timings_s: Mapping[str, float] = field(default_factory=dict)
    preempted: tuple[PreemptedPod, ...] = ()
    #: What each GPU container received from its node's device plugin (kubelet stand-in).
    containers: tuple[ContainerSettings, ...] = ()
    #: Bound pods whose device plugin had not answered when the demo stopped waiting.
    unsettled: tuple[str, ...] = ()
    #: The DRA part: one claim kube-scheduler allocated on the DRA node, as prepared.
    dra: DraClaimShown | None = None

    def placed_pod(self, name: str) -> PlacedPod:
        """The bound pod called ``name`` (any namespace); KeyError if it is not bound."""
        for pod in self.placed:
            if pod.name == name:
                return pod
        raise KeyError(name)

    def waiting_pod(self, name: str) -> WaitingPod:
        """The waiting pod called ``name`` (any namespace); KeyError if it is not waiting."""
        for pod in self.waiting:
            if pod.name == name:
                return pod
        raise KeyError(name)


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return None


def is_bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def is_unschedulable(pod: Mapping[str, Any]) -> bool:
    """Reported as waiting by the scheduler (condition ``PodScheduled=False``)."""
    scheduled = _condition(pod, "PodScheduled")
    return scheduled is not None and scheduled.get("status") == "False"


def _pod_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


@dataclass(frozen=True, slots=True)
class ExamplesSnapshot:
    """The example pods as the API server has them, and their latest FailedScheduling
    Event texts ("ns/name" -> message)."""

    pods: Mapping[str, Json]
    failed_scheduling: Mapping[str, str]

    def complete(self, keys: Sequence[str]) -> bool:
        """Every pod bound, or reported as waiting with its Event written (the Event
        follows the condition)."""
        for key in keys:
            pod = self.pods.get(key)
            if pod is None:
                return False
            if not is_bound(pod) and not (is_unschedulable(pod) and key in self.failed_scheduling):
                return False
        return True


def _event_time(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or "")


def read_snapshot(cp: ControlPlane, keys: Sequence[str]) -> ExamplesSnapshot:
    """One listing of pods and Events per namespace of ``keys``."""
    wanted = set(keys)
    pods: dict[str, Json] = {}
    latest: dict[str, Json] = {}
    for namespace in sorted({key.split("/", 1)[0] for key in keys}):
        for pod in cp.get(f"/api/v1/namespaces/{namespace}/pods").get("items", []):
            if _pod_key(pod) in wanted:
                pods[_pod_key(pod)] = pod
        for event in cp.get(f"/api/v1/namespaces/{namespace}/events").get("items", []):
            involved = event.get("involvedObject") or {}
            key = f"{involved.get('namespace')}/{involved.get('name')}"
            if event.get("reason") != "FailedScheduling" or key not in wanted:
                continue
            if key not in latest or _event_time(event) >= _event_time(latest[key]):
                latest[key] = event
    messages = {key: str(event.get("message") or "") for key, event in latest.items()}
    return ExamplesSnapshot(pods, messages)


def read_preempted(cp: ControlPlane, namespaces: Sequence[str]) -> tuple[PreemptedPod, ...]:
    """The pods of ``namespaces`` that carry a ``Preempted`` Event, oldest first."""
    found: list[tuple[str, PreemptedPod]] = []
    for namespace in sorted(set(namespaces)):
        for event in cp.get(f"/api/v1/namespaces/{namespace}/events").get("items", []):
            if event.get("reason") != "Preempted":
                continue
            involved = event.get("involvedObject") or {}
            pod = PreemptedPod(
                str(involved.get("namespace")),
                str(involved.get("name")),
                str(event.get("message") or ""),
            )
            found.append((_event_time(event), pod))
    return tuple(pod for _, pod in sorted(found, key=lambda item: item[0]))


def awaiting_devices(snapshot: ExamplesSnapshot) -> list[str]:
    """Bound pods whose device plugin has not answered yet (``bind-phase`` allocating)."""
    return sorted(
        key
        for key, pod in snapshot.pods.items()
        if is_bound(pod)
        and ((pod.get("metadata") or {}).get("annotations") or {}).get(names.BIND_PHASE)
        == "allocating"
    )


def wait_for_allocations(
    cp: ControlPlane, keys: Sequence[str], operator: OperatorProcess, timeout_s: float
) -> list[str]:
    """Poll until every bound pod's devices are handed out (or refused); the pods still
    waiting for their device plugin when ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        operator.check_alive()
        waiting = awaiting_devices(read_snapshot(cp, keys))
        if not waiting or time.monotonic() >= deadline:
            return waiting
        time.sleep(POLL_S)


def wait_for_decisions(
    cp: ControlPlane, keys: Sequence[str], operator: OperatorProcess, timeout_s: float
) -> ExamplesSnapshot:
    """Poll until every pod is decided or ``timeout_s`` passes; the last reading."""
    deadline = time.monotonic() + timeout_s
    while True:
        operator.check_alive()
        snapshot = read_snapshot(cp, keys)
        if snapshot.complete(keys) or time.monotonic() >= deadline:
            return snapshot
        time.sleep(POLL_S)


def _grants(pod: Mapping[str, Any]) -> tuple[GpuGrant, ...]:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        devices = codec.decode_pod_devices(
            annotations, {nvidia.COMMON_WORD: nvidia.ALLOCATED_ANNOTATION}
        )
    except CodecError as exc:
        raise DemoError(f"{_pod_key(pod)}: unreadable allocation: {exc}") from exc
    grants = []
    for per_vendor in devices.values():
        for container, container_devices in enumerate(per_vendor):
            for device in container_devices:
                grants.append(
                    GpuGrant(
                        container=container,
                        uuid=device.uuid,
                        card_uuid=device.uuid.split("[", 1)[0],
                        memory_mib=device.memory_mib,
                        cores=device.cores,
                    )
                )
    return tuple(grants)


def collect_result(
    keys: Sequence[str],
    snapshot: ExamplesSnapshot,
    cards: Mapping[str, CardFacts],
    timings_s: Mapping[str, float],
) -> DemoResult:
    """Sort the pods into placed, waiting and undecided, in the order of ``keys``."""
    placed: list[PlacedPod] = []
    waiting: list[WaitingPod] = []
    undecided: list[str] = []
    for key in keys:
        namespace, name = key.split("/", 1)
        pod = snapshot.pods.get(key)
        if pod is not None and is_bound(pod):
            placed.append(PlacedPod(namespace, name, str(pod["spec"]["nodeName"]), _grants(pod)))
        elif pod is not None and is_unschedulable(pod):
            scheduled = _condition(pod, "PodScheduled") or {}
            waiting.append(
                WaitingPod(
                    namespace,
                    name,
                    reason=str(scheduled.get("reason") or ""),
                    message=str(scheduled.get("message") or ""),
                    event_message=snapshot.failed_scheduling.get(key, ""),
                )
            )
        else:
            undecided.append(key)
    return DemoResult(
        cards=dict(cards),
        placed=tuple(placed),
        waiting=tuple(waiting),
        undecided=tuple(undecided),
        timings_s=dict(timings_s),
    )
