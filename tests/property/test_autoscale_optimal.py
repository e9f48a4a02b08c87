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
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from autoscale_cases import LARGE_QUEUE_TYPES, PROPERTY_TYPES, options, queue
from builders import cluster

from vgpu_operator.scheduling.autoscale import search
from vgpu_operator.scheduling.autoscale.catalogue import NodeOption
from vgpu_operator.scheduling.autoscale.hypothetical import NodeFactory
from vgpu_operator.scheduling.autoscale.whatif import Slot, Unit, WhatIfEngine, held
from vgpu_operator.scheduling.books import Books
from vgpu_operator.scheduling.pod_key import pod_key

SMALL_CASES = 160
LARGE_CASES = 100
OPTIONS = options(PROPERTY_TYPES)
LARGE_OPTIONS = options(LARGE_QUEUE_TYPES)


def _fits(books: Books, chosen: Sequence[NodeOption], pods: Sequence[Mapping[str, Any]]) -> bool:
    """Whether some order of ``pods`` and some assignment of them to nodes of ``chosen``
    places them all (every pod, every node: no symmetry is assumed)."""
    engine = WhatIfEngine(books, NodeFactory(books, 0.0))
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
                    engine.overlay.drop_pod(key)
        return False

    return place(pods)


def _brute_force(books: Books, units: Sequence[Unit], most: int) -> tuple[int, float] | None:
    pods = [p for u in units for p in u.pods]
    for count in range(1, most + 1):
        sets = sorted(
            itertools.combinations_with_replacement(OPTIONS, count),
            key=lambda s: sum(o.price for o in s),
        )
        for chosen in sets:
            if _fits(books, chosen, pods):
                return count, sum(o.price for o in chosen)
    return None


def _check_complete(plan: search.ScalePlan, units: Sequence[Unit]) -> None:
    nodes = {s.name for s in plan.new}
    for unit in units:
        if unit.key in plan.unplaceable:
            continue
        for key in unit.keys:
            assert plan.where.get(key) in nodes, (key, plan)


@pytest.mark.parametrize("seed", range(SMALL_CASES))
def test_small_queues_get_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    units = queue(rng, 4)
    while sum(len(u.pods) for u in units) > 5:
        units = units[:-1]
    books = cluster().books
    plan = search.plan(books, units, OPTIONS, now=0.0)
    _check_complete(plan, units)
    placeable = [u for u in units if u.key not in plan.unplaceable]
    for unit in units:
        if unit.key in plan.unplaceable:
            assert all(not _fits(books, [o], unit.pods) for o in OPTIONS), unit.key
    if not placeable:
        assert plan.new == ()
        return
    best = _brute_force(books, placeable, len(plan.new))
    assert best is not None
    assert plan.optimal
    assert (len(plan.new), round(plan.price, 6)) == (best[0], round(best[1], 6)), plan.summary()


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
