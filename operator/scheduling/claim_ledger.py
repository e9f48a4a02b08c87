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
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu_operator.devices import dra, model
from vgpu_operator.scheduling import claims, placement


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
            else int(-(-share.memory_bytes // dra.MIB))
        )
        cores = card.total_cores if share.cores is None else int(-(-share.cores // 1))
        if whole:
            slots = card.count
        else:
            slots = 1 if share.shares is None else int(-(-share.shares // 1))
        out.append(placement.Booking(card.id, card.vendor, memory, cores, slots))
    return out


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


def hold_from_claim(obj: Mapping[str, Any]) -> Hold | None:
    """The hold an allocated claim's status says, or None (not allocated, or nothing of
    this driver in it)."""
    allocation = (obj.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        return None
    node, shares = claims.read_allocated(allocation)
    if node is None or not shares:
        return None
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    return Hold(f"{namespace}/{meta.get('name', '')}", namespace, node, shares)


def same_node_shares(shares: Iterable[claims.AllocatedShare], node: str) -> bool:
    return all(s.node == node for s in shares)


def decided_shares(node: str, picks: Sequence[Any]) -> tuple[claims.AllocatedShare, ...]:
    """A decision's picks (``claim_fit.Pick``) as the shares its status will name."""
    out = []
    for pick in picks:
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
