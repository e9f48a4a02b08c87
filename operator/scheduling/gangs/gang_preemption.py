"""A gang that fits only by preempting: it preempts only if the whole gang then fits.

Tried after a gang did not fit as it stands (``gangs.decide_group``), when preemption is
on, for a gang without a topology constraint. Each waiting member is decided in turn by
the ordinary cycle with preemption allowed, so each member's victims are chosen with the
holds of the members before it in the books (no two members count on the same freed
shares; a PodGroup's member is a victim only one by one, of a ``single`` group:
``group_victims``). If every member the gang needs then fits or holds room its victims
free, the nominations are kept (their victims to evict) and the members that fitted as
things stand give their reservations back: the group binds whole on a later attempt, once
the victims are gone. Otherwise every reservation and nomination of the attempt is given
up and no one is evicted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vgpu_operator.scheduling.books import group_victims
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision
from vgpu_operator.scheduling.preemption import preemption
from vgpu_operator.wire import Pod


@dataclass(frozen=True, slots=True)
class Preempting:
    """Members whose victims are to be evicted (or still leaving), each holding the room
    they free; ``victims``: every pod to evict, once each."""

    nominated: tuple[Decision, ...]
    victims: tuple[str, ...]


def attempt(
    state: ClusterState,
    members: Sequence[Pod],
    need: int,
    now: float,
    priority: int | None = None,
) -> Preempting | None:
    """Preempt for the gang if the whole gang (``need`` members) then fits; None when it
    does not, with the books as before. ``priority``: the PodGroup's (None: no class
    named); each member preempts with the lower of it and its own (``member_priority``)."""
    if priority is not None:
        members = [_with_priority(m, priority) for m in members]
    fitted: list[Decision] = []
    nominated: list[Decision] = []
    spare = len(members) - need
    for pod in members:
        decision = state.schedule(pod, now)
        if decision.scheduled:
            fitted.append(decision)
        elif decision.nominated_node is not None:
            nominated.append(decision)
        else:
            spare -= 1
            if spare < 0:
                break
    keep = nominated and len(fitted) + len(nominated) >= need
    for decision in fitted:
        state.rollback(decision.pod)  # bound with the group once the victims are gone
    if not keep:
        for decision in nominated:
            state.cancel_preemption(decision.pod)
    state.books.forget_freed([d.pod for d in (*fitted, *([] if keep else nominated))])
    if not keep:
        return None
    victims = dict.fromkeys(v for d in nominated for v in d.victims)
    return Preempting(tuple(nominated), tuple(victims))


def member_priority(own: int, group_priority: int | None) -> int:
    """The priority a member preempts, is queued and is weighed as a victim with: the
    lower of its own resolved priority and its PodGroup's. The API server resolves a
    PodGroup's ``priority`` from the class it names but no quota scoped to priority
    classes counts PodGroups, so a tenant may name a class in a PodGroup that its pods may
    not use; taking the lower value means a group can slow its members, never lift them
    past the administrator's rules (upstream gives the members the group's priority:
    ``docs/gangs.md``; ``group_victims.member_priority``)."""
    return group_victims.member_priority(own, group_priority)


def _with_priority(pod: Pod, group_priority: int) -> Pod:
    """A copy of the member that preempts with the lower of its own priority and the
    group's (a PodGroup never lifts its members: ``member_priority``)."""
    own = preemption.priority_of(pod)
    lowered = member_priority(own, group_priority)
    if lowered == own:
        return pod
    return {**pod, "spec": {**(pod.get("spec") or {}), "priority": lowered}}
