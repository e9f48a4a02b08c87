"""Which waiting pods the autoscaler plans for, as the what-if's units.

A pod of this scheduler is planned for when it waits (parked unschedulable: no node holds
it, preemption included) and nothing of it is in the books (no reservation, no hold), or
when it was planned on a node already requested. Left out:

- pods Karpenter's own simulation serves: every resource they ask for is a standard one or
  one an instance type lists (whole ``nvidia.com/gpu``), and they carry no HAMi annotation
  (card type, UUID, NUMA...) that Karpenter would not honour. Karpenter provisions for them;
  a node is never asked for twice.
- pods with ResourceClaims (the DRA path is not planned on an overlay yet).

A PodGroup's waiting members form one unit (its spec and members as the worker decides
them, ``gang_runtime.GangRuntime.group_input``). At most ``limit`` units, the most
important first (priority, then age).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Final

from vgpu_operator.control import gang_runtime
from vgpu_operator.devices import catalog
from vgpu_operator.scheduling import preemption
from vgpu_operator.scheduling.autoscale.whatif import Unit
from vgpu_operator.scheduling.gangs import GroupError
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.wire import Pod, meta_of

#: Resources every instance type has (a pod asking only for these and listed ones is
#: Karpenter's to serve).
STANDARD_RESOURCES: Final = frozenset({"cpu", "memory", "ephemeral-storage", "pods"})
#: Annotation domains of the scheduler's own rules (card types, UUIDs, NUMA, policies):
#: the vendors' (``nvidia.com/``...), HAMi's and ours.
_OWN_DOMAINS: Final = (*catalog.annotation_domains(), "hami.io/", "vgpu-operator.io/")


def karpenter_serves(pod: Mapping[str, Any], listed: Collection[str]) -> bool:
    """Whether Karpenter's simulation models the pod's needs exactly (see the module)."""
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return False
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if any(str(k).startswith(_OWN_DOMAINS) for k in annotations):
        return False
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        resources = container.get("resources") or {}
        for section in ("requests", "limits"):
            for name in resources.get(section) or {}:
                name = str(name)
                if name in STANDARD_RESOURCES or name.startswith("hugepages-"):
                    continue
                if name not in listed:
                    return False
    return True


def uses_claims(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def _importance(pod: Pod) -> tuple[int, str, str]:
    meta = meta_of(pod)
    return (
        -preemption.priority_of(pod),
        str(meta.get("creationTimestamp") or ""),
        str(pod_key(pod)),
    )


def gather(
    waiting: Iterable[Pod],
    *,
    planned: Collection[PodKey],
    parked: Callable[[PodKey], bool],
    in_books: Callable[[PodKey], bool],
    listed: Collection[str],
    gangs: gang_runtime.GangRuntime | None,
    pins: Mapping[PodKey, str],
    limit: int,
) -> tuple[list[Unit], dict[PodKey, str]]:
    """The units to plan for, and the pods left out with why (Karpenter's, DRA, bounds)."""
    singles: list[Pod] = []
    groups: dict[str, Pod] = {}
    left: dict[PodKey, str] = {}
    for pod in sorted(waiting, key=_importance):
        key = pod_key(pod)
        if in_books(key) or not (parked(key) or key in planned):
            continue
        if uses_claims(pod):
            left[key] = "pods with ResourceClaims are not planned for yet"
            continue
        if karpenter_serves(pod, listed):
            continue  # Karpenter's own simulation provisions for it
        group = gang_runtime.GangRuntime.group_of(pod)
        if group is None:
            singles.append(pod)
        else:
            groups.setdefault(group, pod)
    units: list[Unit] = []
    for pod in sorted([*singles, *groups.values()], key=_importance):
        if len(units) >= limit:
            left[pod_key(pod)] = f"more than {limit} units wait: planned in a later round"
            continue
        group = gang_runtime.GangRuntime.group_of(pod)
        unit = _single(pod, pins) if group is None else _group(group, gangs, pins, left)
        if unit is not None:
            units.append(unit)
    return units, left


def _single(pod: Pod, pins: Mapping[PodKey, str]) -> Unit:
    key = pod_key(pod)
    return Unit(str(key), (pod,), pinned=pins.get(key))


def _group(
    group: str,
    gangs: gang_runtime.GangRuntime | None,
    pins: Mapping[PodKey, str],
    left: dict[PodKey, str],
) -> Unit | None:
    if gangs is None:
        return None
    try:
        spec, pending, bound, names = gangs.group_input(group)
    except GroupError as exc:
        for pod in gangs.members(group):
            left[pod_key(pod)] = str(exc)
        return None
    if spec is None or not pending:
        return None
    pinned = {pins.get(pod_key(p)) for p in pending}
    pin = pinned.pop() if len(pinned) == 1 else None
    return Unit(group, tuple(pending), spec, bound, tuple(names), pin)
