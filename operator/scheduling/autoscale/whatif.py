"""One trial: the waiting pods placed by the decision cycle on an overlay of the books with
some new nodes added.

``WhatIfEngine`` is the engine a trial decides with: a ``decision.Cycle`` on an
``overlay.Overlay`` of the live books (preemption off, no verdicts), and the face
``gangs.decide_group`` takes, so that a PodGroup is placed whole exactly as the live worker
places it. A ``Unit`` is what is placed whole: one pod, or the waiting members of a group.
A pod's claims are fitted by the claims dialect on the nodes' pools (a new node on the DRA
path comes with the slices its agent would publish), its template claims not made yet as
the claim controller would make them (``Unit.claims``). A pod alone is held to the new
nodes by a ``nodeSelector`` term on a copy of it (the label
``WHAT_IF_LABEL`` that only new nodes carry): it waits because no live node holds it, and
the walk then passes the live nodes by the node gate's first check. A pod nominated to a
node already requested is held to that node (its name). Group members may also use the
live nodes' room, as the live walk would give it to them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vgpu_operator.scheduling import gangs
from vgpu_operator.scheduling.autoscale.catalogue import HOSTNAME_LABEL, NodeOption
from vgpu_operator.scheduling.autoscale.hypothetical import WHAT_IF_LABEL, NodeFactory
from vgpu_operator.scheduling.books import Books, Overlay
from vgpu_operator.scheduling.cycle import Cycle, Decision, Settings
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.wire import Pod, ResourceClaim


@dataclass(frozen=True, slots=True)
class Unit:
    """What a trial places whole: a pod alone (``group`` None), or the waiting members of a
    PodGroup (its spec, the members bound already, every member's schedulerName)."""

    key: str
    pods: tuple[Pod, ...]
    group: gangs.GroupSpec | None = None
    bound: Mapping[PodKey, str] = field(default_factory=dict)
    scheduler_names: tuple[str, ...] = ()
    #: The node already requested this unit was nominated to (held there), if any.
    pinned: str | None = None
    #: Claims its pods name that do not exist yet: made from their templates as the claim
    #: controller would make them (the pods' ``status.resourceClaimStatuses`` name them).
    claims: tuple[ResourceClaim, ...] = ()

    @property
    def keys(self) -> tuple[PodKey, ...]:
        return tuple(pod_key(p) for p in self.pods)


@dataclass(frozen=True, slots=True)
class Slot:
    """A node of a trial: its name and option (new, or requested already)."""

    name: str
    option: NodeOption


class WhatIfEngine:
    """The engine of one trial (``gangs.GroupEngine``): the decision cycle on an overlay of
    the live books, with nodes added. Nothing reaches the live books."""

    def __init__(self, live: Books, factory: NodeFactory) -> None:
        self.overlay = Overlay(live)
        self.cycle = Cycle(self.overlay, Settings(preemption_enabled=False, verdicts=False))
        self.preemption_enabled = False
        self._factory = factory
        self._added = 0

    @property
    def books(self) -> Overlay:
        return self.overlay

    def schedule(self, pod: Pod, now: float, explain: bool = False) -> Decision:
        return self.cycle.schedule(pod, now, explain)

    def rollback(self, key: PodKey) -> None:
        self.overlay.release_decided(key)
        self.overlay.drop_pod(key)

    def add_claims(self, claims: Sequence[ResourceClaim]) -> None:
        """Claims that do not exist yet (units' template claims) join the what-if."""
        for claim in claims:
            self.overlay.add_claim(claim)

    def add(self, slot: Slot) -> None:
        made = self._factory.make(slot.option, slot.name, self._added)
        self.overlay.add_node(made.entry, made.pool, made.mig)
        self._added += 1

    def remove(self, name: str) -> None:
        self.overlay.remove_node(name)

    def place(self, unit: Unit, now: float) -> tuple[dict[PodKey, str], Decision | None]:
        """Place ``unit`` whole: where each pod went, or nothing and the decision of a pod
        that did not fit (None when a group waits for input, not room)."""
        if unit.group is None:
            decision = self.schedule(held(unit.pods[0], unit.pinned), now)
            if decision.scheduled and decision.node is not None:
                return {decision.pod: decision.node}, None
            self.rollback(decision.pod)
            return {}, decision
        pods = [held(p, unit.pinned, alone=False) for p in unit.pods]
        out = gangs.decide_group(
            self, unit.group, unit.key, pods, unit.bound, now, unit.scheduler_names
        )
        placed = {d.pod: d.node for d in out.placed if d.node is not None}
        if out.reason is None and len(placed) == len(unit.pods):
            return placed, None
        gangs.release(self, list(placed))
        return {}, out.hint or (out.waiting[0] if out.waiting else None)

    def unplace(self, keys: Sequence[PodKey]) -> None:
        for key in keys:
            self.rollback(key)


def pod_shape(pod: Pod) -> str:
    """What makes two pods alike for a what-if: everything but their names (and nodes)."""
    meta = pod.get("metadata") or {}
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    group = spec.get("schedulingGroup")
    body = {
        "namespace": meta.get("namespace"),
        "annotations": meta.get("annotations") or {},
        "labels": meta.get("labels") or {},
        "spec": spec,
        "group": group,
    }
    return json.dumps(body, sort_keys=True, default=str)


def held(pod: Pod, node: str | None, *, alone: bool = True) -> Pod:
    """A copy of ``pod`` held to ``node`` (its name), else, for a pod alone, to new nodes."""
    if node is None and not alone:
        return pod
    spec = pod.get("spec") or {}
    selector = dict(spec.get("nodeSelector") or {})
    if node is not None:
        selector[HOSTNAME_LABEL] = node
    else:
        selector[WHAT_IF_LABEL] = "new"
    return {**pod, "spec": {**spec, "nodeSelector": selector}}
