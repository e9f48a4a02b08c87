"""A lower bound on the stranded memory of the DRA churn trace at its first refusal.

Until the first refusal every claim is placed, so the pods alive at each step are the
same under every policy (a departure picks among the live pods by the trace's index,
and they are the same pods). At the first refusal, the refused claim fits no card (or,
a pair, no node twice): every free GiB is stranded for it, so the figure is the free
memory at that step, F(s) = cluster memory - memory of the live claims. A policy may
refuse at step s only if it could not place the claim; every policy must refuse at the
latest at the first step s* where the live claims and the new one cannot be packed at
all, even by a scheduler that could move every claim at every step (an offline packing,
solved exactly). So no policy strands less than min F(s) over the arrivals s <= s*: the
bound. It is a relaxation (placing online, without moving claims, can only refuse
earlier), so the best a policy can do may lie above it.

The packing: the cards are bins of 40 GiB, 100 cores and 8 shares; a card pattern is
how many claims of each single-card shape, and halves of a pair, it holds. An integer
programme (HiGHS) chooses how many cards hold each pattern, at most all of the cards,
covering every claim (a pair: two halves on two cards, any two; keeping them on one
node could only refuse earlier, so leaving that out keeps the bound a bound). A greedy
first-fit-decreasing packing (pairs on one node) settles the steps that clearly fit,
so the solver runs near the end only.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

#: One item kind: memory GiB, cores (a pair's half is one card of the pair).
Item = tuple[int, int]
CARD_GIB: Final = 40
CARD_CORES: Final = 100
CARD_SHARES: Final = 8


@dataclass(frozen=True, slots=True)
class Bound:
    #: The first arrival (its index among the trace's steps) whose claims cannot be
    #: packed at all (None: the whole trace packs).
    infeasible_step: int | None
    #: Arrivals before it: at most this many claims are placed before a refusal.
    placed_at_most: int
    #: The least free GiB at an arrival up to it: no policy strands less.
    stranded_gib_at_least: float
    #: The free GiB at that first arrival that cannot be packed (what a scheduler that
    #: could move every claim would strand), None with it.
    free_gib_there: float | None


def patterns(kinds: Sequence[Item]) -> list[tuple[int, ...]]:
    """Every way one card holds claims of these kinds (counts per kind, none empty)."""
    out: list[tuple[int, ...]] = []
    limits = [min(CARD_SHARES, CARD_GIB // m, CARD_CORES // c) for m, c in kinds]
    for counts in itertools.product(*(range(n + 1) for n in limits)):
        if not any(counts) or sum(counts) > CARD_SHARES:
            continue
        if sum(n * m for n, (m, _c) in zip(counts, kinds, strict=True)) > CARD_GIB:
            continue
        if sum(n * c for n, (_m, c) in zip(counts, kinds, strict=True)) > CARD_CORES:
            continue
        out.append(counts)
    return out


def greedy_fits(items: Sequence[Item], pairs: int, half: Item, nodes: int, cards: int) -> bool:
    """First fit, largest first, pairs first on two cards of one node: True when it
    places everything (then an exact packing exists); False says nothing."""
    free = [[[CARD_GIB, CARD_CORES, CARD_SHARES] for _ in range(cards)] for _ in range(nodes)]
    for _ in range(pairs):
        for node in free:
            fitting = [c for c in node if _room(c, half)]
            if len(fitting) >= 2:
                for card in fitting[:2]:
                    _take(card, half)
                break
        else:
            return False
    for item in sorted(items, reverse=True):
        fitting = [c for node in free for c in node if _room(c, item)]
        if not fitting:
            return False
        _take(fitting[0], item)
    return True


def _room(card: list[int], item: Item) -> bool:
    return card[0] >= item[0] and card[1] >= item[1] and card[2] >= 1


def _take(card: list[int], item: Item) -> None:
    card[0] -= item[0]
    card[1] -= item[1]
    card[2] -= 1


def exact_fits(items: Sequence[Item], pairs: int, half: Item, total_cards: int) -> bool:
    """Whether the claims pack onto ``total_cards`` cards at all (HiGHS, solved to the
    end: feasible or not). Relaxed: a pair's halves need two cards, not two of one node
    (a relaxation only lowers the bound, which stays a bound)."""
    import highspy  # the bench extra; imported here so that the rest needs none

    counts = Counter(items)
    kinds = [*sorted(counts), half]
    pats = patterns(kinds)
    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    cards = [h.addIntegral(lb=0, ub=total_cards) for _ in pats]
    h.addConstr(sum(cards) <= total_cards)
    wanted = [counts[kind] for kind in kinds[:-1]] + [2 * pairs]
    for i, need in enumerate(wanted):
        holding = [(p[i], x) for p, x in zip(pats, cards, strict=True) if p[i]]
        if need and not holding:
            return False
        if need:
            h.addConstr(sum(n * x for n, x in holding) >= need)
    if pairs:  # a pair's halves lie on two different cards
        with_half = [x for p, x in zip(pats, cards, strict=True) if p[-1]]
        h.addConstr(sum(with_half) >= 2)
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kOptimal:
        return True
    if status == highspy.HighsModelStatus.kInfeasible:
        return False
    raise RuntimeError(f"HiGHS ended with {h.modelStatusToString(status)}")


def bound(
    steps: Sequence[tuple[str, Any]], nodes: int, cards: int, card_gib: int = CARD_GIB
) -> Bound:
    """The bound for a churn trace (``e2e.dra.trace``: arrivals of shapes with
    ``memory_gib``, ``cores`` and ``count``; departures by index into the live pods)."""
    live: list[Any] = []
    least = float("inf")
    arrivals = 0
    for number, (kind, value) in enumerate(steps):
        if kind == "leave":
            if live:
                live.pop(value % len(live))
            continue
        free = nodes * cards * card_gib - sum(s.memory_gib * s.count for s in live)
        least = min(least, float(free))
        claims = [*live, value]
        singles = [(s.memory_gib, s.cores) for s in claims if s.count == 1]
        pair_shapes = [s for s in claims if s.count == 2]
        half = (pair_shapes[0].memory_gib, pair_shapes[0].cores) if pair_shapes else (16, 50)
        if not greedy_fits(singles, len(pair_shapes), half, nodes, cards) and not exact_fits(
            singles, len(pair_shapes), half, nodes * cards
        ):
            return Bound(number, arrivals, least, float(free))
        arrivals += 1
        live.append(value)
    return Bound(None, arrivals, least, None)
