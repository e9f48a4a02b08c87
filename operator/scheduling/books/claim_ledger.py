"""What DRA claims hold of the cards: the books' side of the DRA path.

Every allocated ResourceClaim of this driver holds shares of its node's cards, whoever
allocated it (kube-scheduler, this operator, another scheduler): claim status can be
written only by whoever has RBAC on ``resourceclaims/status`` (schedulers, never
tenants), so an allocation there is believed as written; what it consumes is counted per
claim, once, however many pods it is reserved for. A restarted operator rebuilds all of
it from the claims it lists.

Between the engine's decision and the claim's allocated copy coming back through the
watch, the decision's own hold stands in for it (``Hold.decided``): a copy without the
allocation (the finalizer's update, or the watch lagging behind the status write) does
not drop it; once the status is written (``settle``), the next copy is the truth.

What an allocation holds is read as the agent will serve it: a claim whose opaque config
turns HAMi-core off (``hamiCore: false``, as ``agent.dra.prepare`` reads it) holds its
cards whole, for nothing limits what its containers take; a result with ``adminAccess``
holds nothing (Kubernetes consumes no capacity for it: it reaches a device beside the
claims that hold it, and only in namespaces an administrator labelled).

A claim that goes (deleted, or its allocation stripped) while a pod it was reserved for
still runs keeps its hold under another key (``kept_key``) until those pods end:
kubelet does not take a prepared device from a running container, so the share is still
in use whatever happened to the claim object (``claim_books``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Final

from vgpu_operator.devices import dra, model
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import claim_configs, claim_mig, claims
from vgpu_operator.wire import AllocationResult, ResourceClaim


class Decided(enum.Enum):
    NO = "no"  # read from the claim's status
    WRITING = "writing"  # the engine's decision; its status write is in flight
    WRITTEN = "written"  # written: the next copy of the claim replaces it


@dataclass(frozen=True, slots=True)
class Hold:
    key: str
    namespace: str
    node: str
    shares: tuple[claims.AllocatedShare, ...]
    decided: Decided = Decided.NO
    #: The pod whose decision made it (for a rollback).
    pod: str = ""


def bookings(hold: Hold, cards: Mapping[str, model.DeviceUsage]) -> list[placement.Booking]:
    """What the hold takes of each card; an amount the allocation does not name (or
    names unreadably) counts as the whole card's (fail closed)."""
    out = []
    for share in hold.shares:
        card = cards.get(share.device)
        if card is None:
            continue
        whole = share.memory_bytes is None and share.cores is None and share.shares is None
        memory = (
            card.total_memory_mib
            if share.memory_bytes is None
            else _ceil_div(share.memory_bytes, dra.MIB)
        )
        cores = card.total_cores if share.cores is None else _ceil_div(share.cores, 1)
        if whole:
            slots = card.count
        else:
            slots = 1 if share.shares is None else _ceil_div(share.shares, 1)
        out.append(placement.Booking(card.id, card.vendor, memory, cores, slots))
    return out


def hold_sums(
    hold: Hold, registered: Sequence[model.DeviceInfo], mig: claim_mig.MigNode | None
) -> dict[str, tuple[int, int]]:
    """What ``hold`` counts in its namespace's quota: the memory and cores it books on
    the node's cards (``registered``), and the memory of the MIG instances it holds."""
    cards = {d.id: model.DeviceUsage.from_info(d) for d in registered}
    booked = bookings(hold, cards)
    memory = sum(b.memory_mib for b in booked)
    if mig is not None:
        # A MIG instance counts its memory, as HAMi counts a MIG card's (no cores).
        memory += claim_mig.held_memory_mib(mig, (s.device for s in hold.shares))
    return {dra.VENDOR: (memory, sum(b.cores for b in booked))}


