"""Stranded memory: free card memory that no pending request could use.

Fragmentation made visible. A card's free memory (registered memory after scaling,
less what pods hold) is *stranded* when at least one GPU pod is pending and none of the
pending pods' container requests could take a share of that card by the card's own
remaining capacity: a free share slot, enough free memory (the request's MiB, or its
percentage of the card's memory), enough free compute (cores up to 100; 100 wants a card
nobody shares; 0 wants a card whose compute is not all booked). Where the pod may go
(node selection, card type and UUID choices, quota, NUMA) is not considered: memory
counted here is unusable whatever the pods' placement rules say, so the figure is a
floor. Unhealthy, cordoned and MIG-mode cards are left out (their memory is not
offered, or is cut in fixed instances). With no GPU pod pending nothing is stranded:
there is no demand for the memory to fail. ``docs/operations.md`` states the same.

Pure: the books hand in their cards and the pending pods' requests.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from vgpu_operator.devices import model

#: A card's whole compute, in HAMi's units.
_WHOLE_CARD_CORES = 100


@dataclass(frozen=True, slots=True)
class CardRequest:
    """What one container asks of each card it is given (its vendor and shares)."""

    vendor: str
    memory_mib: int
    #: Percent of the card's memory, used when ``memory_mib`` is 0; None when unset.
    memory_percent: int | None
    cores: int

    @classmethod
    def of(cls, request: model.ContainerRequest) -> CardRequest:
        percent = request.memory_percent if request.uses_percentage else None
        return cls(request.vendor, request.memory_mib, percent, request.cores)

    def fits(self, card: model.DeviceUsage) -> bool:
        """Whether the card's remaining capacity could hold one share of this request."""
        if card.vendor != self.vendor or card.used >= card.count:
            return False
        memory = self.memory_mib
        if self.memory_percent is not None:
            memory = card.total_memory_mib * self.memory_percent // 100
        if card.total_memory_mib - card.used_memory_mib < memory:
            return False
        cores = min(self.cores, _WHOLE_CARD_CORES)
        if card.total_cores - card.used_cores < cores:
            return False
        if cores == _WHOLE_CARD_CORES and card.used > 0:
            return False
        return not (cores == 0 and card.total_cores and card.used_cores >= card.total_cores)


def offered(card: model.DeviceUsage, cordoned: Collection[str]) -> bool:
    """Whether a card's free memory counts at all (see the module docstring)."""
    return card.health and card.id not in cordoned and card.mode != model.MODE_MIG


def stranded_memory_mib(
    cards: Iterable[model.DeviceUsage], requests: Collection[CardRequest]
) -> int:
    """The free memory, in MiB, of the cards no request fits (0 with no requests)."""
    if not requests:
        return 0
    total = 0
    for card in cards:
        free = card.total_memory_mib - card.used_memory_mib
        if free > 0 and not any(request.fits(card) for request in requests):
            total += free
    return total
