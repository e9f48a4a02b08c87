"""Holding, on the nodes the autoscaler asked for, the shares of the pods planned there.

Once a requested node is in the books with its inventory, each pod planned on it gets its
shares held there in the plan's order (``DefragBooks.hold``: the hold a preemptor gets,
through the pod's dialect, so a pod with claims has its claims' devices held) and is
woken; the worker binds it.

A gang (PodGroup) is held whole: its members planned on new nodes are held only once every
one of those nodes has arrived, all in one go; if one member does not fit (the node came
with fewer cards than its type said, another pod took its place), the members held in that
go are given back and the gang is tried again on the next arrival or round. So no partial
gang is ever nominated into new nodes while the rest of its nodes are still on their way
(or never come: the claim is withdrawn and the gang planned again from nothing held).

A node has not arrived while Karpenter has not registered it yet (its
``karpenter.sh/unregistered`` taint, which none of our pods tolerates), while it is not
Ready, or while it carries a startup taint of its NodePool: until then no pod would be
placed there, and its NodeClaim is a node on its way to the plans, with the room the pods
planned on it leave free (a pod arriving meanwhile is planned onto that room, not given a
node of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from vgpu_operator.control import gang_runtime
from vgpu_operator.scheduling.node_basics import NodeFacts
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.wire import Pod

#: The taint Karpenter puts on a node it has not registered yet (removed once it has).
UNREGISTERED_TAINT: Final = "karpenter.sh/unregistered"


def takes_pods(node: NodeFacts, template: Mapping[str, Any]) -> bool:
    """Whether a node Karpenter made for a claim of ours takes pods yet: Ready, registered,
    none of its NodePool ``template``'s startup taints left (see the module)."""
    if not node.ready:
        return False
    startup = {
        (t.get("key"), t.get("effect"))
        for t in (template.get("spec") or {}).get("startupTaints") or ()
        if isinstance(t, Mapping)
    }
    for taint in node.taints:
        if taint.get("key") == UNREGISTERED_TAINT:
            return False
        if (taint.get("key"), taint.get("effect")) in startup:
            return False
    return True


@dataclass(frozen=True, slots=True)
class Planned:
    """A pod planned on a requested node: its key, and the node the request became (None
    while it is on its way)."""

    key: PodKey
    node: str | None


def hold_arrived(
    planned: Iterable[Planned],
    *,
    pending: Callable[[PodKey], Pod | None],
    in_books: Callable[[PodKey], bool],
    hold: Callable[[Pod, str], bool],
    release: Callable[[PodKey], None],
) -> list[PodKey]:
    """Hold the pods whose node has arrived (see the module docstring); gives the keys
    held, in plan order. ``hold(pod, node)`` says whether the shares could be held;
    ``release(key)`` gives a hold back."""
    singles: list[tuple[Planned, Pod]] = []
    gangs: dict[str, list[tuple[Planned, Pod]]] = {}
    for one in planned:
        pod = pending(one.key)
        if pod is None or in_books(one.key):
            continue  # gone, bound, or held already
        group = gang_runtime.GangRuntime.group_of(pod)
        if group is not None:
            gangs.setdefault(group, []).append((one, pod))
        elif one.node is not None:
            singles.append((one, pod))
    held = [one.key for one, pod in singles if one.node is not None and hold(pod, one.node)]
    for members in gangs.values():
        held.extend(_hold_whole(members, hold, release))
    return held


def _hold_whole(
    members: Sequence[tuple[Planned, Pod]],
    hold: Callable[[Pod, str], bool],
    release: Callable[[PodKey], None],
) -> list[PodKey]:
    """All of the gang's members planned on new nodes, or none of them."""
    if not all(one.node for one, _ in members):
        return []  # a node of the gang is still on its way
    done: list[PodKey] = []
    for one, pod in members:
        if not hold(pod, str(one.node)):
            for key in done:
                release(key)
            return []
        done.append(one.key)
    return done
