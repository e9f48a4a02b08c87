"""MIG churn on the DRA path: requests placed before the first refusal, the engine's MIG
rule against upstream's first fit by slice name (issue 39's aim: at least 10 % more).

12 nodes of eight 80 GB cards (A100 and H100), published as partitionable devices; a
seeded trace of MIG profile requests and departures (``scheduling.mig_churn``). Prints,
per seed, both counts and the gain. CPU time only (``process_time``): the figure does not
depend on the machine, the time does.

Usage: ``python tests/bench/bench_mig_churn.py [SEEDS] [LENGTH] [LEAVE_SHARE]``.
"""

from __future__ import annotations

import sys
import time

from vgpu_operator.scheduling import mig_churn
from vgpu_operator.scheduling import mig_partitions as mp


def main(argv: list[str]) -> int:
    seeds = int(argv[1]) if len(argv) > 1 else 5
    length = int(argv[2]) if len(argv) > 2 else mig_churn.DEFAULT_LENGTH
    leave = float(argv[3]) if len(argv) > 3 else mig_churn.DEFAULT_LEAVE_SHARE
    slices = mig_churn.cluster_slices()
    total_engine = total_first_fit = 0
    cards = 12 * 8
    print(f"cluster: {cards} cards, {cards * 7} compute slices, {cards * 8} memory slices")
    print("seed  engine (refused, compute in use)  first fit (refused, compute)  gain")
    for seed in range(seeds):
        events = mig_churn.trace(seed, length, leave)
        started = time.process_time()
        engine = mig_churn.replay(events, mp.choose, slices)
        first_fit = mig_churn.replay(events, mp.first_fit, slices)
        cpu = time.process_time() - started
        total_engine += engine.placed
        total_first_fit += first_fit.placed
        gain = 100 * (engine.placed / max(first_fit.placed, 1) - 1)
        print(
            f"{seed:4d}  {engine.placed:6d} ({engine.refused}, {engine.compute_slices})"
            f"  {first_fit.placed:6d} ({first_fit.refused}, {first_fit.compute_slices})"
            f"  {gain:+5.1f} %  ({cpu:.1f} s CPU)"
        )
    gain = 100 * (total_engine / max(total_first_fit, 1) - 1)
    print(f"all   {total_engine:6d}  {total_first_fit:9d}  {gain:+5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
