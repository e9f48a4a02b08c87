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

Two kinds of pod set are judged beyond one pod at a time:

- Pods that form an upstream PodGroup (their template names ``schedulingGroup``): judged
  as one gang, the engine's own gang decision (``gangs.decide_group``) over every pod of
  the workload in the group: all placed at once, in one domain of its topology
  constraint, or Retry with the group's reason (a PodGroup that is missing or unreadable
  is said so).
- Pods that use ResourceClaims (the DRA path): each pod's claims as kube-controller-manager
  will make them, from the templates the runtime read (``templates``), held under names
  no real claim can have; the engine's claim fit places them as it places a real pod's.
  A claim named by ``resourceClaimName`` is the real one, as the books have it.

Pure: the runtime (``admission_checks``) reads Workloads and templates and writes the
answers; this module only asks the engine. A pod set asking for no devices (not ours to
place) is said so and passed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, cast

from vgpu_operator import names
from vgpu_operator.control import pod_facts
from vgpu_operator.devices import catalog
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision
from vgpu_operator.scheduling.dialects.claims import claims
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.wire import Pod, PodClaimStatus, PodGroup, PodSpec, ResourceClaimSpec

#: The ``spec.controllerName`` of the AdmissionChecks this controller answers.
CONTROLLER_NAME: Final = "vgpu-operator.io/placeable"
#: How long a Ready answer holds its shares at most (seconds). Kueue admits a workload
#: within a pass of its last check turning Ready; the hold covers that gap.
DEFAULT_HOLD_S: Final = 30.0
#: Names of held pods start with this: ``#`` is not allowed in a pod name, so a held pod
#: never shares a key with a real one.
HOLD_PREFIX: Final = "#placeable/"
#: The resources that make a pod set ours to judge (any vendor's devices).
_DEVICE_PREFIXES: Final = catalog.resource_prefixes()

State = Literal["Ready", "Retry"]


#: Names of held claims start with this (``#`` is not allowed in a claim's name either).
HOLD_CLAIM_PREFIX: Final = "#placeable."


class NotPlaceable(Exception):
    """A pod set that cannot be placed now (or read): the Retry's message."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A check state for the Workload's ``status.admissionChecks`` and its message."""

    state: State
    message: str
    #: The nodes the held pods were placed on, per pod set (for logs and tests).
    placed: Mapping[str, tuple[str, ...]]


@dataclass(slots=True)
class _Hold:
    keys: list[PodKey] = field(default_factory=list)
    #: The held claims (``namespace/name``) given to the engine for the held pods.
    claims: list[str] = field(default_factory=list)
    until: float = 0.0


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


def _in_group(pod: Pod, group: str | None) -> Pod:
    """The held pod as a member of ``group`` (``namespace/name``), unless it names one."""
    if group is None or gangs.group_of(pod) is not None:
        return pod
    pod.setdefault("spec", {})["schedulingGroup"] = {"podGroupName": group.partition("/")[2]}
    return pod


def templates_named(workload: Mapping[str, Any]) -> list[str]:
    """The ``namespace/name`` of every ResourceClaimTemplate the workload's pod sets name,
    once each, in order."""
    namespace = (workload.get("metadata") or {}).get("namespace") or "default"
    found: dict[str, None] = {}
    for _, _, template in _pod_sets(workload):
        for entry in (template.get("spec") or {}).get("resourceClaims") or ():
            if isinstance(entry, Mapping) and isinstance(
                entry.get("resourceClaimTemplateName"), str
            ):
                found[f"{namespace}/{entry['resourceClaimTemplateName']}"] = None
    return list(found)


def _asks_devices(pod: Pod) -> bool:
    resources = pod_facts.extended_resources_of(pod)
    return any(r.startswith(_DEVICE_PREFIXES) for r in resources)


