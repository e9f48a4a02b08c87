"""The topology search returns exactly what HAMi's full scan returns.

Not only the same score: the same cards, because HAMi keeps the first best combination
and the choice is visible in the pod's annotations. Score values come from small sets so
that ties are frequent; machines are both unstructured and built from interchangeable
groups (NVSwitch islands, bridged pairs), where the search's symmetry reduction applies.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpu_operator.scheduling.policies import topology

Scores = dict[str, dict[str, int]]

#: Small value sets: few distinct values make ties, and ties test the tie-break.
VALUE_SETS = (
    (0, 1),
    (0, 10, 20),
    (10, 20, 1230),
    (1810, 1820),
    (-5, 0, 7),
)

CARDS = tuple(f"GPU-{i}" for i in range(10))


@st.composite
def unstructured_scores(draw: st.DrawFn, cards: Sequence[str]) -> Scores:
    """Every ordered pair its own value (asymmetric); some entries and maps missing."""
    values = draw(st.sampled_from(VALUE_SETS))
    scores: Scores = {}
    for a in cards:
        if draw(st.integers(0, 9)) == 0:
            continue  # a card the score annotation does not list
        row = {}
        for b in cards:
            if b != a and draw(st.integers(0, 9)) > 0:
                row[b] = draw(st.sampled_from(values))
        scores[a] = row
    return scores


@st.composite
def grouped_scores(draw: st.DrawFn, cards: Sequence[str]) -> Scores:
    """Cards in groups with one symmetric score per pair of groups, plus a few odd pairs.

    Models NVSwitch islands and PCIe trees; the odd pairs (one direction changed) break
    some groups apart, so the search sees both whole and partly split groups.
    """
    values = draw(st.sampled_from(VALUE_SETS))
    group_count = draw(st.integers(1, 3))
    group_of = {card: draw(st.integers(0, group_count - 1)) for card in cards}
    between = {}
    for g in range(group_count):
        for h in range(g, group_count):
            between[g, h] = between[h, g] = draw(st.sampled_from(values))
    scores = {a: {b: between[group_of[a], group_of[b]] for b in cards if b != a} for a in cards}
    for _ in range(draw(st.integers(0, 2))):
        a, b = draw(st.sampled_from(cards)), draw(st.sampled_from(cards))
        if a != b:
            scores[a][b] = draw(st.sampled_from(values))
    return scores


@st.composite
def selections(draw: st.DrawFn) -> tuple[list[str], Scores, int]:
    """(candidates in some scan order, scores of the whole node, requested count).

    Candidates are a subset of the node's cards (others are in use), shuffled.
    """
    node_cards = CARDS[: draw(st.integers(1, len(CARDS)))]
    scores = draw(st.one_of(unstructured_scores(node_cards), grouped_scores(node_cards)))
    candidates = draw(st.permutations(node_cards))
    candidates = candidates[: draw(st.integers(1, len(candidates)))]
    k = draw(st.integers(1, len(candidates)))
    return list(candidates), scores, k


def _brute_force_worst(candidates: Sequence[str], scores: Scores) -> str:
    totals = [
        (sum(scores.get(a, {}).get(b, 0) for b in candidates if b != a), position)
        for position, a in enumerate(candidates)
    ]
    return candidates[min(totals)[1]]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(selections())
def test_best_combination_equals_full_scan(selection: tuple[list[str], Scores, int]) -> None:
    candidates, scores, k = selection

    chosen = topology.best_combination(candidates, scores, k)

    assert chosen == topology.exhaustive_best_combination(candidates, scores, k)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(selections())
def test_best_combination_is_k_distinct_candidates_in_scan_order(
    selection: tuple[list[str], Scores, int],
) -> None:
    candidates, scores, k = selection

    chosen = topology.best_combination(candidates, scores, k)

    positions = [candidates.index(card) for card in chosen]
    assert len(chosen) == k
    assert positions == sorted(set(positions))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(selections())
def test_worst_single_card_equals_brute_force(selection: tuple[list[str], Scores, int]) -> None:
    candidates, scores, _ = selection

    assert topology.worst_single_card(candidates, scores) == _brute_force_worst(candidates, scores)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(selections(), st.data())
def test_search_reaches_full_scan_answer_from_any_start(
    selection: tuple[list[str], Scores, int], data: st.DataObject
) -> None:
    """Whatever combination the search starts from, it ends at the full scan's answer.

    The greedy start is nearly always that answer already, which would hide a pruning
    rule that loses ties. Here the start is an equally good but later combination (the
    hardest case for the tie-break), or any combination at all.
    """
    candidates, scores, k = selection
    combinations = list(itertools.combinations(range(len(candidates)), k))

    def score_of(combination: tuple[int, ...]) -> int:
        return topology.combination_score([candidates[i] for i in combination], scores)

    best_score = max(map(score_of, combinations))
    last_best = [c for c in combinations if score_of(c) == best_score][-1]
    start = data.draw(st.sampled_from([last_best, *combinations]))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(topology._Search, "_greedy_incumbent", lambda _: (start, score_of(start)))
        chosen = topology.best_combination(candidates, scores, k)

    assert chosen == topology.exhaustive_best_combination(candidates, scores, k)
