"""Priority preemption at device level: kube-scheduler's DefaultPreemption with our Fit.

Pure functions over an abstract "does the preemptor fit on this node with these pods
removed" callable, so that the rules read as kube-scheduler states them
(``pkg/scheduler/framework/plugins/defaultpreemption``, ``framework/preemption``):

- ``eligible``: a pod whose ``preemptionPolicy`` is ``Never`` never preempts.
- ``select_victims``: on one node, take out every pod of strictly lower priority; if the
  preemptor still does not fit the node is no candidate; otherwise put pods back one by
  one, most important first (higher priority, then earlier start), those whose eviction
  would violate a PodDisruptionBudget before the others, keeping each back whenever the
  preemptor still fits. What stays out are the victims.
- ``pick_node``: among candidates, fewest budget violations; then the lowest priority of
  the most important victim; then the smallest sum of priorities; then the fewest
  victims; then the latest start among the most important victims; then node order.
- ``candidate_limit``: how many candidate nodes are enough before choosing. kube-scheduler
  stops its dry run at 10 % of the nodes (at least 100), searching 16 nodes at a time;
  one thread here stops at 100 (its ``minCandidateNodesPercentage: 0``), which keeps a
  preemption at 5,000 nodes near a second.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.preemption import disruption
from vgpu_operator.wire import Pod

#: kube-scheduler sums priorities offset by this, so negative priorities compare sanely.
_PRIORITY_OFFSET = 2**31
_CANDIDATES = 100


@dataclass(frozen=True, slots=True)
class Occupant:
    """A pod holding devices on a node, as preemption weighs it."""

    key: PodKey
    priority: int
    started: float | None  # epoch seconds of status.startTime; None: not started yet
    labels: Mapping[str, str]

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[1]

    @property
    def start_rank(self) -> float:
        # kube-scheduler reads a missing start time as "now": later than any real one.
        return math.inf if self.started is None else self.started


def importance(pod: Occupant) -> tuple[int, float]:
    """Sort key, most important first: higher priority, then earlier start."""
    return (-pod.priority, pod.start_rank)


@dataclass(frozen=True, slots=True)
class Victims:
    """The pods to evict on one node (most important first) and how many of them
    violate a PodDisruptionBudget."""

    pods: tuple[Occupant, ...]
    budget_violations: int

    @property
    def keys(self) -> frozenset[PodKey]:
        return frozenset(p.key for p in self.pods)


def priority_of(pod: Pod) -> int:
    """``spec.priority`` as admission resolved it from the PriorityClass (0 when unset)."""
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def eligible(pod: Pod) -> bool:
    return (pod.get("spec") or {}).get("preemptionPolicy") != "Never"


def select_victims(
    preemptor_priority: int,
    occupants: Sequence[Occupant],
    budgets: Sequence[disruption.Budget],
    fits_without: Callable[[frozenset[PodKey]], bool],
) -> Victims | None:
    """The victims on one node, or None when evicting every lower-priority pod would
    still not make room. ``fits_without(keys)``: the preemptor fits once ``keys`` leave."""
    potential = sorted((p for p in occupants if p.priority < preemptor_priority), key=importance)
    removed = {p.key for p in potential}
    if not potential or not fits_without(frozenset(removed)):
        return None
    identities = [disruption.PodIdentity(p.namespace, p.name, p.labels) for p in potential]
    violating, others = disruption.split_by_violation(identities, budgets)
    victims: list[Occupant] = []
    violations = 0
    for group, violates in ((violating, True), (others, False)):
        for position in group:
            pod = potential[position]
            removed.discard(pod.key)
            if fits_without(frozenset(removed)):
                continue  # reprieved: the preemptor fits with this pod staying
            removed.add(pod.key)
            victims.append(pod)
            violations += violates
    victims.sort(key=importance)
    return Victims(tuple(victims), violations)


@dataclass(frozen=True, slots=True)
class Candidate:
    node: str
    victims: Victims


def victims_key(victims: Victims) -> tuple[int, int, int, int, float]:
    """``pick_node``'s order of one node's victims (smaller is better)."""
    pods = victims.pods
    if not pods:
        return (0, -_PRIORITY_OFFSET, 0, 0, -math.inf)
    top = pods[0].priority
    earliest_top_start = min(p.start_rank for p in pods if p.priority == top)
    return (
        victims.budget_violations,
        top,
        sum(p.priority + _PRIORITY_OFFSET for p in pods),
        len(pods),
        -earliest_top_start,  # the latest start wins: it loses the least work
    )


def _choice_key(position: int, candidate: Candidate) -> tuple[int, int, int, int, float, int]:
    return (*victims_key(candidate.victims), position)


def pick_node(candidates: Sequence[Candidate]) -> Candidate | None:
    """kube-scheduler's ``pickOneNodeForPreemption``; ``candidates`` in node order."""
    if not candidates:
        return None
    best = min(range(len(candidates)), key=lambda i: _choice_key(i, candidates[i]))
    return candidates[best]


def candidate_limit(nodes_total: int) -> int:
    """How many candidates the search needs before it may stop (with at least one
    that violates no budget)."""
    return min(_CANDIDATES, nodes_total)


def identity(pod: Occupant) -> disruption.PodIdentity:
    return disruption.PodIdentity(pod.namespace, pod.name, pod.labels)


def blocked_message(chosen: Candidate, budgets: Sequence[disruption.Budget]) -> str:
    """Why a preemption is not made: the victims its budgets protect."""
    blocked = disruption.blocking_budgets([identity(p) for p in chosen.victims.pods], budgets)
    named = ", ".join(
        f"{pod.namespace}/{pod.name} (PodDisruptionBudget {budget.namespace}/{budget.name})"
        for pod, budget in blocked[:3]
    )
    more = f" and {len(blocked) - 3} more" if len(blocked) > 3 else ""
    return (
        f"Preemption would have to evict {named}{more} on node {chosen.node}, which "
        "the budget does not allow now; no pod was evicted."
    )
