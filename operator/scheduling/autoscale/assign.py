"""When the walk's order leaves a pod out: every assignment of pods to a trial's nodes.

A trial first places the units in one order by the walk (``whatif``). That is a packing
heuristic (the most demanding first, each where the node policy sends it); a set of nodes
it fails on may still hold the queue another way. For a small queue the search then tries
assignments: each pod held to one node in turn (``whatif.held``), placed by the decision
cycle there, backtracking on a pod that does not fit; for a queue of at most
``MAX_PERMUTED`` pods, in every order too (the Fit's choice of cards depends on what is on
the node already: under the spread policy small shares taken first leave no whole card
for a later pod, while the pod taken first fits). The live path holds each pod's shares
in the plan's order, so any order found is one the cluster can follow. New nodes of one
option that are still empty are alike, and so are pods of one shape: only the first of
each is tried. Each placement counts against a budget; spent, the trial is lost. A
group's members are placed one by one, all of them (the what-if's rule for a gang: every
waiting member placed), which is why a group with a topology constraint (one domain for
all) is not assigned this way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from vgpu_operator.scheduling.autoscale.whatif import Slot, Unit, WhatIfEngine, held, pod_shape
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.wire import Pod

#: Queues larger than this (pods) are not assigned pod by pod.
MAX_PODS: Final = 12
#: Queues up to this (pods) are also tried in every order.
MAX_PERMUTED: Final = 5


class _Spent(Exception):
    """The placements budget is spent."""


def eligible(units: Sequence[Unit]) -> bool:
    """Whether the queue is small enough, and free of topology-bound groups."""
    pods = sum(len(u.pods) for u in units)
    bound = any(u.group is not None and u.group.topology_key for u in units)
    return pods <= MAX_PODS and not bound


class Assigner:
    """The backtracking search of one trial (see the module docstring)."""

    def __init__(
        self,
        engine: WhatIfEngine,
        slots: Sequence[Slot],
        new: Mapping[str, tuple[str, str, str, str]],
        now: float,
        budget: int,
    ) -> None:
        self._engine = engine
        self._names = [s.name for s in slots]
        #: New nodes by name: their option (empty ones of one option are alike).
        self._new = dict(new)
        self._now = now
        self._budget = budget
        self.placements = 0
        self.where: dict[PodKey, str] = {}
        self._permute = False

    def run(self, units: Sequence[Unit]) -> dict[PodKey, str] | None:
        pods: list[Pod] = [pod for unit in units for pod in unit.pods]
        self._permute = len(pods) <= MAX_PERMUTED
        try:
            return dict(self.where) if self._place(pods) else None
        except _Spent:
            return None

    def _place(self, pods: Sequence[Pod]) -> bool:
        if not pods:
            return True
        shapes: set[str] = set()
        for index in range(len(pods) if self._permute else 1):
            shape = pod_shape(pods[index])
            if shape in shapes:
                continue
            shapes.add(shape)
            if self._place_on_some_node(pods[index], [*pods[:index], *pods[index + 1 :]]):
                return True
        return False

    def _place_on_some_node(self, pod: Pod, rest: Sequence[Pod]) -> bool:
        key = pod_key(pod)
        empty_seen: set[tuple[str, str, str, str]] = set()
        for name in self._names:
            option = self._new.get(name)
            if option is not None and not self._engine.overlay.nodes[name].pods:
                if option in empty_seen:
                    continue
                empty_seen.add(option)
            if self.placements >= self._budget:
                raise _Spent
            self.placements += 1
            decision = self._engine.schedule(held(pod, name), self._now)
            if not decision.scheduled:
                self._engine.rollback(key)
                continue
            self.where[key] = name
            if self._place(rest):
                return True
            self._engine.unplace([key])
            del self.where[key]
        return False
