"""NodeClaims as the autoscaler writes and reads them (pure).

A node the engine asks for is a NodeClaim of its NodePool, made as Karpenter's provisioner
makes one from the pool's template (``NodeClaimTemplate.ToNodeClaim`` in its code): the
template's labels and annotations, the pool's label, its NodeClass label and hash
annotations (so that Karpenter's drift and consolidation treat it as one of the pool's),
an owner reference to the pool, the template's taints, startup taints, NodeClass,
expiry and termination grace period, and the template's requirements narrowed to the
instance type, zone and capacity type the engine chose (one value each: the provider
launches exactly that). ``OWNED_LABEL`` marks it as the operator's (its node carries the
label too, as Karpenter copies a claim's labels onto its node).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from vgpu_operator.scheduling.autoscale import catalogue
from vgpu_operator.scheduling.autoscale.catalogue import (
    CAPACITY_TYPE_LABEL,
    INSTANCE_TYPE_LABEL,
    NODE_POOL_LABEL,
    ZONE_LABEL,
    NodeOption,
)
from vgpu_operator.timestamps import unix_time

#: On NodeClaims the operator asked for (and, copied by Karpenter, their nodes).
OWNED_LABEL: Final = "vgpu-operator.io/autoscaled"
#: The claim's own name, on it and (copied by Karpenter) on its node: the operator knows
#: the node for the claim the moment the node joins, before the claim's status says so.
CLAIM_LABEL: Final = "vgpu-operator.io/nodeclaim"
_HASH_ANNOTATIONS: Final = ("karpenter.sh/nodepool-hash", "karpenter.sh/nodepool-hash-version")
#: Template fields a NodeClaim takes as they are.
_COPIED_SPEC: Final = (
    "taints",
    "startupTaints",
    "nodeClassRef",
    "expireAfter",
    "terminationGracePeriod",
)


def claim_name(pool: str) -> str:
    """A new claim's name: the pool's, and a random suffix (as Karpenter's generateName)."""
    return f"{pool[:54]}-{secrets.token_hex(4)}"  # a label value too: 63 characters at most


def claim_manifest(option: NodeOption, pool: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The NodeClaim ``name`` for one new node of ``option``; ``pool`` is its NodePool."""
    meta = pool.get("metadata") or {}
    template = option.pool.template
    tmeta = template.get("metadata") or {}
    tspec = template.get("spec") or {}
    labels = {
        **(tmeta.get("labels") or {}),
        NODE_POOL_LABEL: option.pool.name,
        OWNED_LABEL: "true",
        CLAIM_LABEL: name,
    }
    ref = tspec.get("nodeClassRef") or {}
    if ref.get("group") and ref.get("kind") and ref.get("name"):
        labels[f"{ref['group']}/{str(ref['kind']).lower()}"] = str(ref["name"])
    annotations = dict(tmeta.get("annotations") or {})
    for key in _HASH_ANNOTATIONS:
        value = (meta.get("annotations") or {}).get(key)
        if value is not None:
            annotations[key] = value
    chosen = {
        INSTANCE_TYPE_LABEL: option.instance_type.name,
        ZONE_LABEL: option.offering.zone,
        CAPACITY_TYPE_LABEL: option.offering.capacity_type,
    }
    requirements = [dict(r) for r in tspec.get("requirements") or () if r.get("key") not in chosen]
    requirements += [
        {"key": key, "operator": "In", "values": [value]}
        for key, value in chosen.items()
        if value is not None
    ]
    spec: dict[str, Any] = {k: tspec[k] for k in _COPIED_SPEC if k in tspec}
    spec["requirements"] = requirements
    spec["resources"] = {}
    owner = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "name": option.pool.name,
        "uid": str(meta.get("uid") or ""),
    }
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner] if owner["uid"] else [],
        },
        "spec": spec,
    }


@dataclass(frozen=True, slots=True)
class NodeClaimFacts:
    """What the autoscaler reads of a NodeClaim."""

    name: str
    ours: bool
    pool: str | None
    instance_type: str | None
    zone: str | None
    capacity_type: str | None
    #: The node it became (``status.nodeName``), once launched.
    node: str | None
    created: float | None
    deleting: bool
    #: Why Karpenter could not launch it, if it said so (its Launched condition).
    failure: str | None
    #: Karpenter initialised its node (registered, Ready, startup taints gone).
    initialized: bool = False

    @property
    def option_key(self) -> tuple[str, str, str, str]:
        return (
            self.pool or "",
            self.instance_type or "",
            self.zone or "",
            self.capacity_type or "",
        )


def read_claim(obj: Mapping[str, Any]) -> NodeClaimFacts | None:
    """A NodeClaim object as the autoscaler reads it (None: no name)."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    labels = meta.get("labels") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    chosen = _single_values(spec.get("requirements") or ())
    created = meta.get("creationTimestamp")
    failure = None
    initialized = False
    for condition in status.get("conditions") or ():
        kind, state = condition.get("type"), condition.get("status")
        if kind == "Launched" and state == "False":
            failure = str(condition.get("message") or condition.get("reason") or "not launched")
        initialized = initialized or (kind == "Initialized" and state == "True")
    return NodeClaimFacts(
        name=name,
        ours=labels.get(OWNED_LABEL) == "true",
        pool=labels.get(NODE_POOL_LABEL),
        instance_type=labels.get(INSTANCE_TYPE_LABEL) or chosen.get(INSTANCE_TYPE_LABEL),
        zone=labels.get(ZONE_LABEL) or chosen.get(ZONE_LABEL),
        capacity_type=labels.get(CAPACITY_TYPE_LABEL) or chosen.get(CAPACITY_TYPE_LABEL),
        node=status.get("nodeName") or None,
        created=unix_time(created),
        deleting=bool(meta.get("deletionTimestamp")),
        failure=failure,
        initialized=initialized,
    )


def _single_values(requirements: Any) -> dict[str, str]:
    values: dict[str, str] = {}
    for r in requirements:
        if isinstance(r, Mapping) and r.get("operator") == "In" and len(r.get("values") or ()) == 1:
            values[str(r.get("key"))] = str(r["values"][0])
    return values


def with_claims_counted(
    options: Sequence[catalogue.NodeOption],
    claims: Sequence[NodeClaimFacts],
    types: Sequence[catalogue.InstanceType],
) -> list[catalogue.NodeOption]:
    """The options with each NodePool's use counted from its claims too (whoever made
    them: its status catches up with new claims only later), the larger of the two."""
    capacity = {t.name: t.capacity for t in types}
    counted: dict[str, dict[str, Fraction]] = {}
    for claim in claims:
        if claim.pool is None or claim.deleting:
            continue
        use = counted.setdefault(claim.pool, {})
        for resource, amount in {
            **capacity.get(claim.instance_type or "", {}),
            catalogue.NODES_LIMIT: Fraction(1),
        }.items():
            use[resource] = use.get(resource, Fraction(0)) + amount
    pools: dict[str, catalogue.NodePool] = {}
    out: list[catalogue.NodeOption] = []
    for option in options:
        pool = pools.get(option.pool.name)
        if pool is None:
            use = counted.get(option.pool.name, {})
            used = {
                k: max(option.pool.used.get(k, Fraction(0)), use.get(k, Fraction(0)))
                for k in {*option.pool.used, *use}
            }
            pool = dataclasses.replace(option.pool, used=used)
            pools[pool.name] = pool
        out.append(dataclasses.replace(option, pool=pool))
    return out
