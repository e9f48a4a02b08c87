"""Best fit on the DRA path: under binpack, try first the node whose card the claim fills
most tightly.

On the annotation path binpack ranks nodes by how full they are (HAMi's node score) and
the first that fits wins. Claims of many sizes that come and go (the DRA path's usual
load) leave that ranking short-sighted: the fullest node may only hold a claim on a card
it leaves with an unusable remainder, while a less full node has a card the claim fills
exactly. On the bench's churn trace (``docs/benchmarks.md``, "DRA"; ``docs/dra-engine.md``,
"Best fit"), trying nodes tightest fit first cut the memory stranded at the first refusal
from 0.68 to 0.43 of first-fit's; trying cards so within a node gained a little more.

The measure is cheap and approximate on purpose: the memory and cores a request asks
(the agent's defaults where it asks none), against what is free on each card, without
selectors or request-policy rounding. It only orders; ``claim_fit`` still decides what
fits, and nodes this measure thinks too small are still tried, last, in their ranking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeVar

from vgpu_operator.devices import dra, model
from vgpu_operator.scheduling.dialects.claims import claims

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Want:
    """One request as this measure sees it: how many cards, and the MiB and cores it
    asks of each; what it leaves out counts at the agent's default request policy (the
    whole card's memory, no cores), whatever the slice says: only an order rests on it."""

    count: int
    memory_mib: int | None
    cores: int | None

    @classmethod
    def of(cls, request: claims.Request) -> Want:
        memory: Fraction | None = None
        cores: Fraction | None = None
        for name, amount in request.capacity.items():
            short = name.rsplit("/", 1)[-1]
            if short == dra.MEMORY:
                memory = amount
            elif short == dra.CORES:
                cores = amount
        return cls(
            request.count,
            None if memory is None else int(-(-memory // dra.MIB)),
            None if cores is None else int(-(-cores // 1)),
        )


def leftover(card: model.DeviceUsage, memory_mib: int, cores: int) -> float | None:
    """What the card keeps free after taking (memory, cores), as the sum of the free
    fractions of memory and cores (0: filled exactly); None where it does not fit."""
    if card.used >= card.count or card.total_memory_mib <= 0 or card.total_cores <= 0:
        return None
    free_memory = card.total_memory_mib - card.used_memory_mib - memory_mib
    free_cores = card.total_cores - card.used_cores - cores
    if free_memory < 0 or free_cores < 0:
        return None
    return free_memory / card.total_memory_mib + free_cores / card.total_cores


def node_leftover(cards: Sequence[model.DeviceUsage], wants: Sequence[Want]) -> float | None:
    """How tightly the pod's requests fill this node's cards: per request, the leftover
    of the tightest card among as many as it asks for (its ``count``-th best), summed;
    None when a request finds too few cards. (Called for every candidate node on every
    decision: kept to plain arithmetic.)"""
    total = 0.0
    for want in wants:
        fits: list[float] = []
        for card in cards:
            # ``leftover``, inlined.
            total_memory, total_cores = card.total_memory_mib, card.total_cores
            if card.used >= card.count or total_memory <= 0 or total_cores <= 0:
                continue
            free_memory = (
                total_memory
                - card.used_memory_mib
                - (total_memory if want.memory_mib is None else want.memory_mib)
            )
            free_cores = total_cores - card.used_cores - (want.cores or 0)
            if free_memory >= 0 and free_cores >= 0:
                fits.append(free_memory / total_memory + free_cores / total_cores)
        if len(fits) < want.count:
            return None
        total += min(fits) if want.count == 1 else sorted(fits)[want.count - 1]
    return total


def tightest_first(
    ranked: Sequence[_T],
    cards_of: Callable[[_T], Sequence[model.DeviceUsage]],
    requests: Sequence[claims.Request],
) -> list[_T]:
    """``ranked`` reordered: the nodes where the requests seem to fit, tightest first
    (ties in ranking order), then the others in ranking order."""
    wants = [Want.of(r) for r in requests]
    fitting: list[tuple[float, int, _T]] = []
    rest: list[_T] = []
    for position, node in enumerate(ranked):
        left = node_leftover(cards_of(node), wants)
        if left is None:
            rest.append(node)
        else:
            fitting.append((left, position, node))
    fitting.sort(key=lambda entry: (entry[0], entry[1]))
    return [node for _, _, node in fitting] + rest


def card_order(
    candidates: Sequence[model.DeviceUsage], memory_mib: int, cores: int
) -> list[model.DeviceUsage]:
    """Cards in ``fit``'s order (the last is tried first) for the tightest fit: the card
    left with least free after the request is tried first, cards it does not fit last;
    ties keep the order they came in (the policy's)."""

    def key(card: model.DeviceUsage) -> tuple[bool, float]:
        left = leftover(card, memory_mib, cores)
        return (left is not None, 0.0 if left is None else -left)

    return sorted(candidates, key=key)
