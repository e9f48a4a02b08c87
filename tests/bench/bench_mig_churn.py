"""MIG churn on the DRA path: requests placed before the first refusal, the engine's MIG
rule against upstream's first fit by slice name (issue 39's aim: at least 10 % more).

12 nodes of eight 80 GB cards (A100 and H100), published as partitionable devices; a
seeded trace of MIG profile requests and departures (``scheduling.mig.mig_churn``). Prints,
per seed, both counts and the gain. CPU time only (``process_time``): the figure does not
depend on the machine, the time does.

Beside first fit over the whole cluster by slice name, two more figures: what
kube-scheduler itself does with upstream's allocator (``mig_churn.SpreadFirstFit``: first
fit within a node, the node default scoring prefers, the fewest pods) and the most any
rule could place (``mig_churn.capacity_bound``: refused only when the cluster's slices
run out, geometry ignored).

Usage: ``python tests/bench/bench_mig_churn.py [SEEDS] [LENGTH] [LEAVE_SHARE]``.
"""

from __future__ import annotations

import sys
import time

from vgpu_operator.scheduling.mig import mig_churn
from vgpu_operator.scheduling.mig import mig_partitions as mp


def main(argv: list[str]) -> int:
    seeds = int(argv[1]) if len(argv) > 1 else 5
    length = int(argv[2]) if len(argv) > 2 else mig_churn.DEFAULT_LENGTH
    leave = float(argv[3]) if len(argv) > 3 else mig_churn.DEFAULT_LEAVE_SHARE
    slices = mig_churn.cluster_slices()
    total_engine = total_first_fit = total_spread = total_bound = 0
    cards = 12 * 8
    print(f"cluster: {cards} cards, {cards * 7} compute slices, {cards * 8} memory slices")
    print(
        "seed  engine (refused, compute in use)  first fit (refused, compute)  gain"
        "  kube-scheduler (gain)  bound"
    )
    for seed in range(seeds):
        events = mig_churn.trace(seed, length, leave)
        started = time.process_time()
        engine = mig_churn.replay(events, mp.choose, slices)
        first_fit = mig_churn.replay(events, mp.first_fit, slices)
        cpu = time.process_time() - started
        spread = mig_churn.replay(events, mig_churn.SpreadFirstFit(seed), slices).placed
        bound = mig_churn.capacity_bound(events, cards)
        total_spread += spread
        total_bound += bound
        total_engine += engine.placed
        total_first_fit += first_fit.placed
        gain = 100 * (engine.placed / max(first_fit.placed, 1) - 1)
        print(
            f"{seed:4d}  {engine.placed:6d} ({engine.refused}, {engine.compute_slices})"
            f"  {first_fit.placed:6d} ({first_fit.refused}, {first_fit.compute_slices})"
            f"  {gain:+5.1f} %  {spread:6d} ({_gain(engine.placed, spread)})  {bound:6d}"
            f"  ({cpu:.1f} s CPU, engine and first fit)"
        )
    print(
        f"all   {total_engine:6d}  {total_first_fit:9d}  {_gain(total_engine, total_first_fit)}"
        f"  {total_spread:6d} ({_gain(total_engine, total_spread)})  {total_bound:6d}"
        f"  (bound over first fit: {_gain(total_bound, total_first_fit)})"
    )
    return 0


def _gain(ours: int, theirs: int) -> str:
    return f"{100 * (ours / max(theirs, 1) - 1):+5.1f} %"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
