"""Gangs: the pods of an upstream PodGroup (``scheduling.k8s.io/v1beta1``) decided as one unit.

A pod joins a group with ``spec.schedulingGroup.podGroupName``; the PodGroup's
``spec.schedulingPolicy`` is ``gang: {minCount}`` (no member is bound until ``minCount``
members can be placed at once) or ``basic: {}`` (pod by pod). ``decide_group`` runs the
ordinary decision cycle (``ClusterState.schedule``, either dialect) for each waiting member
in turn, each reservation in the live books so that the next member cannot take the same
shares. If fewer than the members the gang still needs fit, every reservation of the
attempt is rolled back before it returns: a group that waits holds nothing, so two groups
that each fit alone never deadlock. The members that fit are returned reserved, to be bound
(``confirm``) or, on a failed Binding, released (``rollback``) and the group tried again;
members already bound count toward ``minCount``, and once it is reached later members are
placed one by one, as kube-scheduler does.

A topology constraint (``spec.schedulingConstraints.topology[0].key``, a node label) keeps
the whole group in one domain of that label: the domains are tried in the order of their
best-ranked node under the node policy (binpack: the fullest first; spread: the emptiest),
and the first domain that holds the group is taken. A member is held to a domain by a
``nodeSelector`` term added to a copy of the pod, so the node gate of either dialect rules
the other domains out.

Preemption is off while a gang's members are tried: a member may not evict for a group that
will not fit whole (preemption by gangs is not built yet).

The engine a group is decided on is ``GroupEngine``: the live ``ClusterState``, or
autoscaling's what-if (``autoscale``), which decides a group the same way on an overlay of
the books with nodes that do not exist yet (and never preempts).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final, Protocol

from vgpu_operator.scheduling.books import group_victims
from vgpu_operator.scheduling.books.entries import NodeEntry
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision
from vgpu_operator.scheduling.gangs import gang_preemption
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.scheduling.status import Diagnosis
from vgpu_operator.wire import Pod, PodGroup, PodGroupSpec

API_VERSION: Final = "scheduling.k8s.io/v1beta1"
#: The condition the group's scheduler writes on the PodGroup, and its reasons.
INITIALLY_SCHEDULED: Final = "PodGroupInitiallyScheduled"
REASON_UNSCHEDULABLE: Final = "Unschedulable"
REASON_SCHEDULER_ERROR: Final = "SchedulerError"
REASON_SCHEDULED: Final = "Scheduled"


class GroupBooks(Protocol):
    """What deciding a group reads of the books (``Books``, or a what-if's overlay)."""

    @property
    def nodes(self) -> Mapping[str, NodeEntry]: ...
    def rerank(self) -> None: ...
    def ranking(self, pod_node_policy: str | None) -> Iterable[tuple[float, int, str]]: ...
    def forget_freed(self, keys: Iterable[PodKey]) -> None: ...


class GroupEngine(Protocol):
    """What deciding a group uses of the engine (``ClusterState``, or a what-if's)."""

    preemption_enabled: bool

    @property
    def books(self) -> GroupBooks: ...
    def schedule(self, pod: Pod, now: float, explain: bool = False) -> Decision: ...
    def rollback(self, key: PodKey) -> None: ...


class GroupError(ValueError):
    """A PodGroup (or its members) the engine cannot honour; the message says why."""


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What the engine reads of a PodGroup."""

    key: str  # namespace/name
    gang: bool
    min_count: int
    topology_key: str | None = None
    #: ``disruptionMode: all``: the group is evicted (or moved) whole or not at all.
    disruption_all: bool = False
    #: ``priority`` of a PodGroup that names a ``priorityClassName`` (admission resolves
    #: it from the class); None: no class named. It can only lower its members'
    #: priority, never lift it (``gang_preemption.member_priority``).
    priority: int | None = None
    #: ``preemptionPolicy: Never``: the group never preempts.
    never_preempts: bool = False


def group_of(pod: Pod) -> str | None:
    """The ``namespace/name`` of the PodGroup the pod names, or None."""
    spec = pod.get("spec") or {}
    group = spec.get("schedulingGroup")
    if not isinstance(group, Mapping):
        return None
    name = group.get("podGroupName")
    if not isinstance(name, str) or not name:
        return None
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    return f"{namespace}/{name}"


def read_pod_group(obj: PodGroup) -> GroupSpec:
    """The PodGroup's policy and constraints; ``GroupError`` names what is wrong."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise GroupError("the PodGroup has no name")
    key = f"{meta.get('namespace') or 'default'}/{name}"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise GroupError(f"PodGroup {key} has no spec")
    policy = spec.get("schedulingPolicy")
    if not isinstance(policy, Mapping) or ("gang" in policy) == ("basic" in policy):
        raise GroupError(f"PodGroup {key}: schedulingPolicy must be exactly one of basic, gang")
    gang = "gang" in policy
    min_count = 1
    if gang:
        gang_policy = policy.get("gang")
        raw = gang_policy.get("minCount") if isinstance(gang_policy, Mapping) else None
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            raise GroupError(f"PodGroup {key}: gang.minCount must be a positive integer")
        min_count = raw
    return GroupSpec(
        key,
        gang,
        min_count,
        _topology_key(key, spec),
        _disruption_all(spec),
        class_priority(obj),
        spec.get("preemptionPolicy") == "Never",
    )


def class_priority(obj: PodGroup) -> int | None:
    """The ``priority`` of a PodGroup that names a ``priorityClassName``, or None
    (``group_victims.class_priority``)."""
    return group_victims.class_priority(obj)


def _topology_key(key: str, spec: PodGroupSpec) -> str | None:
    constraints = spec.get("schedulingConstraints") or {}
    topology = constraints.get("topology") if isinstance(constraints, Mapping) else None
    if not topology:
        return None
    if not isinstance(topology, list) or len(topology) != 1:
        raise GroupError(f"PodGroup {key}: at most one topology constraint is allowed")
    label = topology[0].get("key") if isinstance(topology[0], Mapping) else None
    if not isinstance(label, str) or not label:
        raise GroupError(f"PodGroup {key}: a topology constraint needs a node label key")
    return label


def _disruption_all(spec: PodGroupSpec) -> bool:
    mode = spec.get("disruptionMode")
    return isinstance(mode, Mapping) and "all" in mode


@dataclass(frozen=True, slots=True)
class GroupDecision:
    """The outcome of one attempt at a group.

    ``placed``: members reserved in the books, each to be bound (``confirm``) or released
    (``rollback``). ``waiting``: the members left waiting, each with the group's reason.
    ``reason``: why the group (or its first members) waits, None when the attempt placed
    what it had to. ``hint``: the decision of the member that did not fit (its verdict is
    the group's queueing hint); None when the group waits for input, not for room.
    """

    group: str
    placed: tuple[Decision, ...] = ()
    waiting: tuple[Decision, ...] = ()
    reason: str | None = None
    domain: str | None = None
    hint: Decision | None = None
    #: How many members the attempt needed placed at once (0: none, pod by pod).
    needed: int = 0
    #: The nodes of members an attempt placed, for the group's record.
    nodes: Mapping[PodKey, str] = field(default_factory=dict)
    #: Members that preempt for the gang (``gang_preemption``): each holds the room its
    #: victims free; the group binds whole once they are gone.
    preempting: tuple[Decision, ...] = ()

    @property
    def unschedulable(self) -> bool:
        return self.reason is not None


def decide_group(
    state: GroupEngine,
    spec: GroupSpec | None,
    group: str,
    pending: Sequence[Pod],
    bound: Mapping[PodKey, str],
    now: float,
    scheduler_names: Sequence[str] = (),
) -> GroupDecision:
    """Decide the waiting members (``pending``) of the group ``group`` (``spec``: its
    PodGroup, None when missing), whose members already bound are ``bound`` (pod to node).
    ``scheduler_names``: every member's ``schedulerName``, bound or not (mixed names are
    refused, as upstream: one scheduler writes the group's status)."""
    members = sorted(pending, key=_member_order)
    problem = _input_problem(state, spec, group, members, bound, scheduler_names)
    if problem is not None or spec is None:
        reason = problem or f"PodGroup {group} does not exist"
        return refuse(state, group, members, reason, None)
    need = spec.min_count - len(bound) if spec.gang else 0
    if need > len(members):
        reason = (
            f"pod group {group} waits for its members: minCount {spec.min_count}, "
            f"{len(members) + len(bound)} exist"
        )
        return refuse(state, group, members, reason, None)
    hint: Decision | None = None
    best = 0
    tried = 0
    with _no_preemption(state):
        for domain in _domains(state, spec.topology_key, bound):
            tried += 1
            placed, failed, fitted = _attempt(state, spec, members, domain, max(need, 1), now)
            if placed:
                waiting = tuple(d for d in failed if not d.scheduled)
                rest = _waiting(members, placed, failed)
                return GroupDecision(
                    group,
                    tuple(placed),
                    waiting + rest,
                    domain=domain,
                    needed=max(need, 0),
                    nodes={d.pod: d.node or "" for d in placed},
                )
            best = max(best, fitted)
            if hint is None and failed:
                hint = failed[0]
    if not tried:
        reason = f"no node carries the label {spec.topology_key} of pod group {group}'s members"
        return refuse(state, group, members, reason, None)
    if (
        need > 0
        and spec.topology_key is None
        and state.preemption_enabled
        and isinstance(state, ClusterState)
    ):
        preempting = (
            None
            if spec.never_preempts
            else gang_preemption.attempt(state, members, need, now, spec.priority)
        )
        if preempting is not None:
            return _preempting(state, group, members, need, preempting)
    reason = _unschedulable_reason(spec, group, max(need, 1), best, hint)
    return refuse(state, group, members, reason, hint, needed=need)


def _preempting(
    state: GroupEngine,
    group: str,
    members: Sequence[Pod],
    need: int,
    preempting: gang_preemption.Preempting,
) -> GroupDecision:
    count = len(preempting.victims)
    reason = (
        f"pod group {group}: the {need} members it needs fit once {count} lower-priority "
        f"pod{'s' if count != 1 else ''} {'are' if count != 1 else 'is'} preempted"
    )
    holding = {d.pod for d in preempting.nominated}
    rest = refuse(state, group, [m for m in members if pod_key(m) not in holding], reason)
    return GroupDecision(
        group, (), rest.waiting, reason, needed=need, preempting=preempting.nominated
    )


def _member_order(pod: Pod) -> tuple[int, str]:
    priority = (pod.get("spec") or {}).get("priority")
    rank = -priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
    return rank, str((pod.get("metadata") or {}).get("name") or "")


def _input_problem(
    state: GroupEngine,
    spec: GroupSpec | None,
    group: str,
    members: Sequence[Pod],
    bound: Mapping[PodKey, str],
    scheduler_names: Sequence[str],
) -> str | None:
    names = set(scheduler_names) or {
        str((m.get("spec") or {}).get("schedulerName") or "default-scheduler") for m in members
    }
    if len(names) > 1:
        listed = ", ".join(sorted(names))
        return f"the members of pod group {group} name different schedulers ({listed})"
    if spec is None:
        return f"PodGroup {group} does not exist"
    if spec.topology_key is not None and bound:
        values = {_label(state, node, spec.topology_key) for node in bound.values()}
        if len(values) > 1:
            return f"the bound members of pod group {group} span several {spec.topology_key}"
    return None


def _label(state: GroupEngine, node: str, key: str) -> str | None:
    entry = state.books.nodes.get(node)
    return None if entry is None else entry.facts.labels.get(key)


def _domains(
    state: GroupEngine, key: str | None, bound: Mapping[PodKey, str]
) -> Iterator[str | None]:
    """The domains to try, best first (``None`` alone: no topology constraint), found as
    they are needed: the group usually fits in the first, the domain of the best-ranked
    node, so the ranking is read only as far as that node. The books are as before each
    time the next is asked for (an attempt that fell short rolled back), so the ranking
    is read again from the top, past the domains tried."""
    if key is None:
        yield None
        return
    if bound:
        value = _label(state, next(iter(bound.values())), key)
        if value is not None:
            yield value
        return
    tried: set[str] = set()
    while (value := _next_domain(state, key, tried)) is not None:
        tried.add(value)
        yield value
    # Nodes the ranking leaves out (no free card in its summary, or on the DRA path) may
    # still hold a member: their domains come after, by name.
    rest = {n.facts.labels.get(key) for n in state.books.nodes.values()} - tried - {None}
    yield from sorted(v for v in rest if v is not None)


def _next_domain(state: GroupEngine, key: str, tried: set[str]) -> str | None:
    view = state.books
    view.rerank()
    nodes = view.nodes
    for _, _, name in view.ranking(None):
        value = nodes[name].facts.labels.get(key)
        if value is not None and value not in tried:
            return value
    return None


def _in_domain(pod: Pod, key: str | None, value: str | None) -> Pod:
    if key is None or value is None:
        return pod
    spec = pod.get("spec") or {}
    selector = dict(spec.get("nodeSelector") or {})
    selector[key] = value
    return {**pod, "spec": {**spec, "nodeSelector": selector}}


def _attempt(
    state: GroupEngine,
    spec: GroupSpec,
    members: Sequence[Pod],
    domain: str | None,
    need: int,
    now: float,
) -> tuple[list[Decision], list[Decision], int]:
    """Reserve the members one after the other in ``domain``; if fewer than ``need`` fit,
    roll back every reservation (the books as before) and return none placed. Also: the
    members that did not fit, and how many did (before any rollback)."""
    placed: list[Decision] = []
    failed: list[Decision] = []
    spare = len(members) - need  # members that may fail before the attempt is lost
    for pod in members:
        if spec.topology_key is not None:
            selector = (pod.get("spec") or {}).get("nodeSelector") or {}
            if selector.get(spec.topology_key, domain) != domain:
                failed.append(_wait(state, pod_key(pod), "its nodeSelector names another domain"))
                spare -= 1
                if spare < 0:
                    break
                continue
        decision = state.schedule(_in_domain(pod, spec.topology_key, domain), now)
        if decision.scheduled:
            placed.append(decision)
            continue
        failed.append(decision)
        spare -= 1
        if spare < 0:
            break
    if len(placed) < need:
        release(state, [d.pod for d in placed])
        return [], failed, len(placed)
    return placed, failed, len(placed)


def release(state: GroupEngine, keys: Sequence[PodKey]) -> None:
    """Give back the reservations of ``keys`` (an attempt that fell short, or members whose
    Binding failed), leaving no trace in the room the queue hears was freed: a rollback of
    a reservation frees nothing that was free before the attempt."""
    for key in keys:
        state.rollback(key)
    state.books.forget_freed(keys)


def _waiting(
    members: Sequence[Pod], placed: Sequence[Decision], failed: Sequence[Decision]
) -> tuple[Decision, ...]:
    """Members the attempt never reached (it stopped once the group could not fit)."""
    done = {d.pod for d in placed} | {d.pod for d in failed}
    return tuple(Decision(pod_key(m), False) for m in members if pod_key(m) not in done)


def _unschedulable_reason(
    spec: GroupSpec, group: str, need: int, best: int, hint: Decision | None
) -> str:
    where = f" in one {spec.topology_key} domain" if spec.topology_key else ""
    why = ""
    if hint is not None and hint.diagnosis is not None:
        why = f": {hint.diagnosis.message()}"
    elif hint is not None and hint.rejected:
        why = f": {hint.rejected}"
    return f"pod group {group}: {best} of the {need} members it needs fit at once{where}{why}"


def _wait(state: GroupEngine, key: PodKey, reason: str) -> Decision:
    return Decision(key, False, diagnosis=Diagnosis({}, len(state.books.nodes), error=reason))


def refuse(
    state: GroupEngine,
    group: str,
    members: Sequence[Pod],
    reason: str,
    hint: Decision | None = None,
    needed: int = 0,
) -> GroupDecision:
    """Every member waits with ``reason``, nothing placed (bad input, or no room)."""
    waiting = tuple(_wait(state, pod_key(m), reason) for m in members)
    return GroupDecision(group, (), waiting, reason, hint=hint, needed=max(needed, 0))


@contextmanager
def _no_preemption(state: GroupEngine) -> Iterator[None]:
    before = state.preemption_enabled
    state.preemption_enabled = False
    try:
        yield
    finally:
        state.preemption_enabled = before
