"""Topology-aware choice: worst single card and best combination (hami-semantics §9)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from vgpu_operator.scheduling.policies import topology

Scores = dict[str, dict[str, int]]


def _symmetric(pairs: dict[tuple[str, str], int], cards: Sequence[str]) -> Scores:
    """Both directions of every listed pair; unlisted pairs score 0."""
    scores: Scores = {card: {} for card in cards}
    for (a, b), score in pairs.items():
        scores[a][b] = score
        scores[b][a] = score
    return scores


BRIDGED = ["GPU-a0", "GPU-a1", "GPU-a2", "GPU-a3"]
#: HAMi's example: four A100 PCIe, bridged in pairs (30 + 12 links), 20 between pairs.
BRIDGED_SCORES = _symmetric(
    {
        ("GPU-a0", "GPU-a1"): 1230,
        ("GPU-a2", "GPU-a3"): 1230,
        ("GPU-a0", "GPU-a2"): 20,
        ("GPU-a0", "GPU-a3"): 20,
        ("GPU-a1", "GPU-a2"): 20,
        ("GPU-a1", "GPU-a3"): 20,
    },
    BRIDGED,
)

#: Only the earlier card's map counts for a pair; y -> x is not what x -> y says.
ASYMMETRIC: Scores = {
    "x": {"y": 0, "z": 10},
    "y": {"x": 500, "z": 20},
    "z": {"x": 10, "y": 3},
}


def _islands(cards_per_island: int, islands: int) -> tuple[list[str], Scores]:
    """NVSwitch islands (1820 inside) joined over PCIe (10 between islands)."""
    cards = [f"GPU-{i:02d}" for i in range(cards_per_island * islands)]
    scores = {
        a: {
            b: 1820 if i // cards_per_island == j // cards_per_island else 10
            for j, b in enumerate(cards)
            if b != a
        }
        for i, a in enumerate(cards)
    }
    return cards, scores


@pytest.mark.parametrize(
    ("candidates", "scores", "expected"),
    [
        pytest.param(
            ["GPU-a0", "GPU-a1", "GPU-a2"], BRIDGED_SCORES, "GPU-a2", id="keeps-bridged-pair-intact"
        ),
        pytest.param(
            ["GPU-a2", "GPU-a3", "GPU-a0"],
            BRIDGED_SCORES,
            "GPU-a0",
            id="isolated-card-wherever-scanned",
        ),
        pytest.param(BRIDGED, BRIDGED_SCORES, "GPU-a0", id="all-equal-first-in-scan-order"),
        pytest.param(
            ["GPU-a3", "GPU-a1", "GPU-a0", "GPU-a2"],
            BRIDGED_SCORES,
            "GPU-a3",
            id="tie-first-in-given-order",
        ),
        pytest.param(["x", "y"], ASYMMETRIC, "x", id="uses-own-row-x-to-y-is-zero"),
        pytest.param(["y", "z"], ASYMMETRIC, "z", id="uses-own-row-z-to-y-is-lower"),
        pytest.param(
            ["a", "b", "c"], {"a": {"b": 5}, "b": {"a": 5, "c": 1}}, "c", id="missing-map-is-zero"
        ),
        pytest.param(
            ["a", "b"],
            {"a": {"b": 5, "gone": 100}, "b": {"a": 7}},
            "a",
            id="non-candidates-ignored",
        ),
        pytest.param(["solo"], {}, "solo", id="single-candidate"),
    ],
)
def test_worst_single_card_picks_lowest_sum_to_other_candidates(
    candidates: list[str], scores: Scores, expected: str
) -> None:
    assert topology.worst_single_card(candidates, scores) == expected


@pytest.mark.parametrize(
    ("candidates", "scores", "k", "expected"),
    [
        pytest.param(BRIDGED, BRIDGED_SCORES, 2, ("GPU-a0", "GPU-a1"), id="bridged-pair-first-tie"),
        pytest.param(
            ["GPU-a2", "GPU-a0", "GPU-a3", "GPU-a1"],
            BRIDGED_SCORES,
            2,
            ("GPU-a2", "GPU-a3"),
            id="bridged-pair-first-in-scan-order",
        ),
        pytest.param(
            ["GPU-a0", "GPU-a2", "GPU-a3"],
            BRIDGED_SCORES,
            2,
            ("GPU-a2", "GPU-a3"),
            id="only-intact-pair-left",
        ),
        pytest.param(
            BRIDGED, BRIDGED_SCORES, 3, ("GPU-a0", "GPU-a1", "GPU-a2"), id="three-all-tie-first"
        ),
        pytest.param(["x", "y", "z"], ASYMMETRIC, 2, ("y", "z"), id="asymmetric-reverse-ignored"),
        pytest.param(["y", "x", "z"], ASYMMETRIC, 2, ("y", "x"), id="asymmetric-order-matters"),
        pytest.param(
            ["a", "b", "c", "d"],
            {"c": {"d": 1}},
            2,
            ("c", "d"),
            id="missing-maps-are-zero",
        ),
        pytest.param(["a", "b", "c", "d"], {}, 3, ("a", "b", "c"), id="no-scores-first-k"),
        pytest.param(
            ["a", "b", "c"],
            _symmetric({("a", "b"): -5, ("a", "c"): -1, ("b", "c"): -3}, "abc"),
            2,
            ("a", "c"),
            id="negative-scores-least-negative",
        ),
        pytest.param(["c", "a", "b"], {}, 3, ("c", "a", "b"), id="all-requested-in-scan-order"),
        pytest.param(["a", "b", "c"], ASYMMETRIC, 1, ("a",), id="one-card-first"),
    ],
)
def test_best_combination_maximises_pair_sum_first_on_ties(
    candidates: list[str], scores: Scores, k: int, expected: tuple[str, ...]
) -> None:
    assert topology.best_combination(candidates, scores, k) == expected
    assert topology.exhaustive_best_combination(candidates, scores, k) == expected


def test_best_combination_takes_one_island_in_scan_order() -> None:
    cards, scores = _islands(cards_per_island=8, islands=2)
    scan_order = cards[8:12] + cards[:8] + cards[12:]

    chosen = topology.best_combination(scan_order, scores, 8)

    assert chosen == tuple(cards[8:12] + cards[12:])


def test_best_combination_prefers_the_island_that_sorts_first() -> None:
    # Both islands are free and whole; the island whose cards come first wins.
    cards, scores = _islands(cards_per_island=4, islands=2)
    scan_order = [cards[4], cards[0], cards[5], cards[1], cards[6], cards[2], cards[7], cards[3]]

    chosen = topology.best_combination(scan_order, scores, 4)

    assert chosen == (cards[4], cards[5], cards[6], cards[7])


def test_best_combination_keeps_first_tie_that_greedy_growth_misses() -> None:
    # Triangle t0-t1-t2 (10 each) ties with triangle u0-u1-u2, but each t has a heavier
    # edge (11) to a card outside: growing from a t always leaves the triangle, growing
    # from a u finds the later triangle. The earlier triangle must still win.
    cards = ["t0", "t1", "t2", "d0", "d1", "d2", "u0", "u1", "u2"]
    pairs = {("t0", "t1"): 10, ("t0", "t2"): 10, ("t1", "t2"): 10}
    pairs |= {("u0", "u1"): 10, ("u0", "u2"): 10, ("u1", "u2"): 10}
    pairs |= {("t0", "d0"): 11, ("t1", "d1"): 11, ("t2", "d2"): 11}

    chosen = topology.best_combination(cards, _symmetric(pairs, cards), 3)

    assert chosen == ("t0", "t1", "t2")


@pytest.mark.timeout(60)
def test_best_combination_never_scans_all_combinations() -> None:
    # C(72, 36) combinations: only the search's reductions make this return. One weaker
    # pair in the island scanned first makes the other island the answer.
    cards, scores = _islands(cards_per_island=36, islands=2)
    scores[cards[40]][cards[41]] = 1819

    chosen = topology.best_combination(cards[36:] + cards[:36], scores, 36)

    assert chosen == tuple(cards[:36])


@pytest.mark.parametrize(
    ("cards", "expected"),
    [
        pytest.param((), 0, id="empty"),
        pytest.param(("y",), 0, id="single"),
        pytest.param(("y", "x", "z"), 500 + 20 + 10, id="earlier-card-row"),
        pytest.param(("x", "y", "z"), 0 + 10 + 20, id="other-order"),
    ],
)
def test_combination_score_sums_earlier_card_rows(cards: tuple[str, ...], expected: int) -> None:
    assert topology.combination_score(cards, ASYMMETRIC) == expected


@pytest.mark.parametrize(
    ("candidates", "k", "message"),
    [
        pytest.param(["a", "b"], 0, "positive", id="zero"),
        pytest.param(["a", "b"], -1, "positive", id="negative"),
        pytest.param(["a", "b"], 3, "from 2 candidates", id="more-than-candidates"),
        pytest.param([], 1, "no candidate", id="no-candidates"),
        pytest.param(["a", "b", "a"], 2, "repeat", id="repeated-candidate"),
    ],
)
def test_best_combination_rejects_impossible_requests(
    candidates: list[str], k: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        topology.best_combination(candidates, {}, k)
    with pytest.raises(ValueError, match=message):
        topology.exhaustive_best_combination(candidates, {}, k)


@pytest.mark.parametrize(
    ("candidates", "message"),
    [
        pytest.param([], "no candidate", id="no-candidates"),
        pytest.param(["a", "a"], "repeat", id="repeated-candidate"),
    ],
)
def test_worst_single_card_rejects_bad_candidates(candidates: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        topology.worst_single_card(candidates, {})
