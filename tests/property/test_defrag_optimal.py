"""The defragmentation planner on generated clusters of up to 8 nodes: the exact search
is as cheap as an exhaustive search of every set of pods and every order; every plan,
exact or heuristic, keeps the rules; and the cluster after a plan, recomputed from the
pods' own allocations (not from the engine), over-commits no card.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from defrag_cases import Case, books_fingerprint, cases, exhaustive_best

from vgpu_operator.devices import codec
from vgpu_operator.scheduling.defrag import defrag
from vgpu_operator.scheduling.preemption import disruption

MAX_EVICTIONS = 3
CASES = cases(120, max_nodes=8)


def _memory_of(pod: dict[str, Any]) -> int:
    return int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"])


def _card_of(pod: dict[str, Any]) -> str:
    annotation = pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
    single = codec.decode_pod_single_device(annotation, "allocated")
    return single[0][0].uuid


def _check_rules(case: Case, plan: defrag.Plan) -> None:
    by_key = {f"default/{p['metadata']['name']}": p for p in case.running}
    assert plan.evictions <= MAX_EVICTIONS
    priority = case.waiting["spec"]["priority"]
    identities = []
    for move in plan.moves:
        pod = by_key[move.pod]
        assert pod["spec"]["priority"] <= priority, move
        owner = pod["metadata"].get("ownerReferences")
        assert owner, move
        assert owner[0]["kind"] in {"ReplicaSet", "StatefulSet", "Job"}, move
        identities.append(
            disruption.PodIdentity("default", pod["metadata"]["name"], pod["metadata"]["labels"])
        )
    budgets = [disruption.Budget.from_object(b) for b in case.budgets]
    violating, _ = disruption.split_by_violation(identities, budgets)
    assert not violating, plan


def _check_no_overcommit(case: Case, plan: defrag.Plan) -> None:
    capacity = {c.id: (c.memory_mib, c.count) for _n, cards in case.nodes for c in cards}
    memory: Counter[str] = Counter()
    slots: Counter[str] = Counter()
    for pod in case.running:
        card = _card_of(pod)
        memory[card] += _memory_of(pod)
        slots[card] += 1
    for move in plan.moves:
        (card,) = move.from_cards
        memory[card] -= move.memory_mib
        slots[card] -= 1
        (target,) = move.to_cards
        memory[target] += move.memory_mib
        slots[target] += 1
    ((card,),) = plan.cards
    memory[card] += _memory_of(case.waiting)
    slots[card] += 1
    for card, (total, count) in capacity.items():
        assert memory[card] <= total, (card, plan)
        assert slots[card] <= count, (card, plan)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c.seed}")
def test_exact_plan_is_as_cheap_as_every_set_and_order_tried(case: Case) -> None:
    options = defrag.PlanOptions(max_evictions=MAX_EVICTIONS)
    state = case.state()
    before = books_fingerprint(state)
    report = defrag.plan(state, [case.waiting], case.running, 0.0, options, exact=True)
    assert books_fingerprint(state) == before, "planning changed the books"
    best = exhaustive_best(case, MAX_EVICTIONS)
    found = (report.plans[0].evictions, report.plans[0].memory_mib) if report.plans else None
    assert found == best
    if report.plans:
        _check_rules(case, report.plans[0])
        _check_no_overcommit(case, report.plans[0])


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c.seed}")
def test_heuristic_plans_keep_the_rules_and_cost_no_less_than_exact(case: Case) -> None:
    options = defrag.PlanOptions(max_evictions=MAX_EVICTIONS)
    state = case.state()
    before = books_fingerprint(state)
    heuristic = defrag.plan(state, [case.waiting], case.running, 0.0, options, exact=False)
    assert books_fingerprint(state) == before, "planning changed the books"
    if not heuristic.plans:
        return
    plan = heuristic.plans[0]
    _check_rules(case, plan)
    _check_no_overcommit(case, plan)
    order = [m.pod for m in plan.moves]
    assert defrag.replay(state, case.waiting, plan.node, order, case.running, 0.0) is not None
    exact = defrag.plan(state, [case.waiting], case.running, 0.0, options, exact=True).plans[0]
    assert (plan.evictions, plan.memory_mib) >= (exact.evictions, exact.memory_mib)
