"""FGD's replay of Alibaba's GPU trace through ``simulate``: unallocated GPUs at 100 %.

``python tests/bench/bench_fgd_replay.py [--seeds 1,2,3,4,5] [--mixes default]
[--policies binpack,spread,fragmentation]``: per task mix, policy and seed, the share
of the cluster's GPUs left unallocated when the GPUs asked for reach 100 % of capacity
(FGD's figure: the GPUs of the tasks that failed by then), with the pods placed and
failed, and the CPU time per pod of the streamed simulate (``simulation_stream``, no
per-node scores). Results go to ``.bench/fgd.json``; figures are reported, never
asserted. The trace is fetched at bench time (``fgd_trace``).

FGD's published figures (ATC '23, default task list, median of ten seeds) as anchor:
FGD 4.77 %, best-fit 7.09 %, GPU packing 8.20 %, random 13.75 %.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

import fgd_trace  # noqa: E402

from vgpu_operator import simulation, simulation_stream  # noqa: E402

RESULTS = HERE.parent.parent / ".bench" / "fgd.json"
#: A node policy and a GPU policy per case: HAMi's two pairs and ours.
POLICIES = {
    "binpack": ("binpack", "binpack"),
    "spread": ("spread", "spread"),
    "binpack-spread": ("binpack", "spread"),
    "fragmentation": ("fragmentation", "fragmentation"),
}
ANCHOR = {"FGD": 4.77, "best-fit": 7.09, "GPU packing": 8.20, "random": 13.75}


def replay(mix: str, seed: int, policy: str, full: bool = False) -> dict[str, Any]:
    """One replay; ``full``: on to 130 % of capacity (else it stops at 100 %)."""
    node_policy, gpu_policy = POLICIES[policy]
    scenario, tasks, capacity = fgd_trace.scenario(mix, seed, node_policy, gpu_policy)
    state = simulation.build_state(scenario)
    demand = {f"trace/{t.name}": t.gpu_demand for t in tasks}
    arrived = placed = 0.0
    unallocated_at_100: float | None = None
    pods = failed = 0
    start = time.process_time()
    for _pod, decision in simulation_stream.decisions(scenario, state, scores=False):
        asked = demand[decision.pod]
        pods += 1
        if decision.scheduled:
            placed += asked
        else:
            failed += 1
        arrived += asked
        if unallocated_at_100 is None and arrived >= capacity:
            unallocated_at_100 = 100.0 * (capacity - placed) / capacity
            if not full:
                break  # the figure is taken; the rest of the 130 % only draws FGD's curve
    cpu_s = time.process_time() - start
    return {
        "mix": mix,
        "policy": policy,
        "seed": seed,
        "pods": pods,
        "failed": failed,
        "unallocated_pct_at_100": unallocated_at_100,
        "unallocated_pct_at_end": 100.0 * (capacity - placed) / capacity,
        "arrived_pct_at_end": 100.0 * arrived / capacity,
        "cpu_ms_per_pod": 1000.0 * cpu_s / max(pods, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--mixes", default="default")
    parser.add_argument("--policies", default="binpack,spread,fragmentation")
    parser.add_argument("--full", action="store_true", help="replay on to 130 %% of capacity")
    args = parser.parse_args()
    rows = []
    for mix in args.mixes.split(","):
        for policy in args.policies.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                row = replay(mix, seed, policy, args.full)
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary: dict[str, Any] = {}
    for mix in args.mixes.split(","):
        for policy in args.policies.split(","):
            mine = [r for r in rows if r["mix"] == mix and r["policy"] == policy]
            figures = [r["unallocated_pct_at_100"] for r in mine]
            summary[f"{mix}/{policy}"] = {
                "mean_pct": statistics.fmean(figures),
                "median_pct": statistics.median(figures),
                "seeds": len(figures),
                "cpu_ms_per_pod": statistics.fmean(r["cpu_ms_per_pod"] for r in mine),
            }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rows": rows, "summary": summary, "anchor": ANCHOR}, indent=2))
    for case, figures in summary.items():
        print(
            f"{case:32} mean {figures['mean_pct']:.2f} %  median {figures['median_pct']:.2f} %"
            f"  ({figures['seeds']} seeds, {figures['cpu_ms_per_pod']:.2f} ms CPU per pod)"
        )
    print("anchor (FGD, ATC '23): " + ", ".join(f"{k} {v} %" for k, v in ANCHOR.items()))


if __name__ == "__main__":
    main()
