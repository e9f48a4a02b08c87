"""FGD's replay of Alibaba's GPU trace: GPUs left unallocated at 100 % arrived, per policy.

``python tests/bench/bench_fgd_replay.py [--seeds 42-51] [--lists default]
[--policies fgd,bestfit,binpack,fragmentation] [--full]``: per task list, policy and
seed, the share of the cluster's GPUs left unallocated when the GPUs asked for reach
100 % of capacity, by FGD's own reading (its analysis's bucket ``100``: the allocation
averaged over the pods whose arrival brings the GPUs asked to 99.5-100.5 % of
capacity), with the first-crossing figure beside it (the allocation when the GPUs asked
first reach 100 %), the pods placed and failed, FGD's fragmentation (its measure summed
over the nodes, in % of the cluster's GPUs, read in the buckets of 80, 90, 95 and
100 %), and the CPU time per pod. One harness (``fgd_harness``): the engine's
policies and the reference scorers (``fgd_reference``: FGD, best fit, GPU packing)
decide on the same engine and model, arrivals and reading. Results go to
``.bench/fgd.json`` and a markdown table to stdout, with FGD's published per-seed
results beside ours (fetched from its simulator's repository at bench time, as the
trace is: ``fgd_trace``). Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

import fgd_harness  # noqa: E402
import fgd_trace  # noqa: E402

RESULTS = HERE.parent.parent / ".bench" / "fgd.json"
#: FGD's names of the reference policies in its published results.
PUBLISHED_NAME: Final = {"fgd": "FGD", "bestfit": "BestFit", "packing": "GpuPacking"}
#: Arrived percentages whose buckets FGD's fragmentation is read in.
FRAG_AT: Final = (80, 90, 95, 100)


class Curve:
    """Allocation against arrival, one point per pod, read as FGD's analysis reads it."""

    def __init__(self, capacity_milli: int) -> None:
        self.capacity = capacity_milli
        self.buckets: dict[int, list[float]] = {}
        self.first_crossing: float | None = None

    def add(self, arrived_milli: int, allocated_milli: int) -> None:
        arrived = 100.0 * arrived_milli / self.capacity
        allocated = round(100.0 * allocated_milli / self.capacity, 2)
        self.buckets.setdefault(round(arrived), []).append(allocated)
        if self.first_crossing is None and arrived_milli >= self.capacity:
            self.first_crossing = round(100.0 - 100.0 * allocated_milli / self.capacity, 2)

    def unallocated(self, percent: int = 100) -> float | None:
        """100 minus the mean allocation of the pods in the bucket (the next ones out
        when it is empty, as FGD's analysis does)."""
        points = self.buckets.get(percent)
        if not points:
            points = [p for b in (percent - 1, percent + 1) for p in self.buckets.get(b, [])]
        if not points:
            return None
        return round(100.0 - round(statistics.fmean(points), 2), 2)


def replay(
    mix: str, seed: int, policy: str, full: bool = False, quantise: bool = True
) -> dict[str, Any]:
    """One replay; ``full``: on to 130 % of capacity (else it stops past 100.5 %)."""
    list_tasks = fgd_trace.load_tasks(mix)
    harness = fgd_harness.Harness(policy, list_tasks, seed, quantise)
    capacity = 1000 * harness.capacity
    arrivals = fgd_trace.arrivals(list_tasks, harness.capacity, seed)
    curve = Curve(capacity)
    arrived = allocated = pods = failed = 0
    frag: dict[int, list[float]] = {}
    failed_gpus: dict[str, int] = {}
    start = time.process_time()
    for task in arrivals:
        demand = task.milli_per_card * task.num_gpu
        placed = harness.place(task)
        pods += 1
        if placed is None:
            failed += 1
            size = _size(task)
            failed_gpus[size] = failed_gpus.get(size, 0) + demand
        else:
            allocated += demand
        arrived += demand
        curve.add(arrived, allocated)
        bucket = round(100.0 * arrived / capacity)
        if bucket in FRAG_AT:
            frag.setdefault(bucket, []).append(100.0 * harness.fragmentation()[0] / capacity)
        if not full and arrived * 1000 > capacity * 1005:
            break  # the bucket of 100 % is complete
    cpu_s = time.process_time() - start
    return {
        "list": mix,
        "policy": policy,
        "seed": seed,
        "pods": pods,
        "failed": failed,
        "unallocated_pct_at_100": curve.unallocated(100),
        "unallocated_pct_first_crossing": curve.first_crossing,
        "failed_gpus_by_size": {k: v / 1000 for k, v in sorted(failed_gpus.items())},
        "frag_pct": {p: round(statistics.fmean(v), 2) for p, v in frag.items()},
        "arrived_pct_at_end": round(100.0 * arrived / capacity, 2),
        "cpu_ms_per_pod": round(1000.0 * cpu_s / max(pods, 1), 3),
    }


def _size(task: fgd_trace.Task) -> str:
    if task.num_gpu == 1 and task.milli_per_card < 1000:
        return "share"
    return f"{task.num_gpu} GPU"


def seeds_of(text: str) -> list[int]:
    """``42-51`` or ``1,2,3``."""
    if "-" in text:
        low, high = text.split("-", 1)
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def published_median(
    published: dict[tuple[str, str], dict[int, float]], mix: str, policy: str, seeds: Sequence[int]
) -> float | None:
    name = PUBLISHED_NAME.get(policy)
    per_seed = published.get((mix, name)) if name else None
    if not per_seed:
        return None
    values = [per_seed[s] for s in seeds if s in per_seed] or list(per_seed.values())
    return statistics.median(values)


def table(rows: list[dict[str, Any]], published: dict[tuple[str, str], dict[int, float]]) -> str:
    """Median (min-max) per list and policy, FGD's published median where it has one."""
    lists = list(dict.fromkeys(r["list"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    head = "| list | " + " | ".join(policies) + " | FGD published |"
    lines = [head, "|" + "---|" * (len(policies) + 2)]
    for mix in lists:
        cells = []
        for policy in policies:
            figures = [
                r["unallocated_pct_at_100"]
                for r in rows
                if r["list"] == mix and r["policy"] == policy
            ]
            figures = [f for f in figures if f is not None]
            cells.append(
                f"{statistics.median(figures):.2f} ({min(figures):.2f}-{max(figures):.2f})"
                if figures
                else "-"
            )
        seeds = sorted({r["seed"] for r in rows if r["list"] == mix})
        fgd = published_median(published, mix, "fgd", seeds)
        cells.append("-" if fgd is None else f"{fgd:.2f}")
        lines.append(f"| {mix} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--lists", default="default", help="comma list, or 'all'")
    parser.add_argument("--policies", default="fgd,bestfit,binpack,fragmentation")
    parser.add_argument("--full", action="store_true", help="replay on to 130 %% of capacity")
    parser.add_argument(
        "--exact-ties",
        action="store_true",
        help="reference FGD compares falls exactly, not as 0-100 scores",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    lists = list(fgd_trace.LISTS) if args.lists == "all" else args.lists.split(",")
    rows = []
    for mix in lists:
        for policy in args.policies.split(","):
            for seed in seeds_of(args.seeds):
                row = replay(mix, seed, policy, args.full, not args.exact_ties)
                rows.append(row)
                print(json.dumps(row), flush=True)
    try:
        published = fgd_trace.fgd_published()
    except OSError as exc:  # the comparison is optional; our figures stand without it
        print(f"FGD's published results not fetched: {exc}", file=sys.stderr)
        published = {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows}, indent=2))
    print(table(rows, published))


if __name__ == "__main__":
    main()
