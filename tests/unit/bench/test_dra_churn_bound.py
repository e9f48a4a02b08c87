"""The DRA churn trace's lower bound (tests/bench/dra_churn_bound.py) on packings small
enough to check by hand."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

_BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if _BENCH not in sys.path:
    sys.path.append(_BENCH)

import dra_churn_bound as b  # noqa: E402  (needs the path above)

pytest.importorskip("highspy")  # the bench extra


@dataclass(frozen=True)
class Claim:
    memory_gib: int
    cores: int = 10
    count: int = 1


HALF = (16, 50)


def test_the_exact_packing_finds_what_first_fit_decreasing_misses() -> None:
    # Two cards of 40 GiB: 16+12+12 on each. First fit, largest first, puts 16+16 on
    # the first card and has no room left for the fourth 12.
    items = [(16, 10), (16, 10), (12, 10), (12, 10), (12, 10), (12, 10)]
    assert not b.greedy_fits(items, 0, HALF, nodes=1, cards=2)
    assert b.exact_fits(items, 0, HALF, total_cards=2)
    assert not b.exact_fits([*items, (4, 10)], 0, HALF, total_cards=2)


def test_cores_and_shares_bind_as_well_as_memory() -> None:
    # Three claims of 50 cores cannot share two cards... of 4 GiB each they would.
    assert not b.exact_fits([(4, 50)] * 5, 0, HALF, total_cards=2)
    assert b.exact_fits([(4, 50)] * 4, 0, HALF, total_cards=2)
    # Eight shares per card: nine claims of 1 GiB need a second card.
    assert not b.exact_fits([(1, 1)] * 9, 0, HALF, total_cards=1)


def test_a_pair_takes_two_cards() -> None:
    assert not b.exact_fits([], 1, HALF, total_cards=1)
    assert b.exact_fits([], 1, HALF, total_cards=2)
    assert b.greedy_fits([], 1, HALF, nodes=1, cards=2)


def test_the_bound_is_the_least_free_memory_up_to_the_first_step_that_cannot_pack() -> None:
    # One node of two cards (80 GiB). Free before each arrival: 80, 60, 40; a pod
    # leaves; 40 before the first 32 (20+20 | 32 packs), 8 before the second (104 GiB
    # asked): that step cannot pack, so no policy strands less than 8 GiB.
    steps = [
        ("arrive", Claim(20)),
        ("arrive", Claim(20)),
        ("arrive", Claim(20)),
        ("leave", 0),
        ("arrive", Claim(32)),
        ("arrive", Claim(32)),
    ]
    found = b.bound(steps, nodes=1, cards=2)
    assert found == b.Bound(
        infeasible_step=5, placed_at_most=4, stranded_gib_at_least=8.0, free_gib_there=8.0
    )


def test_a_trace_that_always_packs_has_no_refusal_step() -> None:
    found = b.bound([("arrive", Claim(20)), ("leave", 0), ("arrive", Claim(20))], 1, 1)
    assert found.infeasible_step is None
    assert found.placed_at_most == 2
