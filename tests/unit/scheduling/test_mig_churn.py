"""MIG churn, small: on two nodes of eight 80 GB cards and seeded traces, the engine's MIG
rule places at least as many requests before its first refusal as upstream's first fit
by slice name, on every seed, and more over all; and no rule ever over-consumes a
counter (the ledger refuses to go below zero, so a wrong rule would raise)."""

from __future__ import annotations

from vgpu_operator.scheduling.mig import mig_churn
from vgpu_operator.scheduling.mig import mig_partitions as mp


def test_the_mig_rule_places_more_than_first_fit_before_the_first_refusal() -> None:
    slices = mig_churn.cluster_slices(nodes=2)
    engine_total = first_fit_total = 0
    for seed in range(6):
        events = mig_churn.trace(seed, 800)
        engine = mig_churn.replay(events, mp.choose, slices)
        first_fit = mig_churn.replay(events, mp.first_fit, slices)
        assert engine.refused is not None  # the trace is long enough to meet a refusal
        assert engine.placed >= first_fit.placed, seed
        # Never more than the cluster has: 16 cards of 7 compute slices.
        assert engine.compute_slices <= 16 * 7
        engine_total += engine.placed
        first_fit_total += first_fit.placed
    assert engine_total > first_fit_total


def test_kube_schedulers_baseline_spreads_pods_and_fits_first_within_a_node() -> None:
    slices = mig_churn.cluster_slices(nodes=2)
    devices, counters = mig_churn.cluster_devices(slices)
    ledger = mp.CounterLedger(counters)
    rule = mig_churn.SpreadFirstFit(0)
    nodes = []
    starts = []
    for _ in range(4):
        chosen = rule(mp.MigAsk(profile="1g.10gb"), devices, ledger)
        assert chosen is not None
        ledger.take(chosen.consumes)
        rule.placed(chosen)
        nodes.append(chosen.slice_name.split("-gpu")[0])
        starts.append(chosen.start)
        # Within its node, upstream's first fit: the first card...
        assert chosen.card_index == 0
    # ... its first free start; and the fewest pods win: the two nodes alternate.
    assert sorted(nodes) == ["node-00", "node-00", "node-01", "node-01"]
    assert starts == [0, 0, 1, 1]


def test_no_rule_places_more_than_the_capacity_bound() -> None:
    slices = mig_churn.cluster_slices(nodes=2)
    for seed in range(6):
        events = mig_churn.trace(seed, 800)
        bound = mig_churn.capacity_bound(events, 16)
        for rule in (mp.choose, mp.first_fit, mig_churn.SpreadFirstFit(seed)):
            assert mig_churn.replay(events, rule, slices).placed <= bound, seed
