"""Alibaba's GPU trace with its own creation and deletion times: churn, waiting, idle GPUs.

``python tests/bench/bench_fgd_churn.py [--list default] [--compress 10] [--scale 0.02]
[--policies fgd,bestfit,binpack,fragmentation] [--defrag [--max-evictions 3]]``: the
task list in the trace's order of creation, each pod arriving at its creation time and
leaving its duration (deletion minus creation) after it started; a pod that fits nowhere
waits, and is retried (in order of arrival) whenever a pod leaves a node it might now
fit on. One harness with the FGD replay (``fgd_harness``): the engine's policies and the
reference scorers decide on the same engine and model.

The list's own times never load FGD's cluster: at most 66 GPUs of the 6,212 are asked
at once (the lists are a sample of the production cluster's tasks, spread over 149
days). So the replay runs on a sample of the nodes (``--scale``: that share of each
kind of node, model, cards, CPU and memory alike, rounded, at least one of each kind
that rounds to one) with the creation times compressed (``--compress``: divided by it,
durations kept), which raises the load that many times at every moment and keeps the
order of arrivals and each pod's duration.

Figures per policy: the share of the GPUs that sat idle while a waiting request would
have fitted the cluster's free capacity in total (its GPUs, CPU and memory, summed over
the nodes: room there was, on no single node), as a time average over the replay, and
the share of time that held; the waiting time of the pods by size; pods still waiting
at the end; with ``--defrag``, the planner's rounds, plans and moves
(``fgd_churn_defrag``). Written to ``.bench/fgd-churn.json``; figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

import fgd_churn_defrag  # noqa: E402
import fgd_harness  # noqa: E402
import fgd_reference  # noqa: E402
import fgd_trace  # noqa: E402
from fgd_trace import Task  # noqa: E402

RESULTS = HERE.parent.parent / ".bench" / "fgd-churn.json"
#: The over-time series keeps a point at most this often (s of compressed time).
SAMPLE_S = 600.0


def sample_rows(rows: Sequence[dict[str, str]], scale: float) -> list[dict[str, str]]:
    """``scale`` of each kind of node (model, cards, CPU, memory), rounded, the first of
    each kind in the list's order."""
    kinds: dict[tuple[str, ...], list[dict[str, str]]] = {}
    for row in rows:
        key = (row["model"], row["gpu"], row["cpu_milli"], row["memory_mib"])
        kinds.setdefault(key, []).append(row)
    out: list[dict[str, str]] = []
    for members in kinds.values():
        out.extend(members[: round(len(members) * scale)])
    return sorted(out, key=lambda r: r["sn"])


def size_of(task: Task) -> str:
    if task.num_gpu == 0:
        return "cpu-only"
    if task.num_gpu == 1 and task.milli_per_card < 1000:
        return "share"
    return f"{task.num_gpu} GPU"


@dataclass
class Figures:
    waits: dict[str, list[float]] = field(default_factory=dict)
    waiting_at_end: Counter[str] = field(default_factory=Counter)
    #: Time integrals: of the idle GPU milli while a fitting request waited, of the time
    #: that held, and of the time overall.
    idle_blocked: float = 0.0
    blocked_time: float = 0.0
    span: float = 0.0
    series: list[tuple[float, float, float]] = field(default_factory=list)
    never_fits: int = 0


