"""Kueue's AdmissionCheck ``vgpu-operator.io/placeable``, as a judgement on the engine.

Kueue counts quota in totals: four pods of 20 GiB fit a quota of 76 GiB free even when no
card has 20 GiB free, and are then admitted to wait unplaceable while they hold the team's
quota. A ClusterQueue that names an AdmissionCheck of this controller asks us first: a
Workload whose quota Kueue has reserved is answered

- ``Ready`` when the engine places every pod of every pod set *now* (the same
  ``ClusterState.schedule`` as a real pod: the same Fit, with everything already booked,
  reserved or held by an earlier Ready answer); the shares it found are then held in the
  books under names no real pod can have (``#placeable/...``) for ``hold_s`` seconds, so
  that two workloads answered in turn do not both count the same free memory;
- ``Retry`` otherwise, with the reason of the first pod that fits nowhere (its diagnosis:
  the node and device counts per reason); nothing is held.

A hold ends when Kueue has admitted the workload (its pods come next, ungated, and take
the room themselves: holding it longer would make them wait for their own hold), when the
workload is evicted, finished or deleted, when it is judged again, or after ``hold_s``
(``expire``), whichever comes first. The judgement never preempts (its pods say
``preemptionPolicy: Never``): preemption stays Kueue's, by priority and quota.

Pure: the runtime (``admission_checks``) reads Workloads and writes the answers; this
module only asks the engine. Pod sets the check cannot judge are said so and passed:
a pod set whose pods use ResourceClaims (DRA: their claims are made from templates only
once the pods exist) and a pod set asking for no devices (not ours to place).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, cast

from vgpu_operator import names
from vgpu_operator.control import pod_facts
from vgpu_operator.scheduling.cycle.cluster import Decision
from vgpu_operator.scheduling.dialects.claims import claims
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.wire import Pod

#: The ``spec.controllerName`` of the AdmissionChecks this controller answers.
CONTROLLER_NAME: Final = "vgpu-operator.io/placeable"
#: How long a Ready answer holds its shares at most (seconds). Kueue admits a workload
#: within a pass of its last check turning Ready; the hold covers that gap.
DEFAULT_HOLD_S: Final = 30.0
#: Names of held pods start with this: ``#`` is not allowed in a pod name, so a held pod
#: never shares a key with a real one.
HOLD_PREFIX: Final = "#placeable/"
#: The resources that make a pod set ours to judge (any vendor's devices).
_DEVICE_PREFIXES: Final = ("nvidia.com/", "hygon.com/")

State = Literal["Ready", "Retry"]


class Engine(Protocol):
    """What the check needs of ``ClusterState``."""

    def schedule(self, pod: Mapping[str, Any], now: float) -> Decision: ...
    def rollback(self, key: PodKey) -> None: ...
    def cancel_preemption(self, key: PodKey) -> None: ...


@dataclass(frozen=True, slots=True)
class Answer:
    """A check state for the Workload's ``status.admissionChecks`` and its message."""

    state: State
    message: str
    #: The nodes the held pods were placed on, per pod set (for logs and tests).
    placed: Mapping[str, tuple[str, ...]]


@dataclass(slots=True)
class _Hold:
    keys: tuple[PodKey, ...]
    until: float