def held_pod(
    workload: Mapping[str, Any], pod_set: str, index: int, template: Mapping[str, Any]
) -> Pod:
    """The pod ``index`` of ``pod_set`` as the engine is asked to place it: the template's
    spec routed to us, never preempting, no scheduling gates, under a held pod's name."""
    meta = workload.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    template_meta = template.get("metadata") or {}
    # A pod set's template as Kueue's Workload carries it: a pod's spec.
    spec: PodSpec = copy.deepcopy(cast(PodSpec, dict(template.get("spec") or {})))
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
    """The judgements and the holds they leave in the engine's books. ``pod_groups``: the
    PodGroup object of ``namespace/name`` as the operator has read it (None: missing)."""

    def __init__(
        self,
        engine: ClusterState,
        *,
        hold_s: float = DEFAULT_HOLD_S,
        pod_groups: Callable[[str], Mapping[str, Any] | None] = lambda _: None,
    ) -> None:
        self._engine = engine
        self.hold_s = hold_s
        self._pod_groups = pod_groups
        self._holds: dict[str, _Hold] = {}

    def judge(
        self,
        workload: Mapping[str, Any],
        now: float,
        templates: Mapping[str, Mapping[str, Any]] | None = None,
        pod_group: str | None = None,
    ) -> Answer:
        """Place every pod of the workload on the books (see the module docstring).
        ``templates``: the ResourceClaimTemplates its pods name, by ``namespace/name``.
        ``pod_group``: the PodGroup its pods name where the pod sets cannot say it
        (Kueue's Workload keeps no ``schedulingGroup``: the runtime reads it from a pod)."""
        wid = workload_id(workload)
        self.release(wid)
        self.expire(now)
        hold = _Hold(until=now + self.hold_s)
        placed: dict[str, list[str]] = {}
        skipped: list[str] = []
        groups: dict[str, list[tuple[str, Pod]]] = {}
        try:
            for pod_set, count, template in _pod_sets(workload):
                probe = held_pod(workload, pod_set, 0, template)
                if not claims.uses_claims(probe) and not _asks_devices(probe):
                    skipped.append(f"{pod_set} (no devices)")
                    continue
                probe = _in_group(probe, pod_group)
                pods = [
                    _in_group(held_pod(workload, pod_set, i, template), pod_group)
                    for i in range(count)
                ]
                if claims.uses_claims(probe):
                    pods = [self._with_held_claims(p, pod_set, templates or {}, hold) for p in pods]
                group = gangs.group_of(probe)
                if group is not None:
                    groups.setdefault(group, []).extend((pod_set, p) for p in pods)
                    continue
                placed[pod_set] = self._place_one_by_one(pod_set, pods, now, hold)
            for group, members in groups.items():
                for pod_set, node in self._place_group(group, members, now, hold):
                    placed.setdefault(pod_set, []).append(node)
        except NotPlaceable as exc:
            self._undo(hold)
            return Answer("Retry", str(exc), {})
        if hold.keys:
            self._holds[wid] = hold
        else:
            self._undo(hold)
        total = sum(len(n) for n in placed.values())
        message = f"all {total} pods placeable now; held for {self.hold_s:g}s"
        if skipped:
            message += "; passed: " + ", ".join(skipped)
        return Answer("Ready", message, {k: tuple(v) for k, v in placed.items()})

    def _place_one_by_one(
        self, pod_set: str, pods: list[Pod], now: float, hold: _Hold
    ) -> list[str]:
        nodes: list[str] = []
        for index, pod in enumerate(pods):
            key = pod_key(pod)
            decision = self._engine.schedule(pod, now)
            if not decision.scheduled or decision.node is None:
                # A held pod never preempts, but drop any hold the engine kept anyway.
                self._engine.cancel_preemption(key)
                self._engine.rollback(key)
                why = _reason(decision)
                raise NotPlaceable(
                    f"pod set {pod_set}: pod {index + 1} of {len(pods)} fits on no node now: {why}"
                )
            hold.keys.append(key)
            nodes.append(decision.node)
        return nodes

    def _place_group(
        self, group: str, members: list[tuple[str, Pod]], now: float, hold: _Hold
    ) -> list[tuple[str, str]]:
        """Every member at once, as the engine decides a gang (in one domain of its
        topology constraint); each member's pod set and node."""
        sets = sorted({pod_set for pod_set, _ in members})
        where = f"pod group {group} (pod set{'s' if len(sets) > 1 else ''} {', '.join(sets)})"
        obj = self._pod_groups(group)
        if obj is None:
            raise NotPlaceable(f"{where}: PodGroup {group} does not exist")
        try:
            spec = gangs.read_pod_group(cast(PodGroup, obj))  # as the operator read it
        except gangs.GroupError as exc:
            raise NotPlaceable(f"{where}: {exc}") from None
        # Every pod of the workload, at once, never by preemption: the check's promise.
        whole = replace(spec, gang=True, min_count=len(members), never_preempts=True)
        pods = [pod for _, pod in members]
        out = gangs.decide_group(self._engine, whole, group, pods, {}, now)
        if len(out.placed) < len(members):
            gangs.release(self._engine, [d.pod for d in out.placed])
            raise NotPlaceable(f"{where}: {out.reason or 'not every member fits at once'}")
        set_of = {pod_key(pod): pod_set for pod_set, pod in members}
        hold.keys.extend(d.pod for d in out.placed)
        return [(set_of[d.pod], d.node or "") for d in out.placed]

    def _with_held_claims(
        self,
        pod: Pod,
        pod_set: str,
        templates: Mapping[str, Mapping[str, Any]],
        hold: _Hold,
    ) -> Pod:
        """The held pod with a held claim for each template entry, as the claim controller
        will make it (given to the engine, named in ``status.resourceClaimStatuses``)."""
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        statuses: list[PodClaimStatus] = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            if not isinstance(entry, Mapping) or not entry.get("resourceClaimTemplateName"):
                continue
            template_key = f"{namespace}/{entry['resourceClaimTemplateName']}"
            template = templates.get(template_key)
            if template is None:
                raise NotPlaceable(
                    f"pod set {pod_set}: ResourceClaimTemplate {template_key} not found"
                )
            held = str(meta.get("name", "")).removeprefix(HOLD_PREFIX).replace("/", ".")
            name = f"{HOLD_CLAIM_PREFIX}{held}.{entry.get('name')}"
            spec = (template.get("spec") or {}).get("spec") or {}
            self._engine.set_claim(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {
                        "namespace": namespace,
                        "name": name,
                        "uid": f"{meta.get('uid', '')}/{entry.get('name')}",
                        "resourceVersion": "1",
                    },
                    "spec": cast(ResourceClaimSpec, copy.deepcopy(dict(spec))),
                }
            )
            hold.claims.append(f"{namespace}/{name}")
            statuses.append({"name": str(entry.get("name")), "resourceClaimName": name})
        if statuses:
            pod.setdefault("status", {})["resourceClaimStatuses"] = statuses
        return pod

    def _undo(self, hold: _Hold) -> None:
        for key in hold.keys:
            self._engine.rollback(key)
        self._engine.books.forget_freed(hold.keys)
        for claim in hold.claims:
            self._engine.remove_claim(claim)

    def release(self, wid: str) -> bool:
        """End the workload's hold, if it has one."""
        hold = self._holds.pop(wid, None)
        if hold is None:
            return False
        for key in hold.keys:
            self._engine.rollback(key)
        for claim in hold.claims:
            self._engine.remove_claim(claim)
        return True

    def expire(self, now: float) -> list[str]:
        """End the holds whose time is up; returns their workloads."""
        ended = [wid for wid, hold in self._holds.items() if hold.until <= now]
        for wid in ended:
            self.release(wid)
        return ended

    def holding(self) -> dict[str, tuple[PodKey, ...]]:
        return {wid: tuple(hold.keys) for wid, hold in self._holds.items()}

    def next_expiry(self) -> float | None:
        return min((hold.until for hold in self._holds.values()), default=None)
