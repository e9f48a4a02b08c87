"""A PodGroup's own ResourceClaims (``spec.resourceClaims``, the DRAWorkloadResourceClaims
gate, 1.37 beta): claims shared by the group, allocated once and reserved for the group.

A PodGroup names at most four claims, each ``{name, resourceClaimName}`` or ``{name,
resourceClaimTemplateName}``. kube-controller-manager makes a template's claim for the
group (owned by it, named in ``status.resourceClaimStatuses``) and names it in the status
of every member whose own ``spec.resourceClaims`` has an entry that matches the group's
exactly (the same name and the same claim or template); a member's claim found so is a
*group claim*. As kube-scheduler does, the engine then:

- allocates a group claim once, for the first member it places, and reserves it for the
  PodGroup (``reservedFor``: ``scheduling.k8s.io`` ``podgroups``, its name and uid), not
  for the pod: the other members use it as allocated, on its node, without a write;
- within one gang attempt, a later member whose group claim an earlier member's decision
  is allocating uses that decision's devices (the claim is held once in the books) and
  its Binding waits until the allocation is written (``claim_binding``);
- never takes a group claim back when a member's Binding fails: it is the group's, and
  kube-controller-manager releases it when the PodGroup is deleted (then deallocates it
  and deletes a template's claim with its owner), as upstream.

Members of a PodGroup the operator has not read (or whose PodGroup names no such entry)
use their claims as any pod does. Pure: the PodGroup store (``control.gang_runtime``)
keeps ``Books.group_claims``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final, Protocol

from vgpu_operator.scheduling.books import claim_ledger
from vgpu_operator.scheduling.dialects.claims import claims
from vgpu_operator.wire import Pod, PodGroup, ResourceClaim

#: The ``reservedFor`` entry of a PodGroup (upstream's ``BindTo``).
API_GROUP: Final = "scheduling.k8s.io"
RESOURCE: Final = "podgroups"
#: ``MaxPodGroupResourceClaims`` of the 1.37 API: more entries are not read.
MAX_CLAIMS: Final = 4


@dataclass(frozen=True, slots=True)
class GroupClaims:
    """What the engine reads of a PodGroup's claims."""

    namespace: str
    name: str
    uid: str
    #: entry name -> (resourceClaimName, resourceClaimTemplateName), exactly one set.
    entries: Mapping[str, tuple[str | None, str | None]] = field(default_factory=dict)

    def consumer(self) -> dict[str, str]:
        """The group as a ``reservedFor`` entry."""
        return {"apiGroup": API_GROUP, "resource": RESOURCE, "name": self.name, "uid": self.uid}


def read(obj: PodGroup) -> GroupClaims | None:
    """The PodGroup's claims; None when it names none (or none readable). An entry that
    names neither or both of a claim and a template is left out (the API server refuses
    such an entry; a member naming it then uses its claim as its own)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    raw = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    if not isinstance(raw, list) or not raw:
        return None
    entries: dict[str, tuple[str | None, str | None]] = {}
    for entry in raw[:MAX_CLAIMS]:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        claim, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        if isinstance(claim, str) == isinstance(template, str):
            continue
        entries[entry["name"]] = (
            claim if isinstance(claim, str) else None,
            template if isinstance(template, str) else None,
        )
    if not entries:
        return None
    return GroupClaims(
        str(meta.get("namespace") or "default"),
        str(meta.get("name") or ""),
        str(meta.get("uid") or ""),
        entries,
    )


def of_pod(
    pod: Pod, registry: Mapping[str, GroupClaims]
) -> tuple[GroupClaims, frozenset[str]] | None:
    """The pod's group and the names of its claim entries that are the group's (matching
    an entry of the PodGroup exactly); None when it has none."""
    spec = pod.get("spec") or {}
    link = spec.get("schedulingGroup")
    name = link.get("podGroupName") if isinstance(link, Mapping) else None
    if not isinstance(name, str) or not registry:
        return None
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    group = registry.get(f"{namespace}/{name}")
    if group is None:
        return None
    matched = set()
    for entry in spec.get("resourceClaims") or ():
        if not isinstance(entry, Mapping):
            continue
        wanted = group.entries.get(str(entry.get("name")))
        if wanted is not None and wanted == (
            entry.get("resourceClaimName"),
            entry.get("resourceClaimTemplateName"),
        ):
            matched.add(str(entry["name"]))
    return (group, frozenset(matched)) if matched else None


def claim_keys(pod: Pod, entries: frozenset[str]) -> frozenset[str]:
    """The ``namespace/name`` of the claims the pod's entries ``entries`` resolve to (a
    template's through the pod's ``status.resourceClaimStatuses``)."""
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    made = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        if isinstance(s, Mapping)
    }
    keys = set()
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if not isinstance(entry, Mapping) or entry.get("name") not in entries:
            continue
        claim = entry.get("resourceClaimName") or made.get(str(entry.get("name")))
        if isinstance(claim, str) and claim:
            keys.add(f"{namespace}/{claim}")
    return frozenset(keys)


def reserved_groups(obj: ResourceClaim | None) -> frozenset[str]:
    """The ``namespace/name`` of the PodGroups a claim's ``status.reservedFor`` names."""
    if obj is None:
        return frozenset()
    namespace = (obj.get("metadata") or {}).get("namespace") or "default"
    reserved = (obj.get("status") or {}).get("reservedFor")
    if not isinstance(reserved, list):
        return frozenset()
    return frozenset(
        f"{namespace}/{r['name']}"
        for r in reserved
        if isinstance(r, Mapping)
        and r.get("resource") == RESOURCE
        and r.get("apiGroup") == API_GROUP
        and isinstance(r.get("name"), str)
    )


class DecidedHolds(Protocol):
    def decided_by_other(self, key: str, pod: str) -> claim_ledger.Hold | None: ...


def pin_to_decided(
    wanted: claims.PodClaims, keys: frozenset[str], pod: str, holds: DecidedHolds
) -> tuple[claims.PodClaims, frozenset[str]]:
    """The pod's claims with each group claim (``keys``) that another member's decision
    is allocating read as allocated where that decision put it (its devices are held
    once, under the claim); also the keys so pinned. Raises ``claims.Refusal`` when that
    puts the pod's claims on two nodes."""
    pinned: set[str] = set()
    read = []
    for claim in wanted.claims:
        hold = None
        if claim.key in keys and claim.allocated_node is None:
            hold = holds.decided_by_other(claim.key, pod)
        if hold is None:
            read.append(claim)
            continue
        pinned.add(claim.key)
        read.append(replace(claim, allocated_node=hold.node, allocated=hold.shares))
    if not pinned:
        return wanted, frozenset()
    nodes = {c.allocated_node for c in read if c.allocated_node is not None}
    if len(nodes) > 1:
        raise claims.Refusal(
            f"the pod's claims are allocated on different nodes ({', '.join(sorted(nodes))}); "
            "no node can run it"
        )
    pending = tuple(c for c in read if c.allocated_node is None)
    return replace(wanted, claims=tuple(read), node=next(iter(nodes)), pending=pending), frozenset(
        pinned
    )
