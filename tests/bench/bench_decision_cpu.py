"""The annotation path's decision CPU per fitting pod, for comparing two trees.

``PYTHONSAFEPATH=1 .venv/bin/python tests/bench/bench_decision_cpu.py NODES [DECISIONS]``
builds ``bench_scheduling``'s cluster (half-loaded nodes of 8 GPUs), freezes the heap as
the operator does once its first listing is in (``control.heap``), and times DECISIONS
(default 3,000) decisions of each fitting pod of ``bench_scheduling.CASES`` (1, 2 and
8 GPUs) in the thread's CPU time, each reservation rolled back; prints one JSON line:
per pod, mean, p50 and p99 in ms. Run it alternately against two engines (the other
tree's ``operator/`` on ``PYTHONPATH`` as ``vgpu_operator``) on the same machine: one
run's p99 moves by tens of percent on a shared machine, so compare medians of several
runs. Reports, asserts nothing.
"""

from __future__ import annotations

import gc
import importlib
import json
import math
import sys
import time
from pathlib import Path

# With PYTHONSAFEPATH (the Makefile sets it) a script's own folder is not on sys.path.
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))
bench_scheduling = importlib.import_module("bench_scheduling")


def main() -> None:
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000
    decisions = int(sys.argv[2]) if len(sys.argv) > 2 else 3_000
    state = bench_scheduling.build_cluster(nodes)
    gc.freeze()
    out: dict[str, tuple[float, float, float]] = {}
    for case in (c for c in bench_scheduling.CASES if c.fits):
        for _ in range(100):
            state.rollback(state.schedule(case.pod, 0.0).pod)
        cpu = []
        for _ in range(decisions):
            started = time.thread_time()
            decision = state.schedule(case.pod, 0.0)
            cpu.append((time.thread_time() - started) * 1000)
            state.rollback(decision.pod)
        cpu.sort()
        mean, p50 = sum(cpu) / decisions, cpu[decisions // 2]
        p99 = cpu[math.ceil(0.99 * decisions) - 1]
        out[case.name] = (round(mean, 4), round(p50, 4), round(p99, 4))
    print(json.dumps({"nodes": nodes, "decisions": decisions, "cpu_ms": out}))


if __name__ == "__main__":
    main()
