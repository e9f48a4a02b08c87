"""Priority preemption at device level: kube-scheduler's DefaultPreemption with our Fit.

Pure functions over an abstract "does the preemptor fit on this node with these pods
removed" callable, so that the rules read as kube-scheduler states them
(``pkg/scheduler/framework/plugins/defaultpreemption``, ``framework/preemption``):

- ``eligible``: a pod whose ``preemptionPolicy`` is ``Never`` never preempts.
- ``select_victims``: on one node, take out every pod of strictly lower priority; if the
  preemptor still does not fit the node is no candidate; otherwise put pods back one by
  one, most important first (higher priority, then earlier start), those whose eviction
  would violate a PodDisruptionBudget before the others, keeping each back whenever the
  preemptor still fits. What stays out are the victims. A pod that may go only with its
  whole group (a PodGroup of ``disruptionMode: all``) is one victim set with every other
  member, on any node: taken out and put back together, weighed as its most important
  member, each member counted (and its budgets spent) as a victim.
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
    #: The PodGroup (``namespace/name``) it is evicted only with, whole; None: alone.
    group: str | None = None

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


#: Per PodGroup evicted only whole, every member the books hold (on any node).
Whole = Mapping[str, Sequence[Occupant]]


def select_victims(
    preemptor_priority: int,
    occupants: Sequence[Occupant],
    budgets: Sequence[disruption.Budget],
    fits_without: Callable[[frozenset[PodKey]], bool],
    whole: Whole | None = None,
) -> Victims | None:
    """The victims on one node, or None when evicting every lower-priority pod would
    still not make room. ``fits_without(keys)``: the preemptor fits once ``keys`` leave
    (members of a whole group on other nodes among them). ``whole``: the members of each
    group an occupant names (``Occupant.group``)."""
    potential = [
        u for u in _units(occupants, whole or {}) if _unit_priority(u) < preemptor_priority
    ]
    potential.sort(key=_unit_importance)
    removed = {p.key for unit in potential for p in unit}
    if not potential or not fits_without(frozenset(removed)):
        return None
    flat = [p for unit in potential for p in unit]
    violating_members, _ = disruption.split_by_violation([identity(p) for p in flat], budgets)
    violates = set(violating_members)
    counts: list[int] = []
    start = 0
    for unit in potential:
        counts.append(sum(1 for i in range(start, start + len(unit)) if i in violates))
        start += len(unit)
    order = [i for i in range(len(potential)) if counts[i]]
    order += [i for i in range(len(potential)) if not counts[i]]
    victims: list[Occupant] = []
    violations = 0
    for index in order:
        unit = potential[index]
        keys = {p.key for p in unit}
        removed -= keys
        if fits_without(frozenset(removed)):
            continue  # reprieved: the preemptor fits with this pod (or group) staying
        removed |= keys
        victims.extend(unit)
        violations += counts[index]
    victims.sort(key=importance)
    return Victims(tuple(victims), violations)


def _units(occupants: Sequence[Occupant], whole: Whole) -> list[tuple[Occupant, ...]]:
    """The occupants as victim sets: a pod alone, or every member of a whole group."""
    units: list[tuple[Occupant, ...]] = []
    seen: set[str] = set()
    for pod in occupants:
        if pod.group is None:
            units.append((pod,))
        elif pod.group not in seen:
            seen.add(pod.group)
            members = whole.get(pod.group)
            if not members:
                members = [o for o in occupants if o.group == pod.group]
            units.append(tuple(sorted(members, key=importance)))
    return units


def _unit_priority(unit: Sequence[Occupant]) -> int:
    return max(p.priority for p in unit)


def _unit_importance(unit: Sequence[Occupant]) -> tuple[int, int, float, str]:
    """Most important first: its most important member's priority; then, among sets of
    that priority, the larger first (it would cost more victims: put back first, it is
    kept where a smaller one makes room); then that member's earlier start (a pod alone:
    as ``importance``), then the key for a stable order."""
    first = unit[0]  # members are sorted by importance
    return (-first.priority, -len(unit), first.start_rank, first.key)


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
    """Why a preemption is not made: the victims its budgets protect (a whole group's
    member named with its group)."""
    pods = chosen.victims.pods
    blocked = disruption.blocking_budgets([identity(p) for p in pods], budgets)
    groups = {p.key: p.group for p in pods}
    named: list[str] = []
    told: set[str] = set()
    for pod, budget in blocked:
        group = groups.get(PodKey(f"{pod.namespace}/{pod.name}"))
        if group is not None and group in told:
            continue
        where = f"PodDisruptionBudget {budget.namespace}/{budget.name}"
        if group is None:
            named.append(f"{pod.namespace}/{pod.name} ({where})")
            continue
        told.add(group)
        count = sum(1 for p in pods if p.group == group)
        named.append(
            f"pod group {group} ({count} member{'s' if count != 1 else ''}; "
            f"{where} protects its member {pod.namespace}/{pod.name})"
        )
    shown = ", ".join(named[:3])
    more = f" and {len(named) - 3} more" if len(named) > 3 else ""
    return (
        f"Preemption would have to evict {shown}{more} on node {chosen.node}, which "
        "the budget does not allow now; no pod was evicted."
    )


def shielded_message(chosen: Candidate, priority: int, shielded: Mapping[str, int]) -> str | None:
    """Why a preemption is not made although the node has room once a whole group goes:
    the group (of ``shielded``: group -> its priority as a victim) is not of lower
    priority than the preemptor (``priority``)."""
    group = next((p.group for p in chosen.victims.pods if p.group in shielded), None)
    if group is None:
        return None
    count = sum(1 for p in chosen.victims.pods if p.group == group)
    return (
        f"Preemption would have to evict pod group {group} ({count} "
        f"member{'s' if count != 1 else ''}) on node {chosen.node}, whose priority "
        f"{shielded[group]} is not lower than this pod's {priority}; no pod was evicted."
    )