def _ceil_div(amount: Fraction, unit: int) -> int:
    """``amount / unit`` rounded up; in integers where the amount is whole (the usual
    case, and a hot one: preemption's trials read every hold of every candidate node)."""
    if amount.denominator == 1:
        return -(-amount.numerator // unit)
    return int(-(-amount // unit))


class ClaimLedger:
    """Holds by claim, and which claims hold cards of each node."""

    def __init__(self) -> None:
        self.holds: dict[str, Hold] = {}
        self.by_node: dict[str, set[str]] = {}
        #: Per pod, the claims its decision holds (until settled or rolled back).
        self.decided_for: dict[str, list[str]] = {}

    def put(self, hold: Hold) -> Hold | None:
        previous = self.drop(hold.key)
        self.holds[hold.key] = hold
        self.by_node.setdefault(hold.node, set()).add(hold.key)
        return previous

    def drop(self, key: str) -> Hold | None:
        hold = self.holds.pop(key, None)
        if hold is not None:
            keys = self.by_node.get(hold.node)
            if keys is not None:
                keys.discard(key)
        return hold

    def on_node(self, node: str) -> list[Hold]:
        return [self.holds[k] for k in sorted(self.by_node.get(node, ())) if k in self.holds]


CONFIG_HAMI_CORE: Final = claim_configs.CONFIG_HAMI_CORE
#: Joins a claim's key and uid in the key of a hold kept after the claim went.
KEPT_MARK: Final = "#kept:"


def hami_core_off(allocation: AllocationResult) -> bool:
    """Whether the agent will leave HAMi-core out for the allocation's claim: an opaque
    config of this driver (from the claim or its class) says ``hamiCore: false``, the
    claim's own config winning over its class's, as ``agent.dra.prepare`` reads it."""
    devices = allocation.get("devices")
    configs = devices.get("config") if isinstance(devices, Mapping) else None
    if not isinstance(configs, list):
        return False
    ordered = sorted(
        (c for c in configs if isinstance(c, Mapping)),
        key=lambda c: 0 if c.get("source") == "FromClass" else 1,
    )
    return claim_configs.turn_hami_core_off(ordered)


def _without_admin_access(allocation: AllocationResult) -> AllocationResult:
    """The allocation without its ``adminAccess`` results (they consume nothing)."""
    devices = allocation.get("devices")
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list):
        return allocation
    kept = [r for r in results if not (isinstance(r, Mapping) and r.get("adminAccess") is True)]
    if len(kept) == len(results):
        return allocation
    trimmed = (allocation.get("devices") or {}).copy()
    trimmed["results"] = kept
    out = allocation.copy()
    out["devices"] = trimmed
    return out


def hold_from_claim(obj: ResourceClaim) -> Hold | None:
    """The hold an allocated claim's status says, or None (not allocated, or nothing of
    this driver in it that consumes capacity)."""
    allocation = (obj.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        return None
    node, shares = claims.read_allocated(_without_admin_access(allocation))
    if node is None or not shares:
        return None
    if hami_core_off(allocation):
        # Nothing limits what its containers take: each card it names is theirs whole.
        shares = tuple(replace(s, memory_bytes=None, cores=None, shares=None) for s in shares)
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    return Hold(f"{namespace}/{meta.get('name', '')}", namespace, node, shares)


def reserved_uids(obj: ResourceClaim | None) -> frozenset[str]:
    """The uids of the pods a claim's ``status.reservedFor`` names."""
    if obj is None:
        return frozenset()
    reserved = (obj.get("status") or {}).get("reservedFor")
    if not isinstance(reserved, list):
        return frozenset()
    return frozenset(
        str(r["uid"])
        for r in reserved
        if isinstance(r, Mapping) and r.get("uid") and r.get("resource", "pods") == "pods"
    )


def kept_key(key: str, obj: ResourceClaim | None) -> str:
    """The key a claim's hold is kept under once the claim went: its uid tells it from a
    later claim of the same name (which holds under the plain key)."""
    uid = str(((obj or {}).get("metadata") or {}).get("uid") or "")
    return f"{key}{KEPT_MARK}{uid}"


def same_node_shares(shares: Iterable[claims.AllocatedShare], node: str) -> bool:
    return all(s.node == node for s in shares)


def decided_shares(node: str, picks: Sequence[Any]) -> tuple[claims.AllocatedShare, ...]:
    """A decision's picks (``claim_fit.DevicePick``) as the shares its status will name."""
    out = []
    for pick in picks:
        if pick.admin:
            continue  # adminAccess consumes nothing (its status says adminAccess: true)
        capacity = pick.consumption.capacity
        out.append(
            claims.AllocatedShare(
                request=pick.request,
                node=node,
                device=pick.device.name,
                memory_bytes=None if capacity is None else capacity.get(dra.MEMORY),
                cores=None if capacity is None else capacity.get(dra.CORES),
                shares=None if capacity is None else capacity.get(dra.SHARES),
            )
        )
    return tuple(out)
