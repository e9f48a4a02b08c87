"""The engine alone at 15,000 and 50,000 nodes (issue 48 item 3); reports, asserts nothing.

``PYTHONSAFEPATH=1 .venv/bin/python tests/bench/bench_engine_scale.py --nodes 15000
--part decisions`` (parts: ``decisions``, ``dra``, ``memory``; ``--nodes`` may list
several sizes). Each part builds its cluster in this process and prints one JSON line per
case, with the cluster's build time and the process's peak RSS:

- ``decisions``: ``bench_scheduling``'s half-loaded nodes of 8 GPUs; one pod of 1, 2 and
  8 GPUs that fits, the first pod of a request never seen (fits nowhere: every node is
  judged), and ``bench_gangs``'s gang of four 1-GPU members.
- ``dra``: ``bench_dra_scheduling``'s half-loaded DRA nodes; a claim of 8 GiB that fits,
  and the first pod of a claim request never seen.
- ``memory``: ``bench_memory`` with 10 bound pods a node (RSS of the books, and the
  bytes Python holds, traced in a second pass unless ``--untraced``).

The heap is frozen after the build (``gc.freeze``), as the operator freezes its own after
the first listing (``control/heap.py``), so that a full collection of the cluster's
objects does not land in one timed decision. Timings are the thread's CPU time beside the
wall clock; fewer repetitions than the 1,000/5,000-node benches (a never-seen request
judges every node).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))

import bench_dra_scheduling
import bench_gangs
import bench_memory
import bench_scheduling
from bench_scheduling import NEW_REQUEST, _pending, _row

SIZES = (15_000, 50_000)
FIT_RUNS = 200
NEW_RUNS = 10
GANG_RUNS = 50
DRA_FIT_RUNS = 50
DRA_NEW_RUNS = 5


def _peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def decisions(nodes: int) -> list[dict[str, Any]]:
    started = time.process_time()
    state = bench_scheduling.build_cluster(nodes)
    built = round(time.process_time() - started, 1)
    gc.freeze()
    pods = len(state.holding_pods())
    print(f"built {nodes} nodes, {pods} running pods, {built} s CPU", file=sys.stderr)
    cases: list[tuple[str, Any, int, bool, str]] = [
        ("1 GPU 8 GiB 20 cores", _pending("one-gpu", 1, 8192, 20), FIT_RUNS, True, "same"),
        ("2 GPUs 8 GiB 20 cores", _pending("two-gpu", 2, 8192, 20), FIT_RUNS, True, "same"),
        ("8 GPUs 30 GiB 20 cores", _pending("eight-gpu", 8, 30000, 20), FIT_RUNS, True, "same"),
        (
            "unschedulable, first of its request (diagnosis)",
            _pending("huge-request", 1, 1 << 20, 10),
            NEW_RUNS,
            False,
            NEW_REQUEST,
        ),
    ]
    rows = []
    for name, pod, runs, fits, between in cases:
        wall, cpu = bench_scheduling.time_case(state, pod, runs, fits, between)
        rows.append(_row(f"schedule {nodes} nodes: {name}", wall, None, cpu))
    members = bench_gangs.CASES[0][1]
    wall, cpu = bench_gangs.time_gang(state, members, None, True, GANG_RUNS, 5)
    rows.append(_row(f"gang {nodes} nodes: {bench_gangs.CASES[0][0]}", wall, None, cpu))
    for row in rows:
        row.update(build_cpu_s=built, running_pods=pods, peak_rss_mib=_peak_rss_mib())
    return rows


def dra(nodes: int) -> list[dict[str, Any]]:
    started = time.process_time()
    state = bench_dra_scheduling.build_cluster(nodes)
    built = round(time.process_time() - started, 1)
    gc.freeze()
    print(f"built {nodes} DRA nodes, {built} s CPU", file=sys.stderr)
    rows = []
    for name, mib, runs, fits, new in (
        ("claim of 8 GiB", 8192, DRA_FIT_RUNS, True, False),
        ("unschedulable, first of its request (diagnosis)", 81920, DRA_NEW_RUNS, False, True),
    ):
        wall, cpu = bench_dra_scheduling.time_claim(state, mib, runs, fits, new)
        rows.append(_row(f"dra schedule {nodes} nodes: {name}", wall, None, cpu))
    for row in rows:
        row.update(build_cpu_s=built, peak_rss_mib=_peak_rss_mib())
    return rows


def memory(nodes: int, traced: bool) -> list[dict[str, Any]]:
    pods = 10 * nodes
    if traced:
        return bench_memory.run(nodes, pods)
    mib = 1 << 20
    rss = bench_memory._measure(nodes, pods, traced=False)
    return [
        {
            "case": f"{nodes} nodes of 8 GPUs",
            "rss_mib": round((rss[1] - rss[0]) / mib, 1),
            "per_1000_nodes_mib": round((rss[1] - rss[0]) / mib * 1000 / nodes, 1),
        },
        {
            "case": f"{pods} bound pods on them",
            "rss_mib": round((rss[2] - rss[1]) / mib, 1),
            "per_10000_pods_mib": round((rss[2] - rss[1]) / mib * 10_000 / pods, 1),
        },
        {"case": "process RSS at the end", "rss_mib": round(rss[2] / mib, 1)},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default=",".join(map(str, SIZES)))
    parser.add_argument("--part", choices=("decisions", "dra", "memory"), default="decisions")
    parser.add_argument("--untraced", action="store_true", help="memory: RSS only")
    args = parser.parse_args()
    for nodes in (int(n) for n in args.nodes.split(",")):
        started = time.process_time()
        if args.part == "decisions":
            rows = decisions(nodes)
        elif args.part == "dra":
            rows = dra(nodes)
        else:
            rows = memory(nodes, not args.untraced)
        for row in rows:
            print(json.dumps(row), flush=True)
        print(f"{args.part} {nodes}: {time.process_time() - started:.0f} s CPU", file=sys.stderr)


if __name__ == "__main__":
    main()