def workload_id(workload: Mapping[str, Any]) -> str:
    """``namespace/name`` of a Workload (a hold is keyed by it)."""
    meta = workload.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def _pod_sets(workload: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    for pod_set in (workload.get("spec") or {}).get("podSets") or ():
        if not isinstance(pod_set, Mapping):
            continue
        count = pod_set.get("count")
        template = pod_set.get("template")
        if isinstance(count, int) and count > 0 and isinstance(template, Mapping):
            yield str(pod_set.get("name") or "main"), count, template


def _asks_devices(pod: Mapping[str, Any]) -> bool:
    # A pod set's template as Kueue's Workload carries it: a pod's shape, read as one.
    resources = pod_facts.extended_resources_of(cast(Pod, pod))
    return any(r.startswith(_DEVICE_PREFIXES) for r in resources)


def held_pod(
    workload: Mapping[str, Any], pod_set: str, index: int, template: Mapping[str, Any]
) -> dict[str, Any]:
    """The pod ``index`` of ``pod_set`` as the engine is asked to place it: the template's
    spec routed to us, never preempting, no scheduling gates, under a held pod's name."""
    meta = workload.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    template_meta = template.get("metadata") or {}
    spec = copy.deepcopy(dict(template.get("spec") or {}))
    spec.pop("schedulingGates", None)
    spec.pop("nodeName", None)
    spec["schedulerName"] = names.SCHEDULER_NAME
    spec["preemptionPolicy"] = "Never"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{HOLD_PREFIX}{meta.get('name', '')}/{pod_set}/{index}",
            "namespace": namespace,
            "uid": f"{meta.get('uid', '')}/{pod_set}/{index}",
            "labels": dict(template_meta.get("labels") or {}),
            "annotations": dict(template_meta.get("annotations") or {}),
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def _reason(decision: Decision) -> str:
    if decision.rejected:
        return decision.rejected
    if decision.diagnosis is None:
        return "no node fits"
    message = decision.diagnosis.message()
    counts = decision.diagnosis.device_counts()
    if counts:
        devices = ", ".join(f"{n} {reason}" for reason, n in counts.items())
        message = f"{message} (devices: {devices})"
    return message


class PlaceableCheck:
    """The judgements and the holds they leave in the engine's books."""

    def __init__(self, engine: Engine, *, hold_s: float = DEFAULT_HOLD_S) -> None:
        self._engine = engine
        self.hold_s = hold_s
        self._holds: dict[str, _Hold] = {}

    def judge(self, workload: Mapping[str, Any], now: float) -> Answer:
        """Place every pod of the workload on the books (see the module docstring)."""
        wid = workload_id(workload)
        self.release(wid)
        self.expire(now)
        placed: dict[str, tuple[str, ...]] = {}
        taken: list[PodKey] = []
        skipped: list[str] = []
        for pod_set, count, template in _pod_sets(workload):
            probe = held_pod(workload, pod_set, 0, template)
            if claims.uses_claims(probe):
                skipped.append(f"{pod_set} (ResourceClaims: not judged)")
                continue
            if not _asks_devices(probe):
                skipped.append(f"{pod_set} (no devices)")
                continue
            nodes: list[str] = []
            for index in range(count):
                pod = held_pod(workload, pod_set, index, template)
                key = pod_key(pod)
                decision = self._engine.schedule(pod, now)
                if not decision.scheduled or decision.node is None:
                    # A held pod never preempts, but drop any hold the engine kept anyway.
                    self._engine.cancel_preemption(key)
                    self._engine.rollback(key)
                    for earlier in taken:
                        self._engine.rollback(earlier)
                    why = _reason(decision)
                    return Answer(
                        "Retry",
                        f"pod set {pod_set}: pod {index + 1} of {count} fits on no node now: {why}",
                        {},
                    )
                taken.append(key)
                nodes.append(decision.node)
            placed[pod_set] = tuple(nodes)
        if taken:
            self._holds[wid] = _Hold(tuple(taken), now + self.hold_s)
        total = sum(len(n) for n in placed.values())
        message = f"all {total} pods placeable now; held for {self.hold_s:g}s"
        if skipped:
            message += "; passed: " + ", ".join(skipped)
        return Answer("Ready", message, placed)

    def release(self, wid: str) -> bool:
        """End the workload's hold, if it has one."""
        hold = self._holds.pop(wid, None)
        if hold is None:
            return False
        for key in hold.keys:
            self._engine.rollback(key)
        return True

    def expire(self, now: float) -> list[str]:
        """End the holds whose time is up; returns their workloads."""
        ended = [wid for wid, hold in self._holds.items() if hold.until <= now]
        for wid in ended:
            self.release(wid)
        return ended

    def holding(self) -> dict[str, tuple[PodKey, ...]]:
        return {wid: hold.keys for wid, hold in self._holds.items()}

    def next_expiry(self) -> float | None:
        return min((hold.until for hold in self._holds.values()), default=None)
