"""The autoscaling search on generated queues of fractional, whole, multi-card and gang pods
(``autoscale.search``).

- Small queues (up to 5 pods): the nodes asked for are those of an exhaustive search, which
  tries every multiset of instance types (fewest nodes first, then cheapest), every order
  of the pods and every assignment of them to its nodes, each pod placed there by the
  engine's decision cycle: the same count, the same price.
- Larger queues (up to 24 units, 40 pods; instance types of at most 4 cards, so that they
  need up to 5 nodes): the search held to a small budget (a few trials, no
  assignments) asks for at most one node more than the search given a large one proves
  the fewest.
- Always: every pod of a unit the plan places is placed, on a node of the plan (none is
  left waiting that the nodes asked for would hold), and a unit left out fits no option
  alone.
- The same on queues of pods whose GPUs come from ResourceClaims of our classes (shares,
  whole cards, several cards, gangs; claims made, or still to be made from a template:
  one in three), on a NodePool whose nodes are on the DRA path and whose types have at
  most four cards: each pod's claim fitted by the claims dialect on the slices the new
  node's agent would publish, in the search and in the brute force alike (60 small
  queues, 40 of up to 12 units).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from autoscale_cases import (
    LARGE_QUEUE_TYPES,
    PROPERTY_TYPES,
    dra_books,
    dra_options,
    dra_queue,
    options,
    queue,
)
from builders import cluster

from vgpu_operator.scheduling.autoscale import search
from vgpu_operator.scheduling.autoscale.catalogue import NodeOption
from vgpu_operator.scheduling.autoscale.hypothetical import NodeFactory
from vgpu_operator.scheduling.autoscale.whatif import Slot, Unit, WhatIfEngine, held
from vgpu_operator.scheduling.books import Books
from vgpu_operator.scheduling.pod_key import pod_key

SMALL_CASES = 160
LARGE_CASES = 100
SMALL_DRA_CASES = 60
LARGE_DRA_CASES = 40
OPTIONS = options(PROPERTY_TYPES)
LARGE_OPTIONS = options(LARGE_QUEUE_TYPES)
#: Without the big machine: queues of claims need one to four nodes.
DRA_OPTIONS = dra_options(LARGE_QUEUE_TYPES)


def _fits(
    books: Books,
    chosen: Sequence[NodeOption],
    pods: Sequence[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]] = (),
) -> bool:
    """Whether some order of ``pods`` and some assignment of them to nodes of ``chosen``
    places them all (every pod, every node: no symmetry is assumed); ``claims``: their
    claims not made yet."""
    engine = WhatIfEngine(books, NodeFactory(books, 0.0))
    engine.add_claims(claims)
    names = [f"b{i}" for i in range(len(chosen))]
    for name, option in zip(names, chosen, strict=True):
        engine.add(Slot(name, option))

    def place(left: Sequence[Mapping[str, Any]]) -> bool:
        if not left:
            return True
        for index, pod in enumerate(left):
            key = pod_key(pod)
            for name in names:
                if engine.schedule(held(pod, name), 0.0).scheduled:
                    if place([*left[:index], *left[index + 1 :]]):
                        return True
                    engine.unplace([key])
                else:
                    engine.rollback(key)
        return False

    return place(pods)


def _brute_force(
    books: Books, units: Sequence[Unit], most: int, all_options: Sequence[NodeOption] = OPTIONS
) -> tuple[int, float] | None:
    pods = [p for u in units for p in u.pods]
    claims = [c for u in units for c in u.claims]
    for count in range(1, most + 1):
        sets = sorted(
            itertools.combinations_with_replacement(all_options, count),
            key=lambda s: sum(o.price for o in s),
        )
        for chosen in sets:
            if _fits(books, chosen, pods, claims):
                return count, sum(o.price for o in chosen)
    return None


def _check_complete(plan: search.ScalePlan, units: Sequence[Unit]) -> None:
    nodes = {s.name for s in plan.new}
    for unit in units:
        if unit.key in plan.unplaceable:
            continue
        for key in unit.keys:
            assert plan.where.get(key) in nodes, (key, plan)


def _check_optimum(
    books: Books, units: Sequence[Unit], all_options: Sequence[NodeOption]
) -> search.Plan:
    """The plan for ``units`` is complete, leaves out only units no option holds alone,
    and asks for the brute force's count of nodes at its price."""
    plan = search.plan(books, units, all_options, now=0.0)
    _check_complete(plan, units)
    placeable = [u for u in units if u.key not in plan.unplaceable]
    for unit in units:
        if unit.key in plan.unplaceable:
            alone = [not _fits(books, [o], unit.pods, unit.claims) for o in all_options]
            assert all(alone), unit.key
    if not placeable:
        assert plan.new == ()
        return plan
    best = _brute_force(books, placeable, len(plan.new), all_options)
    assert best is not None
    assert plan.optimal
    assert (len(plan.new), round(plan.price, 6)) == (best[0], round(best[1], 6)), plan.summary()
    return plan


def _small(units: list[Unit]) -> list[Unit]:
    while sum(len(u.pods) for u in units) > 5:
        units = units[:-1]
    return units


@pytest.mark.parametrize("seed", range(SMALL_CASES))
def test_small_queues_get_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    _check_optimum(cluster().books, _small(queue(rng, 4)), OPTIONS)


@pytest.mark.parametrize("seed", range(2000, 2000 + SMALL_DRA_CASES))
def test_small_queues_of_claims_get_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    books = dra_books()
    _check_optimum(books, _small(dra_queue(books, rng, 4)), DRA_OPTIONS)


@pytest.mark.parametrize("seed", range(1000, 1000 + LARGE_CASES))
def test_large_queues_ask_for_at_most_one_node_more_than_the_fewest(seed: int) -> None:
    rng = random.Random(seed)
    units = queue(rng, 16)
    books = cluster().books
    tight = search.SearchBudget(max_trials=4, max_placements=0)
    quick = search.plan(books, units, OPTIONS, now=0.0, budget=tight)
    _check_complete(quick, units)
    thorough = search.plan(
        books, units, OPTIONS, now=0.0, budget=search.SearchBudget(max_trials=5000)
    )
    _check_complete(thorough, units)
    assert set(quick.unplaceable) == set(thorough.unplaceable)
    assert thorough.optimal
    assert len(quick.new) <= len(thorough.new) + 1, (quick.summary(), thorough.summary())
    assert len(thorough.new) <= len(quick.new)


@pytest.mark.parametrize("seed", range(3000, 3000 + LARGE_DRA_CASES))
def test_large_queues_of_claims_ask_for_at_most_one_node_more_than_the_fewest(seed: int) -> None:
    rng = random.Random(seed)
    books = dra_books()
    units = dra_queue(books, rng, 12)
    tight = search.SearchBudget(max_trials=4, max_placements=0)
    quick = search.plan(books, units, DRA_OPTIONS, now=0.0, budget=tight)
    _check_complete(quick, units)
    thorough = search.plan(
        books, units, DRA_OPTIONS, now=0.0, budget=search.SearchBudget(max_trials=5000)
    )
    _check_complete(thorough, units)
    assert set(quick.unplaceable) == set(thorough.unplaceable)
    assert thorough.optimal
    assert len(quick.new) <= len(thorough.new) + 1, (quick.summary(), thorough.summary())
    assert len(thorough.new) <= len(quick.new)
