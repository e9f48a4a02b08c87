"""Pods whose ResourceClaims ask for this driver's DeviceClasses go to this scheduler.

The books and the namespace quota hold only for what this scheduler allocates: a claim of
``gpu.vgpu-operator.io`` (or its siblings) that kube-scheduler allocates is placed on the
same cards with no quota check. So the webhook reads the claims and templates a pod names
(``spec.resourceClaims``) and, when one asks for one of ``OUR_CLASSES``:

- a pod naming no scheduler (or ``default-scheduler``) is routed to this one;
- a pod naming this scheduler is left as it is;
- a pod naming another scheduler is refused with a sentence saying what to change;
- a pod bound by its creator (``nodeName``) is left as it is: nothing allocates its claims
  (kubelet runs a pod only on claims reserved for it), so it holds nothing.

A claim or template the pod names that does not exist yet is let through unchanged: which
class it will ask for cannot be known, and refusing would break every other DRA driver's
users who create a pod before its claims. Such a pod cannot take our devices past the
quota all the same: manifests/claim-policy.yaml (``vgpu-claim-allocations``) lets only
the operator write an allocation of our driver, so kube-scheduler's attempt is refused
with a sentence (recreate the pod after its claims, or name this scheduler), and the pod
waits. Reading is bounded: at most
``MAX_CLAIM_READS`` objects per pod (a pod names at most that many), and the reading
stops at the first one that asks for our classes.

Pure: the caller reads the objects (``kube/claims.read_pod_claims``) and passes them in.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from vgpu_operator import names
from vgpu_operator.devices import dra
from vgpu_operator.wire import Pod, ResourceClaim, ResourceClaimTemplate

#: This driver's DeviceClasses (manifests/dra-deviceclasses.yaml).
OUR_CLASSES: Final = frozenset({dra.SHARED_CLASS, dra.EXCLUSIVE_CLASS, dra.MIG_CLASS})
#: The most claims and templates read for one pod (the API allows a pod 32 entries).
MAX_CLAIM_READS: Final = 32

CLAIM: Final = "ResourceClaim"
TEMPLATE: Final = "ResourceClaimTemplate"


@dataclass(frozen=True, slots=True, order=True)
class ClaimRef:
    """One object a pod's ``spec.resourceClaims`` names."""

    kind: str  # CLAIM or TEMPLATE
    name: str


class Action(enum.Enum):
    PASS = "pass"  # none of our classes, or already ours: unchanged
    ROUTE = "route"  # schedulerName set to ours
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class Routing:
    action: Action
    message: str = ""


def claim_refs(pod: Pod) -> list[ClaimRef]:
    """The claims and templates the pod names, each once, in the pod's order."""
    out: list[ClaimRef] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if not isinstance(entry, Mapping):
            continue
        if entry.get("resourceClaimName"):
            ref = ClaimRef(CLAIM, str(entry["resourceClaimName"]))
        elif entry.get("resourceClaimTemplateName"):
            ref = ClaimRef(TEMPLATE, str(entry["resourceClaimTemplateName"]))
        else:
            continue
        if ref not in out:
            out.append(ref)
    return out


def device_classes(obj: ResourceClaim | ResourceClaimTemplate, kind: str) -> set[str]:
    """The DeviceClasses a claim (or a template's claim) asks for, in every request and
    every alternative (``firstAvailable``)."""
    spec: object = obj.get("spec") or {}
    if kind == TEMPLATE:
        spec = spec.get("spec") or {} if isinstance(spec, Mapping) else {}
    devices = spec.get("devices") or {} if isinstance(spec, Mapping) else {}
    found: set[str] = set()
    for request in devices.get("requests") or () if isinstance(devices, Mapping) else ():
        if not isinstance(request, Mapping):
            continue
        alternatives = [request.get("exactly"), *(request.get("firstAvailable") or ())]
        for alternative in alternatives:
            if isinstance(alternative, Mapping) and alternative.get("deviceClassName"):
                found.add(str(alternative["deviceClassName"]))
    return found


def asks_our_classes(obj: ResourceClaim | ResourceClaimTemplate, kind: str) -> set[str]:
    return device_classes(obj, kind) & OUR_CLASSES


def route(
    pod: Pod,
    found: Iterable[tuple[ClaimRef, ResourceClaim | ResourceClaimTemplate | None]],
    scheduler: str,
) -> Routing:
    """What the webhook does with ``pod`` given the objects it names as read (None: not
    found). ``found`` may stop at the first object asking our classes."""
    spec = pod.get("spec") or {}
    ours: set[str] = set()
    for ref, obj in found:
        if obj is not None:
            ours |= asks_our_classes(obj, ref.kind)
    if spec.get("nodeName"):
        return Routing(Action.PASS)
    named = spec.get("schedulerName") or names.DEFAULT_SCHEDULER
    if not ours:
        # None of ours among those that exist (any not made yet: the allocation policy
        # keeps our devices from kube-scheduler if it turns out to be ours).
        return Routing(Action.PASS)
    if named == scheduler:
        return Routing(Action.PASS)
    if named == names.DEFAULT_SCHEDULER:
        return Routing(Action.ROUTE)
    classes = ", ".join(sorted(ours))
    return Routing(
        Action.REFUSE,
        f"the pod names schedulerName {named}, but its claims ask for DeviceClass {classes}, "
        f"which only {scheduler} allocates (so that the namespace's GPU quota holds); remove "
        f"schedulerName or set it to {scheduler}",
    )


def settled_without_reading(pod: Pod, scheduler: str) -> bool:
    """Whether the answer is PASS whatever the claims say: the pod names this scheduler
    (its claims are allocated here, a missing one waited for), or is bound by its
    creator. So a pod the webhook converted (the first hook; the API server then sends
    it to the claims hook too, with templates that a dry run did not make) costs no read."""
    spec = pod.get("spec") or {}
    return bool(spec.get("nodeName")) or spec.get("schedulerName") == scheduler


def too_many(refs: list[ClaimRef]) -> str | None:
    """A refusal when the pod names more objects than the webhook reads."""
    if len(refs) <= MAX_CLAIM_READS:
        return None
    return (
        f"the pod names {len(refs)} ResourceClaims and templates; the vgpu-operator webhook "
        f"reads at most {MAX_CLAIM_READS}"
    )