class Churn:
    def __init__(self, policy: str, tasks: Sequence[Task], rows: Sequence[dict[str, str]]):
        self.harness = fgd_harness.Harness(policy, tasks, rows=rows)
        self.capacity = 1000 * self.harness.capacity
        self.waiting: list[tuple[Task, float]] = []
        self.empty = [
            fgd_reference.Node(
                r["sn"], r["model"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"])
            )
            for r in rows
        ]
        self.figures = Figures()

    def could_fit(self, task: Task) -> bool:
        """Whether the pod fits some node of the sample when it is empty (one that never
        can is refused, not kept waiting)."""
        shape = fgd_harness.shape_of(task)
        return any(empty.fits(shape, task.memory_mib) for empty in self.empty)

    def free_totals(self) -> tuple[int, int, int]:
        nodes = self.harness.model.values()
        return (
            sum(n.idle for n in nodes),
            sum(n.cpu_left for n in nodes),
            sum(n.mem_left for n in nodes),
        )

    def blocked_idle(self) -> int:
        """The idle GPU milli when some waiting request fits the free totals, else 0."""
        idle, cpu, mem = self.free_totals()
        for task, _since in self.waiting:
            demand = task.milli_per_card * task.num_gpu
            if demand <= idle and task.cpu_milli <= cpu and task.memory_mib <= mem:
                return idle
        return 0

    def try_place(self, task: Task, since: float, now: float) -> float | None:
        placed = self.harness.place(task)
        if placed is None:
            return None
        return self.admitted(task, since, now)

    def admitted(self, task: Task, since: float, now: float) -> float:
        """The pod started now (placed): its wait counted, and when it leaves."""
        self.figures.waits.setdefault(size_of(task), []).append(now - since)
        return now + max(1, (task.deleted or 0) - (task.created or 0))

    def summary(self, policy: str, cpu_s: float) -> dict[str, Any]:
        figures, span = self.figures, max(self.figures.span, 1e-9)
        return {
            "policy": policy,
            "capacity_gpus": self.capacity // 1000,
            "idle_while_fitting_request_waits_pct": round(
                100.0 * figures.idle_blocked / span / self.capacity, 3
            ),
            "time_a_fitting_request_waits_pct": round(100.0 * figures.blocked_time / span, 2),
            "wait_s": {size: _waits(w) for size, w in sorted(figures.waits.items())},
            "waiting_at_end": dict(figures.waiting_at_end),
            "never_fits": figures.never_fits,
            "cpu_s": round(cpu_s, 1),
            "series": figures.series,
        }

    def retry(self, node: str, now: float, leave: list[tuple[float, str]]) -> None:
        """Waiting pods, in order of arrival, that may fit the node a pod just left."""
        model = self.harness.model[node]
        still = []
        for task, since in self.waiting:
            shape = fgd_harness.shape_of(task)
            until = self.try_place(task, since, now) if model.fits(shape, task.memory_mib) else None
            if until is None:
                still.append((task, since))
            else:
                heapq.heappush(leave, (until, task.name))
        self.waiting = still


def replay(
    policy: str,
    tasks: Sequence[Task],
    rows: Sequence[dict[str, str]],
    compress: float,
    planner: fgd_churn_defrag.Planner | None = None,
) -> dict[str, Any]:
    """One policy's replay; with ``planner``, defragmentation on."""
    churn = Churn(policy, tasks, rows)
    arrivals = sorted(((t.created or 0) / compress, t.name, t) for t in tasks)
    leave: list[tuple[float, str]] = []  # a heap of (when, pod)
    figures = churn.figures
    last = 0.0
    blocked = 0
    start = time.process_time()
    position = 0
    while position < len(arrivals) or leave:
        if leave and (position == len(arrivals) or leave[0][0] <= arrivals[position][0]):
            now, name = heapq.heappop(leave)
            task = None
        else:
            now, _name, task = arrivals[position]
            position += 1
        figures.idle_blocked += blocked * (now - last)
        figures.blocked_time += (now - last) if blocked else 0.0
        figures.span += now - last
        last = now
        if task is None:
            node = churn.harness.placed[name][1].node
            churn.harness.remove(name)
            churn.retry(node, now, leave)
        elif not churn.could_fit(task):
            figures.never_fits += 1
        else:
            until = churn.try_place(task, now, now)
            if until is None:
                churn.waiting.append((task, now))
            else:
                heapq.heappush(leave, (until, task.name))
        if planner is not None and planner.due(now, churn):
            _defragment(churn, planner, now, leave)
        blocked = churn.blocked_idle()
        if not figures.series or now - figures.series[-1][0] >= SAMPLE_S:
            allocated = churn.capacity - churn.free_totals()[0]
            figures.series.append(
                (now, 100.0 * allocated / churn.capacity, 100.0 * blocked / churn.capacity)
            )
    figures.waiting_at_end = Counter(size_of(t) for t, _ in churn.waiting)
    row = churn.summary(policy, time.process_time() - start)
    return row | ({"defrag": False} if planner is None else planner.figures.summary())


def _defragment(
    churn: Churn, planner: fgd_churn_defrag.Planner, now: float, leave: list[tuple[float, str]]
) -> None:
    """A planning round; the pods it placed start now."""
    placed = planner.round(churn, now)
    names = {task.name for task, _since in placed}
    churn.waiting = [(t, s) for t, s in churn.waiting if t.name not in names]
    for task, since in placed:
        heapq.heappush(leave, (churn.admitted(task, since, now), task.name))


def _waits(waits: Sequence[float]) -> dict[str, float]:
    ordered = sorted(waits)
    return {
        "pods": len(ordered),
        "waited": sum(1 for w in ordered if w > 0),
        "mean": round(statistics.fmean(ordered), 1),
        "p95": round(ordered[int(0.95 * (len(ordered) - 1))], 1),
        "max": round(ordered[-1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", default="default")
    parser.add_argument("--compress", type=float, default=10.0)
    parser.add_argument("--scale", type=float, default=0.02)
    parser.add_argument("--policies", default="fgd,bestfit,binpack,fragmentation")
    parser.add_argument("--limit", type=int, default=0, help="the first N tasks only")
    parser.add_argument(
        "--defrag", action="store_true", help="the defragmentation planner on (moves counted)"
    )
    parser.add_argument(
        "--max-evictions",
        type=int,
        default=fgd_churn_defrag.MAX_EVICTIONS,
        help="with --defrag: the planner's most evictions for one waiting pod",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.compress < 1 or not 0 < args.scale <= 1:
        parser.error("--compress must be at least 1 and --scale in (0, 1]")
    if not 1 <= args.max_evictions <= 16:
        parser.error("--max-evictions must be in 1..16")
    tasks = fgd_trace.load_tasks(args.list)
    if args.limit > 0:
        tasks = sorted(tasks, key=lambda t: (t.created or 0, t.name))[: args.limit]
    rows = sample_rows(fgd_trace.node_rows(), args.scale)
    results = []
    for policy in args.policies.split(","):
        planner = fgd_churn_defrag.Planner(args.max_evictions) if args.defrag else None
        row = replay(policy, tasks, rows, args.compress, planner)
        results.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "series"}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": results}))


if __name__ == "__main__":
    main()
