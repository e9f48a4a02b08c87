"""Which waiting pods the autoscaler plans for, as the what-if's units.

A pod of this scheduler is planned for when it waits (parked unschedulable: no node holds
it, preemption included) and nothing of it is in the books (no reservation, no hold), or
when it was planned on a node already requested. Left out:

- pods Karpenter's own simulation serves: every resource they ask for is a standard one or
  one an instance type lists (whole ``nvidia.com/gpu``), and they carry no HAMi annotation
  (card type, UUID, NUMA...) that Karpenter would not honour. Karpenter provisions for them;
  a node is never asked for twice.

Pods with ResourceClaims are planned like the others (Karpenter's own simulation passes
over them: it ignores pods with DRA requests), their claims fitted by the claims dialect.
A claim still to be made from a ResourceClaimTemplate is taken as the claim controller
would make it (``claim_templates``): the unit carries it, and the pod as the controller
leaves it; a pod whose template is not there is left out, told which.

A PodGroup's waiting members form one unit (its spec and members as the worker decides
them, ``gang_runtime.GangRuntime.group_input``). At most ``limit`` units, the most
important first (priority, then age).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Final, cast

import structlog

from vgpu_operator.control import gang_runtime
from vgpu_operator.devices import catalog
from vgpu_operator.scheduling import preemption
from vgpu_operator.scheduling.autoscale.whatif import Unit
from vgpu_operator.scheduling.dialects.claims import claim_templates
from vgpu_operator.scheduling.gangs import GroupError
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.wire import Pod, ResourceClaim, ResourceClaimTemplate, meta_of

log = structlog.get_logger("vgpu_operator.autoscaler")

#: The most ResourceClaimTemplates one round reads (pods whose claims are still to be made).
TEMPLATE_READS: Final = 16
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


async def read_templates(
    read: Callable[[str, str], Awaitable[Mapping[str, Any] | None]], pods: Iterable[Pod]
) -> dict[str, ResourceClaimTemplate]:
    """The ResourceClaimTemplates of the pods whose claims the claim controller has not
    made yet (a moment after their creation), by ``namespace/name``: at most
    ``TEMPLATE_READS`` a round; one that cannot be read is left out (its pods are told it
    was not found), it stops no round."""
    return await read_template_keys(read, template_keys(pods))


async def read_template_keys(
    read: Callable[[str, str], Awaitable[Mapping[str, Any] | None]], keys: Sequence[str]
) -> dict[str, ResourceClaimTemplate]:
    """The ResourceClaimTemplates ``keys`` (``namespace/name``), the first
    ``TEMPLATE_READS`` of them; one that cannot be read is left out."""
    found: dict[str, ResourceClaimTemplate] = {}
    for key in keys[:TEMPLATE_READS]:
        namespace, name = key.split("/", 1)
        try:
            template = await read(namespace, name)
        except Exception as exc:
            log.debug("autoscale_template_unread", template=key, error=str(exc))
            continue
        if template is not None:
            found[key] = cast(ResourceClaimTemplate, template)  # as the API server read it
    return found


def template_keys(pods: Iterable[Pod]) -> list[str]:
    """The ``namespace/name`` of the templates whose claims the pods wait for, each once."""
    found: dict[str, None] = {}
    for pod in pods:
        namespace = meta_of(pod).get("namespace") or "default"
        for template in claim_templates.pending_templates(pod).values():
            found[f"{namespace}/{template}"] = None
    return list(found)


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
    templates: Mapping[str, ResourceClaimTemplate] | None = None,
) -> tuple[list[Unit], dict[PodKey, str]]:
    """The units to plan for, and the pods left out with why (Karpenter's, bounds, a
    template not found). ``templates``: the ResourceClaimTemplates the pods' claims still
    to be made come from, by ``namespace/name``."""
    singles: list[Pod] = []
    groups: dict[str, Pod] = {}
    left: dict[PodKey, str] = {}
    for pod in sorted(waiting, key=_importance):
        key = pod_key(pod)
        if in_books(key) or not (parked(key) or key in planned):
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
            unit = _with_claims(unit, templates or {}, left)
        if unit is not None:
            units.append(unit)
    return units, left


def _single(pod: Pod, pins: Mapping[PodKey, str]) -> Unit:
    key = pod_key(pod)
    return Unit(str(key), (pod,), pinned=pins.get(key))


def _with_claims(
    unit: Unit, templates: Mapping[str, ResourceClaimTemplate], left: dict[PodKey, str]
) -> Unit | None:
    """The unit with its pods' template claims still to be made, as the claim controller
    would make them; None (each pod told why) when a template is not there."""
    if not any(claim_templates.pending_templates(p) for p in unit.pods):
        return unit
    pods: list[Pod] = []
    claims: list[ResourceClaim] = []
    for pod in unit.pods:
        made = claim_templates.with_template_claims(pod, templates)
        if isinstance(made, str):
            for key in unit.keys:
                left[key] = f"{made}: it cannot be planned for"
            return None
        pods.append(made[0])
        claims.extend(made[1])
    return dataclasses.replace(unit, pods=tuple(pods), claims=tuple(claims))


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
