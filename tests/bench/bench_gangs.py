"""Latency of one gang decision (``gangs.decide_group``) on 5,000 half-loaded nodes; reports,
asserts nothing.

Run standalone (``PYTHONSAFEPATH=1 .venv/bin/python tests/bench/bench_gangs.py``) or call
``run()``. The cluster is ``bench_scheduling``'s (8 GPUs of 80 GiB per node, about half of
every card in use), its nodes labelled with a rack of 100 nodes for the topology case. Each
repetition decides one PodGroup of four pending pods, all reserved together, then gives
every reservation back (``gangs.release``) so that each sees the same load. Timed on the
wall clock and on this thread's CPU (which other processes on a shared machine do not
inflate). kube-scheduler's gang plugin averages 3.7-5.7 ms per 3-pod gang at 5,000 nodes
(scheduler_perf); the aim here is a p99 of 10 ms for 4-pod gangs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))

from bench_scheduling import _pending, _row, build_cluster

from vgpu_operator import names
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.scheduling.gangs.gangs import GroupSpec

NODES = 5_000
RUNS = 300
WARMUP = 20
AIM_P99_MS = 10.0
RACK = "bench.vgpu.io/rack"


def _members(prefix: str, gpus: int, memory_mib: int, cores: int, **last: str) -> list[Any]:
    """Four members of the group ``prefix``; ``last``: annotations of the fourth only."""
    pods = []
    for i in range(4):
        pod = _pending(f"{prefix}-{i}", gpus, memory_mib, cores, **(last if i == 3 else {}))
        pod["spec"]["schedulingGroup"] = {"podGroupName": prefix}
        pods.append(pod)
    return pods


#: (case, members, topology, fits)
CASES: tuple[tuple[str, list[Any], str | None, bool], ...] = (
    ("4-pod gang, 1 GPU 8 GiB 20 cores each", _members("frac", 1, 8192, 20), None, True),
    ("4-pod gang, 2 GPUs 8 GiB 20 cores each", _members("two", 2, 8192, 20), None, True),
    ("4-pod gang in one rack of 100 nodes", _members("rack", 1, 8192, 20), RACK, True),
    (
        "4-pod gang whose 4th member fits nowhere (3 reserved, rolled back)",
        _members("short", 1, 8192, 20, **{names.GPU_USE_TYPE: "B200"}),
        None,
        False,
    ),
)


def _label_racks(state: ClusterState, nodes: int) -> None:
    for index in range(nodes):
        name = f"node-{index:05d}"
        allocatable = {"cpu": "128", "memory": "1Ti", "pods": "250", "nvidia.com/gpu": "80"}
        labels = {"kubernetes.io/hostname": name, RACK: f"rack-{index // 100:03d}"}
        state.set_node(
            {
                "metadata": {"name": name, "labels": labels},
                "status": {
                    "allocatable": allocatable,
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )


def time_gang(
    state: ClusterState,
    members: Sequence[Mapping[str, Any]],
    topology: str | None,
    fits: bool,
    runs: int = RUNS,
    warmup: int = WARMUP,
) -> tuple[list[float], list[float]]:
    spec = GroupSpec("bench/gang", True, len(members), topology)
    wall: list[float] = []
    cpu: list[float] = []
    for repetition in range(warmup + runs):
        started, started_cpu = time.perf_counter(), time.thread_time()
        out = gangs.decide_group(state, spec, spec.key, members, {}, 0.0)
        elapsed_ms = (time.perf_counter() - started) * 1000
        cpu_ms = (time.thread_time() - started_cpu) * 1000
        if bool(out.placed) != fits:
            raise RuntimeError(f"{spec.key}: placed={len(out.placed)}: {out.reason}")
        gangs.release(state, [d.pod for d in out.placed])
        if repetition >= warmup:
            wall.append(elapsed_ms)
            cpu.append(cpu_ms)
    return wall, cpu


def run(nodes: int = NODES) -> list[dict[str, Any]]:
    started = time.perf_counter()
    state = build_cluster(nodes)
    _label_racks(state, nodes)
    print(f"built {nodes} nodes in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    rows = []
    for case, members, topology, fits in CASES:
        wall, cpu = time_gang(state, members, topology, fits)
        rows.append(_row(f"gang {nodes} nodes: {case}", wall, AIM_P99_MS, cpu))
    return rows


if __name__ == "__main__":
    for row in run(int(sys.argv[1]) if len(sys.argv) > 1 else NODES):
        print(row)
